"""Escalations, the messages they send and the acknowledge links they hand out, in SQLite.

The one module of the callout that imports `sqlite3`; its errors become `StateError`.
Exactly once comes from the keys: a message row is (escalation, step, person,
channel) and is written in the same transaction that moves the escalation to its
next step, so a restart neither skips a step nor repeats one. A message is marked
sent after the provider accepted it; the only window for a repeat is a kill between
the provider's OK and that commit (milliseconds), and then the person gets the page
twice rather than never.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from monitor.errors import StateError
from monitor.sqlite import Schema, connect, translate

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS escalation (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL,            -- alarm | flood
    sensor        TEXT NOT NULL,
    rule          TEXT NOT NULL,
    activated_at  REAL NOT NULL,
    pipeline      TEXT NOT NULL,
    roster        TEXT NOT NULL,            -- JSON list of person ids, as at the start
    steps         INTEGER NOT NULL,
    delay         REAL NOT NULL,
    stop_on_clear INTEGER NOT NULL,
    started       REAL NOT NULL,
    next_step     INTEGER NOT NULL DEFAULT 0,
    next_at       REAL,
    status        TEXT NOT NULL,            -- running | acknowledged | cleared | stopped | done | flood
    ended_at      REAL,
    ended_by      TEXT,
    flood         INTEGER,                  -- the flood escalation this alarm was folded into
    UNIQUE (kind, sensor, rule, activated_at, pipeline)
);
CREATE INDEX IF NOT EXISTS escalation_status ON escalation (status);
CREATE TABLE IF NOT EXISTS message (
    escalation INTEGER NOT NULL,
    step       INTEGER NOT NULL,
    person     TEXT NOT NULL,
    channel    TEXT NOT NULL,
    address    TEXT NOT NULL,
    subject    TEXT NOT NULL,
    text       TEXT NOT NULL,
    state      TEXT NOT NULL,               -- pending | sent | cancelled
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_try   REAL NOT NULL,
    created    REAL NOT NULL,
    sent_at    REAL,
    error      TEXT,
    PRIMARY KEY (escalation, step, person, channel)
);
CREATE INDEX IF NOT EXISTS message_state ON message (state, next_try);
CREATE TABLE IF NOT EXISTS link (
    nonce      TEXT PRIMARY KEY,
    escalation INTEGER NOT NULL,
    person     TEXT NOT NULL,
    expires    REAL NOT NULL,
    used_at    REAL,
    used_by    TEXT
);
"""

# Migration 1: the time the next step has waited, measured while the daemon runs (`serve`).
_SERVED = """
ALTER TABLE escalation ADD COLUMN served REAL NOT NULL DEFAULT 0;  -- s of run time since the last step
"""

# Migration 2: acknowledge links live by two clocks (`CalloutStore.rebase`, `CalloutStore.serve`).
_LINK_CLOCKS = """
ALTER TABLE link ADD COLUMN unset INTEGER NOT NULL DEFAULT 0;  -- signed on a clock judged not set
ALTER TABLE link ADD COLUMN shift REAL NOT NULL DEFAULT 0;     -- s its expiry moved with clock steps
ALTER TABLE link ADD COLUMN age REAL NOT NULL DEFAULT 0;       -- s of run time since it was signed
"""

# Not a migration: made at each open (IF NOT EXISTS), so the schema version stays and the last
# release, which refuses a newer version, still opens the file after a downgrade (SQLite keeps
# every index of a table up to date on its writes too). The run-time persist (`serve`, every
# SERVED_PERSIST while a callout runs) reads the unspent links by age: the live ones, not every
# link ever handed out (a full scan before: 10-50 ms a persist at 100,000 links).
_LINK_INDEX = "CREATE INDEX IF NOT EXISTS link_live ON link (age) WHERE used_at IS NULL"

ACTIVE = ("running", "flood")


# The status of an escalation a return to normal ended, acknowledged later (`acknowledged_after_clear`).
ACKED_AFTER_CLEAR = "acknowledged after clear"


@dataclass(frozen=True, slots=True)
class Escalation:
    id: int
    kind: str
    sensor: str
    rule: str
    activated_at: float
    pipeline: str
    roster: tuple[str, ...]
    steps: int
    delay: float
    stop_on_clear: bool
    started: float
    next_step: int
    next_at: float | None
    status: str
    ended_at: float | None
    ended_by: str | None
    flood: int | None
    served: float  # seconds of the daemon's run time the next step has waited (persisted)

    @property
    def next_person(self) -> str | None:
        if self.status != "running" or self.next_step >= self.steps:
            return None
        return self.roster[self.next_step % len(self.roster)]


@dataclass(frozen=True, slots=True)
class Message:
    escalation: int
    step: int
    person: str
    channel: str
    address: str
    subject: str
    text: str
    state: str
    attempts: int
    next_try: float
    created: float
    sent_at: float | None
    error: str | None


@dataclass(frozen=True, slots=True)
class AckLink:
    nonce: str
    escalation: int
    person: str
    expires: float  # on the signing clock, as the signature binds it
    used_at: float | None
    used_by: str | None
    unset: bool  # signed on a clock the daemon judged not set: the expiry moves with its step
    shift: float  # seconds the expiry moved with the clock's steps forward
    age: float  # seconds of the daemon's run time since it was signed (persisted)

    @property
    def expires_at(self) -> float:
        """The expiry on the clock as it reads now."""
        return self.expires + self.shift


_ESC = (
    "id, kind, sensor, rule, activated_at, pipeline, roster, steps, delay, stop_on_clear, started, "
    "next_step, next_at, status, ended_at, ended_by, flood, served"
)
_MSG = (
    "escalation, step, person, channel, address, subject, text, state, attempts, next_try, created, "
    "sent_at, error"
)


def _esc(row: tuple[object, ...]) -> Escalation:
    values = list(row)
    values[6] = tuple(json.loads(str(values[6])))
    values[9] = bool(values[9])
    return Escalation(*values)  # type: ignore[arg-type]


STORE_SCHEMA = Schema("callout store", (_SCHEMA, _SERVED, _LINK_CLOCKS))  # add a migration to change a table


class CalloutStore:
    """`state_dir/callout.sqlite`; every method is one transaction. Not thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # One event loop uses it; created elsewhere is fine (the console tests build it first).
        self._db = connect(path, STORE_SCHEMA, synchronous="FULL", check_same_thread=False)
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StateError(f"{path}: written by a newer station-monitor (schema {row[0]})")
        except sqlite3.Error as exc:
            self._db.close()
            raise translate(exc, f"callout store {path}") from exc
        self._index_links()

    def _index_links(self) -> None:
        """Make the live links' index (`_LINK_INDEX`) if it is missing. A speed-up, not the
        store: refused (a state disk nearly full at the first open after the upgrade, where the
        last release opened the file), the store opens without it, said once, and the next
        open makes it. Before, the refusal failed the open, and the daemon's start."""
        try:
            self._db.execute(_LINK_INDEX)
        except sqlite3.OperationalError as exc:
            log.warning(
                "callout store %s: the index link_live of the acknowledge links was not made (%s);"
                " the store works without it (the run-time persist reads every link), made at the"
                " next open", self.path, translate(exc, "callout store"),
            )  # fmt: skip

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StateError(f"callout store {self.path}: {exc}") from exc

    def _query(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        try:
            return list(self._db.execute(sql, args).fetchall())
        except sqlite3.Error as exc:
            raise StateError(f"callout store {self.path}: {exc}") from exc

    def note(self, key: str) -> str | None:
        """A note of the callout's kept in `meta` beside the schema version (no migration: the
        last release reads only the version's key and leaves the others)."""
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return None if not rows else str(rows[0][0])

    def keep_note(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # --- escalations -----------------------------------------------------------------

    def start(
        self,
        kind: str,
        sensor: str,
        rule: str,
        activated_at: float,
        pipeline: str,
        roster: Sequence[str],
        steps: int,
        delay: float,
        stop_on_clear: bool,
        now: float,
    ) -> Escalation | None:
        """A new escalation, due at once; None when this activation already has one."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO escalation (kind, sensor, rule, activated_at, pipeline, roster, "
                "steps, delay, stop_on_clear, started, next_at, status) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
                (
                    kind,
                    sensor,
                    rule,
                    activated_at,
                    pipeline,
                    json.dumps(list(roster)),
                    steps,
                    delay,
                    int(stop_on_clear),
                    now,
                    now,
                ),
            )
            if cur.rowcount == 0:
                return None
            rowid = cur.lastrowid
        return self.get(int(rowid or 0))

    def known(self, sensor: str, rule: str, activated_at: float) -> bool:
        """Whether this activation has an escalation, under any pipeline or status."""
        rows = self._query(
            "SELECT 1 FROM escalation WHERE kind='alarm' AND sensor=? AND rule=? AND activated_at=?",
            (sensor, rule, activated_at),
        )
        return bool(rows)

    def get(self, escalation: int) -> Escalation | None:
        rows = self._query(f"SELECT {_ESC} FROM escalation WHERE id=?", (escalation,))
        return _esc(rows[0]) if rows else None

    def find(self, sensor: str, rule: str, statuses: Sequence[str] = ACTIVE) -> list[Escalation]:
        marks = ",".join("?" * len(statuses))
        rows = self._query(
            f"SELECT {_ESC} FROM escalation "
            f"WHERE kind='alarm' AND sensor=? AND rule=? AND status IN ({marks})",
            (sensor, rule, *statuses),
        )
        return [_esc(r) for r in rows]

    def running(self, kind: str | None = None) -> list[Escalation]:
        sql = f"SELECT {_ESC} FROM escalation WHERE status='running'"
        rows = self._query(sql + (" AND kind=?" if kind else "") + " ORDER BY id", (kind,) if kind else ())
        return [_esc(r) for r in rows]

    def due(self, now: float) -> list[Escalation]:
        rows = self._query(
            f"SELECT {_ESC} FROM escalation WHERE status='running' AND next_at<=? ORDER BY next_at, id",
            (now,),
        )
        return [_esc(r) for r in rows]

    def behind(self, now: float, retry_max: float) -> tuple[list[tuple[int, int, float, bool]], int]:
        """After a restart on a clock behind the store (not set yet, stepped back while down):
        a running step due later than its delay from `now` less the time it has waited
        (`served`, the daemon's run time: a reboot loop shorter than the delay still gets
        there), or a message retry later than `retry_max`, was scheduled by a clock ahead of
        this one and would wait for it to come round. Each is due then (a message: at once).
        On a right clock the time served is at most the time since the last step, so nothing
        moves; a step back while running counts it the same (the monotonic clock measured it).
        Returns the steps moved, (escalation, step, the time it was due before, whether that
        was further ahead than the whole delay: a clock ahead of this one), and how many
        retries."""
        due = "? + max(0.0, delay - max(0.0, served))"  # a damaged `served` holds it no longer than its delay
        with self._tx() as db:
            moved = [
                (int(str(i)), int(str(n)), float(str(t)), bool(a))
                for i, n, t, a in db.execute(
                    f"SELECT id, next_step, next_at, next_at > ? + delay FROM escalation"
                    f" WHERE status='running' AND next_at > {due}",
                    (now, now),
                ).fetchall()
            ]
            db.execute(
                f"UPDATE escalation SET next_at = {due} WHERE status='running' AND next_at > {due}",
                (now, now),
            )
            retries = db.execute(
                "UPDATE message SET next_try = ? WHERE state='pending' AND next_try > ?",
                (now, now + retry_max),
            ).rowcount
        return moved, int(retries)

    def serve(self, seconds: float, link_ttl: float) -> None:
        """`seconds` more of the daemon's run time waited by every running step and aged by
        every unspent link younger than `link_ttl` (the callout's monotonic clock, flushed
        every `SERVED_PERSIST` and at a stop)."""
        with self._tx() as db:
            db.execute(
                "UPDATE escalation SET served = served + ? WHERE status='running' AND next_at IS NOT NULL",
                (seconds,),
            )
            db.execute("UPDATE link SET age = age + ? WHERE used_at IS NULL AND age < ?", (seconds, link_ttl))

    def rebase(self, step: float, before: float, unset: bool) -> int:
        """The clock stepped by `step` (< 0 back) from `before`: unspent links signed on a clock
        judged not set and not expired on it move with it (their hour was an hour of the
        unset clock's time); still `unset` when the new clock is judged not set either.
        Links signed on a set clock never move. Returns how many moved."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE link SET shift = shift + ?, unset = ? "
                "WHERE used_at IS NULL AND unset = 1 AND expires + shift > ?",
                (step, int(unset), before),
            )
        return int(cur.rowcount)

    def forward(self, step: float, before: Mapping[int, tuple[int, float]]) -> int:
        """The gateway clock stepped forward by `step` while running: running steps and
        message retries move with it, so each is due after the real time it was meant to
        wait (on the old clock's time they were due at once, the next person paged early).
        `before`: steps `behind` moved, (step, the time it was due before): once the clock is
        forward again that time is on it, and the step is due at the earlier of the two (a
        restart after a long power cut: overdue, at once). Returns how many steps moved."""
        with self._tx() as db:
            steps = db.execute(
                "UPDATE escalation SET next_at = next_at + ? WHERE status='running' AND next_at IS NOT NULL",
                (step,),
            ).rowcount
            db.execute("UPDATE message SET next_try = next_try + ? WHERE state='pending'", (step,))
            for escalation, (at_step, due) in before.items():
                db.execute(
                    "UPDATE escalation SET next_at = min(next_at, ?) "
                    "WHERE id=? AND next_step=? AND status='running'",
                    (due, escalation, at_step),
                )
        return int(steps)

    def members(self, flood: int) -> list[Escalation]:
        rows = self._query(f"SELECT {_ESC} FROM escalation WHERE flood=? ORDER BY id", (flood,))
        return [_esc(r) for r in rows]

    def recent(self, limit: int = 50) -> list[Escalation]:
        rows = self._query(f"SELECT {_ESC} FROM escalation ORDER BY id DESC LIMIT ?", (limit,))
        return [_esc(r) for r in rows]

    def step(
        self,
        esc: Escalation,
        messages: Sequence[tuple[str, str, str, str]],
        person: str,
        link: tuple[str, float, bool] | None,
        now: float,
    ) -> bool:
        """Write step `esc.next_step`'s messages ((channel, address, subject, text)) and its link
        ((nonce, expiry, signed on a clock judged not set)), and move on, in one transaction;
        False when another caller took this step already."""
        step = esc.next_step
        last = step + 1 >= esc.steps
        with self._tx() as db:
            cur = db.execute(
                "UPDATE escalation SET next_step=?, next_at=?, status=?, served=0 "
                "WHERE id=? AND next_step=? AND status='running'",
                (step + 1, None if last else now + esc.delay, "done" if last else "running", esc.id, step),
            )
            if cur.rowcount == 0:
                return False
            for channel, address, subject, text in messages:
                db.execute(
                    f"INSERT OR IGNORE INTO message ({_MSG}) "
                    "VALUES (?,?,?,?,?,?,?,'pending',0,?,?,NULL,NULL)",
                    (esc.id, step, person, channel, address, subject, text, now, now),
                )
            if link is not None:
                db.execute(
                    "INSERT INTO link (nonce, escalation, person, expires, unset) VALUES (?,?,?,?,?)",
                    (link[0], esc.id, person, link[1], int(link[2])),
                )
        return True

    def end(self, escalation: int, status: str, by: str | None, now: float) -> bool:
        """Stop an escalation (and the messages it has not sent yet); False if it had ended.
        One a return to normal ended keeps the time its next step was due: an activation that
        continues its event resumes it from there (`resume`)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE escalation SET status=?, ended_at=?, ended_by=?,"
                " next_at=CASE WHEN ?='cleared' THEN next_at END "
                "WHERE id=? AND status IN ('running', 'flood', 'done')",
                (status, now, by, status, escalation),
            )
            db.execute(
                "UPDATE message SET state='cancelled' WHERE escalation=? AND state='pending'", (escalation,)
            )
        return cur.rowcount > 0

    def event(self, sensor: str, rule: str, since: float) -> list[Escalation]:
        """The alarm escalations of one event, the latest stored first: the event's first (the
        first stored activated from `since`) and every one stored after it. By the
        order stored, not by activation time: after the gateway clock stepped back between
        bounces, a continuation's start is before the event's first, and the event was not
        found (the first person paged again at every bounce)."""
        rows = self._query(
            f"SELECT {_ESC} FROM escalation WHERE kind='alarm' AND sensor=? AND rule=? AND id >= ("
            "SELECT min(id) FROM escalation WHERE kind='alarm' AND sensor=? AND rule=?"
            " AND activated_at>=?) ORDER BY id DESC",
            (sensor, rule, sensor, rule, since),
        )
        return [_esc(r) for r in rows]

    def shift_kept(self, step: float) -> int:
        """The gateway clock stepped by `step` (< 0 back) while running: the due time a return
        to normal kept (`end`) moves with it, as a running step's does, so a continuation
        resumes the next step after the real time it was meant to wait. Left on the old clock:
        an hour forward, the step was overdue and the next person paged at once, 11 min early;
        a day back, it was due a day on and nobody was told while the well spilled."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE escalation SET next_at = next_at + ? WHERE status='cleared' AND next_at IS NOT NULL",
                (step,),
            )
        return int(cur.rowcount)

    def resume(self, lead: Escalation, activated_at: float, now: float) -> Escalation | None:
        """A running escalation for the activation at `activated_at` that takes over where `lead`
        (a return to normal ended it unacknowledged) stopped: its roster, its next step, due when
        that was (at once if due already; `served`: the delay less what is left, so a restart
        on an unset clock counts the time already waited). None when this activation already
        has one (a restart's resume)."""
        # Never later than its delay less the time it waited: a kept due time from a clock ahead
        # of this one (stepped back while the daemon was down) would hold the step that long.
        due = now if lead.next_at is None else min(lead.next_at, now + max(0.0, lead.delay - lead.served))
        served = min(lead.delay, max(0.0, lead.delay - (due - now)))
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO escalation (kind, sensor, rule, activated_at, pipeline, roster, "
                "steps, delay, stop_on_clear, started, next_step, next_at, status, served) "
                "VALUES ('alarm', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                (
                    lead.sensor,
                    lead.rule,
                    activated_at,
                    lead.pipeline,
                    json.dumps(list(lead.roster)),
                    lead.steps,
                    lead.delay,
                    int(lead.stop_on_clear),
                    now,
                    lead.next_step,
                    due,
                    served,
                ),
            )
            if cur.rowcount == 0:
                return None
            rowid = cur.lastrowid
        return self.get(int(rowid or 0))

    def acknowledged_after_clear(self, sensor: str, rule: str, activated_at: float, by: str | None) -> bool:
        """An alarm acknowledged after its return to normal ended its escalation: that one is
        marked `ACKED_AFTER_CLEAR` (by whom), so an activation continuing its event pages
        nobody. Not plain "acknowledged": its end time is the clear's, and the history read as
        if the person had answered while the alarm was active."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE escalation SET status=?, ended_by=?, next_at=NULL WHERE kind='alarm'"
                " AND sensor=? AND rule=? AND activated_at=? AND status='cleared'",
                (ACKED_AFTER_CLEAR, by, sensor, rule, activated_at),
            )
        return cur.rowcount > 0

    def fold(self, escalation: int, flood: int) -> None:
        """An alarm's escalation becomes part of a flood summary; its unsent messages are dropped."""
        with self._tx() as db:
            db.execute(
                "UPDATE escalation SET status='flood', flood=?, next_at=NULL WHERE id=?", (flood, escalation)
            )
            db.execute(
                "UPDATE message SET state='cancelled' WHERE escalation=? AND state='pending'", (escalation,)
            )

    # --- messages --------------------------------------------------------------------

    def pending(self, now: float) -> list[Message]:
        rows = self._query(
            f"SELECT {_MSG} FROM message WHERE state='pending' AND next_try<=? ORDER BY next_try", (now,)
        )
        return [Message(*r) for r in rows]  # type: ignore[arg-type]

    def messages(self, escalation: int) -> list[Message]:
        rows = self._query(
            f"SELECT {_MSG} FROM message WHERE escalation=? ORDER BY step, channel", (escalation,)
        )
        return [Message(*r) for r in rows]  # type: ignore[arg-type]

    def sent(self, m: Message, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE message SET state='sent', sent_at=?, attempts=attempts+1, error=NULL "
                "WHERE escalation=? AND step=? AND person=? AND channel=? AND state='pending'",
                (now, m.escalation, m.step, m.person, m.channel),
            )

    def failed(self, m: Message, error: str, next_try: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE message SET attempts=attempts+1, error=?, next_try=? "
                "WHERE escalation=? AND step=? AND person=? AND channel=? AND state='pending'",
                (error[:500], next_try, m.escalation, m.step, m.person, m.channel),
            )

    def next_try(self) -> float | None:
        rows = self._query("SELECT MIN(next_try) FROM message WHERE state='pending'")
        value = rows[0][0] if rows else None
        return None if value is None else float(value)  # type: ignore[arg-type]

    # --- acknowledge links -----------------------------------------------------------

    def link(self, nonce: str) -> AckLink | None:
        rows = self._query(
            "SELECT nonce, escalation, person, expires, used_at, used_by, unset, shift, age FROM link"
            " WHERE nonce=?",
            (nonce,),
        )
        if not rows:
            return None
        values = list(rows[0])
        values[6] = bool(values[6])
        return AckLink(*values)  # type: ignore[arg-type]

    def use_link(self, nonce: str, by: str, now: float) -> bool:
        """Spend a link; False when it was spent already (single use, even under a race)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE link SET used_at=?, used_by=? WHERE nonce=? AND used_at IS NULL", (now, by, nonce)
            )
        return cur.rowcount > 0

    def close(self) -> None:
        self._db.close()
