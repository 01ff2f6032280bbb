"""The slug rule (§139-11 SLUG, §139-15 D(8)) on top of a sensor's rolling baseline.

A sample is *over* when its value is more than `factor` x the window mean of the
whole buckets before it (the mean in force is taken when a bucket starts).

"During normal operation", exactly: the samples of an over run wait. When the run
lasts longer than `duration` it *qualifies* and its samples stay out of the
baseline for good, so a long slug cannot raise its own threshold; when it ends
short (a not-over sample, or a gap of more than `max_sample_gap`) its samples enter their
buckets late, as the normal operation they were (a 10-minute pump run at full rate
is normal operation and counts towards the 24 h average).

Two methods (`method`):

- `sustained` (default): active at the first over sample that ends a continuous
  over run longer than `duration`; clears at the first good sample not over.
- `period_mean`: active at the first sample where the mean of the samples of the
  trailing `duration` (a continuous history at least that long) is over the
  threshold; clears at the first sample where that trailing mean is back at or
  under it. Individual over samples wait as above; the ones waiting when it
  fires, and every over sample while it is active, stay out of the baseline.

No judging against nothing: while the mean in force is below `min_baseline` (or
there is none) the rule does not judge: nothing is over, every sample enters the
baseline, and `not_judged` says so (console, health, /metrics).

Warm-up: for the first `warmup` of a sensor's history nothing is over and every
good sample enters the baseline. A gap longer than the window starts the warm-up
again. When the window holds no normal sample at all, the last mean is carried.

The replay form, a whole batch at once with the same result, is `slug_replay.batch`.
"""

from __future__ import annotations

import math
from collections import deque

from monitor.config import SlugRule
from monitor.engine.baseline import Baselines
from monitor.engine.rules import NAN, duration_text
from monitor.model import Condition, ConditionState, Rule, amount, new_condition


class SlugState:
    """Slug timers of one sensor; its baseline lives in a `Baselines` row."""

    __slots__ = (
        "active",
        "citation",
        "duration",
        "factor",
        "last_mean",
        "max_gap",
        "method",
        "min_baseline",
        "pending",
        "period",
        "period_sum",
        "periodic",
        "prev_t",
        "run_start",
        "sensor",
        "unit",
        "warm_since",
        "warmup",
        "window",
    )

    def __init__(self, sensor: str, rule: SlugRule, unit: str = "") -> None:
        self.sensor = sensor
        self.unit = unit
        self.factor = rule.factor
        self.duration = rule.duration
        self.window = rule.window
        self.max_gap = rule.max_sample_gap
        self.warmup = rule.warmup
        self.citation = rule.citation
        self.method = rule.method
        self.periodic = rule.method == "period_mean"
        self.min_baseline = rule.min_baseline
        self.active = False
        self.run_start = NAN  # start of the current continuous over run
        self.prev_t = NAN  # time of the previous good sample
        self.warm_since = NAN  # start of the sensor's current history
        self.last_mean = NAN  # the window mean last in force
        # Samples of an over run that has not qualified yet: bucket -> [quanta, count].
        self.pending: dict[int, list[int]] = {}
        # period_mean: the trailing `duration` of samples (time, quanta) and their sum.
        self.period: deque[tuple[float, int]] = deque()
        self.period_sum = 0

    def warming_up(self, now: float) -> bool:
        return math.isnan(self.warm_since) or now - self.warm_since < self.warmup

    def not_judged(self) -> bool:
        """Past warm-up, but the mean in force is below `min_baseline` (or none)."""
        return not self.warming_up(self.prev_t) and not self.last_mean >= self.min_baseline

    def threshold(self) -> float:
        return self.factor * self.last_mean

    def condition(self, t: float, value: float, limit: float, state: ConditionState) -> Condition:
        avg = f"{self.factor:g}x the {duration_text(self.window)} average (limit {amount(limit, self.unit)})"
        if self.method == "period_mean":
            what = f"mean of the last {duration_text(self.duration)} {amount(value, self.unit)}"
            if state is ConditionState.ACTIVE:
                text = f"{what} more than {avg} (method period_mean)"
            else:
                text = f"{what} back within {avg} (method period_mean)"
        elif state is ConditionState.ACTIVE:
            text = (
                f"{amount(value, self.unit)} more than {avg} for longer than {duration_text(self.duration)}"
                " (method sustained)"
            )
        else:
            text = f"{amount(value, self.unit)} back within {avg} (method sustained)"
        return new_condition(t, self.sensor, Rule.SLUG, state, value, limit, self.citation, text)


def _release(slug: SlugState, base: Baselines, row: int) -> None:
    """A short over run ended: its samples enter their buckets, as normal operation."""
    for k, (q, c) in slug.pending.items():
        base.add_to(row, k, q, c)
    slug.pending.clear()


def step(slug: SlugState | None, base: Baselines, row: int, t: float, v: float) -> Condition | None:
    """Feed one good sample to the baseline and, with a slug rule, judge it."""
    k = math.floor(t / base.width[row])
    if k != base.bucket[row]:
        base.roll(row, k)
        if slug is not None and base.win_count[row] > 0:
            slug.last_mean = float(base.win_sum[row]) / base.win_count[row] * base.quantum[row]
    q = round(v / base.quantum[row])  # `Baselines.quantize`, inlined on the hot path
    if slug is None:
        base.cur_sum[row] += q
        base.cur_count[row] += 1
        return None
    prev = slug.prev_t
    slug.prev_t = t
    first = math.isnan(prev)  # the sensor's first sample
    if first or t - prev > slug.window:
        slug.warm_since = t
    judged = not t - slug.warm_since < slug.warmup and slug.last_mean >= slug.min_baseline
    thr = slug.factor * slug.last_mean
    if slug.periodic:
        gap = first or t - prev > slug.max_gap
        return _period_step(slug, base, row, t, v, k, q, gap, judged, thr)
    if judged and v > thr:
        if first or t - prev > slug.max_gap or math.isnan(slug.run_start):
            _release(slug, base, row)
            slug.run_start = t
        if slug.active:
            return None
        if t - slug.run_start > slug.duration:
            slug.active = True
            slug.pending.clear()  # the run qualified: its samples stay out
            return slug.condition(t, v, thr, ConditionState.ACTIVE)
        entry = slug.pending.setdefault(k, [0, 0])
        entry[0] += q
        entry[1] += 1
        return None
    if slug.pending:
        _release(slug, base, row)
    base.cur_sum[row] += q
    base.cur_count[row] += 1
    slug.run_start = NAN
    if slug.active:
        slug.active = False
        return slug.condition(t, v, thr, ConditionState.CLEARED)
    return None


def _period_step(
    slug: SlugState,
    base: Baselines,
    row: int,
    t: float,
    v: float,
    k: int,
    q: int,
    gap: bool,
    judged: bool,
    thr: float,
) -> Condition | None:
    """`period_mean`: the trailing mean of the last `duration` against the threshold."""
    period = slug.period
    if gap:
        period.clear()
        slug.period_sum = 0
    period.append((t, q))
    slug.period_sum += q
    covered = period[0][0] <= t - slug.duration
    while len(period) > 1 and period[1][0] <= t - slug.duration:
        slug.period_sum -= period.popleft()[1]
    mean = float(slug.period_sum) * base.quantum[row] / len(period)
    over = judged and v > thr
    if over:
        if gap or math.isnan(slug.run_start):
            _release(slug, base, row)
            slug.run_start = t
        if not slug.active:
            entry = slug.pending.setdefault(k, [0, 0])
            entry[0] += q
            entry[1] += 1
    else:
        _release(slug, base, row)
        base.cur_sum[row] += q
        base.cur_count[row] += 1
        slug.run_start = NAN
    if not slug.active and judged and covered and mean > thr:
        slug.active = True
        slug.pending.clear()  # the period's waiting samples stay out
        return slug.condition(t, mean, thr, ConditionState.ACTIVE)
    if slug.active and not (judged and mean > thr):
        slug.active = False
        return slug.condition(t, mean, thr, ConditionState.CLEARED)
    return None
