"""The local series store: what the console's sparklines and `monitor series` read.

SQLite (`state_dir/series.sqlite`, WAL), one row per sensor and event time, kept
for `store.retention` (30 days by default) behind the newest sample. It works
with or without InfluxDB, so the gateway's own console never depends on the link.
A repeated (sensor, time) replaces the earlier value, so replaying the same
history twice does not double it.

`hold` also keeps the batch as an *intake* record in the same transaction, until
the pipeline `release`s it once the outbox and the ledger have it too; `held`
lists what a crash left in between (see `monitor.pipeline`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

from monitor.errors import SinkError
from monitor.model import Quality, Sample
from monitor.sqlite import Schema, connect, translate

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sensor (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS sample (
    sensor INTEGER NOT NULL,
    t REAL NOT NULL,
    value REAL,
    quality INTEGER NOT NULL,
    PRIMARY KEY (sensor, t)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sample_time ON sample (t);
"""
# Version 2: the pipeline's intake records (keys of a batch until every store has it).
_INTAKE = """
CREATE TABLE IF NOT EXISTS intake (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
"""
SCHEMA = Schema("series store", (_SCHEMA, _INTAKE))  # add a migration to change a table; never edit one

PRUNE_EVERY = 3600.0  # seconds of event time between retention sweeps


class SeriesStore:
    """Append samples, read them back by sensor and time range, downsampled on request."""

    def __init__(self, path: Path, retention: float = 30 * 86400.0) -> None:
        self.path = Path(path)
        self.retention = retention
        self._db = connect(self.path, SCHEMA, synchronous="NORMAL", error=SinkError)
        try:
            self._ids: dict[str, int] = dict(self._db.execute("SELECT name, id FROM sensor").fetchall())
            newest = self._db.execute("SELECT MAX(t) FROM sample").fetchone()[0]
        except sqlite3.Error as exc:
            self._db.close()
            raise translate(exc, f"series store {self.path}", SinkError) from exc
        self._newest: float | None = newest
        self._pruned_at: float = newest if newest is not None else float("-inf")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SeriesStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sensor_id(self, name: str) -> int:
        found = self._ids.get(name)
        if found is None:
            self._db.execute("INSERT OR IGNORE INTO sensor (name) VALUES (?)", (name,))
            found = self._ids[name] = int(
                self._db.execute("SELECT id FROM sensor WHERE name = ?", (name,)).fetchone()[0]
            )
        return found

    def append(self, samples: Iterable[Sample]) -> int:
        """Store samples in one transaction (NaN values are kept as NULL); returns how many."""
        return self._append(samples, hold=False)[0]

    def hold(self, samples: Sequence[Sample]) -> int:
        """Store samples and keep them as an intake record, in one transaction; returns
        the record's number for `release`. The record holds the keys (sensor, time) only,
        12 bytes a sample: the values are in the `sample` rows of the same transaction."""
        seq = self._append(samples, hold=True)[1]
        assert seq is not None
        return seq

    def release(self, seq: int) -> None:
        """Forget an intake record: every store has its batch."""
        try:
            self._db.execute("DELETE FROM intake WHERE seq = ?", (seq,))
        except sqlite3.Error as exc:
            raise SinkError(f"cannot write to series store {self.path}: {exc}") from exc

    def held(self) -> list[tuple[int, list[Sample]]]:
        """Intake records not released, oldest first, with their samples as stored."""
        names = {sid: name for name, sid in self._ids.items()}
        out: list[tuple[int, list[Sample]]] = []
        nan = float("nan")
        try:
            for seq, body in self._db.execute("SELECT seq, body FROM intake ORDER BY seq").fetchall():
                n = len(body) // 12
                ids, times = array("i"), array("d")
                ids.frombytes(body[: 4 * n])
                times.frombytes(body[4 * n :])
                samples = []
                for sid, t in zip(ids, times, strict=True):
                    row = self._db.execute(
                        "SELECT value, quality FROM sample WHERE sensor = ? AND t = ?", (sid, t)
                    ).fetchone()
                    if row is not None:  # None: pruned by retention since
                        samples.append(
                            Sample(names[sid], t, nan if row[0] is None else row[0], Quality(row[1]))
                        )
                out.append((seq, samples))
        except sqlite3.Error as exc:
            raise SinkError(f"cannot read series store {self.path}: {exc}") from exc
        return out

    def _append(self, samples: Iterable[Sample], hold: bool) -> tuple[int, int | None]:
        seq: int | None = None
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = [
                    (
                        self._sensor_id(s.sensor),
                        s.time,
                        s.value if s.value == s.value else None,
                        int(s.quality),
                    )
                    for s in samples
                ]
                self._db.executemany("INSERT OR REPLACE INTO sample VALUES (?, ?, ?, ?)", rows)
                if hold:
                    body = (
                        array("i", [r[0] for r in rows]).tobytes()
                        + array("d", [r[1] for r in rows]).tobytes()
                    )
                    seq = self._db.execute("INSERT INTO intake (body) VALUES (?)", (body,)).lastrowid
                if rows:
                    newest = max(r[1] for r in rows)
                    if self._newest is None or newest > self._newest:
                        self._newest = newest
                    if self._newest - self._pruned_at >= PRUNE_EVERY:
                        self._db.execute("DELETE FROM sample WHERE t < ?", (self._newest - self.retention,))
                        self._pruned_at = self._newest
                self._db.execute("COMMIT")  # a failed COMMIT rolls back below
            except BaseException:
                # SQLite may have rolled back already (a full disk): a second ROLLBACK
                # would hide the real cause behind "no transaction is active".
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                with contextlib.suppress(sqlite3.Error):  # ids cached in the rolled-back transaction
                    self._ids = dict(self._db.execute("SELECT name, id FROM sensor").fetchall())
                raise
        except sqlite3.Error as exc:
            raise SinkError(f"cannot write to series store {self.path}: {exc}") from exc
        return len(rows), seq

    def sensors(self) -> list[str]:
        return sorted(self._ids)

    def query(
        self,
        sensor: str,
        since: float | None = None,
        until: float | None = None,
        max_points: int | None = None,
    ) -> list[Sample]:
        """Samples of `sensor` with since <= time < until, oldest first.

        With `max_points`, a longer range is averaged into that many equal time
        buckets (time: the bucket's first sample; quality: the bucket's worst).
        """
        sid = self._ids.get(sensor)
        if sid is None:
            return []
        lo = float("-inf") if since is None else since
        hi = float("inf") if until is None else until
        try:
            count, first, last = self._db.execute(
                "SELECT COUNT(*), MIN(t), MAX(t) FROM sample WHERE sensor = ? AND t >= ? AND t < ?",
                (sid, lo, hi),
            ).fetchone()
            if max_points is None or count <= max_points:
                rows = self._db.execute(
                    "SELECT t, value, quality FROM sample WHERE sensor = ? AND t >= ? AND t < ? ORDER BY t",
                    (sid, lo, hi),
                ).fetchall()
            else:
                width = (last - first) / max_points or 1.0
                rows = self._db.execute(
                    "SELECT MIN(t), AVG(value), MAX(quality) FROM sample"
                    " WHERE sensor = ? AND t >= ? AND t < ?"
                    " GROUP BY MIN(CAST((t - ?) / ? AS INTEGER), ?) ORDER BY 1",
                    (sid, lo, hi, first, width, max_points - 1),
                ).fetchall()
        except sqlite3.Error as exc:
            raise SinkError(f"cannot read series store {self.path}: {exc}") from exc
        nan = float("nan")
        return [Sample(sensor, t, nan if v is None else v, Quality(q)) for t, v, q in rows]

    def latest(self) -> dict[str, Sample]:
        """The newest sample of every sensor."""
        out: dict[str, Sample] = {}
        nan = float("nan")
        try:
            for name, sid in self._ids.items():
                row = self._db.execute(
                    "SELECT t, value, quality FROM sample WHERE sensor = ? ORDER BY t DESC LIMIT 1", (sid,)
                ).fetchone()
                if row is not None:
                    out[name] = Sample(name, row[0], nan if row[1] is None else row[1], Quality(row[2]))
        except sqlite3.Error as exc:
            raise translate(exc, f"series store {self.path}", SinkError) from exc
        return out
