"""The slug rule (§139-11 SLUG, §139-15 D(8)) on top of a sensor's rolling baseline.

A sample is *over* when its value is more than `factor` x the window mean of the
whole buckets before it (the mean in force is taken when a bucket starts).

"During normal operation", exactly: the samples of an over run wait. When the run
lasts longer than `duration` it *qualifies* and its samples stay out of the
baseline for good, so a long slug cannot raise its own threshold; when it ends
short (a not-over sample, or a gap of more than `max_gap`) its samples enter their
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

The replay form (`batch`) decides over/not-over for a batch in rounds (assume none
is over, compute thresholds, mark, exclude, repeat: each round settles at least
one more bucket). That is exact as long as no over run ends short inside the
batch; at the first one that does, the batch is cut: the part before it is
committed, the short run is stepped through one sample at a time (`step`), and
the rest is tried again. `period_mean` is always stepped.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import numpy.typing as npt

from monitor.config import SlugRule
from monitor.engine.baseline import Baselines, BatchWindow, Floats, Ints
from monitor.engine.rules import NAN, amount, duration_text, ffill_index, hysteresis
from monitor.model import Condition, ConditionState, Rule

MAX_ROUNDS = 40
FIRST_RETRY = 4096  # samples tried at once after a short run was stepped through
MAX_STEPPED = 2048  # samples stepped at most after a short run before trying a batch again


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
        self.max_gap = rule.max_gap
        self.warmup = rule.warmup
        self.citation = rule.citation
        self.method = rule.method
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
        return Condition(t, self.sensor, Rule.SLUG, state, value, limit, self.citation, message=text)


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
            slug.last_mean = base.window(row)[0] / base.win_count[row]
    q = round(v / base.quantum[row])  # `Baselines.quantize`, inlined on the hot path
    if slug is None:
        base.cur_sum[row] += q
        base.cur_count[row] += 1
        return None
    prev = slug.prev_t
    slug.prev_t = t
    if math.isnan(prev) or t - prev > slug.window:
        slug.warm_since = t
    gap = math.isnan(prev) or t - prev > slug.max_gap
    judged = not t - slug.warm_since < slug.warmup and slug.last_mean >= slug.min_baseline
    thr = slug.factor * slug.last_mean
    if slug.method == "period_mean":
        return _period_step(slug, base, row, t, v, k, q, gap, judged, thr)
    if judged and v > thr:
        if gap or math.isnan(slug.run_start):
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


def batch(slug: SlugState | None, base: Baselines, row: int, t: Floats, v: Floats) -> list[Condition]:
    """Feed a batch of good samples; the same result as `step` over each."""
    if not t.size:
        return []
    if slug is None:
        win = base.batch(row, t)
        cs, cc = win.prefix(win.quantize(v), None)
        win.commit(cs, cc)
        return []
    if slug.method != "sustained":
        return _stepped(slug, base, row, t, v)
    out: list[Condition] = []
    p, n = 0, int(t.size)
    chunk = n
    while p < n:
        end = min(n, p + chunk)
        conds, short = _attempt(slug, base, row, t[p:end], v[p:end])
        out.extend(conds)
        if short is None:
            p = end
            chunk *= 2
            continue
        r, e = short
        stop = min(n, p + e + 2)  # the short run and the sample that ended it
        out.extend(_stepped(slug, base, row, t[p + r : stop], v[p + r : stop]))
        p = _step_until_quiet(slug, base, row, t, v, stop, out)
        chunk = FIRST_RETRY
    return out


def _step_until_quiet(
    slug: SlugState, base: Baselines, row: int, t: Floats, v: Floats, p: int, out: list[Condition]
) -> int:
    """After a short run, go on one sample at a time while the level hovers around the
    threshold (short runs come in clusters), until a new bucket starts with no run
    open, or `MAX_STEPPED` samples; returns where the vectorised path resumes."""
    width = base.width[row]
    quiet_k: int | None = None
    end = min(int(t.size), p + MAX_STEPPED)
    times, values = t[p:end].tolist(), v[p:end].tolist()
    for ti, vi in zip(times, values, strict=True):
        k = math.floor(ti / width)
        if quiet_k is not None and k > quiet_k:
            return p
        cond = step(slug, base, row, ti, vi)
        if cond is not None:
            out.append(cond)
        p += 1
        if math.isnan(slug.run_start) and not slug.active:
            if quiet_k is None:
                quiet_k = k
        else:
            quiet_k = None
    return p


def _stepped(slug: SlugState, base: Baselines, row: int, t: Floats, v: Floats) -> list[Condition]:
    out: list[Condition] = []
    for ti, vi in zip(t.tolist(), v.tolist(), strict=True):
        cond = step(slug, base, row, ti, vi)
        if cond is not None:
            out.append(cond)
    return out


def _attempt(
    slug: SlugState, base: Baselines, row: int, t: Floats, v: Floats
) -> tuple[list[Condition], tuple[int, int] | None]:
    """Judge and commit a batch in rounds. When an over run ends short inside it, only
    the part before that run is committed, and (its first index, the index of its last
    sample) comes back with that part's conditions."""
    win = base.batch(row, t)
    qv = win.quantize(v)
    prev = np.concatenate(([slug.prev_t], t[:-1]))
    first = np.isnan(prev)
    restart = first | (t - prev > slug.window)
    last = ffill_index(restart)
    warm_since = np.where(last >= 0, t[np.maximum(last, 0)], slug.warm_since)
    warm = ~(t - warm_since < slug.warmup)
    gap = first | (t - prev > slug.max_gap)

    # The mean in force for the state's current bucket was taken when it started
    # (samples of a short run that entered since count from the next bucket on).
    carry_first = win.m0 == int(win.buckets[0])
    over: npt.NDArray[np.bool_] = np.zeros(t.size, dtype=bool)
    for _ in range(MAX_ROUNDS):
        cs, cc = win.prefix(qv, None if not over.any() else ~over)
        mean, count = win.means(cs, cc)
        if carry_first:
            mean[0], count[0] = slug.last_mean, 1
        have = ffill_index(count > 0)
        mean = np.where(have >= 0, mean[np.maximum(have, 0)], slug.last_mean)
        m = win.expand(mean)
        thr = slug.factor * m
        now_over = warm & (m >= slug.min_baseline) & (v > thr)
        if np.array_equal(now_over, over):
            break
        over = now_over
    else:
        return _stepped(slug, base, row, t, v), None

    run_start = _over_run_starts(t, over, gap, slug)
    qualified = over & (t - run_start > slug.duration)
    short = _first_short_run(over, gap, qualified, slug)
    if short is not None:
        r = short[0]
        if r == 0:
            return [], short
        # Everything before the short run was decided right: commit that part.
        win = base.batch(row, t[:r])
        t, v, qv, over, qualified = t[:r], v[:r], qv[:r], over[:r], qualified[:r]
        thr, m, run_start, warm_since = thr[:r], m[:r], run_start[:r], warm_since[:r]
        cs, cc = cs[: r + 1], cc[: r + 1]
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
    _keep_pending(slug, win, qv, over, state, run_start)
    win.commit(cs, cc)
    slug.active = bool(state[-1])
    slug.run_start = float(run_start[-1]) if over[-1] else NAN
    slug.prev_t = float(t[-1])
    slug.warm_since = float(warm_since[-1])
    slug.last_mean = float(m[-1])
    return conds, short


def _first_short_run(
    over: npt.NDArray[np.bool_],
    gap: npt.NDArray[np.bool_],
    qualified: npt.NDArray[np.bool_],
    slug: SlugState,
) -> tuple[int, int] | None:
    """(first index, last index) of the first over run that ends inside the batch
    without qualifying (its samples would enter the baseline late), or None."""
    carried = not math.isnan(slug.run_start)
    prev_over = np.concatenate(([carried], over[:-1]))
    starts = over & (gap | ~prev_over)
    # A run ends after sample i when i is over and the next is not over or starts a run.
    nxt_cont = np.concatenate((over[1:] & ~starts[1:], [True]))
    ends = np.flatnonzero(over & ~nxt_cont)
    ends = ends[ends < over.size - 1]
    # A carried run that is not continued at all ends before the first sample.
    if carried and not slug.active and slug.pending and not (over[0] and not starts[0]):
        return (0, -1)
    if not ends.size:
        return None
    run_id = np.cumsum(starts)
    q_runs = np.unique(run_id[qualified])
    for e in ends.tolist():
        rid = int(run_id[e])
        if rid == 0:  # the carried run
            if slug.active or (q_runs.size and q_runs[0] == 0):
                continue
            if not slug.pending:
                continue
            return (0, e)
        if rid in q_runs:
            continue
        return (int(np.flatnonzero(run_id == rid)[0]), e)
    return None


def _keep_pending(
    slug: SlugState,
    win: BatchWindow,
    qv: Ints,
    over: npt.NDArray[np.bool_],
    state: npt.NDArray[np.bool_],
    run_start: Floats,
) -> None:
    """After a committed batch: the samples of an open run that has not qualified wait."""
    if not over[-1] or state[-1]:
        slug.pending.clear()
        return
    carried = not math.isnan(slug.run_start) and bool(run_start[-1] == slug.run_start)
    if not carried:
        slug.pending.clear()
    i = int(over.size)
    while i > 0 and over[i - 1] and run_start[i - 1] == run_start[-1]:
        i -= 1
    for k, q in zip(win.k[i:].tolist(), qv[i:].tolist(), strict=True):
        entry = slug.pending.setdefault(k, [0, 0])
        entry[0] += q
        entry[1] += 1


def _over_run_starts(
    t: Floats, over: npt.NDArray[np.bool_], gap: npt.NDArray[np.bool_], slug: SlugState
) -> Floats:
    """Start of each over sample's continuous run: a run starts at an over sample
    after a not-over sample or after a gap longer than `max_gap`."""
    prev_over = np.concatenate(([not math.isnan(slug.run_start)], over[:-1]))
    last = ffill_index(over & (gap | ~prev_over))
    return np.where(last >= 0, t[np.maximum(last, 0)], slug.run_start)
