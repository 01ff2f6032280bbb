"""The config of `monitor fleet`: a broker, the station prefix, and where to serve the view.

A file of its own (keys `mqtt` and `fleet`), so the fleet view runs on any gateway
or any machine that reaches the broker without pretending to be a station:

    mqtt: {host: broker.example, port: 8883, username: fleet, password: ${FLEET_MQTT_PASSWORD},
           tls: {ca_file: /etc/ssl/ca.pem}, topic_prefix: station-monitor}
    fleet:
      port: 8090
      consoles: {ps-1: "https://ps-1.example:8080/"}
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError, field_validator

from monitor.config.load import _format_errors, _read_yaml
from monitor.config.sources import Mqtt
from monitor.config.types import Duration, Section, all_defaults
from monitor.errors import ConfigError


class Fleet(Section):
    host: str = Field("127.0.0.1", description="address the fleet page listens on (loopback by default)")
    port: int = Field(8090, gt=0, lt=65536)
    consoles: dict[str, str] = Field(
        default_factory=dict, description="station id -> that station's console URL, linked from the page"
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="names the page is reached by besides localhost and fleet.host (e.g. fleet.example)",
    )
    command_timeout: Duration = Field(5.0, gt=0, le=60, description="how long to wait for a station's reply")
    max_stations: int = Field(1000, gt=0, description="stations beyond this are refused (hostile publishers)")

    @field_validator("consoles")
    @classmethod
    def _urls(cls, consoles: dict[str, str]) -> dict[str, str]:
        for sid, url in consoles.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{sid}: must be an http:// or https:// URL")
        return consoles


class FleetConfig(Section):
    """A fleet view's config, validated and frozen."""

    mqtt: Mqtt
    fleet: Fleet = all_defaults(Fleet)


def load_fleet_config(path: str | Path) -> FleetConfig:
    """Read and validate a fleet config; raises ConfigError listing every problem."""
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(["(top level): must be a mapping with mqtt and fleet"], str(path))
    try:
        return FleetConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc), str(path)) from None
