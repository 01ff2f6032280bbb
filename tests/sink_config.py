"""A small station config with an `influx` section, written to disk for the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from monitor.config import Config, load_config

SENSORS: list[dict[str, Any]] = [
    {"id": "outfall.flow", "kind": "flow", "unit": "gpm"},
    {"id": "outfall.ph", "kind": "ph"},
    {"id": "outfall.temp", "kind": "temperature", "unit": "degF"},
    {"id": "outfall.oil", "kind": "concentration", "unit": "mg/L", "substance": "oil"},
]


def write_config(
    tmp_path: Path, influx: dict[str, Any] | None, station: str = "ps-1", **extra: Any
) -> tuple[Path, Config]:
    """`station` keeps a test's series apart in a server other tests write to as well."""
    raw: dict[str, Any] = {
        "station": {"id": station, "name": "Barton PS 1"},
        "state_dir": str(tmp_path / "state"),
        "sensors": SENSORS,
        **extra,
    }
    if influx is not None:
        raw["influx"] = influx
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, load_config(path)
