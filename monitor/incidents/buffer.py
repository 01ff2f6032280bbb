"""Recent samples per sensor, in NumPy, for the look back an incident needs.

An incident's evidence starts 24 h before its start, which is known only when the
alarm fires, so the tracker keeps the last `keep` seconds of every judged sensor:
17 bytes a sample (1.5 MB a day for a 1 Hz sensor), appended in O(1) amortised.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


class Recent:
    """One sensor's samples of the last `keep` seconds, in arrival (= time) order."""

    __slots__ = ("keep", "n", "q", "t", "v")

    def __init__(self, keep: float, capacity: int = 1024) -> None:
        self.keep = keep
        self.t = np.empty(capacity, np.float64)
        self.v = np.empty(capacity, np.float64)
        self.q = np.empty(capacity, np.int8)
        self.n = 0

    @property
    def last(self) -> float:
        return float(self.t[self.n - 1]) if self.n else -np.inf

    def push(self, t: float, v: float, q: int) -> None:
        """Append one sample (the live path); not later than the last one: dropped."""
        n = self.n
        if n and t <= self.t[n - 1]:
            return
        if n == self.t.size:
            self._make_room(1, t)
            n = self.n
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
            self._make_room(m, float(t[-1]))
        self.t[self.n : self.n + m] = t
        self.v[self.n : self.n + m] = v
        self.q[self.n : self.n + m] = q
        self.n += m

    @property
    def first(self) -> float:
        return float(self.t[0]) if self.n else np.inf

    def prepend(self, t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> None:
        """Put older samples (from the series store after a restart) before the first one."""
        keep = t < self.first
        t, v, q = t[keep], v[keep], q[keep]
        if not t.size:
            return
        n = self.n
        old = (self.t[:n].copy(), self.v[:n].copy(), self.q[:n].copy())
        self.n = 0
        self.extend(t, v, q)
        self.extend(*old)

    def _make_room(self, m: int, newest: float) -> None:
        cut = int(np.searchsorted(self.t[: self.n], newest - self.keep, "left"))
        kept = self.n - cut
        size = self.t.size
        while kept + m > size // 2 and size < 2 * (kept + m):
            size *= 2
        size = max(size, kept + m)
        for name in ("t", "v", "q"):
            old = getattr(self, name)
            new = old if size == old.size else np.empty(size, old.dtype)
            new[:kept] = old[cut : self.n]
            setattr(self, name, new)
        self.n = kept

    def since(self, after: float, until: float) -> tuple[Floats, Floats, npt.NDArray[np.int8]]:
        """Copies of the samples with after < t <= until."""
        i = int(np.searchsorted(self.t[: self.n], after, "right"))
        j = int(np.searchsorted(self.t[: self.n], until, "right"))
        return self.t[i:j].copy(), self.v[i:j].copy(), self.q[i:j].copy()
