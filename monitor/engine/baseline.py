"""Rolling baselines for every sensor in one pair of 2-D NumPy arrays.

Each sensor owns one row of `sums` / `counts` (1,440 columns), a ring over its
window at one bucket per minute (a window longer than 24 h widens the bucket so
the ring never grows past 1,440 columns: 23 KB a sensor, whatever the window).

A ring slot holds the running (sum, count) of the sensor's baseline samples at the
*start* of a bucket; the per-bucket (sum, count) is the difference of two
neighbours (`buckets()`). Keeping running totals instead of per-bucket sums costs
nothing in memory and buys two things:

- the window total is one subtraction, so an update and a window mean are O(1);
- the live path (one sample at a time) and the vectorised replay path (a NumPy
  cumulative sum) add the same numbers in the same order, so they compute the
  same float, bit for bit, and raise identical events.

The baseline of a sample in bucket `k` is the mean over buckets `k - n .. k - 1`
(the whole buckets before it), so it is constant within a bucket and a sample
never judges itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_BUCKETS = 1440
BUCKET_SECONDS = 60.0
NO_BUCKET = -(2**62)  # a row that has seen no sample yet

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


class Baselines:
    """Rolling window means of many sensors; one row per sensor."""

    def __init__(self, windows: Sequence[float]) -> None:
        rows = len(windows)
        geo = [geometry(w) for w in windows]
        self.width: list[float] = [g[0] for g in geo]
        self.size: list[int] = [g[1] for g in geo]
        self.sums: Floats = np.zeros((rows, MAX_BUCKETS), dtype=np.float64)
        self.counts: Ints = np.zeros((rows, MAX_BUCKETS), dtype=np.int64)
        self._sum_rows = list(self.sums)
        self._count_rows = list(self.counts)
        # Per row: running totals, the current bucket, and the totals at its start.
        self.total: list[float] = [0.0] * rows
        self.n_total: list[int] = [0] * rows
        self.bucket: list[int] = [NO_BUCKET] * rows
        self.start_sum: list[float] = [0.0] * rows
        self.start_count: list[int] = [0] * rows

    @property
    def nbytes(self) -> int:
        """Bytes held by the rings and the per-row totals."""
        return int(self.sums.nbytes + self.counts.nbytes) + 5 * 8 * len(self.total)

    # --- live path: one sample at a time -------------------------------------------

    def bucket_of(self, row: int, t: float) -> int:
        return math.floor(t / self.width[row])

    def roll(self, row: int, k: int) -> None:
        """Move `row` on to bucket `k` (> the current one), closing the buckets between."""
        old = self.bucket[row]
        n = self.size[row]
        total = self.total[row]
        sums, counts = self._sum_rows[row], self._count_rows[row]
        lo = max(old, k - n)
        if lo == old:
            slot = old % n
            sums[slot] = self.start_sum[row]
            counts[slot] = self.start_count[row]
            lo += 1
        if lo < k:
            n_total = self.n_total[row]
            a, b = lo % n, (k - 1) % n + 1
            if a < b:
                sums[a:b] = total
                counts[a:b] = n_total
            else:
                sums[a:n] = total
                counts[a:n] = n_total
                sums[:b] = total
                counts[:b] = n_total
        self.bucket[row] = k
        self.start_sum[row] = total
        self.start_count[row] = self.n_total[row]

    def window(self, row: int) -> tuple[float, int]:
        """Sum and count of the window before the current bucket."""
        slot = self.bucket[row] % self.size[row]
        return (
            self.start_sum[row] - float(self._sum_rows[row][slot]),
            self.start_count[row] - int(self._count_rows[row][slot]),
        )

    def add(self, row: int, value: float) -> None:
        self.total[row] += value
        self.n_total[row] += 1

    def mean(self, row: int) -> float | None:
        """The window mean in force for the row's latest bucket; None when empty."""
        if self.bucket[row] == NO_BUCKET:
            return None
        s, c = self.window(row)
        return s / c if c > 0 else None

    def buckets(self, row: int) -> tuple[Floats, Ints]:
        """Per-bucket (sum, count) of the window, oldest first (for tests and inspection)."""
        n = self.size[row]
        k = self.bucket[row]
        order = (np.arange(k - n, k + 1)) % n
        s = np.append(self.sums[row, order[:-1]], self.start_sum[row])
        c = np.append(self.counts[row, order[:-1]], self.start_count[row])
        return np.diff(s), np.diff(c)

    # --- replay path: a whole batch of one row at once -----------------------------

    def batch(self, row: int, times: Floats) -> BatchWindow:
        return BatchWindow(self, row, times)


class BatchWindow:
    """The baseline arithmetic for one row over a batch of its samples.

    Which samples enter the baseline (`include`) may be decided in rounds (the slug
    rule excludes samples that are over, which depends on the baseline before them),
    so the bucket lookups are computed once and `means()` is cheap to repeat. Means
    are computed per bucket (they are constant within one); `expand` spreads them
    over the bucket's samples.
    """

    def __init__(self, base: Baselines, row: int, times: Floats) -> None:
        self.base = base
        self.row = row
        n = base.size[row]
        self.n = n
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
        self.per_bucket = np.diff(np.append(starts, k.size))
        # Index into the running totals (0 = before the batch) at the start of each
        # bucket and at the start of the bucket `n` before it.
        self.j_now = starts
        if uk.size and int(uk[-1] - uk[0]) == uk.size - 1:  # no empty bucket: plain offsets
            self.j_old = starts[np.maximum(np.arange(-n, uk.size - n), 0)]
        else:
            self.j_old = starts[np.searchsorted(uk, uk - n, side="left")]
        # Buckets at or before the state's current one come from the ring.
        self.from_state = self.m0 != NO_BUCKET and bool(uk.size) and int(uk[0]) - n <= self.m0
        if self.from_state:
            self.now_state = uk <= self.m0
            self.old_state = (uk - n) <= self.m0

    def _state_values(self, x: Ints) -> tuple[Floats, Ints]:
        b = self.base
        row = self.row
        slot = x % self.n
        s = b.sums[row, slot]
        c = b.counts[row, slot]
        cur = x == self.m0
        s[cur] = b.start_sum[row]
        c[cur] = b.start_count[row]
        return s, c

    def prefix(self, values: Floats, include: npt.NDArray[np.bool_] | None) -> tuple[Floats, Ints]:
        """Running totals before each sample (index 0 = the state's totals)."""
        b, row = self.base, self.row
        cs = np.empty(values.size + 1)
        cs[0] = b.total[row]
        if include is None:
            cs[1:] = values
            cc = np.arange(b.n_total[row], b.n_total[row] + values.size + 1, dtype=np.int64)
        else:
            np.multiply(values, include, out=cs[1:])
            cc = np.empty(values.size + 1, dtype=np.int64)
            cc[0] = b.n_total[row]
            cc[1:] = include
            np.cumsum(cc, out=cc)
        np.cumsum(cs, out=cs)
        return cs, cc

    def means(self, cs: Floats, cc: Ints) -> tuple[Floats, Ints]:
        """Window mean (NaN when empty) and count before each bucket of the batch."""
        s_now, c_now = cs[self.j_now], cc[self.j_now]
        s_old, c_old = cs[self.j_old], cc[self.j_old]
        if self.from_state:
            sel = self.now_state
            s_now[sel], c_now[sel] = self._state_values(self.buckets[sel])
            sel = self.old_state
            s_old[sel], c_old[sel] = self._state_values(self.buckets[sel] - self.n)
        count = c_now - c_old
        mean = np.full(count.size, np.nan)
        np.divide(s_now - s_old, count, out=mean, where=count > 0)
        return mean, count

    def expand(self, per_bucket: Floats) -> Floats:
        """A per-bucket array spread over the samples of each bucket."""
        return np.repeat(per_bucket, self.per_bucket)

    def commit(self, cs: Floats, cc: Ints) -> None:
        """Write the batch into the ring and the row's totals."""
        if not self.k.size:
            return
        b, row, n = self.base, self.row, self.n
        k_end = int(self.k[-1])
        lo = k_end - n if self.m0 == NO_BUCKET else max(self.m0, k_end - n)
        xs = np.arange(lo, k_end + 1, dtype=np.int64)
        j = self.j_now[np.searchsorted(self.buckets, xs, side="left")]
        s, c = cs[j], cc[j]
        if self.m0 != NO_BUCKET:
            sel = xs <= self.m0
            s[sel], c[sel] = self._state_values(xs[sel])
        b.sums[row, xs[:-1] % n] = s[:-1]
        b.counts[row, xs[:-1] % n] = c[:-1]
        b.start_sum[row] = float(s[-1])
        b.start_count[row] = int(c[-1])
        b.bucket[row] = k_end
        b.total[row] = float(cs[-1])
        b.n_total[row] = int(cc[-1])
