"""Units per sensor kind, conversions between them, and physically possible ranges.

Lives beside `model` (not under `engine/`) because config validation needs the
unit table too, and the base layer may not import the engine. Every unit has a
dimension and a scale to SI, so a conversion is a table look-up and derived
sensors (monitor/station) can check `ft2 * ft/s` against `gpm` when the config loads.
"""

from __future__ import annotations

import math

from monitor.model import Kind

Dim = tuple[tuple[str, int], ...]  # base -> exponent, sorted, no zeros


def dim(**exponents: int) -> Dim:
    return tuple(sorted((k, v) for k, v in exponents.items() if v))


def dim_mul(a: Dim, b: Dim, sign: int = 1) -> Dim:
    out = dict(a)
    for k, v in b:
        out[k] = out.get(k, 0) + sign * v
    return dim(**out)


GALLON_M3 = 3.785411784e-3
GALLONS_PER_FT3 = 7.480519480519481  # 1728 in3 / 231 in3
FT = 0.3048
_L, _L2, _L3 = dim(L=1), dim(L=2), dim(L=3)
_FLOW, _CONC, _MASS_RATE = dim(L=3, T=-1), dim(M=1, L=-3), dim(M=1, T=-1)
NONE: Dim = ()

# unit -> (dimension, scale to SI, offset to SI): si = value * scale + offset
UNIT_TABLE: dict[str, tuple[Dim, float, float]] = {
    # flow
    "gpm": (_FLOW, GALLON_M3 / 60.0, 0.0),
    "gpd": (_FLOW, GALLON_M3 / 86400.0, 0.0),
    "MGD": (_FLOW, GALLON_M3 * 1e6 / 86400.0, 0.0),
    "cfs": (_FLOW, FT**3, 0.0),
    "ft3/min": (_FLOW, FT**3 / 60.0, 0.0),
    "L/s": (_FLOW, 1e-3, 0.0),
    "m3/h": (_FLOW, 1.0 / 3600.0, 0.0),
    "m3/s": (_FLOW, 1.0, 0.0),
    # volume (meters, derived totals)
    "ft3": (_L3, FT**3, 0.0),
    "gal": (_L3, FT**3 / GALLONS_PER_FT3, 0.0),
    "m3": (_L3, 1.0, 0.0),
    # length (levels, rain per interval, constants)
    "ft": (_L, FT, 0.0),
    "in": (_L, FT / 12.0, 0.0),
    "m": (_L, 1.0, 0.0),
    "mm": (_L, 1e-3, 0.0),
    # area and time (constants of derived sensors: a wet well's area)
    "ft2": (_L2, FT**2, 0.0),
    "m2": (_L2, 1.0, 0.0),
    "s": (dim(T=1), 1.0, 0.0),
    "min": (dim(T=1), 60.0, 0.0),
    "h": (dim(T=1), 3600.0, 0.0),
    # concentration in water: 1 ppm is taken as 1 mg/L (dilute, density 1 kg/L)
    "mg/L": (_CONC, 1e-3, 0.0),
    "ppm": (_CONC, 1e-3, 0.0),
    "µg/L": (_CONC, 1e-6, 0.0),
    "ug/L": (_CONC, 1e-6, 0.0),
    # mass loading (derived: concentration x flow)
    "lb/d": (_MASS_RATE, 0.45359237 / 86400.0, 0.0),
    "kg/d": (_MASS_RATE, 1.0 / 86400.0, 0.0),
    # temperature (absolute, kelvin)
    "degC": (dim(K=1), 1.0, 273.15),
    "degF": (dim(K=1), 5.0 / 9.0, 273.15 - 32.0 * 5.0 / 9.0),
    # each of these is its own dimension: nothing converts into them
    "pH": (dim(pH=1), 1.0, 0.0),
    "µS/cm": (dim(S=1, L=-1), 1e-4, 0.0),
    "uS/cm": (dim(S=1, L=-1), 1e-4, 0.0),
    "mS/cm": (dim(S=1, L=-1), 0.1, 0.0),
    "NTU": (dim(NTU=1), 1.0, 0.0),
    "%LEL": (dim(LEL=1), 1.0, 0.0),
    "%": (NONE, 0.01, 0.0),
    "Hz": (dim(T=-1), 1.0, 0.0),
    "rpm": (dim(T=-1), 1.0 / 60.0, 0.0),
    "A": (dim(A=1), 1.0, 0.0),
    "on/off": (NONE, 1.0, 0.0),
    "1": (NONE, 1.0, 0.0),
}
_FLOW_TO_M3S: dict[str, float] = {
    "gpm": 3.785411784e-3 / 60.0,
    "gpd": 3.785411784e-3 / 86400.0,
    "MGD": 3.785411784e-3 * 1e6 / 86400.0,
    "cfs": 0.028316846592,
    "L/s": 1e-3,
    "m3/h": 1.0 / 3600.0,
}
_VOLUME_TO_FT3: dict[str, float] = {"ft3": 1.0, "gal": 1.0 / GALLONS_PER_FT3, "m3": 35.31466672148859}
# A gas detector's ppm is parts per million by volume in air, not mg/L in water.
_GAS_PPM = "ppm"

UNITS: dict[Kind, tuple[str, ...]] = {
    Kind.FLOW: ("gpm", "gpd", "MGD", "cfs", "L/s", "m3/h"),
    Kind.PH: ("pH",),
    Kind.TEMPERATURE: ("degC", "degF"),
    Kind.CONCENTRATION: ("mg/L", "ppm", "µg/L", "ug/L"),
    Kind.METER: ("ft3", "gal", "m3"),
    Kind.LEVEL: ("ft", "in", "m"),
    Kind.PUMP: ("on/off",),
    Kind.STATUS: ("on/off",),
    Kind.RAIN: ("in", "mm"),
    Kind.CONDUCTIVITY: ("µS/cm", "uS/cm", "mS/cm"),
    Kind.TURBIDITY: ("NTU",),
    Kind.GAS: ("%LEL", "ppm"),
    Kind.SPEED: ("%", "Hz", "rpm"),
    Kind.CURRENT: ("A",),
    Kind.DERIVED: tuple(UNIT_TABLE),
}
DEFAULT_UNIT: dict[Kind, str] = {
    Kind.FLOW: "gpm",
    Kind.PH: "pH",
    Kind.TEMPERATURE: "degC",
    Kind.CONCENTRATION: "mg/L",
    Kind.METER: "ft3",
    Kind.LEVEL: "ft",
    Kind.PUMP: "on/off",
    Kind.STATUS: "on/off",
    Kind.RAIN: "in",
    Kind.CONDUCTIVITY: "µS/cm",
    Kind.TURBIDITY: "NTU",
    Kind.GAS: "%LEL",
    Kind.SPEED: "%",
    Kind.CURRENT: "A",
    Kind.DERIVED: "1",
}
# What a healthy instrument can report, in the kind's default unit. Values
# outside are bad data, never fed to a baseline or a limit rule. Finite, so every
# baseline has a largest value to count in (a station's `valid_range` narrows it).
PHYSICAL_RANGE: dict[Kind, tuple[float, float]] = {
    Kind.FLOW: (0.0, 1_000_000.0),  # gpm: 1,440 MGD, far beyond any lift station
    Kind.PH: (0.0, 14.0),
    Kind.TEMPERATURE: (-50.0, 150.0),
    Kind.CONCENTRATION: (0.0, 1_000_000.0),
    Kind.METER: (0.0, math.inf),
    Kind.LEVEL: (-100.0, 1000.0),  # ft against the wet well's datum; a sump may sit below it
    Kind.PUMP: (0.0, 1.0),
    Kind.STATUS: (0.0, 1.0),
    Kind.RAIN: (0.0, 20.0),  # in per interval; more is a stuck tipping bucket
    Kind.CONDUCTIVITY: (0.0, 200_000.0),
    Kind.TURBIDITY: (0.0, 10_000.0),
    Kind.GAS: (0.0, 100.0),
    Kind.SPEED: (0.0, 110.0),
    Kind.CURRENT: (0.0, 10_000.0),
    Kind.DERIVED: (-1e9, 1e9),  # see physical_range: from the kind its unit belongs to
}
# The kinds a derived sensor's unit is looked up in, for its range and ordinance defaults.
JUDGED_KINDS = (Kind.FLOW, Kind.CONCENTRATION, Kind.TEMPERATURE, Kind.PH, Kind.LEVEL)
# Where the kind's default unit does not convert to the sensor's (gas: %LEL vs ppm).
_UNIT_RANGE: dict[tuple[Kind, str], tuple[float, float]] = {
    (Kind.GAS, _GAS_PPM): (0.0, 1_000_000.0),
    (Kind.SPEED, "Hz"): (0.0, 400.0),
    (Kind.SPEED, "rpm"): (0.0, 20_000.0),
}


def physical_range(kind: Kind, unit: str) -> tuple[float, float]:
    """The kind's physical range in `unit` (bad data outside it); always finite, so each
    baseline row has a largest value to count in.

    A derived sensor takes the range of the kind its unit belongs to, both signs (a
    computed inflow may dip below zero for a moment), else ±1e9."""
    if kind is Kind.DERIVED:
        for judged in JUDGED_KINDS:
            if unit in UNITS[judged]:
                lo, hi = physical_range(judged, unit)
                bound = max(abs(lo), abs(hi))
                return -bound, bound
        return PHYSICAL_RANGE[Kind.DERIVED]
    if (kind, unit) in _UNIT_RANGE:
        return _UNIT_RANGE[(kind, unit)]
    lo, hi = PHYSICAL_RANGE[kind]
    try:
        return convert(lo, DEFAULT_UNIT[kind], unit), convert(hi, DEFAULT_UNIT[kind], unit)
    except ValueError:
        return PHYSICAL_RANGE[kind]


def dimension(unit: str, kind: Kind | None = None) -> tuple[Dim, float, float]:
    """(dimension, scale, offset) of a unit; a gas detector's ppm is its own dimension."""
    if kind is Kind.GAS and unit == _GAS_PPM:
        return dim(ppmv=1), 1.0, 0.0
    try:
        return UNIT_TABLE[unit]
    except KeyError:
        raise ValueError(f"unknown unit {unit!r}") from None


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert between two units of the same dimension; raises ValueError otherwise."""
    scale, offset = conversion(from_unit, to_unit)
    return value * scale + offset


def conversion(from_unit: str, to_unit: str) -> tuple[float, float]:
    """`(scale, offset)` so that `to = from * scale + offset`; vectorises with NumPy."""
    if from_unit == to_unit:
        return 1.0, 0.0
    if from_unit == "on/off" or to_unit == "on/off":
        raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}")
    # The figures billing and the ordinance limits were written against, kept exact.
    if from_unit in _FLOW_TO_M3S and to_unit in _FLOW_TO_M3S:
        return _FLOW_TO_M3S[from_unit] / _FLOW_TO_M3S[to_unit], 0.0
    if from_unit in _VOLUME_TO_FT3 and to_unit in _VOLUME_TO_FT3:
        return _VOLUME_TO_FT3[from_unit] / _VOLUME_TO_FT3[to_unit], 0.0
    if (from_unit, to_unit) == ("degF", "degC"):
        return 5.0 / 9.0, -32.0 * 5.0 / 9.0
    if (from_unit, to_unit) == ("degC", "degF"):
        return 9.0 / 5.0, 32.0
    try:
        d_from, s_from, o_from = UNIT_TABLE[from_unit]
        d_to, s_to, o_to = UNIT_TABLE[to_unit]
    except KeyError:
        raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}") from None
    if d_from != d_to:
        raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}")
    return s_from / s_to, (o_from - o_to) / s_to
