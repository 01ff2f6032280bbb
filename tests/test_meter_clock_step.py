"""The meter ledger across a gateway clock step back while the daemon runs.

The engine's history and the station's move with the step (monitor/engine/clock_step.py);
the ledger's rows were stamped by the same old clock. Left where they were, the first
reading of the new clock (or a queued one `restamp` moved) sorted before them, and every
row the old clock stamped ahead of the new one was re-judged against it: `backwards`,
rejected, a false meter alarm for up to the step's length, and a reading sharing a time
with an old row dropped as a conflict. The ledger moves them with the step instead, in one
transaction with an audit record the clerk sees in the export and `meters show`.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import itertools
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from monitor.config import Config, Influx, load_config
from monitor.daemon import Daemon
from monitor.engine import ClockWatch
from monitor.meters.billing import CLOCK_STEPPED, usage
from monitor.meters.book import MeterBook
from monitor.meters.ledger import Ledger
from monitor.meters.periods import quarter
from monitor.meters.totalizer import MeterSpec
from monitor.model import ManualClock, Sample, iso
from monitor.sinks.lineproto import meter_point_line
from monitor.sources.meter_history import open_history
from monitor.web.service import StationCollector
from monitor.web.station import StationAdapter
from tests.cli import run_monitor
from tests.conftest import fill_disk
from tests.daemon_process import running_daemon
from tests.engine_helpers import T0
from tests.services import InfluxDB1, VictoriaMetrics, http, refused_port, wait_until
from tests.test_pipeline import close

ROOT = Path(__file__).resolve().parent.parent
METER = "shop.meter"
STEP = -3600.0

# The InfluxDB nobody listens on: a port bound and not listening for as long as this test
# process runs, so it refuses and no other test's server can take it (a bare free_port()
# could be bound by one a moment later, which then answers /write).
NOBODY = contextlib.ExitStack().enter_context(refused_port())


def meter_station(
    tmp_path: Path, influx: str = "", database: str = "plant", section: dict[str, Any] | None = None
) -> Path:
    """One totalizer (ft3, 6 digits, a max rate) and a pH probe; by default an InfluxDB nobody
    listens on, so what the ledger hands it stays in the outbox to be read. `section`: the
    whole `influx` section instead (a VictoriaMetrics)."""
    raw: dict[str, Any] = {
        "station": {"id": "ps-meter-step", "timezone": "UTC"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": METER, "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "shop",
             "max_rate": 100_000},
            {"id": "ph", "kind": "ph"},
        ],
        "influx": section or {"url": influx or f"http://127.0.0.1:{NOBODY}", "api": "v1",
                              "database": database},
        "billing": {"rate_per_kcf": "4.25", "accounts": [{"id": "shop", "class": "commercial"}]},
        "console": {"enabled": False},
        "store": {"free_space_floor": 0},
    }  # fmt: skip
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


class Stepped:
    """The daemon with the watch on injected clocks; the gateway clock steps back an hour
    after +65 s of real time (as in tests/test_clock_step.py)."""

    def __init__(self, config: Config, start: float = 0.0) -> None:
        """`start`: the real seconds since T0 at which this daemon starts (a restart)."""
        self.wall, self.mono = ManualClock(self.at(start)), ManualClock(1000.0 + start)
        self.daemon = Daemon(config, self.wall)
        self.daemon.watch_clock(ClockWatch(self.daemon.engine, wall=self.wall.now, monotonic=self.mono.now))

    def at(self, k: float) -> float:
        return T0 + k + (STEP if k > 65 else 0.0)

    def poll(self, k: float, meter: float) -> None:
        t = self.at(k)
        self.wall.set(t)
        self.mono.set(1000.0 + k)
        self.daemon.pipeline.process([Sample(METER, t, meter), Sample("ph", t, 7.0)])

    def step(self) -> None:
        """NTP steps the clock back at +65 s; the tick at +70 s notices it."""
        self.wall.set(self.at(70))
        self.mono.set(1000.0 + 70)
        self.daemon.tick()


def run_across_a_step(tmp_path: Path, path: Path | None = None, drain: bool = False) -> tuple[Path, Stepped]:
    """Polls every 10 s, the register +10 ft3 each: 100 at +0 s ... 150 at +50 s on the old
    clock; the poll of +60 s (160) queued across the step and judged after it; 170 ... 200
    from +70 s on the new clock. `drain`: the old clock's points reach InfluxDB first."""
    path = path or meter_station(tmp_path)
    gw = Stepped(load_config(path))
    for k in range(0, 51, 10):
        gw.poll(k, 100.0 + k)
    if drain:
        assert asyncio.run(gw.daemon.sink.drain(30.0)) == 0
    gw.step()
    gw.daemon.pipeline.process([Sample(METER, T0 + 60, 160.0), Sample("ph", T0 + 60, 7.0)])
    for k in range(70, 101, 10):
        gw.poll(k, 100.0 + k)
    return path, gw


def test_a_step_back_moves_the_ledger_with_it_no_false_alarm_and_consumption_conserved(
    tmp_path: Path,
) -> None:
    """Every reading is in the ledger once, on the new clock, in the order it was taken, all
    accepted: 100 ft3 from 100 to 200, as without a step. No meter alarm. The export (as the
    clerk gets it) bills the 100 ft3 and says the clock stepped; `meters show` lists the
    step. Before: the rows at +0 ... +50 s were `backwards` and rejected, the alarm "reading
    went backwards from 160 to 150" was raised, and the quarter billed 50 ft3."""
    path, gw = run_across_a_step(tmp_path)
    daemon = gw.daemon
    try:
        alarms = [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)]
        assert alarms == []
        ledger = daemon.meters.ledger
        rows = ledger.rows(METER)
        assert [(r.time - T0, float(r.reading)) for r in rows] == [
            (k - 3600.0, 100.0 + k) for k in range(0, 101, 10)
        ]
        assert all(r.accepted for r in rows), [r.describe() for r in rows if not r.accepted]
        assert sum(r.volume for r in rows) == 100
        assert ledger.conflicts(METER) == 0
        (step,) = ledger.clock_steps()
        assert (step.step_ms, step.rows) == (-3_600_000, 6)
        assert (step.first_ms, step.last_ms) == (round(T0 * 1000), round((T0 + 50) * 1000))
        # The InfluxDB copy gets the moved rows at their new times.
        outbox = daemon.sink.outbox
        assert outbox is not None
        lines = [line for line in outbox.pending_lines(10_000) if line.startswith("meter,")]
        sent_ns = {int(line.rsplit(" ", 1)[1]) for line in lines}
        assert {round((T0 + k - 3600) * 1e9) for k in range(0, 101, 10)} <= sent_ns
    finally:
        close(daemon)
    out = tmp_path / "q.csv"
    done = run_monitor("billing", "export", "--config", str(path), "--quarter", "2026Q2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    (row,) = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    assert (row["first_read"], row["last_read"], row["consumption_ft3"]) == ("100", "200", "100.000")
    note = f"gateway clock stepped back by 1h 0m at {iso(T0 + 70 - 3600)}: 6 readings re-stamped"
    assert note in row["flags"].split(";")
    assert "anomaly" not in row["flags"]
    shown = run_monitor("meters", "show", "--config", str(path), "--meter", METER)
    assert shown.returncode == 0, shown.stderr
    assert note in shown.stdout
    assert "REJECTED" not in shown.stdout


def export(path: Path, *flags: str) -> dict[str, str]:
    """The clerk's export of the quarter, from the ledger or (`--from-influx`) the historian."""
    got = run_monitor("billing", "export", *flags, "--config", str(path), "--quarter", "2026Q2", "--out", "-")
    assert got.returncode == 0, got.stderr
    (row,) = list(csv.DictReader(io.StringIO(got.stdout)))
    return row


def test_the_historian_bills_each_moved_reading_once_and_flags_the_quarter(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    """The old clock's points reached InfluxDB before the step; InfluxDB cannot delete them.
    They are overwritten as rejected and billing nothing, the readings are written again at
    their new times: `billing export --from-influx` bills the 100 ft3 the ledger does, and
    flags the quarter `anomaly` (the rejected records; the note itself lives in the ledger).
    Left as they were, the historian summed both copies (150.000 ft3, measured) with no
    `anomaly`: the register going from 200 back to 100 was taken for a settings change
    (`one settings period assumed`)."""
    influxdb1.query("CREATE DATABASE meter_step")
    path = meter_station(tmp_path, influxdb1.url, "meter_step")
    _, gw = run_across_a_step(tmp_path, path, drain=True)
    daemon = gw.daemon
    try:
        assert asyncio.run(daemon.sink.drain(30.0)) == 0
        got = influxdb1.query("SELECT reading, consumption_ft3, accepted FROM meter", db="meter_step")
        values = [tuple(v[1:]) for v in got["results"][0]["series"][0]["values"]]  # in time order
        assert values == [(100.0 + k, 0.0 if k == 0 else 10.0, 1) for k in range(0, 101, 10)] + [
            (100.0 + k, 0.0, 0) for k in range(0, 51, 10)
        ]
        assert daemon.meters.ledger.unsent() == ([], [])
    finally:
        close(daemon)
    ledger, historian = export(path), export(path, "--from-influx")
    assert historian["consumption_ft3"] == ledger["consumption_ft3"] == "100.000"
    print("HIST", historian, ledger)
    assert (historian["first_read"], historian["last_read"]) == ("100", "200")
    assert "anomaly" in historian["flags"].split(";")
    assert "anomaly" not in ledger["flags"]
    assert "replacement" not in historian["flags"] and "one settings period assumed" not in historian["flags"]


@pytest.mark.parametrize("server", ["victoria", "victoria_dedup"])
def test_a_step_found_at_start_reaches_victoriametrics_billed_once(
    tmp_path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    """The daemon ran on a clock an hour ahead and its points reached a real VictoriaMetrics
    (+0 ... +50 s: 100 ... 150); it was restarted on the right clock with nothing to tell it of
    the step (no checkpoint): the start finds the ledger ahead and moves its rows, the points at
    the old times are overwritten as re-stamped (rejected, billing nothing), and the readings of
    the new clock follow (170 ... 200). VictoriaMetrics keeps both values at each old time; the
    historian export must read the re-stamped one, as InfluxDB's overwrite leaves it, and bill
    what the ledger bills: 100 ft3 from 100 to 200, the quarter `anomaly` (the rejected
    records), as `--from-influx` against InfluxDB does for a step seen live. A VictoriaMetrics
    with `-dedup.minScrapeInterval=1ms` keeps one value per field at each old time, from either
    write: the row says `deduplicated` (before: 150 ft3 billed, last read 150, not a word)."""
    victoria: VictoriaMetrics = request.getfixturevalue(server)
    path = meter_station(tmp_path, section={"url": victoria.url, "org": "o", "bucket": "found"})
    before = victoria.lines_taken()
    written = 0
    gw = Stepped(load_config(path))
    daemon = gw.daemon
    try:
        for k in range(0, 51, 10):
            gw.poll(k, 100.0 + k)
        assert asyncio.run(daemon.sink.drain(30.0)) == 0
        assert daemon.sink.drainer is not None
        written += daemon.sink.drainer.stats.written
    finally:
        close(daemon)
        daemon.station.close()
    gw = Stepped(load_config(path), start=70)  # no checkpoint: the ledger is found ahead
    daemon = gw.daemon
    try:
        (step,) = daemon.meters.ledger.clock_steps(METER)
        assert step.found and step.rows == 6
        for k in range(70, 101, 10):
            gw.poll(k, 100.0 + k)
        daemon.pipeline.send_meter_points()
        assert asyncio.run(daemon.sink.drain(30.0)) == 0
        assert daemon.sink.drainer is not None and daemon.meters.ledger.unsent() == ([], [])
        written += daemon.sink.drainer.stats.written
    finally:
        close(daemon)
    victoria.wait_for_lines(before + written)
    victoria.flush()
    ledger, historian = export(path), export(path, "--from-influx")
    assert ledger["consumption_ft3"] == "100.000" and "anomaly" not in ledger["flags"]
    if server == "victoria_dedup":
        assert "deduplicated" in historian["flags"].split(";"), historian
        return
    # Before: the accepted values the old times had were taken (the largest): 150.000 ft3,
    # last read 150 (an old time is the latest), flagged `rewritten` and `one settings period
    # assumed` (the register "going back" from 200 to 100 taken for a settings change).
    assert (historian["first_read"], historian["last_read"]) == ("100", "200")
    assert historian["consumption_ft3"] == "100.000"
    flags = historian["flags"].split(";")
    assert "anomaly" in flags and "rewritten" not in flags and "one settings period assumed" not in flags


# -- the ledger itself: which rows move, and a kill -9 during the move -----------------------

SPEC = MeterSpec(METER, "ft3", 6, Decimal(1), Decimal(100_000), "shop")
HOUR = 3600.0


def long_run_ledger(path: Path) -> None:
    """A previous run on a right clock (readings every 10 min, T0-6 h ... T0-4 h, 1000 ...
    1120), then a boot with the clock an hour ahead: the daemon ran 2 h on it (stamped
    T0-2 h ... T0, 1200 ... 1320) before NTP stepped it back at the real T0-1 h."""
    ledger = Ledger(path, {METER: SPEC}, now=T0 - 6 * HOUR)
    before = [(METER, T0 - 6 * HOUR + 600 * i, Decimal(1000 + 10 * i)) for i in range(13)]
    ahead = [(METER, T0 - 2 * HOUR + 600 * i, Decimal(1200 + 10 * i)) for i in range(13)]
    ledger.add_many(before + ahead)
    ledger.close()


def snapshot(path: Path) -> dict[str, list[tuple[object, ...]]]:
    db = sqlite3.connect(path)
    try:
        tables = ("readings", "replacements", "conflicts", "amendments", "settings", "unsent", "clock_steps")
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}
    finally:
        db.close()


def test_a_step_back_moves_the_old_clocks_rows_down_to_a_gap_of_the_step_keeping_their_order(
    tmp_path: Path,
) -> None:
    """The daemon ran 2 h on a clock an hour ahead. Only the last hour's rows are ahead of the
    new clock; moved alone, they landed among the hour before, which went `backwards` against
    them. All the old clock's rows move (down to the boot's gap, which is at least the step),
    each to the time it was taken; the previous run's rows stay. A reading of the new clock
    then follows them: every row accepted, the 320 ft3 conserved."""
    path = tmp_path / "ledger.sqlite"
    long_run_ledger(path)
    ledger = Ledger(path, {METER: SPEC}, now=T0 - HOUR)
    try:
        changed = ledger.clock_step(-HOUR, T0 - HOUR)
        assert changed == {METER: []}  # the order kept: no verdict changed
        (step,) = ledger.clock_steps(METER)
        first, last = round((T0 - 2 * HOUR) * 1000), round(T0 * 1000)
        assert (step.rows, step.first_ms, step.last_ms) == (13, first, last)
        ledger.add(METER, T0 - HOUR + 600, Decimal(1330))
        rows = ledger.rows(METER)
        want = [T0 - 6 * HOUR + 600 * i for i in range(13)] + [T0 - 3 * HOUR + 600 * i for i in range(14)]
        assert [r.time for r in rows] == want
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 330
        # The same step noticed again (a restart before the engine's checkpoint held it) moves nothing.
        assert ledger.clock_step(-HOUR, T0 - HOUR + 600) == {}
    finally:
        ledger.close()


STEPPER = """
import os, signal, sqlite3, sys
from decimal import Decimal
from pathlib import Path
real = sqlite3.connect
armed = [False]
def trace(statement):
    if armed[0] and os.environ["KILL_AT"] in statement:
        os.kill(os.getpid(), signal.SIGKILL)
def connect(*args, **kwargs):
    db = real(*args, **kwargs)
    db.set_trace_callback(trace)
    return db
sqlite3.connect = connect
from monitor.meters.billing import CLOCK_STEPPED, usage
from monitor.meters.book import MeterBook
from monitor.meters.ledger import Ledger
from monitor.meters.periods import quarter
from monitor.meters.totalizer import MeterSpec
spec = MeterSpec("shop.meter", "ft3", 6, Decimal(1), Decimal(100000), "shop")
now = float(sys.argv[2])
ledger = Ledger(Path(sys.argv[1]), {"shop.meter": spec}, now=now)
armed[0] = True
ledger.clock_step(-3600.0, now)
os.kill(os.getpid(), signal.SIGKILL)  # once it returned: committed
"""


@pytest.mark.parametrize(
    "kill_at",
    ["DELETE FROM readings", "INSERT INTO readings", "INSERT OR IGNORE INTO unsent",
     "INSERT INTO clock_steps", "COMMIT", "returned"],
)  # fmt: skip
def test_a_kill_during_the_move_leaves_the_ledger_as_before_or_as_after(tmp_path: Path, kill_at: str) -> None:
    """A real SIGKILL of the process moving the rows, at a statement of its transaction
    (SQLite's trace hook picks the moment, a fault injection) or once it returned: the ledger
    is as before (no row moved, no audit record) or as after, never half moved; and the step
    noticed again moves it to the same state."""
    before, after = tmp_path / "before.sqlite", tmp_path / "after.sqlite"
    long_run_ledger(before)
    long_run_ledger(after)
    ledger = Ledger(after, {METER: SPEC}, now=T0 - HOUR)
    ledger.clock_step(-HOUR, T0 - HOUR)
    ledger.close()
    path = tmp_path / "killed.sqlite"
    long_run_ledger(path)
    got = subprocess.run(
        [sys.executable, "-c", STEPPER, str(path), str(T0 - HOUR)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "KILL_AT": kill_at},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == -signal.SIGKILL, got.stderr
    state = snapshot(path)
    assert state == snapshot(after if kill_at == "returned" else before)
    ledger = Ledger(path, {METER: SPEC}, now=T0 - HOUR)
    ledger.clock_step(-HOUR, T0 - HOUR)
    ledger.close()
    assert snapshot(path) == snapshot(after)


def test_a_restart_after_a_step_back_moves_the_ledger_with_the_restored_history(tmp_path: Path) -> None:
    """The gateway booted with its clock an hour ahead, the daemon polled 100 ... 150, was
    stopped; NTP stepped the clock back while it was down. At the start the restored history
    is "from the future" (`ClockWatch.check_restored`): the step, at least, moves the ledger
    too, and the readings of the new clock follow in order: no false alarm, 100 ft3."""
    path = meter_station(tmp_path)
    gw = Stepped(load_config(path))
    for k in range(0, 51, 10):
        gw.poll(k, 100.0 + k)
    gw.daemon.tick()
    gw.daemon.checkpoint()
    close(gw.daemon)
    gw.daemon.station.close()
    gw = Stepped(load_config(path), start=70)
    daemon = gw.daemon
    try:
        for k in range(70, 121, 10):  # the first on the new clock notices the step
            gw.poll(k, 100.0 + k)
        alarms = [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)]
        assert alarms == []
        ledger = daemon.meters.ledger
        rows = ledger.rows(METER)
        assert [float(r.reading) for r in rows] == [
            100.0 + k for k in (0, 10, 20, 30, 40, 50, 70, 80, 90, 100, 110, 120)
        ]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 120
        assert rows[5].time < gw.at(70)
        (step,) = ledger.clock_steps(METER)
        assert (step.rows, step.first_ms, step.last_ms) == (6, round(T0 * 1000), round((T0 + 50) * 1000))
    finally:
        close(daemon)


def test_without_a_gap_of_the_step_the_rows_of_the_day_before_are_spread_not_the_whole_history(
    tmp_path: Path,
) -> None:
    """Three days of readings a minute apart, no gap, the clock an hour ahead all along (or a
    drift: no jump the step could stop at). Moving every row by the step would rewrite the whole
    history in one transaction (20 us a row: a year of readings a second is minutes of a
    stopped daemon); the rows of the day before the ones ahead are spread over it instead, in
    order, each by at most the step: every delta kept, all accepted, the older rows untouched."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, {METER: SPEC}, now=T0 - 3 * 86400)
    try:
        ledger.add_many([(METER, T0 - 3 * 86400 + 60 * i, Decimal(1000 + i)) for i in range(3 * 1440 + 1)])
        before = ledger.rows(METER)
        changed = ledger.clock_step(-HOUR, T0 - HOUR)
        assert changed == {METER: []}
        (step,) = ledger.clock_steps(METER)
        assert step.spread and step.describe().endswith(
            "re-stamped (spread over the 1d 1h 59m before: no gap of the step in it)"
        )
        rows = ledger.rows(METER)
        assert [r.reading for r in rows] == [r.reading for r in before]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 3 * 1440
        floor = round((T0 - 2 * HOUR + 2 - 86400) * 1000)
        kept = [(a.time_ms, b.time_ms) for a, b in zip(before, rows, strict=True) if a.time_ms <= floor]
        assert all(a == b for a, b in kept) and len(kept) == 2 * 1440 - 120 + 1
        moved = [(a.time_ms, b.time_ms) for a, b in zip(before, rows, strict=True) if a.time_ms > floor]
        assert step.rows == len(moved) == 1440 + 120
        assert all(floor < b < a and a - b <= 3_600_000 for a, b in moved)
        assert moved[-1][1] <= round((T0 - HOUR + 2) * 1000)
    finally:
        ledger.close()


def test_rows_a_step_spread_reach_victoriametrics_billed_once(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    """Three days of readings a minute apart (+1 ft3 each), all in a real VictoriaMetrics, then a
    step back of an hour with no gap of the step before the rows ahead: 1,560 rows are spread
    over the 26 h before, and their old times are overwritten `restamped` (rejected, 0 billed).
    VictoriaMetrics keeps both values at each old time; the historian must read the overwrite
    there, as InfluxDB's overwrite leaves it, and bill what the ledger bills (4,320 ft3), not
    flag the points `rewritten` and bill the spread readings twice."""
    ledger = Ledger(tmp_path / "ledger.sqlite", {METER: SPEC}, now=T0 - 3 * 86400)
    book = MeterBook(ledger, clock=ManualClock(T0 - HOUR))
    station, bucket = "ps-spread", "spread"
    try:
        ledger.add_many([(METER, T0 - 3 * 86400 + 60 * i, Decimal(1000 + i)) for i in range(3 * 1440 + 1)])
        victoria.write([meter_point_line(station, r) for r in book.take_records()], "o", bucket)
        book.sent()
        ledger.clock_step(-HOUR, T0 - HOUR)
        assert ledger.clock_steps(METER)[0].spread
        again = book.take_records()
        assert sum(1 for r in again if r.restamped == 1) == 1560
        assert any(r.restamped == -1 for r in again)  # moved onto the old stamps' span
        victoria.write([meter_point_line(station, r) for r in again], "o", bucket)
        book.sent()
        billed = sum(r.volume for r in ledger.rows(METER))
    finally:
        ledger.close()
    victoria.flush()
    history = open_history(Influx.model_validate({"url": victoria.url, "org": "o", "bucket": bucket}))
    got = history.records(station, 0, round(T0 * 1000))
    assert sum(s.consumption_ft3 or 0 for s in got) == float(billed) == 4320.0
    assert [s for s in got if s.rewritten] == []


@pytest.mark.parametrize("server", ["victoria", "victoria_dedup"])
def test_a_spread_step_exports_from_both_historians_as_from_the_ledger(
    tmp_path: Path, influxdb1: InfluxDB1, server: str, request: pytest.FixtureRequest
) -> None:
    """The clerk's `billing export --from-influx` after a spread step (three days a minute
    apart, 1 h back, 1,560 rows spread), from a real InfluxDB 1.6 and a real VictoriaMetrics,
    bills what the ledger bills, from the same first to the same last reading. With
    `-dedup.minScrapeInterval=1ms` VictoriaMetrics keeps one value per field at each old
    time: the row says `deduplicated` (before: 4,701 ft3 of 4,320, last read 5316 of 5320,
    flagged only `replacement;estimated;anomaly;unreconciled;...`, never how)."""
    victoria: VictoriaMetrics = request.getfixturevalue(server)
    influxdb1.query("CREATE DATABASE spread")
    (tmp_path / "one").mkdir()
    (tmp_path / "vm").mkdir()
    one = meter_station(tmp_path / "one", influxdb1.url, "spread")
    vm = meter_station(tmp_path / "vm", section={"url": victoria.url, "org": "o", "bucket": "spread2"})
    lines: list[str] = []
    for path in (one, vm):  # a station of its own: the module's VictoriaMetrics is shared
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        raw["station"]["id"] = "ps-spread-export"
        path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        config = load_config(path)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        book = MeterBook.open(config, clock=ManualClock(T0 - 3 * 86400))
        try:
            rows = [(METER, T0 - 3 * 86400 + 60 * i, Decimal(1000 + i)) for i in range(3 * 1440 + 1)]
            book.ledger.add_many(rows)
            lines = [meter_point_line(config.station.id, r) for r in book.take_records()]
            book.sent()
            book.ledger.clock_step(-HOUR, T0 - HOUR)
            assert book.ledger.clock_steps(METER)[0].spread
            lines += [meter_point_line(config.station.id, r) for r in book.take_records()]
            book.sent()
        finally:
            book.close()
    status, body = http("POST", f"{influxdb1.url}/write?db=spread&precision=ns", "\n".join(lines).encode())
    assert status == 204, body
    victoria.write(lines, "o", "spread2")
    victoria.flush()
    for path in (one, vm):
        ledger, historian = export(path), export(path, "--from-influx")
        assert ledger["consumption_ft3"] == "4320.000"
        if path == vm and server == "victoria_dedup":
            assert "deduplicated" in historian["flags"].split(";"), historian
            continue
        assert (historian["first_read"], historian["last_read"], historian["consumption_ft3"]) == (
            ledger["first_read"],
            ledger["last_read"],
            ledger["consumption_ft3"],
        ), (path, historian["flags"])
        assert "rewritten" not in historian["flags"].split(";"), historian["flags"]


def test_rows_two_steps_moved_over_the_same_times_reach_victoriametrics_billed_once(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    """Eleven readings a minute apart on a clock 330 s ahead, all in a real VictoriaMetrics; a
    step back moves them (each by the step), their points are sent, and a second step of the
    same size moves them again, over times the first left. Each old time's last word is the
    overwrite of the latest step (`restamped` its id, above the -id a reading written there
    after an earlier step carries): the historian bills what the ledger bills, nothing
    `rewritten`."""
    ledger = Ledger(tmp_path / "ledger.sqlite", {METER: SPEC}, now=T0 - 2 * HOUR)
    book = MeterBook(ledger, clock=ManualClock(T0))
    station, bucket, step = "ps-twice", "twice", -330.0
    try:
        ledger.add(METER, T0 - 2 * HOUR, Decimal(1000))
        ledger.add_many([(METER, T0 + 60 * i, Decimal(1010 + 10 * i)) for i in range(11)])
        lines = [meter_point_line(station, r) for r in book.take_records()]
        book.sent()
        for now in (T0 + 600 + step, T0 + 600 + 2 * step):
            ledger.clock_step(step, now)
            lines += [meter_point_line(station, r) for r in book.take_records()]
            book.sent()
        steps = ledger.clock_steps(METER)
        assert [(s.rows, s.spread) for s in steps] == [(11, False), (11, False)]
        readings = [float(r.reading) for r in ledger.rows(METER)]
        assert readings == [1000.0] + [1010.0 + 10 * i for i in range(11)]
        billed = sum(r.volume for r in ledger.rows(METER))
    finally:
        ledger.close()
    victoria.write(lines, "o", bucket)
    victoria.flush()
    history = open_history(Influx.model_validate({"url": victoria.url, "org": "o", "bucket": bucket}))
    got = history.records(station, 0, round((T0 + HOUR) * 1000))
    assert [s.time_ms for s in got if s.rewritten] == []
    assert sum(s.consumption_ft3 or 0 for s in got) == float(billed) == 110.0


def test_when_the_new_clock_reaches_the_old_stamps_its_readings_are_no_conflicts(tmp_path: Path) -> None:
    """An hour after the step the new clock stamps the times the old one stamped +0 ... +50 s
    with. Left there, each of those readings (other values, an hour later) was dropped as a
    conflict with the old row; moved, they are new rows: 371 readings, all accepted, 3700 ft3."""
    _, gw = run_across_a_step(tmp_path)
    daemon = gw.daemon
    try:
        for k in range(110, 3701, 10):
            gw.poll(k, 100.0 + k)
        ledger = daemon.meters.ledger
        rows = ledger.rows(METER)
        assert ledger.conflicts(METER) == 0
        assert [(r.time - T0, float(r.reading)) for r in rows] == [
            (k - 3600.0, 100.0 + k) for k in range(0, 3701, 10)
        ]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 3700
        assert [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)] == []
    finally:
        close(daemon)


def meters_health(failures: int, pending: int) -> dict[str, int]:
    """/api/health's `meters` for this station (no meter removed from its config)."""
    return {
        "clock_step_failures": failures,
        "clock_steps_pending": pending,
        "unsent_unconfigured": 0,
        "held_back": 0,
    }


def test_a_move_the_full_disk_refused_is_counted_and_made_before_the_next_reading(
    tmp_path: Path, tiny_disk: Path
) -> None:
    """The state disk (a real 3 MB tmpfs) is full when the step back is noticed: the ledger
    refuses the move. It is counted (`meters` in /api/health, /metrics) and logged once; the
    poll of +60 s waits for the disk. Freed, the move is made first, with the step and the
    notice time it had, then the waiting poll and those of the new clock: the ledger ends as
    a run whose move succeeded at once (tables compared), no meter alarm. Before: one ERROR,
    nothing counted, the rows never moved, and `backwards` was raised for the hour."""
    (tmp_path / "ref").mkdir()
    _, ref = run_across_a_step(tmp_path / "ref")
    close(ref.daemon)
    path = meter_station(tiny_disk)
    gw = Stepped(load_config(path))
    daemon = gw.daemon
    try:
        for k in range(0, 51, 10):
            gw.poll(k, 100.0 + k)
        ballast = fill_disk(tiny_disk)
        gw.step()  # the tick notices the step; the ledger cannot take the move
        ledger = daemon.meters.ledger
        assert [r.time - T0 for r in ledger.rows(METER)] == [float(k) for k in range(0, 51, 10)]
        assert ledger.clock_steps() == []
        health = daemon.health().to_json()
        assert health["meters"] == meters_health(1, 1)
        registry = CollectorRegistry()
        registry.register(StationCollector(StationAdapter(daemon)))  # what /metrics serves
        scraped = generate_latest(registry).decode()
        assert 'station_monitor_meter_clock_step_failures_total{station="ps-meter-step"} 1.0' in scraped
        assert 'station_monitor_meter_clock_steps_pending{station="ps-meter-step"} 1.0' in scraped
        daemon.pipeline.emit([Sample(METER, T0 + 60, 160.0), Sample("ph", T0 + 60, 7.0)])
        assert daemon.pipeline.process_queued() is False  # the disk refuses it too
        gw.step()  # a second tick while still full: the same failure, not counted again
        assert daemon.health().to_json()["meters"] == meters_health(1, 1)
        ballast.unlink()
        daemon.pipeline._retry_at = 0.0  # the retry timer's wait, skipped (a monotonic deadline)
        assert daemon.pipeline.process_queued() is True
        for k in range(70, 101, 10):
            gw.poll(k, 100.0 + k)
        assert [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)] == []
        assert daemon.health().to_json()["meters"] == meters_health(1, 0)
    finally:
        close(daemon)
    got, want = (snapshot(p / "state" / "ledger.sqlite") for p in (tiny_disk, tmp_path / "ref"))
    for state in (got, want):  # when the daemon opened the ledger (the wall clock, not the gateway's)
        state["settings"] = [row[:-1] for row in state["settings"]]
    assert len(got["clock_steps"]) == 1 and got == want


def test_a_move_the_full_disk_refused_survives_a_restart(tmp_path: Path, tiny_disk: Path) -> None:
    """The disk (a real 3 MB tmpfs) refuses the move; the operator frees it and the checkpoint
    timer saves the engine, re-based on the new clock, before the tick retries the move; then
    the daemon is stopped. The move was in memory only: at the next start the checkpoint shows
    no step, and before, the ledger kept the rows stamped +0 ... +50 s ahead of the new clock:
    every reading of the new clock sorted before them, `backwards` (a meter alarm) and the
    quarter billed short. Now the start finds the rows ahead and moves them as a step found
    at start (audited so, "at least"): the readings in order, no alarm, 100 ft3."""
    path = meter_station(tiny_disk)
    gw = Stepped(load_config(path))
    daemon = gw.daemon
    try:
        for k in range(0, 51, 10):
            gw.poll(k, 100.0 + k)
        ballast = fill_disk(tiny_disk)
        gw.step()
        assert daemon.health().to_json()["meters"] == meters_health(1, 1)
        ballast.unlink()
        daemon.checkpoint()  # on the new clock: the restored history will not look ahead
    finally:
        close(daemon)
        daemon.station.close()
    gw = Stepped(load_config(path), start=70)
    daemon = gw.daemon
    try:
        ledger = daemon.meters.ledger
        (step,) = ledger.clock_steps(METER)
        assert step.found and (step.rows, step.first_ms, step.last_ms) == (
            6, round(T0 * 1000), round((T0 + 50) * 1000),
        )  # fmt: skip
        assert step.noticed_ms == round(gw.at(70) * 1000) and step.step_ms == -3_581_000
        assert [r.time for r in ledger.rows(METER)][-1] == gw.at(70) - 1
        for k in range(70, 101, 10):
            gw.poll(k, 100.0 + k)
        rows = ledger.rows(METER)
        assert [float(r.reading) for r in rows] == [100.0 + k for k in range(0, 101, 10) if k != 60]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 100
        assert [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)] == []
        assert daemon.health().to_json()["meters"] == meters_health(0, 0)
    finally:
        close(daemon)
    row = export(path)
    assert row["consumption_ft3"] == "100.000" and "anomaly" not in row["flags"]
    note = (
        f"gateway clock stepped back by at least 59m (found at start {iso(gw.at(70))}:"
        " the ledger's rows were ahead of the clock): 6 readings re-stamped"
    )
    assert note in row["flags"].split(";")


def test_a_ledger_ahead_of_the_clock_at_start_is_moved_as_a_step_found_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger written before this release (or by `meters ingest` while the clock was ahead)
    holds rows an hour ahead of the clock; the engine has no checkpoint to say so. Before, the
    start saw no step and every new reading was judged `backwards` against those rows (the
    meter alarm); the rows are moved at start instead, audited, logged once."""
    path = meter_station(tmp_path)
    config = load_config(path)
    config.state_dir.mkdir(parents=True)
    ledger = Ledger(config.state_dir / "ledger.sqlite", {METER: SPEC}, now=T0)
    ledger.add_many([(METER, T0 + k, Decimal(100 + k)) for k in range(0, 51, 10)])
    ledger.close()
    gw = Stepped(config, start=70)
    daemon = gw.daemon
    try:
        for k in range(70, 101, 10):
            gw.poll(k, 100.0 + k)
        rows = daemon.meters.ledger.rows(METER)
        assert [float(r.reading) for r in rows] == [100.0 + k for k in range(0, 101, 10) if k != 60]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 100
        assert [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)] == []
        (step,) = daemon.meters.ledger.clock_steps(METER)
        assert step.found and step.rows == 6
        said = [r.getMessage() for r in caplog.records if "found at start" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("meter shop.meter: 6 reading(s)"), said
    finally:
        close(daemon)


def test_a_step_found_at_start_that_the_full_disk_refuses_waits_counted_and_is_made_first(
    tmp_path: Path, tiny_disk: Path
) -> None:
    """The ledger is an hour ahead of the clock and the disk (a real 3 MB tmpfs) fills as the
    daemon starts, after its stores opened (full before, the alarm journal refuses to open and
    the daemon does not start): the move found at start is refused like a live one: counted,
    kept, and made before the first reading once the disk has room; no meter alarm, 100 ft3."""
    path = meter_station(tiny_disk)
    gw = Stepped(load_config(path))
    for k in range(0, 51, 10):
        gw.poll(k, 100.0 + k)
    gw.daemon.checkpoint()
    close(gw.daemon)
    gw.daemon.station.close()
    (tiny_disk / "state" / "engine-checkpoint.npz").unlink()  # as if no checkpoint told of it
    gw = Stepped.__new__(Stepped)  # Stepped(start=70), the disk filled before its clock watch
    gw.wall, gw.mono = ManualClock(gw.at(70)), ManualClock(1070.0)
    gw.daemon = daemon = Daemon(load_config(path), gw.wall)
    ballast = fill_disk(tiny_disk)
    daemon.watch_clock(ClockWatch(daemon.engine, wall=gw.wall.now, monotonic=gw.mono.now))
    try:
        assert daemon.health().to_json()["meters"] == meters_health(1, 1)
        assert daemon.meters.ledger.clock_steps() == []
        ballast.unlink()
        for k in range(70, 101, 10):
            gw.poll(k, 100.0 + k)
        rows = daemon.meters.ledger.rows(METER)
        assert [float(r.reading) for r in rows] == [100.0 + k for k in range(0, 101, 10) if k != 60]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == 100
        assert [(e.event, e.message) for e in daemon.alarms.journal.entries(sensor=METER)] == []
        (step,) = daemon.meters.ledger.clock_steps(METER)
        assert step.found and step.noticed_ms == round(gw.at(70) * 1000)
        assert daemon.health().to_json()["meters"] == meters_health(1, 0)
    finally:
        close(daemon)


def test_monitor_run_moves_a_ledger_ahead_of_the_wall_clock_at_its_start(tmp_path: Path) -> None:
    """The same with a real `monitor run` on the real wall clock (the daemon's own clock
    watch, not a test's): rows stamped an hour ahead of now are moved at its start, before
    it takes a reading, and the record says found at start."""
    path = meter_station(tmp_path)
    config = load_config(path)
    config.state_dir.mkdir(parents=True)
    ahead = time.time() + HOUR
    ledger = Ledger(config.state_dir / "ledger.sqlite", {METER: SPEC}, now=ahead)
    ledger.add_many([(METER, ahead + k, Decimal(100 + k)) for k in range(0, 51, 10)])
    ledger.close()
    log = tmp_path / "daemon.log"
    with running_daemon(path, log) as daemon:
        wait_until(lambda: " running: " in log.read_text(), timeout=60, what="the daemon's start")
        assert "found at start" in log.read_text()  # before it ran
        daemon.stop()
    ledger = Ledger(config.state_dir / "ledger.sqlite", {METER: SPEC})
    try:
        (step,) = ledger.clock_steps(METER)
        assert step.found and step.rows == 6 and -HOUR - 60 < step.step_ms / 1000 < -HOUR + 60
        assert all(r.time < time.time() for r in ledger.rows(METER))
    finally:
        ledger.close()


def test_one_far_future_reading_moves_only_itself_not_the_other_rows_or_meters(tmp_path: Path) -> None:
    """Not a clock step: one reading of one meter stamped five years ahead (a typo in an
    ingested file, a device's bad time), the rest of the ledger on the clock. Measured from the
    newest row of all meters, the step (5 years) would have moved every other meter's rows by
    it. Each meter's step is measured from its own newest row, and the rows move down to a gap
    of that step only: the one reading lands a second before now, re-judged; nothing else moves."""
    other = MeterSpec("home.meter", "ft3", 6, Decimal(1), None, "shop")
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, {METER: SPEC, other.meter: other}, now=T0)
    try:
        normal = [(m, T0 + 60 * i, Decimal(100 + i)) for m in (METER, other.meter) for i in range(60)]
        ledger.add_many([*normal, (METER, T0 + 5 * 365 * 86400, Decimal(160))])
        before = snapshot(path)
        now = T0 + 3600
        book = MeterBook(ledger)
        assert book.found_at_start(now, 2.0) == []  # no meter alarm changed
        (step,) = ledger.clock_steps()
        assert (step.meter, step.rows, step.found) == (METER, 1, True)
        after = snapshot(path)
        assert [r for r in after["readings"] if r[0] == other.meter] == [
            r for r in before["readings"] if r[0] == other.meter
        ]
        moved = [r for r in after["readings"] if r not in before["readings"]]
        assert [(r[0], r[1], r[3]) for r in moved] == [(METER, round((now - 1) * 1000), "160")]
        assert book.found_at_start(now, 2.0) == [] and len(ledger.clock_steps()) == 1  # nothing twice
    finally:
        ledger.close()


def test_a_far_future_reading_found_at_a_quick_restart_does_not_spread_the_history(tmp_path: Path) -> None:
    """A restart within a second of the meter's last reading (a restart loop, a meter polled
    every second) with one reading of it stamped five years ahead: the step measured from that
    row lands it a second before now, below the last real reading, so the move looked for a
    gap of five years below, found none and moved the meter's whole history back five years
    (61 of 61 rows: every quarter's consumption gone to 2021). Only the reading ahead may move."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, {METER: SPEC}, now=T0)
    try:
        normal = [(METER, T0 + 60 * i, Decimal(100 + i)) for i in range(60)]
        ledger.add_many([*normal, (METER, T0 + 5 * 365 * 86400, Decimal(160))])
        before = snapshot(path)
        now = T0 + 60 * 59 + 0.5  # the daemon back half a second after the last real reading
        MeterBook(ledger).found_at_start(now, 2.0)
        after = snapshot(path)
        now_ms = round(now * 1000)
        kept = [r for r in before["readings"] if int(str(r[1])) <= now_ms]
        assert [r for r in after["readings"] if int(str(r[1])) <= now_ms - 500] == kept  # not moved
        assert [r[3] for r in after["readings"]][-1] == "160"
        assert all(int(str(r[1])) <= now_ms for r in after["readings"])  # none ahead: no `backwards`
    finally:
        ledger.close()


def test_repeated_small_steps_back_spread_a_few_minutes_of_rows_not_a_day_each(tmp_path: Path) -> None:
    """A clock that keeps being stepped back 5 s (a bad time source, a daemon stepping instead
    of slewing) under a meter polled every 2 s: no gap of the step is ever there, so each step
    spread a whole day of rows (43,200 re-judged, 86,400 points marked for InfluxDB, per step,
    every minute). A step only needs room of a few times its length: the rows spread are those
    within 100 steps (each interval shortened by 1 % at most), still in order, all accepted."""
    path = tmp_path / "ledger.sqlite"
    start = T0 - 86400 - HOUR
    ledger = Ledger(path, {METER: SPEC}, now=start)
    try:
        n = int((T0 - start) / 2) + 1
        ledger.add_many([(METER, start + 2 * i, Decimal(1000 + i)) for i in range(n)])
        reading, old_clock = 1000 + n - 1, T0  # the last reading, and the old clock's time
        for k in range(5):
            with sqlite3.connect(path) as db:  # the daemon sent what was marked before the step
                db.execute("DELETE FROM unsent")
            db.close()
            new_clock = old_clock - 5
            changed = ledger.clock_step(-5.0, new_clock)
            assert changed == {METER: []}  # order kept: no verdict changed
            step = ledger.clock_steps(METER)[-1]
            # 100 steps and two (510 s) of readings 2 s apart, a few more where the steps before
            # had shortened them by 1 % each (at most 510 / (2 x 0.99^5) = 268): 43,204 rows before.
            assert step.spread and step.rows <= 268, (k, step.rows)
            assert step.describe().endswith("(spread over the 8m before: no gap of the step in it)")
            (marked,) = sqlite3.connect(path).execute("SELECT count(*) FROM unsent").fetchone()
            assert marked <= 2 * 268, (k, marked)  # 86,386 before: old and new times
            # A minute of the new clock's readings, then the next step.
            for i in range(1, 31):
                reading += 1
                ledger.add(METER, new_clock + 2 * i, Decimal(reading))
            old_clock = new_clock + 60
        rows = ledger.rows(METER)
        assert [r.reading for r in rows] == [Decimal(1000 + i) for i in range(n + 150)]
        assert all(r.accepted for r in rows) and sum(r.volume for r in rows) == n + 150 - 1
        assert all(a.time_ms < b.time_ms for a, b in itertools.pairwise(rows))
    finally:
        ledger.close()


def test_a_quarters_many_clock_steps_are_one_note_in_the_export_not_one_each(tmp_path: Path) -> None:
    """An hour of a time source stepping the clock back 5 s every minute: 60 steps, each
    recorded (`meters show` lists them). The export's flags cell listed every one (60 notes,
    ~7 KB in one cell; a quarter of it, 130,000); it says how many, when, by how much and how
    many readings, once. Three or fewer are each still listed."""
    path = tmp_path / "ledger.sqlite"
    start = T0 - 2 * HOUR
    ledger = Ledger(path, {METER: SPEC}, now=start)
    try:
        n = int((T0 - start) / 2) + 1
        ledger.add_many([(METER, start + 2 * i, Decimal(1000 + i)) for i in range(n)])
        reading, old_clock = 1000 + n - 1, T0
        q = quarter("2026Q2")
        for k in range(60):
            new_clock = old_clock - 5
            ledger.clock_step(-5.0, new_clock)
            if k == 2:
                notes = [f for f in usage(ledger, METER, q, 86_400).flags if f.startswith(CLOCK_STEPPED)]
                assert len(notes) == 3  # each listed
            ledger.add_many([(METER, new_clock + 2 * i, Decimal(reading + i)) for i in range(1, 31)])
            reading += 30
            old_clock = new_clock + 60
        steps = ledger.clock_steps(METER)
        assert len(steps) == 60
        got = usage(ledger, METER, q, 86_400)
        notes = [f for f in got.flags if f.startswith(CLOCK_STEPPED)]
        first, last = iso(steps[0].noticed_ms / 1000), iso(steps[-1].noticed_ms / 1000)
        moved = sum(s.rows for s in steps)
        assert notes == [
            f"gateway clock stepped back 60 times from {first} to {last} (by 5s each): {moved} readings"
            " re-stamped (each listed by `monitor meters show`)"
        ]
        assert got.ft3 == n - 1 + 60 * 30
    finally:
        ledger.close()


def _take_work(path: Path, recorded: int) -> tuple[int, int]:
    """(points, SQLite VM instructions / 1000) of the take after a 5 s step, with `recorded`
    earlier steps in the audit table (written there directly as a month of a time source
    stepping every minute leaves them: that many real steps take minutes to make)."""
    start = T0 - 2 * HOUR
    ledger = Ledger(path, {METER: SPEC}, now=start)
    try:
        ledger.add_many([(METER, start + 2 * i, Decimal(1000 + i)) for i in range(3601)])
        with sqlite3.connect(path) as db:
            month = round((start - 30 * 86400) * 1000)
            db.executemany(
                "INSERT INTO clock_steps (meter, noticed_ms, step_ms, rows, first_ms, last_ms, spread)"
                " VALUES (?, ?, -5000, 250, ?, ?, 1)",
                [
                    (METER, month + 60_000 * k, month + 60_000 * k - 500_000, month + 60_000 * k)
                    for k in range(recorded)
                ],
            )
            db.execute("DELETE FROM unsent")
        db.close()
        book = MeterBook(ledger)
        ledger.clock_step(-5.0, T0 - 5)
        work = [0]

        def count() -> int:
            work[0] += 1
            return 0

        ledger._db.set_progress_handler(count, 1000)
        points = len(book.take_records())
        ledger._db.set_progress_handler(None, 0)
        return points, work[0]
    finally:
        ledger.close()


def test_sending_the_points_a_step_moved_away_costs_the_same_however_many_steps_were_recorded(
    tmp_path: Path,
) -> None:
    """Each old-time point a step left (overwritten in InfluxDB as `restamped`) looked its
    step up by reading every step ever recorded: with a month of 5 s steps every minute
    (40,000) one take took 49 s, on the daemon's batch path. The latest covering step is read
    first: the same work with 40,000 steps recorded as with none (was 870 x with 5,000). The
    rows written at times a step moved readings from are found by the steps' end
    (`clock_steps_by_last`), not by reading every step of the meter a take (12 x with 40,000)."""
    none = _take_work(tmp_path / "a.sqlite", 0)
    many = _take_work(tmp_path / "b.sqlite", 40_000)
    assert none[0] == many[0] > 400
    assert many[1] <= 2 * none[1] + 10, (none, many)


def test_rows_spread_by_a_step_are_judged_by_the_time_they_were_taken_not_as_jumps(tmp_path: Path) -> None:
    """A meter running at 98 % of its max_rate (98 ft3 a minute, 6,000 ft3/h allowed), read
    every minute for 26 h on a clock an hour ahead, no gap: the step spreads the day's rows
    over 25 h, each minute now 57.8 s. Judged by the new stamps alone, every one was a `jump`
    (98 ft3 in 57.769 s), and so every reading after (each against the last accepted one): a
    meter alarm and 0 of 152,880 ft3 billed. A spread row's interval counts as the time it
    was taken: all accepted, all billed; and the new clock's next reading too."""
    spec = MeterSpec(METER, "ft3", 7, Decimal(1), Decimal(6000), "shop")
    start = T0 - 26 * HOUR
    ledger = Ledger(tmp_path / "ledger.sqlite", {METER: spec}, now=start)
    try:
        ledger.add_many([(METER, start + 60 * i, Decimal(1000 + 98 * i)) for i in range(26 * 60 + 1)])
        assert ledger.clock_step(-HOUR, T0 - HOUR) == {METER: []}  # no verdict changed
        assert ledger.clock_steps(METER)[0].spread
        ledger.add(METER, T0 - HOUR + 60, Decimal(1000 + 98 * 26 * 60 + 98))
        rows = ledger.rows(METER)
        assert [r.flags for r in rows if not r.accepted] == []
        assert sum(r.volume for r in rows) == 98 * (26 * 60 + 1)
        # The new clock's own readings are judged as before: 102 ft3 in a minute is a jump.
        (row,) = ledger.add(METER, T0 - HOUR + 120, Decimal(1000 + 98 * 26 * 60 + 98 + 102))
        assert not row.accepted and row.flags == ("jump",)
    finally:
        ledger.close()


def test_a_clock_years_behind_the_ledger_at_start_moves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway without a battery-backed clock started before NTP answered: its clock reads
    its image's build date, a year before a ledger of readings. Taken for a step found at
    start, every row (61 of 61: the whole history, every quarter) was moved a year back. More
    than one row ahead by more than a day is the clock, not a row: nothing moves, the log says
    so once, and the readings are judged against the ledger as it stands until the clock is
    right (the register keeps the volume: the next accepted reading's delta carries it)."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, {METER: SPEC}, now=T0)
    try:
        ledger.add_many([(METER, T0 + 60 * i, Decimal(100 + i)) for i in range(61)])
        before = snapshot(path)
        boot = T0 - 365 * 86400  # the clock at boot, before NTP
        with caplog.at_level(logging.ERROR, logger="monitor.meters"):
            assert MeterBook(ledger).found_at_start(boot, 2.0) == []
        assert snapshot(path) == before and ledger.clock_steps() == []
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and METER in errors[0] and "61 reading(s)" in errors[0]
        assert "not synchronised" in errors[0]
    finally:
        ledger.close()
