"""A console write done once however often it is sent: the `Idempotency-Key` record.

The operator's page sends a request id with every write; when Wi-Fi drops the answer after
the gateway committed, the page (or the operator) sends the same write again with the same
id. The store that takes the write (the alarm journal, the incident store) keeps
(owner, key, request, time, answer) in a `console_write` table of its own file, and the
row is inserted in the same SQLite transaction as the write: a kill -9 between the commit
and the answer leaves both or neither, so the repeat after a restart finds the key and
writes nothing. The answer is added after the commit (None until then: a repeat that finds
none is answered from what is recorded now).

Bounded for an attacker with the token: a key is 8 to 64 characters of `KEY_CHARS`, the
owner is a digest of the bearer token (keys of one token are not another's), and each
claim deletes all but the newest `KEEP_ROWS`, so the table never grows past that; an
answer above `ANSWER_MAX` bytes is not kept, and the answers kept are `ANSWERS_MAX` bytes all
told (1 MiB: the oldest answers go, their keys stay), so a file holds at most ~2.5 MiB of
them (1 MiB of answers takes up to 2 MiB of pages when each is just under half a page, and
1,000 ids of the longest keys 0.4 MiB) where it could hold 1,000 x 64 KiB. Not by age: a
gateway's clock that steps by days (NTP at boot after a dead RTC battery) made every key
look old, or ahead, and the next write dropped them all, so a retry after it was recorded
twice; a clock cannot tell a step from a quiet weekend. At tens of writes a day a key is kept for weeks.

This module only speaks SQL on a connection its store opened; `Keys` is what the console
asks of a store (a repeat's first use, its answer kept), sqlite3's errors as `StateError`
naming the store: the same for the alarm journal and the incident store.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
from dataclasses import dataclass
from typing import Protocol

from monitor.errors import MonitorError, StateError

# One migration for each store that keeps the keys (append it to that store's Schema).
TABLE = """
CREATE TABLE IF NOT EXISTS console_write (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    request TEXT NOT NULL,
    time REAL NOT NULL,
    answer TEXT,
    UNIQUE (owner, key)
);
"""
KEY_CHARS = "A-Z a-z 0-9 . _ : -"
_KEY = re.compile(r"[A-Za-z0-9._:-]{8,64}")
KEEP_ROWS = 1000  # a station's operators write tens a day; a retry comes within seconds or hours
ANSWER_MAX = 64 * 1024  # one answer kept (an alarm's is ~1 KiB, an incident's grows with its notes)
ANSWERS_MAX = 1024 * 1024  # the answers one file keeps, all told: the newest, the older dropped
# The rows whose answers are past `ANSWERS_MAX` bytes, newest first (the rows and keys stay).
_OVER = """
SELECT id, owner, key, request, time FROM console_write WHERE id IN (
    SELECT id FROM (
        SELECT id, sum(length(CAST(answer AS BLOB))) OVER (ORDER BY id DESC) AS held
        FROM console_write WHERE answer IS NOT NULL
    ) WHERE held > ?
)
"""


class KeyRefusedError(MonitorError):
    """An `Idempotency-Key` header that is not one: its words say what one is."""


@dataclass(frozen=True, slots=True)
class WriteKey:
    """One write's key: whose (`owner`, a digest of the token), the key as sent, and
    `request`, a digest of what was asked (method, path, body bytes)."""

    owner: str
    key: str
    request: str


@dataclass(frozen=True, slots=True)
class Prior:
    """What a key was first used for: its request digest, and its answer when kept."""

    request: str
    answer: str | None


def write_key(header: str, token: bytes, method: str, path: str, body: bytes) -> WriteKey:
    """The key of a write; `KeyRefused` when `header` is not 8 to 64 of `KEY_CHARS`.
    `token`: the bearer token as the guard checked it (`monitor/web/guard.py` `bearer`)."""
    if not _KEY.fullmatch(header):
        raise KeyRefusedError(f"Idempotency-Key must be 8 to 64 characters of {KEY_CHARS}")
    owner = hashlib.sha256(b"station-monitor console write\0" + token).hexdigest()
    asked = hashlib.sha256(f"{method} {path}\0".encode("utf-8", "replace") + body).hexdigest()
    return WriteKey(owner=owner, key=header, request=asked)


def find(db: sqlite3.Connection, key: WriteKey) -> Prior | None:
    """The key's first use, or None when it is new (or forgotten: older than the bounds)."""
    row = db.execute(
        "SELECT request, answer FROM console_write WHERE owner = ? AND key = ?", (key.owner, key.key)
    ).fetchone()
    return None if row is None else Prior(request=row[0], answer=row[1])


def claim(db: sqlite3.Connection, key: WriteKey, time: float) -> None:
    """Record the key; call inside the write's transaction. Prunes to `KEEP_ROWS` first
    (`time` is kept for the reader, never judged: the clock may have stepped)."""
    db.execute(
        "DELETE FROM console_write WHERE id <= (SELECT max(id) FROM console_write) - ?", (KEEP_ROWS - 1,)
    )
    db.execute(
        "INSERT INTO console_write (owner, key, request, time) VALUES (?, ?, ?, ?)",
        (key.owner, key.key, key.request, time),
    )


def answer(db: sqlite3.Connection, key: WriteKey, text: str) -> None:
    """Keep the first answer for repeats (after the write's commit; not when longer than
    `ANSWER_MAX` bytes, `keepable`), dropping first the oldest answers that would take the
    file's past `ANSWERS_MAX` bytes all told, in one transaction. A key whose
    answer went is still known: its repeat writes nothing and is answered from the record."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > ANSWER_MAX:
        return
    db.execute("SAVEPOINT console_answer")  # a transaction of its own, or a part of the caller's
    try:
        # room first, so the file never holds more than the bound, not even within this write
        _drop_answers(db, db.execute(_OVER, (ANSWERS_MAX - size,)).fetchall())
        db.execute(
            "UPDATE console_write SET answer = ? WHERE owner = ? AND key = ?", (text, key.owner, key.key)
        )
        db.execute("RELEASE console_answer")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back itself (a full disk)
            db.execute("ROLLBACK TO console_answer")
            db.execute("RELEASE console_answer")
        raise


def _drop_answers(db: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    """The rows (`_OVER`) without their answers, written anew: deleted, then inserted as
    they were with no answer. Not `UPDATE ... answer = NULL`: a row that held an answer of
    most of a page kept that page to itself when it shrank (SQLite merges pages when rows
    are deleted, not when an update shrinks one), and 1,000 ids took a page each, 4 MiB."""
    if rows:
        db.executemany("DELETE FROM console_write WHERE id = ?", [(r[0],) for r in rows])
        db.executemany(
            "INSERT INTO console_write (id, owner, key, request, time) VALUES (?, ?, ?, ?, ?)", rows
        )


def keepable(text: str) -> bool:
    """An answer of at most `ANSWER_MAX` bytes in UTF-8, as SQLite stores it (`len` counts
    characters)."""
    return len(text.encode("utf-8", "surrogatepass")) <= ANSWER_MAX


class KeyStore(Protocol):
    """What the console asks of a store about its request ids (`Keys` and the alarm
    manager's, which has actions waiting for a full state disk besides its journal's)."""

    def prior_write(self, key: WriteKey) -> Prior | None: ...
    def keep_answer(self, key: WriteKey, text: str) -> None: ...


class Keys:
    """The request ids one store keeps (`store`: its name and file, for messages). The
    claim is the store's own, inside its write's transaction."""

    def __init__(self, db: sqlite3.Connection, store: str) -> None:
        self._db = db
        self.store = store

    def prior_write(self, key: WriteKey) -> Prior | None:
        """The console write first sent with `key`, if it was recorded (`find`)."""
        try:
            return find(self._db, key)
        except sqlite3.Error as exc:
            raise StateError(f"{self.store}: cannot read request ids: {exc}") from exc

    def keep_answer(self, key: WriteKey, text: str) -> None:
        """The answer to repeat for `key` (`answer`)."""
        try:
            answer(self._db, key, text)
        except sqlite3.Error as exc:
            raise StateError(f"{self.store}: cannot keep an answer: {exc}") from exc
