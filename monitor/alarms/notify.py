"""Telling people: the Notifier protocol, the log notifier, and the dispatcher that
applies EEMUA 191 flood handling, chattering suppression and re-notification.

Two kinds of consumer take alarm snapshots from the dispatcher:

- *mirrors* (MQTT retained topics, a SCADA link) get every transition, unfiltered,
  so their copy of the alarm state is always right;
- *notifiers* (webhook pager, log) reach people, so they get one flood notice
  instead of dozens, nothing more from an alarm flagged chattering until it
  calms down, and a reminder for an unacknowledged high-priority alarm every
  `renotify_interval`.

Each consumer has its own queue and task: a slow pager never delays MQTT.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from monitor.alarms.figures import figures
from monitor.alarms.journal import Entry
from monitor.alarms.manager import AlarmManager
from monitor.config import Alarms
from monitor.model import Alarm, AlarmState, Clock, Priority, iso

log = logging.getLogger(__name__)

_URGENT = (Priority.CRITICAL, Priority.HIGH)
_HIDDEN = (AlarmState.SHELVED, AlarmState.SUPPRESSED, AlarmState.OUT_OF_SERVICE)
_CONDITION_EVENTS = ("activated", "cleared", "chattering", "chattering_ended")
_QUEUE_MAX = 1000


@dataclass(frozen=True, slots=True)
class Flood:
    """An alarm flood (EEMUA 191: more than `flood_count` alarms in `flood_window`).

    Announced once when it starts (`active`, `count` alarms in the window) and
    once when it is over (`count` notifications withheld meanwhile). `alarms`
    holds the alarms raised in the window at the start, and those still waiting
    for acknowledgement at the end.
    """

    time: float
    active: bool
    count: int
    window: float
    alarms: tuple[Alarm, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "time": iso(self.time),
            "flood": "started" if self.active else "ended",
            "count": self.count,
            "window_seconds": self.window,
            "alarms": [a.to_json() for a in self.alarms],
        }

    @property
    def text(self) -> str:
        minutes = f"{self.window / 60:g} min"
        if self.active:
            return f"ALARM FLOOD: {self.count} alarms in {minutes}; individual notifications withheld"
        waiting = len(self.alarms)
        return f"alarm flood over: {self.count} notifications withheld, {waiting} alarms unacknowledged"


class Notifier(Protocol):
    """What the dispatcher calls. Raise on failure (it is logged once per episode)."""

    name: str

    async def notify(self, alarm: Alarm, reminder: bool = False) -> None:
        """An alarm changed state (or, with `reminder`, still waits for acknowledgement)."""

    async def flood(self, flood: Flood) -> None:
        """A flood started or ended."""


class LogNotifier:
    """Alarms in the daemon's log (journald): WARNING for what needs a person, INFO otherwise."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None, units: Mapping[str, str] | None = None) -> None:
        self.log = logger or logging.getLogger("monitor.alarms.notify.log")
        self.units: Mapping[str, str] = units or {}

    async def notify(self, alarm: Alarm, reminder: bool = False) -> None:
        """One line; its figures say what they are ("limit 21600" for a frozen alarm was six
        hours, "value 5" for a comm loss five failed polls)."""
        level = logging.WARNING if alarm.state is AlarmState.UNACK else logging.INFO
        what = "still unacknowledged" if reminder else alarm.state.value.replace("_", " ")
        unit = self.units.get(alarm.sensor, "")
        shown = figures(alarm, unit)
        self.log.log(
            level,
            "alarm %s/%s %s (%s)%s [%s]%s",
            alarm.sensor,
            alarm.rule,
            what,
            alarm.priority,
            f": {shown}" if shown else "",
            alarm.citation,
            " chattering" if alarm.chattering else "",
        )

    async def flood(self, flood: Flood) -> None:
        self.log.warning("%s", flood.text)


class _Outlet:
    """One consumer's queue and task; failures logged once per episode."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(_QUEUE_MAX)
        self.failing = False
        self.dropped = 0
        self.failed = 0
        self.sent = 0

    def put(self, job: Callable[[], Awaitable[None]]) -> None:
        if self.queue.full():
            self.queue.get_nowait()
            self.queue.task_done()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.error("notifier %s is behind: %d notifications dropped", self.notifier.name, self.dropped)
        self.queue.put_nowait(job)

    async def run(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed += 1
                if not self.failing:
                    log.error("notifier %s failed: %s", self.notifier.name, exc)
                else:
                    log.debug("notifier %s still failing: %s", self.notifier.name, exc)
                self.failing = True
            else:
                self.sent += 1
                if self.failing:
                    log.info("notifier %s recovered", self.notifier.name)
                self.failing = False
            finally:
                self.queue.task_done()


class Dispatcher:
    """Fans alarm transitions out to mirrors and notifiers; see the module docstring."""

    def __init__(
        self,
        config: Alarms,
        clock: Clock,
        notifiers: Sequence[Notifier] = (),
        mirrors: Sequence[Notifier] = (),
    ) -> None:
        self.config = config
        self.clock = clock
        self._notifiers = [_Outlet(n) for n in notifiers]
        self._mirrors = [_Outlet(m) for m in mirrors]
        self._manager: AlarmManager | None = None
        self._recent: deque[tuple[float, Alarm]] = deque()
        self.in_flood = False
        self.withheld = 0
        self.floods = 0
        self._last_sent: dict[tuple[str, str], float] = {}
        # Reminder times a clock behind them replaced with its now (`tick`), as they were.
        self._behind: dict[tuple[str, str], float] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def attach(self, manager: AlarmManager) -> None:
        """Listen to a manager's transitions; re-notification reads its alarms."""
        self._manager = manager
        manager.listen(self.on_transition)

    def on_transition(self, entry: Entry, alarm: Alarm) -> None:
        for outlet in self._mirrors:
            outlet.put(_notify(outlet.notifier, alarm, False))
        if entry.event == "activated" and alarm.state is AlarmState.UNACK:
            self._recent.append((entry.time, alarm))
        self._check_flood(entry.time)
        if self.in_flood:
            self.withheld += 1
            return
        if alarm.chattering and entry.event in ("activated", "cleared"):
            return  # flagged once ("chattering"); every flap after that is noise to a person
        if entry.event == "suppressed":
            return
        if alarm.state in _HIDDEN and entry.event in _CONDITION_EVENTS:
            return  # shelved, suppressed or out of service: the point is not to page anyone
        self._last_sent[(alarm.sensor, str(alarm.rule))] = entry.time
        for outlet in self._notifiers:
            outlet.put(_notify(outlet.notifier, alarm, False))

    def _check_flood(self, now: float) -> None:
        while self._recent and self._recent[0][0] <= now - self.config.flood_window:
            self._recent.popleft()
        many = len(self._recent) > self.config.flood_count
        if many and not self.in_flood:
            self.in_flood = True
            self.floods += 1
            self.withheld = 0
            raised = tuple(a for _, a in self._recent)
            flood = Flood(now, True, len(raised), self.config.flood_window, raised)
            self._announce(flood)
        elif not many and self.in_flood:
            self.in_flood = False
            waiting: tuple[Alarm, ...] = ()
            if self._manager is not None:
                waiting = tuple(a for a in self._manager.active() if a.state is AlarmState.UNACK)
            self._announce(Flood(now, False, self.withheld, self.config.flood_window, waiting))
            for alarm in waiting:
                self._last_sent[(alarm.sensor, str(alarm.rule))] = now

    def _announce(self, flood: Flood) -> None:
        for outlet in [*self._mirrors, *self._notifiers]:
            outlet.put(_flood(outlet.notifier, flood))

    def tick(self, now: float | None = None) -> None:
        """End a flood that has passed; remind about unacknowledged high-priority alarms."""
        now = self.clock.now() if now is None else now
        self._check_flood(now)
        interval = self.config.renotify_interval
        if self.in_flood or interval <= 0 or self._manager is None:
            return
        for alarm in self._manager.active():
            if alarm.state is not AlarmState.UNACK or alarm.priority not in _URGENT or alarm.chattering:
                continue
            key = (alarm.sensor, str(alarm.rule))
            last = self._last_sent.get(key, alarm.updated_at)
            if last > now:
                # The clock is behind the alarm's last change or reminder (a restart on a clock
                # not set yet, a step back): `now - last` stayed negative until the clock came
                # round again, a year on an unset clock, and no reminder came. Measured from now;
                # the time it was measured from before is kept for a step forward (`clock_step`).
                self._behind.setdefault(key, last)
                self._last_sent[key] = last = now
            if now - last >= interval:
                self._last_sent[key] = now
                for outlet in self._notifiers:
                    outlet.put(_notify(outlet.notifier, alarm, True))

    def clock_step(self, step: float, now: float | None = None) -> None:
        """The gateway clock stepped forward by `step` (the daemon's clock watch): the
        reminder times kept on the old clock move with it, so the next reminder comes
        `renotify_interval` of real time after the last, not at once (NTP after a restart on
        an unset clock: the first tick's time, a year old on the new clock, reminded 15
        minutes early). One a clock behind it had replaced (`tick`) is due at the earlier of
        that and the time it was measured from before, back on that clock (a 2 h power cut:
        overdue, at once). Never past `now` (a device-stamped alarm's time was not the gateway
        clock's). A step back needs nothing: a time ahead of the clock is measured from now."""
        if step <= 0:
            return
        now = self.clock.now() if now is None else now
        for key, last in self._last_sent.items():
            self._last_sent[key] = min(last + step, self._behind.pop(key, math.inf), now)
        self._behind.clear()

    async def run(self) -> None:
        """Deliver until cancelled; one task per consumer."""
        outlets = [*self._mirrors, *self._notifiers]
        self._tasks = [asyncio.create_task(o.run(), name=f"notify-{o.notifier.name}") for o in outlets]
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()

    async def drain(self) -> None:
        """Wait until every queued notification was attempted (shutdown, tests)."""
        for outlet in [*self._mirrors, *self._notifiers]:
            await outlet.queue.join()

    def stats(self) -> dict[str, object]:
        """For the health page: per consumer sent/failed/dropped, and flood state."""
        return {
            "in_flood": self.in_flood,
            "floods": self.floods,
            "consumers": {
                o.notifier.name: {
                    "sent": o.sent,
                    "failed": o.failed,
                    "dropped": o.dropped,
                    "failing": o.failing,
                }
                for o in [*self._mirrors, *self._notifiers]
            },
        }


def _notify(notifier: Notifier, alarm: Alarm, reminder: bool) -> Callable[[], Awaitable[None]]:
    async def job() -> None:
        await notifier.notify(alarm, reminder)

    return job


def _flood(notifier: Notifier, flood: Flood) -> Callable[[], Awaitable[None]]:
    async def job() -> None:
        await notifier.flood(flood)

    return job
