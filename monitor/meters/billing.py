"""The quarterly rent-charge export (§139-3, §139-4) and user classification (§139-15, §139-16).

Reads the ledger only, so billing works on a gateway that never reached InfluxDB.
Volumes stay exact fractions and money exact decimals until the very end, where
each output column is rounded once (money to cents, ROUND_HALF_UP).

A delta belongs to the quarter its later reading falls in: period_start < time <=
period_end (the reading at 00:00 on the first day closes the previous quarter).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import TextIO

from monitor.config import Account, Billing, Config
from monitor.errors import MeterError
from monitor.meters.ledger import Ledger
from monitor.meters.totalizer import ANOMALIES, ft3_to_gal, to_ft3
from monitor.model import iso

COLUMNS = (
    "account", "meter", "period_start", "period_end", "first_read", "last_read", "unit",
    "consumption_ft3", "consumption_kcf", "consumption_gal", "average_gpd", "charge",
    "minimum_applied", "due_after_30_days", "due_after_60_days", "classification", "flags",
)  # fmt: skip
EXPORT_FLAGS = ("rollover", "replacement", "estimated", "anomaly")
INDUSTRIAL_GPD = 25_000  # §139-16 H(1): more than 25,000 gallons per day
MAJOR_GAL_PER_WORKDAY = 50_000  # §139-15: 50,000 gallons or more per average workday
MAJOR_SHARE = Fraction(5, 100)  # §139-15: more than 5 % of the flow carried by the system
PENALTY_30 = Fraction(2, 100)  # §139-4: 2 % after 30 days
PENALTY_60 = Fraction(10, 100)  # §139-4: a further 10 % of the accumulated amount after 60 days


@dataclass(frozen=True, slots=True)
class Quarter:
    """Billing quarter `n` (1-4) of billing year `year`, which starts on the 1st of
    `year_start_month` of calendar year `year` (UTC midnight)."""

    year: int
    n: int
    start: datetime
    end: datetime

    @property
    def start_ms(self) -> int:
        return int(self.start.timestamp()) * 1000

    @property
    def end_ms(self) -> int:
        return int(self.end.timestamp()) * 1000

    @property
    def days(self) -> int:
        return (self.end - self.start).days

    def __str__(self) -> str:
        return f"{self.year}Q{self.n}"


def quarter(text: str, year_start_month: int = 1) -> Quarter:
    """`2026Q3` -> the period; with year_start_month 7, 2026Q3 is January-March 2027."""
    m = re.fullmatch(r"\s*(\d{4})\s*-?\s*[Qq]([1-4])\s*", text)
    if not m:
        raise MeterError(f"quarter {text!r} must look like 2026Q3")
    year, n = int(m.group(1)), int(m.group(2))
    first = (year_start_month - 1) + 3 * (n - 1)  # months after January of `year`
    start = datetime(year + first // 12, first % 12 + 1, 1, tzinfo=UTC)
    last = first + 3
    end = datetime(year + last // 12, last % 12 + 1, 1, tzinfo=UTC)
    return Quarter(year, n, start, end)


def rate(budget: Decimal, prior_year_kcf: Decimal) -> Decimal:
    """§139-3: the O&M budget divided by the prior calendar year's consumption in kcf."""
    if prior_year_kcf <= 0:
        raise MeterError("prior-year consumption must be more than 0 kcf")
    if budget < 0:
        raise MeterError("the budget must not be negative")
    return budget / prior_year_kcf


@dataclass(frozen=True, slots=True)
class Usage:
    """One meter's quarter, exact; `first`/`last` are readings in the meter's unit."""

    account: str
    meter: str
    unit: str
    first: Decimal | None
    last: Decimal | None
    ft3: Fraction
    flags: frozenset[str]


def usage(ledger: Ledger, meter: str, q: Quarter, max_reading_gap: float) -> Usage:
    """Sum of the deltas whose later reading falls in the quarter; no interpolation."""
    spec = ledger.spec(meter)
    before = ledger.accepted_at_or_before(meter, q.start_ms)
    rows = ledger.rows(meter, q.start_ms, q.end_ms)
    accepted = [r for r in rows if r.accepted]
    volume = sum((r.volume for r in accepted), Decimal(0))
    flags: set[str] = set()
    for r in rows:
        flags.update(r.flags)
    out_flags: set[str] = {f for f in ("rollover", "replacement") if f in flags}
    if flags & set(ANOMALIES) or ledger.conflicts(meter, q.start_ms, q.end_ms):
        out_flags.add("anomaly")
    # Coverage: accepted readings inside the quarter, clipped to its bounds.
    times = [q.start_ms, *(r.time_ms for r in accepted), q.end_ms]
    if before is None and accepted:
        times[0] = accepted[0].time_ms  # a meter installed mid-quarter: its first reading opens it
    if not accepted or max(b - a for a, b in itertools.pairwise(times)) > max_reading_gap * 1000:
        out_flags.add("estimated")
    first = before if before is not None else (accepted[0] if accepted else None)
    last = accepted[-1] if accepted else before
    return Usage(
        account=spec.account or "",
        meter=meter,
        unit=spec.unit,
        first=None if first is None else first.reading * spec.multiplier,
        last=None if last is None else last.reading * spec.multiplier,
        ft3=to_ft3(volume, spec.unit),
        flags=frozenset(out_flags),
    )


def _fmt(x: Fraction, places: int) -> str:
    # Exact rounding of a fraction: scale, round half up on integers, then place the point.
    scaled = x * 10**places
    n = (scaled.numerator * 2 + scaled.denominator) // (scaled.denominator * 2)
    q = Decimal(n).scaleb(-places)
    return f"{q:f}"


def _num(x: Decimal | None) -> str:
    if x is None:
        return ""
    text = f"{x.normalize():f}"
    return text


def classify(account: Account, gal: Fraction, days: int, system_gal: Fraction) -> str:
    """§139-16 H(1) industrial user; §139-15 major contributing industry (industrial users first)."""
    residential = account.residential if account.residential is not None else account.class_ == "residential"
    if residential or days <= 0:
        return account.class_
    if gal / days <= INDUSTRIAL_GPD:
        return account.class_
    workdays = Fraction(days * account.workdays_per_week, 7)
    if gal / workdays >= MAJOR_GAL_PER_WORKDAY or (system_gal > 0 and gal / system_gal > MAJOR_SHARE):
        return "major contributing industry"
    return "industrial user"


def export_rows(config: Config, ledger: Ledger, q: Quarter) -> list[dict[str, str]]:
    """One row per account and meter, in account then meter order."""
    billing = config.billing
    if billing is None:
        raise MeterError("the config has no billing section (rate_per_kcf, accounts)")
    meters_by_account: dict[str, list[str]] = defaultdict(list)
    for meter, spec in ledger.specs.items():
        meters_by_account[spec.account or ""].append(meter)
    usages = {m: usage(ledger, m, q, billing.max_reading_gap) for m in ledger.specs}
    system_gal = sum((ft3_to_gal(u.ft3) for u in usages.values()), Fraction(0))
    out: list[dict[str, str]] = []
    for account in sorted(billing.accounts, key=lambda a: a.id):
        meters = sorted(meters_by_account.get(account.id, []))
        account_gal = sum((ft3_to_gal(usages[m].ft3) for m in meters), Fraction(0))
        cls = classify(account, account_gal, q.days, system_gal)
        charges = {m: usages[m].ft3 / 1000 * Fraction(billing.rate_per_kcf) for m in meters}
        minimum = _minimum(billing, account)
        topup = max(minimum - sum(charges.values(), Fraction(0)), Fraction(0))
        for i, meter in enumerate(meters or [""]):
            u = usages.get(meter) or Usage(
                account.id, "", "ft3", None, None, Fraction(0), frozenset({"estimated"})
            )
            charge = charges.get(meter, Fraction(0)) + (topup if i == 0 else 0)
            due30 = charge * (1 + PENALTY_30)
            due60 = due30 * (1 + PENALTY_60)
            gal = ft3_to_gal(u.ft3)
            out.append(
                {
                    "account": account.id,
                    "meter": meter,
                    "period_start": iso(q.start.timestamp()),
                    "period_end": iso(q.end.timestamp()),
                    "first_read": _num(u.first),
                    "last_read": _num(u.last),
                    "unit": u.unit,
                    "consumption_ft3": _fmt(u.ft3, 3),
                    "consumption_kcf": _fmt(u.ft3 / 1000, 6),
                    "consumption_gal": _fmt(gal, 2),
                    "average_gpd": _fmt(gal / q.days, 2),
                    "charge": _fmt(charge, 2),
                    "minimum_applied": "true" if topup > 0 else "false",
                    "due_after_30_days": _fmt(due30, 2),
                    "due_after_60_days": _fmt(due60, 2),
                    "classification": cls,
                    "flags": ";".join(f for f in EXPORT_FLAGS if f in u.flags),
                }
            )
    unbilled = sorted(
        m for m in ledger.specs if ledger.specs[m].account not in {a.id for a in billing.accounts}
    )
    if unbilled:
        raise MeterError(f"meters without a billing account: {', '.join(unbilled)}")
    return out


def _minimum(billing: Billing, account: Account) -> Fraction:
    if billing.minimum_charge is None:
        return Fraction(0)
    return Fraction(billing.minimum_charge) * account.billing_units


def write_csv(rows: list[dict[str, str]], out: TextIO) -> None:
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def write_json(rows: list[dict[str, str]], out: TextIO) -> None:
    """Numbers as strings (exact decimals), booleans as booleans, flags as a list."""
    items = [
        {
            **r,
            "minimum_applied": r["minimum_applied"] == "true",
            "flags": [f for f in r["flags"].split(";") if f],
        }
        for r in rows
    ]
    json.dump(items, out, indent=2, ensure_ascii=False)
    out.write("\n")


def write_export(rows: list[dict[str, str]], path: Path, fmt: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8", newline="") as fh:
        (write_json if fmt == "json" else write_csv)(rows, fh)
    tmp.replace(path)
