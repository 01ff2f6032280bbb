"""Replacements checked before they are written, voids and corrections appended: the
ledger's record is never rewritten, and a refused request leaves nothing behind."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from monitor.config import build_config
from monitor.errors import MeterError
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook
from monitor.model import ManualClock, Sample, iso, parse_time
from tests import cli
from tests.console import call
from tests.test_meters_console import AUTH, MeterView

ROOT = Path(__file__).resolve().parent.parent
H = 3600.0
T = parse_time("2026-07-01T00:00:00Z")
NOW = parse_time("2026-07-02T00:00:00Z")
RAW = {
    "station": {"id": "ps-1"},
    "sensors": [{"id": "shop.meter", "kind": "meter", "unit": "ft3", "register_digits": 5,
                 "max_rate": 100, "account": "shop"}],
    "billing": {"rate_per_kcf": "4.25", "accounts": [{"id": "shop", "class": "commercial"}]},
}  # fmt: skip


def readings() -> list[Sample]:
    """12,000 + 20 ft3/h; the meter swapped at 4.5 h (old final 12,090, new initial 5)."""
    old = [Sample("shop.meter", T + h * H, 12_000 + 20 * h) for h in range(5)]
    new = [Sample("shop.meter", T + (5 + h) * H, 15 + 20 * h) for h in range(3)]
    return old + new


@pytest.fixture
def book(tmp_path: Path) -> Iterator[MeterBook]:
    b = MeterBook.open(build_config({**RAW, "state_dir": str(tmp_path / "state")}), clock=ManualClock(NOW))
    b.ingest(readings())
    yield b
    b.close()


def tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, read by a separate connection (what is on disk)."""
    db = sqlite3.connect(path)
    try:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: sorted(db.execute(f"SELECT * FROM {n}").fetchall(), key=repr) for n in names}
    finally:
        db.close()


def monitor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


@pytest.mark.parametrize(
    ("when", "why"),
    [
        ("0001-01-01T00:00:00+01:00", "before the meter's first reading"),  # was recorded, then a crash
        ("0001-01-01T00:00:00Z", "before the meter's first reading"),
        ("2026-06-30T23:59:59Z", "before the meter's first reading"),
        ("2026-07-02T00:00:01Z", "in the future"),
        ("9999-12-31T23:59:59Z", "in the future"),
    ],
)
def test_a_replacement_time_is_checked_before_anything_is_written(
    book: MeterBook, when: str, why: str
) -> None:
    before = tables(book.ledger.path)
    with pytest.raises(MeterError, match=why):
        book.record_replacement("shop.meter", parse_time(when), 12_090, 5, "op")
    assert tables(book.ledger.path) == before
    assert book.ledger.replacements("shop.meter") == []
    assert all(r.describe() for r in book.ledger.rows("shop.meter"))  # `meters show` still prints


def test_a_replacement_time_out_of_any_calendar_is_refused(book: MeterBook) -> None:
    for t in (float("inf"), float("nan"), 1e308, -1e308):
        with pytest.raises(MeterError):
            book.record_replacement("shop.meter", t, 12_090, 5, "op")
    assert book.ledger.replacements("shop.meter") == []


def test_the_console_refuses_a_replacement_dated_year_one_and_keeps_working(tmp_path: Path) -> None:
    # Regression (issue 13): this got a 500 and was recorded anyway; `meters show` then crashed for good.
    view = MeterView(tmp_path, ManualClock(T))
    try:
        view.meter_book.ingest(readings())
        before = tables(view.meter_book.ledger.path)
        body = {"by": "op", "time": "0001-01-01T00:00:00+01:00", "old_final": 1, "new_initial": 0}
        got = call(view, "POST", "/api/meters/shop.meter/replacements", headers=AUTH, json=body)
        assert got.status_code == 409 and "before the meter's first reading" in got.text
        body["time"] = "2999-01-01T00:00:00Z"
        got = call(view, "POST", "/api/meters/shop.meter/replacements", headers=AUTH, json=body)
        assert got.status_code == 409 and "in the future" in got.text
        assert tables(view.meter_book.ledger.path) == before
        assert call(view, "GET", "/api/meters").status_code == 200
        # The same path as the CLI: the right figures are accepted.
        body = {"by": "op", "time": iso(T + 4.5 * H), "old_final": "12090", "new_initial": 5}
        assert call(view, "POST", "/api/meters/shop.meter/replacements", headers=AUTH, json=body).is_success
    finally:
        view.meter_book.close()
        view.alarms.close()


def test_cli_refuses_year_one_and_show_still_works(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(yaml.safe_dump({**RAW, "state_dir": str(tmp_path / "state")}), encoding="utf-8")
    data = tmp_path / "readings.csv"
    data.write_text(
        "time,sensor,value\n" + "".join(f"{iso(s.time)},{s.sensor},{s.value:g}\n" for s in readings()),
        encoding="utf-8",
    )
    assert monitor_cli("meters", "ingest", "--config", str(config), "--input", str(data)).returncode == 0
    args = ("meters", "replace", "--config", str(config), "--meter", "shop.meter", "--old-final", "1")
    got = monitor_cli(*args, "--new-initial", "0", "--time", "0001-01-01T00:00:00+01:00")
    assert got.returncode == 1 and "before the meter's first reading" in got.stderr
    assert "Traceback" not in got.stderr
    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "shop.meter")
    assert shown.returncode == 0, shown.stderr
    assert "replaced" not in shown.stdout and "0001-" not in shown.stdout


def test_a_voided_replacement_is_appended_and_the_readings_judged_again(book: MeterBook) -> None:
    swap = T + 4.5 * H
    assert book.record_replacement("shop.meter", swap, 12_095, 5, "op")  # typo: 12,090; alarm clears
    assert sum(r.volume for r in book.ledger.rows("shop.meter")) == 80 + 15 + 10 + 40
    with pytest.raises(MeterError, match="void it first"):
        book.record_replacement("shop.meter", swap, 12_090, 5, "op")
    with pytest.raises(MeterError, match="say why"):
        book.void_replacement("shop.meter", swap, "op", " ")
    with pytest.raises(MeterError, match="no replacement in force at 2026-07-01T04:00:00Z"):
        book.void_replacement("shop.meter", T + 4 * H, "op", "wrong time")
    (active,) = book.void_replacement("shop.meter", swap, "op", "typo in the old final")
    assert active.state == "active"  # the swap shows as a meter going backwards again
    assert book.ledger.replacements("shop.meter") == []
    with pytest.raises(MeterError, match="no replacement in force"):
        book.void_replacement("shop.meter", swap, "op", "again")
    (cleared,) = book.record_replacement("shop.meter", swap, 12_090, 5, "op", "re-recorded")
    assert cleared.state == "cleared"
    assert sum(r.volume for r in book.ledger.rows("shop.meter")) == 80 + 10 + 10 + 40
    (rep,) = book.ledger.replacements("shop.meter")
    assert (rep.old_final, rep.new_initial) == (Decimal(12_090), Decimal(5))
    # The first record is still there as it was written; the void and the re-record follow it.
    held = tables(book.ledger.path)
    assert held["replacements"] == [("shop.meter", round(swap * 1000), "12095", "5", "op", "")]
    assert [(a[3], a[4], a[9]) for a in held["amendments"]] == [
        ("void-replacement", "12095", "typo in the old final"),
        ("replacement", "12090", "re-recorded"),
    ]
    q = quarter("2026Q3")
    assert book.ledger.amendment_flags("shop.meter", q.start_ms, q.end_ms) == {"voided replacement"}


def test_a_corrected_misread_is_appended_and_a_replay_of_it_is_no_conflict(book: MeterBook) -> None:
    t2 = T + 2 * H
    book.record_replacement("shop.meter", T + 4.5 * H, 12_090, 5, "op")
    (active,) = book.ingest([Sample("shop.meter", T + 8 * H, 15.0)])  # misread: the new meter says 75
    assert active.state == "active"
    with pytest.raises(MeterError, match="no reading at"):
        book.correct("shop.meter", T + 2.5 * H, 1, "op", "no such reading")
    with pytest.raises(MeterError, match="does not fit 5 digits"):
        book.correct("shop.meter", t2, 100_000, "op", "too big")
    with pytest.raises(MeterError, match="--by"):
        book.correct("shop.meter", t2, 12_040, "", "who?")
    assert book.correct("shop.meter", t2, 12_040, "op", "same value") == []
    (cleared,) = book.correct("shop.meter", T + 8 * H, 75, "op", "photo shows 75")
    assert cleared.state == "cleared"
    before = tables(book.ledger.path)
    assert book.ingest([Sample("shop.meter", T + 8 * H, 15.0)]) == []  # the misread, replayed
    assert tables(book.ledger.path) == before and book.ledger.conflicts("shop.meter") == 0
    (fix,) = book.ledger.amendments("shop.meter")
    assert (fix.original, fix.reading, fix.recorded_by) == ("15", "75", "op")
    assert "reading corrected 15 -> 75 by op" in fix.describe()


def test_a_corrected_reading_changes_the_quarter_to_the_cent(tmp_path: Path) -> None:
    config = build_config({**RAW, "state_dir": str(tmp_path / "state")})
    book = MeterBook.open(config, clock=ManualClock(NOW))
    try:
        book.ingest([Sample("shop.meter", T, 0.0), Sample("shop.meter", T + H, 99.0)])  # read 99, was 59
        q = quarter("2026Q3")
        (row,) = export_rows(config, book.ledger, q)
        assert (row["consumption_ft3"], row["charge"], row["flags"]) == ("99.000", "0.42", "estimated")
        book.correct("shop.meter", T + H, 59, "op", "photo")
        (row,) = export_rows(config, book.ledger, q)
        assert (row["consumption_ft3"], row["charge"], row["flags"]) == (
            "59.000",
            "0.25",
            "estimated;corrected",
        )
    finally:
        book.close()


def test_show_lists_replacements_voids_and_corrections(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(yaml.safe_dump({**RAW, "state_dir": str(tmp_path / "state")}), encoding="utf-8")
    data = tmp_path / "readings.csv"
    data.write_text(
        "time,sensor,value\n" + "".join(f"{iso(s.time)},{s.sensor},{s.value:g}\n" for s in readings()),
        encoding="utf-8",
    )
    assert monitor_cli("meters", "ingest", "--config", str(config), "--input", str(data)).returncode == 0
    base = ("--config", str(config), "--meter", "shop.meter", "--by", "J. Op")
    swap = iso(T + 4.5 * H)
    steps = [
        ("replace", "--time", swap, "--old-final", "12095", "--new-initial", "5"),
        ("void-replacement", "--time", swap, "--why", "typo"),
        ("replace", "--time", swap, "--old-final", "12090", "--new-initial", "5"),
        ("correct", "--time", iso(T + H), "--reading", "12021", "--why", "photo"),
    ]
    for action, *args in steps:
        got = monitor_cli("meters", action, *base, *args)
        assert got.returncode == 0, got.stderr
    refused = monitor_cli("meters", "void-replacement", *base, "--time", iso(T), "--why", "x")
    assert refused.returncode == 1 and "no replacement in force" in refused.stderr
    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "shop.meter").stdout
    assert f"replaced at {swap}: old final 12090, new initial 5 by J. Op" in shown
    assert f"{swap}: replacement voided (old final 12095, new initial 5) by J. Op" in shown
    assert f"{iso(T + H)}: reading corrected 12020 -> 12021 by J. Op" in shown and ": photo" in shown


def test_the_influxdb_copy_follows_a_void_and_a_correction(tmp_path: Path) -> None:
    config = build_config({**RAW, "state_dir": str(tmp_path / "state")})
    book = MeterBook.open(config, clock=ManualClock(NOW))
    points: dict[tuple[str, float], float] = {}  # what InfluxDB holds: the last point per timestamp

    def drain() -> None:
        for r in book.take_records():
            points[(r.meter, r.time)] = r.consumption_ft3
        book.sent()

    try:
        book.ingest(readings())
        book.record_replacement("shop.meter", T + 4.5 * H, 12_095, 5, "op")
        drain()
        assert sum(points.values()) == 80 + 15 + 10 + 40
        book.void_replacement("shop.meter", T + 4.5 * H, "op", "typo")
        drain()
        assert points[("shop.meter", T + 4.5 * H)] == 0 and sum(points.values()) == 80
        book.record_replacement("shop.meter", T + 4.5 * H, 12_090, 5, "op")
        book.correct("shop.meter", T + 7 * H, 56, "op", "photo")  # 55 was read
        drain()
        (row,) = export_rows(config, book.ledger, quarter("2026Q3"))
        assert sum(points.values()) == float(row["consumption_ft3"]) == 80 + 10 + 10 + 41
    finally:
        book.close()


def test_a_point_another_process_changes_between_a_take_and_its_clear_is_sent_again(tmp_path: Path) -> None:
    # The daemon read the marked points and handed them to its outbox; before it cleared the
    # marks, a command corrected one of those readings. Clearing then would leave InfluxDB
    # with the value read before the correction, for good.
    config = build_config({**RAW, "state_dir": str(tmp_path / "state")})
    daemon = MeterBook.open(config, clock=ManualClock(NOW))
    command = MeterBook.open(config, records=False, clock=ManualClock(NOW))
    try:
        daemon.ingest(readings())
        taken = {r.time: r.reading for r in daemon.take_records()}
        assert taken[T + 7 * H] == 55
        command.correct("shop.meter", T + 7 * H, 56, "op", "photo")  # its own connection, committed
        daemon.sent()  # the outbox holds what was taken: not cleared, the ledger changed since
        again = {r.time: r.reading for r in daemon.take_records()}
        assert again[T + 7 * H] == 56
        daemon.sent()
        assert daemon.take_records() == [] and not daemon.due()
    finally:
        command.close()
        daemon.close()


def test_meters_ingest_counts_times_outside_1970_to_2100_as_bad_rows(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(yaml.safe_dump({**RAW, "state_dir": str(tmp_path / "state")}), encoding="utf-8")
    data = tmp_path / "readings.csv"
    data.write_text(
        "time,sensor,value\n0001-01-01T00:00:00+01:00,shop.meter,5\n2026-07-01T00:00:00Z,shop.meter,6\n"
        "1e12,shop.meter,7\n",
        encoding="utf-8",
    )
    got = monitor_cli("meters", "ingest", "--config", str(config), "--input", str(data))
    assert got.returncode == 0 and "1 meter reading(s)" in got.stdout and "2 bad row(s)" in got.stdout
    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "shop.meter")
    assert shown.returncode == 0 and shown.stdout.count("reading ") == 1
    bad = monitor_cli("meters", "show", "--config", str(config), "--meter", "shop.meter", "--since", "soon")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
