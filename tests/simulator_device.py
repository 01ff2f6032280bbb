"""The station simulator (`simulators.modbus_server`) as the Modbus device of a station
config that `monitor run` reads from disk: the tests that start the daemon as a process
describe the same device, so its register map is said here once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# The simulator's register map (see simulators/modbus_server.py) as a device's fields.
FIELDS: dict[str, dict[str, Any]] = {
    "outfall.flow": {"sensor": "outfall.flow", "register": "holding", "address": 0, "type": "FLOAT32"},
    "outfall.ph": {"sensor": "outfall.ph", "register": "holding", "address": 2, "type": "FLOAT32"},
}


def simulator_device(port: int, sensors: tuple[str, ...], **options: Any) -> dict[str, Any]:
    """The device `sim` on loopback `port`, polled every 250 ms, feeding `sensors`;
    `options` (a timeout, `comm_loss_after`) are the test's own."""
    return {
        "name": "sim",
        "host": "127.0.0.1",
        "port": port,
        "poll_interval": "250ms",
        **options,
        "fields": [FIELDS[sensor] for sensor in sensors],
    }


def write_station_yaml(tmp_path: Path, config: dict[str, Any]) -> Path:
    """`config` as `tmp_path/station.yaml`, the file `monitor run --config` is given."""
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
