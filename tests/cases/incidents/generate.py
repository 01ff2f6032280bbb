"""Writes the golden incident cases (input.csv, expected.json) from closed forms.

The expected figures are computed here from the generating functions by the
ordinance's definitions, not by the code under test: the start is the first sample
beyond the threshold, the baseline the mean of the normal samples of the 24 h
before, the excess volume and mass the integrals of the closed form (1 s steps).

    python tests/cases/incidents/generate.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
T0 = 1780444800.0  # 2026-06-03T00:00:00Z
STEP = 60.0
HOURS = 34
LITRES_PER_GALLON = 3.785411784
GPM_TO_LPS = LITRES_PER_GALLON / 60.0
MG_PER_LB = 453_592.37


def bump(t: np.ndarray, start: float, ramp: float, plateau: float, height: float) -> np.ndarray:
    """0 before `start`, a cosine ramp up over `ramp`, `height` for `plateau`, a cosine ramp down."""
    u = t - start
    up = np.clip(u / ramp, 0.0, 1.0)
    down = np.clip((u - ramp - plateau) / ramp, 0.0, 1.0)
    return height * ((1 - np.cos(math.pi * up)) / 2 - (1 - np.cos(math.pi * down)) / 2)


SLUG_AT = T0 + 26 * 3600 + 30.0
OIL_AT = T0 + 30 * 3600 + 15.0


def flow(t: np.ndarray) -> np.ndarray:
    out: np.ndarray = (
        100.0 + 3.0 * np.sin(2 * math.pi * t / 7200.0) + bump(t, SLUG_AT, 1200.0, 3 * 3600.0, 600.0)
    )
    return out


def oil(t: np.ndarray) -> np.ndarray:
    out: np.ndarray = 20.0 + 1.0 * np.sin(2 * math.pi * t / 3600.0) + bump(t, OIL_AT, 600.0, 3600.0, 130.0)
    return out


def run_of(t: np.ndarray, v: np.ndarray, threshold: float, after: float) -> tuple[float, float]:
    """(first sample beyond, first sample back within) after `after`."""
    beyond = (v > threshold) & (t > after)
    i = int(np.flatnonzero(beyond)[0])
    j = i + int(np.flatnonzero(~beyond[i:])[0])
    return float(t[i]), float(t[j])


def fine_integral(f, a: float, b: float) -> float:  # type: ignore[no-untyped-def]
    x = np.arange(a, b + 0.5, 1.0)
    x[-1] = b
    y = f(x)
    return float(np.trapezoid(y, x))


def main() -> None:
    t = T0 + STEP * np.arange(HOURS * 3600 // STEP + 1)
    q, c = flow(t), oil(t)
    case = HERE / "slug-and-oil"
    with (case / "input.csv").open("w", encoding="utf-8") as fh:
        fh.write("time,sensor,value\n")
        for ti, qi, ci in zip(t.tolist(), q.tolist(), c.tolist(), strict=True):
            fh.write(f"{ti:.0f},outfall.flow,{qi:.6f}\n{ti:.0f},outfall.oil,{ci:.6f}\n")

    # Flow slug: the ordinance's 24 h average of normal operation (samples not more than
    # 5x it) before the start; the start is the first sample above 5x that average.
    base_q = 100.0
    for _ in range(5):
        start, end = run_of(t, q, 5 * base_q, SLUG_AT - 3600)
        normal = (t >= start - 86400) & (t < start) & (q <= 5 * base_q)
        base_q = float(q[normal].mean())
    peak = float(q[(t >= start) & (t < end)].max())
    excess_gal = fine_integral(lambda x: (flow(x) - base_q) * GPM_TO_LPS, start, end) / LITRES_PER_GALLON
    mean_q = fine_integral(flow, start, end) / (end - start)
    slug = {
        "sensor": "outfall.flow",
        "rule": "slug",
        "start": start,
        "end": end,
        "baseline": base_q,
        "peak_value": peak,
        "peak_multiple": peak / base_q,
        "mean_multiple": mean_q / base_q,
        "excess_volume_gal": excess_gal,
        "excess_volume_ft3": excess_gal / 7.480519480519481,
    }

    # Oil above its §139-15 D(2) limit of 100 mg/L; excess mass with the outfall flow
    start, end = run_of(t, c, 100.0, OIL_AT - 3600)
    before = (t >= start - 86400) & (t < start)
    base_c = float(c[before].mean())
    peak = float(c[(t >= start) & (t < end)].max())
    mass_mg = fine_integral(lambda x: (oil(x) - base_c) * flow(x) * GPM_TO_LPS, start, end)
    mean_c = fine_integral(oil, start, end) / (end - start)
    high = {
        "sensor": "outfall.oil",
        "rule": "high",
        "start": start,
        "end": end,
        "baseline": base_c,
        "peak_value": peak,
        "peak_multiple": peak / base_c,
        "mean_multiple": mean_c / base_c,
        "excess_mass_lb": mass_mg / MG_PER_LB,
    }
    (case / "expected.json").write_text(json.dumps([slug, high], indent=2) + "\n", encoding="utf-8")


PH_AT = T0 + 27 * 3600 + 20.0


def ph(t: np.ndarray) -> np.ndarray:
    out: np.ndarray = 7.2 + 0.3 * np.sin(2 * math.pi * t / 86400.0) - bump(t, PH_AT, 900.0, 2 * 3600.0, 3.6)
    return out


def ph_case() -> None:
    """pH below the §139-15 C(3) low limit of 5.0 for about 2 h, with a 60 s on-delay; the
    analyser drops readings (every 7th is missing) and reports its error value 99.0 twice."""
    t = T0 + STEP * np.arange(31 * 3600 // STEP + 1)
    v = ph(t)
    keep = np.arange(t.size) % 7 != 3
    bad = np.zeros(t.size, dtype=bool)
    bad[[1700, 1705]] = True  # inside the excursion
    case = HERE / "ph-low-gaps"
    with (case / "input.csv").open("w", encoding="utf-8") as fh:
        fh.write("time,sensor,value\n")
        for ti, vi, k, b in zip(t.tolist(), v.tolist(), keep.tolist(), bad.tolist(), strict=True):
            if k:
                fh.write(f"{ti:.0f},outfall.ph,{99.0 if b else vi:.6f}\n")
    good = keep & ~bad
    tg, vg = t[good], v[good]
    below = (vg < 5.0) & (tg > PH_AT - 3600)
    i = int(np.flatnonzero(below)[0])
    j = i + int(np.flatnonzero(~below[i:])[0])
    start, end = float(tg[i]), float(tg[j])
    base = float(vg[(tg >= start - 86400) & (tg < start)].mean())
    inside = (tg >= start) & (tg <= end)
    peak = float(vg[(tg >= start) & (tg < end)].min())
    mean = fine_integral(ph, start, end) / (end - start)
    expected = {
        "sensor": "outfall.ph",
        "rule": "low",
        "start": start,
        "end": end,
        "baseline": base,
        "peak_value": peak,
        "peak_multiple": peak / base,
        "mean_multiple": mean / base,
        "coverage": float(inside.sum()) / ((end - start) / STEP + 1),
    }
    (case / "expected.json").write_text(json.dumps([expected], indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
    ph_case()
