"""The limit rule's short cut for a side beyond now and then but never for its on-delay
(`rules._reaches`) agrees with the runs' starts it stands in for (`run_starts`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.engine.rules import _reaches, run_starts
from tests.engine_helpers import T0


@pytest.mark.parametrize("seed", range(60))
def test_reaches_is_what_run_starts_says(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    times = T0 + np.cumsum(rng.choice([1.0, 10.0, 29.0, 30.0, 31.0], n))
    member = rng.random(n) < rng.choice([0.1, 0.5, 0.9])
    carried = math.nan if seed % 3 == 0 else float(times[0] - rng.choice([0.0, 5.0, 40.0]))
    delay = float(rng.choice([10.0, 30.0, 60.0]))
    starts = run_starts(times, member, carried)
    reached, open_start = _reaches(times, member, carried, delay)
    assert reached == bool((member & (times - starts >= delay)).any())
    expected = float(starts[-1]) if member[-1] else math.nan
    assert open_start == expected or (math.isnan(open_start) and math.isnan(expected))
