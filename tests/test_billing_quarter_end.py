"""What the billing clerk meets at quarter end, through the real commands and files:
`monitor meters ingest|correct|replace|void-replacement` on a ledger, then
`monitor billing export` read back as CSV or XLSX.

- An account billed the minimum pays the minimum to the cent, however many meters it has.
  `minimum_applied` marks the one row the top-up is on, not every row of the account.
- A correction or a void changes the quarter whose first delta starts from the amended
  reading, so that quarter is marked too, not only the one the amendment falls in.
- Without `max_rate`, a transmitter glitch of 0 just below the top of the register looks like
  a rollover; the return to the true reading must not bill the whole register silently.
  A ledger judged before that bound is judged again at the next start.
- Readings in the XLSX are shown with all their digits, not as 1.23457E+10.
- `meters ingest` reads a spreadsheet's CSV (byte-order mark, `Time` spelt any way) as replay does.
- The export never bills from a ledger that is not there, names a meter with readings that the
  config no longer has, and says in one line that it cannot write `--out`.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from openpyxl import load_workbook

from monitor.config import build_config
from monitor.meters.billing import Usage, build_rows, quarter
from monitor.meters.ledger import to_ms
from monitor.model import parse_time
from tests import cli

ROOT = Path(__file__).resolve().parent.parent


def monitor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


def station(tmp_path: Path, meters: list[dict[str, Any]], **billing: Any) -> Path:
    """A station config with `meters` (ft3, 8 digits unless given) all billed to account `a`."""
    sensors = [{"kind": "meter", "unit": "ft3", "register_digits": 8, "account": "a", **m} for m in meters]
    raw = {
        "station": {"id": "ps-1"},
        "state_dir": str(tmp_path / "state"),
        "sensors": sensors,
        "billing": {"rate_per_kcf": "1", "accounts": [{"id": "a", "class": "commercial"}], **billing},
    }
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def ingest(config: Path, rows: Sequence[tuple[str, str, float]]) -> None:
    path = config.with_name(f"readings-{len(list(config.parent.glob('readings-*.csv')))}.csv")
    lines = ["time,sensor,value", *(f"{t},{m},{v!r}" for t, m, v in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = monitor_cli("meters", "ingest", "--config", str(config), "--input", str(path))
    assert got.returncode == 0, got.stderr


def export(config: Path, *quarters: str) -> list[dict[str, str]]:
    args = [a for q in quarters for a in ("--quarter", q)]
    got = monitor_cli("billing", "export", "--config", str(config), *args, "--out", "-")
    assert got.returncode == 0, got.stderr
    return list(csv.DictReader(io.StringIO(got.stdout)))


def test_an_account_on_the_minimum_pays_the_minimum_to_the_cent_across_its_meters(tmp_path: Path) -> None:
    # $1/kcf: 10,000 ft3 is $10.00 and 5,005 ft3 is $5.005, so the top-up to the $25.00
    # minimum is $9.995. Rounded line by line that was $20.00 + $5.01 = $25.01.
    config = station(tmp_path, [{"id": "m1"}, {"id": "m2"}], minimum_charge="25.00")
    start, end = "2026-07-01T00:00:00Z", "2026-09-30T00:00:00Z"
    ingest(config, [(start, "m1", 0), (start, "m2", 0), (end, "m1", 10_000), (end, "m2", 5_005)])
    rows = export(config, "2026Q3")
    assert [r["meter"] for r in rows] == ["m1", "m2"]
    assert [r["minimum_applied"] for r in rows] == ["true", "false"]  # m1 carries the top-up

    def total(column: str) -> Decimal:
        return sum((Decimal(r[column]) for r in rows), Decimal(0))

    assert total("charge") == Decimal("25.00")
    assert total("due_after_30_days") == Decimal("25.50")  # 25.00 x 1.02
    assert total("due_after_60_days") == Decimal("28.05")  # 25.50 x 1.10
    # Largest remainder: each row within a cent of its exact share ($19.995, $5.005: a tie, the first wins).
    assert [r["charge"] for r in rows] == ["20.00", "5.00"]


def test_minimum_applied_marks_the_row_the_top_up_is_on_not_every_row_of_the_account() -> None:
    """`minimum_applied` is true exactly where the minimum changed the amount: the row that
    carries the account's top-up (its first), so counting the rows that say true counts the
    accounts on the minimum, and a meter billed on its own consumption never says true."""
    accounts = {"even": ["m4"], "high": ["m3"], "idle": [], "low": ["m1", "m2"], "zero-first": ["m5", "m6"]}
    raw = {
        "station": {"id": "ps-1"},
        "sensors": [
            {"id": m, "kind": "meter", "unit": "ft3", "register_digits": 8, "account": a}
            for a, meters in accounts.items()
            for m in meters
        ],
        "billing": {
            "rate_per_kcf": "1",
            "minimum_charge": "25.00",
            "accounts": [{"id": a, "class": "commercial"} for a in accounts],
        },
    }
    used = {"m1": 10_000, "m2": 5_005, "m3": 30_000, "m4": 25_000, "m5": 0, "m6": 10_000}
    owner = {m: a for a, meters in accounts.items() for m in meters}
    usages = {
        m: Usage(owner[m], m, "ft3", Decimal(0), Decimal(ft3), Fraction(ft3), frozenset())
        for m, ft3 in used.items()
    }
    rows = build_rows(build_config(raw), usages, quarter("2026Q3"))
    assert [(r["account"], r["meter"], r["charge"], r["minimum_applied"]) for r in rows] == [
        ("even", "m4", "25.00", "false"),  # $25.00 metered: the minimum changed nothing
        ("high", "m3", "30.00", "false"),
        ("idle", "", "25.00", "true"),  # no meter: the whole charge is the minimum
        ("low", "m1", "20.00", "true"),  # $10.00 + the $9.995 top-up, rounded with the account
        ("low", "m2", "5.00", "false"),  # its own $5.005: the account's rounding, not the minimum
        ("zero-first", "m5", "15.00", "true"),  # the top-up goes on the first row, used or not
        ("zero-first", "m6", "10.00", "false"),
    ]


@pytest.mark.parametrize(
    ("smallest", "minimum"),
    [
        (5, "25.00"),  # $0.005 + 6 x $4.165 = $24.995: a half-cent top-up to the minimum
        (10, None),  # $0.01 + 6 x $4.165 = $25.00 exactly, no minimum: rows of $4.17 made $25.03
    ],
)
def test_an_accounts_rows_add_up_to_its_bill_and_none_goes_below_zero(
    tmp_path: Path, smallest: int, minimum: str | None
) -> None:
    # Six meters of 4,165 ft3 at $1/kcf: $4.165 each, $4.17 rounded alone. Putting all the
    # rounding on the first row (which carries the top-up) made it -$0.02.
    config = station(tmp_path, [{"id": f"m{i}"} for i in range(7)], minimum_charge=minimum)
    start, end = "2026-07-01T00:00:00Z", "2026-09-30T00:00:00Z"
    used = [smallest] + [4_165] * 6
    ingest(config, [(start, f"m{i}", 0) for i in range(7)] + [(end, f"m{i}", u) for i, u in enumerate(used)])
    rows = export(config, "2026Q3")
    exact = [Decimal("0.01")] + [Decimal("4.165")] * 6  # m0: $0.005 and the $0.005 top-up, or $0.01
    for column, factor in (
        ("charge", 1),
        ("due_after_30_days", Decimal("1.02")),
        ("due_after_60_days", Decimal("1.122")),
    ):
        cents = [Decimal(r[column]) for r in rows]
        assert min(cents) >= 0, (column, cents)
        assert sum(cents) == (Decimal("25.00") * factor).quantize(Decimal("0.01"), ROUND_HALF_UP), (
            column,
            cents,
        )
        assert all(abs(c - x * factor) < Decimal("0.01") for c, x in zip(cents, exact, strict=True)), (
            column,
            cents,
        )
    assert [r["minimum_applied"] for r in rows] == ["true" if minimum else "false"] + ["false"] * 6


def test_a_correction_marks_the_next_quarter_whose_first_delta_it_changes(tmp_path: Path) -> None:
    config = station(tmp_path, [{"id": "m"}], max_reading_gap="100d")
    ingest(
        config,
        [
            ("2026-07-01T00:00:00Z", "m", 0),
            ("2026-09-30T00:00:00Z", "m", 1_000),
            ("2026-10-02T00:00:00Z", "m", 2_000),
        ],
    )
    (q4,) = export(config, "2026Q4")
    assert (q4["consumption_ft3"], q4["flags"]) == ("1000.000", "")
    # The reading that closes Q3 was misread: it opens Q4's first delta too.
    got = monitor_cli(
        "meters", "correct", "--config", str(config), "--meter", "m", "--time", "2026-09-30T00:00:00Z",
        "--reading", "1500", "--by", "J. Clerk", "--why", "photo of the register",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    q3, q4 = export(config, "2026Q3", "2026Q4")
    assert (q3["consumption_ft3"], q3["flags"]) == ("1500.000", "corrected")
    assert (q4["consumption_ft3"], q4["flags"]) == ("500.000", "corrected")  # changed, so marked
    (q1,) = export(config, "2027Q1")  # a later quarter the correction did not touch stays unmarked
    assert q1["flags"] == "estimated;no readings"  # nothing read in 2027Q1


def test_a_void_marks_the_next_quarter_whose_first_delta_it_changes(tmp_path: Path) -> None:
    # A swap on 30 September: the new meter starts at 5,000 and reads 5,100 on 2 October.
    config = station(tmp_path, [{"id": "m"}], max_reading_gap="100d")
    ingest(config, [("2026-07-01T00:00:00Z", "m", 0), ("2026-09-29T00:00:00Z", "m", 1_000)])
    got = monitor_cli(
        "meters", "replace", "--config", str(config), "--meter", "m", "--time", "2026-09-30T00:00:00Z",
        "--old-final", "1010", "--new-initial", "5000", "--by", "J. Operator",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    ingest(config, [("2026-10-02T00:00:00Z", "m", 5_100)])
    (q4,) = export(config, "2026Q4")
    assert (q4["consumption_ft3"], q4["flags"]) == ("100.000", "")
    got = monitor_cli(
        "meters", "void-replacement", "--config", str(config), "--meter", "m",
        "--time", "2026-09-30T00:00:00Z", "--by", "J. Operator", "--why", "recorded on the wrong meter",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    (q4,) = export(config, "2026Q4")  # 5,100 is now judged against 1,000: Q4 changed
    assert (q4["consumption_ft3"], q4["flags"]) == ("4100.000", "voided replacement")


def test_a_glitch_of_0_near_the_top_of_the_register_does_not_bill_the_register(tmp_path: Path) -> None:
    # No max_rate: 99,999,010 -> 0 is believed as a rollover (990 ft3), but the transmitter
    # then reads 99,999,020 again. A rise of half the register or more between two readings
    # is no more believable than a fall of that much: a jump, kept out and flagged.
    config = station(tmp_path, [{"id": "m"}], max_reading_gap="100d")
    days = [f"2026-07-0{d}T00:00:00Z" for d in range(1, 6)]
    ingest(
        config, list(zip(days, ["m"] * 5, [99_999_000, 99_999_010, 0, 99_999_020, 99_999_030], strict=True))
    )
    (row,) = export(config, "2026Q3")
    assert Decimal(row["consumption_ft3"]) < 1_000_000, row  # was 100,000,030 ft3: $100,000.03
    assert "anomaly" in row["flags"].split(";")
    shown = monitor_cli("meters", "show", "--config", str(config), "--meter", "m")
    assert "REJECTED [jump]" in shown.stdout and "half" in shown.stdout
    # The remedy the anomaly points at: correct the glitch; the quarter then bills 30 ft3.
    got = monitor_cli(
        "meters", "correct", "--config", str(config), "--meter", "m", "--time", days[2],
        "--reading", "99999015", "--by", "J. Clerk", "--why", "transmitter glitch, register read on site",
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    (row,) = export(config, "2026Q3")
    assert (row["consumption_ft3"], row["flags"]) == ("30.000", "corrected")


def test_xlsx_shows_a_long_reading_with_all_its_digits(tmp_path: Path) -> None:
    # A 14-digit register in litres (0.001 m3): 12,345,678,901.234 m3 is 14 digits in
    # Excel's General format, which shows at most 11 (12345678901 or 1.23457E+10).
    config = station(tmp_path, [{"id": "m", "unit": "m3", "register_digits": 14, "multiplier": 0.001}])
    ingest(
        config,
        [
            ("2026-07-01T00:00:00Z", "m", 12_345_678_901_234.0),
            ("2026-09-30T00:00:00Z", "m", 12_345_678_991_000.0),
        ],
    )
    out = tmp_path / "q.xlsx"
    got = monitor_cli(
        "billing",
        "export",
        "--config",
        str(config),
        "--quarter",
        "2026Q3",
        "--format",
        "xlsx",
        "--out",
        str(out),
    )
    assert got.returncode == 0, got.stderr
    sheet = load_workbook(out)["2026Q3"]
    head = [c.value for c in sheet[1]]
    first, last = sheet.cell(2, head.index("first_read") + 1), sheet.cell(2, head.index("last_read") + 1)
    assert (first.value, first.number_format) == (12_345_678_901.234, "0.000")
    assert (last.value, last.number_format) == (12_345_678_991, "0")


def test_meters_ingest_reads_a_spreadsheets_csv_as_replay_does(tmp_path: Path) -> None:
    # Excel's "CSV UTF-8" starts with a byte-order mark and ends lines with CRLF; a clerk may
    # also capitalise the header. Every row was skipped ("skipped: 'time'") and the command said
    # 0 readings with exit 0, so the quarter billed nothing.
    config = station(tmp_path, [{"id": "m"}])
    sheet = tmp_path / "from-excel.csv"
    sheet.write_bytes(
        b"\xef\xbb\xbfTime, Sensor ,VALUE\r\n2026-07-01T00:00:00Z,m,5\r\n2026-09-30T00:00:00Z,m,1005\r\n"
    )
    got = monitor_cli("meters", "ingest", "--config", str(config), "--input", str(sheet))
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("2 meter reading(s)") and "0 bad row(s)" in got.stdout
    (row,) = export(config, "2026Q3")
    assert row["consumption_ft3"] == "1000.000"
    # A file without the columns is refused by name, before anything is added.
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("when,meter,reading\n2026-10-01T00:00:00Z,m,2000\n", encoding="utf-8")
    got = monitor_cli(
        "meters", "ingest", "--config", str(config), "--input", str(sheet), "--input", str(wrong)
    )
    assert got.returncode == 1
    assert f"{wrong}: header 'when,meter,reading' lacks column(s) time, sensor, value" in got.stderr
    (row,) = export(config, "2026Q4")
    assert (
        row["first_read"] == "1005" and row["flags"] == "estimated;no readings"
    )  # nothing of either file added


def test_an_export_to_a_folder_that_is_not_there_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    config = station(tmp_path, [{"id": "m"}])
    ingest(config, [("2026-07-01T00:00:00Z", "m", 0)])
    for fmt in ("csv", "json", "xlsx"):
        out = tmp_path / "no-such-folder" / f"q.{fmt}"
        got = monitor_cli(
            "billing",
            "export",
            "--config",
            str(config),
            "--quarter",
            "2026Q3",
            "--format",
            fmt,
            "--out",
            str(out),
        )
        assert got.returncode == 1, got.stderr
        assert got.stderr == f"monitor billing export: cannot write {out}: No such file or directory\n"


def test_an_export_without_the_stations_ledger_is_refused_not_billed_as_nothing(tmp_path: Path) -> None:
    # A billing workstation with the station's config but another state_dir (or none copied):
    # the export made an empty ledger there and billed every meter 0 ft3, exit 0.
    config = station(tmp_path, [{"id": "m"}])
    got = monitor_cli("billing", "export", "--config", str(config), "--quarter", "2026Q3", "--out", "-")
    ledger = tmp_path / "state" / "ledger.sqlite"
    assert got.returncode == 1 and got.stdout == ""
    assert f"no meter ledger at {ledger}" in got.stderr and "--from-influx" in got.stderr
    assert not ledger.exists() and not ledger.parent.exists()  # nothing made on the way


def test_a_meter_dropped_from_the_config_with_readings_in_the_quarter_is_named(tmp_path: Path) -> None:
    # A meter taken out of the config (swapped for a new sensor id) keeps its ledger rows, but
    # the export reads configured meters only: its consumption left the bill without a word.
    config = station(tmp_path, [{"id": "old.meter"}, {"id": "new.meter"}])
    ingest(
        config,
        [("2026-07-01T00:00:00Z", "old.meter", 0), ("2026-08-01T00:00:00Z", "old.meter", 700),
         ("2026-08-01T00:00:00Z", "new.meter", 0), ("2026-09-30T00:00:00Z", "new.meter", 300)],
    )  # fmt: skip
    config = station(tmp_path, [{"id": "new.meter"}])
    got = monitor_cli("billing", "export", "--config", str(config), "--quarter", "2026Q3", "--out", "-")
    assert got.returncode == 0, got.stderr
    assert [r["meter"] for r in csv.DictReader(io.StringIO(got.stdout))] == ["new.meter"]
    assert (
        "warning: 2026Q3: meter old.meter has 1 reading(s) in the ledger but is not in the config:"
        " not billed" in got.stderr
    )


def test_a_ledger_judged_before_the_jump_bound_is_judged_again_at_the_next_start(tmp_path: Path) -> None:
    # The ledger file is set back to what the checks before the half-register bound wrote for
    # the glitch above (the true reading after the 0 accepted: 99,999,020 ft3 billed; the meter's
    # spec without its rules version). No real part can write an old ledger on demand.
    config = station(tmp_path, [{"id": "m"}], max_reading_gap="100d")
    days = [f"2026-07-0{d}T00:00:00Z" for d in range(1, 6)]
    ingest(
        config, list(zip(days, ["m"] * 5, [99_999_000, 99_999_010, 0, 99_999_020, 99_999_030], strict=True))
    )
    ledger = tmp_path / "state" / "ledger.sqlite"
    db = sqlite3.connect(ledger)
    with db:
        old = (
            "UPDATE readings SET accepted=1, counts=?, volume=?, flags='', message='', lim='' WHERE time_ms=?"
        )
        db.execute(old, ("99999020", "99999020", to_ms(parse_time(days[3]))))
        db.execute(old, ("10", "10", to_ms(parse_time(days[4]))))
        db.execute("UPDATE meters SET spec='ft3|8|1|None'")
    db.close()
    got = monitor_cli("meters", "list", "--config", str(config))
    assert got.returncode == 0, got.stderr
    assert "meter m: the meter checks changed since its rows were judged; re-judging them" in got.stderr
    (row,) = export(config, "2026Q3")
    assert (row["consumption_ft3"], row["flags"]) == ("1000.000", "rollover;anomaly")
    again = monitor_cli("meters", "list", "--config", str(config))
    assert "re-judging" not in again.stderr  # once


def test_a_meter_with_no_readings_is_told_apart_from_a_sparse_one_and_a_zero(tmp_path: Path) -> None:
    # Three meters in 2026Q3, all billing 0 ft3 or an estimate: read monthly and unused
    # (a true zero), read at the quarter's ends only (sparse: estimated), read last in June
    # (nothing in the quarter: a dead transmitter). The clerk must see which is which.
    config = station(tmp_path, [{"id": "idle"}, {"id": "sparse"}, {"id": "silent"}], max_reading_gap="40d")
    monthly = ("2026-06-30", "2026-07-31", "2026-08-31", "2026-09-30")
    ingest(
        config,
        [
            *((f"{d}T00:00:00Z", "idle", 500) for d in monthly),
            ("2026-06-30T00:00:00Z", "sparse", 100),
            ("2026-09-30T00:00:00Z", "sparse", 900),
            ("2026-06-15T00:00:00Z", "silent", 7000),
        ],
    )
    want = {"idle": [], "sparse": ["estimated"], "silent": ["estimated", "no readings"]}
    rows = export(config, "2026Q3")
    assert {r["meter"]: r["flags"] for r in rows} == {m: ";".join(f) for m, f in want.items()}
    assert {r["meter"]: r["consumption_ft3"] for r in rows} == {
        "idle": "0.000", "sparse": "800.000", "silent": "0.000"
    }  # fmt: skip
    got = monitor_cli(
        "billing", "export", "--config", str(config), "--quarter", "2026Q3", "--format", "json", "--out", "-"
    )
    assert got.returncode == 0, got.stderr
    assert {r["meter"]: r["flags"] for r in json.loads(got.stdout)} == want
    out = tmp_path / "q3.xlsx"
    got = monitor_cli(
        "billing",
        "export",
        "--config",
        str(config),
        "--quarter",
        "2026Q3",
        "--format",
        "xlsx",
        "--out",
        str(out),
    )
    assert got.returncode == 0, got.stderr
    sheet = load_workbook(out)["2026Q3"]
    header, *body, _total = sheet.iter_rows(values_only=True)
    flags = {r[header.index("meter")]: r[header.index("flags")] or "" for r in body}
    assert flags == {m: ";".join(f) for m, f in want.items()}
