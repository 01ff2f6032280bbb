"""The pumping station: derived sensors, pump statistics, the wet well and its overflows.

- `Derivation(config.derived, config.rules)`: derived sensors; `feed(sample)` returns the
  derived samples due (live), `derive_arrays` merges them into replay arrays.
- `StationTracker(config, store)`: pump runs, starts, fail to start, high level and
  overflow records on event time; `feed(sample)` returns alarm conditions.
- `StationStore`: runs and overflow records under state_dir, read by `monitor pumps report`.
- `station_steps(...)`: the replay loop with both of the above, same results as live.

The names are resolved on first use (PEP 562): importing one module of the package
(`monitor pumps` reads the store and the report) does not load NumPy and the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.station.derive import Derivation, derive_arrays
    from monitor.station.record import OverflowRecord
    from monitor.station.replay import station_steps
    from monitor.station.store import StationStore
    from monitor.station.tracker import StationTracker, track_arrays

_HOME = {
    "Derivation": "monitor.station.derive",
    "derive_arrays": "monitor.station.derive",
    "station_steps": "monitor.station.replay",
    "OverflowRecord": "monitor.station.record",
    "StationStore": "monitor.station.store",
    "StationTracker": "monitor.station.tracker",
    "track_arrays": "monitor.station.tracker",
}

__all__ = [
    "Derivation",
    "OverflowRecord",
    "StationStore",
    "StationTracker",
    "derive_arrays",
    "station_steps",
    "track_arrays",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'monitor.station' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
