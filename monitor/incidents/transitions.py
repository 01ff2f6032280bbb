"""A batch's alarm transitions as the incident tracker reads them: parallel columns.

A busy replay raises tens of thousands of transitions a step (53,409 in the benchmark's
10 M rows). The tracker reads six fields of each; as one list a field they are pickled in
C down the replay worker's pipe (no message text, no `extra` dict, no `Condition` built
again on the other side) and read in place by the tracker's loop, which builds a
`Condition` only for the few transitions that open or end an incident.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from typing import NamedTuple

from monitor.engine.columns import ConditionColumns
from monitor.model import Condition, ConditionState, Rule, new_condition

INCIDENT_RULES = frozenset({Rule.SLUG, Rule.HIGH, Rule.LOW})
_ACTIVE = ConditionState.ACTIVE
_CLEARED = ConditionState.CLEARED


class Transitions(NamedTuple):
    """Transitions of incident rules in the engine's order, one list a field."""

    time: list[float]
    sensor: list[str]
    rule: list[Rule]
    active: list[bool]  # ACTIVE, else CLEARED
    limit: list[float | None]
    citation: list[str]

    def condition(self, i: int) -> Condition:
        """The i-th as a `Condition` (its value, message and extra are not kept: the
        tracker reads none of them)."""
        state = _ACTIVE if self.active[i] else _CLEARED
        return new_condition(
            self.time[i], self.sensor[i], self.rule[i], state, math.nan, self.limit[i], self.citation[i]
        )

    @classmethod
    def join(cls, parts: Iterable[Transitions]) -> Transitions:
        """Several batches' transitions as one, in order."""
        out = cls([], [], [], [], [], [])
        for part in parts:
            out.time.extend(part.time)
            out.sensor.extend(part.sensor)
            out.rule.extend(part.rule)
            out.active.extend(part.active)
            out.limit.extend(part.limit)
            out.citation.extend(part.citation)
        return out


def transitions(conditions: Iterable[Condition] | ConditionColumns, sensors: Container[str]) -> Transitions:
    """The conditions of an incident rule on one of `sensors` (those the tracker watches);
    a replay step's straight from its columns."""
    if isinstance(conditions, ConditionColumns):
        return Transitions(*conditions.select(INCIDENT_RULES, sensors))
    mine = [c for c in conditions if c.rule in INCIDENT_RULES and c.sensor in sensors]
    return Transitions(
        [c.time for c in mine],
        [c.sensor for c in mine],
        [c.rule for c in mine],
        [c.state is _ACTIVE for c in mine],
        [c.limit for c in mine],
        [c.citation for c in mine],
    )
