"""A replay batch's conditions as columns, objects built only for who asks for them.

A chattering limit raises tens of thousands of transitions in a replay (53,409 in the
benchmark's 10 M rows, all from limits): built as `Condition`s, each with its message
text, they cost the replay more than the rest of its alarm path. `LimitState.batch_run`
gives a batch's transitions of one limit as arrays (`LimitRun`); `ConditionColumns`
puts every rule's in time order (one stable sort of the times, the order the list's
stable sort by time gave) and hands them on as columns: the event lines
(`event_lines`), the incident worker's transitions (`select`). The `Condition`s, with
their messages, are built the first time `conditions()` is asked (the InfluxDB outbox,
the station's parts, --what-if, the tests): the same objects, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from monitor.model import (
    Condition,
    ConditionState,
    EventHead,
    Rule,
    amount,
    event_lines_of,
    new_condition,
)

Floats = npt.NDArray[np.float64]
_TIME = attrgetter("time")
_ACTIVE, _CLEARED = ConditionState.ACTIVE, ConditionState.CLEARED


def limit_conditions(
    run: LimitRun, times: list[float], values: list[float], states: list[bool]
) -> list[Condition]:
    """`Condition`s of a limit's transitions, their texts built once (a chattering limit
    makes tens of thousands): the messages `LimitState.condition` writes, byte for byte
    (a value's text is `amount`'s, inline)."""
    limit = amount(run.limit, run.unit)
    side = "above the high" if run.high else "below the low"
    unit = f" {run.unit}" if run.unit else ""
    on_text = f" {side} limit {limit}"
    off_text = f" back within the {run.rule} limit {limit}"
    sensor, rule, lim, citation = run.sensor, run.rule, run.limit, run.citation
    return [
        new_condition(
            t, sensor, rule, _ACTIVE if on else _CLEARED, x, lim, citation,
            f"{x:.4g}{unit}{on_text if on else off_text}",
        )
        for t, x, on in zip(times, values, states, strict=True)
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class LimitRun:
    """One limit side's transitions in one batch, in time order: `on` ACTIVE, else CLEARED."""

    sensor: str
    rule: Rule
    limit: float
    citation: str
    unit: str  # the limit's unit as its messages write it ("" for pH)
    high: bool
    time: Floats
    value: Floats
    on: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.time.size)

    def conditions(self) -> list[Condition]:
        return limit_conditions(self, self.time.tolist(), self.value.tolist(), self.on.tolist())


Chunk = LimitRun | list[Condition]


class ConditionColumns:
    """A batch's conditions in time order: the rules' chunks (each in time order) and the
    order that merges them (positions in the chunks' concatenation); `time`, the times in
    that order."""

    __slots__ = ("_chunks", "_conditions", "_order", "time")

    def __init__(self, chunks: Sequence[Chunk], ordered: bool = False) -> None:
        """`ordered`: the chunks, one after the other, are in order already."""
        self._chunks: list[Chunk] = [c for c in chunks if len(c)]
        self._conditions: list[Condition] | None = None
        parts = [_times(c) for c in self._chunks]
        times: Floats = np.concatenate(parts) if parts else np.empty(0, np.float64)
        nan = bool(np.isnan(times).any())
        if ordered or (len(self._chunks) < 2 and not nan and _rising(times)):
            self._order: npt.NDArray[np.intp] = np.arange(times.size)
        elif nan:  # no order NumPy and list.sort agree on: the list's, as before
            objects = [c for chunk in self._chunks for c in _objects(chunk)]
            objects.sort(key=_TIME)
            self._chunks = [objects]
            self._order = np.arange(len(objects))
            times = np.array([c.time for c in objects], np.float64)
        else:  # stable: ties stay in the chunks' order (sensor, then rule), as list.sort kept them
            self._order = np.argsort(times, kind="stable")
        self.time: Floats = times[self._order]

    @classmethod
    def of(cls, conditions: list[Condition]) -> ConditionColumns:
        """Conditions in their order already (merged by a caller)."""
        return cls([conditions], ordered=True)

    def __len__(self) -> int:
        return int(self._order.size)

    def conditions(self) -> list[Condition]:
        """The conditions as objects, in order (built once, when first asked)."""
        if self._conditions is None:
            flat = [c for chunk in self._chunks for c in _objects(chunk)]
            in_order = bool((self._order == np.arange(len(flat))).all())
            self._conditions = flat if in_order else [flat[i] for i in self._order.tolist()]
        return self._conditions

    def event_lines(self, rules: Container[Rule]) -> tuple[str, int]:
        """The JSON lines of the conditions of `rules` (`monitor.model.event_lines`, byte
        for byte), and how many, from the columns."""
        rows = self._rows(lambda c: c.rule in rules)
        if not rows.size:
            return "", 0
        heads: dict[EventHead, int] = {}
        keys = np.empty(self._order.size, np.intp)
        for (a, b), chunk in zip(self._spans(), self._chunks, strict=True):
            if isinstance(chunk, LimitRun):
                on = heads.setdefault((chunk.sensor, chunk.rule, _ACTIVE, chunk.citation), len(heads))
                off = heads.setdefault((chunk.sensor, chunk.rule, _CLEARED, chunk.citation), len(heads))
                keys[a:b] = np.where(chunk.on, on, off)
            else:
                heads_of = [(c.sensor, c.rule, c.state, c.citation) for c in chunk]
                keys[a:b] = [heads.setdefault(h, len(heads)) for h in heads_of]
        text = event_lines_of(
            self._column(rows, _TIMES),
            keys[rows].tolist(),
            list(heads),
            self._column(rows, _VALUES),
            self._column(rows, _LIMITS),
        )
        return text, int(rows.size)

    def select(
        self, rules: Container[Rule], sensors: Container[str]
    ) -> tuple[list[float], list[str], list[Rule], list[bool], list[float | None], list[str]]:
        """The conditions of `rules` on `sensors`, in order, as columns: time, sensor,
        rule, whether ACTIVE, limit, citation (the incident tracker's `Transitions`)."""
        rows = self._rows(lambda c: c.rule in rules and c.sensor in sensors)
        return (
            self._column(rows, _TIMES),
            self._column(rows, _SENSORS),
            self._column(rows, _RULES),
            self._column(rows, _ACTIVES),
            self._column(rows, _LIMITS),
            self._column(rows, _CITATIONS),
        )

    def _spans(self) -> list[tuple[int, int]]:
        """Each chunk's rows in the chunks' concatenation."""
        ends = np.cumsum([len(c) for c in self._chunks]).tolist()
        return list(zip([0, *ends][:-1], ends, strict=True))

    def _rows(self, wanted: Callable[[LimitRun | Condition], bool]) -> npt.NDArray[np.intp]:
        """The positions in the chunks' concatenation of the rows `wanted` (asked once for
        a whole `LimitRun`, of each `Condition` in a list), in order."""
        keep = np.empty(self._order.size, bool)
        for (a, b), chunk in zip(self._spans(), self._chunks, strict=True):
            keep[a:b] = wanted(chunk) if isinstance(chunk, LimitRun) else [wanted(c) for c in chunk]
        return self._order[keep[self._order]]

    def _column(self, rows: npt.NDArray[np.intp], field: _Field) -> list[Any]:
        """One field of those rows, as the objects would have it: a `LimitRun`'s floats
        and bools as Python's, its constants the run's own."""
        if not rows.size:
            return []
        out = np.empty(self._order.size, object)
        for (a, b), chunk in zip(self._spans(), self._chunks, strict=True):
            if isinstance(chunk, LimitRun):
                out[a:b] = field.run(chunk)
            else:
                out[a:b] = [field.condition(c) for c in chunk]
        return out[rows].tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class _Field:
    """A column: what a `LimitRun` has for all its rows, what one `Condition` has."""

    run: Callable[[LimitRun], Any]
    condition: Callable[[Condition], Any]


_TIMES = _Field(lambda r: r.time, lambda c: c.time)
_VALUES = _Field(lambda r: r.value, lambda c: c.value)
_LIMITS = _Field(lambda r: r.limit, lambda c: c.limit)
_SENSORS = _Field(lambda r: r.sensor, lambda c: c.sensor)
_RULES = _Field(lambda r: r.rule, lambda c: c.rule)
_ACTIVES = _Field(lambda r: r.on, lambda c: c.state is _ACTIVE)
_CITATIONS = _Field(lambda r: r.citation, lambda c: c.citation)


def _times(chunk: Chunk) -> Floats:
    if isinstance(chunk, LimitRun):
        return chunk.time
    return np.array([c.time for c in chunk], np.float64)


def _objects(chunk: Chunk) -> list[Condition]:
    return chunk.conditions() if isinstance(chunk, LimitRun) else chunk


def _rising(times: Floats) -> bool:
    return bool((times[1:] >= times[:-1]).all())
