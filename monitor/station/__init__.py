"""The pumping station: derived sensors, pump statistics, the wet well and its overflows.

- `Derivation(config.derived, config.rules)`: derived sensors; `feed(sample)` returns the
  derived samples due (live), `derive_arrays` merges them into replay arrays.
- `StationTracker(config, store)`: pump runs, starts, fail to start, high level and
  overflow records on event time; `feed(sample)` returns alarm conditions.
- `StationStore`: runs and overflow records under state_dir, read by `monitor pumps report`.
- `station_steps(...)`: the replay loop with both of the above, same results as live.
"""

from monitor.station.derive import Derivation, derive_arrays
from monitor.station.replay import station_steps
from monitor.station.store import OverflowRecord, StationStore
from monitor.station.tracker import StationTracker, track_arrays

__all__ = [
    "Derivation",
    "OverflowRecord",
    "StationStore",
    "StationTracker",
    "derive_arrays",
    "station_steps",
    "track_arrays",
]
