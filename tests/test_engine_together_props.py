"""The 2-D path of time-major batches (`monitor/engine/together.py`) against the live path and
the per-sensor path, over generated streams that take it (asserted by counting what it
settled): batches that almost qualify (a sensor missing, twice or out of place at one step,
a step that repeats a time), steps back, gaps, restarts, edge values, batches of every size,
and a checkpoint saved and restored between batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import Config
from monitor.engine import Engine, restore_checkpoint, save_checkpoint, together
from monitor.engine import engine as engine_module
from monitor.model import Condition, ManualClock, Rule
from tests.engine_helpers import T0, as_samples, canon, live, station
from tests.examples import examples
from tests.test_engine_replay import CONFIG, EDGES, PLAIN
from tests.test_engine_together import _state, spy_settled

# Slug sensors that are quiet from the start (warm-up 0) with two geometries, a plain row,
# a meter: most batches are settled by the 2-D path.
QUIET = station(
    {
        "id": "flow",
        "kind": "flow",
        "unit": "gpm",
        "slug": {"window": "5m", "warmup": "0s", "duration": "1m", "max_sample_gap": "2m", "factor": 3},
        "limits": {"high": 900, "unit": "gpm", "on_delay": "30s", "deadband": 50},
        "stale_after": "2m",
    },
    # A long duration: over runs that end short, their samples entering the baseline late.
    {
        "id": "oil",
        "kind": "concentration",
        "substance": "oil",
        "slug": {"window": "5m", "warmup": "0s", "duration": "5m"},
    },
    {"id": "ph", "kind": "ph", "limits": {"deadband": 0.2, "on_delay": "20s"}, "stale_after": "3m"},
    {"id": "cod", "kind": "concentration", "substance": "cod", "slug": {"window": "2h", "warmup": "1m"}},
    {"id": "meter", "kind": "meter", "unit": "ft3"},
)
# A station of one sensor (every batch time-major), and two that share one geometry (the
# rows taken as they are, no gather).
ONE = station(
    {
        "id": "flow",
        "kind": "flow",
        "unit": "gpm",
        "slug": {"window": "5m", "warmup": "0s"},
        "stale_after": "2m",
    }
)
TWO = station(
    {"id": "flow", "kind": "flow", "unit": "gpm", "slug": {"window": "5m", "warmup": "0s", "factor": 2}},
    {"id": "oil", "kind": "concentration", "substance": "oil", "slug": {"window": "5m", "warmup": "30s"}},
)
CONFIGS = {"quiet": QUIET, "config": CONFIG, "plain": PLAIN, "edges": EDGES, "one": ONE, "two": TWO}

Batch = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _values(rng: np.random.Generator, config: Config, steps: int, slugs: float) -> np.ndarray:
    """steps x sensors: each kind's usual level, now and then a slug, and a few edges."""
    level = np.where(np.cumsum(rng.random(steps) < slugs) % 2 == 1, rng.choice([2.0, 6.0]), 1.0)
    cols = []
    for s in config.sensors:
        kind = s.kind.value
        if kind == "flow":
            col = np.round(100 * level * rng.uniform(0.8, 1.2, steps), 1)
        elif kind == "ph":
            col = np.round(rng.uniform(4.0, 10.0, steps), 1)
        elif kind == "temperature":
            col = np.round(rng.uniform(140.0, 160.0, steps))
        elif kind == "meter":
            col = np.round(rng.uniform(0, 1e4, steps))
        else:
            col = np.round(20 * level * rng.uniform(0.5, 1.5, steps), 2)
        cols.append(col)
    values = np.column_stack(cols)
    edge = rng.random(values.shape) < rng.choice([0.0, 0.002, 0.02])
    values[edge] = rng.choice([np.nan, np.inf, -np.inf, -1.0, -0.0, 0.0, 1e300, 900.0, 10.0], int(edge.sum()))
    return values


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, list[Batch], int | None]:
    """A station's export cut into batches at step boundaries; some batches are nudged off
    time-major, one may step back (re-sent steps), and a checkpoint may fall between two."""
    name = draw(st.sampled_from(sorted(CONFIGS)))
    config = CONFIGS[name]
    s = len(config.sensors)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = draw(st.integers(1, 700))
    dt = rng.choice(
        # 300.25 and 600.25: a step just longer than a 5 or 10 minute window (a restart)
        # whose sample before it is still in the window's oldest bucket (its mean not empty)
        [0.0, 5.0, 10.0, 30.0, 60.0, 200.0, 300.25, 400.0, 600.25, 8000.0],
        size=steps,
        p=[0.01, 0.2, 0.48, 0.1, 0.1, 0.04, 0.01, 0.04, 0.01, 0.01],
    )
    t = T0 + np.cumsum(dt) + draw(st.sampled_from([0.0, 0.5, 59.75]))
    values = _values(rng, config, steps, draw(st.sampled_from([0.0, 0.005, 0.05])))
    quality = np.where(rng.random(values.shape) < rng.choice([0.0, 0.002, 0.02]), rng.choice([1, 2]), 0)
    cuts = np.sort(
        rng.choice(np.arange(1, steps + 1), size=min(steps, int(rng.integers(1, 12))), replace=False)
    )
    long = np.flatnonzero(dt > 100.0)
    if long.size and rng.random() < 0.7:
        # A gap at a batch's first sample (the state's restart), or at its last (the next
        # batch goes on in the bucket of a restart, whose window was empty at its start).
        at = rng.choice(long, size=min(long.size, 4), replace=False)
        cuts = np.union1d(cuts, at + rng.integers(0, 2, at.size))
        cuts = cuts[(cuts > 0) & (cuts <= steps)]
    cuts[-1] = steps
    batches: list[Batch] = []
    a = 0
    for b in cuts.tolist():
        if b <= a:
            continue
        sensor = np.tile(np.arange(s), b - a)
        time = np.repeat(t[a:b], s)
        value = values[a:b].ravel()
        q = quality[a:b].ravel()
        nudge = rng.integers(0, 8)
        k = int(rng.integers(0, b - a)) * s  # the nudged step's first sample
        if nudge == 1:  # a sensor missing at one step
            drop = k + int(rng.integers(0, s))
            keep = np.ones(time.size, bool)
            keep[drop] = False
            sensor, time, value, q = sensor[keep], time[keep], value[keep], q[keep]
        elif nudge == 2:  # a sensor twice in a step
            twice = k + int(rng.integers(0, s))
            sensor, time = np.insert(sensor, twice, sensor[twice]), np.insert(time, twice, time[twice])
            value, q = np.insert(value, twice, value[twice]), np.insert(q, twice, q[twice])
        elif nudge == 3 and s > 1:  # two sensors swapped at one step
            i, j = k, k + s - 1
            sensor[[i, j]] = sensor[[j, i]]
            value[[i, j]] = value[[j, i]]
            q[[i, j]] = q[[j, i]]
        elif nudge == 4 and s > 1:  # a step whose last sample comes a little later
            time[k + s - 1] += 0.25 if k + s >= time.size or time[k + s] > time[k] + 0.25 else 0.0
        batches.append((sensor.astype(np.int32 if nudge != 5 else np.int64), time, value, q.astype(np.int8)))
        a = b
        if rng.random() < 0.1:  # the last steps sent again (a source that re-reads)
            back = min(b, int(rng.integers(1, 20)))
            sensor = np.tile(np.arange(s), back)
            batches.append((sensor, np.repeat(t[b - back : b], s), values[b - back : b].ravel(),
                            quality[b - back : b].ravel().astype(np.int8)))  # fmt: skip
    ckpt = draw(st.none() | st.integers(0, len(batches)))
    return name, batches, ckpt


def _cut(stream: Batch, at: int) -> list[Batch]:
    """A stream as two batches, cut at sample `at`."""
    s, t, v, q = stream
    return [(s[:at], t[:at], v[:at], q[:at]), (s[at:], t[at:], v[at:], q[at:])]


def _run(
    config: Config, batches: list[Batch], ckpt: int | None, path: Path
) -> tuple[Engine, list[Condition]]:
    """Each batch through `Engine.replay`, with a checkpoint saved and restored into a fresh
    engine before batch `ckpt`."""
    engine = Engine(config.rules, ManualClock())
    out: list[Condition] = []
    for i, (sensor, time, value, quality) in enumerate(batches):
        if i == ckpt:
            save_checkpoint(engine, path)
            engine = Engine(config.rules, ManualClock())
            restore_checkpoint(engine, path)
        # A batch all GOOD given as a source without qualities gives (every other one).
        given_q = None if i % 2 and not quality.any() else quality
        out += engine.replay(sensor, time, value, given_q).conditions
    return engine, out


def _per_sensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """No batch taken as time-major: every sensor judged on its own (the path before
    together.py), the same samples in the same order."""
    monkeypatch.setattr(engine_module, "_time_major", lambda *args: False)


def test_the_2d_path_equals_the_per_sensor_path_and_live(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settle = together.settle
    settled: list[int] = []
    spying = [True]

    def spy(*args: object, **kwargs: object) -> list[bool]:
        done = settle(*args, **kwargs)  # type: ignore[arg-type]
        if spying[0]:
            settled.append(sum(done))
        return done

    monkeypatch.setattr(together, "settle", spy)

    @settings(max_examples=examples(200), deadline=None, suppress_health_check=list(HealthCheck))
    @given(scenario=scenarios())
    def check(scenario: tuple[str, list[Batch], int | None]) -> None:
        name, batches, ckpt = scenario
        config = CONFIGS[name]
        spying[0] = True
        a, got = _run(config, batches, ckpt, tmp_path / "a.npz")
        spying[0] = False
        with monkeypatch.context() as m:
            _per_sensor(m)
            b, alone = _run(config, batches, ckpt, tmp_path / "b.npz")
        assert canon(got) == canon(alone)
        assert _state(a) == _state(b)
        # Live: each sample after a tick at its time, batch after batch (restarted from the
        # same checkpoint: a restore starts the stale watch anew, and the counters at 0).
        c = Engine(config.rules, ManualClock())
        expected: list[Condition] = []
        for i, (sensor, time, value, quality) in enumerate(batches):
            if i == ckpt:
                save_checkpoint(c, tmp_path / "c.npz")
                c = Engine(config.rules, ManualClock())
                restore_checkpoint(c, tmp_path / "c.npz")
            expected += live(c, as_samples(config, sensor, time, value, quality))
        assert canon(sorted(got, key=a.sort_key)) == canon(sorted(expected, key=c.sort_key))
        assert a.counters == c.counters
        for s in a.sensors:
            assert a.status(s) == c.status(s)
        assert np.array_equal(a.baselines.sums, c.baselines.sums)
        assert np.array_equal(a.baselines.counts, c.baselines.counts)

    check()
    assert sum(settled) > 0  # the 2-D path settled sensors' batches


@pytest.mark.parametrize("over", [False, True])
def test_a_sample_exactly_at_the_slug_threshold_is_not_over_on_either_path(
    over: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A baseline of exactly 10 (whole quanta) and a factor of 2: a sample at 20 is not over
    (the 2-D path settles the batch), the next float above 20 is (its own path, the same
    pending run as live)."""
    settled = spy_settled(monkeypatch)
    s = len(TWO.sensors)
    steps = 90
    values = np.full((steps, s), 10.0)
    values[-1, 0] = np.nextafter(20.0, np.inf) if over else 20.0  # the last step: a run left open
    t = T0 + 10.0 * np.arange(1, steps + 1)
    stream = (np.tile(np.arange(s), steps), np.repeat(t, s), values.ravel(), np.zeros(steps * s, np.int8))
    cut = 70 * s
    batches = _cut(stream, cut)
    a, got = _run(TWO, batches, None, tmp_path / "a.npz")
    assert settled[-1] == (1 if over else 2)  # the flow's batch settled together unless over
    _per_sensor(monkeypatch)
    b, alone = _run(TWO, batches, None, tmp_path / "b.npz")
    c = Engine(TWO.rules, ManualClock())
    expected = live(c, as_samples(TWO, *stream))
    assert canon(got) == canon(alone) == canon(expected)
    assert _state(a) == _state(b)
    assert a.pending("flow") == b.pending("flow") == c.pending("flow") == ((Rule.SLUG,) if over else ())


@pytest.mark.parametrize("gap", [300.25, 299.75])
@pytest.mark.parametrize("inside", [False, True])
def test_a_restart_just_past_the_window_is_not_settled_quiet(
    gap: float, inside: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A step just longer than the 5 minute window (at a batch's first sample, or inside the
    batch) restarts the slug's warm-up although the sample before it is still in the window's
    oldest bucket (the mean is not empty): the 2-D path leaves such a batch to the sensor's own
    path, which moves `warm_since`; a step just shorter is no restart, and settled together."""
    s = len(TWO.sensors)
    t = T0 + 10.0 * np.arange(1, 61)
    t[40:] += gap - 10.0
    stream = (
        np.tile(np.arange(s), t.size),
        np.repeat(t, s),
        np.full(t.size * s, 10.0),
        np.zeros(t.size * s, np.int8),
    )
    cut = (35 if inside else 40) * s
    batches = _cut(stream, cut)
    settled = spy_settled(monkeypatch)
    a, _ = _run(TWO, batches, None, tmp_path / "a.npz")
    restart = gap > 300.0
    assert settled[-1] == (0 if restart else 2)
    _per_sensor(monkeypatch)
    b, _ = _run(TWO, batches, None, tmp_path / "b.npz")
    c = Engine(TWO.rules, ManualClock())
    live(c, as_samples(TWO, *stream))
    assert _state(a) == _state(b)
    for x, y, z in zip(a.sensor_states(), b.sensor_states(), c.sensor_states(), strict=True):
        assert x.slug is not None and y.slug is not None and z.slug is not None
        assert x.slug.warm_since == y.slug.warm_since == z.slug.warm_since == (t[40] if restart else t[0])


def test_a_baseline_exactly_at_the_floor_is_judged_on_either_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`min_baseline` is inclusive: a mean of exactly 10 with a floor of 10 judges the sample
    at 25 (over 2 x 10), so the 2-D path leaves the batch to the sensor's own path, whose
    run is pending as live's."""
    floor = station(
        {
            "id": "flow",
            "kind": "flow",
            "unit": "gpm",
            "slug": {"window": "5m", "warmup": "0s", "factor": 2, "min_baseline": 10},
        },
        {"id": "oil", "kind": "concentration", "substance": "oil", "slug": {"window": "5m", "warmup": "0s"}},
    )
    s = len(floor.sensors)
    steps = 90
    values = np.full((steps, s), 10.0)
    values[-1, 0] = 25.0
    t = T0 + 10.0 * np.arange(1, steps + 1)
    stream = (np.tile(np.arange(s), steps), np.repeat(t, s), values.ravel(), np.zeros(steps * s, np.int8))
    cut = 70 * s
    batches = _cut(stream, cut)
    a, got = _run(floor, batches, None, tmp_path / "a.npz")
    _per_sensor(monkeypatch)
    b, alone = _run(floor, batches, None, tmp_path / "b.npz")
    c = Engine(floor.rules, ManualClock())
    expected = live(c, as_samples(floor, *stream))
    assert canon(got) == canon(alone) == canon(expected)
    assert _state(a) == _state(b)
    assert a.pending("flow") == c.pending("flow") == (Rule.SLUG,)
