"""The gateway clock: notice when the wall clock steps, and keep judging.

Live readings are stamped by the gateway's wall clock. When NTP (or an operator)
steps it back, every new reading would be older than the last one judged and be
dropped as out of order, stale detection would wait for the old time to come round
again, and a restart would not help (the checkpoint holds the old times). So:

- `ClockWatch.check()` compares the wall clock against the monotonic clock (which
  never steps). A difference of more than `TOLERANCE` is a step.
- A step back by `d` shifts everything the engine remembers in time by `-d`
  (each sensor's last reading, timers, warm-up, the baseline ring's bucket labels,
  the stale watch): the history happened `d` earlier, new readings are in order
  and judged as before, and stale detection measures the monotonic time that passed.
  What else remembers reading times (the pumping station's tracker and derived
  sensors, monitor/station/; the meter ledger's rows the old clock stamped ahead of the
  new one, `Ledger.clock_step`) listens on `on_step` and moves with it.
- A step forward by `d` moves the stale watch and the limit timers forward by `d`
  (no false stale alarm for the time that did not pass, and none late: an on-delay
  or a stale watch in progress goes on measuring the time that passed); a baseline
  that sees a gap longer than its window warms up again, as any long gap does. The
  rest of the engine's history stays where it is: new readings are later anyway.
  The station's tracker and derived sensors
  do measure spans (a pump run, starts in the last hour, the fail-to-start delay, an
  overflow's volume, a rate over a window): `on_step` moves them forward by `d`, so
  those spans are the time that passed, as after a step back.
- Either way a diagnostic `clock` condition says "gateway clock stepped back by …"
  and clears after `HOLD` seconds of a steady clock.
- Readings stamped on the clock before a step but judged after it (a poll queued
  while the step was noticed) are moved onto the new clock by the step (`restamp`),
  as the history they follow was: judged at their old stamp, the first of them
  would put the sensor's last reading back on the old clock and every reading after
  it would be dropped as out of order for the length of the step. Which readings:
  after a step back, those stamped ahead of the new clock by more than `TOLERANCE`
  (no clock but the old one stamped them; decided until the new clock passes the old
  one's last stamp); after a step forward, those stamped
  at or before the old clock's time when the step was noticed, within one step of it
  (the new clock stamps nothing there). Counted, and logged once a step.
- A sensor whose readings carry their device's own time (an MQTT subscription with a
  `time_path`, `ClockWatch.device`) was never on the gateway clock: a step moves neither
  its history nor its readings, and restarts none of its timers. Moved back with the
  rest, its history looked a step older than it was: an excursion within its on-delay, or
  a slug run of minutes, was taken for one of hours and alarmed at the next reading.
  Knowing them, a gateway reading needs no allowance for a device clock's lead: with one
  (`mqtt.max_skew`, 300 s) a step back shorter than it moved no queued poll, and the
  poll's sensor dropped every reading as out of order for the length of the step. A
  sensor fed both ways (polled and with a payload time) is taken for the gateway's.
- At start, `check_restored()` compares the restored checkpoint with the wall
  clock: readings "from the future" mean the clock stepped back while the daemon
  was down, and are shifted the same way (a restart after a step is not blind).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from monitor.engine.engine import Engine
from monitor.engine.restored import TOLERANCE
from monitor.model import Clock, Condition, ConditionState, Rule, Sample, WallClock, iso, step_text

log = logging.getLogger(__name__)

HOLD = 300.0  # seconds of a steady clock before the diagnostic clears
GATEWAY = "gateway"  # the `sensor` of the clock condition
CITATION = "gateway clock (NTP)"


def shift(engine: Engine, delta: float, keep: Collection[str] = ()) -> None:
    """Move everything the engine remembers by `delta` seconds (a step back: < 0), but
    the history of the sensors in `keep`: stamped by their device's clock, it never was
    on the gateway's."""
    for st in engine.sensor_states():
        if st.sensor in keep:
            continue
        st.last_time += delta
        st.fresh += delta
        st.bad_since += delta
        for lim in st.limits:
            lim.a_start += delta
            lim.b_start += delta
        slug = st.slug
        if st.row >= 0:
            k = engine.baselines.relabel(st.row, delta)
            if slug is not None and k:
                slug.pending = {b + k: qc for b, qc in slug.pending.items()}
        if slug is not None:
            slug.prev_t += delta
            slug.warm_since += delta
            slug.run_start += delta
            slug.period = type(slug.period)((t + delta, q) for t, q in slug.period)
    engine.last_tick += delta


def advance_watches(engine: Engine, delta: float, keep: Collection[str] = ()) -> None:
    """After a step forward by `delta`: the stale watch, the limit timers (on- and
    off-delay, a bad-value run) and a slug's over run move forward with it, so each
    measures the time that passed, as the station's do (a step within `max_sample_gap`
    made a 12 min run a 16 min slug); but those of the sensors in `keep` (stamped by their
    device's clock: no time was skipped there). Restarted instead, a 3 s step put every
    on-delay in progress back to its start and every stale watch back to zero: an alarm
    up to its whole delay late."""
    engine.last_tick += delta
    for st in engine.sensor_states():
        if st.sensor in keep:
            continue
        st.fresh += delta
        st.bad_since += delta
        for lim in st.limits:
            lim.a_start += delta
            lim.b_start += delta
        slug = st.slug
        if slug is not None:  # an over run goes on if the step is within max_sample_gap
            slug.run_start += delta
            slug.period = type(slug.period)((t + delta, q) for t, q in slug.period)


class ClockWatch:
    """Wall clock against the monotonic clock, for one engine (injectable for tests)."""

    def __init__(
        self,
        engine: Engine,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        # Sensors whose readings carry their device's time (MQTT payload times,
        # `reconcile.device_stamped`; the daemon sets them): a step of the gateway clock
        # moves neither their history nor their readings.
        self.device: frozenset[str] = frozenset()
        # The last step while running: (the old clock's time when it was noticed, the step),
        # for `restamp`; whether its first moved reading was logged.
        self._step: tuple[float, float] | None = None
        self._told = False
        self.wall = wall
        self.monotonic = monotonic
        self._wall0 = wall()
        self._mono0 = monotonic()
        self._active_since: float | None = None  # monotonic time of the last step while active
        self._started = False
        # Told each step (seconds, < 0 back) after the engine is re-based: what else
        # remembers reading times (the pumping station's tracker and derived sensors)
        # moves with it.
        self.on_step: list[Callable[[float], None]] = []

    @property
    def step(self) -> tuple[float, float] | None:
        """The last step while running, (the old clock's time when it was noticed, the
        step), while readings of the old clock may still arrive; a new tuple each step."""
        return self._step

    @classmethod
    def for_clock(
        cls, engine: Engine, clock: Clock, active: Collection[tuple[str, Rule]] = ()
    ) -> ClockWatch | None:
        """A watch for the real clock; None for a test's or the demo's accelerated clock.
        `active`: the alarms a restart restored as active; a clock alarm among them
        clears after `HOLD` of a steady clock, like one raised in this run."""
        if not isinstance(clock, WallClock):
            return None
        watch = cls(engine)
        if (GATEWAY, Rule.CLOCK) in active:
            watch._active_since = watch._mono0
        return watch

    def check(self) -> list[Condition]:
        """Conditions for a step since the last check (and the clear after `HOLD`); the
        first check also looks at the history a checkpoint restored."""
        if not self._started:
            self._started = True
            restored = self.check_restored()
            if restored:
                return restored
        wall, mono = self.wall(), self.monotonic()
        step = wall - (self._wall0 + (mono - self._mono0))
        self._wall0, self._mono0 = wall, mono
        if abs(step) > TOLERANCE:
            self._step, self._told = (wall - step, step), False
            return self._stepped(wall, mono, step, "")
        if self._active_since is not None and mono - self._active_since >= HOLD:
            self._active_since = None
            return [self._condition(wall, 0.0, ConditionState.CLEARED, "gateway clock steady again")]
        return []

    def check_restored(self) -> list[Condition]:
        """At start: a restored history newer than the wall clock means it stepped back."""
        wall, mono = self.wall(), self.monotonic()
        self._wall0, self._mono0 = wall, mono
        # The last tick is the gateway's own clock; readings may be stamped by a device's
        # (MQTT payload times, up to mqtt.max_skew ahead): they decide only without a tick.
        newest = self.engine.restored_tick
        if not math.isfinite(newest):
            newest = max((st.last_time for st in self.engine.sensor_states()), default=-math.inf)
            newest = max(newest, self.engine.last_tick)
        if not math.isfinite(newest) or newest - wall <= TOLERANCE:
            return []
        # How long the daemon was down is unknown: the history ends a second before now.
        return self._stepped(wall, mono, wall - newest - 1.0, " at least (while the daemon was stopped)")

    def restamp(self, items: Sequence[Sample | Condition]) -> tuple[Sequence[Sample | Condition], int]:
        """`items` with those stamped on the clock before the last step moved onto the new
        one by the step (see the module docstring), and how many were moved. The first
        moved after a step is logged, naming it; the rest are only counted."""
        if self._step is None or not items:
            return items, 0
        old, step = self._step
        if step < 0:
            lo, hi = self.wall() + TOLERANCE, old + TOLERANCE
            if lo >= hi:  # the new clock passed every stamp of the old one
                self._step = None
                return items, 0
        else:
            lo, hi = old - step, old + TOLERANCE
        moved = 0
        out: list[Sample | Condition] = []
        for original in items:
            item = original
            if lo < item.time <= hi and item.sensor not in self.device:
                if not self._told:
                    self._told = True
                    log.warning(
                        "%s at %s was stamped before the gateway clock stepped %s; moved by %s%s to %s"
                        " onto the new clock (judged and stored there; the others counted)",
                        item.sensor,
                        iso(item.time),
                        "back" if step < 0 else "forward",
                        "-" if step < 0 else "+",
                        step_text(step),
                        iso(item.time + step),
                    )
                item = replace(item, time=item.time + step)
                moved += 1
            out.append(item)
        return (out, moved) if moved else (items, 0)

    def _stepped(self, wall: float, mono: float, step: float, when: str) -> list[Condition]:
        if step < 0:
            shift(self.engine, step, self.device)
        else:
            advance_watches(self.engine, step, self.device)
        for listener in self.on_step:
            listener(step)
        direction = "back" if step < 0 else "forward"
        text = f"gateway clock stepped {direction} by {step_text(step)}{when}"
        what = "readings re-based" if step < 0 else "timers moved forward"
        log.warning("%s; %s, judging goes on", text, what)
        self._active_since = mono
        return [self._condition(wall, step, ConditionState.ACTIVE, text)]

    def _condition(self, t: float, step: float, state: ConditionState, text: str) -> Condition:
        return Condition(t, GATEWAY, Rule.CLOCK, state, step, TOLERANCE, CITATION, message=text)


__all__ = ["GATEWAY", "HOLD", "TOLERANCE", "ClockWatch", "shift", "step_text"]
