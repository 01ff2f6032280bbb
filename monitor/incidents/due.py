"""What is due, in the station's local time (`station.timezone`).

Readings of chapter 139 the code takes:

- §139-15: "This notification shall be followed, within 15 days of the date of
  occurrence, by a detailed written statement". The date of occurrence is the local
  calendar date of the incident's start; the statement is due by the end of the 15th
  local day after it, so it becomes overdue at local midnight starting day 16. Days
  are counted on the calendar, not as 15 x 24 h, so a DST change in between moves
  the UTC instant by an hour and not the local deadline.
- §139-21 A: the Town serves "written notice stating the nature of the violation and
  providing a reasonable time limit for the satisfactory correction thereof". The
  time limit is entered with the notice (a note of kind `notice`). It is owed while
  the violation goes on, and overdue once the limit passes with the violation still
  going on or ending after it (§139-21 B: "continue any violation beyond the time
  limit"); a violation that ended by the limit owes nothing more.
- §139-21 B: "Each day in which any such violation shall continue shall be deemed a
  separate offense." Violation days are the local calendar dates the violation
  touches, from its start to its end (or to now while it goes on).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from monitor.incidents.model import Incident, NoteKind, Status
from monitor.model import iso


def local_date(t: float, zone: ZoneInfo) -> date:
    return datetime.fromtimestamp(t, tz=zone).date()


def local_midnight(day: date, zone: ZoneInfo) -> float:
    """The instant local `day` begins (midnight exists in every IANA zone we serve;
    where a DST change skips it, zoneinfo resolves to the first instant after)."""
    return datetime.combine(day, time(0), tzinfo=zone).timestamp()


def statement_due(start: float, zone: ZoneInfo, days: int = 15) -> float:
    """The instant the §139-15 written statement becomes overdue."""
    return local_midnight(local_date(start, zone) + timedelta(days=days + 1), zone)


def violation_days(start: float, end: float, zone: ZoneInfo) -> int:
    """§139-21 B: local calendar dates from the start to the end, both counted (an end
    at local midnight is the first moment without the violation: that day is not)."""
    first, last = local_date(start, zone), local_date(max(start, end), zone)
    if end > start and last > first and local_midnight(last, zone) == end:
        last -= timedelta(days=1)
    return (last - first).days + 1


def local_text(t: float, zone: ZoneInfo) -> str:
    """`2026-11-10 00:00 EST`: a time as the Superintendent reads it (the year in four
    digits: strftime's `%Y` makes year 26 `26`)."""
    dt = datetime.fromtimestamp(t, tz=zone)
    return f"{dt.year:04d}-{dt:%m-%d %H:%M %Z}"


def last_day_text(due: float, zone: ZoneInfo) -> str:
    """The last local day something may be done: the day before it is overdue."""
    return (datetime.fromtimestamp(due - 1, tz=zone)).strftime("%Y-%m-%d")


def check_time_limit(due: float, start: float, zone: ZoneInfo) -> float:
    """`due` as a §139-21 A notice's time limit on an incident that began at `start`, or a
    ValueError saying why not (the API's 422, the CLI's exit 2). Checked before it is stored:
    a limit the record cannot show (year 0 or 10000 in UTC or on the station's clock) made
    every later read of the incident fail (the console, `show`, `export`), and one before
    the violation began (a two-digit year in a date field: 0026) stood overdue for good."""
    try:
        shown = local_text(due, zone)
        iso(due)
    except (ValueError, OverflowError, OSError):
        raise ValueError("the time limit is outside the calendar (years 1 to 9999)") from None
    if due <= start:
        raise ValueError(f"the time limit {shown} is before the incident began ({local_text(start, zone)})")
    return due


@dataclass(frozen=True, slots=True)
class Due:
    incident: str
    what: str
    due: float
    overdue: bool

    def to_json(self, zone: ZoneInfo) -> dict[str, object]:
        return {
            "incident": self.incident,
            "what": self.what,
            "due": iso(self.due),
            "due_local": local_text(self.due, zone),
            "overdue": self.overdue,
        }


def dues(incident: Incident, now: float) -> list[Due]:
    """What is still owed on an incident, overdue or not; nothing once it is closed."""
    if incident.status is Status.CLOSED:
        return []
    out: list[Due] = []
    if not any(n.kind is NoteKind.STATEMENT for n in incident.notes):
        out.append(
            Due(
                incident.id,
                "§139-15 written statement",
                incident.statement_due,
                now >= incident.statement_due,
            )
        )
    for n in incident.notes:
        # Corrected in time (the violation ended by the notice's time limit): nothing owed.
        if n.kind is NoteKind.NOTICE and n.due is not None and (incident.end is None or incident.end > n.due):
            out.append(Due(incident.id, "§139-21 A correction by notice", n.due, now >= n.due))
    return out


def overdue(incidents: list[Incident], now: float) -> list[Due]:
    """Every overdue item, the oldest due first."""
    return sorted((d for i in incidents for d in dues(i, now) if d.overdue), key=lambda d: d.due)
