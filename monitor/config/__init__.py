"""Typed, validated station config (pydantic) and the ordinance profile it defaults from.

Split by section so each module stays small: `types` (durations, secrets),
`sensors` (sensors, limits, slug, profile), `sources` (Modbus, MQTT),
`outputs` (InfluxDB, store, console, alarms, billing), `load` (YAML and errors).
"""

import importlib
from typing import TYPE_CHECKING, Any

from monitor.config.load import DEFAULT_PROFILE, Config, Station, build_config, load_config
from monitor.config.outputs import Account, Alarms, Billing, Console, Influx, Store, Webhook
from monitor.config.sensors import LimitRule, Profile, Sensor, SensorRules, SlugRule
from monitor.config.types import Duration, Secret, parse_duration, redact_url

if TYPE_CHECKING:
    from monitor.config.notify import Notify
    from monitor.config.sources import Modbus, ModbusDevice, ModbusField, Mqtt, Subscription, Tls

# Sections imported when first named (PEP 562), not by every command that reads a config:
# a station without them never loads their models (types.LazySection).
_SOURCES = ("Modbus", "ModbusDevice", "ModbusField", "Mqtt", "Subscription", "Tls")
_LAZY = {"Notify": "monitor.config.notify", **dict.fromkeys(_SOURCES, "monitor.config.sources")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_PROFILE",
    "Account",
    "Alarms",
    "Billing",
    "Config",
    "Console",
    "Duration",
    "Influx",
    "LimitRule",
    "Modbus",
    "ModbusDevice",
    "ModbusField",
    "Mqtt",
    "Notify",
    "Profile",
    "Secret",
    "Sensor",
    "SensorRules",
    "SlugRule",
    "Station",
    "Store",
    "Subscription",
    "Tls",
    "Webhook",
    "build_config",
    "load_config",
    "parse_duration",
    "redact_url",
]
