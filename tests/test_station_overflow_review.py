"""Review of the overflow link (review-overflow): the field's attacks on one spill, one event."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.model import ConditionState, Rule, Sample, iso
from monitor.station import StationStore, StationTracker
from tests.test_station_overflow_link import _dead_then_back
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


@pytest.mark.parametrize("delta", [-3600.0, 3600.0], ids=["stepped-back", "stepped-forward"])
def test_a_clock_step_in_the_gap_moves_the_gap_s_start_with_the_clock(tmp_path: Path, delta: float) -> None:
    """The float ended the first overflow at +120 s (the level dead); NTP steps the gateway
    clock an hour at +600 s; the level comes back over the setpoint at +1200 s (real time),
    stamped on the new clock. Before: `continues_gap_from` was the first record's end on the
    old clock: stepped back, the gap "from 21:28 to 20:46" ran backwards, and stepped forward
    it said 78 minutes were not measured, not 18. The gap is measured on the clock the second
    record starts on (the first's end moved with the step, as the link's test of
    `report_within` already moved it); `continues` stays the first record's id."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(1200, 9.4)
    feed(tracker, [s for s in samples if s.time <= T0 + 600])
    tracker.shift(delta)
    later = [Sample(s.sensor, s.time + delta, s.value, s.quality) for s in samples if s.time > T0 + 600]
    conds = [c for c in feed(tracker, later) if c.rule is Rule.OVERFLOW]
    (second,) = [r for r in store.overflows(T0 - 7200, T0 + 7200) if r.start != T0]
    assert (second.start, second.continues) == (T0 + 1200 + delta, T0)
    assert second.gap_from == T0 + 120 + delta  # 18 minutes not measured, before the start
    assert f"not measured from {iso(T0 + 120 + delta)}" in conds[0].message
    store.close()


@pytest.mark.parametrize("saved", [True, False], ids=["stopped", "killed"])
def test_a_restart_in_the_gap_still_links_the_next_overflow(tmp_path: Path, saved: bool) -> None:
    """The float ended the first overflow at +120 s (the level dead, the end judged at
    +480 s); the daemon restarts at +600 s (stopped, or killed -9 with no save at the stop);
    the level comes back over the setpoint at +1200 s. Before: two records with nothing
    linking them (the first's candidacy lived in memory only): two SSO reports for one spill
    because the daemon restarted in between. The restarted tracker takes it from the store."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(1200, 9.4)
    feed(tracker, [s for s in samples if s.time <= T0 + 600])
    if saved:
        tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    conds = [c for c in feed(tracker, [s for s in samples if s.time > T0 + 600]) if c.rule is Rule.OVERFLOW]
    assert conds[0].extra["continues"] == T0 and "not measured from 2026-05-28T20:28:40Z" in conds[0].message
    first, second = store.overflows(T0, T0 + 3600)
    assert (first.end, first.continues) == (T0 + 120, None)  # not reopened
    assert (second.start, second.continues, second.gap_from) == (T0 + 1200, T0, T0 + 120)
    store.close()


def test_a_level_read_below_the_setpoint_before_a_restart_still_parts_the_spills(tmp_path: Path) -> None:
    """As above, but the level read 8.5 ft (under the setpoint) at +650 s, before the restart:
    the float's end was the spill's, and the overflow after the restart is another spill."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(1200, 9.4)
    feed(tracker, [*(s for s in samples if s.time <= T0 + 600), Sample("lvl", T0 + 650, 8.5)])
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    feed(tracker, [s for s in samples if s.time > T0 + 650])
    assert [r.continues for r in store.overflows(T0, T0 + 3600)] == [None, None]
    store.close()
