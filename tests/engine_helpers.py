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


def cut_by_a_checkpoint(
    config: Config,
    stream: tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]],
    cut: float,
    use_replay: bool,
    path: Path,
) -> tuple[list[Condition], list[Condition]]:
    """The whole stream live, and the same stream cut at `cut` by a checkpoint saved to
    `path` and restored into a new engine (replay before the cut and live after it, or the
    other way round): what a restart must not change. The cut's conditions come back in the
    engine's order; a cut between samples of one time may order that time's differently at
    the seam, so both are sorted the same way."""
    from monitor.engine import restore_checkpoint, save_checkpoint

    sensor, time, value, quality = stream
    samples = as_samples(config, *stream)
    whole = live(Engine(config.rules, ManualClock()), samples)
    i = int(cut * len(samples))
    first = Engine(config.rules, ManualClock())
    if use_replay:
        before = first.replay(sensor[:i], time[:i], value[:i], quality[:i]).conditions
    else:
        before = live(first, samples[:i])
    save_checkpoint(first, path)
    second = Engine(config.rules, ManualClock())
    restore_checkpoint(second, path)
    if use_replay:
        after = live(second, samples[i:])
    else:
        after = second.replay(sensor[i:], time[i:], value[i:], quality[i:]).conditions
    return whole, sorted(before + after, key=first.sort_key)


def canon(conditions: list[Condition]) -> list[tuple[object, ...]]:
    """Conditions as comparable tuples (NaN values compare equal, floats bit for bit)."""
    return [
        (c.time.hex(), c.sensor, c.rule, c.state, repr(c.value), repr(c.limit), c.citation)
        for c in conditions
    ]
