"""Consumption between two totalizer readings, and the sanity checks that guard the bill.

Pure functions, no I/O. Readings are register counts (what the Modbus field or the
replay row carries); `counts x multiplier` is volume in the meter's `unit`. All
arithmetic is exact: readings become `Decimal` from their shortest decimal form,
volumes become `Fraction` when converted between units, and nothing is rounded here.

A drop in the reading is a **rollover** when the register wrapped at 10^digits and
the wrapped delta is plausible: within `max_rate` for the elapsed time, or, with no
`max_rate`, less than half the register range; and the reading fell just now (it is
below the reading before it, accepted or not). Anything else that looks wrong is
flagged and the reading is **rejected** (kept in the ledger, never billed; the next
good reading bills from the last accepted one, so nothing is lost):

- `backwards`: the reading went down and it is not a plausible rollover
- `drop`: the reading fell by half the register or more, yet the wrapped delta is more
  than `max_rate` allows (a register reset, or a replacement nobody recorded)
- `jump`: the reading rose by more than `max_rate` allows for the elapsed time, or, with
  no `max_rate`, by half the register range or more (the bound a rollover is believed to)
- `range`: the reading is negative or does not fit the register (>= 10^digits)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from monitor.config import Sensor
from monitor.errors import MeterError
from monitor.model import Condition, ConditionState, Rule

CITATION = "§139-3"  # the rent charge is levied on metered water consumption

# Exact unit definitions: 1 US gallon = 231 in3, 1 ft3 = 1728 in3 (so 1 ft3 =
# 7.480519... gal), 1 ft = 0.3048 m exactly (so 1 ft3 = 0.028316846592 m3).
GAL_PER_FT3 = Fraction(1728, 231)
_FT3_PER_UNIT: dict[str, Fraction] = {
    "ft3": Fraction(1),
    "gal": Fraction(231, 1728),
    "m3": 1 / Fraction("0.028316846592"),
}

# The checks' version, kept with each meter in the ledger: raise it when `judge` would give
# another verdict on readings already held, so ledgers are judged again at the next start.
# 2: without max_rate, a rise of half the register or more is a `jump`.
RULES = 2
ANOMALIES = ("backwards", "drop", "jump", "range")
# Order in which flags are written (ledger and export): stable, so outputs compare exactly.
FLAG_ORDER = ("first", "settings", "rollover", "replacement", *ANOMALIES, "conflict")


def dec(value: float | int | str | Decimal) -> Decimal:
    """A reading or setting as an exact Decimal, from its shortest decimal form (0.1 -> 0.1)."""
    if isinstance(value, Decimal):
        out = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise MeterError(f"reading {value!r} is not a finite number")
        out = Decimal(int(value)) if value.is_integer() else Decimal(repr(value))
    else:
        try:
            out = Decimal(value)
        except ArithmeticError as exc:
            raise MeterError(f"{value!r} is not a number") from exc
    if not out.is_finite():
        raise MeterError(f"{value!r} is not a finite number")
    return out


def to_ft3(volume: Decimal | Fraction, unit: str) -> Fraction:
    """Volume in the meter's unit -> exact ft3."""
    try:
        return Fraction(volume) * _FT3_PER_UNIT[unit]
    except KeyError:
        raise MeterError(f"unknown meter unit {unit!r} (ft3, gal or m3)") from None


def from_ft3(ft3: Fraction, unit: str) -> Fraction:
    """Exact ft3 -> volume in `unit` (a swap's point across a unit change)."""
    return ft3 / to_ft3(Decimal(1), unit)


def ft3_to_gal(ft3: Fraction) -> Fraction:
    return ft3 * GAL_PER_FT3


def order_flags(flags: set[str] | frozenset[str]) -> tuple[str, ...]:
    return tuple(f for f in FLAG_ORDER if f in flags) + tuple(sorted(flags - set(FLAG_ORDER)))


@dataclass(frozen=True, slots=True)
class MeterSpec:
    """What the checks need to know about one meter, from its sensor entry."""

    meter: str
    unit: str
    digits: int | None
    multiplier: Decimal
    max_rate: Decimal | None  # meter units per hour
    account: str | None = None
    since: float | None = None  # `settings_since`: when these settings took effect (epoch s)

    @classmethod
    def from_sensor(cls, sensor: Sensor) -> MeterSpec:
        if sensor.kind != "meter":
            raise MeterError(f"sensor {sensor.id!r} is a {sensor.kind} sensor, not a meter")
        return cls(
            meter=sensor.id,
            unit=sensor.effective_unit,
            digits=sensor.register_digits,
            multiplier=dec(sensor.multiplier),
            max_rate=None if sensor.max_rate is None else dec(sensor.max_rate),
            account=sensor.account,
            since=sensor.settings_since,
        )

    @property
    def modulus(self) -> Decimal | None:
        return None if self.digits is None else Decimal(10) ** self.digits

    def max_volume(self, elapsed_s: int | float) -> Decimal | None:
        """The most the meter can pass in `elapsed_s` seconds at `max_rate` (meter units)."""
        if self.max_rate is None:
            return None
        return self.max_rate * dec(elapsed_s) / Decimal(3600)


@dataclass(frozen=True, slots=True)
class Step:
    """The verdict on one reading against the last accepted one.

    `counts` is the register delta after rollover (0 when rejected or first);
    `volume` is `counts x multiplier` in the meter's unit.
    """

    accepted: bool
    counts: Decimal
    volume: Decimal
    flags: frozenset[str]
    message: str = ""
    limit: Decimal | None = None

    @property
    def anomalies(self) -> frozenset[str]:
        return self.flags & frozenset(ANOMALIES)


ZERO = Decimal(0)


def first_step(spec: MeterSpec, reading: Decimal) -> Step:
    """The first reading of a meter: the baseline, no consumption."""
    bad = _range_problem(spec, reading)
    if bad:
        return Step(False, ZERO, ZERO, frozenset({"range"}), bad)
    return Step(True, ZERO, ZERO, frozenset({"first"}))


def judge(
    spec: MeterSpec, previous: Decimal, elapsed_s: float, reading: Decimal, last_raw: Decimal | None = None
) -> Step:
    """Consumption from `previous` (the last accepted reading) to `reading`.

    ((reading - previous) mod 10^digits) x multiplier, with the checks above.
    `last_raw` is the reading just before this one, accepted or not: a rollover is
    only believed at the moment the register falls. Otherwise a meter that was reset
    would, after enough hours of rejected readings, look like a plausible rollover
    and bill the whole register range.
    """
    bad = _range_problem(spec, reading)
    if bad:
        return Step(False, ZERO, ZERO, frozenset({"range"}), bad)
    diff = reading - previous
    modulus = spec.modulus
    allowed = spec.max_volume(elapsed_s)
    if diff >= 0:
        volume = diff * spec.multiplier
        if allowed is not None and volume > allowed:
            return Step(
                False,
                ZERO,
                ZERO,
                frozenset({"jump"}),
                f"reading jumped from {previous} to {reading}: {_n(volume)} {spec.unit} in "
                f"{_dur(elapsed_s)} is more than max_rate {_n(spec.max_rate)} {spec.unit}/h allows",
                allowed,
            )
        if allowed is None and modulus is not None and diff >= modulus / 2:
            # Without max_rate a rollover is believed up to half the register; a rise of half
            # the register or more is no more believable (a glitch of 0 just below the top was
            # taken as a rollover, and the true reading after it billed the whole register).
            return Step(
                False,
                ZERO,
                ZERO,
                frozenset({"jump"}),
                f"reading jumped from {previous} to {reading}: a rise of half the 10^{spec.digits}"
                f" register or more between two readings is not believable (max_rate sets the bound)",
            )
        return Step(True, diff, volume, frozenset())
    if modulus is not None:
        wrapped = diff + modulus
        volume = wrapped * spec.multiplier
        plausible = volume <= allowed if allowed is not None else wrapped < modulus / 2
        if last_raw is not None and reading >= last_raw:
            plausible = False  # the fall happened at an earlier, rejected reading
        if plausible:
            return Step(True, wrapped, volume, frozenset({"rollover"}))
        if -diff >= modulus / 2:
            return Step(
                False,
                ZERO,
                ZERO,
                frozenset({"drop"}),
                f"reading dropped from {previous} to {reading}; as a rollover at 10^{spec.digits} that is "
                f"{_n(volume)} {spec.unit} in {_dur(elapsed_s)}, more than the meter can pass",
                allowed,
            )
    return Step(
        False,
        ZERO,
        ZERO,
        frozenset({"backwards"}),
        f"reading went backwards from {previous} to {reading}",
    )


def _range_problem(spec: MeterSpec, reading: Decimal) -> str:
    if reading < 0:
        return f"reading {reading} is negative"
    if spec.modulus is not None and reading >= spec.modulus:
        return f"reading {reading} does not fit a {spec.digits}-digit register"
    return ""


def condition(spec: MeterSpec, time: float, reading: Decimal, step: Step | None) -> Condition:
    """The meter alarm for a rejected reading (`step`), or its clearing (`step` None)."""
    if step is None:
        return Condition(
            time=time,
            sensor=spec.meter,
            rule=Rule.METER,
            state=ConditionState.CLEARED,
            value=float(reading),
            limit=None,
            citation=CITATION,
            message=f"meter {spec.meter} reading {reading} accepted again",
        )
    return Condition(
        time=time,
        sensor=spec.meter,
        rule=Rule.METER,
        state=ConditionState.ACTIVE,
        value=float(reading),
        limit=None if step.limit is None else float(step.limit),
        citation=CITATION,
        message=f"meter {spec.meter}: {step.message}; not billed until resolved",
        extra={"flag": ",".join(order_flags(step.anomalies)), "account": spec.account or ""},
    )


def _n(x: Decimal | None) -> str:
    return "?" if x is None else f"{x.normalize():f}"


def _dur(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds:g} s"
