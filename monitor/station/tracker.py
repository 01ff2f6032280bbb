"""The station on event time: pumps, the wet well's level, fail to start, high level, overflows.

Fed every sample in time order (measured and derived), live one by one and in
replay from the merged arrays (`track_arrays`): the same code in both, so the
same runs, records and alarm transitions. Readings that are not good (bad data,
comm failure, outside the kind's range) change nothing: a pump keeps its last
known state and an overflow its last known extent.

Readings of the ordinance and the issue that the code takes:
- `overflow` (the high-high level) or the overflow switch raises `overflow`, a critical
  alarm, and opens an overflow record; `high` alone raises `high_level` (no record).
- Fail to start: the level above `lead_on` for longer than `fail_to_start_delay`
  with no pump running; it clears when a pump runs or the level falls to `lead_on`.
  While the level is not known (no good reading yet: only after a restart can the alarm
  be up then) only a running pump ends it.
- After a restart the alarms the journal holds active are adopted with their activation
  (`adopt`); fail to start and high level, raised by readings, are ended only by a reading
  stamped after it, the rule of the engine's restored alarms (monitor/engine/restored.py):
  a pump's or the level's reading from before the raise (a device's buffer, a queued MQTT
  message) is evidence from before the alarm began.
- Overflow volume: with a weir, Francis' Q = C L H^1.5 on the level above the crest,
  integrated between level samples (trapezoids); without one, the station inflow above
  the capacity of the pumps running, while the level is at or above `overflow`. Both need
  the level: with no level reading while the record was open the volume is unknown (None
  and a note, never 0 gal), and with the level silent longer than its `stale_after` it is
  marked partial (`OverflowRecord.judged`, at the close).
- The level's transmitter dead at or above `overflow`: the float switch going off ends the
  overflow at its off once the level, not read since, is stale (`_float_ended`); with no
  float the record stays open (the console and report say since when the level is not read).
- One spill, one event: the next overflow opened before a level reading said the well was
  below `overflow`, within `report_within` of the end of one the float ended that way,
  continues it (`OverflowRecord.continues`: the spill's first record's start; `gap_from`: the
  end, from which nothing was measured). The first is not reopened: what was measured and
  reported stays. Kept over a restart (`StationStore.save_spill`). One the float alone
  opened then ends as the first did: once the float has stayed off `stale_after` (a
  chattering float, one record). A float bouncing at the crest with the level live just
  under `overflow`: each off ends its record (the alarm is not held back), and the next
  overflow within the level's `stale_after`, the level not read clearly below (`crest_margin`),
  continues it (`SpillLink.crest`): one spill, not a record, a page and a report per bounce.
- An open record keeps what a restart needs to go on as without one: the sensor that opened it
  (its clock), the float's last reading, its off and the volume then, the carried rate.
  Chapter 139 sets no reporting time; `report_within` (2 h default) is the utility's
  (New York's Sewage Pollution Right to Know Act asks for 2 hours).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.config.station import pump_ids
from monitor.engine.restored import after_activation
from monitor.errors import MonitorError
from monitor.model import Alarm, Clock, Condition, ConditionState, Kind, Quality, Rule, Sample, iso
from monitor.station.clocks import WellClocks
from monitor.station.daily import DailyTotals
from monitor.station.overflow import OpenOverflow, OverflowRate, SpillLink, crest_margin, switch_alone
from monitor.station.pumps import PumpRun, PumpStats
from monitor.station.record import OverflowRecord
from monitor.station.store import StationStore
from monitor.units import conversion

log = logging.getLogger(__name__)
_T = TypeVar("_T")
CITATION_OVERFLOW = "station config (overflow: report within)"
CITATION_LEVEL = "station config (wet-well setpoints)"


class StationTracker:
    """Pump statistics and wet-well events of one station; `feed` samples in time order."""

    def __init__(
        self,
        config: Config,
        store: StationStore | None = None,
        *,
        resume: bool = False,
        device: Collection[str] = (),
    ) -> None:
        """`device`: the sensors stamped by their device's clock (`reconcile.device_stamped`),
        for a well whose readings come on two clocks (`_judge_fail`)."""
        self.config = config
        self._device = frozenset(device)
        self.store = store
        well = config.wet_well
        self.pumps: dict[str, PumpStats] = {}
        for pid in (
            pump_ids(well, config.sensors) if well else [s.id for s in config.sensors if s.kind is Kind.PUMP]
        ):
            s = config.sensor(pid)
            cap = s.pump.capacity.to("gpm") if s.pump is not None and s.pump.capacity is not None else None
            self.pumps[pid] = PumpStats(pid, s.pump, cap)
        self.level_id = well.level if well else None
        self.switch_id = well.overflow_switch if well else None
        self.inflow_id = well.inflow if well else None
        sp = config.sensor(well.level).setpoints if well else None
        self.setpoints = sp
        self._overflow_at = sp.overflow if sp is not None else math.inf
        self.delay = well.fail_to_start_delay if well else math.inf
        self.report_within = well.report_within if well else 7200.0
        # The level silent longer than this during an overflow: its volume is partial there.
        self.level_stale = config.rules[well.level].stale_after if well else math.inf
        self._ranges = {sid: (*r.valid_range, frozenset(r.bad_values)) for sid, r in config.rules.items()}
        self._rate = OverflowRate(config)
        self._to_gpm = conversion(config.rules[self.inflow_id].unit, "gpm")[0] if self.inflow_id else 1.0
        self.level = math.nan
        self.level_time = -math.inf
        self.inflow_gpm = math.nan
        self.switch_on = False
        self._switch_read = False  # the float read (since the start or the restart)
        self._level_spent = False  # the level's reading the float overruled: no overflow until the next
        # An overflow the store held open at a restart: the level and the float not read since,
        # nothing says the well stopped spilling (a pump's reading first ended it, and the
        # level's next opened a second record for the one spill).
        self._well_unread = False
        # Such an overflow whose level was read while it was open: until the level is read
        # again its last word (over) stands, so the float ends it only by `_float_ended`
        # (before, its first reading, off, ended it at the restart, the volume carried past
        # the float's off that the restarted tracker does not know).
        self._level_unread = False
        # The last overflow the float ended with the level dead: the next may continue it.
        self._link = SpillLink(self.report_within, self.level_stale)
        # How far under `overflow` the level must read to say the well fell away from the crest
        # (`crest_margin`): a float bouncing at the crest with the level a hair under is one spill.
        self._crest_below = self._overflow_at - crest_margin(sp) if sp is not None else math.inf
        self.above_since: float | None = None
        self.fail_active = False
        self.fail_at = -math.inf  # when fail to start was raised
        # The sensors whose readings began the delay and raised it: their clocks measure them.
        self._above_by = ""
        self._fail_by = ""
        self._above_own: dict[bool, float] = {}  # each clock's first reading in the delay
        self.high_active = False
        # Alarms adopted from the journal at a restart, by sensor and rule, with their
        # activation (None: not known); dropped at the first reading after it. Judged on
        # `_clock` with a device clock's `_skew`.
        self._restored: dict[tuple[str, Rule], float | None] = {}
        self._clock: Clock | None = None
        self._skew = 0.0
        self._open = OpenOverflow()  # the overflow record open now and what carries it on
        self.last_time = -math.inf
        self._last: dict[str, float] = {}
        self.store_errors = 0
        self._store_failing = False
        self._unwritten: list[OverflowRecord | PumpRun] = []  # closed, the store refused (`_ended`)
        self.daily = (
            DailyTotals(config.station.id, config.station.zone, list(self.pumps), store, self.level_stale)
            if store is not None
            else None
        )
        # A pump's drive speed and motor current (pump: {speed, amps}): latest reading, for the console.
        self.drive: dict[str, tuple[str, str]] = {}
        for pid, p in self.pumps.items():
            for key in ("speed", "amps"):
                ref = getattr(p.settings, key, None) if p.settings is not None else None
                if ref is not None:
                    self.drive[ref] = (pid, key)
        self.readings: dict[str, dict[str, float]] = {pid: {} for pid in self.pumps}
        self.watched = frozenset(
            [*self.pumps, *self.drive, *(x for x in (self.level_id, self.switch_id, self.inflow_id) if x)]
        )
        # A well on two clocks (a device-stamped level beside gateway-polled pumps).
        self.clocks = WellClocks(self._device, self.watched)
        # Each sensor's `stale_after`: the station is not monitored once every sensor's last
        # reading is stale (`DailyTotals.stale_at`). Not past the shortest alone (a station
        # whose sensors report on change, each quiet within its own, was called unmonitored),
        # nor the longest (a float switch reporting on change, stale after a day, hid a daemon
        # down for 20 hours beside a level polled every minute).
        self._stale = {sid: config.rules[sid].stale_after for sid in self.watched}
        if self.daily is not None:
            self.daily.silent_after = min(self._stale.values(), default=math.inf)
        if resume and store is not None:
            self._resume(store)

    @property
    def overflow(self) -> OverflowRecord | None:
        """The overflow record open now (None: none)."""
        return self._open.record

    def _resume(self, store: StationStore) -> None:
        last = store.last_time()
        if last is not None and self.daily is not None:
            self.daily.resumed(last)  # the days the daemon was down are closed at its first reading
        for run in store.open_runs():
            p = self.pumps.get(run.pump)
            if p is not None:
                p.running, p.run_start, p.run_counted = True, run.start, run.started
        for rec in store.open_overflows():
            self._open.resumed(rec, self.level_id or self.switch_id or "")
            rec.restarted()  # the level's readings while the daemon was down may be missing
            self._well_unread = True
            if rec.level_last is not None:
                self._level_unread, self.level_time = True, rec.level_last
            # The float's last reading while open: an off after the restart is its on-to-off
            # (before, not known, it ended nothing and the record stayed open for ever).
            if rec.switch_on is not None:
                self.switch_on = rec.switch_on
        # An overflow the float ended with the level dead, and no level reading below the
        # setpoint since: the next may continue it across the restart (one spill, one event).
        spill = store.spill() if self._open.record is None else None
        if spill is not None:
            rec, end, self.level_time, crest = spill
            self._link.kept(rec, end, crest)
            # A crest's: the level was live, just under the setpoint; its word is not spent.
            self._level_spent = not crest
        # The level's last reading overruled by the float, not read since: a record the float
        # alone opened then ends as it would have (once the float stays off `stale_after`)
        # and is the next one's link (before, its first off ended it as if the level had).
        spent = store.level_spent()
        if spent is not None and (self._open.record is None or self._open.record.level_last is None):
            self._level_spent, self.level_time = True, spent
        # The starts of the last hour: starts per hour goes on counting them (a pump that
        # short-cycles across a restart), and a restored `pump_starts` keeps its evidence.
        for pid, start in store.recent_starts():
            p = self.pumps.get(pid)
            if p is not None:
                p.recent_starts.append(start)

    def adopt(self, active: Iterable[Alarm], clock: Clock, skew: float = 0.0) -> None:
        """Alarms the journal holds active after a restart: take them as the current state,
        so the tracker sends their CLEARED when the condition is over. All keep their
        activation: only a reading stamped after it ends them, unless it is in `clock`'s
        future (the clock stepped back while the daemon was down; `skew`: how far ahead a
        device may stamp, `reconcile.device_skew`). A pump's reading stamped at or before
        the activation of its long run or starts alarm changes nothing at all: the pump's
        state then is what raised the alarm (a run the store holds open, starts it holds)."""
        self._clock, self._skew = clock, skew
        for alarm in active:
            sensor, rule = alarm.sensor, alarm.rule
            pump = self.pumps.get(sensor)
            if pump is not None and rule is Rule.PUMP_STARTS:
                pump.starts_alarm = True
                pump.hold_starts_alarm(alarm.activated_at)
            elif pump is not None and rule is Rule.LONG_RUN:
                pump.long_run_alarm = True
            elif sensor == self.level_id and rule is Rule.FAIL_TO_START:
                self.fail_active = True
            elif sensor == self.level_id and rule is Rule.HIGH_LEVEL:
                self.high_active = True
            else:
                continue
            self._restored[sensor, rule] = alarm.activated_at

    def _may_end(self, sensor: str, rule: Rule, t: float) -> bool:
        """Whether a reading stamped `t` may end the restored alarm (True for one the
        tracker raised itself: its own rules hold those)."""
        key = (sensor, rule)
        if key not in self._restored:
            return True
        now = self._clock.now() if self._clock is not None else t
        if not after_activation(t, self._restored[key], now, self._skew):
            return False  # from before the alarm began: it stays as journaled
        del self._restored[key]
        return True

    def _before_restored(self, pid: str, t: float) -> bool:
        """Whether pump `pid`'s reading stamped `t` is from before its restored long run or
        starts alarm began (a device's buffer, a queued MQTT message): it changes nothing,
        neither the alarm nor the run (an "off" would end a run the alarm says went on)."""
        ends_run = self._may_end(pid, Rule.LONG_RUN, t)
        ends_starts = self._may_end(pid, Rule.PUMP_STARTS, t)
        return not (ends_run and ends_starts)

    def shift(self, delta: float, keep: Collection[str] = ()) -> None:
        """The gateway clock stepped by `delta` while the daemon runs (back, < 0, also while
        it was down, found at start): move what the tracker remembers with it
        (monitor/engine/clock_step.py). Back: otherwise every pump, level and switch
        reading stamped on the new clock was older than the last one taken and ignored
        until the clock came round again (no overflow, high level or fail to start for the
        length of the step). Forward: otherwise a run across the step lasted the step too
        (a false long run), the starts before it left the hour at once (a missed starts
        alarm), fail to start skipped its delay and an overflow's volume counted the time
        that did not pass. Either way runs, delays, starts and an overflow in progress are
        measured on the time that passed; their open records move too (kept by start).
        Only what the gateway clock stamped: a pump in `keep` (its feedback carries its
        controller's time, `reconcile.device_stamped`) keeps its runs and starts, and a
        level in `keep` the well's times (delays, the overflow): moved with the gateway,
        a run the controller stamped looked a step longer (a false `long_run`).
        Restored alarms keep the journal's activation (`_may_end` compares it with the
        clock). Local midnights stay: they are the clock's."""
        self._last = {sid: t if sid in keep else t + delta for sid, t in self._last.items()}
        moved = [pid for pid in self.pumps if pid not in keep]
        starts = [(pid, t) for pid in moved for t in self.pumps[pid].recent_starts]
        for pid in moved:
            p = self.pumps[pid]
            p.last_time += delta
            p.last_stop += delta
            p.recent_starts = deque(t + delta for t in p.recent_starts)
            if p.run_start is not None:
                p.run_start += delta
            p.starts_hold += delta
        well = (self.level_id or self.switch_id) not in keep  # the well's times are its level's
        # Fail to start's times are the clock's of the reading that set them (`_judge_fail`).
        if self.above_since is not None and self._above_by not in keep:
            self.above_since += delta
        if False in self._above_own:
            self._above_own[False] += delta
        if self._fail_by not in keep:
            self.fail_at += delta
        if well:
            self.level_time += delta
            if self._level_spent:
                self._saved_spent()
        # An open overflow's start and due time are the clock's that opened it (a gateway
        # float switch beside a device-stamped level: the gateway's).
        switch = self.switch_id or ""
        overflow = self._open.shifted(delta, keep, self.level_id or switch, switch, well)
        if self.switch_id not in keep:  # the float's off, on its clock
            self._link.end += delta
            if self._link.record is not None:
                self._saved_spill()
        self.clocks.stepped(self._last)  # the gateway's newest moves; whether they agree is found again
        if self._last:
            self.last_time = max(self._last.values())  # the latest reading taken, as it stands now
        elif moved or well:
            self.last_time += delta
        if self.daily is not None:
            # Not a silence, the clock's step; but the first forward after a restart may show
            # the gateway booted on a clock behind, and the downtime was one.
            cut = self.daily.day_end - 36 * 3600  # the silences of the days not closed move back
            # When every sensor goes stale, from their last readings as they stand now.
            stale_at = max((t + self._stale[sid] for sid, t in self._last.items()), default=-math.inf)
            silence = self.daily.stepped(delta, self.last_time, stale_at)
            if silence is not None and self.store is not None:
                self._stored(self.store.save_unmonitored, silence)
            if delta < 0 and self.store is not None:
                self._stored(functools.partial(self.store.shift_unmonitored, after=cut), delta)
        if self.store is not None:
            self._stored(functools.partial(self.store.shift_open, pumps=moved, overflow=overflow), delta)
            # The closed runs of the hour move too: a restart takes its starts from them.
            self._stored(functools.partial(self.store.shift_starts, starts), delta)

    # --- feeding ------------------------------------------------------------------------

    def feed(self, sample: Sample) -> list[Condition]:
        if sample.sensor not in self.watched:
            return []
        return self._feed(sample.sensor, sample.time, sample.value, sample.quality is Quality.GOOD)

    def _feed(self, sid: str, t: float, v: float, good: bool) -> list[Condition]:
        lo, hi, bad = self._ranges[sid]
        # `v - v == 0` is False for NaN and infinities; `bad` holds a PLC's error values.
        # Per sensor: a derived sample comes a poll late, after other sensors' later readings.
        if t < self._last.get(sid, -math.inf):
            return []
        if not (good and v - v == 0.0 and lo <= v <= hi) or (bad and v in bad):
            if sid == self.level_id and self._open.record is not None:
                self._open.record.level_missed(t)  # the volume then is an estimate
            return []
        self._last[sid] = t
        if self.clocks.mixed:
            self.clocks.compare(sid, t)
        daily = self.daily
        if daily is not None and daily.restart is not None and daily.restart_first is None:
            daily.restart_first = t  # on which clock: the first step after the restart says
        silence = None  # a silence not monitored ended here (`DailyTotals.seen`)
        if daily is not None:
            if t > daily.last:
                if t > daily.stale_at:  # every sensor's reading stale before this one
                    silence = daily.seen(t)
                else:
                    daily.last = t  # the common case, without a call
            daily.stale_at = max(daily.stale_at, t + self._stale[sid])
        if daily is not None and t >= daily.day_end:
            # A local midnight passed: that day's totals for InfluxDB, with what an overflow
            # open across it spilled to the midnight (its earlier days' share, kept for a restart).
            self._stored(functools.partial(daily.advance, live=self._open.at_midnight), t)
            if self._open.record is not None and self.store is not None:
                self._kept(self._open.record)
                self._stored(self.store.save_overflow, self._open.record)
        if silence is not None and self.store is not None:
            self._stored(self.store.save_unmonitored, silence)  # for a restart's days and reports
        self.last_time = max(self.last_time, t)
        out: list[Condition] = []
        pump = self.pumps.get(sid)
        if pump is not None:
            if t <= pump.last_time or (self._restored and self._before_restored(sid, t)):
                return []
            on = v >= 0.5
            if on is pump.running and pump.quiet(on):
                pump.last_time = t  # nothing changed and nothing to judge: the common case
                return out
            conds, run = pump.update(t, on)
            out.extend(conds)
            if run is not None and self.store is not None:
                self._ended(run, self._stored(self.store.save_run, run))
        elif sid == self.level_id:
            if self._level_spent:
                self._level_spent = False
                self._saved_spent()
            self.level, self.level_time = v, t
            below = self._crest_below if self._link.crest else self._overflow_at
            if v < below and self._link.record is not None:
                self._link.record = None  # the level says the float's end was the spill's
                self._saved_spill()
            self._well_unread = self._level_unread = False
            out.extend(self._judge_level(t))
        elif sid == self.switch_id:
            on = v >= 0.5
            self._well_unread, self._switch_read = False, True
            if self.switch_on and not on and self._open.record is not None:
                self._open.float_off_at = t
            elif on:
                self._open.float_off_at = None
            self.switch_on = on
        elif sid == self.inflow_id:
            self.inflow_gpm = v * self._to_gpm
            if self._open.record is None:
                return out
        elif sid in self.drive:
            pid, key = self.drive[sid]
            self.readings[pid][key] = v
            return out
        if (
            self._open.record is None
            and not self.switch_on
            and not (self.level >= self._overflow_at and not self._level_spent)
        ):
            if self._integrates(sid):
                self._open.carried(sid, 0.0, t)  # no overflow, none starting: nothing to integrate
        else:
            out.extend(self._judge_overflow(t, sid))
        out.extend(self._judge_fail(t, sid))
        return out

    def _judge_level(self, t: float) -> list[Condition]:
        sp = self.setpoints
        if sp is None or sp.high is None:
            return []
        above = self.level >= sp.high
        if above != self.high_active and (above or self._may_end(self.level_id or "", Rule.HIGH_LEVEL, t)):
            self.high_active = above
            state = ConditionState.ACTIVE if above else ConditionState.CLEARED
            return [
                Condition(t, self.level_id or "", Rule.HIGH_LEVEL, state, self.level, sp.high, CITATION_LEVEL)
            ]
        return []

    def _integrates(self, sid: str) -> bool:
        """Whether the overflow's volume is carried to a reading of `sid`: one of the level's
        clock, or of the other when the two agree (as on one clock: its transmitter down, the
        float switch, inflow and pumps carry the volume on, judged at the level's last value).
        Across clocks that disagree (one an hour off), the level's clock alone."""
        return self.clocks.comparable(sid, self.level_id or "")

    def _judge_fail(self, t: float, sid: str = "") -> list[Condition]:
        """Fail to start at reading `t` of sensor `sid`. In a well whose readings come on two
        clocks (a device-stamped level beside a float switch or pump polled on the gateway
        clock) that agree (`WellClocks.compare`), as on one clock: the delay from the first reading
        that found the well calling, whichever clock's. Found to disagree (one an hour off
        until NTP steps it), each clock measures it from its own first reading, and a raise
        is not held against a reading of the other. Judged across such clocks, a float
        reading on a gateway clock an hour ahead found the level above `lead_on` for an hour:
        a false `fail_to_start`, stamped an hour ahead, that a pump start on the corrected
        clock did not end. Measured on the first reading's clock only, a pump that tripped
        (its feedback on the gateway's clock, not judged again while unchanged) with the
        level on its own raised nothing at all, clocks right."""
        sp = self.setpoints
        if sp is None or self.level_id is None:
            return []
        running = any(p.running for p in self.pumps.values())
        if math.isnan(self.level) and not running:
            return []  # the level not known yet (a restart): nothing says the well stopped calling
        calling = self.level > sp.lead_on and not running
        if calling:
            if self.above_since is None:
                self.above_since, self._above_by = t, sid
            own = self._above_own.setdefault(sid in self._device, t)
            since = self.above_since if self.clocks.comparable(sid, self._above_by) else own
            if not self.fail_active and t - since >= self.delay:
                self.fail_active = True
                self.fail_at, self._fail_by = t, sid
                idle = ", ".join(self.pumps) or "no pumps configured"
                return [
                    Condition(
                        t,
                        self.level_id,
                        Rule.FAIL_TO_START,
                        ConditionState.ACTIVE,
                        self.level,
                        sp.lead_on,
                        CITATION_LEVEL,
                        message=f"level above lead_on for {t - since:.0f} s, no pump running ({idle})",
                    )
                ]
            return []
        self.above_since = None
        self._above_own.clear()
        # A reading stamped before the raise (a pump's feedback from a lagging source) is
        # evidence from before the alarm began: it does not end it; the next sample judged
        # at or after the raise does, with what is known then. A restored alarm: after.
        before = t < self.fail_at and self.clocks.comparable(sid, self._fail_by)
        if self.fail_active and not before and self._may_end(self.level_id, Rule.FAIL_TO_START, t):
            self.fail_active = False
            return [
                Condition(
                    t,
                    self.level_id,
                    Rule.FAIL_TO_START,
                    ConditionState.CLEARED,
                    self.level,
                    sp.lead_on,
                    CITATION_LEVEL,
                )
            ]
        return []

    def _float_ended(self, t: float, sid: str) -> float | None:
        """When the float switch ended the overflow that the level's last reading, at or above
        `overflow`, still says goes on: its off, if the level has not been read since and is
        stale at reading `t` of `sid` (older than its `stale_after`). Its transmitter dead, the
        level kept the record open until a level reading came: possibly forever. Judged once
        the float has stayed off (no on since) for the level's `stale_after`: judged at the
        first reading after the off, a float bouncing off for one poll at the spill crest
        ended the overflow and its on opened a second, two reports for one spill (the end is
        still the off's time, only judged later; a level reading after the off has its word);
        only across clocks that agree (`WellClocks.comparable`)."""
        off, level = self._open.float_off_at, self.level_id or ""
        # Not read since the off and the off held `stale_after`: the level is stale too.
        if off is None or self.level_time > off or t - off <= self.level_stale:
            return None
        if not (self.clocks.comparable(sid, level) and self.clocks.comparable(self.switch_id or "", level)):
            return None
        return off

    def _judge_overflow(self, t: float, sid: str = "") -> list[Condition]:
        """The overflow at reading `t` of sensor `sid`. In a well whose readings come on two
        clocks, the volume is integrated between the readings of both while they agree (the
        level's transmitter down, the float, inflow and pumps carry it on), of the level's
        clock only while they disagree (a float reading an hour ahead added an hour of flow),
        never back in time (`_carried`); the record's start is the clock's of the reading
        that opened it (a step moves it with that clock) and its end is not before its start."""
        sp = self.setpoints
        level_over = (
            sp is not None and not self._level_spent and (self.level >= sp.overflow or self._level_unread)
        )
        over = level_over or self.switch_on or self._well_unread
        rec = self._open.record
        q, method = self._rate.gpm(self.level, self.inflow_gpm, self.pumps.values())
        out: list[Condition] = []
        float_end = (
            self._float_ended(t, sid) if rec is not None and level_over and not self.switch_on else None
        )
        off = self._open.float_off_at
        if float_end is not None:
            over = False  # the float's word: the level's last reading is stale
        elif rec is not None and self._level_spent and not self.switch_on and off is not None:
            # The float alone (the level dead since it ended an earlier record) ends this one
            # as it ended that: once it has stayed off `stale_after`. Ended at its first off,
            # a float chattering at the crest made a record and a page of each bounce.
            if self.clocks.comparable(sid, self.switch_id or "") and t - off > self.level_stale:
                float_end, over = off, False
            else:
                over = True
        if self._integrates(sid) and float_end is None:
            prev = self._open.t_prev
            if rec is not None and prev > -math.inf and t > prev and rec.volume_gal is not None:
                mean = (self._open.q_prev + q) / 2.0 if method == "weir" else self._open.q_prev
                rec.volume_gal += mean * (t - prev) / 60.0
            self._open.carried(sid, q, t)
        sensor = self.level_id or self.switch_id or ""
        # The level the alarm's points give: none once older than its `stale_after` (the
        # transmitter dead, the float deciding); before, InfluxDB had the dead reading as
        # measured then (CLEARED at 9.5 ft, over the setpoint).
        read = not (
            self.clocks.comparable(sid, self.level_id or "") and t - self.level_time > self.level_stale
        )
        shown = self.level if read else math.nan
        if over and rec is None:
            rec = OverflowRecord(sensor, t, t + self.report_within, method=method, opened_by=sid)
            rec.volume_gal = 0.0 if method else None
            self._open.opened(rec, sid)
            why = "level at or above overflow" if level_over else "overflow switch on"
            extra: dict[str, float | str] = {}
            if self._link.record is not None:
                why += self._link.continued(
                    rec, t, self.clocks.comparable(sid, self.switch_id or ""), self.level
                )
                if rec.continues is not None:
                    extra["continues"] = rec.continues
                self._saved_spill()
            out.append(
                Condition(
                    t,
                    sensor,
                    Rule.OVERFLOW,
                    ConditionState.ACTIVE,
                    shown,
                    sp.overflow if sp else None,
                    CITATION_OVERFLOW,
                    message=f"{why}; report within {self.report_within / 3600:g} h",
                    extra=extra,
                )
            )
        if rec is not None and math.isfinite(self.level):
            rec.peak = self.level if math.isnan(rec.peak) else max(rec.peak, self.level)
        if rec is not None and sid and sid == self.level_id:
            rec.level_read(t)  # what the volume rests on
        if rec is not None and sid == self.switch_id and self._open.float_off_at == t:
            self._open.volume_at_off = rec.volume_gal  # carried to the float's off
        if rec is not None and sp is not None:
            # The level read under the setpoint while the float says on: the float, the
            # independent witness, keeps the record open (as when the level is stale), and
            # the record says the two disagree rather than take either silently.
            if self.switch_on and read and self.level < sp.overflow and not self._level_spent:
                rec.disagreeing(t, self.level)
            else:
                rec.agreed(t)
        if rec is not None and not over:
            if float_end is not None:
                rec.end, rec.volume_gal = max(float_end, rec.start), self._open.volume_at_off
            else:
                rec.end = t if self.clocks.same(sid, self._open.opened_by) else max(t, rec.start)
            rec.volume_gal, rec.volume_note = rec.judged(self.level_stale, rec.end)
            if sp is not None:
                rec.volume_note = switch_alone(rec, sp.overflow)
            if float_end is not None and not self._level_spent:
                self._level_spent = True
                self._saved_spent()
            # The float's word alone, the level not read since its last (over): this one's or
            # a record's before that the float ended (a chain). A later overflow may continue it.
            if self._level_spent:
                self._link.kept(rec, rec.end)
                ended = f"ended at the overflow switch's off; the level not read since {iso(self.level_time)}"
                rec.volume_note = f"{rec.volume_note}; {ended}" if rec.volume_note else ended
            elif sid == self.switch_id and not self.switch_on and read and self.level >= self._crest_below:
                # The float's off with the level live just under the setpoint: a bounce at the
                # crest if the float is back on soon, the level not clearly below (`SpillLink`).
                self._link.kept(rec, rec.end, crest=True)
            self._open.record = None
            out.append(
                Condition(
                    t,
                    sensor,
                    Rule.OVERFLOW,
                    ConditionState.CLEARED,
                    shown,
                    sp.overflow if sp else None,
                    CITATION_OVERFLOW,
                )
            )
        # The float's on or off while it is open is written at once: killed (-9) before the
        # next save, the restarted tracker would not know the float was on, and an off seen
        # after the restart would end nothing (the record open for ever).
        moved = rec is not None and sid == self.switch_id and rec.switch_on is not self.switch_on
        if rec is not None and self.store is not None and (out or rec.end is not None or moved):
            self._kept(rec)
            self._ended(rec, self._stored(self.store.save_overflow, rec))
        if rec is not None and rec is self._link.record:
            self._saved_spill()  # after its end is written: a restart in the gap links too
        return out

    def _saved_spill(self) -> None:
        """The link's candidate kept for a restart (`StationStore.save_spill`; none: dropped)."""
        if self.store is not None:
            spill = self._link.saved(self.level_time)
            self._stored(functools.partial(self.store.save_spill, crest=self._link.crest), spill)

    def _saved_spent(self) -> None:
        """Whether the level's last reading is spent, kept for a restart with its time
        (`StationStore.save_level_spent`)."""
        if self.store is not None:
            self._stored(self.store.save_level_spent, self.level_time if self._level_spent else None)

    def _kept(self, rec: OverflowRecord) -> None:
        """What a restart needs in `rec` (`OpenOverflow.kept`): the float's last reading if
        read since the start or the restart."""
        self._open.kept(rec, self.switch_on if self._switch_read else None)

    def take_daily(self) -> list[str]:
        """Line-protocol points of the local days closed since the last call."""
        return self.daily.take() if self.daily is not None else []

    def daily_queued(self) -> None:
        """The outbox took every daily line taken (`DailyTotals.queued`); a store that refuses
        the note is logged once with the other writes, and a restart sends those days again."""
        if self.daily is not None:
            self._stored(DailyTotals.queued, self.daily)

    def _ended(self, rec: OverflowRecord | PumpRun, written: bool) -> None:
        """A closed record's write the store refused (a full disk) is tried again at each
        `save`: later writes are of what is open, so its end was lost for good (the report
        "to ?", a restart taking the overflow up again as spilling, the pump as running)."""
        if not written and rec.end is not None:
            self._unwritten.append(rec)

    def save(self) -> None:
        """Persist what is in progress (open overflow volume, last event time) and the closed
        records the store refused."""
        if self.store is None:
            return
        store, unwritten, self._unwritten = self.store, self._unwritten, []
        for rec in unwritten:
            if isinstance(rec, PumpRun):
                self._ended(rec, self._stored(store.save_run, rec))
            else:
                self._ended(rec, self._stored(store.save_overflow, rec))
        if self._open.record is not None:
            self._kept(self._open.record)
            self._stored(self.store.save_overflow, self._open.record)
        if self.last_time > -math.inf:
            self._stored(self.store.save_progress, self.last_time)

    def _stored(self, write: Callable[[_T], None], arg: _T) -> bool:
        """A write to the station store; one that fails (a full disk) is logged once and
        counted, and never stops the alarms: they are judged from memory. True: written."""
        try:
            write(arg)
        except MonitorError as exc:
            self.store_errors += 1
            if not self._store_failing:
                log.error("station store: runs and overflow records not recorded: %s", exc)
            self._store_failing = True
            return False
        if self._store_failing:
            self._store_failing = False
            log.info("station store: records written again (%d write(s) lost)", self.store_errors)
        return True


def track_arrays(
    tracker: StationTracker,
    names: tuple[str, ...],
    sensor: npt.NDArray[np.integer],
    time: npt.NDArray[np.float64],
    value: npt.NDArray[np.float64],
    quality: npt.NDArray[np.integer],
) -> list[Condition]:
    """Replay: feed the station's samples of a batch (in time order) to the tracker."""
    index = {n: i for i, n in enumerate(names)}
    wanted = {index[s]: s for s in tracker.watched if s in index}
    if not wanted:
        return []
    idx = np.flatnonzero(np.isin(sensor, np.fromiter(wanted, dtype=np.int64)))
    out: list[Condition] = []
    feed = tracker._feed
    good = int(Quality.GOOD)
    for i, t, v, q in zip(
        sensor[idx].tolist(), time[idx].tolist(), value[idx].tolist(), quality[idx].tolist(), strict=True
    ):
        out.extend(feed(wanted[i], t, v, q == good))
    return out


__all__ = ["StationTracker", "track_arrays"]
