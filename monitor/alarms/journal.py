"""The alarm journal: every transition and operator action, append-only, in SQLite.

This is the one module that imports `sqlite3` for alarms; its errors become
`StateError`. Rows are never updated or deleted (triggers refuse it), so the
journal is evidence an inspector can read, and the alarm manager rebuilds its
state at start by replaying it. Beside it, `console_write` keeps the console's request ids
(`monitor/writeonce.py`) in the transaction of the action each records; the newest 1,000 are kept.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from monitor import writeonce
from monitor.errors import StateError
from monitor.model import Rule, iso
from monitor.sqlite import Schema, connect
from monitor.writeonce import WriteKey

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    time      REAL    NOT NULL,
    sensor    TEXT    NOT NULL,
    rule      TEXT    NOT NULL,
    event     TEXT    NOT NULL,
    state     TEXT    NOT NULL,
    priority  TEXT    NOT NULL,
    actor     TEXT,
    note      TEXT,
    until     REAL,
    value     REAL,
    lim       REAL,
    citation  TEXT    NOT NULL DEFAULT '',
    message   TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS journal_time ON journal (time);
CREATE TRIGGER IF NOT EXISTS journal_no_update BEFORE UPDATE ON journal
BEGIN SELECT RAISE(ABORT, 'the alarm journal is append-only'); END;
CREATE TRIGGER IF NOT EXISTS journal_no_delete BEFORE DELETE ON journal
BEGIN SELECT RAISE(ABORT, 'the alarm journal is append-only'); END;
"""
# Add a migration to change a table; never edit one. Version 2: the console's request ids
# (`monitor/writeonce.py`), in the transaction of the action they record; not part of the
# append-only record (the oldest go as new ones come).
SCHEMA = Schema("alarm journal", (_SCHEMA, writeonce.TABLE))

_COLUMNS = "id, time, sensor, rule, event, state, priority, actor, note, until, value, lim, citation, message"


@dataclass(frozen=True, slots=True)
class Entry:
    """One journal row: what happened to which alarm, and the state it left it in.

    `event` is one of `EVENTS`; `time` is event time for condition changes
    (activated, cleared) and the clock for actions and timers.
    """

    time: float
    sensor: str
    rule: Rule
    event: str
    state: str
    priority: str
    actor: str | None = None
    note: str | None = None
    until: float | None = None
    value: float | None = None
    limit: float | None = None
    citation: str = ""
    message: str = ""
    id: int = 0

    def to_json(self) -> dict[str, object]:
        value = _finite(self.value)
        return {
            "id": self.id,
            "time": iso(self.time),
            "sensor": self.sensor,
            "rule": str(self.rule),
            "event": self.event,
            "state": self.state,
            "priority": self.priority,
            "actor": self.actor,
            "note": self.note,
            "until": None if self.until is None else iso(self.until),
            "value": value,
            "limit": self.limit,
            "citation": self.citation,
            "message": self.message,
        }


EVENTS = (
    "activated",
    "cleared",
    "acknowledged",
    "shelved",
    "unshelved",
    "shelve_expired",
    "suppressed",
    "unsuppressed",
    "removed_from_service",
    "returned_to_service",
    "chattering",
    "chattering_ended",
)


class Journal:
    """An append-only SQLite file (`state_dir/journal.sqlite`), WAL so reports can read alongside."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # One owner (the manager, on one event loop) but possibly built on another thread.
        # FULL: an acknowledgement or an activation on record must survive a power cut.
        self._db = connect(path, SCHEMA, synchronous="FULL", check_same_thread=False)
        self.keys = writeonce.Keys(self._db, f"alarm journal {path}")  # the console's request ids

    def append(self, entry: Entry, key: WriteKey | None = None) -> Entry:
        """Write one row durably before the transition it records is announced; with the
        console's request `key` in the same transaction (a repeat finds it, not a gap)."""
        try:
            if key is not None:
                self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.execute(
                f"INSERT INTO journal ({_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.time,
                    entry.sensor,
                    str(entry.rule),
                    entry.event,
                    entry.state,
                    entry.priority,
                    entry.actor,
                    entry.note,
                    entry.until,
                    _finite(entry.value),
                    _finite(entry.limit),
                    entry.citation,
                    entry.message,
                ),
            )
            if key is not None:
                writeonce.claim(self._db, key, entry.time)
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if key is not None:
                # SQLite may have rolled back itself (a full disk); a closed file cannot be asked
                with contextlib.suppress(sqlite3.Error):
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            raise StateError(f"alarm journal {self.path}: cannot append {entry.event}: {exc}") from exc
        rowid = cur.lastrowid or 0
        return replace(entry, id=rowid)

    def entries(
        self,
        since: float | None = None,
        until: float | None = None,
        sensor: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> Iterator[Entry]:
        """Rows in journal order (or newest first), optionally filtered."""
        where: list[str] = []
        params: list[float | str] = []
        if since is not None:
            where.append("time >= ?")
            params.append(since)
        if until is not None:
            where.append("time < ?")
            params.append(until)
        if sensor is not None:
            where.append("sensor = ?")
            params.append(sensor)
        sql = f"SELECT {_COLUMNS} FROM journal"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC" if newest_first else " ORDER BY id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        try:
            rows = self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StateError(f"alarm journal {self.path}: cannot read: {exc}") from exc
        for row in rows:
            yield _entry(row)

    def close(self) -> None:
        self._db.close()


def _finite(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


def _entry(row: tuple[object, ...]) -> Entry:
    (rid, time, sensor, rule, event, state, priority, actor, note, until, value, lim, citation, message) = row
    try:
        rule_v = Rule(str(rule))
    except ValueError as exc:
        raise StateError(f"alarm journal row {rid}: unknown rule {rule!r}") from exc
    return Entry(
        id=int(str(rid)),
        time=float(str(time)),
        sensor=str(sensor),
        rule=rule_v,
        event=str(event),
        state=str(state),
        priority=str(priority),
        actor=None if actor is None else str(actor),
        note=None if note is None else str(note),
        until=None if until is None else float(str(until)),
        value=None if value is None else float(str(value)),
        limit=None if lim is None else float(str(lim)),
        citation=str(citation),
        message=str(message),
    )
