"""Review of the overflow link (review-overflow): the field's attacks on one spill, one event."""

from __future__ import annotations

from pathlib import Path

from monitor.model import ConditionState, Rule, Sample
from monitor.station import StationStore, StationTracker
from tests.test_station_overflow_volume import _transmitter_dies
from tests.test_station_tracker import T0, feed, station


def test_a_float_chattering_after_it_ended_the_overflow_does_not_flap_the_alarm(tmp_path: Path) -> None:
    """The level dead at 9.5 ft from +30 s; the float ended the first overflow at +120 s. From
    +1200 s it chatters at the spill crest (on, off, on, ... a poll each) to +1500 s, then
    stays off. Before: each bounce was a record and an `overflow` ACTIVE then CLEARED (three
    pages, three rows), though the first record held through such a bounce. Now as the first:
    one record, ended at the float's last off once it has stayed off `stale_after`."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [s for s in _transmitter_dies(bad=False) if s.time < T0 + 1200]
    for t in range(1200, 2401, 60):
        on = 1.0 if t <= 1500 and (t // 60) % 2 == 0 else 0.0
        samples += [Sample("switch", T0 + t, on), Sample("inflow", T0 + t, 600.0), Sample("p1", T0 + t, 0.0)]
    conds = [c for c in feed(tracker, samples) if c.rule is Rule.OVERFLOW and c.time >= T0 + 1200]
    # The last on at +1440 s, off from +1500 s: judged ended once off longer than 5 min.
    assert [(c.time - T0, c.state) for c in conds] == [
        (1200.0, ConditionState.ACTIVE),
        (1860.0, ConditionState.CLEARED),
    ]
    _, second = store.overflows(T0, T0 + 3600)
    assert (second.start, second.end) == (T0 + 1200, T0 + 1500)
    assert (second.continues, second.gap_from) == (T0, T0 + 120)
    store.close()
