"""The durable outbox: every point is committed here before it counts as taken.

One SQLite file in WAL mode (`state_dir/outbox.sqlite`). A point leaves the
`outbox` table only when the server acknowledged the batch that carried it
(`ack`), when the server rejected it for good (`dead_letter`, with the reason),
or when the size cap forced the oldest out (`dropped`, counted, and an OUTBOX
condition raised). Counters live in a one-row `meta` table updated in the same
transaction as the rows they count, so a `kill -9` at any moment leaves them
consistent with the rows.

Delivery is at least once: a batch the server stored just before the process
died is sent again after the restart. InfluxDB keeps one point per series and
timestamp (a repeat overwrites it), so what the server holds is exactly once
per series and timestamp; VictoriaMetrics does the same with
`-dedup.minScrapeInterval=1ms`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Literal

from monitor.errors import OutboxError
from monitor.model import Clock, Condition, ConditionState, Rule, WallClock

log = logging.getLogger(__name__)

OUTBOX_SENSOR = "outbox"  # the pseudo-sensor the OUTBOX condition names
OUTBOX_CITATION = "station-monitor outbox size cap"
CLEAR_FRACTION = 0.9  # the cap alarm clears once the backlog is below 90 % of the cap
MAX_REASON = 2000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,
    queued REAL NOT NULL,
    line BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter (
    id INTEGER PRIMARY KEY,
    queued REAL NOT NULL,
    failed REAL NOT NULL,
    status INTEGER,
    reason TEXT NOT NULL,
    line BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    next_id INTEGER NOT NULL,
    pending_rows INTEGER NOT NULL,
    pending_bytes INTEGER NOT NULL,
    dropped INTEGER NOT NULL,
    written INTEGER NOT NULL,
    episode_dropped INTEGER NOT NULL  -- > 0 while the cap alarm is active
);
INSERT OR IGNORE INTO meta VALUES (1, 1, 0, 0, 0, 0, 0);
"""


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """What `monitor outbox status` prints and the metrics endpoint exports."""

    pending: int
    pending_bytes: int
    oldest_queued: float | None  # clock time the oldest pending point was committed
    dead_letters: int
    dropped: int
    written: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    queued: float
    failed: float
    status: int | None
    reason: str
    line: str


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows taken from the head of the outbox, oldest first; ids are increasing."""

    ids: list[int]
    lines: list[bytes]

    def __len__(self) -> int:
        return len(self.ids)

    def body(self) -> bytes:
        return b"\n".join(self.lines)

    def split(self) -> tuple[Batch, Batch]:
        mid = len(self.ids) // 2
        return Batch(self.ids[:mid], self.lines[:mid]), Batch(self.ids[mid:], self.lines[mid:])


class Outbox:
    """SQLite outbox; one instance per process, used from one thread.

    `synchronous="full"` (default) fsyncs every commit, so a committed point also
    survives a power cut; `"normal"` survives any process crash but may lose the
    last commits on power loss.
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int = 1 << 30,
        clock: Clock | None = None,
        on_condition: Callable[[Condition], None] | None = None,
        synchronous: Literal["full", "normal"] = "full",
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.clock: Clock = clock or WallClock()
        self.on_condition = on_condition
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open outbox {self.path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- taking points in -------------------------------------------------------------

    def append(self, lines: Sequence[str]) -> int:
        """Commit `lines` in one transaction; returns how many old points the cap dropped.

        When this returns, the points are on disk: the caller may count them as taken.
        """
        if not lines:
            return 0
        blobs = [s.encode() for s in lines]
        size = sum(map(len, blobs))
        now = self.clock.now()
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                next_id, pending_bytes, episode = db.execute(
                    "SELECT next_id, pending_bytes, episode_dropped FROM meta"
                ).fetchone()
                db.executemany(
                    "INSERT INTO outbox (id, queued, line) VALUES (?, ?, ?)",
                    zip(range(next_id, next_id + len(blobs)), repeat(now), blobs),
                )
                dropped_rows = dropped_bytes = 0
                if pending_bytes + size > self.max_bytes:
                    dropped_rows, dropped_bytes = self._drop_oldest(pending_bytes + size - self.max_bytes)
                db.execute(
                    "UPDATE meta SET next_id = ?, pending_rows = pending_rows + ?,"
                    " pending_bytes = pending_bytes + ?, dropped = dropped + ?,"
                    " episode_dropped = episode_dropped + ?",
                    (
                        next_id + len(blobs),
                        len(blobs) - dropped_rows,
                        size - dropped_bytes,
                        dropped_rows,
                        dropped_rows,
                    ),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot append {len(lines)} point(s) to outbox {self.path}: {exc}") from exc
        if dropped_rows:
            self._raise_cap(episode, episode + dropped_rows, now)
        return dropped_rows

    def _drop_oldest(self, excess: int) -> tuple[int, int]:
        """Delete the oldest rows until `excess` bytes are freed (inside the caller's transaction)."""
        rows = freed = 0
        cutoff = None
        cursor = self._db.execute("SELECT id, length(line) FROM outbox ORDER BY id")
        for row_id, n in cursor:
            rows += 1
            freed += n
            cutoff = row_id
            if freed >= excess:
                break
        cursor.close()
        if cutoff is not None:
            self._db.execute("DELETE FROM outbox WHERE id <= ?", (cutoff,))
        return rows, freed

    def _raise_cap(self, before: int, episode: int, now: float) -> None:
        """Raise the cap alarm when an episode starts (`before` == 0); the episode
        survives restarts in `meta`, so its clear is never lost."""
        if before == 0:
            log.error(
                "outbox %s reached its cap of %d bytes: dropping the oldest points (%d so far)",
                self.path,
                self.max_bytes,
                episode,
            )
            self._emit(ConditionState.ACTIVE, episode, now)
        else:
            log.debug("outbox %s still at its cap: %d point(s) dropped", self.path, episode)

    def _emit(self, state: ConditionState, episode: int, now: float) -> None:
        if self.on_condition is None:
            return
        verb = "dropping the oldest points" if state is ConditionState.ACTIVE else "back below the cap"
        self.on_condition(
            Condition(
                time=now,
                sensor=OUTBOX_SENSOR,
                rule=Rule.OUTBOX,
                state=state,
                value=float(episode),
                limit=float(self.max_bytes),
                citation=OUTBOX_CITATION,
                message=f"outbox {verb}: {episode} point(s) dropped, cap {self.max_bytes} bytes",
                extra={"dropped": float(episode)},
            )
        )

    # -- handing points out -----------------------------------------------------------

    def peek(self, limit: int) -> Batch:
        """The oldest `limit` pending points (they stay until acked or dead-lettered)."""
        try:
            rows = self._db.execute("SELECT id, line FROM outbox ORDER BY id LIMIT ?", (limit,)).fetchall()
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot read outbox {self.path}: {exc}") from exc
        return Batch([r[0] for r in rows], [r[1] for r in rows])

    def ack(self, batch: Batch) -> int:
        """The server stored `batch`: remove it. Returns the rows removed (fewer if the cap
        dropped some of them meanwhile)."""
        if not batch.ids:
            return 0
        lo, hi = batch.ids[0], batch.ids[-1]
        try:
            with self._tx() as db:
                rows, size = db.execute(
                    "SELECT COUNT(*), COALESCE(SUM(length(line)), 0) FROM outbox WHERE id BETWEEN ? AND ?",
                    (lo, hi),
                ).fetchone()
                db.execute("DELETE FROM outbox WHERE id BETWEEN ? AND ?", (lo, hi))
                db.execute(
                    "UPDATE meta SET pending_rows = pending_rows - ?, pending_bytes = pending_bytes - ?,"
                    " written = written + ?",
                    (rows, size, rows),
                )
                pending_bytes, episode = db.execute(
                    "SELECT pending_bytes, episode_dropped FROM meta"
                ).fetchone()
                cleared = episode > 0 and pending_bytes < CLEAR_FRACTION * self.max_bytes
                if cleared:
                    db.execute("UPDATE meta SET episode_dropped = 0")
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot remove acknowledged points from outbox {self.path}: {exc}") from exc
        if cleared:
            log.info("outbox %s is below its cap again after dropping %d point(s)", self.path, episode)
            self._emit(ConditionState.CLEARED, episode, self.clock.now())
        return int(rows)

    def dead_letter(self, batch: Batch, status: int | None, reason: str) -> int:
        """The server refused these lines for good: move them aside with its reason."""
        if not batch.ids:
            return 0
        now = self.clock.now()
        reason = reason[:MAX_REASON]
        try:
            with self._tx() as db:
                moved = size = 0
                for row_id in batch.ids:
                    found = db.execute("SELECT queued, line FROM outbox WHERE id = ?", (row_id,)).fetchone()
                    if found is None:
                        continue
                    db.execute(
                        "INSERT INTO dead_letter (queued, failed, status, reason, line)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (found[0], now, status, reason, found[1]),
                    )
                    db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))
                    moved += 1
                    size += len(found[1])
                db.execute(
                    "UPDATE meta SET pending_rows = pending_rows - ?, pending_bytes = pending_bytes - ?",
                    (moved, size),
                )
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot move rejected points to dead letters in {self.path}: {exc}") from exc
        return moved

    # -- looking ----------------------------------------------------------------------

    def stats(self) -> OutboxStats:
        try:
            rows, size, dropped, written = self._db.execute(
                "SELECT pending_rows, pending_bytes, dropped, written FROM meta"
            ).fetchone()
            oldest = self._db.execute("SELECT queued FROM outbox ORDER BY id LIMIT 1").fetchone()
            dead = self._db.execute("SELECT COUNT(*) FROM dead_letter").fetchone()[0]
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot read outbox {self.path}: {exc}") from exc
        return OutboxStats(
            pending=rows,
            pending_bytes=size,
            oldest_queued=None if oldest is None else float(oldest[0]),
            dead_letters=dead,
            dropped=dropped,
            written=written,
            max_bytes=self.max_bytes,
        )

    @property
    def pending(self) -> int:
        return int(self._db.execute("SELECT pending_rows FROM meta").fetchone()[0])

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        rows = self._db.execute(
            "SELECT id, queued, failed, status, reason, line FROM dead_letter ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        return [DeadLetter(r[0], r[1], r[2], r[3], r[4], bytes(r[5]).decode(errors="replace")) for r in rows]

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`, rolled back on any exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
