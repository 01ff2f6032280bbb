"""The slug rule's replay form: a batch of one sensor's good samples at once, with the
same result as `slug.step` over each (checked with hypothesis).

Over/not-over is decided for the batch in rounds (assume none is over, compute
thresholds, mark, exclude, repeat: each round settles at least one more bucket). That
is exact as long as no over run ends short inside the batch; at the first one that
does, the part before it is committed from the same rounds, the short run is stepped
through one sample at a time, and so is what follows while the level hovers at the
threshold; then the rest is tried as a batch again. `period_mean` is always stepped.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from monitor.engine.baseline import MAX_BATCH, Baselines, BatchWindow, Floats, Ints
from monitor.engine.rules import NAN, ffill_index, hysteresis
from monitor.engine.slug import SlugState, step
from monitor.model import Condition, ConditionState

MAX_ROUNDS = 40
FIRST_RETRY = 4096  # samples tried at once after a short run was stepped through
MAX_STEPPED = 2048  # samples stepped at most after a short run before trying a batch again
QUIET_BUCKETS = 10  # whole buckets with no over run before a batch is tried again


def batch(slug: SlugState | None, base: Baselines, row: int, t: Floats, v: Floats) -> list[Condition]:
    """Feed a batch of good samples; the same result as `step` over each."""
    if not t.size:
        return []
    if slug is None:
        base.absorb(row, t, v)
        return []
    if slug.method != "sustained":
        return _stepped(slug, base, row, t, v)
    out: list[Condition] = []
    p, n = 0, int(t.size)
    chunk = min(n, MAX_BATCH)
    last_short = 0  # where the previous short run was: clusters far apart get big batches
    while p < n:
        end = min(n, p + chunk)
        conds, short = _attempt(slug, base, row, t[p:end], v[p:end])
        out.extend(conds)
        if short is None:
            p = end
            chunk = min(2 * chunk, MAX_BATCH)
            continue
        r, e = short
        stop = min(n, p + e + 2)  # the short run and the sample that ended it
        out.extend(_stepped(slug, base, row, t[p + r : stop], v[p + r : stop]))
        p = _step_until_quiet(slug, base, row, t, v, stop, out)
        chunk = min(MAX_BATCH, max(FIRST_RETRY, 2 * (p - last_short)))
        last_short = p
    return out


def _step_until_quiet(
    slug: SlugState, base: Baselines, row: int, t: Floats, v: Floats, p: int, out: list[Condition]
) -> int:
    """After a short run, go on one sample at a time while the level hovers around the
    threshold (short runs come in clusters), until `QUIET_BUCKETS` whole buckets pass
    with no run open, or `MAX_STEPPED` samples; returns where the batch path resumes."""
    width = base.width[row]
    quiet_k: int | None = None
    end = min(int(t.size), p + MAX_STEPPED)
    times, values = t[p:end].tolist(), v[p:end].tolist()
    for ti, vi in zip(times, values, strict=True):
        k = math.floor(ti / width)
        if quiet_k is not None and k > quiet_k + QUIET_BUCKETS:
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
    # Each sample's step from the one before (NaN for the first sample ever: a restart).
    first = math.isnan(slug.prev_t)
    step = np.empty(t.size)
    step[0] = t[0] - slug.prev_t
    np.subtract(t[1:], t[:-1], out=step[1:])
    restart = step > slug.window
    restart[0] |= first
    warm_since: Floats
    warm: npt.NDArray[np.bool_] | None  # None: every sample is warm
    if restart.any():
        last = ffill_index(restart)
        warm_since = np.where(last >= 0, t[np.maximum(last, 0)], slug.warm_since)
        warm = ~(t - warm_since < slug.warmup)
    else:  # no restart in the batch (most): warm-up counts from the state's start
        warm_since = np.full(1, slug.warm_since)  # only its last is read below
        # `t - since` rises with t: warm from the first sample on, warm throughout.
        warm = ~(t - slug.warm_since < slug.warmup) if t[0] - slug.warm_since < slug.warmup else None
    # Nothing to carry on (most batches): a first round that finds no sample over ends the
    # batch, and it can tell from each bucket's largest value against its threshold.
    may_be_quiet = warm is None and not slug.active and math.isnan(slug.run_start)

    # The mean in force for the state's current bucket was taken when it started
    # (samples of a short run that entered since count from the next bucket on).
    carry_first = win.m0 == int(win.buckets[0])
    over: npt.NDArray[np.bool_] = np.zeros(t.size, dtype=bool)
    for _ in range(MAX_ROUNDS):
        cs, cc = win.prefix(qv, None if not over.any() else ~over)
        mean, count = win.means(cs, cc)
        if carry_first:
            mean[0], count[0] = slug.last_mean, 1
        have_count = count > 0
        if not have_count.all():  # an empty window: the last mean before it holds
            have = ffill_index(have_count)
            mean = np.where(have >= 0, mean[np.maximum(have, 0)], slug.last_mean)
        if may_be_quiet:
            may_be_quiet = False
            # Good values are never NaN: a bucket's largest is over exactly when one is.
            peak = np.maximum.reduceat(v, win.j_now)
            if not ((mean >= slug.min_baseline) & (peak > slug.factor * mean)).any():
                _settle_quiet(slug, win, cs, cc, t, warm_since, mean)
                return [], None
        m = win.expand(mean)
        thr = slug.factor * m
        now_over = (m >= slug.min_baseline) & (v > thr)
        if warm is not None:
            now_over &= warm
        if np.array_equal(now_over, over):
            break
        over = now_over
    else:
        return _stepped(slug, base, row, t, v), None

    if not slug.active and math.isnan(slug.run_start) and not over.any():
        # Nothing over and no run open from before (most batches): no condition, no short
        # run, nothing pending; what the general path below concludes, without its passes.
        _settle_quiet(slug, win, cs, cc, t, warm_since, m)
        return [], None

    gap = step > slug.max_gap
    gap[0] |= first
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


def _settle_quiet(
    slug: SlugState, win: BatchWindow, cs: Floats, cc: Ints, t: Floats, warm_since: Floats, mean: Floats
) -> None:
    """End a batch with nothing over and no run open: nothing pending, the window
    committed, the state at the batch's last sample (its time, warm-up start and mean)."""
    slug.pending.clear()
    win.commit(cs, cc)
    slug.prev_t = float(t[-1])
    slug.warm_since = float(warm_since[-1])
    slug.last_mean = float(mean[-1])


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
    qv: Floats,
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
        entry[0] += int(q)
        entry[1] += 1


def _over_run_starts(
    t: Floats, over: npt.NDArray[np.bool_], gap: npt.NDArray[np.bool_], slug: SlugState
) -> Floats:
    """Start of each over sample's continuous run: a run starts at an over sample
    after a not-over sample or after a gap longer than `max_gap`."""
    prev_over = np.concatenate(([not math.isnan(slug.run_start)], over[:-1]))
    last = ffill_index(over & (gap | ~prev_over))
    return np.where(last >= 0, t[np.maximum(last, 0)], slug.run_start)
