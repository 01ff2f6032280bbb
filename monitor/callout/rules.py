"""Which pipeline takes an alarm, and who is on call: schedules in station local time.

A pipeline's `match` lists are ANDed, each list ORs its entries, an empty list
matches everything; sensors may be globs (`outfall.*`). The first pipeline in
config order that matches takes the alarm (like a firewall's rules), so a narrow
pipeline goes above a catch-all.
"""

from __future__ import annotations

from datetime import datetime, time
from fnmatch import fnmatchcase
from zoneinfo import ZoneInfo

from monitor.config import Config
from monitor.config.notify import DAYS, EscalationPipeline, Notify, Schedule
from monitor.model import Alarm


def local(t: float, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t, zone)


def in_force(schedule: Schedule, holidays: frozenset[object], t: float, zone: ZoneInfo) -> bool:
    """True when `t` falls in the schedule. A period that runs over midnight (`to` before
    `from`) belongs to the day it started on; a holiday's day name is `holiday`."""
    now = local(t, zone)
    start, end = schedule.from_, schedule.to
    today, clock = now.date(), now.time()
    if start < end:
        return _day(today, holidays) in schedule.days and start <= clock and (clock < end or end == time.max)
    # over midnight: the evening of a listed day, or the morning after one
    if clock >= start:
        return _day(today, holidays) in schedule.days
    if clock < end:
        yesterday = (now - _ONE_DAY).date()
        return _day(yesterday, holidays) in schedule.days
    return False


def _day(d: object, holidays: frozenset[object]) -> str:
    if d in holidays:
        return "holiday"
    return DAYS[d.weekday()]  # type: ignore[attr-defined]


class Matcher:
    """Compiled once from the config: pipelines in order, sensors' dischargers, holidays."""

    def __init__(self, config: Config) -> None:
        assert config.notify is not None
        self.notify: Notify = config.notify
        self.zone = config.station.zone
        self.holidays = frozenset[object](self.notify.holidays)
        self.dischargers = {s.id: s.discharger for s in config.sensors}

    def in_force(self, pipeline: EscalationPipeline, t: float) -> bool:
        name = pipeline.match.schedule
        if name is None:
            return True
        return in_force(self.notify.schedules[name], self.holidays, t, self.zone)

    def pipeline(self, alarm: Alarm, t: float) -> EscalationPipeline | None:
        for p in self.notify.pipelines:
            m = p.match
            if m.priorities and alarm.priority not in m.priorities:
                continue
            if m.rules and alarm.rule not in m.rules:
                continue
            if m.sensors and not any(fnmatchcase(alarm.sensor, pat) for pat in m.sensors):
                continue
            if m.dischargers and self.dischargers.get(alarm.sensor) not in m.dischargers:
                continue
            if not self.in_force(p, t):
                continue
            return p
        return None

    def on_call(self, t: float) -> list[dict[str, object]]:
        """Per pipeline in force now: its roster's first person (the one a new alarm reaches)."""
        out: list[dict[str, object]] = []
        for p in self.notify.pipelines:
            if not self.in_force(p, t):
                continue
            roster = self.notify.rosters[p.roster]
            first = self.notify.people[roster[0]]
            out.append({"pipeline": p.name, "roster": p.roster, "person": roster[0], "name": first.name})
        return out


_ONE_DAY = datetime(2000, 1, 2) - datetime(2000, 1, 1)
