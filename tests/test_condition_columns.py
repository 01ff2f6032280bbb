"""`ConditionColumns`, a replay batch's conditions as columns, against the list of
`Condition`s it replaces: the same objects in the same order (the stable sort by time),
the same event lines byte for byte, the same transitions for the incident tracker."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from operator import attrgetter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.engine.columns import Chunk, ConditionColumns, LimitRun
from monitor.incidents.transitions import INCIDENT_RULES, Transitions, transitions
from monitor.model import Condition, ConditionState, Rule, event_lines
from tests.examples import examples

EVENTS = frozenset({Rule.SLUG, Rule.HIGH, Rule.LOW, Rule.STALE})
# few distinct times, so that chunks tie; inf and NaN as a bad clock could give them
times = st.one_of(st.sampled_from([0.0, 10.0, 10.0, 20.0, 1_780_000_000.5]), st.floats(-1e9, 4e9))
odd_times = st.sampled_from([float("inf"), float("-inf"), float("nan")])
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-4, 65.212222, 1e10])
)
sensors = st.sampled_from(["temp1", "temp2", "flow1", "ph9"])


@st.composite
def limit_runs(draw: st.DrawFn, odd: bool) -> LimitRun:
    n = draw(st.integers(0, 6))
    t = sorted(draw(st.lists(st.one_of(times, odd_times) if odd else times, min_size=n, max_size=n)))
    high = draw(st.booleans())
    return LimitRun(
        draw(sensors),
        Rule.HIGH if high else Rule.LOW,
        draw(st.sampled_from([65.0, 6.5, 0.0, 1e10])),
        draw(st.sampled_from(["§139-15 D(1)", "§139-15 C(3)"])),
        draw(st.sampled_from(["degF", "", "mg/L"])),
        high,
        np.array(t, np.float64),
        np.array(draw(st.lists(values, min_size=n, max_size=n)), np.float64),
        np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool),
    )


@st.composite
def object_chunks(draw: st.DrawFn, odd: bool) -> list[Condition]:
    n = draw(st.integers(0, 4))
    t = sorted(draw(st.lists(st.one_of(times, odd_times) if odd else times, min_size=n, max_size=n)))
    return [
        Condition(
            x,
            draw(sensors),
            draw(st.sampled_from([Rule.STALE, Rule.SLUG, Rule.BAD_VALUE, Rule.HIGH])),
            draw(st.sampled_from(list(ConditionState))),
            draw(st.one_of(values, st.integers(-5, 5))),
            draw(st.one_of(st.none(), values)),
            "§139-9",
            "a message",
            {"x": 1.5},
        )
        for x in t
    ]


def chunk_lists(odd: bool) -> st.SearchStrategy[list[Chunk]]:
    return st.lists(st.one_of(limit_runs(odd), object_chunks(odd)), max_size=6)


def _expected(chunks: list[Chunk]) -> list[Condition]:
    """What the engine did before: every rule's objects, one stable sort by time."""
    flat = [c for chunk in chunks for c in (chunk.conditions() if isinstance(chunk, LimitRun) else chunk)]
    flat.sort(key=attrgetter("time"))
    return flat


def _outcome(write: Callable[[], tuple[str, int]]) -> tuple[str, int] | type[BaseException]:
    try:
        return write()
    except (OverflowError, ValueError) as exc:
        return type(exc)


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(chunk_lists(False), chunk_lists(True)))
def test_the_columns_are_the_conditions_in_order(chunks: list[Chunk]) -> None:
    expected = _expected(chunks)
    columns = ConditionColumns(chunks)
    assert len(columns) == len(expected)
    # events and transitions from the columns, before any object is built
    events = [c for c in expected if c.rule in EVENTS]
    # an event at an infinite time fails to be written, from the columns as it did before
    assert _outcome(lambda: columns.event_lines(EVENTS)) == _outcome(
        lambda: (event_lines(events), len(events))
    )
    watched = {"temp1", "flow1"}
    got = pickle.loads(pickle.dumps(transitions(columns, watched)))
    want = transitions(expected, watched)
    assert repr(got) == repr(want)  # NaN limits: equal as text, not as floats
    assert [type(x) for x in got.time + got.limit] == [type(x) for x in want.time + want.limit]
    assert repr(columns.conditions()) == repr(expected)
    assert np.array_equal(columns.time, np.array([c.time for c in expected], np.float64), equal_nan=True)


def test_a_limit_runs_objects_are_built_when_asked_and_once() -> None:
    """A `LimitRun` makes the messages `LimitState.condition` writes; `conditions()` builds
    them at the first call only."""
    run = LimitRun(
        "temp1", Rule.HIGH, 65.0, "§139-15 D(1)", "degF", True,
        np.array([10.0, 20.0]), np.array([65.25, 59.0]), np.array([True, False]),
    )  # fmt: skip
    columns = ConditionColumns([run, []])
    first = columns.conditions()
    assert first is columns.conditions()
    assert [c.message for c in first] == [
        "65.25 degF above the high limit 65 degF",
        "59 degF back within the high limit 65 degF",
    ]
    assert [c.state for c in first] == [ConditionState.ACTIVE, ConditionState.CLEARED]
    mine = transitions(columns, {"temp1"})
    assert mine == Transitions(
        [10.0, 20.0], ["temp1"] * 2, [Rule.HIGH] * 2, [True, False], [65.0] * 2, ["§139-15 D(1)"] * 2
    )
    assert set(INCIDENT_RULES) >= set(mine.rule)


def test_conditions_merged_by_a_caller_keep_their_order() -> None:
    """`of`: the station's merge (by time, sensor, rule and state) is not sorted again."""
    a = Condition(10.0, "b", Rule.HIGH, ConditionState.ACTIVE, 1.0, 0.5, "§1")
    b = Condition(10.0, "a", Rule.HIGH_LEVEL, ConditionState.ACTIVE, 1.0, 0.5, "§2")
    assert ConditionColumns.of([a, b]).conditions() == [a, b]
    assert ConditionColumns.of([]).event_lines(EVENTS) == ("", 0)
