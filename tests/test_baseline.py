"""The bucketed window mean equals a brute-force mean over the same buckets, for random
streams with gaps, on both the live and the batch path; memory stays within 32 KB a sensor."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.engine import together
from monitor.engine.baseline import MAX_BUCKETS, Baselines, geometry, quantum_for
from monitor.engine.slug import step
from tests.examples import examples

T0 = 1_780_000_000.0
SCALE = 1e5  # the largest value a row's sensor can report; sums count in quanta of it
QUANTUM = quantum_for(SCALE)  # 2^-13: each value is exact to half of this


@st.composite
def streams(draw: st.DrawFn) -> tuple[float, np.ndarray, np.ndarray]:
    window = draw(st.sampled_from([120.0, 600.0, 3600.0, 86400.0, 3 * 86400.0]))
    n = draw(st.integers(1, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # mostly steady, with gaps of minutes, hours and longer than the window
    steps = rng.choice(
        [0.5, 7.0, 60.0, 300.0, 5000.0, 2 * window], size=n, p=[0.3, 0.3, 0.2, 0.1, 0.07, 0.03]
    )
    times = T0 + draw(st.floats(0, 59)) + np.cumsum(steps)
    values = np.round(rng.lognormal(3, 1.5, n), draw(st.integers(0, 6)))
    return window, times, values


def brute_mean(width: float, size: int, times: np.ndarray, values: np.ndarray, k: int) -> float | None:
    buckets = np.floor(times / width).astype(np.int64)
    sel = (buckets >= k - size) & (buckets <= k - 1)
    return float(np.mean(values[sel])) if sel.any() else None


@settings(max_examples=examples(120), deadline=None)
@given(stream=streams())
def test_live_mean_equals_brute_force(stream: tuple[float, np.ndarray, np.ndarray]) -> None:
    window, times, values = stream
    base = Baselines([window], [SCALE])
    width, size = geometry(window)
    for i, (t, v) in enumerate(zip(times.tolist(), values.tolist(), strict=True)):
        step(None, base, 0, t, v)
        expected = brute_mean(width, size, times[: i + 1], values[: i + 1], int(np.floor(t / width)))
        got = base.mean(0)
        if expected is None:
            assert got is None
        else:
            assert got == pytest.approx(expected, rel=1e-9, abs=QUANTUM)
    # the per-bucket view of the ring agrees with a histogram of the window
    sums, counts = base.buckets(0)
    k = int(np.floor(times[-1] / width))
    b = np.floor(times / width).astype(np.int64)
    sel = (b >= k - size) & (b < k)
    assert np.array_equal(counts, np.bincount(b[sel] - (k - size), minlength=size))
    assert sums == pytest.approx(
        np.bincount(b[sel] - (k - size), values[sel], minlength=size), rel=1e-9, abs=QUANTUM * times.size
    )


def _state(base: Baselines) -> tuple[object, ...]:
    """What a ring holds and its running totals, comparable with ==."""
    return (
        base.sums.tolist(),
        base.counts.tolist(),
        base.cur_sum,
        base.cur_count,
        base.win_sum,
        base.win_count,
        base.bucket,
    )


@settings(max_examples=examples(120), deadline=None)
@given(stream=streams(), cut=st.floats(0, 1))
def test_batch_means_equal_brute_force_and_live(
    stream: tuple[float, np.ndarray, np.ndarray], cut: float
) -> None:
    window, times, values = stream
    width, size = geometry(window)
    live = Baselines([window], [SCALE])
    batch = Baselines([window], [SCALE])
    i = int(cut * times.size)
    for t, v in zip(times[:i].tolist(), values[:i].tolist(), strict=True):
        step(None, live, 0, t, v)
        step(None, batch, 0, t, v)
    win = batch.batch(0, times[i:])
    cs, cc = win.prefix(win.quantize(values[i:]), None)
    mean, _ = win.means(cs, cc)
    per_sample = win.expand(mean)
    win.commit(cs, cc)
    for j in range(i, times.size):
        k = int(np.floor(times[j] / width))
        expected = brute_mean(width, size, times[:j], values[:j], k)  # samples of earlier buckets only
        if expected is None:
            assert np.isnan(per_sample[j - i])
        else:
            assert per_sample[j - i] == pytest.approx(expected, rel=1e-9, abs=QUANTUM)
        step(None, live, 0, float(times[j]), float(values[j]))
    # and the batch left exactly the state the live path did
    assert _state(live) == _state(batch)


@settings(max_examples=examples(120), deadline=None)
@given(stream=streams(), cut=st.floats(0, 1))
def test_absorb_leaves_the_state_of_the_live_path(
    stream: tuple[float, np.ndarray, np.ndarray], cut: float
) -> None:
    """A row no rule judges commits only its batch's last buckets (`absorb` skips the
    older samples): the ring and totals are still exactly what the live path leaves."""
    window, times, values = stream
    live = Baselines([window], [SCALE])
    batch = Baselines([window], [SCALE])
    i = int(cut * times.size)
    for t, v in zip(times[:i].tolist(), values[:i].tolist(), strict=True):
        step(None, batch, 0, t, v)
    for t, v in zip(times.tolist(), values.tolist(), strict=True):
        step(None, live, 0, t, v)
    batch.absorb(0, times[i:], values[i:])
    assert _state(live) == _state(batch)


@settings(max_examples=examples(120), deadline=None)
@given(stream=streams(), cuts=st.lists(st.floats(0, 1), max_size=4))
def test_commit_advancing_the_ring_equals_rebuilding_it(
    stream: tuple[float, np.ndarray, np.ndarray], cuts: list[float]
) -> None:
    """A batch's commit clears and writes only the slots it passes over (`advance`): the
    state after each batch is what rebuilding the last n + 1 buckets in time order gives."""
    window, times, values = stream
    fast = Baselines([window], [SCALE])
    slow = Baselines([window], [SCALE])
    edges = sorted({0, times.size, *(int(c * times.size) for c in cuts)})
    for a, b in itertools.pairwise(edges):
        for base, rebuild in ((fast, False), (slow, True)):
            win = base.batch(0, times[a:b])
            cs, cc = win.prefix(win.quantize(values[a:b]), None)
            win.commit(cs, cc, rebuild=rebuild)
        assert _state(fast) == _state(slow)


@pytest.mark.parametrize("window", [120.0, 600.0, 3600.0])
@pytest.mark.parametrize("size", [1, 3, 5, 20, 60, 150])
def test_commit_advancing_the_ring_equals_rebuilding_it_at_every_cut(window: float, size: int) -> None:
    """Batches of every size from a steady stream (and one gap longer than the window):
    each advance from each ring position leaves the state a rebuild leaves."""
    times = T0 + np.cumsum(np.where(np.arange(900) == 500, 2 * window + 7, 7.0))
    values = ((np.arange(times.size) % 13 + 1.0) * 1.25).astype(np.float64)
    fast = Baselines([window], [SCALE])
    slow = Baselines([window], [SCALE])
    for a in range(0, times.size, size):
        for base, rebuild in ((fast, False), (slow, True)):
            win = base.batch(0, times[a : a + size])
            cs, cc = win.prefix(win.quantize(values[a : a + size]), None)
            win.commit(cs, cc, rebuild=rebuild)
        assert _state(fast) == _state(slow)


@settings(max_examples=examples(120), deadline=None)
@given(
    stream=streams(),
    cuts=st.lists(st.floats(0, 1), max_size=5),
    other=st.sampled_from([120.0, 600.0, 86400.0]),
)
def test_rows_committed_together_leave_the_state_of_the_live_path(
    stream: tuple[float, np.ndarray, np.ndarray], cuts: list[float], other: float
) -> None:
    """Rows without a slug rule committed together from one 2-D array of a batch
    (`together._settle`: grouped by geometry, running totals in int64), batch after batch
    with one `Scratch` of every size: each row's ring is what the live path leaves. Three
    rows: two of the stream's window (one group, values of other scales) and one of another."""
    window, times, values = stream
    windows = [window, other, window]
    rows = np.vstack((values, np.round(values * 3.5, 2), -np.round(values / 7.0, 3)))
    live = Baselines(windows, [SCALE] * 3)
    together_ = Baselines(windows, [SCALE] * 3)
    scratch = together.Scratch()
    edges = sorted({0, times.size, *(int(c * times.size) for c in cuts)})
    for a, b in itertools.pairwise(edges):
        t = times[a:b]
        steps = t[1:] - t[:-1]
        max_step = float(steps.max()) if steps.size else -math.inf
        done = together._settle(
            together_, t, max_step, rows[:, a:b], [0, 1, 2], [0, 1, 2], [None] * 3, scratch
        )
        assert done == [True, True, True]  # each row's batch went through the 2-D commit
        for r in range(3):
            for ti, vi in zip(t.tolist(), rows[r, a:b].tolist(), strict=True):
                step(None, live, r, ti, vi)
        assert _state(live) == _state(together_)


@pytest.mark.parametrize(
    ("window", "width", "size"),
    [(86400.0, 60.0, 1440), (3600.0, 60.0, 60), (90.0, 60.0, 2), (7 * 86400.0, 420.0, 1440)],
)
def test_geometry_keeps_minute_buckets_and_the_memory_bound(window: float, width: float, size: int) -> None:
    assert geometry(window) == (width, size)
    base = Baselines([window] * 10)
    assert base.sums.shape == (10, MAX_BUCKETS)
    assert base.nbytes / 10 <= 32 * 1024
