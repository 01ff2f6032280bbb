"""Rolling baselines for every sensor in one pair of 2-D NumPy arrays.

Each sensor owns one row of `sums` / `counts` (1,440 columns), a ring over its
window at one bucket per minute (a window longer than 24 h widens the bucket so
the ring never grows past 1,440 columns: 23 KB a sensor, whatever the window).

A ring slot holds the (sum, count) of *one* bucket, and the sums are exact
integers: each value is counted in quanta of its sensor (a power of two, 2^-30 of
the largest plausible value, e.g. 0.001 gpm for a flow sensor with a 1,000,000 gpm
range), so

- no running total grows forever and nothing is lost to rounding: a value that has
  left the window leaves no trace (a float running sum would keep the rounding
  error of a 1e30 reading for good, and two 1e308 readings made it NaN);
- addition is exact, so the order does not matter: the live path (one sample at a
  time, `roll` / `add`), the vectorised replay path (NumPy cumulative sums) and a
  sample of a short over run that enters its bucket late all give the same sums,
  bit for bit, and the same window mean `sum * quantum / count`.

The baseline of a sample in bucket `k` is the mean over buckets `k - n .. k - 1`
(the whole buckets before it), so a sample never judges itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_BUCKETS = 1440
BUCKET_SECONDS = 60.0
NO_BUCKET = -(2**62)  # a row that has seen no sample yet
QUANTUM_BITS = 30  # the largest plausible value is 2^30 quanta
# A batch's running totals are float64 holding whole numbers of quanta: exact while below
# 2^53, so a batch is at most 2^23 samples of one sensor (the callers cut longer ones).
MAX_BATCH = 2**23
DEFAULT_SCALE = 1e9  # largest plausible value of a row when none is given

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


def geometry(window: float) -> tuple[float, int]:
    """`(bucket width in seconds, buckets in the ring)` for a window; one-minute
    buckets up to 24 h, wider ones beyond so the ring stays at 1,440 columns."""
    width = (
        BUCKET_SECONDS if window <= MAX_BUCKETS * BUCKET_SECONDS else float(math.ceil(window / MAX_BUCKETS))
    )
    size = min(MAX_BUCKETS, max(1, math.ceil(window / width)))
    return width, size


def quantum_for(scale: float) -> float:
    """The power of two that counts values up to `scale` in at most 2^30 quanta."""
    scale = scale if math.isfinite(scale) and scale > 0 else DEFAULT_SCALE
    return math.ldexp(1.0, math.frexp(scale)[1] - QUANTUM_BITS)


class Baselines:
    """Rolling window means of many sensors; one row per sensor.

    `scales[row]` is the largest magnitude a plausible value of the row can have
    (values beyond it are bad data and never reach a baseline)."""

    def __init__(self, windows: Sequence[float], scales: Sequence[float] | None = None) -> None:
        rows = len(windows)
        geo = [geometry(w) for w in windows]
        self.width: list[float] = [g[0] for g in geo]
        self.size: list[int] = [g[1] for g in geo]
        scales = scales if scales is not None else [DEFAULT_SCALE] * rows
        self.quantum: list[float] = [quantum_for(s) for s in scales]
        self.sums: Ints = np.zeros((rows, MAX_BUCKETS), dtype=np.int64)
        self.counts: Ints = np.zeros((rows, MAX_BUCKETS), dtype=np.int64)
        self._sum_rows = list(self.sums)
        self._count_rows = list(self.counts)
        # Per row: the current bucket, its (sum, count) so far, and the window's totals
        # (buckets `bucket - n .. bucket - 1`, always equal to the ring's sum).
        self.bucket: list[int] = [NO_BUCKET] * rows
        self.cur_sum: list[int] = [0] * rows
        self.cur_count: list[int] = [0] * rows
        self.win_sum: list[int] = [0] * rows
        self.win_count: list[int] = [0] * rows

    @property
    def rows(self) -> int:
        return len(self.bucket)

    @property
    def nbytes(self) -> int:
        """Bytes held by the rings and the per-row totals."""
        return int(self.sums.nbytes + self.counts.nbytes) + 6 * 8 * self.rows

    def quantize(self, row: int, value: float) -> int:
        """A value in the row's quanta (round half to even, as `np.rint`)."""
        return round(value / self.quantum[row])

    # --- live path: one sample at a time -------------------------------------------

    def bucket_of(self, row: int, t: float) -> int:
        return math.floor(t / self.width[row])

    def roll(self, row: int, k: int) -> None:
        """Move `row` on to bucket `k` (> the current one), closing the buckets between."""
        old = self.bucket[row]
        self.bucket[row] = k
        cur, ccur = self.cur_sum[row], self.cur_count[row]
        self.cur_sum[row] = self.cur_count[row] = 0
        if old == NO_BUCKET:
            return
        n = self.size[row]
        sums, counts = self._sum_rows[row], self._count_rows[row]
        d = k - old
        if d > n:  # everything the ring held, and the closed bucket, left the window
            sums[:] = 0
            counts[:] = 0
            self.win_sum[row] = self.win_count[row] = 0
            return
        slot = old % n  # held bucket old - n, which leaves; bucket `old` takes its place
        if d == 1:
            self.win_sum[row] += cur - int(sums[slot])
            self.win_count[row] += ccur - int(counts[slot])
            sums[slot] = cur
            counts[slot] = ccur
            return
        slots = (old + np.arange(d)) % n  # buckets old - n .. k - n - 1 leave
        self.win_sum[row] += cur - int(sums[slots].sum())
        self.win_count[row] += ccur - int(counts[slots].sum())
        sums[slots] = 0
        counts[slots] = 0
        sums[slot] = cur
        counts[slot] = ccur

    def add(self, row: int, q: int, count: int = 1) -> None:
        """Add `q` quanta (`count` samples) to the current bucket."""
        self.cur_sum[row] += q
        self.cur_count[row] += count

    def add_to(self, row: int, k: int, q: int, count: int) -> None:
        """Add to bucket `k` (at or before the current one) late: the samples of a
        short over run entering their buckets; dropped if `k` left the window."""
        cur = self.bucket[row]
        n = self.size[row]
        if k == cur:
            self.cur_sum[row] += q
            self.cur_count[row] += count
        elif cur - n <= k < cur:
            self._sum_rows[row][k % n] += q
            self._count_rows[row][k % n] += count
            self.win_sum[row] += q
            self.win_count[row] += count

    def relabel(self, row: int, delta: float) -> int:
        """The gateway clock stepped by `delta` seconds: the ring keeps its sums and
        counts, its buckets are renamed by whole buckets (rounded down, so the next
        reading never falls before the current bucket); returns that bucket shift."""
        k = self.bucket[row]
        shift = math.floor(delta / self.width[row])
        if k == NO_BUCKET or shift == 0:
            return 0
        s, c = self.chronological(row)
        n = self.size[row]
        self.bucket[row] = k + shift
        order = np.arange(k + shift - n, k + shift) % n
        self.sums[row, order] = s[:-1]
        self.counts[row, order] = c[:-1]
        return shift

    def window(self, row: int) -> tuple[float, int]:
        """Sum and count of the window before the current bucket."""
        return float(self.win_sum[row]) * self.quantum[row], self.win_count[row]

    def mean(self, row: int) -> float | None:
        """The window mean before the row's latest bucket; None when empty."""
        if self.bucket[row] == NO_BUCKET:
            return None
        c = self.win_count[row]
        return float(self.win_sum[row]) / c * self.quantum[row] if c > 0 else None

    def chronological(self, row: int) -> tuple[Ints, Ints]:
        """Quanta and counts of buckets `bucket - n .. bucket` (the ring oldest first,
        then the current bucket)."""
        n = self.size[row]
        p = self.bucket[row] % n  # the slot of bucket `bucket - n`: the ring in two slices
        sums, counts = self._sum_rows[row], self._count_rows[row]
        s = np.concatenate((sums[p:n], sums[:p], (self.cur_sum[row],)))
        c = np.concatenate((counts[p:n], counts[:p], (self.cur_count[row],)))
        return s, c

    def buckets(self, row: int) -> tuple[Floats, Ints]:
        """Per-bucket (sum, count) of the window, oldest first (for tests and inspection)."""
        s, c = self.chronological(row)
        return s[:-1].astype(np.float64) * self.quantum[row], c[:-1]

    # --- replay path: a whole batch of one row at once -----------------------------

    def batch(self, row: int, times: Floats, lookups: bool = True) -> BatchWindow:
        return BatchWindow(self, row, times, lookups)

    def advance(self, row: int, buckets: Ints, sums: Ints, counts: Ints) -> None:
        """Move `row` on to bucket `buckets[-1]`, adding each bucket's quanta and count:
        `buckets` rise, none before the current bucket. Only the ring slots of the buckets
        passed over are cleared and only the batch's buckets written (`roll` for many),
        not the whole ring rebuilt in time order."""
        n = self.size[row]
        k_end = int(buckets[-1])
        old = self.bucket[row]
        ring_s, ring_c = self._sum_rows[row], self._count_rows[row]
        d = k_end - old
        if d == 0:
            self.cur_sum[row] += int(sums[-1])
            self.cur_count[row] += int(counts[-1])
            return
        if old == NO_BUCKET or d > n:  # everything the ring held left the window
            ring_s[:] = 0
            ring_c[:] = 0
        else:  # buckets old .. k_end - 1 take the slots of old - n .. k_end - n - 1
            p = old % n
            if p + d <= n:
                ring_s[p : p + d] = 0
                ring_c[p : p + d] = 0
            else:
                ring_s[p:] = 0
                ring_c[p:] = 0
                ring_s[: p + d - n] = 0
                ring_c[: p + d - n] = 0
            ring_s[p] = self.cur_sum[row]
            ring_c[p] = self.cur_count[row]
        if buckets.size > 1:
            i0 = 0 if int(buckets[0]) >= k_end - n else int(np.searchsorted(buckets, k_end - n))
            slots = buckets[i0:-1] % n  # distinct: fewer than n buckets
            ring_s[slots] += sums[i0:-1]
            ring_c[slots] += counts[i0:-1]
        self.bucket[row] = k_end
        self.cur_sum[row] = int(sums[-1])
        self.cur_count[row] = int(counts[-1])
        self.win_sum[row] = int(ring_s.sum())
        self.win_count[row] = int(ring_c.sum())

    def absorb(self, row: int, times: Floats, values: Floats) -> None:
        """Commit a batch of a row no rule judges (no slug rule: the baseline is kept for the
        console and checkpoints): only the last n + 1 buckets reach the ring, so the samples
        before them are skipped, and no window mean is looked up."""
        if not times.size:
            return
        width, last = self.width[row], float(times[-1])
        start = 0
        if math.isfinite(last):
            # One bucket of margin below bucket `last - n`, so rounding in `t / width` cannot
            # drop a sample the commit needs; the commit ignores buckets older than that.
            oldest = (math.floor(last / width) - self.size[row] - 1) * width
            if times[0] < oldest:
                start = int(np.searchsorted(times, oldest, side="left"))
        for a in range(start, int(times.size), MAX_BATCH):
            win = self.batch(row, times[a : a + MAX_BATCH], lookups=False)
            q = win.quantize(values[a : a + MAX_BATCH])
            if self.bucket[row] == NO_BUCKET or int(win.buckets[0]) >= self.bucket[row]:
                # Each bucket's quanta summed on their own, no running totals to take apart:
                # whole numbers below 2^53, so the sums are exact and the commit's.
                sums = np.add.reduceat(q, win.j_now).astype(np.int64)
                self.advance(row, win.buckets, sums, win.per_bucket)
            else:
                cs, cc = win.prefix(q, None)
                win.commit(cs, cc)


def _running(x: Ints) -> Ints:
    """Running totals with a leading 0: `concatenate(([0], cumsum(x)))` in one array."""
    out = np.empty(x.size + 1, dtype=np.int64)
    out[0] = 0
    np.cumsum(x, out=out[1:])
    return out


class BatchWindow:
    """The baseline arithmetic for one row over a batch of its samples.

    Which samples enter the baseline (`include`) may be decided in rounds (the slug
    rule excludes samples that are over, which depends on the baseline before them),
    so the bucket lookups are computed once and `means()` is cheap to repeat. Means
    are computed per bucket (they are constant within one); `expand` spreads them
    over the bucket's samples.
    """

    def __init__(self, base: Baselines, row: int, times: Floats, lookups: bool = True) -> None:
        self.base = base
        self.row = row
        n = base.size[row]
        self.n = n
        self.quantum = base.quantum[row]
        scaled = times / base.width[row]
        # Truncation is floor for times after 1970 and saves a pass; `math.floor` live.
        k = (scaled if scaled.size and scaled[0] >= 0 else np.floor(scaled)).astype(np.int64)
        self.k = k
        self.m0 = base.bucket[row]
        first = np.ones(k.size, dtype=bool)
        np.not_equal(k[1:], k[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        uk = k[starts]
        self.buckets = uk
        per_bucket = np.empty_like(starts)  # np.diff(np.append(...)) without their wrappers
        np.subtract(starts[1:], starts[:-1], out=per_bucket[:-1])
        if starts.size:
            per_bucket[-1] = k.size - starts[-1]
        self.per_bucket = per_bucket
        # Index into the batch's running totals (0 = before the batch) at the start of
        # each bucket and at the start of the first bucket not older than `n` before it.
        self.j_now = starts
        self.from_state = False
        if not lookups:  # commit only (`Baselines.absorb`): no window means before buckets
            return
        if uk.size and int(uk[-1] - uk[0]) == uk.size - 1:  # no empty bucket: plain offsets
            self.j_old = starts[np.maximum(np.arange(-n, uk.size - n), 0)]
        else:
            self.j_old = starts[np.searchsorted(uk, uk - n, side="left")]
        # What the state holds (buckets m0 - n .. m0), as running totals oldest first.
        self.from_state = self.m0 != NO_BUCKET and bool(uk.size) and int(uk[0]) - n <= self.m0
        if self.from_state:
            s, c = base.chronological(row)
            self.state_cs = _running(s)
            self.state_cc = _running(c)
            # np.clip(x, 0, n + 1), without its wrapper's cost (a sixth of the window's setup)
            lo = uk - self.m0
            np.minimum(np.maximum(lo, 0, out=lo), n + 1, out=lo)
            hi = uk - (self.m0 - n)  # buckets up to u - 1
            np.minimum(np.maximum(hi, 0, out=hi), n + 1, out=hi)
            self.state_lo, self.state_hi = lo, hi  # kept for sensors judged together
            self.state_s = self.state_cs[hi] - self.state_cs[lo]
            self.state_c = self.state_cc[hi] - self.state_cc[lo]

    def quantize(self, values: Floats) -> Floats:
        """Values in whole quanta of the row, as float64 (round half to even, as the live
        path; the quantum is a power of two, so multiplying by its inverse is dividing)."""
        x = values * (1.0 / self.quantum)
        return np.rint(x, out=x)

    def prefix(self, q: Floats, include: npt.NDArray[np.bool_] | None) -> tuple[Floats, Ints]:
        """Running totals of the batch's included samples before each sample (index 0:
        none yet); whole numbers of quanta below 2^53, so every one is exact."""
        cs = np.empty(q.size + 1, dtype=np.float64)
        cs[0] = 0
        if include is None:
            np.cumsum(q, out=cs[1:])
            cc = np.arange(q.size + 1, dtype=np.int64)
        else:
            np.multiply(q, include, out=cs[1:])
            np.cumsum(cs[1:], out=cs[1:])
            cc = np.empty(q.size + 1, dtype=np.int64)
            cc[0] = 0
            np.cumsum(include, out=cc[1:])
        return cs, cc

    def means(self, cs: Floats, cc: Ints) -> tuple[Floats, Ints]:
        """Window mean (NaN when empty) and count before each bucket of the batch."""
        s = cs[self.j_now] - cs[self.j_old]
        count = cc[self.j_now] - cc[self.j_old]
        if self.from_state:
            s = s + self.state_s
            count = count + self.state_c
        mean = np.full(count.size, np.nan)
        # sum / count x quantum, as the live path: the quantum is a power of two.
        np.divide(s, count, out=mean, where=count > 0)
        mean *= self.quantum
        return mean, count

    def expand(self, per_bucket: Floats) -> Floats:
        """A per-bucket array spread over the samples of each bucket."""
        return np.repeat(per_bucket, self.per_bucket)

    def commit(self, cs: Floats, cc: Ints, rebuild: bool = False) -> None:
        """Write the batch into the ring and the row's totals: `Baselines.advance` when the
        batch starts at or after the row's current bucket (always, in replay), else (or with
        `rebuild`, for the tests) the last n + 1 buckets rebuilt in time order."""
        if not self.k.size:
            return
        b, row, n = self.base, self.row, self.n
        k_end = int(self.k[-1])
        lo_k = k_end - n
        # Per bucket of the last n + 1: the batch's part (running totals at bucket edges) ...
        i0 = int(np.searchsorted(self.buckets, lo_k, side="left"))
        starts = self.j_now[i0:]
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        ends[-1] = self.k.size
        part_s = (cs[ends] - cs[starts]).astype(np.int64)
        part_c = cc[ends] - cc[starts]
        if not rebuild and (self.m0 == NO_BUCKET or int(self.buckets[0]) >= self.m0):
            b.advance(row, self.buckets[i0:], part_s, part_c)
            return
        at = self.buckets[i0:] - lo_k
        s = np.zeros(n + 1, dtype=np.int64)
        c = np.zeros(n + 1, dtype=np.int64)
        s[at] = part_s
        c[at] = part_c
        # ... plus what the state held for it (buckets m0 - n .. m0).
        if self.m0 != NO_BUCKET and self.m0 >= lo_k:
            st_s, st_c = b.chronological(row)
            shift = self.m0 - n - lo_k  # where the state's oldest bucket lands (<= 0)
            s[: n + 1 + shift] += st_s[-shift:]
            c[: n + 1 + shift] += st_c[-shift:]
        p = lo_k % n  # the slot of bucket lo_k: the ring written in two slices
        sums, counts = b._sum_rows[row], b._count_rows[row]
        sums[p:n], sums[:p] = s[: n - p], s[n - p : n]
        counts[p:n], counts[:p] = c[: n - p], c[n - p : n]
        b.cur_sum[row] = int(s[-1])
        b.cur_count[row] = int(c[-1])
        b.win_sum[row] = int(s[:-1].sum())
        b.win_count[row] = int(c[:-1].sum())
        b.bucket[row] = k_end
