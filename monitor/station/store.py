"""Pump runs and overflow records on disk (state_dir/station.sqlite), for reports and restarts.

One row per pump run and per overflow, keyed by (sensor, start): replaying the
same history again replaces its rows instead of counting them twice, and what
`monitor run` recorded and what `monitor replay` of its output recorded are the
same rows. Open runs and overflows (`end` NULL) are picked up again after a restart.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from monitor.errors import StateError
from monitor.station.pumps import PumpRun

FILE = "station.sqlite"
SCHEMA_VERSION = 1


@dataclass(slots=True)
class OverflowRecord:
    """One overflow: when, how high, how much, and when it must be reported by."""

    sensor: str
    start: float
    due: float
    end: float | None = None
    peak: float = float("nan")
    volume_gal: float | None = None
    method: str = ""  # weir | inflow | "" (no estimate possible)


class StationStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # One thread at a time uses it (the daemon's loop); the console may run on another
            # loop thread in tests, so sqlite3's same-thread check is off.
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(
                """
                CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS runs (
                    pump TEXT NOT NULL, start REAL NOT NULL, end REAL, started INTEGER NOT NULL,
                    PRIMARY KEY (pump, start));
                CREATE TABLE IF NOT EXISTS overflows (
                    sensor TEXT NOT NULL, start REAL NOT NULL, end REAL, peak REAL, volume_gal REAL,
                    due REAL NOT NULL, method TEXT NOT NULL, PRIMARY KEY (sensor, start));
                """
            )
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StateError(f"{path}: written by a newer monitor (schema {row[0]})")
        except sqlite3.Error as exc:
            raise StateError(f"{path}: {exc}") from exc

    @classmethod
    def open(cls, state_dir: Path) -> StationStore:
        return cls(state_dir / FILE)

    def close(self) -> None:
        self.db.close()

    def save_run(self, run: PumpRun) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?)",
            (run.pump, run.start, run.end, int(run.started)),
        )

    def save_overflow(self, rec: OverflowRecord) -> None:
        peak = rec.peak if rec.peak == rec.peak else None
        self.db.execute(
            "INSERT OR REPLACE INTO overflows VALUES (?, ?, ?, ?, ?, ?, ?)",
            (rec.sensor, rec.start, rec.end, peak, rec.volume_gal, rec.due, rec.method),
        )

    def save_progress(self, t: float) -> None:
        """The last event time judged: where an open run is counted up to in a report."""
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('last_time', ?)", (repr(t),))

    def last_time(self) -> float | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'last_time'").fetchone()
        return None if row is None else float(row[0])

    def runs(self, start: float, end: float) -> list[PumpRun]:
        """Runs that overlap [start, end)."""
        rows = self.db.execute(
            "SELECT pump, start, end, started FROM runs WHERE start < ? AND (end IS NULL OR end > ?)"
            " ORDER BY start",
            (end, start),
        ).fetchall()
        return [PumpRun(p, s, e, bool(c)) for p, s, e, c in rows]

    def open_runs(self) -> list[PumpRun]:
        rows = self.db.execute("SELECT pump, start, started FROM runs WHERE end IS NULL").fetchall()
        return [PumpRun(p, s, None, bool(c)) for p, s, c in rows]

    def overflows(self, start: float, end: float) -> list[OverflowRecord]:
        rows = self.db.execute(
            "SELECT sensor, start, end, peak, volume_gal, due, method FROM overflows"
            " WHERE start < ? AND (end IS NULL OR end > ?) ORDER BY start",
            (end, start),
        ).fetchall()
        return [
            OverflowRecord(s, st, due, e, float("nan") if pk is None else pk, vol, m)
            for s, st, e, pk, vol, due, m in rows
        ]

    def open_overflows(self) -> list[OverflowRecord]:
        return [r for r in self.overflows(float("-inf"), float("inf")) if r.end is None]


__all__ = ["FILE", "OverflowRecord", "StationStore"]
