"""Review of the overflow link (review-overflow): the field's attacks on one spill, one event."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monitor.config import build_config
from monitor.model import ConditionState, Rule, Sample, iso
from monitor.sinks.lineproto import condition_line
from monitor.sqlite import Schema, connect
from monitor.station import StationStore, StationTracker
from monitor.station.store import SCHEMA
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


@pytest.mark.parametrize("delta", [-2 * 86_400.0, 2 * 86_400.0], ids=["back-2d", "forward-2d"])
def test_a_clock_step_of_days_in_the_gap_measures_the_chain_s_day_on_the_new_clock(
    tmp_path: Path, delta: float
) -> None:
    """As above, with NTP stepping the gateway clock two days (a gateway booted on a clock two
    days behind). The chain's day (`SPILL_SPAN`) is measured from its first start moved with
    the step, as the gap is: 20 minutes after the first record began, the next one continues
    it. Before, the first start stayed on the old clock: stepped forward, the next record,
    two days "later", started a new spill (two SSO reports for one); stepped back, the chain
    would have run a day longer than its cap."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(1200, 9.4)
    feed(tracker, [s for s in samples if s.time <= T0 + 600])
    tracker.shift(delta)
    later = [Sample(s.sensor, s.time + delta, s.value, s.quality) for s in samples if s.time > T0 + 600]
    feed(tracker, later)
    (second,) = [r for r in store.overflows(T0 - 3 * 86_400, T0 + 3 * 86_400) if r.start != T0]
    assert (second.start, second.continues) == (T0 + 1200 + delta, T0)
    assert second.gap_from == T0 + 120 + delta
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


MIDNIGHT = T0 + 27_200  # 2026-05-29 00:00 in New York (EDT), the station's zone


def _day_point(points: list[str], day: str) -> dict[str, str]:
    (point,) = [p for p in points if p.startswith("station_daily") and f"day={day}" in p]
    fields = point.split(" ")[1]
    return dict(kv.split("=") for kv in fields.split(","))


@pytest.mark.parametrize("restart", [False, True], ids=["live", "restarted-after-midnight"])
def test_an_overflow_across_the_station_s_midnight_splits_its_volume_between_the_days(
    tmp_path: Path, restart: bool
) -> None:
    """The level reads 9.5 ft (over the setpoint) every minute from 23:50 to 00:20 local, the
    inflow 600 gpm, the pumps off: 18,000 gal, 6,000 before midnight. Before: the 28th's
    `station_daily` took the volume the store held at midnight (the last write: 0 gal at the
    record's opening here, at most 30 s old live), with nothing saying it was still going,
    and the 29th nothing: the days' sum said 0 gal of a measured 18,000. Now each day has
    what spilled in it (the sum is the record's volume), and the 28th says one was still open
    at its end (`overflows_open`)."""
    config = station(tmp_path, overflow_switch=None)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", MIDNIGHT - 3600, 0.0), Sample("p2", MIDNIGHT - 3600, 0.0)]
    for t in range(-600, 1201, 60):
        samples += [
            Sample("inflow", MIDNIGHT + t, 600.0),
            Sample("lvl", MIDNIGHT + t, 9.5 if t < 1200 else 8.0),
        ]
    points: list[str] = []
    for s in samples:
        if restart and s.time == MIDNIGHT + 120 and s.sensor == "inflow":
            tracker.save()
            points += tracker.take_daily()
            tracker.daily_queued()  # as the daemon's DailyFeed once the outbox took them
            store.close()
            store = StationStore.open(config.state_dir)
            tracker = StationTracker(config, store, resume=True)
        tracker.feed(s)
        points += tracker.take_daily()
    tracker.feed(Sample("p1", MIDNIGHT + 86_400, 0.0))
    points += tracker.take_daily()
    (rec,) = store.overflows(MIDNIGHT - 3600, MIDNIGHT + 3600)
    assert rec.volume_gal == pytest.approx(18_000.0) and rec.volume_note == ""
    before, after = _day_point(points, "2026-05-28"), _day_point(points, "2026-05-29")
    assert (before["overflows"], before["overflows_open"]) == ("1i", "1i")
    assert float(before["overflow_volume_gal"]) == pytest.approx(6_000.0)
    assert (after["overflows"], after["overflows_open"]) == ("0i", "0i")
    assert float(after["overflow_volume_gal"]) == pytest.approx(12_000.0)
    store.close()


def test_a_station_store_of_schema_3_upgrades_and_a_schema_3_release_refuses_schema_4(tmp_path: Path) -> None:
    """Schema 4 adds an open overflow's earlier days' share; a schema-3 file (written by the
    release before) opens with it unknown (the record crossed no midnight the day split
    saw), and a release that reads up to schema 3 refuses the upgraded file, naming it."""
    path = tmp_path / "station.sqlite"
    old = connect(path, Schema("station store", SCHEMA.migrations[:3]))
    old.execute(
        "INSERT INTO overflows (sensor, start, end, peak, volume_gal, due, method, opened_by)"
        " VALUES ('lvl', ?, NULL, 9.3, 1234.5, ?, 'weir', 'lvl')",
        (T0, T0 + 7200),
    )
    old.close()
    store = StationStore(path)
    (rec,) = store.open_overflows()
    assert (rec.opened_by, rec.volume_gal, rec.volume_before_day) == ("lvl", 1234.5, None)
    assert store.db.execute("PRAGMA user_version").fetchone() == (SCHEMA.version,)
    store.close()
    with pytest.raises(
        Exception, match=rf"newer station-monitor \(schema {SCHEMA.version}, this release reads up to 3\)"
    ) as err:
        connect(path, Schema("station store", SCHEMA.migrations[:3]))
    assert str(path) in str(err.value)


def test_an_overflow_s_end_the_full_disk_refused_is_written_when_there_is_room(tiny_disk: Path) -> None:
    """The state disk (a real 3 MB tmpfs) is full when the level's reading under the setpoint
    ends the overflow: the record's closing write fails (logged once, counted). Before: the
    store kept the record open for good (later saves write only the open record, and there
    was none): `monitor pumps report` said "to ?", `station_daily` counted it still open and a
    restart took it up again as spilling. The end is written at the next save with room."""
    config = station(tiny_disk)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(
        tracker,
        [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0), Sample("lvl", T0, 9.5), Sample("lvl", T0 + 60, 9.5)],
    )
    st = os.statvfs(tiny_disk)
    ballast = tiny_disk / "ballast"
    with ballast.open("wb", buffering=0) as f:
        try:
            for _ in range(st.f_blocks):
                f.write(b"\0" * st.f_frsize)
        except OSError:
            pass  # full: the disk's last block taken
    feed(tracker, [Sample("lvl", T0 + 120, 8.0)])
    assert tracker.overflow is None and tracker.store_errors > 0
    ballast.unlink()
    feed(tracker, [Sample("lvl", T0 + 180, 8.0)])
    tracker.save()
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.end == T0 + 120
    store.close()
    store = StationStore.open(config.state_dir)
    assert StationTracker(config, store, resume=True).overflow is None  # not taken up again
    store.close()


def test_the_day_s_volume_says_how_much_of_it_is_an_estimate(tmp_path: Path) -> None:
    """Two overflows in a day: one measured throughout (the level read every minute, 4,000 gal),
    one whose level fell silent past its `stale_after` (9,000 gal carried on at the last level:
    partial). Before: `overflow_volume_gal` 13,000 and a count of one partial overflow: what a
    regulator reads as measured and what rests on a dead transmitter were not told apart. The
    point now gives the gallons of the partial ones (`overflow_volume_partial_gal`)."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 1.0), Sample("p2", T0, 0.0), Sample("lvl", T0, 8.5)]
    samples += [Sample("switch", T0 + 60, 1.0), Sample("inflow", T0 + 60, 900.0)]
    samples += [Sample("lvl", T0 + 60 + 60 * k, 9.1) for k in range(1, 11)]
    samples += [Sample("lvl", T0 + 720, 8.9), Sample("switch", T0 + 780, 0.0), Sample("p1", T0 + 840, 0.0)]
    later = T0 + 3600
    for t in range(0, 900, 30):
        level = [Sample("lvl", later + t, 9.5)] if t <= 60 else []
        samples += [*level, Sample("switch", later + t, 1.0), Sample("inflow", later + t, 600.0)]
    samples += [Sample("switch", later + 900, 0.0), Sample("lvl", later + 900, 8.0)]
    feed(tracker, [*samples, Sample("p1", T0 + 86_400, 0.0)])
    whole, partial = store.overflows(T0, T0 + 7200)
    assert (whole.volume_note, partial.volume_note[:8]) == ("", "partial:")
    assert whole.volume_gal is not None and partial.volume_gal is not None
    day = _day_point(tracker.take_daily(), "2026-05-28")
    assert float(day["overflow_volume_gal"]) == pytest.approx(whole.volume_gal + partial.volume_gal)
    assert float(day["overflow_volume_partial_gal"]) == pytest.approx(partial.volume_gal)
    store.close()


def test_the_overflow_alarm_s_points_do_not_give_a_dead_level_as_a_reading(tmp_path: Path) -> None:
    """The level dead at 9.5 ft from +30 s: the float's end of the first overflow (judged at
    +480 s) and the float's opening of the one that continues it (+1200 s). Before: both
    alarm points in InfluxDB said `value=9.5`, the level's reading of +30 s, as if measured
    then (CLEARED at 9.5 ft, over the setpoint). A level older than its `stale_after` is no
    reading: the points carry no `value` (the journal's is null), their `limit` stays."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [s for s in _transmitter_dies(bad=False) if s.time < T0 + 1200]
    samples += [Sample("switch", T0 + 1200, 1.0)]
    conds = [c for c in feed(tracker, samples) if c.rule is Rule.OVERFLOW]
    assert [(c.time - T0, c.state) for c in conds] == [
        (0.0, ConditionState.ACTIVE),
        (480.0, ConditionState.CLEARED),
        (1200.0, ConditionState.ACTIVE),
    ]
    opened, ended, continued = (condition_line("t", c, "critical") for c in conds)
    assert "value=9.5" in opened  # read then
    assert "value=" not in ended and "value=" not in continued and "limit=9" in ended
    store.close()


@pytest.mark.parametrize(
    "garbage", [-1.0, 2000.0, float("nan")], ids=["plc-error-value", "out-of-range", "nan"]
)
def test_a_transmitter_back_with_garbage_does_not_part_the_spill(tmp_path: Path, garbage: float) -> None:
    """The float ended the first overflow (the level dead); the transmitter comes back at
    +900 s with the PLC's error value (-1, listed in the level's `bad_values`), a reading
    outside a level's plausible range, or NaN, then 9.4 ft at +1200 s. None of these is a
    reading below the setpoint: the second overflow continues the first (held already; a
    guard for the link)."""
    config = build_config(
        {
            "station": {"id": "t", "timezone": "America/New_York"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft", "bad_values": [-1.0],
                 "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                {"id": "inflow", "kind": "flow", "unit": "gpm"},
                {"id": "switch", "kind": "status"},
            ],
            "wet_well": {"level": "lvl", "inflow": "inflow", "overflow_switch": "switch"},
        }
    )  # fmt: skip
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(1200, 9.4)
    samples += [Sample("lvl", T0 + 900, garbage), Sample("lvl", T0 + 960, garbage)]
    feed(tracker, sorted(samples, key=lambda s: s.time))
    _, second = store.overflows(T0, T0 + 3600)
    assert (second.start, second.continues, second.gap_from) == (T0 + 1200, T0, T0 + 120)
    store.close()
