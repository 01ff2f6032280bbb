"""Readings missing inside an overflow, however short: the level's transmitter reading bad
data, the daemon down across a restart. The volume then is an estimate and the record says
so, and what the estimate did (the weir's flow between the levels either side, or carried
on at the last level known)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.model import Quality, Sample
from monitor.sqlite import Schema, connect
from monitor.station import StationStore, StationTracker
from monitor.station.report import overflow_figures
from monitor.station.store import SCHEMA
from tests.test_station_tracker import T0, feed, station

WEIR = {"weir": {"length": "24 in", "coefficient": 3.33}}


def _level_only(until: int, level: float = 9.5) -> list[Sample]:
    """A weir well read every 30 s (the level alone, pumps off): over the crest to `until`."""
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    return samples + [Sample("lvl", T0 + t, level) for t in range(0, until + 1, 30)]


def test_a_weir_s_estimate_across_a_silence_says_it_used_the_levels_either_side(tmp_path: Path) -> None:
    """The level reads 9.5 ft to +60 s, nothing for 14 min (past its `stale_after`), then 9.3 ft
    and 8.0 ft. The weir's volume over the silence is the mean of the rates of 9.5 and 9.3 ft
    (trapezoids between level readings). Before: the note said "the volume then rests on the
    last level known", which is not what was done."""
    config = station(tmp_path, overflow_switch=None, **WEIR)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _level_only(60)
    samples += [Sample("lvl", T0 + 900, 9.3), Sample("lvl", T0 + 930, 8.0)]
    feed(tracker, samples)
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note == (
        "partial: no level reading from 2026-05-28T20:27:40Z to 2026-05-28T20:41:40Z;"
        " the flow over the weir then is estimated from the levels read before and after"
    )
    store.close()


def test_the_inflow_method_s_estimate_still_rests_on_the_last_level_known(tmp_path: Path) -> None:
    """Without a weir the rate across a silence is the inflow above the pumps' capacity with
    the last level known (a rectangle, not an average): the note says that, as before."""
    config = station(tmp_path, overflow_switch=None)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    for t in range(0, 901, 30):
        samples += [Sample("inflow", T0 + t, 600.0)] + ([Sample("lvl", T0 + t, 9.5)] if t <= 60 else [])
    feed(tracker, [*samples, Sample("lvl", T0 + 930, 8.0)])
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note.endswith("; the volume then rests on the last level known")
    store.close()


@pytest.mark.parametrize(
    "quality", [Quality.BAD_DATA, Quality.COMM_FAILURE], ids=["bad-data", "comm-failure"]
)
def test_bad_level_readings_shorter_than_stale_after_mark_the_volume_partial(
    tmp_path: Path, quality: Quality
) -> None:
    """The level's transmitter reads bad from +120 s to +210 s (its `stale_after` is 5 min): no
    good reading from +90 s to +240 s,
    in the middle of an overflow measured every 30 s. Before: the volume was presented as
    measured throughout (no note), though four readings were missing."""
    config = station(tmp_path, overflow_switch=None, **WEIR)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [
        s if not T0 + 120 <= s.time <= T0 + 210 else Sample("lvl", s.time, 9.5, quality)
        for s in _level_only(600)
    ]
    feed(tracker, [*samples, Sample("lvl", T0 + 630, 8.0)])
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note == (
        "partial: level readings missing from 2026-05-28T20:28:10Z to 2026-05-28T20:30:40Z;"
        " the flow over the weir then is estimated from the levels read before and after"
    )
    (figures,) = overflow_figures(store, T0, T0 + 3600, config.station.zone, stale_after=300.0)
    assert figures["volume_partial"] is True
    assert (figures["volume_unmeasured_from"], figures["volume_unmeasured_to"]) == (
        "2026-05-28T20:28:10Z",
        "2026-05-28T20:30:40Z",
    )
    # The day's point counts it among the partial ones.
    feed(tracker, [Sample("p1", T0 + 86_400, 0.0)])
    (day,) = [p for p in tracker.take_daily() if p.startswith("station_daily")]
    assert "overflows_volume_partial=1i" in day
    store.close()


def test_a_good_level_throughout_is_not_partial(tmp_path: Path) -> None:
    """The guard: the same overflow read every 30 s throughout has no note."""
    config = station(tmp_path, overflow_switch=None, **WEIR)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, [*_level_only(600), Sample("lvl", T0 + 630, 8.0)])
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note == ""
    store.close()


def _restarted(
    tmp_path: Path, down: tuple[int, int], poll: int = 30, again: tuple[Sample, ...] = ()
) -> StationStore:
    """The overflow above, polled every `poll` s; the daemon stopped after its reading of
    `down[0]` s and taking readings again from `down[1]` s (after `again`, first)."""
    config = station(tmp_path, overflow_switch=None, **WEIR)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    samples += [Sample("lvl", T0 + t, 9.5) for t in range(0, 601, poll)]
    feed(tracker, [s for s in samples if s.time <= T0 + down[0]])
    tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    feed(tracker, [*again, *(s for s in samples if s.time >= T0 + down[1]), Sample("lvl", T0 + 630, 8.0)])
    return store


def test_a_daemon_down_shorter_than_stale_after_marks_the_volume_partial(tmp_path: Path) -> None:
    """Stopped after +150 s, back at +300 s (under the level's `stale_after`): four polls not
    taken. Before: the volume was presented as measured throughout."""
    store = _restarted(tmp_path, (150, 300))
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note.startswith(
        "partial: level readings missing from 2026-05-28T20:29:10Z to 2026-05-28T20:31:40Z;"
    )
    store.close()


@pytest.mark.parametrize("stamp", [150, 120], ids=["redelivered", "older"])
def test_a_level_reading_from_before_the_restart_does_not_hide_the_downtime(
    tmp_path: Path, stamp: int
) -> None:
    """As above, but the first level reading after the restart is one from before it: MQTT
    redelivers the message taken but not acknowledged before a kill -9 (QoS 1), or the
    broker's retained message on subscribing (stamped +150 s, the last taken), or an older
    one a device's buffer sends again. Before: that reading ended the silence across the
    downtime (no later than the last reading, it missed nothing), and the four polls not
    taken went unsaid: the volume presented as measured throughout."""
    store = _restarted(tmp_path, (150, 300), again=(Sample("lvl", T0 + stamp, 9.5),))
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note.startswith(
        "partial: level readings missing from 2026-05-28T20:29:10Z to 2026-05-28T20:31:40Z;"
    )
    store.close()


def test_a_restart_between_two_polls_is_not_partial(tmp_path: Path) -> None:
    """Restarted between two polls of a minute: no reading was missed, no note."""
    store = _restarted(tmp_path, (120, 180), poll=60)
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.volume_note == ""
    store.close()


def test_a_station_store_of_schema_4_upgrades_and_a_schema_4_release_refuses_it(tmp_path: Path) -> None:
    """Schema 5 keeps the readings known missing while an overflow is open; a schema-4 file
    opens with none, and a release that reads up to schema 4 refuses the upgraded file."""
    path = tmp_path / "station.sqlite"
    old = connect(path, Schema("station store", SCHEMA.migrations[:4]))
    old.execute(
        "INSERT INTO overflows (sensor, start, end, peak, volume_gal, due, method, opened_by)"
        " VALUES ('lvl', ?, NULL, 9.3, 1234.5, ?, 'weir', 'lvl')",
        (T0, T0 + 7200),
    )
    old.close()
    store = StationStore(path)
    (rec,) = store.open_overflows()
    assert (rec.volume_gal, rec.missing_from, rec.missing_to, rec.disagree_from) == (1234.5, None, None, None)
    assert store.db.execute("PRAGMA user_version").fetchone() == (SCHEMA.version,)
    store.close()
    with pytest.raises(
        Exception, match=rf"newer station-monitor \(schema {SCHEMA.version}, this release reads up to 4\)"
    ):
        connect(path, Schema("station store", SCHEMA.migrations[:4]))


def test_a_level_back_below_overflow_while_the_float_says_spilling_is_said_to_disagree(
    tmp_path: Path,
) -> None:
    """The level reads 9.5 ft, then its transmitter fails (comm failure) from +300 s and comes
    back at +600 s reading 7.0 ft (plausible, under the overflow setpoint) while the float
    switch, the independent high-level witness, stays on until +1500 s. The float keeps the
    overflow open (it decides when the level is in doubt, as when the level is stale); the
    weir's volume on 7.0 ft is 0 gal a minute. Before: the record read as measured, nothing
    said the two instruments disagreed for 15 minutes of a spill the float saw."""
    config = station(tmp_path, **WEIR)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    for t in range(0, 1801, 30):
        if t < 300:
            samples.append(Sample("lvl", T0 + t, 9.5))
        elif t < 600:
            samples.append(Sample("lvl", T0 + t, 9.5, Quality.COMM_FAILURE))
        else:
            samples.append(Sample("lvl", T0 + t, 7.0))
        samples.append(Sample("switch", T0 + t, 1.0 if t < 1500 else 0.0))
    feed(tracker, samples)
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end) == (T0, T0 + 1500)  # the float's word: open until its off
    assert (rec.disagree_from, rec.disagree_to, rec.disagree_level) == (T0 + 600, T0 + 1500, 7.0)
    assert rec.volume_note.startswith("partial: ")
    assert rec.volume_note.endswith(
        "; the level read 7, under overflow, while the overflow switch was on from"
        " 2026-05-28T20:36:40Z to 2026-05-28T20:51:40Z: the instruments disagree; the switch kept"
        " the overflow open, the volume then is the level's"
    )
    store.close()


def test_the_stretch_of_missing_readings_moves_with_a_gateway_clock_step(tmp_path: Path) -> None:
    """Bad level readings +120 s to +210 s, then the gateway clock steps an hour back (NTP) and
    the overflow goes on on the new clock: the stretch moves with the record's other times.
    Left at its old stamps it lay an hour after the record's end."""
    config = station(tmp_path, overflow_switch=None, **WEIR)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = _level_only(270)
    samples = [
        s if not T0 + 120 <= s.time <= T0 + 210 else Sample("lvl", s.time, 9.5, Quality.BAD_DATA)
        for s in samples
    ]
    feed(tracker, samples)
    tracker.shift(-3600.0)
    feed(
        tracker,
        [Sample("lvl", T0 - 3600 + t, 9.5) for t in range(300, 601, 30)] + [Sample("lvl", T0 - 2970, 8.0)],
    )
    (rec,) = store.overflows(T0 - 7200, T0 + 3600)
    assert (rec.start, rec.end) == (T0 - 3600, T0 - 2970)
    assert (rec.missing_from, rec.missing_to) == (T0 - 3600 + 90, T0 - 3600 + 240)
    assert "level readings missing from 2026-05-28T19:28:10Z to 2026-05-28T19:30:40Z" in rec.volume_note
    store.close()
