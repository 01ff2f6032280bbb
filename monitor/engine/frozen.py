"""The frozen-value rule: good readings unchanged for longer than `frozen_after`.

A fouled pH probe, a temperature transmitter whose input card latched, or a PLC that keeps
serving its last register value after the loop broke (4-20 mA open loop with "hold last
value") all report one value, good quality, for hours; the limit and stale rules see
nothing wrong. This rule raises an instrument alarm then, and clears it at the first change.

What counts (one definition, live and batch):

- Only GOOD readings. A bad value (error code, out of range) or a failed poll between them
  neither counts as a change nor ends the run.
- "Unchanged" is anchored: a reading within `frozen_band` of the value the run began with
  (default 0: equal). A real slow drift leaves the band and restarts the run; a
  flickering last digit does not.
- The run's age is measured from its first reading, on event time. A silence longer than
  `stale_after` between good readings (the sensor was stale, and said so) restarts the
  count at the next reading: two readings hours apart are no evidence of a held signal.
  The silence is no change either: an active frozen alarm stays until the value changes.
- Active at the first reading more than `frozen_after` after the run began (exactly
  `frozen_after` raises nothing); cleared at the first reading outside the band.
- A gateway clock step moves the run with it (`clock_step.shift`, `advance_watches`), so
  a step measures no time that did not pass.
"""

from __future__ import annotations

import math

import numpy as np

from monitor.config import SensorRules
from monitor.engine.baseline import Floats
from monitor.engine.rules import Bools, ffill_index, transitions
from monitor.model import Condition, ConditionState, Kind, Rule, amount, new_condition, number

FROZEN_CITATION = "station config: frozen_after"
_NAN = math.nan
_HINTS = {
    Kind.PH: "probe fouled or signal held?",
    Kind.TEMPERATURE: "transmitter stuck or signal held?",
}
# A band is compared with room for the readings' own rounding, so `frozen_band: 0.1` holds a
# toggle of a 0.1 digit whatever the value (21.6 - 21.5 is 0.10000000000000142 in binary;
# a FLOAT32 register pair 21.5/21.6 is 0.1000004 apart): 2**-22 of the larger reading, four
# FLOAT32 half-steps, a quarter of a part per million. A band of 0 stays "equal".
_ROUNDING = 2.0**-22
_SEARCH = 64  # first window of the band's search for the next change; doubles while none
_ROUND = 32  # fewer runs than this with a change left: searched one by one


def age_text(seconds: float) -> str:
    """`6 h 0 min`, `12 min 5 s`: how long, as an operator reads it."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    if s >= 60:
        return f"{s // 60} min {s % 60} s"
    return f"{seconds:g} s"


class FrozenState:
    """One sensor's unchanged run: its reference value, start, last good reading, alarm."""

    __slots__ = (
        "active",
        "after",
        "band",
        "gap",
        "grace",
        "hint",
        "label",
        "last",
        "ref",
        "sensor",
        "since",
        "unit",
    )

    def __init__(self, rules: SensorRules, after: float) -> None:
        self.sensor = rules.sensor
        self.after = after
        self.band = rules.frozen_band
        self.gap = rules.stale_after
        self.unit = rules.unit if rules.kind is not Kind.PH else ""
        self.label = "pH" if rules.kind is Kind.PH else str(rules.kind)
        self.hint = _HINTS.get(rules.kind, "instrument stuck or signal held?")
        self.ref = _NAN  # the value the run began with (NaN: no run)
        self.since = _NAN  # when the run (or its count, after a silence) began
        self.last = _NAN  # the last good reading's time
        self.active = False
        # More silence the next reading may follow `last` by without restarting the count:
        # after a restart, the time the checkpoint did not hold (`resume`); then 0.
        self.grace = 0.0

    def _reads(self, *values: float) -> list[str]:
        """The readings as a message shows them, with the decimals the finest of them has (up
        to 7 significant digits, a FLOAT32's; pH at least 2): "7.004 (was 7.000)", not
        "7.00 (was 7.00)", where the usual 2 decimals or 4 figures hid the change."""
        shortest = [f"{v:.7g}" for v in values]
        if any("e" in t or "n" in t for t in shortest):  # huge, tiny or not finite: as limits read
            return [amount(v, self.unit) for v in values]
        places = max(len(t) - t.index(".") - 1 if "." in t else 0 for t in shortest)
        if not self.unit:
            return [number(v, f".{max(places, 2)}f") for v in values]
        return [f"{number(v, f'.{places}f')} {self.unit}" for v in values]

    def condition(self, t: float, value: float, ref: float, since: float, on: bool) -> Condition:
        if on:
            within = f" (within {self.band:g})" if self.band > 0 else ""
            (held_at,) = self._reads(ref)
            held = f"{self.label} reads {held_at} unchanged{within}"
            text = f"{held} for {age_text(t - since)}: {self.hint}"
        else:
            now, was = self._reads(value, ref)
            text = f"{self.label} reading changed: {now} (was {was})"
        state = ConditionState.ACTIVE if on else ConditionState.CLEARED
        return new_condition(t, self.sensor, Rule.FROZEN, state, value, self.after, FROZEN_CITATION, text)

    def hold(self, activated_at: float | None = None) -> None:
        """An alarm the journal holds active after a restart: one the checkpoint restored
        active keeps its reference, and so does one raised after the checkpoint was saved
        when the run the checkpoint holds began more than `frozen_after` before the
        activation (it is the alarm's own run): a change while the daemon was down (the probe
        cleaned) clears it at the first reading. Otherwise (no checkpoint, or a later run)
        the first reading becomes the reference (`_adopt`) and the next change clears it."""
        if self.active:
            return
        self.active = True
        own = activated_at is not None and self.since + self.after < activated_at
        if not own:  # NaN `since` (no run) compares false: no reference either
            self.ref = _NAN

    def resume(self, unsaved: float) -> None:
        """A restart from a checkpoint saved up to `unsaved` seconds before the daemon ended
        (kill -9 between two saves): the readings it saw after the save are lost, and were
        no silence. The next reading may follow `last` by that much more than `stale_after`
        and keep the run; the time the daemon was down still counts as silence."""
        self.grace = unsaved

    def shift(self, delta: float) -> None:
        """A gateway clock step: the run moves with it (no time passed in the step)."""
        self.since += delta
        self.last += delta

    def _left(self, v: float, ref: float) -> bool:
        """Whether reading `v` is a change from the run's first value `ref`."""
        if self.band == 0.0:
            return v != ref
        return abs(v - ref) > self.band + _ROUNDING * max(abs(v), abs(ref))

    def _adopt(self, t: float, v: float) -> None:
        self.ref, self.since, self.last = v, t, t

    def step(self, t: float, v: float) -> Condition | None:
        """One GOOD reading, live."""
        ref = self.ref
        grace, self.grace = self.grace, 0.0
        if math.isnan(ref):
            self._adopt(t, v)  # a first reading, or a held alarm's first after a restart
            return None
        if self._left(v, ref):
            out = self.condition(t, v, ref, _NAN, False) if self.active else None
            self.ref, self.since, self.last, self.active = v, t, t, False
            return out
        if t - self.last > self.gap + grace:
            self.since = t  # silent longer than stale_after: the count starts again
        self.last = t
        if not self.active and t - self.since > self.after:
            self.active = True
            return self.condition(t, v, ref, self.since, True)
        return None

    def batch(self, gt: Floats, gv: Floats) -> list[Condition]:
        """The good readings of a batch (times rising): what `step` gives for each."""
        if not gt.size:
            return []
        grace, self.grace = self.grace, 0.0
        if math.isnan(self.ref):
            self._adopt(float(gt[0]), float(gv[0]))
            gt, gv = gt[1:], gv[1:]
            if not gt.size:
                return []
            grace = 0.0
        change = self._changes(gv)
        prev_t = np.empty_like(gt)
        prev_t[0] = self.last
        prev_t[1:] = gt[:-1]
        silent = gt - prev_t > self.gap
        if grace:
            silent[0] = gt[0] - prev_t[0] > self.gap + grace
        reset = change | silent
        at = ffill_index(reset)
        since = np.where(at >= 0, gt[np.maximum(at, 0)], self.since)
        on = ~change & (gt - since > self.after)
        flips, final = transitions(on, change, self.active)
        out: list[Condition] = []
        if flips.size:
            starts = ffill_index(change)  # the last change at or before each reading
            for i in flips.tolist():
                if on[i]:
                    j = int(starts[i])
                    ref = float(gv[j]) if j >= 0 else self.ref
                    out.append(self.condition(float(gt[i]), float(gv[i]), ref, float(since[i]), True))
                else:  # a change: the run it ends began at the change before it
                    j = int(starts[i - 1]) if i else -1
                    ref = float(gv[j]) if j >= 0 else self.ref
                    out.append(self.condition(float(gt[i]), float(gv[i]), ref, _NAN, False))
        last_change = np.flatnonzero(change)
        if last_change.size:
            self.ref = float(gv[last_change[-1]])
        self.since = float(since[-1])
        self.last = float(gt[-1])
        self.active = final
        return out

    def _changes(self, gv: Floats) -> Bools:
        """Where a reading leaves the band around its run's first value (a new run)."""
        band = self.band
        if band == 0.0:
            change = np.empty(gv.size, bool)
            change[0] = gv[0] != self.ref
            np.not_equal(gv[1:], gv[:-1], out=change[1:])
            return change
        # Two readings more than 3 x band apart cannot both be within band of one value:
        # the later one begins a run for certain ("cuts", found for all readings at once).
        # Then in rounds, each run's first reading more than band from the run's first
        # value is the next change for certain, found in every run at once; when few runs
        # are left with one (a long slow drift), each is searched on from there.
        # (The band's rounding room, `_ROUNDING` of the larger value each side, stays well
        # inside the third band the cut leaves over, counted here three times to be sure.)
        change = np.zeros(gv.size, bool)
        mag = np.abs(gv)
        apart = np.abs(gv[1:] - gv[:-1]) > 3.0 * band + 3.0 * _ROUNDING * np.maximum(mag[1:], mag[:-1])
        change[np.flatnonzero(apart) + 1] = True
        while True:
            first = ffill_index(change)
            refs = np.where(first >= 0, gv[np.maximum(first, 0)], self.ref)
            at = np.flatnonzero(_beyond(gv, refs, band) & ~change)
            if not at.size:
                return change
            run = first[at]  # the run each one is in (by its first reading; -1: carried in)
            new = at[np.concatenate(([True], run[1:] != run[:-1]))]
            change[new] = True
            if new.size < _ROUND:
                break
        marked = np.flatnonzero(change)
        stops = np.append(marked, gv.size)[np.searchsorted(marked, new, side="right")]
        for j, end in zip(new.tolist(), stops.tolist(), strict=True):
            if end - j > 1:
                _search(gv, j + 1, end, float(gv[j]), band, change)
        return change


def _search(gv: Floats, a: int, b: int, ref: float, band: float, change: Bools) -> None:
    """Mark in `change` each reading of gv[a:b] more than `band` from its run's first value
    (`ref` at `a`), in windows that double while nothing leaves."""
    k, w = a, _SEARCH
    while k < b:
        e = min(b, k + w)
        hit = np.flatnonzero(_beyond(gv[k:e], ref, band))
        if hit.size:
            j = k + int(hit[0])
            change[j] = True
            ref = float(gv[j])
            k, w = j + 1, _SEARCH
        else:
            k, w = e, w * 2


def _beyond(gv: Floats, ref: Floats | float, band: float) -> Bools:
    """`FrozenState._left` of each reading (band > 0), the same arithmetic."""
    return np.abs(gv - ref) > band + _ROUNDING * np.maximum(np.abs(gv), np.abs(ref))
