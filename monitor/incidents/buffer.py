"""Recent samples per sensor, in NumPy, for the look back an incident needs.

An incident's start and evidence lie before its alarm, so the tracker keeps recent
samples of every judged sensor: 17 bytes a sample, appended in O(1) amortised. The
buffer only grows while samples arrive; the tracker trims it between batches (never
in the middle of one, so a batch's own run is always at hand when its alarm is
judged, however long the batch). Live it keeps the qualifying run's length plus a
margin (about 46 KB for a 1 Hz sensor with the 15 min slug rule) and reads the day
before from the series store; in replay it keeps the whole day (1.5 MB at 1 Hz).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


class Recent:
    """One sensor's recent samples, in time order."""

    __slots__ = ("keep", "n", "q", "t", "v")

    def __init__(self, keep: float, capacity: int = 256) -> None:
        self.keep = keep
        self.t = np.empty(capacity, np.float64)
        self.v = np.empty(capacity, np.float64)
        self.q = np.empty(capacity, np.int8)
        self.n = 0

    @property
    def first(self) -> float:
        return float(self.t[0]) if self.n else np.inf

    @property
    def last(self) -> float:
        return float(self.t[self.n - 1]) if self.n else -np.inf

    def push(self, t: float, v: float, q: int) -> None:
        """Append one sample (the live path); not later than the last one: dropped."""
        n = self.n
        if n and t <= self.t[n - 1]:
            return
        if n == self.t.size:
            self._grow(n + 1)
        self.t[n] = t
        self.v[n] = v
        self.q[n] = q
        self.n = n + 1

    def extend(self, t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> None:
        """Append samples later than the last one (earlier ones are dropped, as the engine does)."""
        if self.n:
            later = t > self.t[self.n - 1]
            if not later.all():
                t, v, q = t[later], v[later], q[later]
        m = int(t.size)
        if not m:
            return
        if self.n + m > self.t.size:
            self._grow(self.n + m)
        self.t[self.n : self.n + m] = t
        self.v[self.n : self.n + m] = v
        self.q[self.n : self.n + m] = q
        self.n += m

    def prepend(self, t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> None:
        """Put older samples (read back from the series store) before the first one."""
        keep = t < self.first
        t, v, q = t[keep], v[keep], q[keep]
        m, n = int(t.size), self.n
        if not m:
            return
        size = max(256, 2 * (m + n))
        for name, older in (("t", t), ("v", v), ("q", q)):
            old = getattr(self, name)
            new = np.empty(size, old.dtype)
            new[:m] = older
            new[m : m + n] = old[:n]
            setattr(self, name, new)
        self.n = m + n

    def trim(self, before: float) -> None:
        """Drop the samples older than `before` (and give back memory a backfill took)."""
        n = self.n
        cut = int(np.searchsorted(self.t[:n], before, "left"))
        if not cut:
            return
        kept = n - cut
        size = self.t.size
        if size > 4 * max(kept, 64):
            size = max(256, 2 * kept)
        for name in ("t", "v", "q"):
            old = getattr(self, name)
            new = old if size == old.size else np.empty(size, old.dtype)
            new[:kept] = old[cut:n]
            setattr(self, name, new)
        self.n = kept

    def _grow(self, need: int) -> None:
        size = max(2 * self.t.size, need)
        for name in ("t", "v", "q"):
            old = getattr(self, name)
            new = np.empty(size, old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    def since(self, after: float, until: float) -> tuple[Floats, Floats, npt.NDArray[np.int8]]:
        """Copies of the samples with after < t <= until."""
        i = int(np.searchsorted(self.t[: self.n], after, "right"))
        j = int(np.searchsorted(self.t[: self.n], until, "right"))
        return self.t[i:j].copy(), self.v[i:j].copy(), self.q[i:j].copy()

    def window(self, after: float, until: float) -> tuple[Floats, Floats, npt.NDArray[np.int8]]:
        """Views of the samples with after < t <= until (valid until the next append or trim)."""
        i = int(np.searchsorted(self.t[: self.n], after, "right"))
        j = int(np.searchsorted(self.t[: self.n], until, "right"))
        return self.t[i:j], self.v[i:j], self.q[i:j]

    @property
    def nbytes(self) -> int:
        return int(self.t.nbytes + self.v.nbytes + self.q.nbytes)
