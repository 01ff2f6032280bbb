"""The figures of an incident, from its samples and its condition's threshold.

Everything is computed from the samples (the frozen evidence) and the threshold the
condition reported, never from the engine's internals, so the figures mean the same
whatever the engine does inside, and live and replay agree by construction.

- end: the first good sample back within the threshold after the last one beyond it
  (the alarm's clear, after a deadband and off-delay, is recorded as `clear_time`).
- start: the first good sample of the run beyond the threshold that ends at the
  alarm (walking back over good samples while they stay beyond and no gap exceeds
  the rule's `max_sample_gap`); not the alarm time, which is 15 min later for a slug.
- baseline: for a slug, threshold / factor (the 24 h average the engine judged
  against); for a limit, the mean of the good samples in the 24 h before the start.
- integrals (mean, excess volume, excess mass) are trapezoids between consecutive
  good samples in [start, end]; an interval longer than `max_gap` is not bridged
  (it counts against the coverage instead).
- coverage: good samples present in [start, end] over the samples the sensor's
  usual interval (the median spacing in the 24 h before the start) would give.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from monitor.incidents.model import Figures
from monitor.units import conversion

Floats = npt.NDArray[np.float64]
LITRES_PER_GALLON = 3.785411784
GALLONS_PER_FT3 = 7.480519480519481
MG_PER_LB = 453_592.37


@dataclass(frozen=True, slots=True)
class Series:
    """Good samples of one sensor in time order."""

    t: Floats
    v: Floats

    @staticmethod
    def of(t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> Series:
        good = (q == 0) & np.isfinite(v)
        order = np.argsort(t[good], kind="stable")
        return Series(t[good][order], v[good][order])

    @staticmethod
    def of_sorted(t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> Series:
        """`of` for samples already in time order (the recent buffer's): no sort."""
        good = (q == 0) & np.isfinite(v)
        return Series(t[good], v[good])

    def between(self, a: float, b: float) -> Series:
        """Samples with a <= t <= b."""
        i, j = np.searchsorted(self.t, a, "left"), np.searchsorted(self.t, b, "right")
        return Series(self.t[i:j], self.v[i:j])

    def before(self, a: float, b: float) -> Series:
        """Samples with a <= t < b."""
        i, j = np.searchsorted(self.t, a, "left"), np.searchsorted(self.t, b, "left")
        return Series(self.t[i:j], self.v[i:j])


def run_start(s: Series, alarm_time: float, threshold: float, high: bool, max_gap: float) -> float:
    """Time of the first sample of the beyond-threshold run that ends at `alarm_time`."""
    i = int(np.searchsorted(s.t, alarm_time, "right")) - 1
    if i < 0:
        return alarm_time
    beyond = s.v[: i + 1] > threshold if high else s.v[: i + 1] < threshold
    gap = np.concatenate(([True], np.diff(s.t[: i + 1]) > max_gap))
    breaks = np.flatnonzero(~beyond)
    first = int(breaks[-1]) + 1 if breaks.size else 0
    gaps = np.flatnonzero(gap[: i + 1])
    gaps = gaps[gaps > first]
    if gaps.size:
        first = int(gaps[-1])
    if first > i:
        return alarm_time  # the alarm sample itself is not beyond (a reconcile clear, say)
    return float(s.t[first])


def run_end(s: Series, clear_time: float, threshold: float, high: bool) -> float:
    """Time of the first sample back within the threshold after the last one beyond it, up
    to the clear (a limit's deadband and off-delay clear the alarm later than that)."""
    j = int(np.searchsorted(s.t, clear_time, "right"))
    beyond = s.v[:j] > threshold if high else s.v[:j] < threshold
    last = np.flatnonzero(beyond)
    if not last.size or int(last[-1]) + 1 >= j:
        return clear_time
    return float(s.t[int(last[-1]) + 1])


Fetch = Callable[[float, float], tuple[Floats, Floats, npt.NDArray[np.int8]]]


def run_end_since(fetch: Fetch, after: float, clear_time: float, threshold: float, high: bool) -> float:
    """`run_end` over the samples `fetch(after, clear_time)` gives (after < t <= clear, in time order),
    fetching only a window back from the clear: just the last sample beyond the threshold
    and the one after it matter, so the window widens until it holds one beyond (or reaches
    `after`). The same answer, without copying a day-long merged incident at every clear."""
    span = 3600.0
    while True:
        since = max(after, clear_time - span)
        t, v, q = fetch(since, clear_time)
        # `run_end` over the good samples (all at or before the clear), without copying them
        good = (q == 0) & np.isfinite(v)
        beyond = good & (v > threshold if high else v < threshold)
        at = np.flatnonzero(beyond)
        if since <= after or at.size:
            if not at.size:
                return clear_time
            later = np.flatnonzero(good[int(at[-1]) + 1 :])
            return float(t[int(at[-1]) + 1 + int(later[0])]) if later.size else clear_time
        span *= 8


def run_ends(
    t: Floats,
    v: Floats,
    q: npt.NDArray[np.int8],
    after: float,
    clears: Floats,
    threshold: float,
    high: bool,
) -> Floats:
    """`run_end_since` for many clears of one incident at once, over one time-ordered
    buffer: for each clear, the first good sample after the last good one beyond the
    threshold in (after, clear], else the clear itself. A chattering alarm clears
    thousands of times in a replay step; this is one pass instead of a search each."""
    out = np.array(clears, np.float64)
    if not out.size:
        return out
    i0 = int(np.searchsorted(t, after, "right"))
    j = np.searchsorted(t, out, "right") - i0  # per clear: the window is [i0, i0 + j)
    top = int(j.max())
    if top <= 0:
        return out
    tt, vv, qq = t[i0 : i0 + top], v[i0 : i0 + top], q[i0 : i0 + top]
    good = (qq == 0) & np.isfinite(vv)
    beyond = np.flatnonzero(good & (vv > threshold if high else vv < threshold))
    goods = np.flatnonzero(good)
    k = np.searchsorted(beyond, j, "left") - 1  # the last beyond before each window's end
    has = k >= 0
    if not has.any() or not goods.size:
        return out
    last = beyond[k[has]]
    p = np.searchsorted(goods, last, "right")  # the first good one after it
    found = p < goods.size
    nxt = goods[np.minimum(p, goods.size - 1)]
    found &= nxt < j[has]
    at = np.flatnonzero(has)[found]
    out[at] = tt[nxt[found]]
    return out


def usual_interval(s: Series, before: float, window: float) -> float | None:
    """The sensor's usual sampling interval: the median spacing in `window` before `before`."""
    w = s.before(before - window, before)
    if w.t.size < 3:
        return None
    d = np.diff(w.t)
    d = d[d > 0]
    return median(d) if d.size else None


def median(x: Floats) -> float:
    """`np.median` of a non-empty array without NaN, as it computes it (the middle one, or
    the mean of the middle two, after a partition) without its wrappers and NaN check: a
    third of its time (190 -> 70 us for a day at 10 s), taken at each refresh and freeze of
    an incident, and no import of numpy.ma on first use."""
    k = x.size // 2
    if x.size % 2:
        return float(np.partition(x, k)[k])
    part = np.partition(x, (k - 1, k))
    return float((part[k - 1] + part[k]) / 2)


def mean_before(s: Series, start: float, window: float) -> float | None:
    w = s.before(start - window, start)
    return float(w.v.mean()) if w.v.size else None


def _trapezoid(t: Floats, y: Floats, max_gap: float) -> tuple[float, float]:
    """(integral of y dt, seconds covered), not bridging intervals longer than max_gap."""
    if t.size < 2:
        return 0.0, 0.0
    dt = np.diff(t)
    ok = dt <= max_gap
    area = (y[1:] + y[:-1]) * 0.5 * dt
    return float(area[ok].sum()), float(dt[ok].sum())


def compute(
    s: Series,
    *,
    start: float,
    until: float,
    baseline: float | None,
    high: bool,
    max_gap: float,
    interval: float | None,
    flow_unit: str | None = None,
    paired_flow: tuple[Series, str] | None = None,
) -> Figures:
    """Figures over [start, until]: `flow_unit` for a flow sensor (excess volume),
    `paired_flow` (flow series, its unit) for a concentration in mg/L (excess mass)."""
    w = s.between(start, until)
    if not w.t.size:
        return Figures(start=start, baseline=baseline, coverage=0.0)
    k = int(np.argmax(w.v)) if high else int(np.argmin(w.v))
    peak, peak_t = float(w.v[k]), float(w.t[k])
    area, covered = _trapezoid(w.t, w.v, max_gap)
    mean = area / covered if covered > 0 else float(w.v.mean())
    usable = baseline is not None and math.isfinite(baseline) and baseline != 0
    volume_gal = volume_ft3 = mass = None
    if flow_unit is not None and baseline is not None:
        excess, _ = _trapezoid(w.t, w.v - baseline, max_gap)
        litres = excess * conversion(flow_unit, "L/s")[0]
        volume_gal = litres / LITRES_PER_GALLON
        volume_ft3 = volume_gal / GALLONS_PER_FT3
    if paired_flow is not None and baseline is not None:
        flow, unit = paired_flow
        f = flow.between(start - max_gap, until + max_gap)
        if f.t.size:
            q = np.interp(w.t, f.t, f.v * conversion(unit, "L/s")[0], left=np.nan, right=np.nan)
            ok = np.isfinite(q)
            mg, _ = _trapezoid(w.t[ok], (w.v[ok] - baseline) * q[ok], max_gap)  # mg/L x L/s
            mass = mg / MG_PER_LB
    coverage = None
    if interval is not None and interval > 0:
        expected = (until - start) / interval + 1.0
        coverage = min(1.0, w.t.size / expected) if expected > 0 else 1.0
    return Figures(
        start=start,
        baseline=baseline,
        peak_value=peak,
        peak_time=peak_t,
        peak_multiple=peak / baseline if usable and baseline is not None else None,
        mean_multiple=mean / baseline if usable and baseline is not None else None,
        excess_volume_gal=volume_gal,
        excess_volume_ft3=volume_ft3,
        excess_mass_lb=mass,
        coverage=coverage,
        samples=int(w.t.size),
    )
