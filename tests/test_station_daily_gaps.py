"""The station's daily log has a point for every local day, the days the daemon was down
included: what was not monitored is said (`unmonitored_hours`), never given as zeros."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import yaml

from monitor.config import build_config, load_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Sample
from monitor.sqlite import Schema, connect
from monitor.station import StationStore, StationTracker
from monitor.station.report import report
from monitor.station.store import SCHEMA
from simulators.lift_station import LiftStation
from tests.test_station_live import DAY as SIM_DAY
from tests.test_station_live import START, polls, write_config
from tests.test_station_tracker import T0, station

MIDNIGHT = T0 + 27_200  # 2026-05-29 00:00 in New York (EDT), the station's zone
DAY = 86_400


def _fields(point: str) -> dict[str, str]:
    return dict(kv.split("=") for kv in point.split(" ")[1].split(","))


def _days(points: list[str], measurement: str) -> dict[str, dict[str, str]]:
    """Each day's fields of `measurement` (station_daily, or pump_daily of p1)."""
    out: dict[str, dict[str, str]] = {}
    for p in points:
        if p.startswith(measurement + ",") and (measurement == "station_daily" or "pump=p1" in p):
            day = next(tag for tag in p.split(" ")[0].split(",") if tag.startswith("day="))[4:]
            out[day] = _fields(p)
    return out


def _polls(start: float, end: float) -> list[Sample]:
    """The well polled every minute: the level at 4 ft, p1 running, p2 off."""
    out: list[Sample] = []
    for t in range(int(start), int(end), 60):
        out += [Sample("lvl", t, 4.0), Sample("p1", t, 1.0), Sample("p2", t, 0.0)]
    return out


@pytest.mark.parametrize("restart", [False, True], ids=["replay", "restarted"])
def test_days_the_daemon_was_down_get_a_point_saying_so(tmp_path: Path, restart: bool) -> None:
    """Polled from 22:00 on the 28th to 23:00, then nothing until 01:00 on the 30th (the daemon
    down over two midnights), then to 00:00 on the 31st. Before: no point for the 28th nor the
    29th after the restart (the restarted tracker began its days at its first reading): holes
    in the operator's daily log. Now the 28th says its 23 hours not monitored (the first
    reading came at 22:00, the last at 22:59), the 29th is wholly unmonitored and gives no
    figure (none was measured: no 0 run hours, no 0 overflows), the 30th its first hour; the
    same live across the restart and in replay of the readings."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    points: list[str] = []
    before = _polls(MIDNIGHT - 7200, MIDNIGHT - 3600)
    after = _polls(MIDNIGHT + DAY + 3600, MIDNIGHT + 2 * DAY + 60)
    for s in before:
        tracker.feed(s)
    if restart:
        tracker.save()
        points += tracker.take_daily()
        store.close()
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store, resume=True)
    for s in after:
        tracker.feed(s)
        points += tracker.take_daily()
    days = _days(points, "station_daily")
    assert sorted(days) == ["2026-05-28", "2026-05-29", "2026-05-30"]
    first, down, back = days["2026-05-28"], days["2026-05-29"], days["2026-05-30"]
    assert float(first["unmonitored_hours"]) == pytest.approx(22.0 + 1.0 + 1 / 60)
    assert "run_hours" in first and first["overflows"] == "0i"
    assert down == {"unmonitored_hours": "24.0"}  # nothing measured: no figure, no zero
    assert float(back["unmonitored_hours"]) == pytest.approx(1.0)
    assert float(back["run_hours"]) == pytest.approx(23.0, abs=0.02)
    pumps = _days(points, "pump_daily")
    assert pumps["2026-05-29"] == {"unmonitored_hours": "24.0"}
    assert float(pumps["2026-05-30"]["unmonitored_hours"]) == pytest.approx(1.0)
    store.close()


def test_a_day_monitored_throughout_says_so(tmp_path: Path) -> None:
    """The guard: polled every minute across the whole 29th, `unmonitored_hours` is 0.0."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    for s in _polls(MIDNIGHT - 60, MIDNIGHT + DAY + 60):
        tracker.feed(s)
    day = _days(tracker.take_daily(), "station_daily")["2026-05-29"]
    assert day["unmonitored_hours"] == "0.0" and float(day["run_hours"]) == pytest.approx(24.0, abs=0.02)
    store.close()


@pytest.mark.integration
def test_the_daemon_back_after_a_day_down_writes_the_days_it_missed(tmp_path: Path) -> None:
    """The daemon, fed as the poller feeds it (the lift-station simulator, one batch a minute,
    the config of `config/pump-station.yaml` with InfluxDB), stops at 23:00 local on Jan 1 and
    starts again at 01:00 on Jan 3. Before: its outbox held no `station_daily` for Jan 1 nor
    Jan 2 (the restarted daemon began its days at its first reading). Now both are queued for
    InfluxDB at the restart's first poll, Jan 2 saying only that it was not monitored."""
    sim = LiftStation(START, days=3.5, storm=None, failure=None, slug=None).run()
    csv = tmp_path / "s.csv"
    sim.write_csv(csv, 60.0)
    path = write_config(tmp_path, "live")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["influx"] = {"url": "http://127.0.0.1:9", "api": "v1", "database": "station"}  # never drained here
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    batches = polls(csv)
    down, back = START + 28 * 3600, START + 2 * SIM_DAY + 6 * 3600  # 23:00 Jan 1, 01:00 Jan 3 local
    daily: dict[str, dict[str, str]] = {}
    for part in ([b for b in batches if b[0].time < down], [b for b in batches if b[0].time >= back]):
        clock = ManualClock(part[0][0].time)
        daemon = Daemon(load_config(path), clock)
        try:
            for batch in part:
                clock.set(batch[0].time)
                daemon.pipeline.process(batch)
            assert daemon.sink.outbox is not None
            daily |= _days(daemon.sink.outbox.pending_lines(10**6), "station_daily")
            daemon.station.close()
        finally:
            daemon.meters.close()
            daemon.alarms.close()
            daemon.sink.close()
    assert sorted(daily) == ["2025-12-31", "2026-01-01", "2026-01-02", "2026-01-03"]
    assert float(daily["2026-01-01"]["unmonitored_hours"]) == pytest.approx(1.0, abs=0.02)
    assert daily["2026-01-02"] == {"unmonitored_hours": "24.0"}
    assert float(daily["2026-01-03"]["unmonitored_hours"]) == pytest.approx(1.0, abs=0.02)
    assert float(daily["2026-01-03"]["run_hours"]) > 1.0


def _down_and_back(tmp_path: Path) -> tuple[StationStore, list[str]]:
    """`test_days_the_daemon_was_down_get_a_point_saying_so`'s restart, p1 running throughout:
    down from 23:00 on the 28th to 01:00 on the 30th. The store and the daily points."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    for s in _polls(MIDNIGHT - 7200, MIDNIGHT - 3600):
        tracker.feed(s)
    tracker.save()
    points = tracker.take_daily()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    for s in _polls(MIDNIGHT + DAY + 3600, MIDNIGHT + 2 * DAY + 60):
        tracker.feed(s)
        points += tracker.take_daily()
    tracker.save()
    return store, points


def test_the_pumps_report_leaves_out_the_hours_not_monitored_as_the_daily_point_does(
    tmp_path: Path,
) -> None:
    """`monitor pumps report` over a day is the day's `pump_daily` point. Before, the report
    counted p1's run open across the downtime as running through it: 24 h on the 30th (the
    point: 23 h) and 24 h on the 29th, a day nobody watched (the point: unmonitored only)."""
    store, points = _down_and_back(tmp_path)
    zone = ZoneInfo("America/New_York")
    daily = _days(points, "pump_daily")
    for day, start in (("2026-05-29", MIDNIGHT), ("2026-05-30", MIDNIGHT + DAY)):
        pumps = report(store, ["p1", "p2"], start, start + DAY, zone)["pumps"]
        assert isinstance(pumps, list)
        p1 = pumps[0]
        point = daily[day]
        assert p1["run_hours"] == pytest.approx(float(point.get("run_hours", "0")), abs=1e-3)
        assert p1["unmonitored_hours"] == pytest.approx(float(point["unmonitored_hours"]), abs=1e-3)
    store.close()


def test_a_restart_killed_before_it_saved_does_not_count_the_downtime_twice(tmp_path: Path) -> None:
    """The daemon comes back at 01:00 on the 30th (its silence since 23:00 on the 28th kept at
    once), is killed -9 ten minutes later, before it saved its progress (every 30 s of wall
    time, or its sensors' first minutes), and comes back again at 01:30: the store's last event
    time is still 23:00 on the 28th. Before, the two silences from it were both counted: 48
    hours unmonitored on the 29th, 2.5 on the 30th. Now one silence, to 01:30 (the ten minutes
    watched between are lost with the progress not saved: counted unmonitored, not measured)."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    for s in _polls(MIDNIGHT - 7200, MIDNIGHT - 3600):
        tracker.feed(s)
    tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    for s in _polls(MIDNIGHT + DAY + 3600, MIDNIGHT + DAY + 4200):
        tracker.feed(s)
    store.close()  # kill -9: no `save`
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    points: list[str] = []
    for s in _polls(MIDNIGHT + DAY + 5400, MIDNIGHT + 2 * DAY + 60):
        tracker.feed(s)
        points += tracker.take_daily()
    days = _days(points, "station_daily")
    assert days["2026-05-29"] == {"unmonitored_hours": "24.0"}
    assert float(days["2026-05-30"]["unmonitored_hours"]) == pytest.approx(1.5)
    store.close()


@pytest.mark.parametrize(
    ("down", "hours"),
    [("2026-11-01", "25.0"), ("2026-03-08", "23.0")],
    ids=["fall-back", "spring-forward"],
)
def test_a_day_wholly_down_at_a_clock_change_has_its_own_length(
    tmp_path: Path, down: str, hours: str
) -> None:
    """Days are local: a day wholly down on which the clocks go back is 25 hours unmonitored,
    on which they go forward 23, and the days either side 1 hour each (down from 23:00 the
    day before, back at 01:00 the day after)."""
    zone = ZoneInfo("America/New_York")
    day = datetime.fromisoformat(down).replace(tzinfo=zone)
    before = (day - timedelta(days=1)).replace(hour=22).timestamp()
    after = (day + timedelta(days=1)).replace(hour=1).timestamp()
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    for s in [*_polls(before, before + 3600), *_polls(after, after + 23 * 3600 + 60)]:
        tracker.feed(s)
    days = _days(tracker.take_daily(), "station_daily")
    assert days[down] == {"unmonitored_hours": hours}
    ahead = (day + timedelta(days=1)).date().isoformat()
    assert float(days[ahead]["unmonitored_hours"]) == pytest.approx(1.0)
    store.close()


def test_a_schema_5_store_upgrades_keeping_its_silences_and_a_schema_5_release_refuses_it(
    tmp_path: Path,
) -> None:
    """Schema 6 keeps every silence not monitored (table `unmonitored`), for reports over any
    period; schema 5 kept those of the days not closed in `meta` (key `unmonitored`). A
    schema-5 file's are still read after the upgrade (a restart's days, reports), and a release
    that reads up to schema 5 refuses the upgraded file, naming it."""
    path = tmp_path / "station.sqlite"
    old = connect(path, Schema("station store", SCHEMA.migrations[:5]))
    down, back = MIDNIGHT - 3600.0, MIDNIGHT + DAY + 3600.0
    old.execute("INSERT INTO meta VALUES ('unmonitored', ?)", (f"{down!r} {back!r}",))
    old.close()
    store = StationStore(path)
    assert store.db.execute("PRAGMA user_version").fetchone() == (SCHEMA.version,)
    assert store.unmonitored(MIDNIGHT, MIDNIGHT + DAY) == [(down, back)]
    store.save_unmonitored((back + 7200, back + 9000))
    assert store.unmonitored() == [(down, back), (back + 7200, back + 9000)]
    store.close()
    with pytest.raises(
        Exception, match=rf"newer station-monitor \(schema {SCHEMA.version}, this release reads up to 5\)"
    ):
        connect(path, Schema("station store", SCHEMA.migrations[:5]))


@pytest.mark.parametrize("boot", [60.0, -400 * DAY], ids=["fake-hwclock", "unset-clock"])
def test_a_gateway_booted_on_a_clock_behind_then_stepped_by_ntp_says_the_days_it_was_down(
    tmp_path: Path, boot: float
) -> None:
    """Down from 23:00 on the 28th for 26 hours; the gateway boots on a clock behind (one
    without a battery: fake-hwclock's time saved at shutdown, or an unset clock), the daemon
    reads ten minutes on it, then NTP steps the clock forward to the real time (the tracker
    moves what it measures by the step). Before: the downtime was taken for the clock's step,
    no silence: the 29th, a day nobody watched, had a point saying it was monitored
    throughout (0 unmonitored hours, 0 run hours, 0 overflows: zeros read as measured). Now
    the readings since the restart were on the clock behind: the restart came at the first
    one's time plus the step, and the silence from 23:00 on the 28th to it is unmonitored; and a
    later silence (the link dead two hours) is still found (the sensors' stale times moved with
    their readings, not the store's last time by a step of 56 years)."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    for s in _polls(MIDNIGHT - 7200, MIDNIGHT - 3600):
        tracker.feed(s)
    tracker.save()
    points = tracker.take_daily()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    back = MIDNIGHT + DAY + 60  # the real time of the restart: 00:01 on the 30th
    first = MIDNIGHT - 3600 + boot  # on the clock behind
    for s in _polls(first, first + 600):
        tracker.feed(s)
    tracker.shift(back - first)
    hole = (MIDNIGHT + DAY + 12 * 3600, MIDNIGHT + DAY + 14 * 3600)  # the gateway's link dead after
    for s in _polls(back + 600, MIDNIGHT + 2 * DAY + 60):
        if not hole[0] <= s.time < hole[1]:
            tracker.feed(s)
            points += tracker.take_daily()
    days = _days(points, "station_daily")
    assert float(days["2026-05-28"]["unmonitored_hours"]) == pytest.approx(22.0 + 1.0 + 1 / 60)
    assert days["2026-05-29"] == {"unmonitored_hours": "24.0"}
    assert float(days["2026-05-30"]["unmonitored_hours"]) == pytest.approx(1 / 60 + 2.0 + 1 / 60)
    store.close()


def test_a_clock_a_day_ahead_stepped_back_leaves_no_day_without_a_point(tmp_path: Path) -> None:
    """A gateway's first start on a clock a day ahead (its RTC set wrong, no NTP yet): the
    daemon reads from 10:00 on the 28th, stamped the 29th; at 13:00 NTP steps the clock back a
    day. Before: the station's day still ended at the wrong clock's midnight (the 29th's end),
    so the 28th, monitored from 10:00, never had a point (a hole in the daily log). Now the
    day ends at the midnight after the last reading on the new clock."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    start = MIDNIGHT - 14 * 3600  # 10:00 on the 28th
    for s in _polls(start + DAY, start + DAY + 3 * 3600):
        tracker.feed(s)
    tracker.shift(-DAY)
    points: list[str] = []
    for s in _polls(start + 3 * 3600, MIDNIGHT + DAY + 60):
        tracker.feed(s)
        points += tracker.take_daily()
    days = _days(points, "station_daily")
    assert sorted(days) == ["2026-05-28", "2026-05-29"]
    assert float(days["2026-05-28"]["unmonitored_hours"]) == pytest.approx(10.0)
    assert float(days["2026-05-28"]["run_hours"]) == pytest.approx(14.0, abs=0.02)
    store.close()


def test_a_downtime_shorter_than_a_quiet_sensor_s_stale_after_is_still_unmonitored(tmp_path: Path) -> None:
    """The float switch reports on change (MQTT), so its `stale_after` is a day; the level and
    the pumps are polled every minute (5 min). Nothing comes from 23:00 on the 28th to 19:00
    on the 29th, 20 hours: the daemon down (a restart), or the gateway's link with the switch's
    last report more than a day old (replay). Before: a silence counted only past the longest
    `stale_after` of the station's sensors (a day), so the 29th had a point saying it was
    monitored throughout, and its run hours counted p1's run through the silence. Now a
    silence is unmonitored once every sensor's last reading is stale (each its own
    `stale_after` after it; the daemon down, once its quickest sensor's would be)."""
    for restart in (False, True):
        config = build_config(
            {
                "station": {"id": "t", "timezone": "America/New_York"},
                "state_dir": str(tmp_path / str(restart)),
                "sensors": [
                    {"id": "lvl", "kind": "level", "unit": "ft",
                     "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                    {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                    {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                    {"id": "switch", "kind": "status", "stale_after": "1d"},
                ],
                "wet_well": {"level": "lvl", "overflow_switch": "switch"},
            }
        )  # fmt: skip
        assert config.rules["switch"].stale_after == DAY
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store)
        points: list[str] = []
        switch = Sample("switch", MIDNIGHT - 7200 - (0 if restart else DAY), 0.0)
        for s in [switch, *_polls(MIDNIGHT - 7200, MIDNIGHT - 3600)]:
            tracker.feed(s)
        if restart:
            tracker.save()
            points += tracker.take_daily()
            store.close()
            store = StationStore.open(config.state_dir)
            tracker = StationTracker(config, store, resume=True)
        for s in _polls(MIDNIGHT + 19 * 3600, MIDNIGHT + DAY + 60):
            tracker.feed(s)
            points += tracker.take_daily()
        day = _days(points, "station_daily")["2026-05-29"]
        assert float(day["unmonitored_hours"]) == pytest.approx(19.0), restart
        assert float(day["run_hours"]) == pytest.approx(5.0, abs=0.02), restart
        store.close()


def test_a_clock_ahead_set_right_while_the_daemon_was_down_leaves_no_day_without_a_point(
    tmp_path: Path,
) -> None:
    """The daemon runs from 22:00 to 23:00 on the 28th on a clock a day ahead (stamped the
    29th), is stopped, and NTP sets the clock right while it is down; it starts at 01:00 on the
    29th and finds the step at start (its history ahead of the clock: `shift` before any
    reading). Before: the restarted day still ended at the wrong clock's midnight (the 29th's
    end) and the silence began at the 29th's start: the 28th had no point at all. Now the 28th
    closes at its midnight, its silence from the last reading (moved back a day) to 01:00."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    for s in _polls(MIDNIGHT - 7200 + DAY, MIDNIGHT - 3600 + DAY):
        tracker.feed(s)
    tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    tracker.shift(-DAY)
    points: list[str] = []
    for s in _polls(MIDNIGHT + 3600, MIDNIGHT + DAY + 60):
        tracker.feed(s)
        points += tracker.take_daily()
    days = _days(points, "station_daily")
    assert sorted(days) == ["2026-05-28", "2026-05-29"]
    assert float(days["2026-05-28"]["unmonitored_hours"]) == pytest.approx(22.0 + 1.0 + 1 / 60)
    assert float(days["2026-05-29"]["unmonitored_hours"]) == pytest.approx(1.0)
    store.close()


def test_the_longest_run_is_the_longest_seen_not_one_through_the_downtime(tmp_path: Path) -> None:
    """p1 runs before the daemon goes down (22:00 to 23:00 on the 28th) and after it comes
    back (01:00 on the 30th to the 31st): the store holds one run across the downtime. Before:
    `longest_run_hours` was that run's whole length, 50 hours, in the same point whose
    `run_hours` left the downtime out (23): a pump "seen" running 50 hours on a day it was
    seen for 23. Now the longest run is the longest stretch of it monitored, in the point and
    in the report alike."""
    store, points = _down_and_back(tmp_path)
    point = _days(points, "pump_daily")["2026-05-30"]
    assert float(point["longest_run_hours"]) == pytest.approx(23.0, abs=0.02)
    pumps = report(store, ["p1"], MIDNIGHT + DAY, MIDNIGHT + 2 * DAY, ZoneInfo("America/New_York"))["pumps"]
    assert isinstance(pumps, list)
    assert pumps[0]["longest_run_hours"] == pytest.approx(float(point["longest_run_hours"]), abs=1e-3)
    store.close()
