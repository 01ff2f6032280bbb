"""The diagnostic bad-value rule: a sensor whose readings have all been bad data
(not believable: outside the plausible range, a device error value, non-finite)
for `BAD_VALUE_DELAY` raises a "bad value" condition; its next good reading clears
it. Readings of other qualities (comm failure) neither start nor end the run.

Bad readings never reach a baseline or a limit rule; this rule is how an operator
learns that an instrument has been sending nonsense, before the stale rule fires.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from monitor.engine.baseline import Floats
from monitor.engine.rules import duration_text, hysteresis, run_starts
from monitor.engine.state import SensorState
from monitor.model import Condition, ConditionState, Rule, amount, new_condition

BAD_VALUE_DELAY = 60.0  # seconds of nothing but bad readings before the diagnostic alarm
BAD_VALUE_CITATION = "plausible range (station config: valid_range, bad_values)"


def bad_value_condition(st: SensorState, t: float, value: float, state: ConditionState) -> Condition:
    unit = st.rules.unit if st.rules.unit != "pH" else ""
    if state is ConditionState.ACTIVE:
        text = (
            f"bad value {value!r}: only unbelievable readings for {duration_text(BAD_VALUE_DELAY)}"
            f" (plausible {amount(st.lo, unit)} to {amount(st.hi, unit)})"
        )
    else:
        text = f"believable reading {amount(value, unit)} again"
    return new_condition(t, st.sensor, Rule.BAD_VALUE, state, value, None, BAD_VALUE_CITATION, text)


def bad_value_step(st: SensorState, t: float, value: float, bad: bool) -> Condition | None:
    """One GOOD (`bad` False) or BAD_DATA (`bad` True) reading, live."""
    if bad:
        if math.isnan(st.bad_since):
            st.bad_since = t
        if not st.bad_active and t - st.bad_since >= BAD_VALUE_DELAY:
            st.bad_active = True
            return bad_value_condition(st, t, value, ConditionState.ACTIVE)
        return None
    st.bad_since = math.nan
    if st.bad_active:
        st.bad_active = False
        return bad_value_condition(st, t, value, ConditionState.CLEARED)
    return None


def bad_value_batch(
    st: SensorState, t: Floats, v: Floats, bad: npt.NDArray[np.bool_], good: npt.NDArray[np.bool_]
) -> list[Condition]:
    """The same over a batch: `bad` and `good` flag the readings that count."""
    sel = bad | good
    if not sel.any():
        return []
    t, v, bad, good = t[sel], v[sel], bad[sel], good[sel]
    start = run_starts(t, bad, st.bad_since)
    on = bad & (t - start >= BAD_VALUE_DELAY)
    state = hysteresis(on, good, st.bad_active)
    prev = np.concatenate(([st.bad_active], state[:-1]))
    out = [
        bad_value_condition(
            st, float(t[i]), float(v[i]), ConditionState.ACTIVE if state[i] else ConditionState.CLEARED
        )
        for i in np.flatnonzero(state != prev)
    ]
    st.bad_active = bool(state[-1])
    st.bad_since = float(start[-1]) if bad[-1] else math.nan
    return out
