"""The local series store: what the console's sparklines and `monitor series` read.

SQLite (`state_dir/series.sqlite`, WAL), one row per sensor and event time, kept
for `store.retention` (30 days by default) behind the newest sample. It works
with or without InfluxDB, so the gateway's own console never depends on the link.
A repeated (sensor, time) replaces the earlier value, so replaying the same
history twice does not double it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
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
SCHEMA = Schema("series store", (_SCHEMA,))  # add a migration to change a table; never edit one

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
                if rows:
                    newest = max(r[1] for r in rows)
                    if self._newest is None or newest > self._newest:
                        self._newest = newest
                    if self._newest - self._pruned_at >= PRUNE_EVERY:
                        self._db.execute("DELETE FROM sample WHERE t < ?", (self._newest - self.retention,))
                        self._pruned_at = self._newest
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise SinkError(f"cannot write to series store {self.path}: {exc}") from exc
        return len(rows)

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
