"""Units per sensor kind, conversions between them, and physically possible ranges.

Lives beside `model` (not under `engine/`) because config validation needs the
unit table too, and the base layer may not import the engine.
"""

from __future__ import annotations

import math

from monitor.model import Kind

# Factor to the kind's canonical unit (flow: m3/s, meter volume: ft3).
_FLOW_TO_M3S: dict[str, float] = {
    "gpm": 3.785411784e-3 / 60.0,
    "gpd": 3.785411784e-3 / 86400.0,
    "cfs": 0.028316846592,
    "L/s": 1e-3,
    "m3/h": 1.0 / 3600.0,
}
GALLONS_PER_FT3 = 7.480519480519481  # 1728 in3 / 231 in3
_VOLUME_TO_FT3: dict[str, float] = {
    "ft3": 1.0,
    "gal": 1.0 / GALLONS_PER_FT3,
    "m3": 35.31466672148859,
}
_TEMPERATURE = ("degC", "degF")

UNITS: dict[Kind, tuple[str, ...]] = {
    Kind.FLOW: tuple(_FLOW_TO_M3S),
    Kind.PH: ("pH",),
    Kind.TEMPERATURE: _TEMPERATURE,
    Kind.CONCENTRATION: ("mg/L",),
    Kind.METER: tuple(_VOLUME_TO_FT3),
}
DEFAULT_UNIT: dict[Kind, str] = {
    Kind.FLOW: "gpm",
    Kind.PH: "pH",
    Kind.TEMPERATURE: "degC",
    Kind.CONCENTRATION: "mg/L",
    Kind.METER: "ft3",
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
}


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert between two units of the same dimension; raises ValueError otherwise."""
    scale, offset = conversion(from_unit, to_unit)
    return value * scale + offset


def conversion(from_unit: str, to_unit: str) -> tuple[float, float]:
    """`(scale, offset)` so that `to = from * scale + offset`; vectorises with NumPy."""
    if from_unit == to_unit:
        return 1.0, 0.0
    if from_unit in _FLOW_TO_M3S and to_unit in _FLOW_TO_M3S:
        return _FLOW_TO_M3S[from_unit] / _FLOW_TO_M3S[to_unit], 0.0
    if from_unit in _VOLUME_TO_FT3 and to_unit in _VOLUME_TO_FT3:
        return _VOLUME_TO_FT3[from_unit] / _VOLUME_TO_FT3[to_unit], 0.0
    if (from_unit, to_unit) == ("degF", "degC"):
        return 5.0 / 9.0, -32.0 * 5.0 / 9.0
    if (from_unit, to_unit) == ("degC", "degF"):
        return 9.0 / 5.0, 32.0
    raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}")
