"""One alarm's ISA-18.2 record and how each journal event changes it.

The same `apply_event` runs live and when the journal is replayed at start,
so a restored alarm is exactly the alarm that was there before the restart.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from monitor.alarms.journal import Entry
from monitor.model import Alarm, AlarmState, Priority, Rule

PRIORITY_ORDER = {Priority.CRITICAL: 0, Priority.HIGH: 1, Priority.MEDIUM: 2, Priority.LOW: 3}


@dataclass(slots=True)
class Record:
    """The manager's mutable record of one (sensor, rule) alarm."""

    sensor: str
    rule: Rule
    priority: Priority
    citation: str = ""
    message: str = ""
    value: float | None = None
    limit: float | None = None
    active: bool = False
    acknowledged: bool = True  # nothing waits for an operator while normal
    activated_at: float | None = None
    cleared_at: float | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    ack_note: str | None = None
    shelved_by: str | None = None
    shelved_until: float | None = None
    shelve_reason: str | None = None
    suppressed_by: str | None = None
    out_of_service_by: str | None = None
    out_of_service_reason: str | None = None
    activations: deque[float] = field(default_factory=deque)
    chattering: bool = False
    updated_at: float = 0.0

    def copy(self) -> Record:
        return replace(self, activations=deque(self.activations))

    @property
    def state(self) -> AlarmState:
        """ISA-18.2 state: out of service, shelved and suppressed hide the alarm state beneath."""
        if self.out_of_service_by is not None:
            return AlarmState.OUT_OF_SERVICE
        if self.shelved_until is not None:
            return AlarmState.SHELVED
        if self.suppressed_by is not None:
            return AlarmState.SUPPRESSED
        if self.active:
            return AlarmState.ACKED if self.acknowledged else AlarmState.UNACK
        return AlarmState.NORMAL if self.acknowledged else AlarmState.RTN_UNACK

    def snapshot(self) -> Alarm:
        return Alarm(
            sensor=self.sensor,
            rule=self.rule,
            state=self.state,
            priority=self.priority,
            value=self.value,
            limit=self.limit,
            citation=self.citation,
            message=self.message,
            active=self.active,
            acknowledged=self.acknowledged,
            activated_at=self.activated_at,
            cleared_at=self.cleared_at,
            acked_by=self.acked_by,
            acked_at=self.acked_at,
            ack_note=self.ack_note,
            shelved_by=self.shelved_by,
            shelved_until=self.shelved_until,
            shelve_reason=self.shelve_reason,
            chattering=self.chattering,
            updated_at=self.updated_at,
        )


def _back_in_service(rec: Record) -> None:
    """Leaving shelved, suppressed or out of service: an active alarm must be seen again."""
    rec.acknowledged = not rec.active
    if rec.active:
        rec.acked_by = rec.acked_at = rec.ack_note = None


def apply_event(rec: Record, e: Entry) -> None:
    """Change `rec` as journal entry `e` says; the one place transitions are defined."""
    ev = e.event
    if ev == "activated":
        rec.active = True
        rec.acknowledged = False
        rec.activated_at = e.time
        rec.cleared_at = None
        rec.acked_by = rec.acked_at = rec.ack_note = None
        rec.value, rec.limit = e.value, e.limit
        rec.citation = e.citation or rec.citation
        rec.message = e.message
        rec.activations.append(e.time)
    elif ev == "cleared":
        rec.active = False
        rec.cleared_at = e.time
        rec.value = e.value
        if e.message:
            rec.message = e.message
    elif ev == "acknowledged":
        rec.acknowledged = True
        rec.acked_by, rec.acked_at, rec.ack_note = e.actor, e.time, e.note
    elif ev == "shelved":
        rec.shelved_by, rec.shelved_until, rec.shelve_reason = e.actor, e.until, e.note
    elif ev in ("unshelved", "shelve_expired"):
        rec.shelved_by = rec.shelved_until = rec.shelve_reason = None
        if rec.suppressed_by is None and rec.out_of_service_by is None:
            _back_in_service(rec)
    elif ev == "suppressed":
        rec.suppressed_by = e.note or e.actor or "logic"
    elif ev == "unsuppressed":
        rec.suppressed_by = None
        if rec.shelved_until is None and rec.out_of_service_by is None:
            _back_in_service(rec)
    elif ev == "removed_from_service":
        rec.out_of_service_by, rec.out_of_service_reason = e.actor, e.note
    elif ev == "returned_to_service":
        rec.out_of_service_by = rec.out_of_service_reason = None
        rec.shelved_by = rec.shelved_until = rec.shelve_reason = None
        if rec.suppressed_by is None:
            _back_in_service(rec)
    elif ev == "chattering":
        rec.chattering = True
    elif ev == "chattering_ended":
        rec.chattering = False
    rec.updated_at = e.time


def sort_key(alarm: Alarm) -> tuple[int, int, float]:
    """Console order: priority, then what waits for a person, then newest first."""
    waiting = 0 if alarm.state in (AlarmState.UNACK, AlarmState.RTN_UNACK) else 1
    return (PRIORITY_ORDER[alarm.priority], waiting, -(alarm.activated_at or alarm.updated_at))
