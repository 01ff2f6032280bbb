"""Baselines of many sensors at once: a time-major batch with one time per step.

A station's export holds every sensor once per step, at the step's time, so all its
sensors share one array of times: rows of the same bucket width, ring size and current
bucket share `BatchWindow`'s geometry, and their arithmetic runs as one 2-D array (rows
x samples) instead of a dozen NumPy calls per sensor (2,050 sensor batches at 10 M rows).

Only what concludes nothing is done here, the same as the sensor's own path would do it:
a slug batch with nothing over and no run open (`slug_replay._attempt`'s quiet first
round, most batches) and the baselines of sensors without a slug rule
(`Baselines.absorb`). Any other member is left to `slug_replay.batch`, which starts
from scratch. The sums are whole numbers of quanta (exact in any order) and each mean
is the same elementwise division, so the baselines and states are bit for bit the ones
the per-sensor path leaves (`tests/test_engine_together.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from monitor.engine.baseline import MAX_BATCH, NO_BUCKET, Baselines, BatchWindow, Floats, Ints
from monitor.engine.slug import SlugState
from monitor.engine.state import SensorState
from monitor.model import Quality

GOOD = int(Quality.GOOD)

Floats2D = npt.NDArray[np.float64]


class Scratch:
    """Working arrays reused from batch to batch (every full batch has the same shape).
    A fresh array of a megabyte or two is fresh pages from the kernel, each faulted in on
    first touch: at 10 M rows 75,000 minor faults and 0.12 s of system time in the replay,
    where the per-sensor path's small arrays are reused by malloc."""

    def __init__(self) -> None:
        self._arrays: dict[str, npt.NDArray[Any]] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type[np.generic]) -> npt.NDArray[Any]:
        """The array kept as `name`, or a new one when its shape or type differs."""
        a = self._arrays.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self._arrays[name] = np.empty(shape, dtype=dtype)
        return a


def step_times(time: Floats, steps: int, n_states: int, scratch: Scratch) -> Floats | None:
    """The times of a time-major batch's steps when every sample of a step has its step's
    time (NaN never does), else None."""
    by_step = time.reshape(steps, n_states)
    first = by_step[:, 0]
    # The mask in a kept array (no fresh pages each batch); one comparison of the whole
    # batch is 8 times faster than each step's least and greatest (0.15 vs 1.28 ms).
    same = np.equal(by_step, first[:, None], out=scratch.get("same", by_step.shape, np.bool_))
    if n_states > 1 and not bool(same.all()):
        return None
    return first.copy()


def whole(
    states: Sequence[SensorState], t: Floats, values: Floats2D, quality: npt.NDArray[np.int8] | None
) -> list[bool]:
    """Per sensor (row of `values`), True when `Engine._admit` would take its batch whole
    (`t`: rising times): after its last sample, every value believable, no device error
    values to look for, and (`quality`, steps x sensors) GOOD. One minimum and maximum a
    row instead of each sensor's masks (NaN fails both)."""
    lo = np.array([st.lo for st in states])
    hi = np.array([st.hi for st in states])
    good = (values.min(axis=1) >= lo) & (values.max(axis=1) <= hi)
    if quality is not None:
        good &= ~quality.any(axis=0) if GOOD == 0 else (quality == GOOD).all(axis=0)
    first = float(t[0])
    return [
        g and not st.bad_values and first > st.last_time for g, st in zip(good.tolist(), states, strict=True)
    ]


def settle(
    base: Baselines,
    judged: Sequence[SensorState],
    whole: list[bool],
    t: Floats,
    max_step: float,
    values: Floats2D,
    scratch: Scratch,
) -> list[bool]:
    """`slug_replay.batch(st.slug, base, st.row, t, values[st.index])` for each judged sensor
    taken `whole` whose batch concludes nothing (no condition; `max_step`: the largest step
    of `t`); True per sensor index done, False for those the caller judges on its own."""
    settled = [False] * len(whole)
    # The batch's running totals of quanta stay below 2^53 (exact as float64, as int64):
    # a value within the row's plausible range is at most 2^30 quanta, unless that range
    # is wider than the one its quantum was chosen for (then: the sensor's own path).
    most = 2.0**53 / (t.size + 1)
    members = [st for st in judged if whole[st.index] and max(-st.lo, st.hi) / base.quantum[st.row] < most]
    if not members or t.size > MAX_BATCH:  # the per-sensor path cuts a longer batch
        return settled
    done = _settle(base, t, max_step, values, [st.index for st in members], [st.row for st in members],
                   [st.slug for st in members], scratch)  # fmt: skip
    for st, d in zip(members, done, strict=True):
        settled[st.index] = d
    return settled


def _settle(
    base: Baselines,
    t: Floats,
    max_step: float,
    values: Floats2D,
    at: list[int],
    rows: list[int],
    slugs: list[SlugState | None],
    scratch: Scratch,
) -> list[bool]:
    """`settle` of the members (row `at[j]` of `values` is member j's)."""
    done = [False] * len(rows)
    groups: dict[tuple[float, int, int], list[int]] = {}
    for j, (row, slug) in enumerate(zip(rows, slugs, strict=True)):
        if slug is None or _may_be_quiet(slug, t, max_step):
            groups.setdefault((base.width[row], base.size[row], base.bucket[row]), []).append(j)
    for members in groups.values():
        win = base.batch(rows[members[0]], t)
        if win.m0 != NO_BUCKET and int(win.buckets[0]) < win.m0:
            continue  # the commit would rebuild the ring: the per-sensor path does
        picked = [at[j] for j in members]
        # Usually every sensor of the station: the rows as they are, no copy.
        mine = values
        if picked != list(range(values.shape[0])):
            mine = np.take(values, picked, axis=0, out=scratch.get("rows", (len(picked), t.size), np.float64))
        taken = _group(base, win, t, mine, [rows[j] for j in members], [slugs[j] for j in members], scratch)
        for j, d in zip(members, taken, strict=True):
            done[j] = d
    return done


def _group(
    base: Baselines,
    win: BatchWindow,
    t: Floats,
    values: Floats2D,
    rows: list[int],
    slugs: list[SlugState | None],
    scratch: Scratch,
) -> list[bool]:
    """One group's members (row x of `values` is `rows[x]`'s): the running totals of every
    sample's quanta (`BatchWindow.quantize`, `prefix`), each slug member's quiet round
    (`_quiet_slugs`), and the commit of the plain members and the quiet ones (True)."""
    size = int(t.size)
    inverse = np.array([1.0 / base.quantum[r] for r in rows])
    qv = np.multiply(values, inverse[:, None], out=scratch.get("quanta", values.shape, np.float64))
    np.rint(qv, out=qv)
    # Running totals in int64, not float64 as `BatchWindow.prefix`: the same whole numbers
    # (`settle` admits rows whose totals stay below 2^53), and NumPy's integer cumulative
    # sum is several times faster (rows x 5,120 samples: 1.17 -> 0.26 ms with the cast).
    cs = scratch.get("totals", (len(rows), size + 1), np.int64)
    cs[:, 0] = 0
    np.cumsum(qv, axis=1, dtype=np.int64, out=cs[:, 1:])
    ends = np.empty_like(win.j_now)  # each bucket's end in the running totals
    ends[:-1] = win.j_now[1:]
    ends[-1] = size
    judged = [x for x, sl in enumerate(slugs) if sl is not None]
    quiet = _quiet_slugs(base, win, t, values, cs, rows, slugs, judged, scratch) if judged else []
    taken = [sl is None or quiet[x] for x, sl in enumerate(slugs)]
    # BatchWindow.commit's part of the last n + 1 buckets (Baselines.advance ignores older
    # ones): each bucket's quanta from the running totals, whole numbers, exact.
    i0 = int(np.searchsorted(win.buckets, int(win.k[-1]) - win.n, side="left"))
    starts, ends = win.j_now[i0:], ends[i0:]
    part_s = cs[:, ends] - cs[:, starts]
    part_c = ends - starts
    buckets = win.buckets[i0:]
    for x, row in enumerate(rows):
        if taken[x]:
            base.advance(row, buckets, part_s[x], part_c)
    return taken


def _may_be_quiet(slug: SlugState, t: Floats, max_step: float) -> bool:
    """`_attempt`'s `may_be_quiet`: sustained, no alarm or run carried over, no restart
    (a step longer than the window, or the first sample ever), warm throughout."""
    if slug.method != "sustained" or slug.active or not math.isnan(slug.run_start):
        return False
    first = float(t[0])
    if math.isnan(slug.prev_t) or first - slug.prev_t > slug.window or max_step > slug.window:
        return False
    return not first - slug.warm_since < slug.warmup


def _state_totals(base: Baselines, win: BatchWindow, rows: list[int], scratch: Scratch) -> tuple[Ints, Ints]:
    """`BatchWindow.state_s` and `state_c` for each row: the state's buckets
    `m0 - n .. m0` (the ring oldest first, then the current bucket) as running totals,
    taken at the batch's buckets."""
    n, p = win.n, win.m0 % win.n
    out = []
    for ring, cur in ((base.sums, base.cur_sum), (base.counts, base.cur_count)):
        src = np.take(ring, rows, axis=0, out=scratch.get("ring", (len(rows), ring.shape[1]), np.int64))
        run = scratch.get("state", (len(rows), n + 2), np.int64)
        run[:, 0] = 0
        run[:, 1 : n - p + 1] = src[:, p:n]
        run[:, n - p + 1 : n + 1] = src[:, :p]
        run[:, n + 1] = [cur[r] for r in rows]
        np.cumsum(run[:, 1:], axis=1, out=run[:, 1:])
        out.append(run[:, win.state_hi] - run[:, win.state_lo])
    return out[0], out[1]


def _quiet_slugs(
    base: Baselines,
    win: BatchWindow,
    t: Floats,
    values: Floats2D,
    cs: Ints,
    rows: list[int],
    slugs: list[SlugState | None],
    judged: list[int],
    scratch: Scratch,
) -> list[bool]:
    """`_attempt`'s first round and `_settle_quiet` (but the commit) for the members
    `judged` (a slug rule each); True per member (all of `rows`) settled quiet."""
    # BatchWindow.means with every sample included (running counts 0, 1, 2, ...).
    pick = np.array(judged, dtype=np.intp)[:, None]
    s: Ints = cs[pick, win.j_now] - cs[pick, win.j_old]
    count = np.broadcast_to(win.j_now - win.j_old, s.shape)
    if win.from_state:
        state_s, state_c = _state_totals(base, win, [rows[x] for x in judged], scratch)
        s = s + state_s
        count = count + state_c
    mean = np.full(s.shape, np.nan)
    np.divide(s, count, out=mean, where=count > 0)
    mean *= np.array([base.quantum[rows[x]] for x in judged])[:, None]
    slug_of = [sl for sl in (slugs[x] for x in judged) if sl is not None]  # every one
    if win.m0 == int(win.buckets[0]):  # the mean in force for the state's bucket
        mean[:, 0] = [sl.last_mean for sl in slug_of]
        count = np.array(count)
        count[:, 0] = 1
    factor = np.array([sl.factor for sl in slug_of])[:, None]
    floor = np.array([sl.min_baseline for sl in slug_of])[:, None]
    # Over: a sample above factor x its bucket's mean where that mean is judged (NaN never
    # is), as `_attempt`'s bucket peaks; the thresholds spread over the samples compare
    # faster than np.maximum.reduceat takes the peaks (0.08 instead of 0.69 ms a batch).
    # Every row compared (no copy of the judged ones): the others' thresholds infinite.
    thr = np.full((len(rows), s.shape[1]), np.inf)
    thr[judged] = np.where(mean >= floor, factor * mean, np.inf)
    bucket = np.repeat(np.arange(s.shape[1]), win.per_bucket)  # each sample's bucket
    spread = np.take(thr, bucket, axis=1, out=scratch.get("spread", values.shape, np.float64))
    above = np.greater(values, spread, out=scratch.get("above", values.shape, np.bool_))
    over = above.any(axis=1)[judged]
    # A row with an empty window (its last mean carried) or a sample over: its own path.
    calm: list[bool] = ((count > 0).all(axis=1) & ~over).tolist()
    quiet = [False] * len(rows)
    last = float(t[-1])
    for y, (x, slug) in enumerate(zip(judged, slug_of, strict=True)):
        if calm[y]:
            slug.pending.clear()
            slug.prev_t = last
            slug.last_mean = float(mean[y, -1])
            quiet[x] = True
    return quiet
