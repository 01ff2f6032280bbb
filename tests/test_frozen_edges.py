"""The frozen-value rule at its edges, as the field and a damaged state file give them: a
band set to the instrument's last digit, a checkpoint entry that makes no sense, a kind
whose reading holds by nature, the page a person reads at night."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.engine import Engine
from monitor.model import ConditionState, ManualClock, Rule, Sample
from tests.engine_helpers import T0, canon, every, live, run_live, station

ACTIVE = ConditionState.ACTIVE

TEMP = station(
    {"id": "temp", "kind": "temperature", "unit": "degC", "frozen_after": "1h", "frozen_band": 0.1}
)


@pytest.mark.parametrize(
    "pair",
    [
        (21.5, 21.6),  # 21.6 - 21.5 is 0.10000000000000142 in binary floating point
        (1.0, 1.1),  # 0.10000000000000009
        (7.0, 7.1),  # 0.09999999999999964: was the only kind that alarmed
        (215 * 0.1, 216 * 0.1),  # an INT16 register x 0.1 (scale) toggling its last bit
        (float(np.float32(21.5)), float(np.float32(21.6))),  # a FLOAT32 register pair
    ],
)
def test_a_band_of_the_last_digit_holds_a_toggle_of_that_digit_whatever_the_value(
    pair: tuple[float, float],
) -> None:
    """`frozen_band: 0.1` on an instrument of 0.1 resolution whose last digit toggles: the
    docs say the band is for exactly that. Compared in binary floating point, 21.5 and 21.6
    are 0.10000000000000142 apart and counted a change, so a stuck 21.5/21.6 transmitter
    never alarmed, while 7.0/7.1 did: whether a stuck instrument alarmed depended on the
    value it stuck at."""
    points = every(10.0, list(pair) * 200)  # 4000 s of the toggle
    engine, out = run_live(TEMP, "temp", points)
    raised = [c for c in out if c.rule is Rule.FROZEN]
    assert [c.state for c in raised] == [ACTIVE], pair
    assert raised[0].time == T0 + 3610.0
    # The replay path gives the same (one definition).
    batch = Engine(TEMP.rules, ManualClock())
    times, values = np.array([t for t, _ in points]), np.array([v for _, v in points])
    got = batch.replay(np.zeros(len(points), np.int32), times, values)
    assert canon([c for c in got.conditions if c.rule is Rule.FROZEN]) == canon(raised)
    # A real step of two digits is still a change.
    more = live(engine, [Sample("temp", points[-1][0] + 10.0, pair[0] + 0.2)])
    assert [c.state for c in more if c.rule is Rule.FROZEN] == [ConditionState.CLEARED]
