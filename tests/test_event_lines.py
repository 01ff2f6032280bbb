"""`event_lines`, the replay's events writer, against the wire form it replaces."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.model import Condition, ConditionState, Rule, event_lines
from tests.examples import examples

times = st.one_of(
    st.integers(0, 4_102_444_800).map(float),
    st.floats(0.0, 4_102_444_800.0),
    st.floats(-1e9, 0.0),
    st.sampled_from([0.0, -0.0, 86399.0, 86400.0, 951_782_400.0, 1_780_000_000.0005]),
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6).map(np.float64),
)
conditions = st.builds(
    Condition,
    time=times,
    sensor=st.text(min_size=1, max_size=12),
    rule=st.sampled_from(list(Rule)),
    state=st.sampled_from(list(ConditionState)),
    value=numbers,
    limit=st.one_of(st.none(), numbers),
    citation=st.text(max_size=20),
)


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(conditions, max_size=20))
def test_event_lines_are_json_dumps_of_to_json_byte_for_byte(conds: list[Condition]) -> None:
    expected = "".join(json.dumps(c.to_json(), ensure_ascii=False) + "\n" for c in conds)
    assert event_lines(conds) == expected


def test_quotes_backslashes_and_non_ascii_are_escaped_as_json_does() -> None:
    c = Condition(1_780_000_000.0, 'ph "2"\\a', Rule.HIGH, ConditionState.ACTIVE, 9.5, None, "§139-15\n")
    line = event_lines([c])
    assert json.loads(line) == c.to_json()
    assert line == json.dumps(c.to_json(), ensure_ascii=False) + "\n"


def test_zero_and_negative_zero_and_repeated_numbers_keep_their_own_text() -> None:
    """Numbers are formatted once per value: 0.0 and -0.0 are one dict key, not one text."""
    t = 1_780_000_000.0
    conds = [
        Condition(t, "a", Rule.HIGH, ConditionState.ACTIVE, v, lim, "c")
        for v, lim in [(0.0, -0.0), (-0.0, 0.0), (2.5, 2.5), (2.5, None), (float("nan"), 1), (7, 7.0)]
    ] + [Condition(t + 0.5, "a", Rule.LOW, ConditionState.CLEARED, 1.0, 2.0, "c")]
    assert event_lines(conds) == "".join(json.dumps(c.to_json(), ensure_ascii=False) + "\n" for c in conds)
    assert '"value": -0.0, "limit": 0.0' in event_lines(conds[1:2])
