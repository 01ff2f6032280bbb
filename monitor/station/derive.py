"""Derived sensors: evaluate checked expressions on event time, the same way live and in replay.

A derived sample is made at the time of the input samples that changed it: when
an input sample arrives, its derived sensors are marked; they are evaluated at
that time as soon as an input sample with a later time arrives (all the inputs
read at one poll share a time, so a derived sensor sees them together), or at
`flush()`. Live and replay feed the same samples in the same order to the same
code, so they make the same derived samples; live, a derived sample follows its
inputs by one poll interval. Live with readings on two clocks (a device's MQTT
payload time beside the gateway's), `LiveStation` keeps one `Derivation` per clock
and feeds a device's reading to the gateway's at its arrival (docs/station.md).

An input that is missing, bad, or older than the derived sensor's
`max_input_age` stops the derived sensor (no sample is made, counted in
`skipped`): its stale alarm then says so, instead of a wrong value going on.
Values are computed in SI and converted to the derived sensor's unit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping

import numpy as np
import numpy.typing as npt

from monitor.config import SensorRules
from monitor.config.expression import Binary, Choice, Node, Num, Ref, Running, Unary, Window
from monitor.config.station import DerivedPlan
from monitor.model import Quality, Sample
from monitor.units import dimension

_NAN = math.nan
_GOOD = Quality.GOOD
_NONE: list[Sample] = []  # shared empty result; callers only read it
Fn = Callable[[], float]


class _Buffer:
    """Recent good samples of one sensor, for rate/sum/mean over a short window."""

    __slots__ = ("keep", "times", "values")

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self.times: deque[float] = deque()
        self.values: deque[float] = deque()

    def add(self, t: float, v: float) -> None:
        self.times.append(t)
        self.values.append(v)
        cut = t - self.keep
        while len(self.times) > 2 and self.times[1] <= cut:
            self.times.popleft()
            self.values.popleft()

    def rate(self, now: float, window: float) -> float:
        """(v_now - v_then) / (t_now - t_then), `then` the oldest sample within the window,
        or the one just before it when only the latest is inside."""
        times = self.times
        if len(times) < 2:
            return _NAN
        cut = now - window
        i = 0
        n = len(times)
        while i < n - 2 and times[i + 1] <= cut:
            i += 1
        if times[i] < cut and times[i + 1] < now:
            i += 1
        dt = times[-1] - times[i]
        return (self.values[-1] - self.values[i]) / dt if dt > 0 else _NAN

    def total(self, now: float, window: float) -> tuple[float, int]:
        cut = now - window
        s, k = 0.0, 0
        for t, v in zip(reversed(self.times), reversed(self.values), strict=True):
            if t <= cut:
                break
            s += v
            k += 1
        return s, k


class Derivation:
    """Every derived sensor of a station; `feed` each sample in time order."""

    def __init__(
        self,
        plans: Mapping[str, DerivedPlan],
        rules: Mapping[str, SensorRules],
        arrival: Collection[str] = (),
    ) -> None:
        """`arrival`: inputs fed stamped at their arrival (`LiveStation`: a device's readings
        on the gateway clock), where a burst shares one time: one at the time of the one
        before replaces it (the newest reading counts) rather than being out of order."""
        self.plans = plans
        self.skipped = 0
        self.made = 0
        self._now = 0.0
        inputs: dict[str, int] = {}
        for plan in plans.values():
            for s in plan.compiled.inputs:
                inputs.setdefault(s, len(inputs))
        for s in plans:
            inputs.setdefault(s, len(inputs))
        self._slot = inputs
        self._arrival = frozenset(inputs[s] for s in arrival if s in inputs)
        self._vals = [_NAN] * len(inputs)
        self._times = [-math.inf] * len(inputs)  # of the last good sample of each
        # and of the newest bad one: on its sender's clock too, whose step moves it (`shift`)
        self._bad_times = [-math.inf] * len(inputs)
        self._si: list[tuple[float, float]] = []
        self._range: list[tuple[float, float]] = []
        self._bad = [frozenset(rules[s].bad_values) for s in inputs]  # a PLC's error values
        for s in inputs:
            r = rules[s]
            _, scale, offset = dimension(r.unit, r.kind)
            self._si.append((scale, offset))
            self._range.append(r.valid_range)
        keep: dict[str, float] = {}
        for plan in plans.values():
            for node in _walk(plan.compiled.tree):
                if isinstance(node, Window):
                    keep[node.sensor] = max(keep.get(node.sensor, 0.0), node.seconds)
        self._buffers = {self._slot[s]: _Buffer(w) for s, w in keep.items()}
        self._order = list(plans)  # dependency order (config.derived)
        self._fns = {sid: self._compile(plan.compiled.tree) for sid, plan in plans.items()}
        self._args = {sid: [self._slot[s] for s in plan.compiled.inputs] for sid, plan in plans.items()}
        self._dependents: dict[int, list[str]] = {}
        for sid, plan in plans.items():
            for s in plan.compiled.inputs:
                self._dependents.setdefault(self._slot[s], []).append(sid)
        self._dirty: set[str] = set()
        self._pending = -math.inf
        # sensor -> slot, for the inputs only: one look-up per sample decides
        self._watch = {s: i for s, i in inputs.items() if i in self._dependents}
        # per slot: plausible range, to SI, window buffer, derived sensors that read it
        self._info = [
            (*self._range[i], *self._si[i], self._buffers.get(i), tuple(self._dependents.get(i, ())))
            for i in range(len(inputs))
        ]
        self._steps = [
            (sid, self._slot[sid], self._args[sid], self._fns[sid], p.scale, p.offset, p.max_input_age)
            for sid, p in plans.items()
        ]

    @property
    def inputs(self) -> frozenset[str]:
        """Sensors whose samples can change a derived sensor."""
        return frozenset(s for s, i in self._slot.items() if i in self._dependents)

    def feed(self, sample: Sample) -> list[Sample]:
        """Take one sample; returns derived samples due (at an earlier time)."""
        slot = self._watch.get(sample.sensor)
        if slot is None:
            return _NONE
        return self._feed(slot, sample.time, sample.value, sample.quality is _GOOD)

    def flush(self) -> list[Sample]:
        """Derived samples still pending (end of a replay)."""
        if not self._dirty:
            return []
        return self._evaluate(self._pending)

    def shift(self, delta: float, keep: Collection[str] = ()) -> None:
        """The gateway clock stepped by `delta` (< 0: back) while the daemon runs: the
        inputs' times and windows move with it (monitor/engine/clock_step.py), so the next
        readings, stamped on the new clock, are in order (back) and a rate or a window
        spans the time that passed, not the step (forward). Those of the sensors in `keep`
        (stamped by their device's clock) stay; the pending evaluation moves only when the
        latest input was the gateway's (set by a device's reading, it was on the right
        clock: moved a step forward, no derived sample was made for the step's length).
        Then it is at least the latest moved input's time. A bad reading (BAD_DATA) counts
        as its sender's as a good one does: taken for the gateway's, it moved the time a
        device's NaN had set, and a step forward silenced the derived sensors for its length."""
        kept = {i for s, i in self._slot.items() if s in keep}
        watched = set(self._watch.values())
        seen = [max(t, b) for t, b in zip(self._times, self._bad_times, strict=True)]
        latest_kept = max((seen[i] for i in watched & kept), default=-math.inf)
        self._times[:] = [t if i in kept else t + delta for i, t in enumerate(self._times)]
        self._bad_times[:] = [t if i in kept else t + delta for i, t in enumerate(self._bad_times)]
        if not watched <= kept and self._pending > latest_kept:
            self._pending += delta
            self._now += delta
        moved = [self._times[i] for i in watched - kept]
        if moved:
            self._pending = max(self._pending, *moved)
        for i, buf in self._buffers.items():
            if i not in kept:
                buf.times = deque(t + delta for t in buf.times)

    def _feed(self, slot: int, t: float, v: float, good: bool) -> list[Sample]:
        out = self._evaluate(self._pending) if t > self._pending and self._dirty else _NONE
        times = self._times
        if not t > times[slot] and good and not (t == times[slot] and slot in self._arrival):
            return out  # out of order: the engine counts and logs it
        lo, hi, scale, offset, buf, deps = self._info[slot]
        if good and v - v == 0.0 and lo <= v <= hi and not (self._bad[slot] and v in self._bad[slot]):
            si = v * scale + offset
            self._vals[slot] = si
            times[slot] = t
            if buf is not None:
                buf.add(t, si)
        else:
            self._vals[slot] = _NAN
            self._bad_times[slot] = max(self._bad_times[slot], t)
        self._dirty.update(deps)
        if t > self._pending:  # noqa: PLR1730 - a branch is cheaper than max() per sample
            self._pending = t
        return out

    def _evaluate(self, t: float) -> list[Sample]:
        self._now = t
        out: list[Sample] = []
        dirty = self._dirty
        times = self._times
        vals = self._vals
        for sid, slot, args, fn, scale, offset, max_age in self._steps:
            if sid not in dirty:
                continue
            value = _NAN
            if min([times[i] for i in args]) >= t - max_age:
                value = fn() * scale + offset
            _, _, si_scale, si_offset, buf, deps = self._info[slot]
            if value - value == 0.0:
                out.append(Sample(sid, t, value))
                self.made += 1
                si = value * si_scale + si_offset
                vals[slot] = si
                times[slot] = t
                if buf is not None:
                    buf.add(t, si)
            else:
                self.skipped += 1
                vals[slot] = _NAN
            if deps:
                dirty.update(deps)
        dirty.clear()
        return out

    def _compile(self, node: Node) -> Fn:
        """The tree as nested closures over the slot values: built once, cheap per sample."""
        vals = self._vals
        if isinstance(node, Num):
            c = node.value
            return lambda: c
        if isinstance(node, Ref):
            i = self._slot[node.sensor]
            return lambda: vals[i]
        if isinstance(node, Running):
            i = self._slot[node.sensor]
            return lambda: _NAN if math.isnan(vals[i]) else float(vals[i] > 0.5)
        if isinstance(node, Unary):
            f = self._compile(node.operand)
            return lambda: -f()
        if isinstance(node, Window):
            buf = self._buffers[self._slot[node.sensor]]
            w = node.seconds
            if node.fn == "rate":
                return lambda: buf.rate(self._now, w)
            if node.fn == "sum":
                return lambda: buf.total(self._now, w)[0]
            return lambda: _mean(buf.total(self._now, w))
        if isinstance(node, Choice):
            test, then, other = (self._compile(n) for n in (node.test, node.then, node.otherwise))
            return lambda: _choose(test(), then, other)
        op = node.op
        left, right = node.left, node.right
        # The common shapes without a call per operand: sensor (op) constant, sensor (op) sensor.
        if op in ("+", "-", "*") and isinstance(left, Ref) and isinstance(right, (Ref, Num)):
            i = self._slot[left.sensor]
            if isinstance(right, Num):
                c = right.value
                return {"+": lambda: vals[i] + c, "-": lambda: vals[i] - c, "*": lambda: vals[i] * c}[op]
            j = self._slot[right.sensor]
            return {
                "+": lambda: vals[i] + vals[j],
                "-": lambda: vals[i] - vals[j],
                "*": lambda: vals[i] * vals[j],
            }[op]
        if op in ("+", "-", "*") and isinstance(left, (Ref, Num)):
            g = self._compile(right)
            if isinstance(left, Num):
                c = left.value
                return {"+": lambda: c + g(), "-": lambda: c - g(), "*": lambda: c * g()}[op]
            i = self._slot[left.sensor]
            return {"+": lambda: vals[i] + g(), "-": lambda: vals[i] - g(), "*": lambda: vals[i] * g()}[op]
        a, b = self._compile(left), self._compile(right)
        if op == "+":
            return lambda: a() + b()
        if op == "-":
            return lambda: a() - b()
        if op == "*":
            return lambda: a() * b()
        if op == "/":
            return lambda: _div(a(), b())
        if op == "min":
            return lambda: _nanmin(a(), b())
        return lambda: _nanmax(a(), b())


def _walk(node: Node) -> list[Node]:
    out: list[Node] = [node]
    if isinstance(node, Unary):
        out += _walk(node.operand)
    elif isinstance(node, Binary):
        out += _walk(node.left) + _walk(node.right)
    elif isinstance(node, Choice):
        out += _walk(node.test) + _walk(node.then) + _walk(node.otherwise)
    return out


def _div(a: float, b: float) -> float:
    return a / b if b else _NAN


def _mean(sk: tuple[float, int]) -> float:
    return sk[0] / sk[1] if sk[1] else _NAN


def _choose(test: float, then: Fn, other: Fn) -> float:
    if math.isnan(test):
        return _NAN
    return then() if test else other()


def _nanmin(a: float, b: float) -> float:
    return _NAN if math.isnan(a) or math.isnan(b) else min(a, b)


def _nanmax(a: float, b: float) -> float:
    return _NAN if math.isnan(a) or math.isnan(b) else max(a, b)


def derive_arrays(
    derivation: Derivation,
    names: tuple[str, ...],
    sensor: npt.NDArray[np.integer],
    time: npt.NDArray[np.float64],
    value: npt.NDArray[np.float64],
    quality: npt.NDArray[np.integer] | None,
    *,
    final: bool = True,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int8]]:
    """Replay: the samples with their derived samples merged in, in time order.

    Walks the inputs' samples through `Derivation._feed` in order, exactly as live
    feeds them one by one; only those samples cost a Python step.
    """
    n = int(time.size)
    q = np.zeros(n, np.int8) if quality is None else np.asarray(quality).astype(np.int8)
    wanted = np.array([names.index(s) for s in derivation.inputs if s in names], dtype=np.int64)
    mask = np.isin(sensor, wanted)
    idx = np.flatnonzero(mask)
    slot_of = {names.index(s): derivation._slot[s] for s in derivation.inputs if s in names}
    made: list[Sample] = []
    feed = derivation._feed
    good_q = int(Quality.GOOD)
    for i, t, v, qq in zip(
        sensor[idx].tolist(), time[idx].tolist(), value[idx].tolist(), q[idx].tolist(), strict=True
    ):
        made.extend(feed(slot_of[i], t, v, qq == good_q))
    if final:
        made.extend(derivation.flush())
    s_out = np.asarray(sensor, dtype=np.int64)
    if not made:
        return s_out, np.asarray(time, np.float64), np.asarray(value, np.float64), q
    index = {n: i for i, n in enumerate(names)}
    d_sensor = np.array([index[m.sensor] for m in made], dtype=np.int64)
    d_time = np.array([m.time for m in made], dtype=np.float64)
    d_value = np.array([m.value for m in made], dtype=np.float64)
    all_t = np.concatenate((time, d_time))
    order = np.argsort(all_t, kind="stable")
    return (
        np.concatenate((s_out, d_sensor))[order],
        all_t[order],
        np.concatenate((value, d_value))[order],
        np.concatenate((q, np.zeros(d_time.size, np.int8)))[order],
    )


__all__ = ["Derivation", "derive_arrays"]
