"""Edges of effective-dated meter settings, found by an adversarial review: where a change
without `settings_since` starts, the InfluxDB point of a swap at a unit change, a reading at
a change's very time, a reload's check, quarters cut at a change, and the historian path.

Real ledgers (SQLite files) and the real `monitor` commands, as tests/test_meter_settings.py.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
import random
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

from monitor.config import build_config, load_config
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook
from monitor.meters.historian import ONE_PERIOD, sample_usage, settings_doubt
from monitor.meters.ledger import Ledger, Replacement
from monitor.model import ManualClock, Sample, iso, parse_time
from monitor.sinks.pipeline import open_sink
from monitor.sources.meter_history import MeterSample as StoredSample
from tests.daemon_process import DaemonProcess, running_daemon
from tests.examples import examples
from tests.services import InfluxDB1, wait_until
from tests.test_meter_settings import (
    CHANGE,
    NOTE,
    ROOT,
    daily,
    dump,
    edit,
    export,
    hour,
    ingest,
    monitor_cli,
    row,
    spec,
    station,
)


def periods(ledger: Ledger) -> list[tuple[int, str, str]]:
    return [(p.since_ms, str(p.spec.multiplier), p.source) for p in ledger.periods("m", superseded=True)]


def volumes(ledger: Ledger) -> list[tuple[int, str, tuple[str, ...]]]:
    return [(r.time_ms, str(r.volume), r.flags) for r in ledger.rows("m")]


def q3_sum(influxdb1: InfluxDB1, db: str) -> float:
    """What InfluxDB holds for the quarter 2025Q3: the sum the billing export must equal."""
    got = influxdb1.query(
        "SELECT sum(consumption_ft3) FROM meter WHERE time > '2025-07-01T00:00:00Z'"
        " AND time <= '2025-10-01T00:00:00Z'",
        db=db,
    )
    return float(got["results"][0]["series"][0]["values"][0][1])


# -- 1. a change without settings_since never reaches back past the rows held ----------------


def test_a_change_without_settings_since_keeps_the_rows_held_when_the_clock_is_behind_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The gateway's clock is five hours behind the readings it recorded (set back by hand, or a
    # replay of later history) when it restarts with multiplier 10 and no settings_since.
    # Before, the change took effect from the clock's time: readings 5..9, recorded x1, were
    # judged again x10 (their quarter grew by 450 ft3, unflagged in that quarter's rows).
    config = build_config(yaml.safe_load(station(tmp_path).read_text()))
    book = MeterBook.open(config, clock=ManualClock(hour(10)))
    book.ingest([Sample("m", hour(h), 1000 + 10 * h) for h in range(10)])
    book.close()
    held = Ledger(tmp_path / "state" / "ledger.sqlite", {"m": spec()}, now=hour(10))
    before = volumes(held)
    held.close()
    changed = build_config(yaml.safe_load(station(tmp_path, multiplier=10).read_text()))
    with caplog.at_level(logging.WARNING, logger="monitor.meters.ledger"):
        book = MeterBook.open(changed, clock=ManualClock(hour(5)))
    assert volumes(book.ledger) == before  # every row held keeps the settings it was recorded with
    assert "just after the latest reading held" in caplog.text
    assert periods(book.ledger)[-1] == (round(hour(9) * 1000) + 1, "10", "config")
    book.ingest([Sample("m", hour(h), 1000 + 10 * h) for h in (10, 11)])  # after it: x10
    assert volumes(book.ledger)[-2:] == [
        (round(hour(10) * 1000), "0", ("settings",)),
        (round(hour(11) * 1000), "100", ()),
    ]
    book.close()


def test_a_change_without_settings_since_on_a_clock_reset_to_before_the_first_reading(tmp_path: Path) -> None:
    # A gateway whose clock came up in the past (no RTC battery): before, a change with no
    # settings_since was taken as a correction from the first reading and re-judged the whole
    # history x10, silently billing every past quarter ten times.
    config = build_config(yaml.safe_load(station(tmp_path).read_text()))
    book = MeterBook.open(config, clock=ManualClock(hour(10)))
    book.ingest([Sample("m", hour(h), 1000 + 10 * h) for h in range(10)])
    book.close()
    changed = build_config(yaml.safe_load(station(tmp_path, multiplier=10).read_text()))
    book = MeterBook.open(changed, clock=ManualClock(hour(-50)))
    assert [src for _, _, src in periods(book.ledger)] == ["config", "config"]  # nothing corrected
    assert {v for _, v, _ in volumes(book.ledger)[1:]} == {"10"}
    book.close()


def test_a_change_without_settings_since_by_command_with_readings_ahead_of_the_clock(tmp_path: Path) -> None:
    # The same through the commands: readings stamped ahead of this machine's clock (a gateway
    # clock running fast) stay x1 when `monitor meters list` records the change.
    config = station(tmp_path)
    t0 = parse_time("2099-01-01T00:00:00Z")
    ingest(config, [(f"{t0 + h * 3600:.0f}", 1000 + 10 * h) for h in range(5)])
    ledger = tmp_path / "state" / "ledger.sqlite"
    rows_before = [line for line in dump(ledger) if '"readings"' in line]
    edit(config, multiplier=10)
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 0, got.stderr
    assert "just after the latest reading held" in got.stderr
    assert [line for line in dump(ledger) if '"readings"' in line] == rows_before


# -- 2. the InfluxDB point of a swap at a unit change -----------------------------------------


def test_a_swap_at_a_unit_change_writes_the_old_meters_delta_in_its_own_unit(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    # A gallon meter swapped for a cubic-metre one on 1 July 05:00, recorded as a replacement at
    # the change's time. The swap's point carries the old meter's last 10 gal; before, they were
    # written as 10 m3 (353.1 ft3 instead of 1.337 ft3), so InfluxDB no longer summed to the bill.
    influxdb1.query("CREATE DATABASE billing")
    path = station(tmp_path, unit="gal")
    raw = yaml.safe_load(path.read_text())
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "billing"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    book = MeterBook.open(load_config(path))
    sink = open_sink(load_config(path))
    book.ingest([Sample("m", hour(h), 500 + 10 * h) for h in range(5)])  # 540 gal at 04:00
    book.send(sink.write_meter_records, limit=None)
    book.close()
    edit(path, unit="m3", settings_since=iso(hour(5)))
    config = load_config(path)
    book = MeterBook.open(config)
    book.ingest([Sample("m", hour(h), h - 5) for h in (6, 7)])  # 1, 2 m3 on the new register
    book.record_replacement("m", hour(5), "550", "0")
    records = book.take_records()
    swap = next(r for r in records if r.time == hour(5))
    assert (swap.unit, swap.reading) == ("m3", 0.0)
    assert swap.consumption_ft3 == pytest.approx(10 * 231 / 1728)  # 10 gal
    assert swap.consumption == pytest.approx(10 * 231 / 1728 * 0.028316846592)  # in the point's unit
    sink.write_meter_records(records)
    book.sent()
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    assert config.billing is not None
    (want,) = export_rows(config, book.ledger, quarter("2025Q3"))
    book.close()
    got = q3_sum(influxdb1, "billing")
    # 50 gal (40 + the swap's 10) and 2 m3 (from the new initial 0)
    assert want["consumption_ft3"] == "77.313" and Decimal(f"{got:.3f}") == Decimal("77.313")


# -- 3. a reading stamped exactly at a change belongs to the new settings ---------------------


def test_a_reading_at_the_changes_very_time_is_the_new_baseline_one_before_it_is_billed_old(
    tmp_path: Path,
) -> None:
    config = station(tmp_path)
    t = parse_time(CHANGE)
    ingest(config, [(f"{t - 7200:.0f}", 1000), (f"{t - 1:.0f}", 1010)])  # x1 up to a second before
    edit(config, multiplier=10, settings_since=CHANGE)
    ingest(config, [(f"{t:.0f}", 1011), (f"{t + 3600:.0f}", 1021)])
    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "m")
    lines = [line for line in shown.stdout.splitlines() if line.startswith("  2025")]
    assert [line.split()[:5] for line in lines] == [
        ["2025-08-14T22:00:00Z", "reading", "1000", "+0", "accepted"],
        ["2025-08-14T23:59:59Z", "reading", "1010", "+10", "accepted"],  # one second before: x1
        ["2025-08-15T00:00:00Z", "reading", "1011", "+0", "accepted"],  # at it: the new baseline
        ["2025-08-15T01:00:00Z", "reading", "1021", "+100", "accepted"],  # x10
    ]
    assert "[settings]" in lines[2]
    q3 = row(export(config, "2025Q3"))
    assert (q3["consumption_ft3"], q3["last_read"], q3["flags"]) == ("110.000", "10210", f"estimated;{NOTE}")


def test_a_swap_recorded_at_the_changes_time_bills_the_old_meter_from_its_own_last_reading(
    tmp_path: Path,
) -> None:
    # The docs' way to bill across a change: a replacement at the change's very time. With a
    # reading of the new register stamped at that same time, the old final was judged against
    # that reading (the new register's 0) instead of the old meter's last: 1045 billed, not 5.
    config = station(tmp_path)
    t = parse_time(CHANGE)
    ingest(config, [(f"{t - 7200:.0f}", 1000), (f"{t - 3600:.0f}", 1040)])
    edit(config, multiplier=10, settings_since=CHANGE)
    ingest(config, [(f"{t:.0f}", 0), (f"{t + 3600:.0f}", 3)])  # the new x10 register
    got = monitor_cli("meters", "replace", "--config", str(config), "--meter", "m", "--time", CHANGE,
                      "--old-final", "1045", "--new-initial", "0", "--by", "test")  # fmt: skip
    assert got.returncode == 0, got.stderr
    q3 = row(export(config, "2025Q3"))
    assert q3["consumption_ft3"] == "75.000"  # 40 + 5 on the old meter, 3 x 10 on the new one
    assert q3["flags"] == f"replacement;estimated;{NOTE}"


def test_a_change_at_a_quarters_end(tmp_path: Path) -> None:
    # A unit change (gal -> ft3) at 1 October 00:00Z, the instant 2025Q3 ends and Q4 starts.
    config = station(tmp_path, unit="gal")
    end = "2025-10-01T00:00:00Z"
    ingest(config, daily("2025-09-28", 3, 1000))  # 28-30 September at noon: 200 gal billed in Q3
    edit(config, unit="ft3", settings_since=end)
    ingest(config, daily("2025-10-01", 2, 5000))  # the new register from 1 October noon
    q3, q4 = row(export(config, "2025Q3")), row(export(config, "2025Q4"))
    note = f"settings changed at {end}: unit gal -> ft3"
    # Q3 holds no reading under the new settings: its unit is its last reading's, gal (it said ft3)
    assert (q3["unit"], q3["last_read"], q3["consumption_gal"]) == ("gal", "1200", "200.00")
    assert note in q3["flags"].split(";")
    # Q4 starts at the new baseline (1 October noon), then 100 ft3
    assert (q4["unit"], q4["first_read"], q4["consumption_ft3"]) == ("ft3", "1200", "100.000")
    assert note in q4["flags"].split(";")


def test_a_reading_at_a_quarters_end_that_is_a_changes_time_closes_the_quarter_as_the_new_baseline(
    tmp_path: Path,
) -> None:
    config = station(tmp_path, unit="gal")
    end = "2025-10-01T00:00:00Z"
    ingest(config, daily("2025-09-29", 2, 1000))
    edit(config, unit="ft3", settings_since=end)
    ingest(config, [(f"{parse_time(end):.0f}", 7), *daily("2025-10-01", 1, 17)])
    q3, q4 = row(export(config, "2025Q3")), row(export(config, "2025Q4"))
    assert (q3["unit"], q3["last_read"], q3["consumption_gal"]) == ("ft3", "7", "100.00")
    assert f"settings changed at {end}: unit gal -> ft3" in q3["flags"]
    assert (q4["first_read"], q4["consumption_ft3"], q4["flags"]) == ("7", "10.000", "estimated")


# -- 4. a reload's check sees the ledger, not only the running daemon's memory ----------------


def daemon_config(tmp_path: Path, meters: list[str], **m: Any) -> Path:
    """`station()` with the console off and the meters named (`m` with `m`'s settings)."""
    path = station(tmp_path, **m)
    raw = yaml.safe_load(path.read_text())
    raw["console"] = {"enabled": False}
    plain = {"kind": "meter", "unit": "ft3", "register_digits": 8, "account": "a"}
    raw["sensors"] = [raw["sensors"][0] if name == "m" else {"id": name, **plain} for name in meters]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def refused_reload(daemon: DaemonProcess, log: Path) -> str:
    daemon.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "the running config stays" in log.read_text(), timeout=30, what="the refusal")
    assert daemon.proc.poll() is None, log.read_text()
    return log.read_text()


def test_a_reload_sees_the_periods_of_a_meter_removed_and_added_again(tmp_path: Path) -> None:
    # m's x10 period from 15 August is in the ledger; the running config has no m. A reload
    # adding it back with a settings_since before that period was let through: the new daemon
    # could not open the ledger and the process ended.
    config = station(tmp_path)
    ingest(config, daily("2025-07-01", 60, 0))
    edit(config, multiplier=10, settings_since=CHANGE)
    assert monitor_cli("meters", "list", "--config", str(config)).returncode == 0
    daemon_config(tmp_path, ["n"])
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        wait_until(lambda: "running" in log.read_text(), timeout=60, what="the daemon's start")
        daemon_config(tmp_path, ["n", "m"], multiplier=100, settings_since="2025-08-01T00:00:00Z")
        text = refused_reload(daemon, log)
        assert "meter m: settings changed (multiplier 10 -> 100) from settings_since 2025-08-01" in text
        assert f"not after the settings in force since {CHANGE}" in text
        daemon.stop()


def test_a_reload_sees_a_period_another_process_recorded_while_the_daemon_ran(tmp_path: Path) -> None:
    # `monitor meters list` with an edited copy of the config records x10 from 15 August while
    # the daemon runs; the reload's check read the periods the daemon had cached at its start.
    config = daemon_config(tmp_path, ["m"])
    ingest(config, daily("2025-07-01", 60, 0))
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        wait_until(lambda: "running" in log.read_text(), timeout=60, what="the daemon's start")
        other = tmp_path / "copy.yaml"
        other.write_text(config.read_text())
        edit(other, multiplier=10, settings_since=CHANGE)
        got = monitor_cli("meters", "list", "--config", str(other))
        assert got.returncode == 0 and "settings changed" in got.stderr, got.stderr
        edit(config, multiplier=100, settings_since="2025-08-01T00:00:00Z")
        text = refused_reload(daemon, log)
        assert f"not after the settings in force since {CHANGE}" in text
        daemon.stop()


# -- the historian path (--from-influx) holds no settings periods -----------------------------


def test_the_historian_across_a_unit_change_bills_each_record_in_its_unit_and_says_it_assumed_one_period(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    # A gallon meter reprogrammed to ft3 on 15 August. Before, `--from-influx` refused the whole
    # export (every station's) for this one meter; a multiplier change went through with the
    # new baseline flagged `replacement` or `unreconciled` as if records were missing.
    influxdb1.query("CREATE DATABASE fleet")
    path = station(tmp_path, unit="gal")
    raw = yaml.safe_load(path.read_text())
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "fleet"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    sink = open_sink(load_config(path))
    book = MeterBook.open(load_config(path))
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-07-01", 45, 1000)])  # to 14 August
    book.send(sink.write_meter_records, limit=None)
    book.close()
    edit(path, unit="ft3", multiplier=10, settings_since=CHANGE)
    book = MeterBook.open(load_config(path))
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-08-15", 100, 20)])  # into Q4
    book.send(sink.write_meter_records, limit=None)
    book.close()
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    own = row(export(path, "2025Q3"))
    got = monitor_cli("billing", "export", "--from-influx", "--config", str(path), "--quarter", "2025Q3",
                      "--out", "-")  # fmt: skip
    assert got.returncode == 0, got.stderr
    (hist,) = list(csv.DictReader(io.StringIO(got.stdout)))
    # 44 x 100 gal, then 46 x 1000 ft3 after the new baseline: the station's own figures
    assert hist["consumption_ft3"] == own["consumption_ft3"] == "46588.194"
    assert hist["charge"] == own["charge"] and hist["unit"] == own["unit"] == "ft3"
    assert hist["flags"] == "one settings period assumed"  # not `replacement`: none was recorded
    assert "meter m: 2025Q3 judged with the config's settings, one settings period assumed" in got.stderr
    assert "records in gal, the config says ft3" in got.stderr


def test_the_historian_says_it_assumed_one_period_from_the_records_and_the_config() -> None:
    """Pure: a multiplier change (1 -> 10) without settings_since shows as a reading that moved
    with no consumption (it was `unreconciled`, as if records were missing); with
    settings_since, records from before it say so themselves."""
    q = quarter("2025Q3")

    def rec(i: int, reading: float, consumption: float) -> StoredSample:
        return StoredSample(
            "m", "a", "ft3", q.start_ms + i * 86_400_000, reading, consumption, consumption, 1.0
        )

    before, x1 = rec(0, 100.0, 0.0), [rec(i, 100.0 + 10 * i, 10.0) for i in range(1, 40)]
    x10 = [rec(40, 5000.0, 0.0), *(rec(i, 5000.0 + 100 * (i - 40), 100.0) for i in range(41, 92))]
    plain = spec("10")
    got = sample_usage("m", plain, before, [*x1, *x10], q, 2 * 86_400)
    assert got.flags == {ONE_PERIOD} and got.ft3 == 390 + 5100
    assert settings_doubt(plain, before, [*x1, *x10]).startswith("the reading moved without consumption")
    assert sample_usage("m", plain, before, x1, q, 100 * 86_400).flags == frozenset()  # no change: no flag
    dated = spec("10", since=(q.start_ms + 40 * 86_400_000) / 1000)
    assert settings_doubt(dated, before, x1) == "records from before its settings_since 2025-08-10T00:00:00Z"
    assert settings_doubt(dated, x10[0], x10[1:]) == ""  # a later quarter's records: all after it


# -- more edges: what a change of max_rate alone costs, two changes and a change back ---------


def test_a_change_of_max_rate_alone_bills_the_movement_across_it(tmp_path: Path) -> None:
    # max_rate is the bound the checks use, not what a count is worth: before, its change made
    # the next reading a new baseline and a day's 100 ft3 went unbilled.
    config = station(tmp_path)
    ingest(config, daily("2025-07-01", 45, 1000))
    edit(config, max_rate=50, settings_since=CHANGE)
    ingest(config, daily("2025-08-15", 47, 1000 + 100 * 45))
    q3 = row(export(config, "2025Q3"))
    assert q3["consumption_ft3"] == "9100.000"  # all 91 deltas, as if nothing had changed
    assert q3["flags"] == f"settings changed at {CHANGE}: max_rate none -> 50"
    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "m").stdout
    assert "[settings]" not in shown


def test_two_changes_in_a_quarter_and_a_change_back(tmp_path: Path) -> None:
    config = station(tmp_path)
    ingest(config, daily("2025-07-01", 20, 1000))  # x1 to 20 July
    edit(config, multiplier=10, settings_since="2025-07-21T00:00:00Z")
    ingest(config, daily("2025-07-21", 20, 3000))  # x10 to 9 August
    edit(config, multiplier=1, settings_since="2025-08-10T00:00:00Z")  # back to the original
    ingest(config, daily("2025-08-10", 52, 9000))  # x1 to 30 September
    q3 = row(export(config, "2025Q3"))
    # 19 x 100 + 19 x 1000 + 51 x 100; each first reading after a change a new baseline
    assert q3["consumption_ft3"] == "26000.000"
    assert q3["flags"] == (
        "settings changed at 2025-07-21T00:00:00Z: multiplier 1 -> 10;"
        "settings changed at 2025-08-10T00:00:00Z: multiplier 10 -> 1"
    )
    assert export(config, "2025Q3") == export(config, "2025Q3")


def test_a_change_and_its_undoing_with_no_reading_between_still_start_a_new_baseline(tmp_path: Path) -> None:
    # x1 -> x10 -> x1 with no reading under x10: the movement across may have been counted x10.
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path, {"m": spec()}, now=hour(100))
    ledger.add_many([("m", hour(h), Decimal(1000 + 10 * h)) for h in range(3)])
    ledger.close()
    Ledger(path, {"m": spec("10", since=hour(3))}, now=hour(100)).close()
    ledger = Ledger(path, {"m": spec("1", since=hour(4))}, now=hour(100))
    ledger.add_many([("m", hour(h), Decimal(1000 + 10 * h)) for h in (5, 6)])
    assert volumes(ledger)[-2:] == [
        (round(hour(5) * 1000), "0", ("settings",)),
        (round(hour(6) * 1000), "10", ()),
    ]
    ledger.close()


def test_rows_a_backdated_change_re_judges_at_the_open_reach_influxdb(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    # A x10 register fitted on 15 August, the config edited on 1 September with settings_since:
    # the open re-judges 15-31 August, but those rows went to InfluxDB only if something else
    # re-judged them later: InfluxDB summed to 36,100 ft3 against the export's 50,400 (x1 values).
    influxdb1.query("CREATE DATABASE backdated")
    path = station(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "backdated"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    sink = open_sink(load_config(path))
    book = MeterBook.open(load_config(path))
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-07-01", 62, 1000)])  # to 31 August
    book.send(sink.write_meter_records, limit=None)
    book.close()
    edit(path, multiplier=10, settings_since=CHANGE)
    config = load_config(path)
    book = MeterBook.open(config)  # the daemon's start with the edited config
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-09-01", 30, 1000 + 100 * 62)])
    book.send(sink.write_meter_records, limit=None)
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    (want,) = export_rows(config, book.ledger, quarter("2025Q3"))
    book.close()
    got = q3_sum(influxdb1, "backdated")
    # 44 x 100 to 14 August, the 15 August baseline, 46 x 1000 after it
    assert want["consumption_ft3"] == "50400.000" and Decimal(f"{got:.3f}") == Decimal("50400.000")


@settings(max_examples=examples(15), deadline=None)  # a SQLite ledger per example
@given(seed=st.integers(0, 2**32 - 1))
def test_a_swap_and_a_reading_at_a_changes_time_give_one_ledger_in_any_order(
    seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The readings (one stamped at the change), and the swap at the change recorded anywhere
    among them: the same rows as in time order. 40 + 5 on the old meter, 10 x (9 - 0) after."""
    rng = random.Random(seed)
    ops: list[tuple[str, float, int]] = [("reading", hour(h), 1000 + 10 * h) for h in range(1, 5)]
    ops += [("reading", hour(5), 2), ("reading", hour(6), 5), ("reading", hour(7), 9), ("swap", hour(5), 0)]
    results = []
    for order in (sorted(ops, key=lambda o: (o[1], o[0] == "swap")), rng.sample(ops, len(ops))):
        path = tmp_path_factory.mktemp("l") / "l.sqlite"
        ledger = Ledger(path, {"m": spec()}, now=hour(100))
        ledger.add("m", hour(0), Decimal(1000))
        ledger.close()
        ledger = Ledger(path, {"m": spec("10", since=hour(5))}, now=hour(100))
        for kind, t, value in order:
            if kind == "reading":
                ledger.add("m", t, Decimal(value))
            else:
                ledger.record_replacement(
                    Replacement("m", round(t * 1000), Decimal(1045), Decimal(0)), hour(100)
                )
        results.append(volumes(ledger))
        assert sum(Decimal(v) for _, v, _ in volumes(ledger)) == 40 + 5 + 90
        ledger.close()
    assert results[0] == results[1]


def test_a_correction_from_the_first_reading_is_said_in_every_quarter_it_changes(tmp_path: Path) -> None:
    # A settings_since at or before the first reading corrects the whole history (documented);
    # before, the quarters already filed exported ten times larger with no flag at all.
    config = station(tmp_path)
    ingest(config, daily("2025-06-01", 120, 1000))  # June to 28 September
    filed = row(export(config, "2025Q3"))
    edit(config, multiplier=10, settings_since="2025-06-01T00:00:00Z")
    assert monitor_cli("meters", "list", "--config", str(config)).returncode == 0
    note = "settings changed from the first reading: multiplier 1 -> 10 (corrected)"
    for q in ("2025Q2", "2025Q3"):
        got = row(export(config, q))
        assert note in got["flags"].split(";"), got["flags"]
    q3 = row(export(config, "2025Q3"))
    assert Decimal(q3["consumption_ft3"]) == 10 * Decimal(filed["consumption_ft3"])


def test_settings_replaced_before_a_meters_first_reading_are_no_correction(tmp_path: Path) -> None:
    config = station(tmp_path)
    assert monitor_cli("meters", "list", "--config", str(config)).returncode == 0  # no reading yet
    edit(config, multiplier=10)  # fixed before commissioning
    assert monitor_cli("meters", "list", "--config", str(config)).returncode == 0
    ingest(config, daily("2025-07-01", 92, 1000))
    assert row(export(config, "2025Q3"))["flags"] == ""


@pytest.mark.parametrize(
    ("key", "value"),
    [("multiplier", 0), ("multiplier", -10), ("multiplier", float("nan")), ("multiplier", float("inf")),
     ("max_rate", 0), ("max_rate", float("nan")), ("register_digits", 0), ("register_digits", 19)],
)  # fmt: skip
def test_a_change_to_an_impossible_setting_stops_the_config_and_writes_nothing(
    tmp_path: Path, key: str, value: object
) -> None:
    config = station(tmp_path)
    ingest(config, daily("2025-07-01", 10, 1000))
    ledger = tmp_path / "state" / "ledger.sqlite"
    before = dump(ledger)
    edit(config, **{key: value, "settings_since": CHANGE})
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 2 and f"sensors[0].{key}" in got.stderr, got.stderr
    assert dump(ledger) == before


def test_every_meter_whose_change_is_refused_is_named_at_once(tmp_path: Path) -> None:
    config = daemon_config(tmp_path, ["m", "n"])
    ingest(config, daily("2025-07-01", 10, 1000))
    raw = yaml.safe_load(config.read_text())
    for sensor in raw["sensors"]:
        sensor.update(multiplier=10, settings_since="2999-01-01T00:00:00Z")
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 1
    assert "meter m: settings_since 2999-01-01T00:00:00Z is in the future" in got.stderr
    assert "meter n: settings_since 2999-01-01T00:00:00Z is in the future" in got.stderr


def test_rows_another_process_re_judged_by_recording_a_change_reach_influxdb(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    # The operator edits the station's config and runs `monitor meters show` before the reload:
    # the command records the change and re-judges the ledger, the reload finds nothing new, and
    # InfluxDB kept the x1 values (the historian's bill ten times short, unflagged). The
    # daemon's book now sees the new period at its next batch and sends the rows again.
    influxdb1.query("CREATE DATABASE elsewhere")
    path = station(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "elsewhere"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    sink = open_sink(load_config(path))
    book = MeterBook.open(load_config(path))  # the running daemon's
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-07-01", 62, 1000)])
    book.send(sink.write_meter_records, limit=None)
    other = tmp_path / "edited.yaml"
    other.write_text(path.read_text())
    edit(other, multiplier=10, settings_since=CHANGE)
    # Its own process, as the operator's is (in this one SQLite keeps the command's file open
    # while the book's connection holds the same file).
    command = [sys.executable, "-m", "monitor", "meters", "show", "--config", str(other), "--meter", "m"]
    got = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert got.returncode == 0 and "settings changed" in got.stderr, got.stderr
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-09-01", 30, 1000 + 100 * 62)])
    book.send(sink.write_meter_records, limit=None)
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    book.close()
    config = load_config(other)
    ledger = Ledger(tmp_path / "state" / "ledger.sqlite", {"m": spec("10", since=parse_time(CHANGE))})
    (want,) = export_rows(config, ledger, quarter("2025Q3"))
    ledger.close()
    got_sum = q3_sum(influxdb1, "elsewhere")
    assert want["consumption_ft3"] == "50400.000" and Decimal(f"{got_sum:.3f}") == Decimal("50400.000")


def test_rows_a_command_re_judged_reach_influxdb_from_the_next_daemon(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    # The same, with the reload (or a start) right after the command: the next daemon finds
    # the change recorded already, nothing to re-judge; the ledger remembers that the InfluxDB
    # copy does not follow that period yet, so that daemon sends the rows.
    influxdb1.query("CREATE DATABASE next")
    path = station(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "next"}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    sink = open_sink(load_config(path))
    book = MeterBook.open(load_config(path))
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-07-01", 62, 1000)])
    book.send(sink.write_meter_records, limit=None)
    book.close()  # the daemon stops (a reload, or down)
    edit(path, multiplier=10, settings_since=CHANGE)
    got = monitor_cli("meters", "show", "--config", str(path), "--meter", "m")
    assert got.returncode == 0 and "settings changed" in got.stderr, got.stderr
    config = load_config(path)
    book = MeterBook.open(config)  # the next daemon: nothing changed for it
    book.ingest([Sample("m", float(t), v) for t, v in daily("2025-09-01", 30, 1000 + 100 * 62)])
    book.send(sink.write_meter_records, limit=None)
    assert book.take_records() == []  # sent once
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    (want,) = export_rows(config, book.ledger, quarter("2025Q3"))
    book.close()
    again = MeterBook.open(config)  # and the start after that sends nothing again
    assert again.take_records() == []
    again.close()
    got_sum = q3_sum(influxdb1, "next")
    assert want["consumption_ft3"] == "50400.000" and Decimal(f"{got_sum:.3f}") == Decimal("50400.000")


def test_a_ledger_whose_settings_cursor_is_behind_marks_the_rows_it_had_not_sent(tmp_path: Path) -> None:
    # A schema-2 ledger from before the `unsent` marks kept, per meter, the id of the latest
    # settings row the InfluxDB copy followed. A period recorded after it (a command while the
    # daemon was down) had rows not sent yet: the upgrade marks them, and only them.
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, {"m": spec()}, now=hour(40))
    ledger.add_many([("m", hour(h), Decimal(1000 + 10 * h)) for h in range(1, 30)])
    ledger.close()
    ledger = Ledger(path, {"m": spec("10", since=hour(20.5))}, now=hour(40))  # the command's open
    ledger.close()
    db = sqlite3.connect(path)
    db.executescript(
        "DROP TABLE unsent; DROP TABLE clock_steps;"  # neither was there at schema 2
        " PRAGMA user_version=2; UPDATE meta SET value='2' WHERE key='schema';"
        " INSERT INTO meta VALUES ('influx copy settings id: m', '1');"  # the x1 period's row
    )
    db.close()
    ledger = Ledger(path, {"m": spec("10", since=hour(20.5))}, now=hour(40))
    keys, rows = ledger.unsent()
    assert keys == [("m", round(hour(h) * 1000)) for h in range(21, 30)]
    assert [r.time_ms for r in rows] == [k[1] for k in keys]
    ledger.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM meta WHERE key LIKE 'influx copy%'").fetchone() == (0,)
    db.close()
