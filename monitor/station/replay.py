"""Replay with the station: derived samples merged in, pump and wet-well events added.

The engine judges the derived samples like measured ones (baselines, limits, slug);
the tracker sees the validated samples of each step, in time order, as live does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.engine import Engine, ReplayStep, replay_steps
from monitor.model import Kind
from monitor.sources.replay import Samples
from monitor.station.derive import Derivation, derive_arrays
from monitor.station.tracker import StationTracker, track_arrays

log = logging.getLogger(__name__)


def station_steps(
    config: Config, engine: Engine, samples: Samples, tracker: StationTracker | None
) -> Iterator[ReplayStep]:
    """`replay_steps` with derived sensors and the station tracker; conditions in time order."""
    names = engine.sensors
    sensor: npt.NDArray[np.integer] = samples.sensor
    time, value, quality = samples.time, samples.value, samples.quality
    derived = [names.index(s) for s in config.derived]
    if derived:
        recorded = np.isin(sensor, np.array(derived))
        if recorded.any():
            # A recording of a live run carries the derived series too; they are computed again.
            log.warning(
                "%d recorded sample(s) of derived sensors ignored; derived sensors are computed"
                " from their inputs",
                int(recorded.sum()),
            )
            keep = ~recorded
            sensor, time, value, quality = sensor[keep], time[keep], value[keep], quality[keep]
        derivation = Derivation(config.derived, config.rules)
        sensor, time, value, quality = derive_arrays(derivation, names, sensor, time, value, quality)
    for step in replay_steps(engine, sensor, time, value, quality):
        if tracker is None:
            yield step
            continue
        ok = step.accepted
        extra = track_arrays(tracker, names, step.sensor[ok], step.time[ok], step.value[ok], step.quality[ok])
        if extra:
            merged = sorted([*step.conditions, *extra], key=engine.sort_key)
            yield replace(step, conditions=merged)
        else:
            yield step
    if tracker is not None:
        tracker.save()


def has_station(config: Config) -> bool:
    """Whether a replay needs the station parts at all."""
    return (
        bool(config.derived)
        or config.wet_well is not None
        or any(s.kind is Kind.PUMP for s in config.sensors)
    )


__all__ = ["has_station", "station_steps"]
