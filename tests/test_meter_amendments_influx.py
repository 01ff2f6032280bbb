"""Amendments reach InfluxDB, whoever makes them and wherever a crash falls.

Real parts throughout: `monitor run` processes, `monitor meters replace|correct|void-replacement`
and `monitor replay` as the operator runs them, a real InfluxDB 1.6, and the billing office's
own check: `monitor billing export --from-influx` equals the export from the ledger (apart from
the amendment flags, which live only in the ledger: docs/billing.md). The crashes are real
SIGKILLs, at a statement chosen with SQLite's trace hook in the killed process (a fault
injection: the test picks the moment, the kill itself is real).
"""

from __future__ import annotations

import csv
import io
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from monitor.model import iso, parse_time
from tests.daemon_process import running_daemon
from tests.services import InfluxDB1, wait_until
from tests.test_meter_settings import ROOT, daily, monitor_cli, station

Q = "2025Q3"
SWAP = "2025-08-10T00:00:00Z"  # the old meter read 4950 then, the new one 5
MISREAD = "2025-07-21T12:00:00Z"  # the register showed 3000; 3010 was polled
AMENDED = frozenset({"corrected", "voided replacement"})  # flags the historian cannot hold


def history() -> list[tuple[str, int]]:
    """Noon readings 1 July to 5 October (past the quarter's end, so the historian export is
    not `incomplete`): the old meter to 9 August, one misread, the new meter from 10 August."""
    old = daily("2025-07-01", 40, 1000)
    new = [(t, 55 + 100 * i) for i, (t, _) in enumerate(daily("2025-08-10", 57, 0))]  # 55 on the 10th
    rows = old + new
    at = next(i for i, (t, _) in enumerate(rows) if t == str(round(parse_time(MISREAD))))
    rows[at] = (rows[at][0], 3010)
    return rows


def influx_station(tmp_path: Path, influx: InfluxDB1, database: str) -> Path:
    influx.query(f"CREATE DATABASE {database}")
    path = station(tmp_path)
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    raw["console"] = {"enabled": False}
    raw["influx"] = {"url": influx.url, "api": "v1", "database": database}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def write_readings(config: Path, rows: list[tuple[str, int]], name: str) -> Path:
    path = config.with_name(name)
    path.write_text("time,sensor,value\n" + "".join(f"{t},m,{v}\n" for t, v in rows), encoding="utf-8")
    return path


def meters(config: Path, action: str, *args: str) -> None:
    """A `monitor meters` command in its own process, as the operator's is."""
    command = [sys.executable, "-m", "monitor", "meters", action, "--config", str(config), "--meter", "m",
               *args]  # fmt: skip
    got = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert got.returncode == 0, got.stderr


def export(config: Path, historian: bool = False) -> list[dict[str, str]]:
    flag = ("--from-influx",) if historian else ()
    got = monitor_cli("billing", "export", *flag, "--config", str(config), "--quarter", Q, "--out", "-")
    assert got.returncode == 0, got.stderr
    rows = list(csv.DictReader(io.StringIO(got.stdout)))
    for row in rows:
        row.pop("station", None)
        row["flags"] = ";".join(f for f in row["flags"].split(";") if f and f not in AMENDED)
    return rows


def agrees(config: Path) -> bool:
    return export(config, historian=True) == export(config)


def wait_agrees(config: Path, what: str) -> None:
    """Until the historian's bill is the ledger's; on a timeout, the difference."""
    try:
        wait_until(lambda: agrees(config), timeout=60, what=what)
    except TimeoutError:
        got, want = export(config, historian=True), export(config)
        pairs = zip(got, want, strict=True)
        diff = [(k, g.get(k), w[k]) for g, w in pairs for k in w if g.get(k) != w[k]]
        raise AssertionError(f"{what}: (column, historian, ledger) {diff}") from None


def points(influx: InfluxDB1, database: str, where: str = "") -> list[list[Any]]:
    got = influx.query(f"SELECT reading, consumption_ft3, accepted FROM meter {where}", db=database)
    series = got["results"][0].get("series")
    return series[0]["values"] if series else []


def unsent(config: Path) -> int:
    db = sqlite3.connect(config.parent / "state" / "ledger.sqlite")
    try:
        return int(db.execute("SELECT count(*) FROM unsent").fetchone()[0])
    finally:
        db.close()


def test_amendments_made_while_the_daemon_runs_and_while_it_is_down_reach_influxdb(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    config = influx_station(tmp_path, influxdb1, "amend_live")
    rows = history()
    readings = write_readings(config, rows, "readings.csv")
    got = monitor_cli("meters", "ingest", "--config", str(config), "--input", str(readings))
    assert got.returncode == 0, got.stderr  # while the daemon is down: the first start sends them
    unamended = export(config)
    assert "anomaly" in unamended[0]["flags"]  # the new meter's readings rejected: backwards
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        wait_until(lambda: len(points(influxdb1, "amend_live")) == len(rows), timeout=60, what="the readings")
        assert agrees(config)
        meters(config, "replace", "--time", SWAP, "--old-final", "4950", "--new-initial", "5", "--by", "op")
        meters(config, "correct", "--time", MISREAD, "--reading", "3000", "--by", "op", "--why", "photo")
        amended = export(config)
        assert amended != unamended and "anomaly" not in amended[0]["flags"]
        wait_agrees(config, "the replacement and the correction in InfluxDB")
        meters(config, "void-replacement", "--time", SWAP, "--by", "op", "--why", "wrong meter")
        assert export(config) == unamended
        wait_agrees(config, "the void in InfluxDB")
        assert "meter point(s) the ledger held for InfluxDB handed to the outbox" in log.read_text()
        daemon.stop()
    # While it is down: the replacement recorded again; the next start sends it.
    meters(config, "replace", "--time", SWAP, "--old-final", "4950", "--new-initial", "5", "--by", "op")
    assert export(config) == amended and not agrees(config)
    with running_daemon(config, log) as daemon:
        wait_agrees(config, "the replacement recorded while the daemon was down")
        wait_until(lambda: unsent(config) == 0, timeout=30, what="the marks cleared")
        daemon.stop()
    # Once per series and time: one point per reading, the swap's two sides one point.
    assert len(points(influxdb1, "amend_live")) == len(rows) + 1
    assert "Traceback" not in log.read_text()


# The killed process: `monitor run` or `monitor replay` as the CLI runs it, SIGKILLed by itself
# (SQLite's trace hook) at the outbox statement $KILL_AT, once the ledger ran $ARMED_BY (and,
# with $ARM_FILE, once that file exists): after the ledger's commit, before the outbox's append.
CHILD = """
import os, signal, sqlite3, sys
real = sqlite3.connect
armed = [False]
def ready():
    return not os.environ.get("ARM_FILE") or os.path.exists(os.environ["ARM_FILE"])
def ledger(statement):
    if os.environ["ARMED_BY"] in statement and ready():
        armed[0] = True
def outbox(statement):
    if armed[0] and os.environ["KILL_AT"] in statement:
        os.kill(os.getpid(), signal.SIGKILL)
def connect(*args, **kwargs):
    db = real(*args, **kwargs)
    name = str(args[0])
    if name.endswith("ledger.sqlite"):
        db.set_trace_callback(ledger)
    elif name.endswith("outbox.sqlite"):
        db.set_trace_callback(outbox)
    return db
sqlite3.connect = connect
from monitor.cli import main
sys.exit(main(sys.argv[1:]))
"""


def killed_child(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "KILL_AT": "INSERT INTO segment", **env},
        )  # fmt: skip


def test_kill_9_between_a_commands_amendment_and_the_outbox_append_loses_nothing(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    config = influx_station(tmp_path, influxdb1, "amend_killed")
    rows = history()
    readings = write_readings(config, rows, "readings.csv")
    assert monitor_cli("meters", "ingest", "--config", str(config), "--input", str(readings)).returncode == 0
    log = tmp_path / "daemon.log"
    arm = tmp_path / "arm"
    child = killed_child(["run", "--config", str(config)], log, ARMED_BY="FROM unsent", ARM_FILE=str(arm))
    try:
        wait_until(lambda: len(points(influxdb1, "amend_killed")) == len(rows), timeout=60, what="readings")
        arm.touch()  # from now on, the daemon's next hand-over to the outbox is its last
        meters(config, "correct", "--time", MISREAD, "--reading", "3000", "--by", "op", "--why", "photo")
        assert child.wait(timeout=60) == -signal.SIGKILL, log.read_text()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    misread = f"WHERE time = '{MISREAD}'"
    assert points(influxdb1, "amend_killed", misread)[0][1] == 3010  # the kill fell before the append
    assert unsent(config) > 0  # the marks outlived it
    with running_daemon(config, log) as daemon:
        wait_agrees(config, "the correction after the kill")
        wait_until(lambda: log.read_text().count(" running: ") == 2, timeout=60, what="the start")
        daemon.stop()
    assert points(influxdb1, "amend_killed", misread)[0][1] == 3000


def test_kill_9_between_a_backfills_ledger_commit_and_the_outbox_append_loses_nothing(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    # A gap filled late by `monitor replay` re-judges the readings after it (the day after the
    # gap was billed the whole gap). Killed after the ledger committed those rows and before
    # the outbox took them: before, they lived only in the replay's memory; InfluxDB kept the
    # old figures for good and its bill disagreed with the ledger's.
    config = influx_station(tmp_path, influxdb1, "backfill_killed")
    rows = history()
    gap = rows[50:55]
    kept = write_readings(config, rows[:50] + rows[55:], "readings.csv")
    assert monitor_cli("meters", "replace", "--config", str(config), "--meter", "m", "--time", SWAP,
                       "--old-final", "4950", "--new-initial", "5").returncode == 0  # fmt: skip
    assert monitor_cli("meters", "ingest", "--config", str(config), "--input", str(kept)).returncode == 0
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        wait_until(lambda: len(points(influxdb1, "backfill_killed")) == len(rows) - 5 + 1, timeout=60,
                   what="the readings")  # fmt: skip
        wait_agrees(config, "the readings with a gap")
        daemon.stop()
    after_gap = f"WHERE time = '{iso(float(rows[55][0]))}'"
    assert points(influxdb1, "backfill_killed", after_gap)[0][2] == 600  # the gap's 6 days
    filled = write_readings(config, gap, "gap.csv")
    child = killed_child(
        ["replay", "--config", str(config), "--input", str(filled), "--events", str(tmp_path / "e.jsonl"),
         "--no-incidents"],
        log, ARMED_BY="INTO readings",  # the rows written; the marks too, from this fix on
    )  # fmt: skip
    assert child.wait(timeout=120) == -signal.SIGKILL, log.read_text()[-3000:]
    # The ledger took (some of) the gap and re-judged the day after it; InfluxDB has neither.
    rejudged = ledger_volume(config, rows[55][0])
    assert rejudged < 600 and points(influxdb1, "backfill_killed", after_gap)[0][2] == 600
    assert unsent(config) > 0 and not agrees(config)
    with running_daemon(config, log) as daemon:
        wait_agrees(config, "the re-judged rows after the kill")
        wait_until(lambda: log.read_text().count(" running: ") == 2, timeout=60, what="the start")
        daemon.stop()
    assert points(influxdb1, "backfill_killed", after_gap)[0][2] == rejudged
    assert len(points(influxdb1, "backfill_killed")) == len(rows) - 5 + 1 + gap_rows(config, gap)


def ledger_volume(config: Path, epoch: str) -> int:
    db = sqlite3.connect(config.parent / "state" / "ledger.sqlite")
    try:
        (volume,) = db.execute("SELECT volume FROM readings WHERE time_ms=?", (int(epoch) * 1000,)).fetchone()
        return int(volume)
    finally:
        db.close()


def gap_rows(config: Path, gap: list[tuple[str, int]]) -> int:
    """How many of the gap's readings the killed replay committed to the ledger."""
    db = sqlite3.connect(config.parent / "state" / "ledger.sqlite")
    try:
        times = [int(t) * 1000 for t, _ in gap]
        marks = ",".join("?" * len(times))
        got = db.execute(f"SELECT count(*) FROM readings WHERE time_ms IN ({marks})", times).fetchone()
        return int(got[0])
    finally:
        db.close()
