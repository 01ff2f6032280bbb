"""Replay with the station: derived samples merged in, pump and wet-well events added.

The engine judges the derived samples like measured ones (baselines, limits, slug);
the tracker sees the validated samples of each step, in time order, as live does.
Batches stream through: a derived sample still pending at the end of a batch comes
with the next one (as live, it is made when a later reading arrives) or at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.engine import Engine, ReplayStep, replay_steps
from monitor.engine.columns import ConditionColumns
from monitor.station.derive import Derivation, derive_arrays
from monitor.station.tracker import StationTracker, track_arrays

if TYPE_CHECKING:  # the replay input (and pyarrow behind it): only replay itself loads it
    from monitor.sources.replay import Samples

log = logging.getLogger(__name__)


def station_steps(
    config: Config, engine: Engine, batches: Iterable[Samples], tracker: StationTracker | None
) -> Iterator[ReplayStep]:
    """`replay_steps` with derived sensors and the station tracker; conditions in time order."""
    names = engine.sensors
    derivation = Derivation(config.derived, config.rules) if config.derived else None
    derived = np.array([names.index(s) for s in config.derived], dtype=np.int64)
    ignored = 0
    for b in batches:
        sensor: npt.NDArray[np.integer] = b.sensor
        time, value, quality = b.time, b.value, b.quality
        if derivation is not None:
            recorded = np.isin(sensor, derived)
            if recorded.any():
                # A recording of a live run carries the derived series too; they are computed again.
                ignored += int(recorded.sum())
                keep = ~recorded
                sensor, time, value, quality = sensor[keep], time[keep], value[keep], quality[keep]
            sensor, time, value, quality = derive_arrays(
                derivation, names, sensor, time, value, quality, final=False
            )
        yield from judge_steps(engine, tracker, sensor, time, value, quality)
    if derivation is not None:
        e = np.empty(0, dtype=np.int64)
        sensor, time, value, quality = derive_arrays(
            derivation, names, e, np.empty(0), np.empty(0), np.empty(0, np.int8)
        )
        if time.size:
            yield from judge_steps(engine, tracker, sensor, time, value, quality)
    if ignored:
        log.warning(
            "%d recorded sample(s) of derived sensors ignored; derived sensors are computed"
            " from their inputs",
            ignored,
        )
    if tracker is not None:
        tracker.save()


def judge_steps(
    engine: Engine,
    tracker: StationTracker | None,
    sensor: npt.NDArray[np.integer],
    time: npt.NDArray[np.float64],
    value: npt.NDArray[np.float64],
    quality: npt.NDArray[np.integer],
) -> Iterator[ReplayStep]:
    """The engine's steps with the tracker's pump and wet-well conditions merged in (also
    `--what-if`, one tracker per config)."""
    for step in replay_steps(engine, sensor, time, value, quality):
        if tracker is None:
            yield step
            continue
        ok = step.accepted
        extra = track_arrays(
            tracker, engine.sensors, step.sensor[ok], step.time[ok], step.value[ok], step.quality[ok]
        )
        if extra:
            merged = sorted([*step.conditions, *extra], key=engine.sort_key)
            yield replace(step, columns=ConditionColumns.of(merged))
        else:
            yield step


def has_station(config: Config) -> bool:
    """Whether a replay needs the station parts at all."""
    return config.has_station


__all__ = ["has_station", "judge_steps", "station_steps"]
