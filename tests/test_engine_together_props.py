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
from monitor.model import Condition, ManualClock
from tests.engine_helpers import T0, as_samples, canon, live, station
from tests.examples import examples
from tests.test_engine_replay import CONFIG, EDGES, PLAIN
from tests.test_engine_together import _state

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
    {"id": "oil", "kind": "concentration", "substance": "oil", "slug": {"window": "5m", "warmup": "0s"}},
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
        [0.0, 5.0, 10.0, 30.0, 60.0, 200.0, 400.0, 8000.0],
        size=steps,
        p=[0.01, 0.2, 0.5, 0.1, 0.1, 0.04, 0.04, 0.01],
    )
    t = T0 + np.cumsum(dt) + draw(st.sampled_from([0.0, 0.5, 59.75]))
    values = _values(rng, config, steps, draw(st.sampled_from([0.0, 0.005, 0.05])))
    quality = np.where(rng.random(values.shape) < rng.choice([0.0, 0.002, 0.02]), rng.choice([1, 2]), 0)
    cuts = np.sort(
        rng.choice(np.arange(1, steps + 1), size=min(steps, int(rng.integers(1, 12))), replace=False)
    )
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
            at = k + int(rng.integers(0, s))
            sensor, time = np.insert(sensor, at, sensor[at]), np.insert(time, at, time[at])
            value, q = np.insert(value, at, value[at]), np.insert(q, at, q[at])
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


def _reversed(batch: Batch, sensors: int) -> Batch:
    """Each step's sensors reversed (a step: the k-th sample of each sensor at one time; two
    steps may share a time): the same samples in the same time order, not time-major."""
    sensor, time, value, quality = batch
    if sensors == 1:
        return batch
    seen: dict[tuple[float, int], int] = {}
    rank = np.empty(time.size, np.int64)
    for j, key in enumerate(zip(time.tolist(), sensor.tolist(), strict=True)):
        rank[j] = seen[key] = seen.get(key, -1) + 1
    order = np.lexsort((-np.arange(time.size), rank, time))
    return sensor[order], time[order], value[order], quality[order]


def _run(
    config: Config, batches: list[Batch], ckpt: int | None, path: Path, reverse: bool
) -> tuple[Engine, list[Condition]]:
    """Each batch through `Engine.replay` (reversed: the per-sensor path), with a checkpoint
    saved and restored into a fresh engine before batch `ckpt`."""
    engine = Engine(config.rules, ManualClock())
    out: list[Condition] = []
    for i, batch in enumerate(batches):
        if i == ckpt:
            save_checkpoint(engine, path)
            engine = Engine(config.rules, ManualClock())
            restore_checkpoint(engine, path)
        sensor, time, value, quality = _reversed(batch, len(config.sensors)) if reverse else batch
        # A batch all GOOD given as a source without qualities gives (every other one).
        given_q = None if i % 2 and not quality.any() else quality
        out += engine.replay(sensor, time, value, given_q).conditions
    return engine, out


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
        a, got = _run(config, batches, ckpt, tmp_path / "a.npz", reverse=False)
        spying[0] = False
        b, alone = _run(config, batches, ckpt, tmp_path / "b.npz", reverse=True)
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
