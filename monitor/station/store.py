"""Pump runs and overflow records on disk (state_dir/station.sqlite), for reports and restarts.

One row per pump run and per overflow, keyed by (sensor, start): replaying the
same history again replaces its rows instead of counting them twice, and what
`monitor run` recorded and what `monitor replay` of its output recorded are the
same rows. Open runs and overflows (`end` NULL) are picked up again after a restart.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from monitor.sqlite import Schema, connect, translate
from monitor.station.pumps import PumpRun
from monitor.station.record import NO_LEVEL, OverflowRecord

FILE = "station.sqlite"


def merged(gaps: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Stretches of time, those that overlap or touch made one, oldest first: a time counted once."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(gaps):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    pump TEXT NOT NULL, start REAL NOT NULL, end REAL, started INTEGER NOT NULL,
    PRIMARY KEY (pump, start));
CREATE TABLE IF NOT EXISTS overflows (
    sensor TEXT NOT NULL, start REAL NOT NULL, end REAL, peak REAL, volume_gal REAL,
    due REAL NOT NULL, method TEXT NOT NULL, PRIMARY KEY (sensor, start));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Why a volume is unknown or partial, and the level readings it rests on (a record
# with no level reading said 0 gal, read as measured).
_VOLUME_NOTE = """
ALTER TABLE overflows ADD COLUMN volume_note TEXT NOT NULL DEFAULT '';
ALTER TABLE overflows ADD COLUMN level_last REAL;
ALTER TABLE overflows ADD COLUMN silent_from REAL;
ALTER TABLE overflows ADD COLUMN silent_to REAL;
"""
# A restart goes on as without one (the opener's clock, the float's state, the carried
# rate), and an overflow continuing one the float ended with the level dead says so.
_RESUME_AND_LINK = """
ALTER TABLE overflows ADD COLUMN opened_by TEXT NOT NULL DEFAULT '';
ALTER TABLE overflows ADD COLUMN switch_on INTEGER;
ALTER TABLE overflows ADD COLUMN switch_off_at REAL;
ALTER TABLE overflows ADD COLUMN volume_at_off REAL;
ALTER TABLE overflows ADD COLUMN rate_gpm REAL;
ALTER TABLE overflows ADD COLUMN rate_at REAL;
ALTER TABLE overflows ADD COLUMN continues REAL;
ALTER TABLE overflows ADD COLUMN gap_from REAL;
"""
# An overflow open across a local midnight: each day's point has what spilled in it.
_DAY_SPLIT = """
ALTER TABLE overflows ADD COLUMN volume_before_day REAL;
"""
# The level's readings known missing while an overflow was open, however briefly, and the
# level read under the setpoint while the float said on (the instruments disagree).
_MISSING = """
ALTER TABLE overflows ADD COLUMN missing_from REAL;
ALTER TABLE overflows ADD COLUMN missing_to REAL;
ALTER TABLE overflows ADD COLUMN disagree_from REAL;
ALTER TABLE overflows ADD COLUMN disagree_to REAL;
ALTER TABLE overflows ADD COLUMN disagree_level REAL;
"""
# The level read in a crest gap (the float off, the level live just under the setpoint): the
# gap between two records of one spill was measured, not a stretch nothing was read in.
_GAP_LEVEL = """
ALTER TABLE overflows ADD COLUMN gap_level REAL;
"""
# The silences of the station not monitored (`DailyTotals`), kept for good: `monitor pumps
# report` over any period leaves them out of run hours as the day's point does.
_UNMONITORED = """
CREATE TABLE IF NOT EXISTS unmonitored (start REAL PRIMARY KEY, end REAL NOT NULL);
"""
# Add a migration to change a table; never edit one.
SCHEMA = Schema(
    "station store", (_SCHEMA, _VOLUME_NOTE, _RESUME_AND_LINK, _DAY_SPLIT, _MISSING, _UNMONITORED, _GAP_LEVEL)
)


_COLUMNS = (
    "sensor, start, end, peak, volume_gal, due, method, volume_note, level_last, silent_from, silent_to,"
    " opened_by, switch_on, switch_off_at, volume_at_off, rate_gpm, rate_at, continues, gap_from,"
    " volume_before_day, missing_from, missing_to, disagree_from, disagree_to, disagree_level,"
    " gap_level"
)


class StationStore:
    """Every write and read raises `StateError` naming the file when SQLite refuses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # One thread at a time uses it (the daemon's loop); the console may run on another
        # loop thread in tests, so sqlite3's same-thread check is off.
        self.db = connect(path, SCHEMA, check_same_thread=False)

    def _run(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, f"station store {self.path}") from exc

    @classmethod
    def open(cls, state_dir: Path) -> StationStore:
        return cls(state_dir / FILE)

    def close(self) -> None:
        self.db.close()

    def save_run(self, run: PumpRun) -> None:
        self._run(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?)",
            (run.pump, run.start, run.end, int(run.started)),
        )

    def save_overflow(self, rec: OverflowRecord) -> None:
        peak = rec.peak if rec.peak == rec.peak else None
        switch = None if rec.switch_on is None else int(rec.switch_on)
        self._run(
            f"INSERT OR REPLACE INTO overflows ({_COLUMNS}) VALUES ({', '.join('?' * 26)})",
            (
                rec.sensor,
                rec.start,
                rec.end,
                peak,
                rec.volume_gal,
                rec.due,
                rec.method,
                rec.volume_note,
                rec.level_last,
                rec.silent_from,
                rec.silent_to,
                rec.opened_by,
                switch,
                rec.switch_off_at,
                rec.volume_at_off,
                rec.rate_gpm,
                rec.rate_at,
                rec.continues,
                rec.gap_from,
                rec.volume_before_day,
                rec.missing_from,
                rec.missing_to,
                rec.disagree_from,
                rec.disagree_to,
                rec.disagree_level,
                rec.gap_level,
            ),
        )

    def shift_open(self, delta: float, pumps: Collection[str], overflow: bool = True) -> None:
        """The open runs of `pumps` and, with `overflow`, the open overflow moved by `delta`
        seconds (the gateway clock stepped while they were open: `StationTracker.shift`;
        a device-stamped pump's or level's stay); their rows are keyed by start."""
        for pump in pumps:
            self._run("UPDATE runs SET start = start + ? WHERE end IS NULL AND pump = ?", (delta, pump))
        if overflow:
            self._run(
                "UPDATE overflows SET start = start + ?, due = due + ? WHERE end IS NULL", (delta, delta)
            )

    def shift_starts(self, starts: list[tuple[str, float]], delta: float) -> None:
        """The closed runs that began at `starts` ((pump, start): the tracker's starts of
        the last hour) moved by `delta` seconds with a clock step, as the tracker moves
        them, so starts per hour restored after a restart counts the hour that passed. A
        run already at the moved time (the same instant, to the bit) keeps its place."""
        for pump, start in starts:
            self._run(
                "UPDATE OR IGNORE runs SET start = start + ?, end = end + ?"
                " WHERE pump = ? AND start = ? AND end IS NOT NULL",
                (delta, delta, pump, start),
            )

    def save_progress(self, t: float) -> None:
        """The last event time judged: where an open run is counted up to in a report."""
        self._run("INSERT OR REPLACE INTO meta VALUES ('last_time', ?)", (repr(t),))

    def last_time(self) -> float | None:
        rows = self._run("SELECT value FROM meta WHERE key = 'last_time'")
        return float(rows[0][0]) if rows else None

    def save_spill(self, spill: tuple[float, float, float] | None, crest: bool = False) -> None:
        """The overflow the float ended with the level dead, that the next may continue
        (`StationTracker`, one spill, one event): its start (the key), its end on the float's
        clock as it stands, the level's last reading; None once the level read below the
        setpoint or the next record opened. Kept so a restart in the gap does not part one
        spill into two events. `crest`: one the float's off ended with the level live just
        under the setpoint (key `crest`: a release before it ignores the key, as it did `spill`
        before it knew one)."""
        # One transaction: killed between the two, a restart would find neither candidate.
        self._run("BEGIN IMMEDIATE")
        try:
            self._run("DELETE FROM meta WHERE key IN ('spill', 'crest')")
            if spill is not None:
                key = "crest" if crest else "spill"
                self._run("INSERT INTO meta VALUES (?, ?)", (key, " ".join(map(repr, spill))))
            self._run("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # a full disk refused the COMMIT: not left open
                self.db.rollback()
            raise

    def save_level_spent(self, level_time: float | None) -> None:
        """The level's last reading, at or above the setpoint, that the float overruled (its
        transmitter dead: `StationTracker`, no overflow from it until the next reading);
        None once the level is read again. Kept so a record the float alone opened then and
        open at a restart ends as without one (a key of `meta`: no schema change)."""
        if level_time is None:
            self._run("DELETE FROM meta WHERE key = 'level_spent'")
        else:
            self._run("INSERT OR REPLACE INTO meta VALUES ('level_spent', ?)", (repr(level_time),))

    def save_unmonitored(self, gap: tuple[float, float]) -> None:
        """A silence not monitored (`DailyTotals`), for the days' points after a restart and for
        reports. One from the same last time (a restart killed before it saved its progress
        begins its silence there again) keeps the longer: the downtime is counted once."""
        self._run(
            "INSERT INTO unmonitored VALUES (?, ?)"
            " ON CONFLICT (start) DO UPDATE SET end = max(end, excluded.end)",
            gap,
        )

    def shift_unmonitored(self, delta: float, after: float) -> None:
        """The silences ending after `after` (the days not closed) moved by `delta` with a
        clock step back, as `DailyTotals.stepped` moves them; one landing on another's start
        keeps its place."""
        self._run(
            "UPDATE OR IGNORE unmonitored SET start = start + ?, end = end + ? WHERE end > ?",
            (delta, delta, after),
        )

    def unmonitored(self, start: float = -math.inf, end: float = math.inf) -> list[tuple[float, float]]:
        """The silences not monitored that overlap [start, end), merged where they overlap,
        oldest first. With those the merged schema-5 code kept in `meta` (key `unmonitored`)."""
        rows = self._run("SELECT start, end FROM unmonitored WHERE start < ? AND end > ?", (end, start))
        kept = self._run("SELECT value FROM meta WHERE key = 'unmonitored'")
        xs = [float(x) for x in str(kept[0][0]).split()] if kept else []
        old = [(a, b) for a, b in zip(xs[::2], xs[1::2], strict=False) if a < end and b > start]
        return merged([*rows, *old])

    def level_spent(self) -> float | None:
        """The time `save_level_spent` kept, if any."""
        rows = self._run("SELECT value FROM meta WHERE key = 'level_spent'")
        return float(rows[0][0]) if rows else None

    def spill(self) -> tuple[OverflowRecord, float, float, bool] | None:
        """The record `save_spill` named (closed), its end, the level's last reading and
        whether it is a crest's (`save_spill`)."""
        rows = self._run("SELECT key, value FROM meta WHERE key IN ('spill', 'crest')")
        if not rows:
            return None
        key, value = rows[0]
        start, end, level_time = (float(x) for x in str(value).split())
        recs = [r for r in self.overflows(start, start + 1.0) if r.start == start and r.end is not None]
        return (recs[0], end, level_time, key == "crest") if recs else None

    def save_daily_queued(self, end: float) -> None:
        """The end (a local midnight) of the last day whose daily totals the outbox took: a
        restart closes the days after it again (`DailyTotals.resumed`), as their lines were
        kept in memory only. A key of `meta`: an older release ignores it."""
        self._run("INSERT OR REPLACE INTO meta VALUES ('daily_queued', ?)", (repr(end),))

    def daily_queued(self) -> float | None:
        rows = self._run("SELECT value FROM meta WHERE key = 'daily_queued'")
        return float(rows[0][0]) if rows else None

    def runs(self, start: float, end: float) -> list[PumpRun]:
        """Runs that overlap [start, end)."""
        rows = self._run(
            "SELECT pump, start, end, started FROM runs WHERE start < ? AND (end IS NULL OR end > ?)"
            " ORDER BY start",
            (end, start),
        )
        return [PumpRun(p, s, e, bool(c)) for p, s, e, c in rows]

    def recent_starts(self, window: float = 3600.0) -> list[tuple[str, float]]:
        """(pump, start) of the starts within `window` before the newest, oldest first: the
        evidence of starts per hour, taken again after a restart."""
        rows = self._run(
            "SELECT pump, start FROM runs WHERE started = 1"
            " AND start > (SELECT max(start) FROM runs WHERE started = 1) - ? ORDER BY start",
            (window,),
        )
        return [(p, s) for p, s in rows]

    def open_runs(self) -> list[PumpRun]:
        rows = self._run("SELECT pump, start, started FROM runs WHERE end IS NULL")
        return [PumpRun(p, s, None, bool(c)) for p, s, c in rows]

    def overflows(self, start: float, end: float) -> list[OverflowRecord]:
        rows = self._run(
            f"SELECT {_COLUMNS} FROM overflows WHERE start < ? AND (end IS NULL OR end > ?) ORDER BY start",
            (end, start),
        )
        out = []
        for row in rows:
            head, tail = row[:11], row[11:]  # the columns of schema 2, then of schemas 3 to 5
            s, st, e, pk, vol, due, m, note, last, sf, stt = head
            by, sw, *rest = tail
            nan = float("nan") if pk is None else pk
            rec = OverflowRecord(s, st, due, e, nan, vol, m, note, last, sf, stt, by)
            rec.switch_on = None if sw is None else bool(sw)
            rec.switch_off_at, rec.volume_at_off, rec.rate_gpm, rec.rate_at = rest[:4]
            rec.continues, rec.gap_from, rec.volume_before_day, rec.missing_from, rec.missing_to = rest[4:9]
            rec.disagree_from, rec.disagree_to, rec.disagree_level, rec.gap_level = rest[9:]
            out.append(rec)
        return out

    def open_overflows(self) -> list[OverflowRecord]:
        return [r for r in self.overflows(float("-inf"), float("inf")) if r.end is None]


__all__ = ["FILE", "NO_LEVEL", "OverflowRecord", "StationStore", "merged"]
