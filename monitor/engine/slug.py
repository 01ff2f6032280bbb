"""The slug rule (§139-11 SLUG, §139-15 D(8)) on top of a sensor's rolling baseline.

A sample is *over* when its value is more than `factor` x the window mean of the
whole buckets before it. Over samples stay out of the baseline ("during normal
operation"), so a long slug cannot raise its own threshold. The condition becomes
active at the first over sample that ends a continuous over run longer than
`duration`, and clears at the first good sample that is not over. A gap of more
than `max_sample_gap` between good samples restarts the run (an active slug stays active
across a gap while the samples stay over).

Warm-up: for the first `warmup` of a sensor's history nothing is over and every
good sample enters the baseline, so the baseline learns a full day's pattern
before it judges. A gap longer than the window starts the warm-up again. When the
window holds no normal sample at all (a slug longer than the window), the last
mean in force is carried.

The replay form decides over/not-over for a whole batch in rounds: assume no
sample is over, compute every sample's threshold, mark the over ones, exclude them,
and repeat until nothing changes. Each round settles at least one more bucket
(a sample's threshold depends only on earlier buckets), so the rounds converge to
exactly what the live path computes; a batch that needs too many rounds is judged
one sample at a time instead.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from monitor.config import SlugRule
from monitor.engine.baseline import Baselines, Floats
from monitor.engine.rules import NAN, amount, duration_text, ffill_index, hysteresis
from monitor.model import Condition, ConditionState, Rule

MAX_ROUNDS = 40


class SlugState:
    """Slug timers of one sensor; its baseline lives in a `Baselines` row."""

    __slots__ = (
        "active",
        "citation",
        "duration",
        "factor",
        "last_mean",
        "max_gap",
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
        self.active = False
        self.run_start = NAN  # start of the current continuous over run
        self.prev_t = NAN  # time of the previous good sample
        self.warm_since = NAN  # start of the sensor's current history
        self.last_mean = NAN  # the window mean last in force

    def warming_up(self, now: float) -> bool:
        return math.isnan(self.warm_since) or now - self.warm_since < self.warmup

    def threshold(self) -> float:
        return self.factor * self.last_mean

    def condition(self, t: float, value: float, limit: float, state: ConditionState) -> Condition:
        avg = f"{self.factor:g}x the {duration_text(self.window)} average (limit {amount(limit, self.unit)})"
        if state is ConditionState.ACTIVE:
            text = (
                f"{amount(value, self.unit)} more than {avg} for longer than {duration_text(self.duration)}"
            )
        else:
            text = f"{amount(value, self.unit)} back within {avg}"
        return Condition(t, self.sensor, Rule.SLUG, state, value, limit, self.citation, message=text)


def step(slug: SlugState | None, base: Baselines, row: int, t: float, v: float) -> Condition | None:
    """Feed one good sample to the baseline and, with a slug rule, judge it."""
    k = math.floor(t / base.width[row])
    if k != base.bucket[row]:
        base.roll(row, k)
        if slug is not None:
            s, c = base.window(row)
            if c > 0:
                slug.last_mean = s / c
    if slug is None:
        base.total[row] += v
        base.n_total[row] += 1
        return None
    prev = slug.prev_t
    slug.prev_t = t
    if math.isnan(prev) or t - prev > slug.window:
        slug.warm_since = t
    warming = t - slug.warm_since < slug.warmup
    thr = slug.factor * slug.last_mean
    if not warming and v > thr:
        if math.isnan(prev) or t - prev > slug.max_gap or math.isnan(slug.run_start):
            slug.run_start = t
        if not slug.active and t - slug.run_start > slug.duration:
            slug.active = True
            return slug.condition(t, v, thr, ConditionState.ACTIVE)
        return None
    base.total[row] += v
    base.n_total[row] += 1
    slug.run_start = NAN
    if slug.active:
        slug.active = False
        return slug.condition(t, v, thr, ConditionState.CLEARED)
    return None


def batch(slug: SlugState | None, base: Baselines, row: int, t: Floats, v: Floats) -> list[Condition]:
    """Feed a batch of good samples; the same result as `step` over each."""
    if not t.size:
        return []
    win = base.batch(row, t)
    if slug is None:
        cs, cc = win.prefix(v, None)
        win.commit(cs, cc)
        return []
    prev = np.concatenate(([slug.prev_t], t[:-1]))
    first = np.isnan(prev)
    restart = first | (t - prev > slug.window)
    last = ffill_index(restart)
    warm_since = np.where(last >= 0, t[np.maximum(last, 0)], slug.warm_since)
    judged = ~(t - warm_since < slug.warmup)
    gap = first | (t - prev > slug.max_gap)

    over: npt.NDArray[np.bool_] = np.zeros(t.size, dtype=bool)
    for _ in range(MAX_ROUNDS):
        cs, cc = win.prefix(v, None if not over.any() else ~over)
        mean, count = win.means(cs, cc)
        have = ffill_index(count > 0)
        mean = np.where(have >= 0, mean[np.maximum(have, 0)], slug.last_mean)
        thr = win.expand(slug.factor * mean)
        now_over = judged & (v > thr)
        if np.array_equal(now_over, over):
            break
        over = now_over
    else:
        out: list[Condition] = []
        for ti, vi in zip(t.tolist(), v.tolist(), strict=True):
            cond = step(slug, base, row, ti, vi)
            if cond is not None:
                out.append(cond)
        return out

    run_start = _over_run_starts(t, over, gap, slug)
    qualified = over & (t - run_start > slug.duration)
    state = hysteresis(qualified, ~over, slug.active)
    before = np.concatenate(([slug.active], state[:-1]))
    conds = [
        slug.condition(
            float(t[i]),
            float(v[i]),
            float(thr[i]),
            ConditionState.ACTIVE if state[i] else ConditionState.CLEARED,
        )
        for i in np.flatnonzero(state != before)
    ]
    win.commit(cs, cc)
    slug.active = bool(state[-1])
    slug.run_start = float(run_start[-1]) if over[-1] else NAN
    slug.prev_t = float(t[-1])
    slug.warm_since = float(warm_since[-1])
    slug.last_mean = float(mean[-1])
    return conds


def _over_run_starts(
    t: Floats, over: npt.NDArray[np.bool_], gap: npt.NDArray[np.bool_], slug: SlugState
) -> Floats:
    """Start of each over sample's continuous run: a run starts at an over sample
    after a not-over sample or after a gap longer than `max_gap`."""
    prev_over = np.concatenate(([not math.isnan(slug.run_start)], over[:-1]))
    last = ffill_index(over & (gap | ~prev_over))
    return np.where(last >= 0, t[np.maximum(last, 0)], slug.run_start)
