"""Billing maths: quarters, the §139-3 rate, money rounding, classification, the CLI."""

from __future__ import annotations

import subprocess
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from monitor.config import Account, Config, build_config
from monitor.errors import MeterError
from monitor.meters.billing import export_rows, quarter, rate
from monitor.meters.book import MeterBook
from monitor.meters.classes import SystemFlow, classify
from monitor.model import Sample, iso, parse_time
from tests import cli

ROOT = Path(__file__).resolve().parent.parent


def run_monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


@pytest.mark.parametrize(
    ("text", "start_month", "start", "end"),
    [
        ("2026Q3", 1, "2026-07-01T00:00:00Z", "2026-10-01T00:00:00Z"),
        ("2026Q4", 1, "2026-10-01T00:00:00Z", "2027-01-01T00:00:00Z"),
        ("2026Q1", 7, "2026-07-01T00:00:00Z", "2026-10-01T00:00:00Z"),
        ("2026Q3", 7, "2027-01-01T00:00:00Z", "2027-04-01T00:00:00Z"),
        ("2026Q4", 10, "2027-07-01T00:00:00Z", "2027-10-01T00:00:00Z"),
        ("2026q2", 12, "2027-03-01T00:00:00Z", "2027-06-01T00:00:00Z"),
    ],
)
def test_quarters_follow_the_billing_year(text: str, start_month: int, start: str, end: str) -> None:
    q = quarter(text, start_month)
    assert (iso(q.start.timestamp()), iso(q.end.timestamp())) == (start, end)


def test_quarter_must_be_well_formed() -> None:
    for bad in ("2026Q5", "Q3", "2026-07"):
        with pytest.raises(MeterError, match="2026Q3"):
            quarter(bad)


def test_rate_is_budget_over_prior_year_kcf() -> None:
    assert rate(Decimal("850000"), Decimal("200000")) == Decimal("4.25")
    with pytest.raises(MeterError):
        rate(Decimal(1), Decimal(0))
    got = run_monitor("billing", "rate", "--budget", "$1,000,000", "--prior-year-kcf", "300000")
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines()[0] == "rate_per_kcf: 3.33"  # 3.3333... rounded half up to cents
    got = run_monitor("billing", "rate", "--budget", "1000000", "--prior-year-kcf", "300000", "--places", "4")
    assert got.stdout.splitlines()[0] == "rate_per_kcf: 3.3333"
    bad = run_monitor("billing", "rate", "--budget", "lots", "--prior-year-kcf", "3")
    assert bad.returncode == 1 and "budget 'lots' is not a number" in bad.stderr


def acct(
    cls: str = "industrial",
    workdays: int = 5,
    residential: bool | None = None,
    sic: str | None = "D",
    **more: object,
) -> Account:
    return Account.model_validate(
        {"id": "a", "class": cls, "workdays_per_week": workdays, "residential": residential,
         "sic_division": sic, **more}
    )  # fmt: skip


def cls_of(account: Account, gal: Fraction, days: int, system: Fraction | None) -> str:
    flow = SystemFlow(system, "billing.system_flow_gpd" if system is not None else "no system flow")
    return classify(account, gal, days, flow)[0]


def test_classification_thresholds() -> None:
    days, big = 91, Fraction(10**12)
    gal = Fraction(25_000 * days)
    assert cls_of(acct(), gal, days, big) == "industrial"  # exactly 25,000 gpd is not "more than"
    assert cls_of(acct(), gal + 1, days, big) == "industrial user"
    # 50,000 gal per average workday: 91 days x 5/7 = 65 workdays.
    assert cls_of(acct(), Fraction(50_000 * 65), days, big) == "major contributing industry"
    assert cls_of(acct(), Fraction(50_000 * 65) - 1, days, big) == "industrial user"
    # > 5 % of the municipal system's flow makes an industrial user major, whatever its workdays.
    small = gal + 1
    assert cls_of(acct(workdays=7), small, days, small * 20) == "industrial user"  # exactly 5 %
    assert cls_of(acct(workdays=7), small, days, small * 20 - 1) == "major contributing industry"
    # Residential users are never industrial users, however much they use.
    assert cls_of(acct("residential"), big, days, big) == "residential"
    assert cls_of(acct("apartments", residential=True), big, days, big) == "apartments"


def test_industrial_user_needs_every_condition_of_139_16_h1() -> None:
    days, gal = 92, Fraction(40_000 * 92)  # 40,000 gpd, well over 25,000
    flow = SystemFlow(None, "no billing.system_flow_gpd or billing.system_meter")
    school = classify(acct("school", sic="I", governmental=True), gal, days, flow)
    assert school == ("school", "§139-16 H(1): governmental user: not an industrial user")
    mall = classify(acct("commercial", sic="G"), gal, days, flow)  # retail trade is division G
    assert mall == (
        "commercial",
        "§139-16 H(1): SIC division G is not one of A, B, D, E, I: not an industrial user",
    )
    unknown = classify(acct("commercial", sic=None), gal, days, flow)
    assert unknown == ("commercial", "§139-16 H(1): no sic_division configured: not an industrial user")
    for division in ("A", "B", "D", "E", "I"):
        got, reason = classify(acct(sic=division, workdays=7), gal, days, flow)
        assert got == "industrial user"
        assert reason.endswith(
            "§139-15 5 % prong not judged (no billing.system_flow_gpd or billing.system_meter)"
        )


def test_the_superintendents_designation_overrides_and_says_why() -> None:
    days, gal = 92, Fraction(1_000 * 92)  # 1,000 gpd: no flow prong can apply
    flow = SystemFlow(Fraction(10**9), "billing.system_flow_gpd")
    toxic = {"classification": "major contributing industry", "reason": "chromium in toxic amounts (§139-15)"}
    assert classify(acct(designation=toxic), gal, days, flow) == (
        "major contributing industry", "designation: chromium in toxic amounts (§139-15)"
    )  # fmt: skip
    bod = {"classification": "industrial user", "reason": "BOD equivalent of 30,000 gpd (§139-16 H(1)(b))"}
    assert classify(acct(designation=bod), gal, days, flow)[0] == "industrial user"
    # A designated industrial user is still judged against §139-15's flow prongs.
    heavy = Fraction(60_000 * 92)
    got, reason = classify(acct(designation=bod, workdays=7), heavy, days, flow)
    assert got == "major contributing industry" and "60,000.00 gal per average workday >= 50,000" in reason
    out = {"classification": "not industrial", "reason": "sanitary wastes only (§139-16 H(1)(a))"}
    assert classify(acct(designation=out), heavy, days, flow) == (
        "industrial", "designation: sanitary wastes only (§139-16 H(1)(a))"
    )  # fmt: skip
    with pytest.raises(ValueError, match="reason"):
        acct(designation={"classification": "industrial user"})


def billing_config(tmp_path: Path, minimum: str | None = "25.00", units: int = 1) -> Config:
    return build_config(
        {
            "station": {"id": "ps-1"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "m", "kind": "meter", "unit": "ft3", "register_digits": 8, "account": "a"}],
            "billing": {
                "rate_per_kcf": "3.33",
                "minimum_charge": minimum,
                "accounts": [{"id": "a", "class": "commercial", "billing_units": units}],
            },
        }
    )


def export_for(
    tmp_path: Path, used_ft3: list[int], minimum: str | None = "25.00", units: int = 1
) -> dict[str, str]:
    config = billing_config(tmp_path, minimum, units)
    book = MeterBook.open(config)
    start = parse_time("2026-07-01T00:00:00Z")
    reading, samples = 0, [Sample("m", start, 0.0)]
    for i, used in enumerate(used_ft3, start=1):
        reading += used
        samples.append(Sample("m", start + i * 3600 * 12, float(reading)))
    book.ingest(samples)
    rows = export_rows(config, book.ledger, quarter("2026Q3"))
    book.close()
    assert len(rows) == 1
    return rows[0]


def test_money_is_rounded_once_at_the_end(tmp_path: Path) -> None:
    # 1,501 ft3 x $3.33/kcf = $4.99833; minimum off: charge $5.00, +2 % = $5.0982966 -> $5.10,
    # +10 % = $5.60812626 -> $5.61 (rounding $5.10 x 1.1 = $5.61 agrees here).
    row = export_for(tmp_path, [1501], minimum=None)
    assert (row["charge"], row["due_after_30_days"], row["due_after_60_days"]) == ("5.00", "5.10", "5.61")
    assert row["minimum_applied"] == "false" and row["consumption_kcf"] == "1.501000"


def test_minimum_charge_is_per_billing_unit(tmp_path: Path) -> None:
    row = export_for(tmp_path, [1000], units=3)  # $3.33 < 3 x $25
    assert (row["charge"], row["minimum_applied"], row["due_after_30_days"]) == ("75.00", "true", "76.50")
    assert row["due_after_60_days"] == "84.15"
    assert "estimated" in row["flags"]  # 12 h of readings in a 92-day quarter


def test_cli_replace_reports_inconsistent_figures(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(
        "station: {id: ps-1}\nstate_dir: state\n"
        "sensors:\n  - {id: m, kind: meter, unit: ft3, register_digits: 6}\n",
        encoding="utf-8",
    )
    readings = tmp_path / "r.csv"
    readings.write_text(
        "time,sensor,value\n2026-07-01T00:00:00Z,m,500\n2026-07-01T01:00:00Z,m,x\n2026-07-01T02:00:00Z,m,510\n",
        encoding="utf-8",
    )
    got = run_monitor("meters", "ingest", "--config", str(config), "--input", str(readings))
    assert got.returncode == 0 and "2 meter reading(s)" in got.stdout and "1 bad row(s)" in got.stdout
    assert "r.csv:3: skipped" in got.stderr
    args = ("meters", "replace", "--config", str(config), "--meter", "m", "--new-initial", "0")
    got = run_monitor(*args, "--time", "2026-07-01T03:00:00Z", "--old-final", "400")
    assert got.returncode == 1 and "old final 400 does not follow the last accepted reading 510" in got.stderr
    got = run_monitor(*args, "--time", "2026-07-01T03:00:00", "--old-final", "520")
    assert got.returncode == 1 and "has no zone" in got.stderr
    got = run_monitor(*args, "--time", "2026-07-01T03:00:00Z", "--old-final", "520", "--meter", "nope")
    assert got.returncode == 1 and "unknown meter 'nope'" in got.stderr
    got = run_monitor(*args, "--time", "2026-07-01T03:00:00Z", "--old-final", "520")
    assert got.returncode == 0, got.stderr
    shown = run_monitor("meters", "show", "--config", str(config), "--meter", "m")
    assert "old final" in shown.stdout and "replaced at 2026-07-01T03:00:00Z" in shown.stdout
    listed = run_monitor("meters", "list", "--config", str(config))
    assert "m  account -  ft3 x1, 6 digits, no max rate" in listed.stdout
    no_billing = run_monitor(
        "billing", "export", "--config", str(config), "--quarter", "2026Q3", "--out", "-"
    )
    assert no_billing.returncode == 1 and "no billing section" in no_billing.stderr


def test_a_corrupt_ledger_is_reported_not_trusted(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(
        "station: {id: ps-1}\nstate_dir: state\nsensors:\n  - {id: m, kind: meter}\n", encoding="utf-8"
    )
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "ledger.sqlite").write_bytes(b"this is not a database" * 100)
    got = run_monitor("meters", "list", "--config", str(config))
    assert got.returncode == 1 and "meter ledger" in got.stderr and "ledger.sqlite" in got.stderr
    assert "Traceback" not in got.stderr
