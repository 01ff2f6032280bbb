"""The quarterly rent-charge export (§139-3, §139-4) and user classification (§139-15, §139-16).

Reads the ledger only, so billing works on a gateway that never reached InfluxDB.
Volumes stay exact fractions and money exact decimals until the very end, where
each output column is rounded once (money to cents, ROUND_HALF_UP).

A delta belongs to the quarter its later reading falls in: period_start_utc < time <=
period_end_utc (the reading at local midnight on the first day closes the previous
quarter). Quarters are cut at the Town's midnight (`periods.py`); classes follow
§139-16 H(1) and §139-15 (`classes.py`).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import TextIO

from monitor.config import Account, Billing, Config
from monitor.durable import replace_file
from monitor.errors import MeterError
from monitor.meters.classes import SystemFlow, classify
from monitor.meters.ledger import READING, Ledger, Row
from monitor.meters.periods import Presentation, Quarter, quarter
from monitor.meters.rows import steps_summary
from monitor.meters.settings import change
from monitor.meters.totalizer import ANOMALIES, ft3_to_gal, to_ft3
from monitor.model import iso

__all__ = [
    "COLUMNS", "NO_READINGS", "Quarter", "Usage", "build_rows", "columns", "coverage", "estimated",
    "export_rows", "quarter", "rate", "unconfigured", "write_csv", "write_json",
]  # fmt: skip

COLUMNS = (
    "account", "meter", "period_start", "period_end", "period_start_utc", "period_end_utc",
    "first_read", "last_read", "unit", "consumption_ft3", "consumption_kcf", "consumption_gal",
    "average_gpd", "charge", "minimum_applied", "due_after_30_days", "due_after_60_days",
    "classification", "classification_reason", "flags",
)  # fmt: skip
PRESENTED_COLUMNS = ("presented", "penalty_from_30", "penalty_from_60")  # only with --presented
MONEY_COLUMNS = ("charge", "due_after_30_days", "due_after_60_days")
NO_READINGS = "no readings"  # besides `estimated`: missing, told apart from sparse
EXPORT_FLAGS = (
    "rollover", "replacement", "estimated", NO_READINGS, "anomaly", "corrected", "voided replacement",
    "rewritten", "unreconciled", "incomplete", "one settings period assumed", "deduplicated",  # historian
)  # fmt: skip
PENALTY_30 = Fraction(2, 100)  # §139-4: 2 % after 30 days
PENALTY_60 = Fraction(10, 100)  # §139-4: a further 10 % of the accumulated amount after 60 days


def columns(presented: bool = False) -> tuple[str, ...]:
    """The export's columns; the §139-4 dates follow the amounts due when a bill date is given."""
    if not presented:
        return COLUMNS
    at = COLUMNS.index("due_after_60_days") + 1
    return COLUMNS[:at] + PRESENTED_COLUMNS + COLUMNS[at:]


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
    # Each delta in the unit of its time's settings (a unit may have changed in the quarter).
    by_unit: dict[str, Decimal] = defaultdict(Decimal)
    for r in accepted:
        by_unit[ledger.spec_at(meter, r.time_ms, r.seq).unit] += r.volume
    ft3 = sum((to_ft3(v, unit) for unit, v in sorted(by_unit.items())), Fraction(0))
    flags: set[str] = set()
    for r in rows:
        flags.update(r.flags)
    out_flags: set[str] = {f for f in ("rollover", "replacement") if f in flags}
    out_flags |= settings_notes(ledger, meter, q, [r for r in rows if "settings" in r.flags])
    out_flags |= correction_notes(
        ledger, meter, [r.time_ms for r in rows] + ([] if before is None else [before.time_ms])
    )
    if flags & set(ANOMALIES) or ledger.conflicts(meter, q.start_ms, q.end_ms):
        out_flags.add("anomaly")
    before_ms = None if before is None else before.time_ms
    # The quarter's first delta starts at `before`: an amendment from that reading on
    # (a corrected closing reading of the last quarter, a voided swap) changes this quarter too.
    since = q.start_ms if before_ms is None else min(q.start_ms, before_ms - 1)
    out_flags |= ledger.amendment_flags(meter, since, q.end_ms)
    out_flags |= coverage(q, before_ms, [r.time_ms for r in accepted], max_reading_gap)
    steps = ledger.clock_steps(meter, q.start_ms, q.end_ms)
    out_flags |= {cs.describe() for cs in steps} if len(steps) <= STEP_NOTES else {steps_summary(steps)}
    first = before if before is not None else (accepted[0] if accepted else None)
    last = accepted[-1] if accepted else before

    def reading(row: Row | None) -> Decimal | None:  # x the multiplier of the reading's time
        return None if row is None else row.reading * ledger.spec_at(meter, row.time_ms, row.seq).multiplier

    return Usage(
        account=spec.account or "",
        meter=meter,
        # last_read's unit: at a change on the quarter's end instant, the unit in force then is
        # the next quarter's, and only a reading stamped at that very instant is in it.
        unit=(
            ledger.spec_at(meter, q.end_ms) if last is None else ledger.spec_at(meter, last.time_ms, last.seq)
        ).unit,
        first=reading(first),
        last=reading(last),
        ft3=ft3,
        flags=frozenset(out_flags),
    )


SETTINGS_CHANGED = "settings changed"  # the start of the flag naming a change: `settings changed at ...`


def settings_notes(ledger: Ledger, meter: str, q: Quarter, baselines: list[Row]) -> set[str]:
    """`settings changed at <time>: multiplier 1 -> 10` for each change of the meter's settings
    that took effect in the quarter, or whose new baseline (the first reading after it, whose
    delta is not billed) falls in it."""
    changes = ledger.settings_changes(meter, q.start_ms, q.end_ms)
    for row in baselines:
        changes += ledger.settings_changes(meter, -(2**62), row.time_ms)[-1:]  # the change it follows
    return {f"{SETTINGS_CHANGED} at {iso(b.since_ms / 1000)}: {change(a.spec, b.spec)}" for a, b in changes}


def correction_notes(ledger: Ledger, meter: str, times_ms: list[int]) -> set[str]:
    """`settings changed from the first reading: multiplier 1 -> 10 (corrected)` for a quarter
    with rows under a first period that a correction replaced: its figures are no longer
    those of an export made before the correction, and the export says so."""
    held = ledger.periods(meter, superseded=True)
    first = [p for p in held if p.first]
    later = [p.since_ms for p in held if not p.first]
    if len(first) < 2 or not times_ms or min(times_ms) >= min(later, default=2**62):
        return set()
    return {
        f"{SETTINGS_CHANGED} from the first reading: {change(a.spec, b.spec)} (corrected)"
        for a, b in itertools.pairwise(first)
        if b.source == "corrected"
    }


def coverage(q: Quarter, before_ms: int | None, accepted_ms: list[int], max_reading_gap: float) -> set[str]:
    """The coverage flags, shared by the ledger and the historian: `estimated` for a gap
    longer than `max_reading_gap`, and `no readings` besides when the quarter has no
    accepted reading at all, so a clerk can tell a meter that was not read (a dead
    transmitter, a meter never connected) from one read too seldom."""
    if not accepted_ms:
        return {"estimated", NO_READINGS}
    return {"estimated"} if estimated(q, before_ms, accepted_ms, max_reading_gap) else set()


def estimated(q: Quarter, before_ms: int | None, accepted_ms: list[int], max_reading_gap: float) -> bool:
    """Coverage, shared by the ledger and the historian: accepted readings inside the
    quarter, clipped to its bounds, leave no gap longer than `max_reading_gap` seconds."""
    if not accepted_ms:
        return True
    times = [q.start_ms, *accepted_ms, q.end_ms]
    if before_ms is None:
        times[0] = accepted_ms[0]  # a meter installed mid-quarter: its first reading opens it
    return max(b - a for a, b in itertools.pairwise(times)) > max_reading_gap * 1000


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


def system_flow(config: Config, usages: Mapping[str, Usage], q: Quarter) -> SystemFlow:
    """The municipal system's flow over the quarter for §139-15's 5 % prong, or why not."""
    billing = config.billing
    assert billing is not None
    if billing.system_flow_gpd is not None:
        return SystemFlow(Fraction(billing.system_flow_gpd) * q.days, "billing.system_flow_gpd")
    if billing.system_meter is not None:
        u = usages[billing.system_meter]
        caveat = f" ({', '.join(f for f in EXPORT_FLAGS if f in u.flags)})" if u.flags else ""
        return SystemFlow(ft3_to_gal(u.ft3), f"system meter {billing.system_meter}{caveat}")
    return SystemFlow(None, "no billing.system_flow_gpd or billing.system_meter")


def export_rows(
    config: Config, ledger: Ledger, q: Quarter, presented: Presentation | None = None
) -> list[dict[str, str]]:
    """One row per account and meter, in account then meter order, from the ledger."""
    billing = config.billing
    if billing is None:
        raise MeterError("the config has no billing section (rate_per_kcf, accounts)")
    usages = {m: usage(ledger, m, q, billing.max_reading_gap) for m in ledger.specs}
    return build_rows(config, usages, q, presented)


def unconfigured(ledger: Ledger, q: Quarter) -> list[tuple[str, int]]:
    """Meters the ledger holds readings of in the quarter that the config no longer has
    (a meter dropped or renamed): the export cannot bill them, so the command names them."""
    out = []
    for meter in ledger.meters():
        if meter not in ledger.specs:
            n = sum(1 for r in ledger.rows(meter, q.start_ms, q.end_ms) if r.seq == READING)
            if n:
                out.append((meter, n))
    return out


def build_rows(
    config: Config, usages: Mapping[str, Usage], q: Quarter, presented: Presentation | None = None
) -> list[dict[str, str]]:
    """The export's rows from each meter's quarter (the system meter's too, if any),
    however the usages were read: one computation of charges, classes and flags."""
    billing = config.billing
    if billing is None:
        raise MeterError("the config has no billing section (rate_per_kcf, accounts)")
    billed = [m for m in usages if m != billing.system_meter]
    unbilled = sorted(m for m in billed if usages[m].account not in {a.id for a in billing.accounts})
    if unbilled:
        raise MeterError(f"meters without a billing account: {', '.join(unbilled)}")
    meters_by_account: dict[str, list[str]] = defaultdict(list)
    for meter in billed:
        meters_by_account[usages[meter].account].append(meter)
    system = system_flow(config, usages, q)
    period = {
        "period_start": q.first_day.isoformat(),
        "period_end": q.last_day.isoformat(),
        "period_start_utc": iso(q.start.timestamp()),
        "period_end_utc": iso(q.end.timestamp()),
    }
    dates = (
        {}
        if presented is None
        else {
            "presented": presented.presented.isoformat(),
            "penalty_from_30": presented.penalty_from_30.isoformat(),
            "penalty_from_60": presented.penalty_from_60.isoformat(),
        }
    )
    out: list[dict[str, str]] = []
    for account in sorted(billing.accounts, key=lambda a: a.id):
        meters = sorted(meters_by_account.get(account.id, []))
        account_gal = sum((ft3_to_gal(usages[m].ft3) for m in meters), Fraction(0))
        cls, reason = classify(account, account_gal, q.days, system)
        charges = {m: usages[m].ft3 / 1000 * Fraction(billing.rate_per_kcf) for m in meters}
        minimum = _minimum(billing, account)
        topup = max(minimum - sum(charges.values(), Fraction(0)), Fraction(0))
        money = _money(
            [charges.get(m, Fraction(0)) + (topup if i == 0 else 0) for i, m in enumerate(meters or [""])]
        )
        for i, meter in enumerate(meters or [""]):
            u = usages.get(meter) or Usage(
                account.id, "", "ft3", None, None, Fraction(0), frozenset({"estimated", NO_READINGS})
            )
            gal = ft3_to_gal(u.ft3)
            row = {
                "account": account.id,
                "meter": meter,
                **period,
                "first_read": _num(u.first),
                "last_read": _num(u.last),
                "unit": u.unit,
                "consumption_ft3": _fmt(u.ft3, 3),
                "consumption_kcf": _fmt(u.ft3 / 1000, 6),
                "consumption_gal": _fmt(gal, 2),
                "average_gpd": _fmt(gal / q.days, 2),
                "charge": money[i][0],
                # Where the minimum changed the amount: the row the top-up is on, not its account's
                # every row (an account is on the minimum when one of its rows says so).
                "minimum_applied": "true" if topup > 0 and i == 0 else "false",
                "due_after_30_days": money[i][1],
                "due_after_60_days": money[i][2],
                **dates,
                "classification": cls,
                "classification_reason": reason,
                "flags": ";".join(export_flags(u.flags)),
            }
            out.append({c: row[c] for c in columns(presented is not None)})
    return out


STEP_NOTES = 3  # a quarter's clock steps listed one by one in its flags; more are one summary
CLOCK_STEPPED = "gateway clock stepped"  # the start of a clock step's note (`rows.ClockStep.describe`)


def export_flags(flags: frozenset[str]) -> list[str]:
    """The flags in their fixed order, then the settings changes and the gateway clock's steps
    back the ledger's rows were moved across, each in time order."""
    return (
        [f for f in EXPORT_FLAGS if f in flags]
        + sorted(f for f in flags if f.startswith(SETTINGS_CHANGED))
        + sorted(f for f in flags if f.startswith(CLOCK_STEPPED))
    )


def _money(charges: list[Fraction]) -> list[tuple[str, str, str]]:
    """Each row's charge and §139-4 amounts due, in cents, for one account's rows.

    One row is its exact amount rounded half up, once. Several rows (an account with
    several meters) share the account's exact total rounded the same way, by largest
    remainder: each row gets its amount rounded down, and the cents left go to the rows
    with the largest fractions (the first row on a tie). So the rows add up to the account's
    bill to the cent (the minimum, when it applies), and no row is more than a cent from its
    exact amount, nor below zero ($20.00 + $5.01 was $25.01 against a $25.00 minimum)."""
    factors = (Fraction(1), 1 + PENALTY_30, (1 + PENALTY_30) * (1 + PENALTY_60))
    columns = []
    for factor in factors:
        exact = [c * factor * 100 for c in charges]
        if len(exact) == 1:
            cents = [_half_up(exact[0])]
        else:
            cents = [math.floor(x) for x in exact]
            left = _half_up(sum(exact, Fraction(0))) - sum(cents)
            by_fraction = sorted(range(len(exact)), key=lambda i: (-(exact[i] - cents[i]), i))
            for i in by_fraction[:left]:
                cents[i] += 1
        columns.append([f"{Decimal(c).scaleb(-2):f}" for c in cents])
    return list(zip(*columns, strict=True))


def _half_up(x: Fraction) -> int:
    return (x.numerator * 2 + x.denominator) // (x.denominator * 2)


def _minimum(billing: Billing, account: Account) -> Fraction:
    if billing.minimum_charge is None:
        return Fraction(0)
    return Fraction(billing.minimum_charge) * account.billing_units


TEXT_COLUMNS = ("station", "account", "meter", "unit", "classification", "classification_reason", "flags")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


def write_csv(rows: list[dict[str, str]], out: TextIO) -> None:
    """Text from the config (an account's class, an id) that a spreadsheet would run as a
    formula gets a leading `'` (OWASP's CSV-injection advice); numbers are left as written."""
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(
        {c: "'" + v if c in TEXT_COLUMNS and v.startswith(FORMULA_START) else v for c, v in r.items()}
        for r in rows
    )


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
    """Written beside the target and renamed, so a reader never sees half a file."""
    text = io.StringIO(newline="")
    (write_json if fmt == "json" else write_csv)(rows, text)
    data = text.getvalue().encode("utf-8")
    try:
        replace_file(path, lambda f: f.write(data))  # no half file left beside the target
    except OSError as exc:  # a folder that is not there, a full disk: one line, as the XLSX says it
        raise MeterError(f"cannot write {path}: {exc.strerror}") from None
