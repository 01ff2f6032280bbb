"""The durable outbox: every point is committed here before it counts as taken.

One SQLite file in WAL mode (`state_dir/outbox.sqlite`). Each `append` commits
*segment* row per 1,000 lines: the lines joined by newlines, so a 5,000-point append
is five rows, not 5,000, and a batch for the server is a few blobs concatenated. A
segment's `skip` counts its leading lines already gone (acknowledged or
dropped); the row is deleted when all are.

A point leaves only when the server acknowledged the batch that carried it, when
the server rejected it for good (a dead letter, with the reason), or when the
size cap forced the oldest out (counted as `dropped`, and an OUTBOX condition
raised; never a point appended `last`, the meter ledger's: `append_last` takes those only as
far as they fit, and the ledger keeps the rest). Counters live in a one-row `meta` table
updated in the same transaction as the rows they count, so a `kill -9` at any moment leaves
them consistent.

Delivery is at least once: a batch the server stored just before the process
died is sent again after the restart. InfluxDB keeps one point per series and
timestamp (a repeat overwrites it), so what the server holds is exactly once
per series and timestamp. VictoriaMetrics keeps the repeat; the billing and
replay readers read an identical one once. Its `-dedup.minScrapeInterval` is
no substitute for an overwrite: it keeps one value per field and millisecond,
not the last written, and billing flags the rows it may have changed (docs/billing.md).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from monitor.errors import OutboxError
from monitor.model import Clock, Condition, ConditionState, Rule, WallClock
from monitor.sinks.batch import Batch, DeadLetter, OutboxStats, Piece, Rejected
from monitor.sqlite import Schema, connect, translate

log = logging.getLogger(__name__)

OUTBOX_SENSOR = "outbox"  # the pseudo-sensor the OUTBOX condition names
OUTBOX_CITATION = "station-monitor outbox size cap"
CLEAR_FRACTION = 0.9  # the cap alarm clears once the backlog is below 90 % of the cap
MAX_REASON = 2000
# An append is stored as segments of at most this many lines (in one transaction): a batch
# that takes part of a segment rewrites that row, so a 10 M-point replay append held in one
# row would be re-read and rewritten by every 5,000-point batch (quadratic drain).
SEGMENT_LINES = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS segment (
    id INTEGER PRIMARY KEY,
    queued REAL NOT NULL,     -- clock time of the append
    count INTEGER NOT NULL,   -- lines in body
    skip INTEGER NOT NULL,    -- leading lines already acknowledged, dead-lettered or dropped
    nbytes INTEGER NOT NULL,  -- bytes of the lines still pending, a newline each
    body BLOB NOT NULL        -- line protocol, lines joined by newlines
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
    next_id INTEGER NOT NULL,          -- segment ids never repeat, even when the table empties
    pending_rows INTEGER NOT NULL,
    pending_bytes INTEGER NOT NULL,
    dropped INTEGER NOT NULL,
    written INTEGER NOT NULL,
    episode_dropped INTEGER NOT NULL   -- > 0 while the cap alarm is active
);
INSERT OR IGNORE INTO meta VALUES (1, 1, 0, 0, 0, 0, 0);
"""
# 2: `last`: segments the cap drops only when nothing else is left (the meter ledger's points,
# unmarked there once the outbox holds them: dropped, nothing would send them again). Since
# `append_last`, never: they are taken only as far as they fit.
_LAST = """
ALTER TABLE segment ADD COLUMN last INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS segment_by_drop ON segment (last, id);
"""
SCHEMA = Schema("outbox", (_SCHEMA, _LAST))  # add a migration to change a table; never edit one


class Outbox:
    """SQLite outbox; one instance per process, used from one thread.

    `synchronous="full"` (default) fsyncs every append, so a committed point also
    survives a power cut; `"normal"` survives any process crash but may lose the
    last appends on power loss. Acknowledgements never fsync: losing one only
    means a batch is sent again.
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
        self.synchronous = synchronous
        self._db = connect(self.path, SCHEMA, synchronous="FULL" if synchronous == "full" else "NORMAL",
                           error=OutboxError)  # fmt: skip

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- taking points in -------------------------------------------------------------

    def append(self, lines: Sequence[str], last: bool = False) -> int:
        """Commit `lines` in one transaction; returns how many old points the cap dropped.

        When this returns, the points are on disk: the caller may count them as taken.
        `last`: the cap never drops them (points whose only other copy forgot them when they
        were taken: the meter ledger's; `append_last` takes only as many as fit).
        """
        return self._append(lines, last, fit=False)[1]

    def append_last(self, lines: Sequence[str]) -> int:
        """Commit the first of `lines` that fit under the cap beside the points held `last`
        (other points are dropped for them, oldest first), as points the cap never drops;
        returns how many were taken. The meter ledger keeps the rest marked and offers them
        again once deliveries made room: dropped at the cap (counted, alarmed), a point whose
        ledger mark was cleared was gone from the InfluxDB copy for good."""
        return self._append(lines, True, fit=True)[0]

    def room_last(self) -> int:
        """Bytes under the cap not held by points appended `last` (what `append_last` may take)."""
        try:
            sql = "SELECT coalesce(sum(nbytes), 0) FROM segment WHERE last = 1"
            (held,) = self._db.execute(sql).fetchone()
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot read outbox {self.path}: {exc}") from exc
        return max(0, self.max_bytes - int(held))

    def _append(self, lines: Sequence[str], last: bool, fit: bool) -> tuple[int, int]:
        """(points taken, old points dropped); `fit`: only the first lines that fit beside
        the `last` ones (read in the same transaction)."""
        if not lines:
            return 0, 0
        if fit:
            room = self.room_last()
            taken = used = 0
            for line in lines:
                used += len(line.encode()) + 1
                if used > room:
                    break
                taken += 1
            lines = lines[:taken]
            if not lines:
                return 0, 0
        bodies = []
        for at in range(0, len(lines), SEGMENT_LINES):
            part = lines[at : at + SEGMENT_LINES]
            body = "\n".join(part).encode()
            if body.count(b"\n") != len(part) - 1:
                raise OutboxError(
                    f"a point for {self.path} contains a line break; the serialiser must escape it"
                )
            bodies.append((len(part), body))
        size = sum(len(body) + 1 for _, body in bodies)
        now = self.clock.now()
        try:
            with _Transaction(self._db) as db:
                next_id, pending_bytes, episode = db.execute(
                    "SELECT next_id, pending_bytes, episode_dropped FROM meta"
                ).fetchone()
                db.executemany(
                    "INSERT INTO segment (id, queued, count, skip, nbytes, body, last)"
                    " VALUES (?, ?, ?, 0, ?, ?, ?)",
                    [
                        (next_id + i, now, n, len(body) + 1, body, int(last))
                        for i, (n, body) in enumerate(bodies)
                    ],
                )
                dropped_rows = dropped_bytes = 0
                if pending_bytes + size > self.max_bytes:
                    dropped_rows, dropped_bytes = self._drop_oldest(db, pending_bytes + size - self.max_bytes)
                db.execute(
                    f"UPDATE meta SET next_id = next_id + {len(bodies)}, pending_rows = pending_rows + ?,"
                    " pending_bytes = pending_bytes + ?, dropped = dropped + ?,"
                    " episode_dropped = episode_dropped + ?",
                    (len(lines) - dropped_rows, size - dropped_bytes, dropped_rows, dropped_rows),
                )
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot append {len(lines)} point(s) to outbox {self.path}: {exc}") from exc
        if dropped_rows:
            self._raise_cap(episode, episode + dropped_rows, now)
        return len(lines), dropped_rows

    @staticmethod
    def _drop_oldest(db: sqlite3.Connection, excess: int) -> tuple[int, int]:
        """Remove the oldest lines until `excess` bytes are freed (inside the caller's
        transaction); never those appended `last` (over a cap lowered under them, the rest stays)."""
        rows = freed = 0
        whole: list[int] = []
        partial: tuple[int, int, int] | None = None
        got = db.execute("SELECT id, count, skip, nbytes FROM segment WHERE last = 0 ORDER BY id")
        for seg, count, skip, nbytes in got:
            if freed + nbytes <= excess:
                whole.append(seg)
                rows += count - skip
                freed += nbytes
                if freed == excess:
                    break
                continue
            body = db.execute("SELECT body FROM segment WHERE id = ?", (seg,)).fetchone()[0]
            lines = bytes(body).split(b"\n")
            k, cut = skip, 0
            while freed + cut < excess:
                cut += len(lines[k]) + 1
                k += 1
            partial = (seg, k, cut)
            rows += k - skip
            freed += cut
            break
        db.executemany("DELETE FROM segment WHERE id = ?", [(s,) for s in whole])
        if partial is not None:
            seg, k, cut = partial
            db.execute("UPDATE segment SET skip = ?, nbytes = nbytes - ? WHERE id = ?", (k, cut, seg))
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

    def peek(self, limit: int, after: tuple[int, int] | None = None) -> Batch | None:
        """The oldest `limit` pending points (from `after`, a previous batch's cursor),
        as one body; None when there are none. Nothing is removed."""
        seg0, line0 = after or (0, 0)
        pieces: list[Piece] = []
        parts: list[bytes] = []
        taken = 0
        try:
            cursor = self._db.execute(
                "SELECT id, queued, count, skip, nbytes, body FROM segment WHERE id >= ? ORDER BY id", (seg0,)
            )
            for seg, queued, count, skip, nbytes, body in cursor:
                start = max(skip, line0) if seg == seg0 else skip
                if start >= count:
                    continue
                end = min(count, start + limit - taken)
                if start == 0 and end == count:
                    part = bytes(body)
                    size = nbytes
                else:
                    part = b"\n".join(bytes(body).split(b"\n")[start:end])
                    size = len(part) + 1
                pieces.append(Piece(seg, start, end, size, queued, count))
                parts.append(part)
                taken += end - start
                if taken >= limit:
                    break
            cursor.close()
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot read outbox {self.path}: {exc}") from exc
        if not pieces:
            return None
        return Batch(pieces, b"\n".join(parts))

    def settle(self, batch: Batch, rejected: Sequence[Rejected] = ()) -> int:
        """The server took `batch`: remove it, moving the `rejected` lines to dead
        letters. Returns the points counted as written."""
        now = self.clock.now()
        lines = batch.lines if rejected else []
        try:
            with _Transaction(self._db, relax=self.synchronous == "full") as db:
                gone, size = self._remove(db, batch)
                for r in rejected:
                    db.execute(
                        "INSERT INTO dead_letter (queued, failed, status, reason, line)"
                        " VALUES (?, ?, ?, ?, ?)",
                        (batch.queued_of(r.index), now, r.status, r.reason[:MAX_REASON], lines[r.index]),
                    )
                written = max(0, gone - len(rejected))
                db.execute(
                    "UPDATE meta SET pending_rows = pending_rows - ?, pending_bytes = pending_bytes - ?,"
                    " written = written + ?",
                    (gone, size, written),
                )
                pending_bytes, episode = db.execute(
                    "SELECT pending_bytes, episode_dropped FROM meta"
                ).fetchone()
                cleared = episode > 0 and pending_bytes < CLEAR_FRACTION * self.max_bytes
                if cleared:
                    db.execute("UPDATE meta SET episode_dropped = 0")
        except sqlite3.Error as exc:
            raise OutboxError(f"cannot remove delivered points from outbox {self.path}: {exc}") from exc
        if cleared:
            log.info("outbox %s is below its cap again after dropping %d point(s)", self.path, episode)
            self._emit(ConditionState.CLEARED, episode, now)
        return written

    def ack(self, batch: Batch) -> int:
        return self.settle(batch)

    @staticmethod
    def _remove(db: sqlite3.Connection, batch: Batch) -> tuple[int, int]:
        """Advance or delete each piece's segment; (lines, bytes) removed.

        A piece whose segment changed since it was read (the cap dropped from it,
        or another drainer got there first) removes only what is still pending.
        """
        gone = size = 0
        for p in batch.pieces:
            if p.end >= p.total:
                changed = db.execute("DELETE FROM segment WHERE id = ? AND skip = ?", (p.segment, p.start))
            else:
                changed = db.execute(
                    "UPDATE segment SET skip = ?, nbytes = nbytes - ? WHERE id = ? AND skip = ?",
                    (p.end, p.nbytes, p.segment, p.start),
                )
            if changed.rowcount == 1:
                gone += p.count
                size += p.nbytes
                continue
            row = db.execute("SELECT skip, body FROM segment WHERE id = ?", (p.segment,)).fetchone()
            if row is None or row[0] >= p.end or row[0] < p.start:
                continue
            skip, body = row
            cut = sum(len(x) + 1 for x in bytes(body).split(b"\n")[skip : p.end])
            if p.end >= p.total:
                db.execute("DELETE FROM segment WHERE id = ?", (p.segment,))
            else:
                db.execute(
                    "UPDATE segment SET skip = ?, nbytes = nbytes - ? WHERE id = ?", (p.end, cut, p.segment)
                )
            gone += p.end - skip
            size += cut
        return gone, size

    # -- looking ----------------------------------------------------------------------

    def stats(self) -> OutboxStats:
        try:
            rows, size, dropped, written = self._db.execute(
                "SELECT pending_rows, pending_bytes, dropped, written FROM meta"
            ).fetchone()
            oldest = self._db.execute("SELECT queued FROM segment ORDER BY id LIMIT 1").fetchone()
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
        try:
            return int(self._db.execute("SELECT pending_rows FROM meta").fetchone()[0])
        except sqlite3.Error as exc:
            raise translate(exc, f"outbox {self.path}", OutboxError) from exc

    def pending_lines(self, limit: int = 1000) -> list[str]:
        """The oldest pending points as text (for diagnostics and tests)."""
        batch = self.peek(limit)
        return [] if batch is None else [x.decode(errors="replace") for x in batch.lines]

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        try:
            rows = self._db.execute(
                "SELECT id, queued, failed, status, reason, line FROM dead_letter ORDER BY id DESC LIMIT ?",
                (limit,),
            ).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, f"outbox {self.path}", OutboxError) from exc
        return [
            DeadLetter(r[0], r[1], r[2], r[3], r[4], bytes(r[5]).decode(errors="replace"))
            for r in reversed(rows)
        ]


class _Transaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`, rolled back on any exception; with `relax` the
    commit skips the fsync (`synchronous=NORMAL` for that commit only)."""

    def __init__(self, db: sqlite3.Connection, relax: bool = False) -> None:
        self.db = db
        self.relax = relax

    def __enter__(self) -> sqlite3.Connection:
        if self.relax:
            self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            if exc_type is None:
                try:
                    self.db.execute("COMMIT")
                except sqlite3.Error:
                    _rollback(self.db)
                    raise
            else:
                # SQLite may have rolled back already (a full disk): a second ROLLBACK
                # would hide the real cause behind "no transaction is active".
                _rollback(self.db)
        finally:
            if self.relax:
                self.db.execute("PRAGMA synchronous=FULL")


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        db.execute("ROLLBACK")
