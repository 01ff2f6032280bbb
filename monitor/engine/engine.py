"""The detection engine: validate samples, keep baselines, judge limit, slug and stale rules.

Two ways in, one definition:

- `process(sample)` and `tick(now)`: the live path, one sample at a time, for the daemon;
- `replay(sensor, time, value, quality)`: whole NumPy batches for replay of history.

Replaying a batch gives the same conditions as calling `tick(t)` then
`process(sample)` for each of its samples in order (the clock follows the data).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping

import numpy as np
import numpy.typing as npt

from monitor.config import SensorRules
from monitor.engine import slug as slug_rule
from monitor.engine import slug_replay, together
from monitor.engine.arrival import DeviceWatch
from monitor.engine.badvalue import bad_value_batch, bad_value_step
from monitor.engine.baseline import Baselines, Floats
from monitor.engine.columns import Chunk, ConditionColumns
from monitor.engine.restored import after_activation
from monitor.engine.rules import LimitState
from monitor.engine.stale import NO_GOOD_SAMPLE, frozen_stamp, stale_batch, stale_condition, stamped_ahead
from monitor.engine.state import Admitted, Counters, ReplayResult, SensorState, SensorStatus
from monitor.model import (
    Clock,
    Condition,
    ConditionState,
    Kind,
    Quality,
    RefusedAhead,
    Rule,
    Sample,
    WallClock,
    iso,
)

log = logging.getLogger(__name__)

Diagnosis = tuple[Floats, Floats, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]

DEFAULT_WINDOW = 86400.0  # baseline window of sensors without a slug rule (console only)
_RULE_ORDER = {Rule.STALE: 0, Rule.BAD_VALUE: 1, Rule.HIGH: 2, Rule.LOW: 3, Rule.SLUG: 4, Rule.FROZEN: 5}
_GOOD, _BAD = int(Quality.GOOD), int(Quality.BAD_DATA)
_GOOD_Q, _BAD_Q = Quality.GOOD, Quality.BAD_DATA


def _when(t: float) -> str:
    return iso(t) if math.isfinite(t) else repr(t)


def event_order(sensors: Mapping[str, int]) -> Callable[[Condition], tuple[float, int, int, bool]]:
    """Sort key that puts conditions in time order, ties by sensor, rule, then state."""

    def key(c: Condition) -> tuple[float, int, int, bool]:
        return (
            c.time,
            sensors.get(c.sensor, -1),
            _RULE_ORDER.get(c.rule, 9),
            c.state is ConditionState.CLEARED,
        )

    return key


def _time_major(sensor: npt.NDArray[np.integer], steps: int, n_states: int) -> bool:
    """True when the batch holds every sensor once per step, in index order."""
    # In the array's own integer type where it holds every index (no cast of the batch).
    fits = sensor.dtype.kind in "iu" and np.iinfo(sensor.dtype).max >= n_states - 1
    expected = np.arange(n_states, dtype=sensor.dtype if fits else np.int64)
    return bool((sensor.reshape(steps, n_states) == expected).all())


class Engine:
    """Rolling baselines and chapter 139 rules for every sensor of a station."""

    def __init__(self, rules: Mapping[str, SensorRules], clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else WallClock()
        self.sensors: tuple[str, ...] = tuple(rules)
        self._index = {s: i for i, s in enumerate(self.sensors)}
        windows: list[float] = []
        scales: list[float] = []
        self._states: list[SensorState] = []
        for i, r in enumerate(rules.values()):
            row = -1
            if r.kind is not Kind.METER:
                row = len(windows)
                windows.append(r.slug.window if r.slug else DEFAULT_WINDOW)
                scales.append(max(abs(r.valid_range[0]), abs(r.valid_range[1])))
            self._states.append(SensorState(i, r, row))
        self._by_id = {st.sensor: st for st in self._states}
        self._judged = [st for st in self._states if st.judged]
        self.baselines = Baselines(windows, scales)
        self.last_tick = -math.inf
        # The last tick a restored checkpoint held: the gateway's own clock when it was saved
        # (readings may carry a device's clock, ahead of it); the clock watch compares it.
        self.restored_tick = -math.inf
        # How far ahead of the gateway clock a device may stamp a reading, for the restored
        # limit alarms' clock-step exception (`restore_active`, monitor/engine/restored.py).
        self.restore_skew = 0.0
        # The readings a source refused as stamped ahead of the gateway clock (`refused_ahead`).
        self.ahead: RefusedAhead | None = None
        self.counters = Counters()
        self._unknown_logged: set[str] = set()
        self.sort_key = event_order(self._index)
        self._scratch = together.Scratch()  # the 2-D path's working arrays, batch after batch
        self._parts: list[Admitted | None] = []  # the replay batch's accepted samples by sensor

    # --- accessors -------------------------------------------------------------------

    def sensor_states(self) -> tuple[SensorState, ...]:
        """Each sensor's live state in config order: what a checkpoint saves and restores
        (the engine's own objects, so a restore changes the engine in place)."""
        return tuple(self._states)

    def restore_active(
        self, sensor: str, rule: Rule, activated_at: float | None = None, skew: float = 0.0
    ) -> bool:
        """Take an alarm the journal holds as active, raised at `activated_at`, as the
        engine's own state, so it ends by the rule's own judgement (deadband, off-delay)
        and is never raised twice. As for the reconciler's alarms, a reading stamped at or
        before the activation neither starts the off-delay nor ends it, unless the gateway
        clock stepped back (`restored.after_activation`; `skew`: `reconcile.device_skew`).
        Live path only: the replay never holds an alarm. True for the limit rules and a
        frozen alarm (it ends only when the reading changes, not at the first reading after
        a restart); other rules are reconciled by the caller."""
        st = self._by_id.get(sensor)
        if st is None:
            return False
        if rule is Rule.FROZEN and st.frozen is not None:
            st.frozen.hold(activated_at)  # a change clears it (from which reference: `hold`)
            return True
        for lim in st.limits:
            if lim.rule is rule:
                lim.hold(activated_at)
                self.restore_skew = skew
                return True
        return False

    def judges_frozen(self, sensor: str) -> bool:
        """Whether the sensor has the frozen-value rule (`frozen_after`): a frozen alarm the
        journal holds for one that has it no more (a reload took it off) is the caller's to end."""
        st = self._by_id.get(sensor)
        return st is not None and st.frozen is not None

    def stamped_by_device(self, sensors: Collection[str]) -> None:
        """Mark the sensors whose readings carry their device's own time (an MQTT payload's
        `time_path`, `reconcile.device_stamped`; the daemon sets them): their stale watch
        runs on the gateway clock, from each good reading's arrival (its judgement, within
        a second of arrival in the daemon) less its delay beyond the quickest seen (a
        backlog's reading an hour old is an hour old: monitor/engine/arrival.py), and
        needs its stamp later than the last one.
        The difference of two clocks is no age: a gateway an hour ahead made a level
        reporting every 10 s look an hour old at every tick (stale raised and cleared every
        10 s), an hour behind a silent device went stale an hour late. Replay has no arrival
        and marks none: a reading's own time is its arrival there, as before."""
        for st in self._states:
            st.device = DeviceWatch() if st.sensor in sensors else None

    def refused_ahead(self, refused: RefusedAhead) -> None:
        """Where to learn of readings a source refused as stamped ahead of the gateway clock
        (MQTT `max_skew`; the daemon sets it): a sensor that goes stale while they arrive
        says so, not only "no good sample" (the gateway clock behind: check its time sync)."""
        self.ahead = refused

    def forget_active(self, sensor: str, rule: Rule) -> bool:
        """Drop a limit, slug, stale or bad-value alarm a checkpoint held active that the journal has
        normal: it cleared after the checkpoint was saved and the daemon died before the
        next one (or the sensor was removed, its alarm retired, then added again). Held,
        a new breach would pass for the old one going on and raise nothing, while the
        journal, console and callouts say normal. Its on-delay (slug: duration) starts
        again with the next reading, a stale watch with the first tick; a frozen alarm's
        unchanged run is kept (the next unchanged reading raises it again). True when there
        was something to drop; comm-loss is the sources' own, not the engine's."""
        st = self._by_id.get(sensor)
        if st is None:
            return False
        if rule is Rule.STALE:
            if not st.stale_active:
                return False
            st.stale_active = False  # the restored watch raises it again if nothing comes
            return True
        if rule is Rule.SLUG:
            if st.slug is None or not st.slug.active:
                return False
            st.slug.active = False
            st.slug.run_start = math.nan  # the next over-run is timed from its own start
            return True
        if rule is Rule.FROZEN:
            if st.frozen is None or not st.frozen.active:
                return False
            # The run stays: it is evidence the checkpoint kept. Still unchanged, the next
            # reading raises the alarm again (the journal lost it: a refused write, a
            # retired sensor added back); changed (it cleared meanwhile), a new run begins.
            st.frozen.active = False
            return True
        if rule is Rule.BAD_VALUE:
            if not st.bad_active:
                return False
            st.bad_active = False
            st.bad_since = math.nan
            return True
        for lim in st.limits:
            if lim.rule is rule and lim.active:
                lim.active = False
                lim.a_start = lim.b_start = math.nan
                lim.held = -math.inf
                return True
        return False

    def pending(self, sensor: str) -> tuple[Rule, ...]:
        """Rules of `sensor` whose on-delay or slug duration is running: the latest sample
        was beyond the limit, but not yet for long enough to be active."""
        st = self._by_id.get(sensor)
        if st is None:
            return ()
        out = [lim.rule for lim in st.limits if not lim.active and not math.isnan(lim.a_start)]
        if st.slug is not None and not st.slug.active and not math.isnan(st.slug.run_start):
            out.append(Rule.SLUG)
        return tuple(out)

    def index(self, sensor: str) -> int:
        """Position of a sensor in `sensors` (the index replay arrays use); -1 if unknown."""
        return self._index.get(sensor, -1)

    def status(self, sensor: str) -> SensorStatus:
        st = self._by_id[sensor]
        seen = st.last_time > -math.inf
        mean = self.baselines.mean(st.row) if st.row >= 0 else None
        active = [c.rule for c in st.limits if c.active]
        if st.slug is not None and st.slug.active:
            active.append(Rule.SLUG)
        if st.stale_active:
            active.append(Rule.STALE)
        if st.bad_active:
            active.append(Rule.BAD_VALUE)
        if st.frozen is not None and st.frozen.active:
            active.append(Rule.FROZEN)
        return SensorStatus(
            sensor=st.sensor,
            kind=st.rules.kind,
            unit=st.rules.unit,
            time=st.last_time if seen else None,
            value=st.value if seen and math.isfinite(st.value) else None,
            quality=st.quality,
            baseline_mean=mean,
            warming_up=self.warming_up(sensor),
            active=tuple(active),
            slug_not_judged=st.slug is not None and st.slug.not_judged(),
        )

    def statuses(self) -> list[SensorStatus]:
        return [self.status(s) for s in self.sensors]

    def baseline_mean(self, sensor: str) -> float | None:
        """The window mean the slug rule judges the sensor's next sample against."""
        st = self._by_id[sensor]
        return self.baselines.mean(st.row) if st.row >= 0 else None

    def warming_up(self, sensor: str) -> bool:
        """True while a slug sensor has less than its warm-up of history: not judged yet."""
        slug = self._by_id[sensor].slug
        return slug is not None and slug.warming_up(slug.prev_t)

    # --- live path ---------------------------------------------------------------------

    def validate(self, sample: Sample) -> Sample:
        """The sample as it will be stored: BAD_DATA when its value is not believable."""
        st = self._by_id.get(sample.sensor)
        if st is None or sample.quality is not Quality.GOOD:
            return sample
        if st.believable(sample.value):
            return sample
        return Sample(sample.sensor, sample.time, sample.value, Quality.BAD_DATA)

    def process(self, sample: Sample) -> list[Condition]:
        """Judge one sample; returns the conditions it changed (usually none)."""
        st = self._by_id.get(sample.sensor)
        if st is None:
            self._unknown(sample.sensor, sample.time)
            return []
        t = sample.time
        if not t > st.last_time:
            self._out_of_order(st, t, 1, st.last_time)
            if st.device is not None:  # arrived, but its device's clock did not advance
                st.device.refused(t, st.last_time, self._arrival())
            return []
        st.last_time = t
        st.ooo_episode = False
        if self.ahead is not None:  # a reading judged ends a run of refusals ahead, if any
            self.ahead.taken(st.sensor, t)
        self.counters.samples += 1
        v = sample.value
        st.value = v
        # Bad whichever path marked it: a source (a device error value), the daemon's
        # `validate`, or here; every one is counted and logged once per episode.
        q = sample.quality
        if (
            not (st.lo <= v <= st.hi and not (st.bad_values and v in st.bad_values))
            if q is _GOOD_Q
            else q is _BAD_Q
        ):
            st.quality = Quality.BAD_DATA
            self._bad(st, t, v, 1)
            cond = bad_value_step(st, t, v, True) if st.judged else None
            if cond is None:
                return []
            self.counters.conditions += 1
            return [cond]
        if q is not _GOOD_Q:
            st.quality = q
            self.counters.not_good += 1
            return []
        st.quality = _GOOD_Q
        if st.bad_episode:
            st.bad_episode = False
            log.info("sensor %s: believable values again from %s", st.sensor, _when(t))
        if not st.judged:
            return []
        out: list[Condition] = []
        # The stale watch's clock: a device-stamped reading's on the gateway's, from its arrival.
        arrived = self._arrival() if st.device is not None else t
        taken = st.device.taken(t, arrived) if st.device is not None else t
        if st.bad_active or st.bad_since == st.bad_since:  # a bad run to end (NaN: none)
            cond = bad_value_step(st, t, v, False)
            if cond is not None:
                out.append(cond)
        if st.stale_active and arrived - taken <= st.stale_after:  # a backlog's old reading: still stale
            st.stale_active = False
            # Raised at a tick because no reading had arrived; this one ends it when it
            # arrives. Stamped before the last tick (a device's time, a backlog after a
            # broker outage, a poll stamped at its start), it is judged at that tick, never
            # before the raise. Replay ticks at each sample's time first: always `t` there.
            # A device-stamped one ends it at its arrival on the gateway clock, as it was raised.
            ended = arrived if arrived > self.last_tick else self.last_tick
            out.append(stale_condition(st.sensor, ended, v, st.stale_after, ConditionState.CLEARED))
        # A device's reading never puts its watch back, nor starts it before the first tick
        # (NaN: a restart's, which does not count the downtime): one late against a restored
        # delivery (a gateway clock stepped forward while the daemon was down), or kept by the
        # broker for the session, raised stale at the next tick on a live PLC (a false page).
        if st.device is None or taken >= st.fresh:
            st.fresh = taken
        st.last_good = v
        for lim in st.limits:
            if t <= lim.held and not self._ends_hold(lim, t):
                lim.step_before(t, v)
                continue
            cond = lim.step(t, v)
            if cond is not None:
                out.append(cond)
        slug_cond = slug_rule.step(st.slug, self.baselines, st.row, t, v)
        if slug_cond is not None:
            out.append(slug_cond)
        if st.frozen is not None:
            frozen_cond = st.frozen.step(t, v)
            if frozen_cond is not None:
                out.append(frozen_cond)
        self.counters.conditions += len(out)
        return out

    def _ends_hold(self, lim: LimitState, t: float) -> bool:
        """Whether a reading stamped `t`, at or before a restored alarm's activation, is
        judged as usual all the same (the gateway clock stepped back); then the hold is
        over, as it is once a reading after the activation came (each later one is too)."""
        if not after_activation(t, lim.held, self.clock.now(), self.restore_skew):
            return False
        lim.held = -math.inf
        return True

    def _arrival(self) -> float:
        """The gateway clock's time a reading is judged at, never before the last tick."""
        now = self.clock.now()
        return now if now > self.last_tick else self.last_tick

    def tick(self, now: float | None = None) -> list[Condition]:
        """Raise stale conditions due at `now` (default: the clock); the daemon calls this
        every second, replay before each sample's time."""
        if now is None:
            now = self.clock.now()
        if not now > self.last_tick:
            return []
        self.last_tick = now
        out: list[Condition] = []
        for st in self._judged:
            fresh = st.fresh
            if math.isnan(fresh):
                st.fresh = now  # the watch starts with the first tick
            elif not st.stale_active and now - fresh > st.stale_after:
                st.stale_active = True
                why = NO_GOOD_SAMPLE
                if st.device is not None and st.device.frozen(now, st.stale_after):
                    why = frozen_stamp(st.last_time)
                elif self.ahead is not None and (seen := self.ahead.latest(st.sensor)) is not None:
                    arrived, ahead, count = seen
                    if now - arrived <= st.stale_after:  # still arriving, none taken
                        why = stamped_ahead(ahead, count)
                out.append(
                    stale_condition(st.sensor, now, st.last_good, st.stale_after, ConditionState.ACTIVE, why)
                )
        self.counters.conditions += len(out)
        return out

    # --- replay path -------------------------------------------------------------------

    def replay(
        self,
        sensor: npt.NDArray[np.integer],
        time: Floats,
        value: Floats,
        quality: npt.NDArray[np.integer] | None = None,
    ) -> ReplayResult:
        """Judge a batch in time order; `sensor` holds indices into `sensors` (-1: unknown)."""
        n = int(time.size)
        sensor = np.asarray(sensor)
        time = np.asarray(time, dtype=np.float64)
        value = np.asarray(value, dtype=np.float64)
        q_in = np.zeros(n, np.int8) if quality is None else np.asarray(quality).astype(np.int8)
        q_out = q_in.copy()
        accepted = np.zeros(n, dtype=bool)
        if n == 0:
            return ReplayResult(q_out, accepted, ConditionColumns([]))
        n_states = len(self._states)
        steps = n // n_states if n_states else 0
        major = bool(steps) and steps * n_states == n and _time_major(sensor, steps, n_states)
        # Every sensor of a step at the step's time (a station's export): the sensors share
        # one array of times, checked and judged once for all.
        shared = together.step_times(time, steps, n_states, self._scratch) if major else None
        if shared is None:
            if bool(np.any(time[1:] < time[:-1])):
                raise ValueError("a replay batch must be in time order")
            order_of = time
        else:  # the steps in order: the whole batch is (within a step the times are equal)
            order_of = shared
            step_of = shared[1:] - shared[:-1]
            if bool((step_of < 0).any()):
                raise ValueError("a replay batch must be in time order")
        ticks = order_of[order_of > self.last_tick] if order_of[0] <= self.last_tick else order_of
        if ticks.size:
            changes = np.flatnonzero(ticks[1:] != ticks[:-1]) + 1
            ticks = ticks[np.concatenate(([0], changes))]
            ticks = ticks[np.isfinite(ticks)]
        order: npt.NDArray[np.intp] | None = None
        s_time: Floats | None = None
        whole: list[bool] | None = None  # per sensor: every sample of the batch admitted, good
        settled: list[bool] = [False] * n_states  # per sensor: its baseline done together
        max_step = -math.inf
        if major:
            # Every sensor once at each step, in config order: grouped by sensor with one
            # transpose, sensor i's samples at i, i + S, i + 2S, ...
            values = value.reshape(steps, n_states).T.copy()
            s_value = values.reshape(-1)
            bounds = np.arange(0, n + 1, steps)
            if shared is None:
                s_time = time.reshape(steps, n_states).T.ravel()
            elif bool((step_of > 0).all()):
                max_step = float(step_of.max()) if step_of.size else -math.inf
                step_q = None if quality is None else q_in.reshape(steps, n_states)
                whole = together.whole(self._states, shared, values, step_q)
                settled = together.settle(
                    self.baselines, self._judged, whole, shared, max_step, values, self._scratch
                )
            # The qualities by sensor only for a sensor `_admit` takes sample by sample.
            some = quality is not None and (whole is None or not all(whole))
            s_q = q_in.reshape(steps, n_states).T.ravel() if some else None
        else:
            known = (sensor >= 0) & (sensor < n_states)
            key = (sensor if known.all() else np.where(known, sensor, n_states)).astype(np.uint16)
            order = np.argsort(key, kind="stable")
            bounds = np.concatenate(([0], np.cumsum(np.bincount(key, minlength=n_states + 1))))
            unknown = order[bounds[n_states] :]
            if unknown.size:
                self._unknown(f"index {int(sensor[unknown[0]])}", float(time[unknown[0]]), int(unknown.size))
            s_time, s_value = time[order], value[order]
            s_q = None if quality is None else q_in[order]
        # Each rule's transitions of each sensor, in event order (stale, bad value, limits,
        # slug; each rule's in time order), sensors in index order: a stable sort by time
        # merges them. A limit's stay arrays (`LimitRun`): no object each.
        out: list[Chunk] = []
        self._parts = [None] * n_states
        for st in self._states:
            i = st.index
            a, b = int(bounds[i]), int(bounds[i + 1])
            sel = np.arange(i, n, n_states) if order is None else order[a:b]
            ts = s_time[a:b] if s_time is not None else shared
            assert ts is not None
            known_step: float | None = None  # the largest step of gt, when known
            if whole is not None and whole[i]:
                gt, gv, diag = ts, s_value[a:b], None
                self._admit_whole(st, sel, ts, gv, q_out, accepted)
                known_step = max_step
            else:
                qs = None if s_q is None else s_q[a:b]
                gt, gv, diag = self._admit(st, sel, ts, s_value[a:b], qs, q_out, accepted)
            if not st.judged:
                continue
            out.append(stale_batch(st, ticks, gt, gv, known_step, self.last_tick))
            if diag is not None:
                out.append(bad_value_batch(st, *diag))
            elif gt.size and (st.bad_active or not math.isnan(st.bad_since)):
                out.append(bad_value_batch(st, gt[:1], gv[:1], np.zeros(1, bool), np.ones(1, bool)))
            for lim in st.limits:
                run = lim.batch_run(gt, gv)
                if run is not None:
                    out.append(run)
            if not settled[i]:
                out.append(slug_replay.batch(st.slug, self.baselines, st.row, gt, gv))
            if st.frozen is not None:
                out.append(st.frozen.batch(gt, gv))
        if ticks.size:
            self.last_tick = float(ticks[-1])
        columns = ConditionColumns(out)
        self.counters.conditions += len(columns)
        return ReplayResult(q_out, accepted, columns, self._parts)

    def _admit_whole(
        self,
        st: SensorState,
        sel: npt.NDArray[np.intp],
        ts: Floats,
        vs: Floats,
        q_out: npt.NDArray[np.int8],
        accepted: npt.NDArray[np.bool_],
    ) -> None:
        """`_admit` of a time-major batch (`sel`: every sensor count from the sensor's index)
        known (`together.whole`) to be in order and good throughout."""
        st.ooo_episode = False
        accepted[st.index :: len(self._states)] = True  # `sel` as a slice: no gather
        self._parts[st.index] = (sel, ts, vs)
        self.counters.samples += int(sel.size)
        self._believable_again(st)
        self._last_reading(st, sel, ts, vs, q_out)

    def _believable_again(self, st: SensorState) -> None:
        """The end of a bad-value episode, logged once."""
        if st.bad_episode:
            st.bad_episode = False
            log.info("sensor %s: believable values again", st.sensor)

    @staticmethod
    def _last_reading(
        st: SensorState, sel: npt.NDArray[np.intp], ts: Floats, vs: Floats, q_out: npt.NDArray[np.int8]
    ) -> None:
        """The sensor's latest admitted time, value and quality, as the status shows them."""
        st.last_time = float(ts[-1])
        st.value = float(vs[-1])
        st.quality = Quality(int(q_out[sel[-1]]))

    def _admit(
        self,
        st: SensorState,
        sel: npt.NDArray[np.intp],
        ts: Floats,
        vs: Floats,
        qs: npt.NDArray[np.int8] | None,
        q_out: npt.NDArray[np.int8],
        accepted: npt.NDArray[np.bool_],
    ) -> tuple[Floats, Floats, Diagnosis | None]:
        """Drop out-of-order samples, flag unbelievable values; returns the good ones and,
        when some were bad, what the bad-value rule needs (times, values, bad, good)."""
        empty = np.empty(0)
        if not sel.size:
            return empty, empty, None
        if ts[0] > st.last_time and bool(np.all(ts[1:] > ts[:-1])):
            st.ooo_episode = False
        else:
            before = np.fmax.accumulate(np.concatenate(([st.last_time], ts[:-1])))
            ok = ts > before
            first = int(np.flatnonzero(~ok)[0])
            self._out_of_order(st, float(ts[first]), int((~ok).sum()), float(before[first]))
            sel, ts, vs = sel[ok], ts[ok], vs[ok]
            qs = None if qs is None else qs[ok]
            if not sel.size:
                return empty, empty, None
        accepted[sel] = True
        self._parts[st.index] = (sel, ts, vs)
        self.counters.samples += int(sel.size)
        believable = (vs >= st.lo) & (vs <= st.hi)
        if st.bad_values:
            believable &= ~np.isin(vs, list(st.bad_values))
        good = believable if qs is None else believable & (qs == _GOOD)
        diag: Diagnosis | None = None
        if not good.all():
            good_q = np.ones(sel.size, dtype=bool) if qs is None else qs == _GOOD
            bad = (good_q & ~good) if qs is None else (good_q & ~good) | (qs == _BAD)
            self.counters.not_good += int(sel.size - good_q.sum() - (~good_q & bad).sum())
            if bad.any():
                q_out[sel[bad]] = _BAD
                i = int(np.flatnonzero(bad)[0])
                self._bad(st, float(ts[i]), float(vs[i]), int(bad.sum()))
                diag = (ts, vs, bad, good)
            decisive = np.flatnonzero(bad | good)
            if decisive.size and good[decisive[-1]]:
                self._believable_again(st)
        else:
            self._believable_again(st)
        self._last_reading(st, sel, ts, vs, q_out)
        if diag is None and good.all():
            return ts, vs, None
        return ts[good], vs[good], diag

    # --- bad input, logged once per episode ------------------------------------------

    def _unknown(self, sensor: str, t: float, count: int = 1) -> None:
        self.counters.unknown_sensor += count
        if sensor not in self._unknown_logged:
            self._unknown_logged.add(sensor)
            log.warning(
                "sample for unknown sensor %r at %s ignored (not in the station config)",
                sensor,
                _when(t),
            )

    def _out_of_order(self, st: SensorState, t: float, count: int, previous: float) -> None:
        self.counters.out_of_order += count
        if not st.ooo_episode:
            st.ooo_episode = True
            log.warning(
                "sensor %s: sample at %s is not later than the previous one at %s; ignored (%d so far)",
                st.sensor,
                _when(t),
                _when(previous),
                self.counters.out_of_order,
            )

    def _bad(self, st: SensorState, t: float, v: float, count: int) -> None:
        self.counters.bad_values += count
        self.counters.bad_by_sensor[st.sensor] = self.counters.bad_by_sensor.get(st.sensor, 0) + count
        if not st.bad_episode:
            st.bad_episode = True
            log.warning(
                "sensor %s: value %r at %s is not believable (valid %g..%g %s); flagged bad, not judged",
                st.sensor,
                v,
                _when(t),
                st.lo,
                st.hi,
                st.rules.unit,
            )
