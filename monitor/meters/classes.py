"""User classes: §139-16 H(1) "industrial user" and §139-15 "major contributing industry".

§139-16 H(1): "Any nongovernmental, nonresidential user ... which discharges more than
the equivalent of 25,000 gallons per day (gpd) of sanitary wastes and which is
identified in the Standard Industrial Classification Manual, 1972 ... under one of the
following divisions: Division A ..., Division B ..., Division D ..., Division E ... or
Division I". All four conditions must hold; a user without a configured SIC division
is not judged an industrial user (the export says so: it never guesses a division).

§139-15: "Major contributing industries, which are industrial users of the POTW, that
have a flow of 50,000 gallons or more per average workday; have a flow greater than 5%
of the flow carried by the municipal system receiving the waste; ..." Only industrial
users can be major; either flow prong is enough. The 5 % prong needs the municipal
system's flow (`billing.system_flow_gpd` or `billing.system_meter`): without it the
prong is reported as not judged.

The prongs no meter can judge (BOD/SS equivalence, toxics, the 21 categories, a SPDES
finding) come in as the Superintendent's `designation`, with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from monitor.config import Account

INDUSTRIAL_GPD = 25_000  # §139-16 H(1): more than 25,000 gallons per day
INDUSTRIAL_DIVISIONS = ("A", "B", "D", "E", "I")  # §139-16 H(1)
MAJOR_GAL_PER_WORKDAY = 50_000  # §139-15: 50,000 gallons or more per average workday
MAJOR_SHARE = Fraction(5, 100)  # §139-15: more than 5 % of the flow carried by the system
INDUSTRIAL, MAJOR = "industrial user", "major contributing industry"


@dataclass(frozen=True, slots=True)
class SystemFlow:
    """The municipal system's flow over the same period, or why there is none."""

    gal: Fraction | None
    source: str  # "billing.system_flow_gpd", "meter plant.influent", or why it is missing


def _n(x: Fraction) -> str:
    return f"{float(x):,.2f}"


def is_residential(account: Account) -> bool:
    return account.residential if account.residential is not None else account.class_ == "residential"


def classify(account: Account, gal: Fraction, days: int, system: SystemFlow) -> tuple[str, str]:
    """(classification, reason): the class name, or the §139-16/§139-15 class, and why."""
    d = account.designation
    if d is not None and d.classification != INDUSTRIAL:
        cls = account.class_ if d.classification == "not industrial" else d.classification
        return cls, f"designation: {d.reason}"
    if d is None:
        why_not = _not_industrial(account, gal, days)
        if why_not is not None:
            return account.class_, f"§139-16 H(1): {why_not}: not an industrial user"
        reasons = [
            f"§139-16 H(1): nongovernmental, nonresidential, SIC division {account.sic_division},"
            f" {_n(gal / days)} gpd > 25,000"
        ]
    else:
        reasons = [f"designation: {d.reason}"]
    if days <= 0:
        return INDUSTRIAL, "; ".join(reasons)
    workdays = Fraction(days * account.workdays_per_week, 7)
    per_workday = gal / workdays
    major = per_workday >= MAJOR_GAL_PER_WORKDAY
    if major:
        reasons.append(f"§139-15: {_n(per_workday)} gal per average workday >= 50,000")
    if system.gal is None:
        reasons.append(f"§139-15 5 % prong not judged ({system.source})")
    elif system.gal <= 0:
        reasons.append(f"§139-15 5 % prong not judged ({system.source} shows no flow)")
    else:
        share = gal / system.gal
        pct = f"{float(share * 100):.2f} % of {system.source}"
        if share > MAJOR_SHARE:
            major = True
            reasons.append(f"§139-15: {pct} > 5 %")
        elif not major:
            reasons.append(f"§139-15: {_n(per_workday)} gal per average workday < 50,000, {pct} <= 5 %")
    return (MAJOR if major else INDUSTRIAL), "; ".join(reasons)


def _not_industrial(account: Account, gal: Fraction, days: int) -> str | None:
    if is_residential(account):
        return "residential user"
    if account.governmental:
        return "governmental user"
    if account.sic_division is None:
        return "no sic_division configured"
    if account.sic_division not in INDUSTRIAL_DIVISIONS:
        return f"SIC division {account.sic_division} is not one of A, B, D, E, I"
    if days <= 0 or gal / days <= INDUSTRIAL_GPD:
        return f"{_n(gal / days if days > 0 else Fraction(0))} gpd is not more than 25,000"
    return None
