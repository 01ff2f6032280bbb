"""One spill, one event: an overflow the float switch ended with the level transmitter dead
and the next one, opened before the level was read below the setpoint, are linked
(`continues`); an overflow carried over a restart ends by the float seen off after it; and
its start stays on the clock of the reading that opened it. The real tracker, store,
report, console view and line protocol, on event time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config import load_config
from monitor.model import Condition, ConditionState, Rule, Sample
from monitor.sinks.lineproto import condition_line
from monitor.sqlite import Schema, connect
from monitor.station import StationStore, StationTracker
from monitor.station.report import overflow_figures
from monitor.station.store import SCHEMA
from monitor.station.view import snapshot
from tests import cli
from tests.test_station_overflow_volume import _replayed, _transmitter_dies
from tests.test_station_tracker import T0, feed, station


def _dead_then_back(back_at: int, level: float, until: int = 1800) -> list[Sample]:
    """`_transmitter_dies`: the level dead at 9.5 ft from +30 s, the float off from +120 s
    (the first overflow ends there); the level transmitter comes back at +`back_at` s
    reading `level`, then 8.5 ft (below the setpoint) from `back_at` + 300 s to `until`."""
    samples = [s for s in _transmitter_dies(bad=False) if s.time < T0 + back_at]
    for t in range(back_at, until + 1, 60):
        samples += [
            Sample("lvl", T0 + t, level if t < back_at + 300 else 8.5),
            Sample("switch", T0 + t, 0.0),
            Sample("inflow", T0 + t, 600.0),
            Sample("p1", T0 + t, 0.0),
        ]
    return samples


@pytest.mark.parametrize("replay", [False, True], ids=["live", "replay"])
def test_the_level_back_over_the_setpoint_after_a_float_ended_overflow_continues_it(
    tmp_path: Path, replay: bool
) -> None:
    """The float ended the first overflow at +120 s (the level dead since +30 s at 9.5 ft);
    the transmitter comes back at +1200 s reading 9.4 ft: nothing measured the well below
    the setpoint in between. Before: two records, nothing linking them, the 18 minutes
    between in neither: the Superintendent filed two SSO reports for one spill. The second
    record now continues the first (its start, the spill's id) and says from when the
    time between was not measured."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(1200, 9.4)
    if replay:
        _replayed(tracker, samples)
    else:
        conds = feed(tracker, [s for s in samples if s.time <= T0 + 1200])
        (raised,) = [c for c in conds if c.rule is Rule.OVERFLOW and c.time == T0 + 1200]
        assert raised.state is ConditionState.ACTIVE and raised.extra["continues"] == T0
        assert "continues the overflow from 2026-05-28T20:26:40Z" in raised.message
        assert "continues=1780000000" in condition_line("t", raised, "critical")
        view = snapshot(config, tracker, T0 + 1200)["overflow"]
        assert view["continues"] == "2026-05-28T20:26:40Z"  # type: ignore[index]
        assert view["continues_gap_from"] == "2026-05-28T20:28:40Z"  # type: ignore[index]
        feed(tracker, [s for s in samples if s.time > T0 + 1200])
    first, second = store.overflows(T0, T0 + 3600)
    assert (first.start, first.end, first.continues) == (T0, T0 + 120, None)
    assert (second.start, second.end) == (T0 + 1200, T0 + 1500)
    assert (second.continues, second.gap_from) == (T0, T0 + 120)
    assert second.volume_note == ""  # the level read throughout: measured, ended by the level
    figures = overflow_figures(store, T0, T0 + 3600, config.station.zone, 300.0)
    assert [(f["continues"], f["continues_gap_from"]) for f in figures] == [
        (None, None),
        ("2026-05-28T20:26:40Z", "2026-05-28T20:28:40Z"),
    ]
    # The day's point: two records, one of them continuing the other (one spill event).
    feed(tracker, [Sample("p1", T0 + 86_400, 0.0)])
    (day,) = [p for p in tracker.take_daily() if p.startswith("station_daily")]
    assert "overflows=2i" in day and "overflows_continuing=1i" in day
    store.close()


def test_a_chain_of_overflows_on_the_float_alone_continues_the_spill_s_first(tmp_path: Path) -> None:
    """The level dead at 9.5 ft from +30 s; the float ends the first overflow at +120 s, then
    comes on four more times (+1200, +2100, +3000, +3900 s, two minutes each, off for 13
    minutes between: longer than the level's `stale_after`, so each off ends its record): the
    level not read in between, all five are one spill, each continues the spill's first record
    and its gap runs from the previous record's end. (A float off for less than `stale_after`
    does not end the record: tests/test_station_overflow_review.py.)"""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [s for s in _transmitter_dies(bad=False) if s.time < T0 + 1200]
    starts = [1200, 2100, 3000, 3900]
    for t in range(1200, 4801, 60):
        on = 1.0 if any(s <= t < s + 120 for s in starts) else 0.0
        samples += [Sample("switch", T0 + t, on), Sample("inflow", T0 + t, 600.0), Sample("p1", T0 + t, 0.0)]
    feed(tracker, samples)
    tracker.save()
    first, *chain = store.overflows(T0, T0 + 7200)
    assert (first.end, first.continues) == (T0 + 120, None)
    assert [(r.start - T0, r.end and r.end - T0) for r in chain] == [(s, s + 120.0) for s in starts]
    assert [r.continues for r in chain] == [T0] * 4
    assert [r.gap_from and r.gap_from - T0 for r in chain] == [120.0, *(s + 120.0 for s in starts[:-1])]
    assert all("ended at the overflow switch's off; the level not read since" in r.volume_note for r in chain)
    store.close()


def test_a_chain_on_the_float_alone_is_one_spill_for_a_day_at_most(tmp_path: Path) -> None:
    """The level dead for 30 hours, the float on for two minutes every 110 (each off longer
    than `stale_after`, each gap shorter than `report_within`): before, every record linked
    to the first, one "spill" of 30 hours and 17 records, the very case the docs say must not
    happen (a week-dead transmitter making every later spill one event). A chain continues
    its first record for a day from that start; the next record starts a new spill (a new SSO
    report, continued by the ones after it)."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [s for s in _transmitter_dies(bad=False) if s.time < T0 + 1200]
    starts = list(range(6600, 30 * 3600, 6600))
    for t in range(1200, 30 * 3600, 60):
        on = 1.0 if any(s <= t < s + 120 for s in starts) else 0.0
        samples += [Sample("switch", T0 + t, on), Sample("inflow", T0 + t, 600.0), Sample("p1", T0 + t, 0.0)]
    feed(tracker, samples)
    tracker.save()
    first, *chain = store.overflows(T0, T0 + 31 * 3600)
    assert first.continues is None and len(chain) == len(starts)
    within = [r for r in chain if r.start - T0 <= 86_400]
    after = [r for r in chain if r.start - T0 > 86_400]
    assert within and after
    assert all(r.continues == T0 for r in within)
    assert after[0].continues is None  # a new spill: its own SSO report
    assert all(r.continues == after[0].start for r in after[1:])
    store.close()


@pytest.mark.parametrize(
    ("back_at", "level"),
    [(1200, 8.5), (7200 + 120 + 60, 9.4)],
    ids=["level-read-below-first", "beyond-report-within"],
)
def test_no_link_when_the_level_said_the_spill_stopped_or_long_after(
    tmp_path: Path, back_at: int, level: float
) -> None:
    """The level read back below the setpoint (8.5 ft) confirms the float's end: a later
    overflow is another spill. Back over the setpoint more than `report_within` (2 h) after
    the first's end: not linked either (a week-dead transmitter must not make every later
    spill the same event)."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _dead_then_back(back_at, level, until=back_at + 600)
    over = back_at + 360
    samples += [Sample("lvl", T0 + over, 9.3), Sample("lvl", T0 + over + 60, 8.0)]
    feed(tracker, sorted(samples, key=lambda s: s.time))
    records = store.overflows(T0, T0 + 86_400)
    assert len(records) >= 2 and all(r.continues is None for r in records)
    store.close()


def test_the_text_report_names_the_overflow_continued(tmp_path: Path) -> None:
    """`monitor pumps report --format text`, copied into the state's SSO form: the second
    record says which overflow it continues and that the time between was not measured."""
    raw: dict[str, Any] = {
        "station": {"id": "t", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "lvl", "kind": "level", "unit": "ft",
             "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
            {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            {"id": "inflow", "kind": "flow", "unit": "gpm"},
            {"id": "switch", "kind": "status"},
        ],
        "wet_well": {"level": "lvl", "inflow": "inflow", "overflow_switch": "switch"},
    }  # fmt: skip
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = load_config(path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, _dead_then_back(1200, 9.4))
    tracker.save()
    store.close()
    out = cli.run_monitor(
        "pumps", "report", "--config", str(path), "--start", "2026-05-28T20:00:00Z",
        "--end", "2026-05-28T21:00:00Z", "--format", "text",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if "overflow lvl" in x]
    assert len(lines) == 2 and "continues" not in lines[0]
    assert (
        "continues the overflow from 2026-05-28 16:26 EDT"
        " (not measured from its end, 2026-05-28 16:28 EDT, to this start)" in lines[1]
    )


def _float_on_at_the_restart() -> list[Sample]:
    """The level dead at 9.5 ft from +30 s; the float on to +240 s and off from +300 s;
    the inflow and p1 polled every 60 s to +1200 s."""
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0), Sample("lvl", T0, 9.5)]
    samples += [Sample("lvl", T0 + 30, 9.5), Sample("switch", T0 + 30, 1.0)]
    for t in range(60, 1201, 60):
        samples.append(Sample("switch", T0 + t, 1.0 if t < 300 else 0.0))
        samples += [Sample("inflow", T0 + t, 600.0), Sample("p1", T0 + t, 0.0)]
    return samples


@pytest.mark.parametrize("saved", [True, False], ids=["stopped", "killed"])
def test_a_float_seen_off_only_after_a_restart_ends_the_overflow_carried_over_it(
    tmp_path: Path, saved: bool
) -> None:
    """The daemon restarts at +250 s with the overflow open and the float last read on; the
    float's first reading after it, at +300 s, is off and stays off. Before: the restarted
    tracker did not know the float was on, so its off was no on-to-off: the record stayed
    open (the report "to ?", the console's banner on) for ever. It now ends at +300 s, as
    the same history without a restart does; killed (-9, no save at the stop) too, since the
    float's on is written when it comes (the volume then is the one last written)."""
    samples = _float_on_at_the_restart()
    config = station(tmp_path / "once")
    store = StationStore.open(config.state_dir)
    feed(StationTracker(config, store), samples)
    (whole,) = store.overflows(T0, T0 + 3600)
    store.close()
    config = station(tmp_path / "restarted")
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, [s for s in samples if s.time <= T0 + 250])
    if saved:
        tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    conds = feed(tracker, [s for s in samples if s.time > T0 + 250])
    assert [(c.time - T0, c.state) for c in conds if c.rule is Rule.OVERFLOW] == [
        (660.0, ConditionState.CLEARED)
    ]
    assert tracker.overflow is None
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (whole.start, whole.end) == (rec.start, rec.end) == (T0, T0 + 300)
    assert "ended at the overflow switch's off" in rec.volume_note
    # The daemon was down in the overflow: the volume across it is an estimate (the level's
    # silence from +30 s runs across the downtime), the rest of the note as without it.
    assert rec.volume_note == (
        "partial: level readings missing from 2026-05-28T20:27:10Z to 2026-05-28T20:31:40Z;"
        f" the volume then rests on the last level known; {whole.volume_note}"
    )
    if saved:
        assert rec.volume_gal == pytest.approx(whole.volume_gal)  # carried over the restart as without it
    store.close()


@pytest.mark.parametrize("device", [{"lvl"}, {"switch"}], ids=["float-on-gateway", "float-on-device"])
def test_an_overflow_open_across_a_restart_keeps_the_clock_of_the_reading_that_opened_it(
    tmp_path: Path, device: set[str]
) -> None:
    """The float switch opens the overflow (the level reads 8.5 ft, under the setpoint); the
    level and the float are on two clocks an hour apart (the gateway's RTC ahead until NTP
    steps it back while the daemon is down). Before: the restarted tracker took the open
    record for the level's clock. Float on the gateway's clock: the step did not move the
    record, which stayed an hour ahead and ended at its own start (0 s, report due an hour
    late). Float on its own clock: the step moved it an hour back (69 min, not 9)."""
    config = station(tmp_path)
    ahead = {s: 3600.0 if s not in device else 0.0 for s in ("lvl", "switch", "p1", "p2", "inflow")}

    def read(sid: str, t: float, v: float, stepped: bool = False) -> Sample:
        return Sample(sid, T0 + t + (0.0 if stepped else ahead[sid]), v)

    before = [read(sid, t, v) for t in range(0, 241, 30) for sid, v in (("lvl", 8.5), ("switch", 1.0))]
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, device=device)
    feed(tracker, before[2:])  # in poll order; the float opens it at +30 s
    tracker.save()
    opened = tracker.overflow
    assert opened is not None and opened.start == T0 + 30 + ahead["switch"]
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True, device=device)
    tracker.shift(-3600.0, keep=device)  # found at start: the gateway clock stepped back
    after = [
        read(sid, t, v, stepped=True)
        for t in range(300, 601, 30)
        for sid, v in (("lvl", 8.5), ("switch", 1.0 if t < 540 else 0.0))
    ]
    feed(tracker, after)
    (rec,) = store.overflows(T0 - 7200, T0 + 7200)
    assert (rec.start, rec.end, rec.due) == (T0 + 30, T0 + 540, T0 + 30 + 7200)
    store.close()


def test_a_station_store_of_schema_2_upgrades_and_an_older_release_refuses_schema_3(tmp_path: Path) -> None:
    """Schema 3 adds the record's opener, the float's state, the link; a schema-2 file opens
    with them unknown (taken as before: the level's clock, the float not known, no link),
    and a release that reads up to schema 2 refuses the upgraded file, naming it."""
    path = tmp_path / "station.sqlite"
    old = connect(path, Schema("station store", SCHEMA.migrations[:2]))
    old.execute(
        "INSERT INTO overflows (sensor, start, end, peak, volume_gal, due, method)"
        " VALUES ('lvl', ?, NULL, 9.3, 1234.5, ?, 'weir')",
        (T0, T0 + 7200),
    )
    old.close()
    store = StationStore(path)
    (rec,) = store.open_overflows()
    assert (rec.opened_by, rec.switch_on, rec.continues, rec.gap_from) == ("", None, None, None)
    assert store.db.execute("PRAGMA user_version").fetchone() == (SCHEMA.version,)
    store.close()
    with pytest.raises(Exception, match="newer station-monitor") as err:
        connect(path, Schema("station store", SCHEMA.migrations[:2]))
    assert str(path) in str(err.value)


def _float_chain(until: int) -> list[Sample]:
    """The level dead at 9.5 ft from +30 s (the float ends the first overflow at +120 s); the
    float on again +1200 to +1320 s and +2100 to +2220 s; polled every 60 s to `until`."""
    samples = [s for s in _transmitter_dies(bad=False) if s.time < T0 + 1200]
    for t in range(1200, until + 1, 60):
        on = 1.0 if any(s <= t < s + 120 for s in (1200, 2100)) else 0.0
        samples += [Sample("switch", T0 + t, on), Sample("inflow", T0 + t, 600.0), Sample("p1", T0 + t, 0.0)]
    return samples


@pytest.mark.parametrize("saved", [True, False], ids=["stopped", "killed"])
def test_a_restart_while_a_float_only_continuing_record_is_open_keeps_the_chain(
    tmp_path: Path, saved: bool
) -> None:
    """The daemon restarts at +1290 s, the float on, the second record (opened by the float
    alone, continuing the first) open. Before: the restarted tracker did not know the level
    was dead (its last reading's time was not stored for such a record), so the float's first
    off ended the record at once, as if the level had said so: no note that the float ended
    it, no link candidate, and the third overflow (+2100 s) was a new spill, a second SSO
    report. Now the restart changes nothing: the same records, conditions and links."""
    samples = _float_chain(3000)
    config = station(tmp_path / "once")
    store = StationStore.open(config.state_dir)
    whole_conds = feed(StationTracker(config, store), samples)
    whole = store.overflows(T0, T0 + 7200)
    store.close()
    config = station(tmp_path / "restarted")
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    conds = feed(tracker, [s for s in samples if s.time <= T0 + 1290])
    assert tracker.overflow is not None and tracker.overflow.continues == T0
    if saved:
        tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    conds += feed(tracker, [s for s in samples if s.time > T0 + 1290])
    records = store.overflows(T0, T0 + 7200)
    store.close()

    def overflow(cs: list[Condition]) -> list[tuple[float, ConditionState]]:
        return [(c.time - T0, c.state) for c in cs if c.rule is Rule.OVERFLOW]

    assert overflow(conds) == overflow(whole_conds)
    assert [(r.start - T0, r.end and r.end - T0, r.continues) for r in records] == [
        (0.0, 120.0, None),
        (1200.0, 1320.0, T0),
        (2100.0, 2220.0, T0),
    ]
    assert [(r.volume_note, r.gap_from) for r in records] == [(r.volume_note, r.gap_from) for r in whole]
