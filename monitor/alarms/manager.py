"""The alarm manager: conditions and operator actions in, journaled ISA-18.2 transitions out."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from monitor.alarms.journal import Entry, Journal
from monitor.alarms.late import LateEntries
from monitor.alarms.state import Record, apply_event, sort_key
from monitor.config import Alarms, Config
from monitor.errors import AlarmError, StateError
from monitor.model import Alarm, AlarmState, Clock, Condition, ConditionState, Priority, Rule, iso
from monitor.writeonce import KeyStore, WriteKey

log = logging.getLogger(__name__)

Listener = Callable[[Entry, Alarm], None]
"""Called after every journaled transition, on the caller's thread (the event loop)."""

# The note of an activation that continues an earlier one's event (an overflow continuing a
# spill: monitor/station/overflow.py `SpillLink`): journaled, and the call-out walks the
# event's one escalation on instead of starting one per activation (a float bouncing at the
# crest paged per bounce; a clear that ended the escalation then paged nobody for hours).
CONTINUES = "continues the event from "


def continues_note(condition: Condition) -> str | None:
    """The activation's note if `condition` continues an earlier event (its `continues`)."""
    first = condition.extra.get("continues")
    return f"{CONTINUES}{iso(first)}" if isinstance(first, float) else None


def continues_from(note: str | None) -> float | None:
    """The event's start a `continues_note` names (to the millisecond); None for any other note."""
    if not note or not note.startswith(CONTINUES):
        return None
    try:
        return datetime.fromisoformat(note.removeprefix(CONTINUES)).timestamp()
    except ValueError:
        return None


_NAME_MAX = 100
_TEXT_MAX = 500


class AlarmManager:
    """One alarm per (sensor, rule), its state machine, and the journal behind it.

    Every change is written to the journal first and applied second, so what
    the console shows is always something the journal can prove. Not
    thread-safe: call it from the daemon's event loop.
    """

    def __init__(self, config: Alarms, journal: Journal, clock: Clock) -> None:
        self.config = config
        self.journal = journal
        self.clock = clock
        self._records: dict[tuple[str, Rule], Record] = {}
        self._listeners: list[Listener] = []
        # A listener (console, MQTT mirror, notifications, InfluxDB copy) that fails does not
        # undo the journaled transition, but it is never silent: counted per listener (health,
        # /metrics), ERROR with the traceback when an episode starts, INFO when it works again.
        self.listener_failures: dict[str, int] = {}
        self._failing: set[str] = set()
        # The one exception to "journal first": the state disk's own alarm when the journal,
        # on that disk, refuses (read-only, I/O errors). It is shown from memory (console,
        # MQTT) and journaled, in order, as soon as the journal takes writes again; an
        # operator's action with its console request id (`late.py`).
        self._late = LateEntries(journal)
        # The console's request ids of this manager's writes: those waiting with the disk
        # alarm's actions, then the journal's (`monitor/web/once.py` asks here).
        self.keys: KeyStore = self._late
        # Clears stamped before their alarm's activation, journaled at the activation.
        self.early_clears = 0
        self._early_logged: set[tuple[str, Rule]] = set()
        self._restore()

    @classmethod
    def open(cls, config: Config, clock: Clock) -> AlarmManager:
        """The manager for a station, journal at `state_dir/journal.sqlite`."""
        return cls(config.alarms, Journal(journal_path(config)), clock)

    # --- reading ---------------------------------------------------------

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def get(self, sensor: str, rule: Rule | str) -> Alarm | None:
        rec = self._records.get((sensor, _rule(rule)))
        return None if rec is None else rec.snapshot()

    def alarms(self) -> list[Alarm]:
        """Every alarm the station has had, normal ones included, console order."""
        return sorted((r.snapshot() for r in self._records.values()), key=sort_key)

    def active(self) -> list[Alarm]:
        """Alarms an operator should see: everything not normal, console order."""
        return [a for a in self.alarms() if a.state is not AlarmState.NORMAL]

    def active_conditions(self) -> list[tuple[str, Rule]]:
        """(sensor, rule) whose condition was active when last heard of, shelved or not.

        After a restart the engine starts from nothing; seeding its rule state from
        this list lets it send the CLEARED that ends an alarm restored as active.
        """
        return sorted(key for key, rec in self._records.items() if rec.active)

    def priority(self, sensor: str, rule: Rule) -> Priority:
        return self.config.priority_of(sensor, rule)

    # --- conditions from the engine ----------------------------------------

    def apply(self, condition: Condition) -> list[Alarm]:
        """Turn an engine condition into transitions; a repeated state is no transition.

        An alarm's value and limit are those of its last transition (the reading
        that tripped or cleared it), so what the journal holds is what a restart
        restores; the live reading is the sensor's, not the alarm's.
        """
        key = (condition.sensor, condition.rule)
        rec = self._records.get(key)
        out: list[Alarm] = []
        if condition.state is ConditionState.ACTIVE:
            if rec is not None and rec.active:
                return out
            if rec is None:
                rec = self._records[key] = Record(
                    condition.sensor, condition.rule, self.priority(*key), citation=condition.citation
                )
            note = continues_note(condition)
            out.append(self._record(rec, "activated", condition.time, condition=condition, note=note))
            out.extend(self._check_chatter(rec, condition.time))
            lost = self._comm_lost(condition.sensor)
            if condition.rule is Rule.STALE and rec.suppressed_by is None and lost:
                out.append(self._record(rec, "suppressed", condition.time, note="comm_loss"))
        else:
            if rec is None or not rec.active:
                return out
            out.append(self._record(rec, "cleared", self._cleared_at(rec, condition), condition=condition))
        if condition.rule is Rule.COMM_LOSS:
            out.extend(self._follow_comm_loss(condition))
        return out

    def _cleared_at(self, rec: Record, condition: Condition) -> float:
        """The clear's time, never before the activation: the journal never holds a negative
        duration. The engine and the reconciler stamp a late reading's stale or comm-loss clear
        when they judged it; a restored alarm ended by an older reading (only after the
        gateway clock stepped back while the daemon was down: monitor/engine/restored.py)
        is cleared at its activation, counted, logged once."""
        raised = rec.activated_at
        if raised is None or not condition.time < raised:
            return condition.time
        self.early_clears += 1
        key = (rec.sensor, rec.rule)
        if key not in self._early_logged:
            self._early_logged.add(key)
            log.warning(
                "%s: clear stamped %s, before its activation at %s; journaled at the activation (%d so far)",
                _name(rec),
                iso(condition.time),
                iso(raised),
                self.early_clears,
            )
        return raised

    def _comm_lost(self, sensor: str) -> bool:
        rec = self._records.get((sensor, Rule.COMM_LOSS))
        return rec is not None and rec.active

    def _follow_comm_loss(self, condition: Condition) -> list[Alarm]:
        """Designed suppression: a sensor that lost comms is stale by consequence, not news."""
        stale = self._records.get((condition.sensor, Rule.STALE))
        if stale is None:
            return []
        if condition.state is ConditionState.ACTIVE and stale.suppressed_by is None:
            return [self._record(stale, "suppressed", condition.time, note="comm_loss")]
        if condition.state is ConditionState.CLEARED and stale.suppressed_by == "comm_loss":
            return [self._record(stale, "unsuppressed", condition.time)]
        return []

    # --- operator actions ------------------------------------------------

    def acknowledge(
        self, sensor: str, rule: Rule | str, by: str, note: str | None = None, key: WriteKey | None = None
    ) -> Alarm:
        rec = self._find(sensor, rule)
        by, note = _who(by), _text(note, "note")
        state = rec.state
        if state is AlarmState.ACKED:
            when = iso(rec.acked_at or 0)
            raise AlarmError(f"{_name(rec)} was already acknowledged by {rec.acked_by} at {when}")
        if state is AlarmState.NORMAL:
            raise AlarmError(f"{_name(rec)} is normal; there is nothing to acknowledge")
        if state not in (AlarmState.UNACK, AlarmState.RTN_UNACK):
            raise AlarmError(f"{_name(rec)} is {state.value.replace('_', ' ')}; it cannot be acknowledged")
        return self._record(rec, "acknowledged", self.clock.now(), actor=by, note=note, key=key)

    def shelve(
        self,
        sensor: str,
        rule: Rule | str,
        by: str,
        reason: str,
        until: float | None = None,
        duration: float | None = None,
        key: WriteKey | None = None,
    ) -> Alarm:
        """Hide an alarm until a time (default `shelve_default`, never past `shelve_max` from now)."""
        rec = self._find(sensor, rule)
        by = _who(by)
        why = _text(reason, "reason")
        if not why:
            raise AlarmError(f"shelving {_name(rec)} needs a reason")
        if rec.out_of_service_by is not None:
            raise AlarmError(f"{_name(rec)} is out of service; return it to service before shelving")
        now = self.clock.now()
        if until is not None and duration is not None:
            raise AlarmError("give either until or duration, not both")
        if duration is not None:
            if not math.isfinite(duration) or duration <= 0:
                raise AlarmError(f"shelve duration must be a positive number of seconds, not {duration}")
            until = now + duration
        elif until is None:
            until = now + self.config.shelve_default
        if not math.isfinite(until) or until <= now:
            raise AlarmError(f"shelve until must be in the future (now {iso(now)})")
        capped = min(until, now + self.config.shelve_max)
        if capped < until:
            log.info("shelving %s capped at shelve_max (%gs)", _name(rec), self.config.shelve_max)
        return self._record(rec, "shelved", now, actor=by, note=why, until=capped, key=key)

    def unshelve(self, sensor: str, rule: Rule | str, by: str, key: WriteKey | None = None) -> Alarm:
        rec = self._find(sensor, rule)
        by = _who(by)
        if rec.shelved_until is None:
            raise AlarmError(f"{_name(rec)} is not shelved")
        return self._record(rec, "unshelved", self.clock.now(), actor=by, key=key)

    def remove_from_service(
        self, sensor: str, rule: Rule | str, by: str, reason: str, key: WriteKey | None = None
    ) -> Alarm:
        """Out of service, e.g. for instrument maintenance; stays until returned, no expiry."""
        rec = self._find(sensor, rule)
        by = _who(by)
        why = _text(reason, "reason")
        if not why:
            raise AlarmError(f"removing {_name(rec)} from service needs a reason")
        if rec.out_of_service_by is not None:
            raise AlarmError(f"{_name(rec)} is already out of service (by {rec.out_of_service_by})")
        return self._record(rec, "removed_from_service", self.clock.now(), actor=by, note=why, key=key)

    def return_to_service(self, sensor: str, rule: Rule | str, by: str, key: WriteKey | None = None) -> Alarm:
        """Back in service from out of service or shelved."""
        rec = self._find(sensor, rule)
        by = _who(by)
        if rec.out_of_service_by is None and rec.shelved_until is None:
            raise AlarmError(f"{_name(rec)} is in service (neither out of service nor shelved)")
        if rec.out_of_service_by is None:
            return self._record(rec, "unshelved", self.clock.now(), actor=by, key=key)
        return self._record(rec, "returned_to_service", self.clock.now(), actor=by, key=key)

    def suppress(self, sensor: str, rule: Rule | str, reason: str) -> Alarm:
        """Designed suppression by logic (e.g. a process unit shut down)."""
        rec = self._find(sensor, rule)
        if rec.suppressed_by is not None:
            raise AlarmError(f"{_name(rec)} is already suppressed ({rec.suppressed_by})")
        return self._record(rec, "suppressed", self.clock.now(), note=_text(reason, "reason") or "logic")

    def unsuppress(self, sensor: str, rule: Rule | str) -> Alarm:
        rec = self._find(sensor, rule)
        if rec.suppressed_by is None:
            raise AlarmError(f"{_name(rec)} is not suppressed")
        return self._record(rec, "unsuppressed", self.clock.now())

    # --- timers ------------------------------------------------------------

    def tick(self, now: float | None = None) -> list[Alarm]:
        """Expire shelves and end chattering; the daemon calls this from its clock."""
        now = self.clock.now() if now is None else now
        out: list[Alarm] = []
        for rec in list(self._records.values()):
            if rec.shelved_until is not None and rec.shelved_until <= now:
                out.append(self._record(rec, "shelve_expired", now, note=f"until {iso(rec.shelved_until)}"))
            out.extend(self._check_chatter(rec, now))
        return out

    def _check_chatter(self, rec: Record, now: float) -> list[Alarm]:
        window = self.config.chatter_window
        while rec.activations and rec.activations[0] <= now - window:
            rec.activations.popleft()
        many = len(rec.activations) > self.config.chatter_count
        if many and not rec.chattering:
            note = f"{len(rec.activations)} activations in {window:g}s"
            return [self._record(rec, "chattering", now, note=note)]
        if not many and rec.chattering and not rec.active:
            return [self._record(rec, "chattering_ended", now)]
        return []

    # --- journal -----------------------------------------------------------

    def _record(
        self,
        rec: Record,
        event: str,
        time: float,
        condition: Condition | None = None,
        actor: str | None = None,
        note: str | None = None,
        until: float | None = None,
        key: WriteKey | None = None,
    ) -> Alarm:
        """Journal first, then change memory, then tell listeners. `key`: the console's
        request id, journaled in the same transaction as the entry."""
        draft = Entry(
            time=time,
            sensor=rec.sensor,
            rule=rec.rule,
            event=event,
            state="",
            priority=str(rec.priority),
            actor=actor,
            note=note,
            until=until,
            value=condition.value if condition else rec.value,
            limit=condition.limit if condition else rec.limit,
            citation=condition.citation if condition else rec.citation,
            message=condition.message if condition else "",
        )
        after = rec.copy()
        apply_event(after, draft)
        entry = self._append(replace(draft, state=str(after.state)), key)
        apply_event(rec, entry)
        alarm = rec.snapshot()
        for listener in self._listeners:
            name = getattr(listener, "__qualname__", type(listener).__qualname__)
            try:
                listener(entry, alarm)
            except Exception:
                self.listener_failures[name] = self.listener_failures.get(name, 0) + 1
                if name in self._failing:
                    log.debug(
                        "alarm listener %s failed again on %s %s", name, _name(rec), event, exc_info=True
                    )
                else:
                    self._failing.add(name)
                    log.exception(
                        "alarm listener %s failed on %s %s; counted in health", name, _name(rec), event
                    )
                continue
            if name in self._failing:
                self._failing.discard(name)
                log.info(
                    "alarm listener %s works again (%d failure(s) so far)", name, self.listener_failures[name]
                )
        return alarm

    def _append(self, entry: Entry, key: WriteKey | None = None) -> Entry:
        self._late.write()  # the disk alarm's transitions the journal missed, first
        try:
            if self._late and entry.rule is Rule.DISK_FULL:
                raise StateError("alarm journal: earlier state disk transitions not written yet")
            return self.journal.append(entry, key)
        except StateError as exc:
            if entry.rule is not Rule.DISK_FULL:
                raise
            self._late.add(entry, key)  # an action past the bound: refused, as the journal did
            log.warning("alarm %s/%s %s shown but not journaled yet (journaled once the state disk "
                        "takes writes): %s", entry.sensor, entry.rule, entry.event, exc)  # fmt: skip
            return entry

    def _restore(self) -> None:
        count = 0
        for entry in self.journal.entries():
            key = (entry.sensor, entry.rule)
            rec = self._records.get(key)
            if rec is None:
                rec = self._records[key] = Record(entry.sensor, entry.rule, self.priority(*key))
            apply_event(rec, entry)
            count += 1
        if count:
            waiting = sum(1 for r in self._records.values() if r.state is not AlarmState.NORMAL)
            path = self.journal.path
            log.info("alarm journal %s: %d entries replayed, %d alarms not normal", path, count, waiting)

    def _find(self, sensor: str, rule: Rule | str) -> Record:
        key = (sensor, _rule(rule))
        rec = self._records.get(key)
        if rec is None:
            raise AlarmError(f"no alarm {sensor}/{key[1]} on this station")
        return rec

    def close(self) -> None:
        """Journal what waits for the state disk first (`LateEntries.close`)."""
        self._late.close()
        self.journal.close()


def journal_path(config: Config) -> Path:
    return config.state_dir / "journal.sqlite"


def _rule(rule: Rule | str) -> Rule:
    try:
        return Rule(rule)
    except ValueError:
        raise AlarmError(f"unknown rule {rule!r}; one of {', '.join(r.value for r in Rule)}") from None


def _name(rec: Record) -> str:
    return f"alarm {rec.sensor}/{rec.rule}"


def _who(by: str) -> str:
    who = (by or "").strip()
    if not who:
        raise AlarmError("say who you are (by): the journal records every action with a name")
    if len(who) > _NAME_MAX:
        raise AlarmError(f"name is longer than {_NAME_MAX} characters")
    return who


def _text(text: str | None, what: str) -> str | None:
    if text is None:
        return None
    text = text.strip()
    if len(text) > _TEXT_MAX:
        raise AlarmError(f"{what} is longer than {_TEXT_MAX} characters")
    return text or None
