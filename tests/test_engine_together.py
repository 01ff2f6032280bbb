"""Sensors judged together (`monitor/engine/together.py`): a time-major batch with one time
per step leaves the same conditions, states and baselines as each sensor judged alone."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from monitor.engine import Engine, replay_steps, together
from monitor.model import ManualClock
from tests.engine_helpers import T0, canon, station

CONFIG = station(
    {
        "id": "flow",
        "kind": "flow",
        "unit": "gpm",
        "slug": {"window": "30m", "warmup": "10m", "duration": "3m", "max_sample_gap": "2m", "factor": 3},
        "stale_after": "4m",
    },
    {"id": "oil", "kind": "concentration", "substance": "oil", "slug": {"window": "20m", "warmup": "0s"}},
    {"id": "ph", "kind": "ph", "limits": {"deadband": 0.2, "on_delay": "20s"}, "stale_after": "3m"},
    {"id": "temp", "kind": "temperature", "unit": "degF", "bad_values": [-1.0]},
    {"id": "meter", "kind": "meter", "unit": "ft3"},
)
SENSORS = len(CONFIG.sensors)


def _stream(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Time-major steps of 10 s (now and then a gap longer than a window), slugs, a few
    bad values and qualities: most batches quiet, some not."""
    rng = np.random.default_rng(seed)
    steps = 3000
    dt = rng.choice(
        [10.0, 10.0, 10.0, 10.0, 60.0, 2400.0], size=steps, p=[0.9, 0.02, 0.02, 0.02, 0.0395, 0.0005]
    )
    t = T0 + np.cumsum(dt)
    level = np.where(np.cumsum(rng.random(steps) < 0.01) % 2 == 1, 6.0, 1.0)
    values = np.column_stack(
        (
            np.round(100 * level * rng.uniform(0.8, 1.2, steps), 1),
            np.round(20 * rng.uniform(0.5, 1.5, steps), 2),
            np.round(rng.uniform(4.0, 10.0, steps), 1),
            np.round(rng.uniform(140.0, 160.0, steps)),
            np.round(rng.uniform(0, 1e4, steps)),
        )
    )
    bad = rng.random(values.shape) < 0.0005
    values[bad] = rng.choice([np.nan, -1.0, 1e9], size=int(bad.sum()))
    quality = np.where(rng.random(values.shape) < 0.0005, 2, 0)
    sensor = np.tile(np.arange(SENSORS), steps)
    return sensor, np.repeat(t, SENSORS), values.ravel(), quality.ravel()


def spy_settled(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`together.settle` watched: each call's count of sensors settled together, so a test
    can assert the 2-D path was taken."""
    settle = together.settle
    settled: list[int] = []

    def spy(*args: object, **kwargs: object) -> list[bool]:
        done = settle(*args, **kwargs)  # type: ignore[arg-type]
        settled.append(sum(done))
        return done

    monkeypatch.setattr(together, "settle", spy)
    return settled


def _state(engine: Engine) -> list[object]:
    base = engine.baselines
    out: list[object] = [base.sums.tobytes(), base.counts.tobytes(), base.bucket, base.cur_sum]
    out += [base.cur_count, base.win_sum, base.win_count, engine.counters]
    for st in engine.sensor_states():
        out.append([repr(getattr(st, a)) for a in st.__slots__ if a not in ("rules", "limits", "slug")])
        if st.slug is not None:
            out.append([repr(getattr(st.slug, a)) for a in st.slug.__slots__])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_sensors_judged_together_equal_each_alone(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sensor, time, value, quality = _stream(seed)
    settled = spy_settled(monkeypatch)
    batch = int(np.random.default_rng(seed).integers(100, 600))
    a = Engine(CONFIG.rules, ManualClock())
    got = [c for s in replay_steps(a, sensor, time, value, quality, batch_size=batch) for c in s.conditions]
    assert sum(settled) > 0  # the batches went through `together`
    # Each step's sensors in reverse: not time-major, every sensor judged on its own.
    swap = np.arange(time.size).reshape(-1, SENSORS)[:, ::-1].ravel()
    b = Engine(CONFIG.rules, ManualClock())
    calls = len(settled)
    alone = replay_steps(b, sensor[swap], time[swap], value[swap], quality[swap], batch_size=batch)
    expected = [c for s in alone for c in s.conditions]
    assert len(settled) == calls
    assert canon(got) == canon(expected)
    assert _state(a) == _state(b)


def test_whole_takes_only_batches_admitted_whole_and_good() -> None:
    """A NaN, a quality other than GOOD, a device error value to look for, or a first time
    not after the sensor's last one: that sensor's batch goes through `_admit`."""
    engine = Engine(CONFIG.rules, ManualClock())
    states = engine.sensor_states()
    t: npt.NDArray[np.float64] = T0 + 10.0 * np.arange(4.0)
    values = np.tile(np.array([[100.0], [20.0], [7.0], [150.0], [5.0]]), 4)
    assert together.whole(states, t, values, None) == [True, True, True, False, True]  # temp: bad_values
    values[0, 2] = math.nan
    quality = np.zeros((4, SENSORS), np.int8)
    quality[3, 1] = 2
    states[2].last_time = float(t[0])
    assert together.whole(states, t, values, quality) == [False, False, False, False, True]
