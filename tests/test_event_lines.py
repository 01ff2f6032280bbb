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


@settings(max_examples=examples(2000), deadline=None)
@given(
    st.one_of(
        st.floats(-2e9, 2e9),
        st.floats(-0.01, 0.01),
        st.integers(-(10**15), 10**15).map(lambda k: k / 1e6),  # six decimals, and their neighbours
        st.integers(0, 10**9).map(lambda k: (2 * k + 1) / 2e6),  # half-way between two of them
    )
)
def test_a_value_is_repr_of_its_rounding_to_six_decimals(value: float) -> None:
    """Values from 1e-3 to 1e9 are formatted with six decimals and their zeros stripped:
    the same text as `repr(round(value, 6))`, the wire form, at the edges too."""
    c = Condition(1_780_000_000.0, "a", Rule.HIGH, ConditionState.ACTIVE, value, value, "c")
    assert event_lines([c]) == json.dumps(c.to_json(), ensure_ascii=False) + "\n"


def test_edges_of_the_six_decimal_range_and_of_hours_read_as_the_wire_form() -> None:
    edges = [1e-3, 0.0009999995, 0.0078125, 1e9, 999999999.9999995, 999999999.999999, 123456789.1234565]
    values = [x for e in edges for x in (e, -e, np.nextafter(e, 0.0).item(), np.nextafter(e, 2e9).item())]
    # Times across hours, days and years, whole and not, in and out of order, in one call.
    times = [1_780_000_000.0 + k for k in (0, 3599, 3600, 86399, -1, 0.25, 3600.5, 31_536_000)]
    times += [0.0, 253_402_300_799.0, -1.0, 1.5]
    conds = [
        Condition(t, "s", Rule.LOW, ConditionState.CLEARED, v, None, "c")
        for t, v in zip(times * 4, values, strict=False)
    ]
    assert event_lines(conds) == "".join(json.dumps(c.to_json(), ensure_ascii=False) + "\n" for c in conds)
