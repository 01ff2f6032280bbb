"""Limit rules, one step per sample (live) and one pass per batch (replay), and the
array helpers the batch forms of every rule share.

Both forms implement the same definition; `tests/test_engine_replay.py` checks
with hypothesis that they raise identical conditions.

Limit (§139-15 C(3), D(1), D(2)): the value, converted to the limit's unit, is
*beyond* when strictly above `high` (below `low`). The condition becomes active at
the first sample that has been beyond continuously for at least `on_delay`, and
clears at the first sample that has been back inside by more than `deadband`
continuously for at least `off_delay`. Samples in the deadband hold the state and
restart both timers.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from monitor.config import LimitRule
from monitor.engine.columns import LimitRun
from monitor.model import Condition, ConditionState, Rule, amount, new_condition
from monitor.units import conversion

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
NAN = math.nan


def duration_text(seconds: float) -> str:
    """15m, 24h, 90s: durations as the config writes them."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0 and not (unit == "d" and seconds <= 172800):
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def ffill_index(marker: Bools) -> npt.NDArray[np.intp]:
    """For each position, the index of the latest marked position at or before it (-1: none)."""
    out = np.full(marker.size, -1, dtype=np.intp)
    marked = np.flatnonzero(marker)
    if marked.size:
        out[marked[0] :] = np.repeat(marked, np.diff(np.append(marked, marker.size)))
    return out


def run_starts(times: Floats, member: Bools, carried: float) -> Floats:
    """Start time of the run of consecutive `member` samples each sample belongs to.

    `carried` is the start of a run still open from before the batch (NaN: none).
    """
    prev = np.concatenate(([not math.isnan(carried)], member[:-1]))
    last = ffill_index(member & ~prev)
    return np.where(last >= 0, times[np.maximum(last, 0)], carried)


def _last_run_start(times: Floats, member: Bools, carried: float) -> float:
    """`run_starts(times, member, carried)[-1]` if the last sample is a member, else NaN."""
    if not member[-1]:
        return NAN
    outside = np.flatnonzero(~member)
    if outside.size:
        return float(times[int(outside[-1]) + 1])
    return carried if not math.isnan(carried) else float(times[0])


def _reaches(times: Floats, member: Bools, carried: float, delay: float) -> tuple[bool, float]:
    """Whether a run of `member` samples lasts `delay` within the batch (`_switches` flags
    any), and the start of the run open at the last sample (NaN if none), from the runs'
    first and last samples alone: times rise, so a run's longest span is at its last.
    A limit beyond now and then but never for its on-delay (pH at 10 s a sample, 30 s
    on-delay) skips `run_starts`' passes over the batch (110 -> 30 us a batch)."""
    at = np.flatnonzero(member)
    if not at.size:
        return False, NAN
    cut = np.flatnonzero(at[1:] != at[:-1] + 1)  # the last sample of each run but the last
    first = np.empty(cut.size + 1, dtype=np.intp)
    first[0] = at[0]
    first[1:] = at[cut + 1]
    last = np.empty(cut.size + 1, dtype=np.intp)
    last[:-1] = at[cut]
    last[-1] = at[-1]
    start = times[first]
    if first[0] == 0 and not math.isnan(carried):
        start[0] = carried
    reached = bool((times[last] - start >= delay).any())
    return reached, float(start[-1]) if member[-1] else NAN


def _switches(
    times: Floats, member: Bools, carried: float, delay: float, finite: bool
) -> tuple[Bools, float]:
    """Where a side's run has lasted `delay` (the samples that switch it), and the start
    of the run open at the last sample (NaN if none). Without a delay every member
    switches (`t - start >= 0` for finite times), so only the last run's start is needed."""
    if delay == 0 and finite:
        return member, _last_run_start(times, member, carried)
    starts = run_starts(times, member, carried)
    return member & (times - starts >= delay), float(starts[-1]) if member[-1] else NAN


def hysteresis(to_on: Bools, to_off: Bools, initial: bool) -> Bools:
    """State after each sample of a two-state machine switched on/off by disjoint flags."""
    decisive = to_on | to_off
    last = ffill_index(decisive)
    return np.where(last >= 0, to_on[np.maximum(last, 0)], initial)


def transitions(to_on: Bools, to_off: Bools, initial: bool) -> tuple[npt.NDArray[np.intp], bool]:
    """Where `hysteresis(to_on, to_off, initial)` changes and its final state, from the
    decisive samples alone (a batch's transitions without the state of every sample)."""
    at = np.flatnonzero(to_on | to_off)
    if not at.size:
        return at, initial
    on = to_on[at]
    change = np.empty(at.size, dtype=bool)
    change[0] = bool(on[0]) != initial
    np.not_equal(on[1:], on[:-1], out=change[1:])
    return at[change], bool(on[-1])


class LimitState:
    """One side (high or low) of one sensor's limits, with its timers."""

    __slots__ = (
        "a_start",
        "active",
        "b_start",
        "citation",
        "clear_at",
        "held",
        "high",
        "limit",
        "off_delay",
        "offset",
        "on_delay",
        "rule",
        "scale",
        "sensor",
        "unit",
    )

    def __init__(self, sensor: str, rules: LimitRule, sensor_unit: str, high: bool) -> None:
        limit = rules.high if high else rules.low
        assert limit is not None
        self.sensor = sensor
        self.high = high
        self.rule = Rule.HIGH if high else Rule.LOW
        self.limit = limit
        self.clear_at = limit - rules.deadband if high else limit + rules.deadband
        self.on_delay = rules.on_delay
        self.off_delay = rules.off_delay
        self.scale, self.offset = conversion(sensor_unit, rules.unit)
        self.citation = rules.citation
        self.unit = "" if rules.unit == "pH" else rules.unit
        self.active = False
        self.a_start = NAN  # start of the current run beyond the limit
        self.b_start = NAN  # start of the current run back inside by more than the deadband
        # A restored alarm's activation (`hold`): readings stamped at or before it do not end
        # it. -inf: none, every reading is later (the replay never holds one).
        self.held = -math.inf

    def condition(self, t: float, value: float, state: ConditionState, limit: str | None = None) -> Condition:
        """`limit`: the limit's text, when the caller formatted it once for many."""
        side = "above the high" if self.high else "below the low"
        now = amount(value, self.unit)
        limit = amount(self.limit, self.unit) if limit is None else limit
        if state is ConditionState.ACTIVE:
            text = f"{now} {side} limit {limit}"
        else:
            text = f"{now} back within the {self.rule} limit {limit}"
        return new_condition(t, self.sensor, self.rule, state, value, self.limit, self.citation, text)

    def _run(self, times: Floats, values: Floats, on: Bools) -> LimitRun:
        rule, unit = self.rule, self.unit
        return LimitRun(self.sensor, rule, self.limit, self.citation, unit, self.high, times, values, on)

    def step(self, t: float, raw: float) -> Condition | None:
        """Judge one good sample (in the sensor's unit)."""
        v = raw * self.scale + self.offset
        beyond = v > self.limit if self.high else v < self.limit
        if beyond:
            if math.isnan(self.a_start):
                self.a_start = t
            self.b_start = NAN
            if not self.active and t - self.a_start >= self.on_delay:
                self.active = True
                return self.condition(t, v, ConditionState.ACTIVE)
            return None
        inside = v < self.clear_at if self.high else v > self.clear_at
        if inside:
            if math.isnan(self.b_start):
                self.b_start = t
            self.a_start = NAN
            if self.active and t - self.b_start >= self.off_delay:
                self.active = False
                self.held = -math.inf  # a restored alarm's hold ends with it
                return self.condition(t, v, ConditionState.CLEARED)
            return None
        self.a_start = self.b_start = NAN
        return None

    def hold(self, activated_at: float | None) -> None:
        """Take an alarm the journal holds as active, raised at `activated_at`, as this
        side's own: it ends by the deadband and off-delay, never raised twice, and not on
        a reading from before it began (`step_before`). An off-delay run a checkpoint held
        is kept only if it began after the raise (the checkpoint saw the alarm active)."""
        self.active = True
        if activated_at is not None and not self.b_start > activated_at:
            self.b_start = NAN
        self.held = -math.inf if activated_at is None else activated_at

    def step_before(self, t: float, raw: float) -> None:
        """Judge a good sample stamped at or before the held activation: as `step`, except
        that it neither starts the off-delay nor ends the alarm (it is evidence from before
        the alarm began: a device's buffer, a queued MQTT message)."""
        v = raw * self.scale + self.offset
        beyond = v > self.limit if self.high else v < self.limit
        if not beyond:
            self.a_start = NAN
        elif math.isnan(self.a_start):
            self.a_start = t
        self.b_start = NAN

    def batch(self, times: Floats, raw: Floats) -> list[Condition]:
        """Judge a batch of good samples; same result as `step` over each."""
        run = self.batch_run(times, raw)
        return [] if run is None else run.conditions()

    def batch_run(self, times: Floats, raw: Floats) -> LimitRun | None:
        """`batch`, its transitions as arrays (None: none); the replay builds no object
        for them unless asked (monitor/engine/columns.py)."""
        if not times.size:
            return None
        v = raw * self.scale + self.offset
        if self.high:
            beyond, inside = v > self.limit, v < self.clear_at
        else:
            beyond, inside = v < self.limit, v > self.clear_at
        if not (beyond.any() if not self.active else inside.any()):
            # Inactive and never beyond, or active and never back inside: the state holds
            # (most batches); only the timers of the runs open at the end are kept.
            self.a_start = _last_run_start(times, beyond, self.a_start)
            self.b_start = _last_run_start(times, inside, self.b_start)
            return None
        # Without a delay a sample beyond (back inside) switches at once: `t - start >= 0`
        # holds for every finite time, so the runs' starts are needed only at the end.
        finite = float(times[-1]) < math.inf  # the times rise: all finite then
        if not self.active and self.on_delay > 0 and finite and float(times[0]) > -math.inf:
            reached, a_last = _reaches(times, beyond, self.a_start, self.on_delay)
            if not reached:  # nothing switches on, and an inactive side has nothing to clear
                self.a_start = a_last
                self.b_start = _last_run_start(times, inside, self.b_start)
                return None
        on, a_last = _switches(times, beyond, self.a_start, self.on_delay, finite)
        off, b_last = _switches(times, inside, self.b_start, self.off_delay, finite)
        at, self.active = transitions(on, off, self.active)
        self.a_start = a_last
        self.b_start = b_last
        return self._run(times[at], v[at], on[at]) if at.size else None
