"""What the engine remembers per sensor, and what it reports: counters, status, replay results."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from monitor.config import SensorRules
from monitor.engine.arrival import DeviceWatch
from monitor.engine.columns import ConditionColumns
from monitor.engine.frozen import FrozenState
from monitor.engine.rules import NAN, LimitState
from monitor.engine.slug import SlugState
from monitor.model import Condition, Kind, Quality, Rule

# The largest FLOAT32, the value many PLCs send as an error code; it and beyond
# (FLOAT64 max, infinities) are never a reading. NaN fails every comparison.
FLOAT32_MAX = 3.4028234663852886e38
BELOW_FLOAT32_MAX = float(np.nextafter(FLOAT32_MAX, 0.0))


@dataclass
class Counters:
    """What the engine took in and turned away, for metrics and the replay report."""

    samples: int = 0  # samples accepted (any quality)
    unknown_sensor: int = 0  # samples for a sensor the config does not know
    out_of_order: int = 0  # samples not later than the sensor's previous one
    bad_values: int = 0  # values rejected as not believable (NaN, inf, out of range)
    not_good: int = 0  # samples that arrived with a quality other than GOOD
    conditions: int = 0
    bad_by_sensor: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SensorStatus:
    """One sensor as the console shows it."""

    sensor: str
    kind: Kind
    unit: str
    time: float | None
    value: float | None
    quality: Quality | None
    baseline_mean: float | None
    warming_up: bool
    active: tuple[Rule, ...]
    # Past warm-up but the baseline is below the slug rule's `min_baseline`: no slug is judged.
    slug_not_judged: bool = False


def slug_status(status: SensorStatus, rules: SensorRules) -> str:
    """The slug rule's state as the console shows it: "" (no rule), warming_up,
    not_judged (baseline below `slug.min_baseline`) or judged."""
    if rules.slug is None:
        return ""
    if status.warming_up:
        return "warming_up"
    return "not_judged" if status.slug_not_judged else "judged"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Per input sample: its quality after validation and whether it was accepted
    (not out of order, known sensor); plus the conditions in time order."""

    quality: npt.NDArray[np.int8]
    accepted: npt.NDArray[np.bool_]
    columns: ConditionColumns  # `conditions` as objects, built when asked
    # Per sensor index: the accepted samples (batch indices, times, values) in time order,
    # None for a sensor with none; the split the engine made anyway, for the incident
    # tracker (so it does not sort the batch by sensor again).
    by_sensor: list[Admitted | None] | None = None

    @property
    def conditions(self) -> list[Condition]:
        return self.columns.conditions()


Admitted = tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.float64]]


class SensorState:
    """Everything the engine remembers about one sensor between samples."""

    __slots__ = (
        "bad_active",
        "bad_episode",
        "bad_since",
        "bad_values",
        "device",
        "fresh",
        "frozen",
        "hi",
        "index",
        "judged",
        "last_good",
        "last_time",
        "limits",
        "lo",
        "ooo_episode",
        "quality",
        "row",
        "rules",
        "sensor",
        "slug",
        "stale_active",
        "stale_after",
        "value",
    )

    def __init__(self, index: int, rules: SensorRules, row: int) -> None:
        self.index = index
        self.sensor = rules.sensor
        self.rules = rules
        self.judged = rules.kind is not Kind.METER
        self.row = row
        # Clamped inside FLOAT32's largest, so one comparison pair also refuses the extremes.
        self.lo = max(rules.valid_range[0], -BELOW_FLOAT32_MAX)
        self.hi = min(rules.valid_range[1], BELOW_FLOAT32_MAX)
        self.bad_values = frozenset(rules.bad_values)
        self.stale_after = rules.stale_after
        lim = rules.limits if self.judged else None
        self.limits: list[LimitState] = []
        if lim is not None:
            if lim.high is not None:
                self.limits.append(LimitState(rules.sensor, lim, rules.unit, high=True))
            if lim.low is not None:
                self.limits.append(LimitState(rules.sensor, lim, rules.unit, high=False))
        self.slug = SlugState(rules.sensor, rules.slug, rules.unit) if self.judged and rules.slug else None
        after = rules.frozen_after
        self.frozen = FrozenState(rules, after) if self.judged and after is not None else None
        self.last_time = -math.inf
        self.value = NAN
        self.quality: Quality | None = None
        self.fresh = NAN  # time of the last good sample (or when the watch started)
        # Stamped by its device's clock (`Engine.stamped_by_device`): `fresh` is then the
        # gateway clock's time the last good reading was taken (monitor/engine/arrival.py),
        # never the device's stamp.
        self.device: DeviceWatch | None = None
        self.stale_active = False
        self.last_good = NAN
        self.bad_episode = False
        self.ooo_episode = False
        self.bad_since = NAN  # first of the current run of bad values (BAD_DATA)
        self.bad_active = False  # the diagnostic bad-value condition

    def believable(self, v: float) -> bool:
        """Finite, inside the plausible range, and not one of the device's error values."""
        return self.lo <= v <= self.hi and not (self.bad_values and v in self.bad_values)
