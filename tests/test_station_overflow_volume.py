"""An overflow's volume says what was measured: unknown (not 0) with no level reading during
it, partial when the level's readings stopped before it ended; the report, the console and
the day's InfluxDB point say so too, and a station store of the last release upgrades."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from monitor.config import Config, load_config
from monitor.model import Quality, Rule, Sample
from monitor.sqlite import Schema, connect
from monitor.station import StationStore, StationTracker
from monitor.station.report import overflow_figures
from monitor.station.store import _SCHEMA, NO_LEVEL, SCHEMA
from monitor.station.tracker import track_arrays
from monitor.station.view import snapshot
from tests import cli
from tests.test_station_tracker import T0, feed, station


def overflows(store: StationStore, config: Config) -> dict[str, object]:
    """The report's one overflow of the hour from T0."""
    (figures,) = overflow_figures(store, T0, T0 + 3600, config.station.zone)
    return figures


def _float_only(until: int) -> list[Sample]:
    """The level read 4 ft before the storm, then its transmitter failed: the float switch,
    inflow (900 gpm) and pumps (off) alone say the well spilled from +60 s to +`until` s."""
    samples = [Sample("lvl", T0, 4.0), Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    for t in range(60, until, 60):
        samples += [Sample("switch", T0 + t, 1.0), Sample("inflow", T0 + t, 900.0)]
    return [*samples, Sample("switch", T0 + until, 0.0)]


@pytest.mark.parametrize("weir", [False, True], ids=["inflow", "weir"])
def test_an_overflow_with_no_level_reading_has_an_unknown_volume_not_zero(tmp_path: Path, weir: bool) -> None:
    """Before: 0 gal (the day's total too), which a Superintendent's sanitary-sewer-overflow
    report read as measured (the weir had no head, the inflow method no level at or above
    overflow)."""
    well: dict[str, Any] = {"weir": {"length": "24 in", "coefficient": 3.33}} if weir else {}
    config = station(tmp_path, **well)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, _float_only(600)[:-1])
    live = snapshot(config, tracker, T0 + 540)["overflow"]
    assert live["volume_gal"] is None and live["volume_note"] == NO_LEVEL  # type: ignore[index]
    feed(tracker, _float_only(600)[-1:])
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end, rec.method) == (T0 + 60, T0 + 600, "weir" if weir else "inflow")
    assert rec.volume_gal is None and rec.volume_note == NO_LEVEL
    figures = overflows(store, config)
    assert figures["volume_gal"] is None and figures["volume_note"] == NO_LEVEL
    # The day closes: the unknown volume is counted as unknown, not added as 0 gal.
    feed(tracker, [Sample("p1", T0 + 86_400, 0.0)])
    (day,) = [p for p in tracker.take_daily() if p.startswith("station_daily")]
    assert "overflows=1i" in day and "overflows_volume_unknown=1i" in day
    assert "overflow_volume_gal=0.0" in day  # of the overflows whose volume is known: a float
    store.close()


def test_a_volume_the_level_measured_over_part_of_the_overflow_is_marked_partial(tmp_path: Path) -> None:
    """The level reads 9.5 ft (over the overflow setpoint) to +60 s, then is silent for
    longer than its `stale_after` (5 min) until it reads 8 ft at +900 s, the float on all
    along: the volume carried on at the last level from +60 s to +900 s is an estimate,
    and the record says so and from when to when."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    for t in range(0, 900, 30):
        level = [Sample("lvl", T0 + t, 9.5)] if t <= 60 else []
        samples += [*level, Sample("switch", T0 + t, 1.0), Sample("inflow", T0 + t, 600.0)]
    feed(tracker, [*samples, Sample("switch", T0 + 900, 0.0), Sample("lvl", T0 + 900, 8.0)])
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.end, rec.level_last, rec.silent_from, rec.silent_to) == (
        T0 + 900,
        T0 + 900,
        T0 + 60,
        T0 + 900,
    )
    assert rec.volume_gal == pytest.approx(600.0 * 15)  # carried on, as before
    assert rec.volume_note.startswith(
        "partial: no level reading from 2026-05-28T20:27:40Z to 2026-05-28T20:41:40Z"
    )
    figures = overflows(store, config)
    assert figures["volume_partial"] is True and figures["volume_gal"] == 9000.0
    assert (figures["volume_unmeasured_from"], figures["volume_unmeasured_to"]) == (
        "2026-05-28T20:27:40Z",
        "2026-05-28T20:41:40Z",
    )
    # The day's point counts it as partial; its volume is in the total.
    feed(tracker, [Sample("p1", T0 + 86_400, 0.0)])
    (day,) = [p for p in tracker.take_daily() if p.startswith("station_daily")]
    assert "overflows_volume_partial=1i" in day and "overflow_volume_gal=9000.0" in day
    store.close()


def test_a_level_read_throughout_gives_a_whole_volume(tmp_path: Path) -> None:
    """The level polled every minute to the end (the float closes it a minute after the
    level's last reading, below the crest): whole, no note."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 1.0), Sample("p2", T0, 0.0), Sample("lvl", T0, 8.5)]
    samples += [Sample("switch", T0 + 60, 1.0), Sample("inflow", T0 + 60, 900.0)]
    samples += [Sample("lvl", T0 + 60 + 60 * k, 9.1) for k in range(1, 11)]
    feed(tracker, [*samples, Sample("lvl", T0 + 720, 8.9), Sample("switch", T0 + 780, 0.0)])
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_gal == pytest.approx(4000.0) and rec.volume_note == ""
    figures = overflows(store, config)
    assert figures["volume_partial"] is False and figures["volume_note"] is None


def test_a_station_store_of_the_last_release_upgrades(tmp_path: Path) -> None:
    """A file written before the volume's note and the level's span were stored (version 1)."""
    path = tmp_path / "station.sqlite"
    old = connect(path, Schema("station store", (_SCHEMA,)))
    old.execute(
        "INSERT INTO overflows VALUES ('lvl', ?, ?, 9.3, 1234.5, ?, 'weir')", (T0, T0 + 600, T0 + 7200)
    )
    old.close()
    store = StationStore(path)
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.volume_gal, rec.volume_note, rec.level_last, rec.silent_from) == (1234.5, "", None, None)
    assert store.db.execute("PRAGMA user_version").fetchone() == (SCHEMA.version,)
    store.close()


def test_replay_records_the_same_unknown_volume(tmp_path: Path) -> None:
    """`monitor replay`'s path (`track_arrays` over the merged arrays) gives the record live gives."""
    samples = _float_only(600)
    names = ("lvl", "p1", "p2", "switch", "inflow")
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    track_arrays(
        tracker,
        names,
        np.array([names.index(s.sensor) for s in samples], dtype=np.int64),
        np.array([s.time for s in samples]),
        np.array([s.value for s in samples]),
        np.full(len(samples), int(Quality.GOOD), dtype=np.int64),
    )
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.end, rec.volume_gal, rec.volume_note) == (T0 + 600, None, NO_LEVEL)
    store.close()


def _transmitter_dies(bad: bool, switch: bool = True) -> list[Sample]:
    """The level reads 9.5 ft (over the overflow setpoint, 9) at +0 and +30 s, then its
    transmitter dies: no more readings, or only bad-quality ones (`bad`). The float switch
    (`switch`) is on from +30 s and goes off at +120 s; it, the inflow and the pumps go on
    being polled every 60 s to +1200 s."""
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0), Sample("lvl", T0, 9.5)]
    samples += [Sample("lvl", T0 + 30, 9.5)] + ([Sample("switch", T0 + 30, 1.0)] if switch else [])
    for t in range(60, 1201, 60):
        if switch:
            samples.append(Sample("switch", T0 + t, 1.0 if t < 120 else 0.0))
        samples += [Sample("inflow", T0 + t, 600.0), Sample("p1", T0 + t, 0.0)]
        if bad:
            samples.append(Sample("lvl", T0 + t, 9.5, Quality.BAD_DATA))
    return samples


def _replayed(tracker: StationTracker, samples: list[Sample]) -> None:
    """`monitor replay`'s path: `track_arrays` over the merged arrays."""
    names = ("lvl", "p1", "p2", "switch", "inflow")
    track_arrays(
        tracker,
        names,
        np.array([names.index(s.sensor) for s in samples], dtype=np.int64),
        np.array([s.time for s in samples]),
        np.array([s.value for s in samples]),
        np.array([int(s.quality) for s in samples], dtype=np.int64),
    )


@pytest.mark.parametrize("replay", [False, True], ids=["live", "replay"])
@pytest.mark.parametrize("bad", [False, True], ids=["silent", "bad-quality"])
def test_the_float_going_off_with_the_level_stale_ends_the_overflow_at_its_off(
    tmp_path: Path, bad: bool, replay: bool
) -> None:
    """Before: the level's last good reading (9.5 ft, over the setpoint) kept the record open
    after the float went off, until a level reading came: with the transmitter dead, forever
    (the report's end missing, the console's "overflow in progress" on). The float is the
    independent high-level signal: once the level is stale (older than its `stale_after`,
    5 min) the overflow ends at the float's off, and the record says so."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _transmitter_dies(bad)
    if replay:
        _replayed(tracker, samples)
    else:
        # While the level is not yet stale it still says the well spills: in progress.
        feed(tracker, [s for s in samples if s.time <= T0 + 300])
        assert tracker.overflow is not None
        feed(tracker, [s for s in samples if s.time > T0 + 300])
    assert tracker.overflow is None
    assert snapshot(config, tracker, T0 + 1200)["overflow"] is None
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end, rec.level_last) == (T0, T0 + 120, T0 + 30)
    assert rec.volume_gal == pytest.approx(600.0)  # +60 s to the float's off at +120 s, not on to +360 s
    assert (
        "ended at the overflow switch's off; the level not read since 2026-05-28T20:27:10Z" in rec.volume_note
    )
    figures = overflows(store, config)
    assert figures["end"] == "2026-05-28T20:28:40Z" and figures["duration_s"] == 120.0
    store.close()


def test_with_no_float_a_stale_level_leaves_the_overflow_open_and_says_so(tmp_path: Path) -> None:
    """No float switch: nothing else says the well stopped spilling, so the record's end
    stays open; the console and the report say the level has not been read since +30 s
    (before: an "overflow in progress" with nothing saying it rested on a dead transmitter)."""
    config = station(tmp_path, overflow_switch=None)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _transmitter_dies(bad=True, switch=False)
    feed(tracker, [s for s in samples if s.time <= T0 + 300])
    view = snapshot(config, tracker, T0 + 300)["overflow"]
    assert view is not None and view["level_not_read_since"] is None  # type: ignore[index]
    feed(tracker, [s for s in samples if s.time > T0 + 300])
    tracker.save()
    view = snapshot(config, tracker, T0 + 1200)["overflow"]
    assert view["level_not_read_since"] == "2026-05-28T20:27:10Z"  # type: ignore[index]
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.end is None
    (figures,) = overflow_figures(store, T0, T0 + 3600, config.station.zone, stale_after=300.0)
    assert figures["end"] is None and figures["level_not_read_since"] == "2026-05-28T20:27:10Z"
    store.close()


def test_a_restart_with_an_overflow_open_keeps_one_record(tmp_path: Path) -> None:
    """The daemon restarts mid-overflow (level 9.5 ft, float on throughout) and the first
    reading after it is a pump's: before, the well's state not known yet (level NaN, the
    float not read) ended the record at that reading, and the level's next reading opened a
    second one (two SSO reports for one spill, the first CLEARED at the restart). Only the
    level or the float may say the well stopped spilling."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    for t in range(0, 301, 60):
        samples += [
            Sample("lvl", T0 + t, 9.5),
            Sample("switch", T0 + t, 1.0),
            Sample("inflow", T0 + t, 900.0),
        ]
    feed(tracker, samples)
    tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    samples = []
    for t in range(360, 601, 60):  # the gateway polls the pumps and inflow before the well
        samples += [Sample("p1", T0 + t, 0.0), Sample("inflow", T0 + t, 900.0), Sample("lvl", T0 + t, 9.5)]
        samples.append(Sample("switch", T0 + t, 1.0 if t < 600 else 0.0))
    conds = [c for c in feed(tracker, samples) if c.rule is Rule.OVERFLOW]
    assert conds == []  # no CLEARED at the restart, no second ACTIVE
    tracker.save()
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end) == (T0, None)  # the level still over the setpoint at +600 s
    store.close()


@pytest.mark.parametrize("replay", [False, True], ids=["live", "replay"])
def test_a_float_off_for_one_poll_with_the_level_stale_does_not_split_the_overflow(
    tmp_path: Path, replay: bool
) -> None:
    """The level transmitter dies at +30 s (9.5 ft, over the setpoint); the float, on, bounces
    off for one poll at +600 s (the water at the spill crest) and the pumps and inflow are
    polled 5 s after it. Before: the pump's reading at +605 s, the level stale, ended the
    overflow at +600 s and the float's on at +660 s opened a second: two overflow reports for
    one spill, the minute between in neither. The float's off ends it only once it has stayed
    off for the level's `stale_after` (5 min), as a float that goes off and stays off does."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [
        Sample("p1", T0, 0.0),
        Sample("p2", T0, 0.0),
        Sample("lvl", T0, 9.5),
        Sample("lvl", T0 + 30, 9.5),
    ]
    for t in range(60, 1201, 60):
        samples.append(Sample("switch", T0 + t, 0.0 if t == 600 else 1.0))
        samples += [Sample("inflow", T0 + t + 5, 900.0), Sample("p1", T0 + t + 5, 0.0)]
    if replay:
        _replayed(tracker, samples)
    else:
        feed(tracker, samples)
    tracker.save()
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end) == (T0, None)
    store.close()


def test_after_a_restart_the_console_still_says_the_level_is_not_read(tmp_path: Path) -> None:
    """No float, the level transmitter dead since +30 s (9.5 ft), the daemon restarted at
    +300 s with the overflow open: before, the console's "level not read since" went blank
    (the restarted tracker had no level reading, though the record keeps its last), and the
    overflow read as spilling on measured."""
    config = station(tmp_path, overflow_switch=None)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _transmitter_dies(bad=True, switch=False)
    feed(tracker, [s for s in samples if s.time <= T0 + 300])
    tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    feed(tracker, [s for s in samples if s.time > T0 + 300])
    view = snapshot(config, tracker, T0 + 1200)["overflow"]
    assert view is not None and view["level_not_read_since"] == "2026-05-28T20:27:10Z"  # type: ignore[index]
    store.close()


@pytest.mark.parametrize("switch", [True, False], ids=["float-ended", "no-float"])
def test_the_text_report_gives_the_overflow_s_times_in_the_station_s_zone(
    tmp_path: Path, switch: bool
) -> None:
    """`monitor pumps report` text, which the Superintendent copies into the state's SSO
    form: before, the start was local ("16:26 EDT") but the end and "level not read since"
    UTC with Z ("20:28:40Z"): read side by side, a 2-minute overflow looked 4 hours long."""
    raw: dict[str, Any] = {
        "station": {"id": "t", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "lvl", "kind": "level", "unit": "ft",
             "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
            {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            {"id": "p2", "kind": "pump", "pump": {"capacity": "0.72 MGD"}},
            {"id": "inflow", "kind": "flow", "unit": "gpm"},
            {"id": "switch", "kind": "status"},
        ],
        "wet_well": {"level": "lvl", "inflow": "inflow", "fail_to_start_delay": "2m",
                     **({"overflow_switch": "switch"} if switch else {})},
    }  # fmt: skip
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = load_config(path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, _transmitter_dies(bad=False, switch=switch))
    tracker.save()
    store.close()
    out = cli.run_monitor(
        "pumps", "report", "--config", str(path), "--start", "2026-05-28T20:00:00Z",
        "--end", "2026-05-28T21:00:00Z", "--format", "text",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if "overflow lvl" in x]
    if switch:
        assert "from 2026-05-28 16:26 EDT to 2026-05-28 16:28 EDT:" in line
    else:
        assert "from 2026-05-28 16:26 EDT to ? (level not read since 2026-05-28 16:27 EDT):" in line


@pytest.mark.parametrize("stored", [True, False], ids=["float-stored", "older-release-record"])
def test_a_restart_after_the_float_s_off_does_not_end_the_overflow_at_the_restart(
    tmp_path: Path, stored: bool
) -> None:
    """The level dead since +30 s at 9.5 ft; the float went off at +120 s; the daemon
    restarted at +200 s. Before: the float's first reading after the restart (off, the level
    not known) ended the overflow at +240 s, its volume carried at the dead level past the
    float's off (1,200 gal, not the 600 of the same history without a restart) and no note
    saying either. The record keeps the float's off (schema 3): the overflow ends there, at
    +120 s with 600 gal, as without a restart, once the float has stayed off `stale_after`.
    A record of an older release does not say when the float went off: the level's last word
    stands (open, "level not read since"), until the float is seen on and off again, then it
    ends at that off."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _transmitter_dies(bad=False)
    feed(tracker, [s for s in samples if s.time <= T0 + 200])
    tracker.save()
    if not stored:  # what an older release's record holds: nothing of the float
        store.db.execute("UPDATE overflows SET switch_on = NULL, switch_off_at = NULL, volume_at_off = NULL")
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    conds = feed(tracker, [s for s in samples if T0 + 200 < s.time <= T0 + 600])
    if stored:
        assert [(c.time - T0, c.state) for c in conds if c.rule is Rule.OVERFLOW] == [(480.0, "cleared")]
        (rec,) = store.overflows(T0, T0 + 3600)
        assert (rec.start, rec.end) == (T0, T0 + 120) and rec.volume_gal == pytest.approx(600.0)
        assert "ended at the overflow switch's off" in rec.volume_note
        store.close()
        return
    assert [c for c in conds if c.rule is Rule.OVERFLOW] == []
    assert tracker.overflow is not None
    view = snapshot(config, tracker, T0 + 600)["overflow"]
    assert view is not None and view["level_not_read_since"] == "2026-05-28T20:27:10Z"  # type: ignore[index]
    # The float on again at +660 s, off at +720 s and on being polled off: it ends at +720 s.
    later = [Sample("switch", T0 + t, 1.0 if t == 660 else 0.0) for t in range(660, 1201, 60)]
    later += [Sample("p1", T0 + t, 0.0) for t in range(660, 1201, 60)]
    feed(tracker, sorted(later, key=lambda s: s.time))
    assert tracker.overflow is None
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end) == (T0, T0 + 720)
    assert (
        "ended at the overflow switch's off; the level not read since 2026-05-28T20:27:10Z" in rec.volume_note
    )
    store.close()


def test_the_report_of_an_open_overflow_on_a_dead_level_marks_its_volume_partial(tmp_path: Path) -> None:
    """No float, the level dead since +30 s (9.5 ft), the report run at +1200 s with the
    overflow open: before, the report said 11,400 gal with `volume_partial` false (an open
    record was never judged partial) while the console said "partial: no level reading from
    +30 s": the volume carried at the dead level is an estimate in both."""
    config = station(tmp_path, overflow_switch=None)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, _transmitter_dies(bad=True, switch=False))
    tracker.save()
    live = snapshot(config, tracker, T0 + 1200)["overflow"]
    assert str(live["volume_note"]).startswith("partial")  # type: ignore[index]
    (figures,) = overflow_figures(store, T0, T0 + 3600, config.station.zone, stale_after=300.0)
    assert figures["volume_partial"] is True and figures["volume_note"] == live["volume_note"]  # type: ignore[index]
    assert (figures["volume_unmeasured_from"], figures["volume_unmeasured_to"]) == (
        "2026-05-28T20:27:10Z",
        "2026-05-28T20:46:40Z",
    )
    store.close()


def test_the_float_s_off_moves_with_a_gateway_clock_step(tmp_path: Path) -> None:
    """The level dead since +30 s, the float off at +120 s, then the gateway clock steps back
    an hour (NTP) before the next poll: the float's off moves with the start and the level's
    times, so the overflow still ends at the off (now an hour earlier on the corrected clock)
    with the same 600 gal and two minutes, not at a reading an hour off."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _transmitter_dies(bad=False)
    feed(tracker, [s for s in samples if s.time <= T0 + 120])
    tracker.shift(-3600.0)
    feed(tracker, [Sample(s.sensor, s.time - 3600, s.value, s.quality) for s in samples if s.time > T0 + 120])
    assert tracker.overflow is None
    (rec,) = store.overflows(T0 - 7200, T0 + 3600)
    assert (rec.start, rec.end) == (T0 - 3600, T0 - 3600 + 120)
    assert rec.volume_gal == pytest.approx(600.0)
    assert "the level not read since 2026-05-28T19:27:10Z" in rec.volume_note
    store.close()
