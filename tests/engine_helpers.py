"""Shared helpers for the engine tests: a small station config and sample streams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from monitor.config import Config, build_config
from monitor.engine import Engine
from monitor.model import Condition, ManualClock, Quality, Sample

T0 = 1_780_000_000.0  # 2026-05-28, a whole minute


def station(*sensors: dict[str, Any]) -> Config:
    return build_config({"station": {"id": "ps-test"}, "sensors": list(sensors)})


def wet_well_station(station_id: str, state: Path, *pumps: dict[str, Any]) -> Config:
    """A daemon's station: the wet well's level `lvl` (off 2 ft, lead on 5, lag on 6, high 8,
    overflow 9) and `pumps`, a pump failing to start after 2 min, its console off and no
    free-space floor, its state in `state`."""
    return build_config(
        {
            "station": {"id": station_id, "timezone": "UTC"},
            "state_dir": str(state),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft",
                 "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                *pumps,
            ],
            "wet_well": {"level": "lvl", "fail_to_start_delay": "2m"},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip


def live(engine: Engine, samples: list[Sample]) -> list[Condition]:
    """The live path as replay defines it: the clock follows the data."""
    out: list[Condition] = []
    for s in samples:
        out += engine.tick(s.time)
        out += engine.process(s)
    return sorted(out, key=engine.sort_key)


def as_samples(
    config: Config,
    sensor: npt.NDArray[np.integer],
    time: npt.NDArray[np.float64],
    value: npt.NDArray[np.float64],
    quality: npt.NDArray[np.integer],
) -> list[Sample]:
    ids = [s.id for s in config.sensors]
    return [
        Sample(ids[int(i)], float(t), float(v), Quality(int(q)))
        for i, t, v, q in zip(sensor, time, value, quality, strict=True)
    ]


def every(seconds: float, values: list[float], start: float = T0) -> list[tuple[float, float]]:
    return [(start + i * seconds, v) for i, v in enumerate(values)]


def run_live(
    config: Config, sensor: str, points: list[tuple[float, float]]
) -> tuple[Engine, list[Condition]]:
    engine = Engine(config.rules, ManualClock(points[0][0] if points else T0))
    return engine, live(engine, [Sample(sensor, t, v) for t, v in points])


def canon(conditions: list[Condition]) -> list[tuple[object, ...]]:
    """Conditions as comparable tuples (NaN values compare equal, floats bit for bit)."""
    return [
        (c.time.hex(), c.sensor, c.rule, c.state, repr(c.value), repr(c.limit), c.citation)
        for c in conditions
    ]
