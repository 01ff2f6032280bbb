"""One pump's duty on event time: runs, starts, starts per hour, longest run, and its alarms.

A run starts at the first sample that reads on and ends at the first that reads
off; with a poll interval `dt` both edges are late by less than `dt`, so a run's
length is right to within `dt` and the starts are exact. A pump whose state is
not known (no sample yet, bad or missing reading) keeps its last known state: a
polling gap neither starts nor stops a pump.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from monitor.config.station import PumpSettings
from monitor.model import Condition, ConditionState, Rule

CITATION = "station config (pump duty)"


@dataclass(slots=True)
class PumpRun:
    """One run of a pump; `end` is None while it runs."""

    pump: str
    start: float
    end: float | None = None
    started: bool = True  # False: already running when first seen (not counted as a start)


@dataclass
class PumpStats:
    sensor: str
    settings: PumpSettings | None
    capacity_gpm: float | None
    running: bool | None = None  # None: not seen yet
    run_start: float | None = None
    last_time: float = float("-inf")
    starts: int = 0
    run_seconds: float = 0.0
    longest_run: float = 0.0
    recent_starts: deque[float] = field(default_factory=deque)
    starts_alarm: bool = False
    long_run_alarm: bool = False
    run_counted: bool = False  # the run in progress began with a start we saw
    last_stop: float = float("-inf")  # when the last run ended (the longest idle pump leads next)
    starts_hold: float = float("-inf")  # a restored starts alarm without its starts: held until then

    def update(self, t: float, on: bool) -> tuple[list[Condition], PumpRun | None]:
        """A good reading at `t`; returns alarm transitions and a run that started or ended."""
        out: list[Condition] = []
        run: PumpRun | None = None
        self.last_time = t
        if self.running is None:
            self.running = on
            self.run_start = t if on else None
            run = PumpRun(self.sensor, t, started=False) if on else None
            if not on and self.long_run_alarm:  # restored, its run not in the store: off ends it
                self.long_run_alarm = False
                out.append(self._cond(t, Rule.LONG_RUN, ConditionState.CLEARED, math.nan, "run ended"))
        elif on and not self.running:
            self.running = True
            self.run_start = t
            self.run_counted = True
            self.starts += 1
            self.recent_starts.append(t)
            run = PumpRun(self.sensor, t)
        elif not on and self.running:
            self.running = False
            start = self.run_start if self.run_start is not None else t
            length = t - start
            self.run_seconds += length
            self.longest_run = max(self.longest_run, length)
            self.run_start = None
            self.last_stop = t
            run = PumpRun(self.sensor, start, t, started=self.run_counted)
            if self.long_run_alarm:
                self.long_run_alarm = False
                out.append(self._cond(t, Rule.LONG_RUN, ConditionState.CLEARED, length / 3600.0, "run ended"))
        out.extend(self.judge(t))
        return out, run

    def hold_starts_alarm(self, activated_at: float | None) -> None:
        """A starts alarm restored at a restart, raised at `activated_at`: the starts that
        raised it come back from the station store (`recent_starts`). When fewer than
        raise it are known at the activation (a store that lost them), it cannot tell when
        the window empties, only that every start that raised it is at or before the
        activation: it is held until an hour after it."""
        s = self.settings
        if activated_at is None or s is None or s.max_starts_per_hour is None:
            return
        known = sum(1 for t in self.recent_starts if activated_at - 3600.0 < t <= activated_at)
        if known <= s.max_starts_per_hour:
            self.starts_hold = activated_at + 3600.0

    def quiet(self, on: bool) -> bool:
        """True when a reading that does not change the state needs no judging either."""
        s = self.settings
        if s is None or self.starts_alarm:
            return s is None
        return not (on and s.max_run is not None and not self.long_run_alarm)

    def judge(self, t: float) -> list[Condition]:
        """Starts in the last hour and the length of the current run, at event time `t`."""
        out: list[Condition] = []
        cut = t - 3600.0
        recent = self.recent_starts
        while recent and recent[0] <= cut:
            recent.popleft()
        s = self.settings
        if s is not None and s.max_starts_per_hour is not None:
            limit = s.max_starts_per_hour
            if len(recent) > limit and not self.starts_alarm:
                self.starts_alarm = True
                out.append(
                    self._cond(
                        t,
                        Rule.PUMP_STARTS,
                        ConditionState.ACTIVE,
                        len(recent),
                        f"{len(recent)} starts in the last hour",
                        limit,
                    )
                )
            elif len(recent) <= limit and self.starts_alarm and t >= self.starts_hold:
                self.starts_alarm = False
                out.append(self._cond(t, Rule.PUMP_STARTS, ConditionState.CLEARED, len(recent), "", limit))
        if s is not None and s.max_run is not None and self.running and self.run_start is not None:
            length = t - self.run_start
            if length > s.max_run and not self.long_run_alarm:
                self.long_run_alarm = True
                out.append(
                    self._cond(
                        t,
                        Rule.LONG_RUN,
                        ConditionState.ACTIVE,
                        length / 3600.0,
                        "running longer than max_run",
                        s.max_run / 3600.0,
                    )
                )
        return out

    def run_hours_until(self, t: float) -> float:
        """Run hours so far, counting a run in progress up to `t`."""
        extra = t - self.run_start if self.running and self.run_start is not None else 0.0
        return (self.run_seconds + max(0.0, extra)) / 3600.0

    def _cond(
        self,
        t: float,
        rule: Rule,
        state: ConditionState,
        value: float,
        message: str,
        limit: float | None = None,
    ) -> Condition:
        return Condition(t, self.sensor, rule, state, float(value), limit, CITATION, message=message)


__all__ = ["PumpRun", "PumpStats"]
