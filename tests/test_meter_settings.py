"""A meter's settings (unit, register_digits, multiplier, max_rate) change from a time, not
retroactively: readings before it keep the settings of their time, the quarters already
billed export byte for byte as filed, the quarter of the change is flagged, and a ledger
written before settings periods (schema 1) opens with its settings as the first period.

Real files and real SQLite throughout; the commands run as `monitor ...` (tests/cli.py), and
the crash tests kill a real child process with SIGKILL at the worst moment of an open.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.config import build_config
from monitor.errors import MeterError
from monitor.meters.book import MeterBook, meter_records
from monitor.meters.ledger import Ledger, Replacement
from monitor.meters.totalizer import MeterSpec
from monitor.model import ManualClock, Sample, parse_time
from monitor.sqlite import user_version
from tests import cli
from tests.daemon_process import running_daemon
from tests.examples import examples
from tests.services import wait_until

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_1 = ROOT / "tests" / "cases" / "ledger-schema-1" / "ledger.sqlite"
DAY = 86400.0
CHANGE = "2025-08-15T00:00:00Z"
NOTE = f"settings changed at {CHANGE}: multiplier 1 -> 10"


def monitor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli.run_monitor(*args, cwd=ROOT)


def station(tmp_path: Path, **meter: Any) -> Path:
    """A UTC station with one meter `m` (ft3, 8 digits, x1 unless given) billed to `a`."""
    raw = {
        "station": {"id": "ps-1"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "m", "kind": "meter", "unit": "ft3", "register_digits": 8, "account": "a", **meter}
        ],
        "billing": {"rate_per_kcf": "2", "accounts": [{"id": "a", "class": "commercial"}],
                    "max_reading_gap": "2d"},
    }  # fmt: skip
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def edit(config: Path, **meter: Any) -> None:
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["sensors"][0].update(meter)
    config.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")


def daily(first: str, days: int, start: int, per_day: int = 100) -> list[tuple[str, int]]:
    """A reading at noon each day, the register rising `per_day` counts a day."""
    t0 = parse_time(f"{first}T12:00:00Z")
    return [(f"{t0 + i * DAY:.0f}", start + per_day * i) for i in range(days)]


def ingest(config: Path, rows: list[tuple[str, int]]) -> subprocess.CompletedProcess[str]:
    path = config.with_name(f"readings-{len(list(config.parent.glob('readings-*.csv')))}.csv")
    path.write_text("time,sensor,value\n" + "".join(f"{t},m,{v}\n" for t, v in rows), encoding="utf-8")
    got = monitor_cli("meters", "ingest", "--config", str(config), "--input", str(path))
    assert got.returncode == 0, got.stderr
    return got


def export(config: Path, q: str, fmt: str = "csv") -> bytes:
    out = config.with_name(f"{q}-{len(list(config.parent.glob('*.out')))}.out")
    got = monitor_cli("billing", "export", "--config", str(config), "--quarter", q, "--format", fmt,
                      "--out", str(out))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert "settings changed" not in got.stderr  # an export of an unchanged config records nothing
    return out.read_bytes()


def row(data: bytes) -> dict[str, str]:
    (only,) = list(csv.DictReader(io.StringIO(data.decode())))
    return only


def dump(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return list(db.iterdump())
    finally:
        db.close()


def test_a_multiplier_changed_from_a_time_leaves_the_quarters_before_it_as_filed(tmp_path: Path) -> None:
    config = station(tmp_path)
    ingest(config, daily("2025-04-01", 183, 10_000))  # 1 April to 30 September, x1
    filed = {q: export(config, q) for q in ("2025Q2", "2025Q3")}
    filed_xlsx = export(config, "2025Q2", "xlsx")
    assert row(filed["2025Q3"])["consumption_ft3"] == "9200.000"  # 92 deltas of 100 ft3

    # The technician fitted a x10 register on 15 August; the config says so from then on.
    edit(config, multiplier=10, settings_since=CHANGE)
    got = ingest(config, daily("2025-10-01", 92, 10_000 + 100 * 183))  # Q4, the register goes on
    assert f"meter m: settings changed (multiplier 1 -> 10) from {CHANGE} (settings_since)" in got.stderr

    assert export(config, "2025Q2") == filed["2025Q2"]  # byte for byte as filed
    assert export(config, "2025Q2", "xlsx") == filed_xlsx
    q3 = row(export(config, "2025Q3"))
    # 45 deltas at x1 to 14 August, the 15 August reading a new baseline, 46 deltas at x10
    assert q3["consumption_ft3"] == "50500.000" and q3["charge"] == "101.00"
    assert q3["flags"] == NOTE
    assert (q3["first_read"], q3["last_read"]) == ("19000", "282000")  # each x the multiplier of its time
    q4 = row(export(config, "2025Q4"))
    assert (q4["consumption_ft3"], q4["flags"]) == ("92000.000", "")  # ten times 92 x 100
    for fmt in ("csv", "xlsx"):  # reproducible: the same bytes again
        assert export(config, "2025Q3", fmt) == export(config, "2025Q3", fmt)

    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "m")
    assert shown.returncode == 0, shown.stderr
    assert "from the first reading: unit ft3, register_digits 8, multiplier 1, max_rate None" in shown.stdout
    assert f"from {CHANGE}: unit ft3, register_digits 8, multiplier 10, max_rate None" in shown.stdout
    assert "first reading under the settings from 2025-08-15T00:00:00Z: a new baseline" in shown.stdout


def test_a_restart_with_an_unchanged_config_changes_nothing(tmp_path: Path) -> None:
    config = station(tmp_path)
    ingest(config, daily("2025-07-01", 40, 0))
    edit(config, multiplier=10, settings_since=CHANGE)
    assert monitor_cli("meters", "list", "--config", str(config)).returncode == 0
    ledger = tmp_path / "state" / "ledger.sqlite"
    before = dump(ledger)
    for _ in range(2):  # the daemon's start, a command: each opens the ledger with this config
        got = monitor_cli("meters", "list", "--config", str(config))
        assert got.returncode == 0 and "settings" not in got.stderr, got.stderr
    assert dump(ledger) == before
    q3 = export(config, "2025Q3")
    assert export(config, "2025Q3") == q3 and dump(ledger) == before


@pytest.mark.parametrize(
    "value", ["2025-08-15", "15 August", "2025-08-15T00:00:00", 1_755_216_000, "yesterday", True]
)
def test_a_bad_settings_since_is_refused_naming_the_key(tmp_path: Path, value: object) -> None:
    config = station(tmp_path, settings_since=value)
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 2
    assert "sensors[0].settings_since" in got.stderr and "Z or an offset" in got.stderr, got.stderr
    assert not (tmp_path / "state" / "ledger.sqlite").exists()


def test_settings_since_only_for_meters(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="settings_since"):
        build_config({"station": {"id": "x"}, "sensors": [{"id": "f", "kind": "flow",
                                                           "settings_since": CHANGE}]})  # fmt: skip


def test_a_settings_since_in_the_future_or_before_the_last_change_is_refused(tmp_path: Path) -> None:
    config = station(tmp_path)
    ingest(config, daily("2025-07-01", 40, 0))
    ledger = tmp_path / "state" / "ledger.sqlite"
    before = dump(ledger)
    edit(config, multiplier=10, settings_since="2999-01-01T00:00:00Z")
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 1 and "settings_since 2999-01-01T00:00:00Z is in the future" in got.stderr
    assert dump(ledger) == before  # refused before anything was written
    edit(config, settings_since=CHANGE)
    assert monitor_cli("meters", "list", "--config", str(config)).returncode == 0
    edit(config, multiplier=100, settings_since="2025-08-01T00:00:00Z")  # before the change just recorded
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 1
    assert f"is not after the settings in force since {CHANGE}" in got.stderr, got.stderr


def spec(
    multiplier: str = "1", digits: int | None = 8, unit: str = "ft3", since: float | None = None
) -> MeterSpec:
    return MeterSpec("m", unit, digits, Decimal(multiplier), None, "a", since)


T0 = parse_time("2025-07-01T00:00:00Z")


def hour(h: float) -> float:
    return T0 + h * 3600


def test_without_settings_since_a_change_takes_effect_when_the_ledger_is_first_opened_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = build_config(yaml.safe_load(station(tmp_path).read_text()))
    book = MeterBook.open(config, clock=ManualClock(hour(10)))
    book.ingest([Sample("m", hour(h), 1000 + 10 * h) for h in range(10)])
    book.close()
    changed = build_config({**yaml.safe_load(station(tmp_path, multiplier=10).read_text())})
    with caplog.at_level(logging.WARNING, logger="monitor.meters.ledger"):
        book = MeterBook.open(changed, clock=ManualClock(hour(10.5)))  # the restart with the new config
    assert "from 2025-07-01T10:30:00Z (the time the ledger was opened)" in caplog.text
    book.ingest([Sample("m", hour(h), 1000 + 10 * h) for h in (10, 11, 12, 13)])
    book.ingest([Sample("m", hour(5.5), 1055)])  # late, stamped before the change: x1
    rows = book.ledger.rows("m")
    got = [(r.time_ms, int(r.volume), r.flags) for r in rows]
    assert got[5:8] == [(round(hour(5) * 1000), 10, ()), (round(hour(5.5) * 1000), 5, ()),
                        (round(hour(6) * 1000), 5, ())]  # fmt: skip
    # 10:00 is before the change (x1); 11:00 the first reading after it, a new baseline; then x10
    assert [(int(r.volume), r.flags) for r in rows[-4:]] == [
        (10, ()),
        (0, ("settings",)),
        (100, ()),
        (100, ()),
    ]
    records = book.take_records()
    assert [(r.reading, r.consumption) for r in records[-2:]] == [(11_200, 100), (11_300, 100)]
    assert meter_records(rows, book.ledger.specs, book.ledger.spec_at)[5].reading == 1050  # x1 then
    book.close()
    again = MeterBook.open(changed, clock=ManualClock(hour(20)))  # opened again later: nothing new
    assert [(p.since_ms, int(p.spec.multiplier)) for p in again.ledger.periods("m")] == [
        (-(2**62), 1),
        (round(hour(10.5) * 1000), 10),
    ]
    again.close()


def test_a_replacement_at_the_change_bills_across_it(tmp_path: Path) -> None:
    # A meter swapped for a x10 one: the old final under x1, the new initial under x10.
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path, {"m": spec()}, now=hour(50))
    ledger.add_many([("m", hour(h), Decimal(500 + 10 * h)) for h in range(5)])  # 540 at hour 4
    ledger.close()
    ledger = Ledger(path, {"m": spec("10", since=hour(5))}, now=hour(50))
    ledger.add_many([("m", hour(h), Decimal(3 + h - 6)) for h in (6, 7)])  # 3, 4 on the new register
    assert ledger.rows("m")[-1].volume == 10 and ledger.rows("m")[-2].flags == ("settings",)
    ledger.record_replacement(Replacement("m", round(hour(5) * 1000), Decimal(550), Decimal(0)), now=hour(50))
    rows = ledger.rows("m")
    assert [(r.seq, int(r.volume)) for r in rows[-4:]] == [
        (1, 10),
        (2, 0),
        (0, 30),
        (0, 10),
    ]  # 10 ft3 + 3 x 10
    ledger.close()


def test_a_ledger_from_before_settings_periods_keeps_its_history(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.sqlite"
    path.parent.mkdir()
    shutil.copy(SCHEMA_1, path)
    rows_before = readings(path)
    old = MeterSpec("shop.meter", "gal", 6, Decimal(10), None, "shop")
    ledger = Ledger(path, {"shop.meter": old}, now=parse_time("2026-01-01T00:00:00Z"))
    (period,) = ledger.periods("shop.meter")
    assert (period.first, period.source, str(period.spec.multiplier), period.spec.unit) == (
        True,
        "migrated",
        "10",
        "gal",
    )
    assert ledger.replacements("shop.meter")[0].recorded_by == "J. Operator"
    ledger.close()
    db = sqlite3.connect(path)
    assert user_version(db) == 7 and db.execute("SELECT value FROM meta").fetchone() == ("7",)
    db.close()
    assert readings(path) == rows_before
    # Then the register is reprogrammed to x1 on 15 September: only the rows after it change.
    new = MeterSpec("shop.meter", "gal", 6, Decimal(1), None, "shop", parse_time("2025-09-15T00:00:00Z"))
    ledger = Ledger(path, {"shop.meter": new}, now=parse_time("2026-01-01T00:00:00Z"))
    cut = round(parse_time("2025-09-15T00:00:00Z") * 1000)
    rows = ledger.rows("shop.meter")
    assert [(r.time_ms, r.seq, str(r.volume), r.flags) for r in rows if r.time_ms < cut] == [
        (t, seq, v, tuple(f for f in flags.split(",") if f)) for t, seq, v, flags, _ in rows_before if t < cut
    ]
    after = [r for r in rows if r.time_ms > cut]
    assert after[0].flags == ("settings",) and {r.volume for r in after[1:]} == {25}
    ledger.close()


def readings(path: Path) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(
            "SELECT time_ms, seq, volume, flags, message FROM readings ORDER BY time_ms, seq"
        ).fetchall()
    finally:
        db.close()


# The child: `monitor meters list` as the daemon's start opens the ledger, SIGKILLed (by itself,
# from SQLite's trace hook) at the statement named by $KILL_AT, after the statement $ARMED_BY.
CHILD = """
import os, signal, sqlite3, sys
real = sqlite3.connect
armed = [False]
def trace(statement):
    if os.environ["ARMED_BY"] in statement:
        armed[0] = True
    if armed[0] and os.environ["KILL_AT"] in statement:
        os.kill(os.getpid(), signal.SIGKILL)
def connect(*args, **kwargs):
    db = real(*args, **kwargs)
    if "ledger" in str(args[0]):
        db.set_trace_callback(trace)
    return db
sqlite3.connect = connect
from monitor.cli import main
sys.exit(main(["meters", "list", "--config", sys.argv[1]]))
"""


@pytest.mark.parametrize(
    ("armed_by", "kill_at"),
    [
        ("PRAGMA user_version=2", "COMMIT"),  # the migration done, not committed
        ("recorded_at) VALUES", "COMMIT"),  # the first open with the change, rows re-judged
        ("recorded_at) VALUES", "PRAGMA data_version"),  # its COMMIT done, before the first reading
    ],
)
def test_kill_9_during_the_migration_or_the_first_open_with_a_change(
    tmp_path: Path, armed_by: str, kill_at: str
) -> None:
    results = []
    for killed in (True, False):
        home = tmp_path / ("killed" if killed else "clean")
        home.mkdir()
        config = station(home, id="shop.meter", unit="gal", register_digits=6, multiplier=1,
                         account="a", settings_since="2025-09-15T00:00:00Z")  # fmt: skip
        (home / "state").mkdir()
        shutil.copy(SCHEMA_1, home / "state" / "ledger.sqlite")
        if killed:
            env = {**os.environ, "ARMED_BY": armed_by, "KILL_AT": kill_at, "PYTHONPATH": str(ROOT)}
            child = subprocess.run([sys.executable, "-c", CHILD, str(config)], env=env, cwd=ROOT,
                                   capture_output=True, text=True, timeout=120)  # fmt: skip
            assert child.returncode == -signal.SIGKILL, child.stderr
            assert dump(home / "state" / "ledger.sqlite")[:1]  # opens
        got = monitor_cli("meters", "list", "--config", str(config))  # the next start
        assert got.returncode == 0, got.stderr
        again = monitor_cli("meters", "list", "--config", str(config))
        assert again.returncode == 0 and "settings" not in again.stderr
        lines = dump(home / "state" / "ledger.sqlite")
        results.append([line for line in lines if 'INSERT INTO "settings"' not in line])
        db = sqlite3.connect(home / "state" / "ledger.sqlite")
        results[-1].append(repr(db.execute("SELECT meter, since_ms, spec, source FROM settings").fetchall()))
        db.close()
    assert results[0] == results[1]


@settings(max_examples=examples(20), deadline=None)  # two SQLite ledgers per example
@given(
    seed=st.integers(0, 2**32 - 1),
    new=st.sampled_from([("10", 8, "ft3"), ("1", 5, "ft3"), ("1", 8, "gal"), ("0.1", 6, "m3")]),
    at=st.integers(2, 38),
)
def test_any_arrival_order_gives_the_same_ledger_with_a_settings_change(
    seed: int, new: tuple[str, int, str], at: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rng = random.Random(seed)
    readings, r = [], 1000
    for h in range(1, 40):
        r += rng.choice([0, 20, 80])
        readings.append(("m", hour(h), Decimal(r % 100_000)))
    multiplier, digits, unit = new
    changed = spec(multiplier, digits, unit, since=hour(at - 0.5))
    ledgers = []
    for shuffle in (False, True):
        path = tmp_path_factory.mktemp("l") / "l.sqlite"
        first = Ledger(path, {"m": spec()}, now=hour(100))
        first.add("m", hour(0), Decimal(1000))  # the meter's first reading, then the change
        first.close()
        ledger = Ledger(path, {"m": changed}, now=hour(100))
        mixed = readings[:]
        if shuffle:
            rng.shuffle(mixed)
        for i in range(0, len(mixed), 5):
            ledger.add_many(mixed[i : i + 5])
        ledgers.append(ledger)
    assert ledgers[0].rows("m") == ledgers[1].rows("m")
    flagged = [r for r in ledgers[0].rows("m") if "settings" in r.flags]
    assert [r.time_ms for r in flagged] == [round(hour(at) * 1000)]  # the first reading after the change
    for ledger in ledgers:
        ledger.close()


def test_a_refused_change_leaves_the_ledger_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path, {"m": spec()}, now=hour(10))
    ledger.add("m", hour(0), Decimal(1))
    ledger.close()
    before = dump(path)
    with pytest.raises(MeterError, match="settings_since 2025-07-01T11:00:00Z is in the future"):
        Ledger(path, {"m": spec("10", since=hour(11))}, now=hour(10))
    assert dump(path) == before


def test_a_reload_with_a_settings_change_it_cannot_take_keeps_the_running_daemon(tmp_path: Path) -> None:
    # `monitor run`, a real process: SIGHUP with a settings_since in the future is refused
    # before the running daemon stops (before, the new daemon failed to open the ledger and
    # the process ended); a valid change is then taken and recorded.
    config = station(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["console"] = {"enabled": False}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    ingest(config, daily("2025-07-01", 3, 0))
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        wait_until(lambda: "running" in log.read_text(), timeout=60, what="the daemon's start")
        edit(config, multiplier=10, settings_since="2999-01-01T00:00:00Z")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "the running config stays" in log.read_text(), timeout=30, what="the refusal")
        assert "settings_since 2999-01-01T00:00:00Z is in the future" in log.read_text()
        assert daemon.proc.poll() is None
        edit(config, settings_since=CHANGE)
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: log.read_text().count("station ps-1 running") == 2, timeout=60, what="the reload")
        assert f"settings changed (multiplier 1 -> 10) from {CHANGE}" in log.read_text()
        daemon.stop()
