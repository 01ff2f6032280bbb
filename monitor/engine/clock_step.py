"""The gateway clock: notice when the wall clock steps, and keep judging.

Live readings are stamped by the gateway's wall clock. When NTP (or an operator)
steps it back, every new reading would be older than the last one judged and be
dropped as out of order, stale detection would wait for the old time to come round
again, and a restart would not help (the checkpoint holds the old times). So:

- `ClockWatch.check()` compares the wall clock against the monotonic clock (which
  never steps). A difference of more than `TOLERANCE` is a step. The monotonic clock is
  `boottime` (Linux CLOCK_BOOTTIME): it counts a suspend, as the wall clock does when the
  kernel resumes. `time.monotonic()` stops during one: an hour's suspend was taken for a
  step forward of an hour, and the callout's next step, the alarm reminders and the stale
  watches moved an hour later (the next person paged an hour late). Everything measured on
  the watch's clock (the callout's time served, a step's `SETTLE`, `HOLD`, the step log's
  windows) counts the suspend as time that passed, as it did for the person not answering.
  Only the heartbeat's steady run (`ClockFile.settle`, `STEADY`) is on `awake`, the clock
  that stops: it is the time NTP had to step the clock, and a suspended gateway has none.
- A step back by `d` shifts everything the engine remembers in time by `-d`
  (each sensor's last reading, timers, warm-up, the baseline ring's bucket labels,
  the stale watch): the history happened `d` earlier, new readings are in order
  and judged as before, and stale detection measures the monotonic time that passed.
  What else remembers reading times (the pumping station's tracker and derived
  sensors, monitor/station/; the meter ledger's rows the old clock stamped ahead of the
  new one, `Ledger.clock_step`; the callout's next steps and the alarm reminders' times,
  `Callout.clock_step`, `Dispatcher.clock_step`) listens on `on_step` and moves with it.
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
- Each step is logged once an episode (`StepLog`, engine/clock_log.py): a flapping clock's
  further steps are counted and summarised in one line per window, not a WARNING each.
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
- Every step is remembered while a reading stamped before it may still wait (a batch a
  full disk holds, a poll queued while two steps were noticed: an NTP sync after a bad
  RTC steps back, then forward): a reading is moved by every step after the clock that
  stamped it, found from the newest clock back (each clock's stamps run from its step to
  the next step, as above), so one queued across a step back of 1 h and forward of 30 min
  moves by -30 min, not by the last step only (before, it was not taken for an old clock's
  at all, and its sensor dropped every reading as out of order for half an hour). A step
  is forgotten once nothing the pipeline holds was handed over before it was noticed
  (`forget`, with `SETTLE` for a source's hand-over), and beyond `MAX_STEPS` (logged).
- A sensor whose readings carry their device's own time (an MQTT subscription with a
  `time_path`, `ClockWatch.device`) was never on the gateway clock: a step moves neither
  its history nor its readings, and restarts none of its timers; only its stale watch,
  which runs on the gateway clock from each reading's arrival (`Engine.stamped_by_device`),
  moves with the step. Moved back with the
  rest, its history looked a step older than it was: an excursion within its on-delay, or
  a slug run of minutes, was taken for one of hours and alarmed at the next reading.
  Knowing them, a gateway reading needs no allowance for a device clock's lead: with one
  (`mqtt.max_skew`, 300 s) a step back shorter than it moved no queued poll, and the
  poll's sensor dropped every reading as out of order for the length of the step. A
  derived sensor made only of such readings carries their time and is theirs too. A
  sensor named both ways (polled, or fed without a payload time, and with one) is refused
  (a config error; a templated subscription's message, a bad payload): one history cannot
  follow two clocks across a step. A literal name decides when a template could bind it too
  (the template's message is refused); two templates only, one with a payload time, that
  could both bind a sensor are a config error (monitor/config/clocks.py).
- At start, `check_restored()` compares the restored checkpoint with the wall
  clock: readings "from the future" mean the clock stepped back while the daemon
  was down, and are shifted the same way (a restart after a step is not blind). Or that
  the clock is not set yet: the first step forward that reaches where the history ended
  sets it, and moves the history forward by as much as the start moved it back (the
  baselines go on; left a year back, every one warmed up again).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from monitor.engine.clock_log import StepLog
from monitor.engine.engine import Engine
from monitor.engine.restored import TOLERANCE
from monitor.model import Clock, Condition, ConditionState, Rule, Sample, WallClock, iso, step_text

log = logging.getLogger(__name__)

HOLD = 300.0  # seconds of a steady clock before the diagnostic clears
GATEWAY = "gateway"  # the `sensor` of the clock condition
CITATION = "gateway clock (NTP)"
# Seconds a source may take from stamping a reading to handing it over (a Modbus poll
# hands over at once, MQTT within its linger; a flood drains in seconds): a step noticed
# that long before the oldest reading the pipeline holds was handed over moves none.
SETTLE = 60.0
MAX_STEPS = 100  # steps remembered at most (a flapping RTC while a full disk holds a batch)
_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)  # Linux only


def boottime() -> float:
    """Seconds since boot, counting a suspend (CLOCK_BOOTTIME): the wall clock is moved on by
    a suspend when the kernel resumes, and so is this, so a suspend is no step. Without it
    (not Linux) the monotonic clock, which may stop during one."""
    if _BOOTTIME is None:
        return time.monotonic()
    return time.clock_gettime(_BOOTTIME)


@dataclass(frozen=True, slots=True)
class GatewayStep:
    """One step while running: its number this run, the old clock's time when it was
    noticed, the step (seconds, < 0 back) and the monotonic time it was noticed."""

    n: int
    old: float
    step: float
    noticed: float


def shift(engine: Engine, delta: float, keep: Collection[str] = (), clock: float | None = None) -> None:
    """Move everything the engine remembers by `delta` seconds (a step back: < 0), but
    the history of the sensors in `keep`: stamped by their device's clock, it never was
    on the gateway's. `clock`: the new clock's reading less the monotonic time, onto which
    the refusals ahead move from the clock each arrived on (`RefusedAhead.shift`)."""
    for st in engine.sensor_states():
        if st.device is not None or st.sensor not in keep:  # a device's stale watch: the gateway's
            st.fresh += delta
        if st.device is not None:
            st.device.shift(delta)
        if st.sensor in keep:
            continue
        st.last_time += delta
        st.bad_since += delta
        if st.frozen is not None:
            st.frozen.shift(delta)
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
    if engine.ahead is not None:  # refusals ahead arrived on the gateway clock, as the watches run
        engine.ahead.shift(delta, clock)


def advance_watches(
    engine: Engine, delta: float, keep: Collection[str] = (), clock: float | None = None
) -> None:
    """After a step forward by `delta`: the stale watch, the limit timers (on- and
    off-delay, a bad-value run) and a slug's over run move forward with it, so each
    measures the time that passed, as the station's do (a step within `max_sample_gap`
    made a 12 min run a 16 min slug); but those of the sensors in `keep` (stamped by their
    device's clock: no time was skipped there). Restarted instead, a 3 s step put every
    on-delay in progress back to its start and every stale watch back to zero: an alarm
    up to its whole delay late. `clock`: as `shift`'s.

    The tick moves from the latest time the gateway clock is known to have reached: its
    last tick, or a reading it stamped since (the daemon ticks once a second and judges
    readings between ticks). Moved from the tick alone, a run begun at such a reading
    began after the moved tick, and the checkpoint the engine wrote then was refused for
    that sensor (`check_entry`: no run starts after the last reading or tick)."""
    gateway = [st.last_time for st in engine.sensor_states() if st.sensor not in keep]
    engine.last_tick = max([engine.last_tick, *gateway]) + delta
    if engine.ahead is not None:  # refusals ahead arrived on the gateway clock, as the watches run
        engine.ahead.shift(delta, clock)
    for st in engine.sensor_states():
        if st.device is not None or st.sensor not in keep:  # a device's stale watch: the gateway's
            st.fresh += delta
        if st.device is not None:
            st.device.shift(delta)
        if st.sensor in keep:
            continue
        st.bad_since += delta
        if st.frozen is not None:  # an unchanged run counts the time that passed, not the step
            st.frozen.shift(delta)
        for lim in st.limits:
            lim.a_start += delta
            lim.b_start += delta
        slug = st.slug
        if slug is not None:  # an over run goes on if the step is within max_sample_gap
            slug.run_start += delta
            slug.period = type(slug.period)((t + delta, q) for t, q in slug.period)


class ClockWatch:
    """Wall clock against the monotonic clock, for one engine (injectable for tests).

    `monotonic`: the clock steps are measured on, counting a suspend (`boottime`); `awake`:
    one that stops during a suspend (a test that injects only `monotonic` has the one clock
    for both: it cannot suspend)."""

    def __init__(
        self,
        engine: Engine,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = boottime,
        awake: Callable[[], float] | None = None,
    ) -> None:
        self.engine = engine
        # Sensors whose readings carry their device's time (MQTT payload times,
        # `reconcile.device_stamped`; the daemon sets them): a step of the gateway clock
        # moves neither their history nor their readings.
        self.device: frozenset[str] = frozenset()
        # The steps while running that a queued reading may still be stamped before, oldest
        # first, for `restamp`; how many were noticed; whether the first reading moved
        # after the step that began the episode (`StepLog`) was logged.
        self._steps: deque[GatewayStep] = deque()
        self._count = 0
        self._told = False
        self._capped = False  # said so in the log when MAX_STEPS dropped one
        self.step_log = StepLog()  # a step logged once an episode, the rest counted
        self.wall = wall
        self.monotonic = monotonic
        if awake is None:
            awake = time.monotonic if monotonic is boottime else monotonic
        self.awake = awake
        self._wall0 = wall()
        self._mono0 = monotonic()
        # How far `check_restored` moved the history back, and where it ended: undone by the
        # first step forward that reaches that end (an unset clock set by NTP, `_stepped`).
        self._restored_back, self._restored_end = 0.0, math.inf
        self._active_since: float | None = None  # monotonic time of the last step while active
        self._started = False
        # Told each step (seconds, < 0 back) after the engine is re-based: what else
        # remembers reading times (the pumping station's tracker and derived sensors)
        # moves with it.
        self.on_step: list[Callable[[float], None]] = []

    @property
    def generation(self) -> int:
        """How many steps were noticed while running: readings moved onto the clock of one
        generation (`restamp`) need only the steps after it."""
        return self._count

    @property
    def steps(self) -> tuple[GatewayStep, ...]:
        """The steps remembered, oldest first."""
        return tuple(self._steps)

    def forget(self, handed_over: float) -> None:
        """Forget the steps noticed more than `SETTLE` before `handed_over`, the monotonic
        time the oldest reading the pipeline still holds was handed over: every reading
        stamped before them has been judged."""
        while self._steps and self._steps[0].noticed < handed_over - SETTLE:
            self._steps.popleft()

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
        self.step_log.tick(mono)
        step = wall - (self._wall0 + (mono - self._mono0))
        self._wall0, self._mono0 = wall, mono
        if abs(step) > TOLERANCE:
            self._remember(GatewayStep(self._count + 1, wall - step, step, mono))
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
        self._restored_back, self._restored_end = newest + 1.0 - wall, newest
        return self._stepped(wall, mono, wall - newest - 1.0, " at least (while the daemon was stopped)")

    def _remember(self, step: GatewayStep) -> None:
        self._count = step.n
        self._steps.append(step)
        if len(self._steps) > MAX_STEPS:
            dropped = self._steps.popleft()
            if not self._capped:
                self._capped = True
                log.warning(
                    "gateway clock stepped %d times while readings waited; the step noticed at %s is"
                    " forgotten: a reading still queued from before it is judged at its stamp",
                    MAX_STEPS + 1,
                    iso(dropped.old),
                )

    def restamp(
        self, items: Sequence[Sample | Condition], since: int = 0, handed: float = math.inf
    ) -> tuple[Sequence[Sample | Condition], int]:
        """`items` with those stamped on a clock before a step moved onto the clock of now
        by every step after theirs (see the module docstring), and how many were moved.
        `since`: the generation the items were moved onto already (only later steps
        count). `handed`: the monotonic time the items were handed over: one queued longer
        than the step (a stall) was stamped that much further before it, and is the old
        clock's all the same. The first moved after a step is logged, naming it; the rest
        are counted."""
        steps = [s for s in self._steps if s.n > since]
        if not steps or not items:
            return items, 0
        now = self.wall()
        lo, hi = _stamps(steps[-1], now)  # the clock of now's: the common case, decided here
        device = self.device
        moved = 0
        out: list[Sample | Condition] = []
        for original in items:
            item = original
            if not lo < item.time <= hi and item.sensor not in device:
                delta, across = _moved_by(item.time, steps, now, handed)
                if delta != 0.0:
                    if not self._told:
                        self._told = True
                        log.warning(
                            "%s at %s was stamped before the gateway clock stepped %s%s; moved by %s%s to %s"
                            " onto the new clock (judged and stored there; the others counted)",
                            item.sensor,
                            iso(item.time),
                            "back" if delta < 0 else "forward",
                            "" if across == 1 else f" ({across} steps)",
                            "-" if delta < 0 else "+",
                            step_text(delta),
                            iso(item.time + delta),
                        )
                    item = replace(item, time=item.time + delta)
                    moved += 1
            out.append(item)
        return (out, moved) if moved else (items, 0)

    def _stepped(self, wall: float, mono: float, step: float, when: str) -> list[Condition]:
        clock = wall - mono  # the new clock, against which a refusal ahead's arrival is judged
        if step < 0:
            shift(self.engine, step, self.device, clock)
        elif self._restored_back > 0 and wall >= self._restored_end:
            # The clock the start moved the history back for was not set (a year behind: a
            # gateway without a battery-backed clock before NTP answered), and this step sets
            # it: the history moves forward as far as the start moved it back (left there,
            # the next reading was a year after it and every baseline warmed up again, the
            # slug rule blind for 20 h), the watches by the rest (the daemon's down time).
            back, self._restored_back = min(step, self._restored_back), 0.0
            shift(self.engine, back, self.device, clock)
            advance_watches(self.engine, step - back, self.device, clock)
        else:
            advance_watches(self.engine, step, self.device, clock)
        for listener in self.on_step:
            listener(step)
        direction = "back" if step < 0 else "forward"
        text = f"gateway clock stepped {direction} by {step_text(step)}{when}"
        what = "readings re-based" if step < 0 else "timers moved forward"
        if self.step_log.stepped(mono, step, f"{text}; {what}, judging goes on"):
            self._told = False  # a new episode: the first reading it moves is logged too
        self._active_since = mono
        return [self._condition(wall, step, ConditionState.ACTIVE, text)]

    def _condition(self, t: float, step: float, state: ConditionState, text: str) -> Condition:
        return Condition(t, GATEWAY, Rule.CLOCK, state, step, TOLERANCE, CITATION, message=text)


def _stamps(s: GatewayStep, end: float) -> tuple[float, float]:
    """The stamps (lo, hi] of the clock after step `s`, up to its `end`: from the step (after
    a step forward, only above the old clock's last stamp) to `end`, with the tolerance."""
    lo = s.old + s.step - TOLERANCE
    if s.step > 0:
        lo = max(lo, s.old + TOLERANCE)
    return lo, end + TOLERANCE


def _moved_by(
    t: float, steps: Sequence[GatewayStep], now: float, handed: float = math.inf
) -> tuple[float, int]:
    """How far a reading stamped `t` moves onto the clock of `now`, and across how many
    steps: found from the newest clock back, each clock stamping from its step (after a
    step forward, only above the old clock's last stamp) to the next step (`now` for the
    newest); the clock before the oldest step kept, within one step below its last stamp,
    or, for a reading handed over (`handed`, monotonic) longer before the step was noticed,
    within that wait and `SETTLE` (a poll a stalled pipeline queued for minutes).
    Not moved: a stamp no clock the gateway had could make (ahead of every one, or older)."""
    delta, end = 0.0, now
    for k in range(len(steps) - 1, -1, -1):
        s = steps[k]
        lo, hi = _stamps(s, end)
        if lo < t <= hi:  # this clock's
            return delta, len(steps) - 1 - k
        delta += s.step
        end = s.old
    first = steps[0]
    waited = first.noticed - handed + SETTLE if math.isfinite(handed) else 0.0
    back = max(abs(first.step), waited)
    if first.old - back < t <= first.old + TOLERANCE:
        return delta, len(steps)
    return 0.0, 0


__all__ = [
    "GATEWAY",
    "HOLD",
    "MAX_STEPS",
    "SETTLE",
    "TOLERANCE",
    "ClockWatch",
    "GatewayStep",
    "boottime",
    "shift",
    "step_text",
]
