"""Pump runs and overflow records on disk (state_dir/station.sqlite), for reports and restarts.

One row per pump run and per overflow, keyed by (sensor, start): replaying the
same history again replaces its rows instead of counting them twice, and what
`monitor run` recorded and what `monitor replay` of its output recorded are the
same rows. Open runs and overflows (`end` NULL) are picked up again after a restart.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.model import iso
from monitor.sqlite import Schema, connect, translate
from monitor.station.pumps import PumpRun

FILE = "station.sqlite"
NO_LEVEL = "no level reading during the overflow"


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
    # Why the volume is not the whole overflow's: "" (measured throughout), "no level
    # reading during the overflow" (volume None, never 0), "partial: ..." (`StationTracker`).
    volume_note: str = ""
    # What the volume rests on: the level's last good reading while it was open, and its
    # longest silence then (from the start or a reading to the next reading).
    level_last: float | None = None
    silent_from: float | None = None
    silent_to: float | None = None
    # What a restart needs to go on as without one (schema 3; None/"" in an older file):
    # the sensor whose reading opened it (its start is that clock's), the float's last
    # reading while open (True on), its on-to-off then and the volume carried to it, and
    # the rate the volume is carried at from `rate_at`.
    opened_by: str = ""
    switch_on: bool | None = None
    switch_off_at: float | None = None
    volume_at_off: float | None = None
    rate_gpm: float | None = None
    rate_at: float | None = None
    # The overflow this one continues (the start of the spill's first record: its id) and
    # the end of the record just before it: from then to this start nothing was measured
    # (`StationTracker`, "one spill, one event").
    continues: float | None = None
    gap_from: float | None = None
    # The volume carried to the last local midnight it was open across: the share of its
    # earlier days in their `station_daily` (schema 4; None: it crossed none).
    volume_before_day: float | None = None
    # The longest stretch, however short, in which the level's readings are known to be
    # missing while it was open (schema 5; None: none): its transmitter read bad, or the
    # daemon was down (`StationTracker`). Its volume then is an estimate: partial.
    missing_from: float | None = None
    missing_to: float | None = None
    # Not stored: the level's silence now is one with readings missing since (`level_missed`),
    # and whether only if longer than the longest before it (a restart between two polls
    # missed none: `restarted`).
    # The longest stretch in which the level read under `overflow` while the float switch
    # said on (the instruments disagree; the float keeps the record open), and the level read
    # first then (schema 5). Said in the note when longer than the level's `stale_after`
    # (shorter: a float's hysteresis at the crest).
    disagree_from: float | None = None
    disagree_to: float | None = None
    disagree_level: float | None = None
    # Not stored: the disagreement going on now, since when and the level then.
    _disagree_now: tuple[float, float] | None = dataclasses.field(default=None, repr=False, compare=False)
    _missed_since: float | None = dataclasses.field(default=None, repr=False, compare=False)
    _missed_if_longer: bool = dataclasses.field(default=False, repr=False, compare=False)

    def level_read(self, t: float) -> None:
        """A good level reading at `t` while the overflow is open."""
        prev = self.start if self.level_last is None else self.level_last
        gap = self.silence(prev)  # the silence so far, not counting to `t`
        missed = self._missed(t)
        if missed is not None:
            self._kept_missing(*missed)
        self._missed_since = None
        if t - prev > gap[1] - gap[0]:
            self.silent_from, self.silent_to = prev, t
        self.level_last = t if self.level_last is None else max(self.level_last, t)

    def level_missed(self, t: float) -> None:
        """A level reading at `t`, bad (bad data, comm failure, outside its range), while the
        overflow is open: the silence it falls in misses readings, however short."""
        since = self.start if self.level_last is None else self.level_last
        if t >= since and (self._missed_since is None or self._missed_if_longer):
            self._missed_since, self._missed_if_longer = since, False

    def restarted(self) -> None:
        """Taken up again after the daemon was down: the level's silence across the downtime
        misses readings if longer than its longest silence before it (the level's poll,
        while the daemon ran); a restart between two polls missed none."""
        if self._missed_since is None:
            self._missed_since = self.start if self.level_last is None else self.level_last
            self._missed_if_longer = True

    def _missed(self, until: float) -> tuple[float, float] | None:
        """The silence now, to `until`, if readings are missing in it."""
        since = self._missed_since
        if since is None or until <= since:
            return None
        if self._missed_if_longer:
            before = self.silence(since)
            if until - since <= before[1] - before[0]:
                return None
        return since, until

    def _kept_missing(self, start: float, end: float) -> None:
        if (
            self.missing_from is None
            or self.missing_to is None
            or end - start > self.missing_to - self.missing_from
        ):
            self.missing_from, self.missing_to = start, end

    def missing(self, until: float) -> tuple[float, float] | None:
        """The longest stretch with the level's readings known missing, up to `until`."""
        now = self._missed(until)
        kept = (
            None
            if self.missing_from is None or self.missing_to is None
            else (self.missing_from, self.missing_to)
        )
        if now is None or (kept is not None and kept[1] - kept[0] >= now[1] - now[0]):
            return kept
        return now

    def shifted_level(self, delta: float) -> None:
        """The level's clock stepped by `delta` (`OpenOverflow.shifted`): the stretches of missing
        readings and of disagreement, on the level's clock, move with it."""
        if self.missing_from is not None and self.missing_to is not None:
            self.missing_from, self.missing_to = self.missing_from + delta, self.missing_to + delta
        if self._missed_since is not None:
            self._missed_since += delta
        if self.disagree_from is not None and self.disagree_to is not None:
            self.disagree_from, self.disagree_to = self.disagree_from + delta, self.disagree_to + delta
        if self._disagree_now is not None:
            self._disagree_now = (self._disagree_now[0] + delta, self._disagree_now[1])

    def disagreeing(self, t: float, level: float) -> None:
        """A good level reading `level`, under `overflow`, at `t` with the float switch on."""
        if self._disagree_now is None:
            self._disagree_now = (t, level)

    def agreed(self, t: float) -> None:
        """The level and the float agree again at `t` (over, or the float off)."""
        longest = self.disagreement(t)
        if longest is not None:
            self.disagree_from, self.disagree_to, self.disagree_level = longest
        self._disagree_now = None

    def disagreement(self, until: float) -> tuple[float, float, float] | None:
        """The longest disagreement up to `until` (one going on ends there): from, to, level."""
        kept = None
        if (
            self.disagree_from is not None
            and self.disagree_to is not None
            and self.disagree_level is not None
        ):
            kept = (self.disagree_from, self.disagree_to, self.disagree_level)
        now = self._disagree_now
        if now is not None and (kept is None or until - now[0] > kept[1] - kept[0]):
            return now[0], until, now[1]
        return kept

    def _disagreed(self, stale_after: float, until: float) -> str:
        """What the record says of the instruments disagreeing longer than `stale_after`."""
        d = self.disagreement(until)
        if d is None or d[1] - d[0] <= stale_after:
            return ""
        return (
            f"the level read {d[2]:g}, under overflow, while the overflow switch was on"
            f" from {iso(d[0])} to {iso(d[1])}: the instruments disagree; the switch"
            " kept the overflow open, the volume then is the level's"
        )

    def unmeasured(self, stale_after: float, until: float) -> tuple[float, float] | None:
        """Where the volume is not measured, up to `until` (None: nowhere): the level's
        longest silence if longer than `stale_after`, else the longest stretch with its
        readings known missing."""
        silent = self.silence(until)
        if silent[1] - silent[0] > stale_after:
            return silent
        return self.missing(until)

    def silence(self, until: float) -> tuple[float, float]:
        """The level's longest silence while open, up to `until` ((x, x): none)."""
        gap = (until, until)
        if self.silent_from is not None and self.silent_to is not None:
            gap = (self.silent_from, self.silent_to)
        if self.level_last is not None and until - self.level_last > gap[1] - gap[0]:
            gap = (self.level_last, until)
        return gap

    def judged(self, stale_after: float, until: float) -> tuple[float | None, str]:
        """The volume as it may be reported over [start, `until`], and why it is not the
        whole overflow's: unknown (None, never 0) with no level reading while it was open
        (the weir has no head, the inflow method needs the level); partial when the level
        was silent longer than its `stale_after`, or its readings are known missing however
        briefly (`missing`). The note says what the estimate did: the weir's flow between
        the levels read before and after (trapezoids), or carried on at the last level known
        (the inflow method; the weir's with no level read after)."""
        if not self.method:
            return None, "no weir or inflow to estimate it"
        if self.level_last is None:
            return None, NO_LEVEL
        gap = self.unmeasured(stale_after, until)
        disagreed = self._disagreed(stale_after, until)
        parts = [disagreed] if disagreed else []
        if gap is not None:
            silent = self.silence(until)
            long = gap[1] - gap[0] > stale_after and gap == silent
            what = "no level reading" if long else "level readings missing"
            if self.method == "weir" and gap[1] <= self.level_last:
                how = "the flow over the weir then is estimated from the levels read before and after"
            else:
                how = "the volume then rests on the last level known"
            parts.insert(0, f"{what} from {iso(gap[0])} to {iso(gap[1])}; {how}")
        return self.volume_gal, "partial: " + "; ".join(parts) if parts else ""


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
# Add a migration to change a table; never edit one.
SCHEMA = Schema("station store", (_SCHEMA, _VOLUME_NOTE, _RESUME_AND_LINK, _DAY_SPLIT, _MISSING))


_COLUMNS = (
    "sensor, start, end, peak, volume_gal, due, method, volume_note, level_last, silent_from, silent_to,"
    " opened_by, switch_on, switch_off_at, volume_at_off, rate_gpm, rate_at, continues, gap_from,"
    " volume_before_day, missing_from, missing_to, disagree_from, disagree_to, disagree_level"
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
            f"INSERT OR REPLACE INTO overflows ({_COLUMNS}) VALUES ({', '.join('?' * 25)})",
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

    def save_spill(self, spill: tuple[float, float, float] | None) -> None:
        """The overflow the float ended with the level dead, that the next may continue
        (`StationTracker`, one spill, one event): its start (the key), its end on the float's
        clock as it stands, the level's last reading; None once the level read below the
        setpoint or the next record opened. Kept so a restart in the gap does not part one
        spill into two events."""
        if spill is None:
            self._run("DELETE FROM meta WHERE key = 'spill'")
        else:
            self._run("INSERT OR REPLACE INTO meta VALUES ('spill', ?)", (" ".join(map(repr, spill)),))

    def save_level_spent(self, level_time: float | None) -> None:
        """The level's last reading, at or above the setpoint, that the float overruled (its
        transmitter dead: `StationTracker`, no overflow from it until the next reading);
        None once the level is read again. Kept so a record the float alone opened then and
        open at a restart ends as without one (a key of `meta`: no schema change)."""
        if level_time is None:
            self._run("DELETE FROM meta WHERE key = 'level_spent'")
        else:
            self._run("INSERT OR REPLACE INTO meta VALUES ('level_spent', ?)", (repr(level_time),))

    def save_unmonitored(self, gaps: list[tuple[float, float]]) -> None:
        """The silences of the days not closed yet that were not monitored (`DailyTotals`):
        a restart keeps them for the days' points (a key of `meta`: no schema change)."""
        self._run(
            "INSERT OR REPLACE INTO meta VALUES ('unmonitored', ?)",
            (" ".join(repr(x) for gap in gaps for x in gap),),
        )

    def unmonitored(self) -> list[tuple[float, float]]:
        """What `save_unmonitored` kept (none: [])."""
        rows = self._run("SELECT value FROM meta WHERE key = 'unmonitored'")
        xs = [float(x) for x in str(rows[0][0]).split()] if rows else []
        return list(zip(xs[::2], xs[1::2], strict=True))

    def level_spent(self) -> float | None:
        """The time `save_level_spent` kept, if any."""
        rows = self._run("SELECT value FROM meta WHERE key = 'level_spent'")
        return float(rows[0][0]) if rows else None

    def spill(self) -> tuple[OverflowRecord, float, float] | None:
        """The record `save_spill` named (closed), its end and the level's last reading."""
        rows = self._run("SELECT value FROM meta WHERE key = 'spill'")
        if not rows:
            return None
        start, end, level_time = (float(x) for x in str(rows[0][0]).split())
        recs = [r for r in self.overflows(start, start + 1.0) if r.start == start and r.end is not None]
        return (recs[0], end, level_time) if recs else None

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
            rec.disagree_from, rec.disagree_to, rec.disagree_level = rest[9:]
            out.append(rec)
        return out

    def open_overflows(self) -> list[OverflowRecord]:
        return [r for r in self.overflows(float("-inf"), float("inf")) if r.end is None]


__all__ = ["FILE", "NO_LEVEL", "OverflowRecord", "StationStore"]
