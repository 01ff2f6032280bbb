"""The meter ledger: every reading a meter reported, with its verdict, in SQLite.

The ledger is the billing office's source of truth; InfluxDB only gets a copy. Each
row is one reading (or one side of a recorded replacement) with the delta from the
last accepted reading and its flags. Rows are a pure function of the raw readings,
the recorded replacements and the meter config: a reading that arrives out of order,
or a replacement recorded after the fact, re-judges the rows after it, so replay and
live polling of the same readings give the same ledger.

Re-ingesting the same (meter, time) is a no-op (replay after live cannot double
count, nor can a replay of a reading an operator corrected); a different value for a
time already held is kept out, counted as a conflict, and shown as an anomaly.
Replacements, voids and corrections are appended by `amend.Amendments`.

A meter's settings (unit, register_digits, multiplier, max_rate) are held as periods
(table `settings`, `settings.SettingsPeriods`): a changed setting takes effect from a time,
readings before it keep the settings of their time, and the first reading at or after it
starts a new baseline.

A gateway clock step back moves the rows its old clock stamped ahead of the new one by the
step (`clock_step`, one transaction, audited in `clock_steps`), as the engine's history is;
rows it had to spread (no gap of the step before them) are judged against max_rate by the time
they were taken (`_elapsed`), so from then on rows depend on the recorded steps too. Rows
found ahead of the clock when the daemon starts are moved the same way, each meter by its own
step (`ahead`, `MeterBook.found_at_start`), audited as found at start.

Time is stored as integer milliseconds (the resolution InfluxDB keeps too).
"""

from __future__ import annotations

import logging
import sqlite3
import time as _time
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

from monitor import writeonce
from monitor.errors import MeterError, StateError
from monitor.meters.amend import Amendments, when
from monitor.meters.rows import (
    CLOCK_STEPS,
    CLOCK_STEPS_BY_LAST,
    CLOCK_STEPS_FOUND,
    CONSOLE_WRITES,
    NEW_INITIAL,
    OLD_FINAL,
    READING,
    SCHEMA,
    SCHEMA_VERSION,
    SETTINGS,
    UNSENT,
    ClockStep,
    Replacement,
    Row,
    to_ms,
)
from monitor.meters.settings import Period, SettingsPeriods, settings_text
from monitor.meters.totalizer import ZERO, MeterSpec, Step, first_step, judge, order_flags
from monitor.model import iso
from monitor.sqlite import Schema, connect, translate

__all__ = [
    "NEW_INITIAL", "OLD_FINAL", "READING", "ClockStep", "Ledger", "Period", "Replacement", "Row",
    "settings_text", "to_ms",
]  # fmt: skip

log = logging.getLogger(__name__)
# Add a migration to change a table; never edit one. 2: settings periods (`rows.SETTINGS`);
# 3: the points the InfluxDB copy does not hold yet (`rows.UNSENT`).
# 4: the gateway clock's steps back the rows were moved across (`rows.CLOCK_STEPS`).
# 5: whether such a step was found at start (`rows.CLOCK_STEPS_FOUND`).
# 6: the steps indexed by their last old stamp (`rows.CLOCK_STEPS_BY_LAST`).
# 7: the console's request ids (`rows.CONSOLE_WRITES`, `monitor/writeonce.py`).
REACH = 86400.0  # seconds before the rows ahead of the new clock a step back moves rows over, at most
# ... and at most this many steps' lengths: rows spread over 100 steps are each interval shortened
# by 1 % at most, and a 5 s step does not re-judge (and resend) a day of readings a second.
STEPS_REACH = 100
LEDGER_SCHEMA = Schema(
    "meter ledger",
    (SCHEMA, SETTINGS, UNSENT, CLOCK_STEPS, CLOCK_STEPS_FOUND, CLOCK_STEPS_BY_LAST, CONSOLE_WRITES),
)


ROW_COLUMNS = "r.time_ms, r.seq, r.reading, r.accepted, r.counts, r.volume, r.flags, r.message, r.lim"


def _row(meter: str, columns: list[object] | tuple[object, ...]) -> Row:
    """A `readings` row (`ROW_COLUMNS`) as a `Row`."""
    t, seq, reading, accepted, counts, volume, flags, message, lim = columns
    assert isinstance(t, int) and isinstance(seq, int) and isinstance(flags, str)
    return Row(meter, t, seq, Decimal(str(reading)), bool(accepted), Decimal(str(counts)),
               Decimal(str(volume)), tuple(f for f in flags.split(",") if f), str(message),
               Decimal(str(lim)) if lim else None)  # fmt: skip


class Ledger(SettingsPeriods, Amendments):
    """SQLite meter ledger under the state directory; one writer (the daemon or a command)."""

    def __init__(self, path: Path, specs: Mapping[str, MeterSpec], now: float | None = None) -> None:
        """`now`: the gateway's time, from which a changed setting without `settings_since`
        takes effect (the daemon's clock; the wall clock when not given)."""
        self.path = path
        self.specs = dict(specs)
        # FULL: a committed reading is what the bill is cut from; it must survive a power cut.
        self._db = connect(path, LEDGER_SCHEMA, synchronous="FULL")
        self.keys = writeonce.Keys(self._db, f"meter ledger {path}")  # the console's request ids
        try:
            got = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if got is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif got[0] != SCHEMA_VERSION:
                raise StateError(f"meter ledger {path} has schema {got[0]}, expected {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            self._db.close()
            raise translate(exc, f"meter ledger {path}") from exc
        self._last: dict[str, Row | None] = {}
        self._baseline: dict[str, Row | None] = {}
        self._version = -1
        self._conflicts: dict[str, list[str]] = {}
        self._writes: list[tuple[object, ...]] = []  # rows written in this transaction, not yet sent
        # Points (meter, time) whose rows this transaction wrote or removed: marked `unsent` in
        # it, so the InfluxDB copy gets them whoever wrote them and wherever a crash falls.
        self._marks: set[tuple[str, int]] = set()
        self.marked = 0  # transactions of this connection that marked points (see `clear_unsent`)
        self._periods: dict[str, tuple[list[int], list[Period]]] = {}
        # Per meter: (from, to, factor) of the steps back whose rows were spread (`_elapsed`).
        self._spreads: dict[str, list[tuple[int, int, float]]] = {}
        now_ms = to_ms(_time.time() if now is None else now)
        try:
            with self._tx():
                refused = []
                for meter, spec in self.specs.items():
                    try:
                        self._check_spec(meter, spec, now_ms)
                    except MeterError as exc:  # every meter's reason at once, nothing written
                        refused.append(str(exc))
                if refused:
                    raise MeterError("; ".join(refused))
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[None]:
        """One transaction; sqlite errors become StateError naming the file."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._refresh()
            try:
                yield
                self._flush()
                self._db.execute("COMMIT")
            except BaseException:
                self._writes.clear()
                self._marks.clear()
                # SQLite may have rolled back already (a full disk): a second ROLLBACK
                # would hide the real cause behind "no transaction is active".
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._last.clear()  # the caches may hold rows that were rolled back
                self._baseline.clear()
                self._periods.clear()
                self._spreads.clear()
                raise
        except sqlite3.Error as exc:
            raise StateError(f"meter ledger {self.path}: {exc}") from exc

    def _refresh(self) -> None:
        """Forget cached rows when another connection committed (`monitor meters replace`
        while the daemon runs), so a reading is never judged against a stale baseline."""
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        if version != self._version:
            self._version = version
            self._last.clear()
            self._baseline.clear()
            self._periods.clear()
            self._spreads.clear()

    def refresh(self) -> None:
        """Forget what another connection's commit made stale (outside a transaction)."""
        if not self._db.in_transaction:
            self._refresh()

    def spec(self, meter: str) -> MeterSpec:
        try:
            return self.specs[meter]
        except KeyError:
            raise MeterError(f"unknown meter {meter!r} (configured: {', '.join(self.specs)})") from None

    # -- reading rows ----------------------------------------------------------------

    def add(self, meter: str, time: float, reading: Decimal) -> list[Row]:
        """Add one reading; returns the rows written or re-judged (empty for a duplicate)."""
        return self.add_many([(meter, time, reading)])

    def add_many(self, items: Iterable[tuple[str, float, Decimal]]) -> list[Row]:
        """Add readings in one transaction (replay, a Modbus poll cycle); returns the rows
        written or re-judged, in order per meter. Readings older than a meter's latest row
        are stored first and the meter is re-judged once from the oldest of them."""
        out: list[Row] = []
        rejudge: dict[str, tuple[int, int]] = {}
        self._conflicts = {}
        with self._tx():
            for meter, time, reading in items:
                self.spec(meter)
                time_ms = to_ms(time)
                key = (time_ms, READING)
                if meter in rejudge:
                    if not self._duplicate(meter, time_ms, reading):
                        rejudge[meter] = min(rejudge[meter], key)
                        self._write(
                            meter,
                            time_ms,
                            READING,
                            reading,
                            first_step(self.spec_at(meter, time_ms), reading),
                        )
                    continue
                last = self.last(meter)
                if last is not None and key <= last.key:  # not after the latest row: maybe held already
                    if self._duplicate(meter, time_ms, reading):
                        continue
                    rejudge[meter] = key
                    self._write(
                        meter, time_ms, READING, reading, first_step(self.spec_at(meter, time_ms), reading)
                    )
                    continue
                step = self._judge(
                    meter,
                    self.baseline(meter),
                    time_ms,
                    READING,
                    reading,
                    None if last is None else last.reading,
                )
                out.append(self._write(meter, time_ms, READING, reading, step))
            for meter, start in rejudge.items():
                out.extend(self._rejudge(meter, start))
        for meter, seen in self._conflicts.items():  # one line per meter and batch, not per reading
            log.warning(
                "meter %s: %d reading(s) differ from readings already in the ledger for the same time"
                " (first: %s); kept the first, counted as conflicts",
                meter, len(seen), seen[0],
            )  # fmt: skip
        return out

    def _flush(self) -> None:
        """Send the buffered row writes in one statement (before any read of the table)."""
        if self._writes:
            self._db.executemany(
                "INSERT OR REPLACE INTO readings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self._writes
            )
            self._writes.clear()
        if self._marks:
            self._db.executemany("INSERT OR IGNORE INTO unsent VALUES (?, ?)", sorted(self._marks))
            self._marks.clear()
            self.marked += 1

    def _mark(self, meter: str, time_ms: int) -> None:
        """The point at this time must go to InfluxDB again (committed with the rows)."""
        self._marks.add((meter, time_ms))

    def _duplicate(self, meter: str, time_ms: int, reading: Decimal) -> bool:
        """True when a reading for this time is held already; a different value is a conflict."""
        self._flush()
        held = self._db.execute(
            "SELECT reading FROM readings WHERE meter=? AND time_ms=? AND seq=?", (meter, time_ms, READING)
        ).fetchone()
        if held is None:
            return False
        if Decimal(held[0]) != reading and reading not in self.corrected_originals(meter, time_ms):
            self._db.execute(
                "INSERT OR IGNORE INTO conflicts VALUES (?, ?, ?, ?)", (meter, time_ms, held[0], str(reading))
            )
            what = f"{iso(time_ms / 1000)} offered {reading}, held {held[0]}"
            self._conflicts.setdefault(meter, []).append(what)
        return True

    def _judge(
        self, meter: str, base: Row | None, time_ms: int, seq: int, reading: Decimal, last_raw: Decimal | None
    ) -> Step:
        """A reading against the last accepted one, by the settings of its time. The first
        reading under new settings is a new baseline: the register may have been reset or
        reprogrammed, and which settings the movement across the change was counted in is not
        known, so it is not billed (flag `settings`). Not so across a change of max_rate
        alone: the count means what it meant."""
        period = self.period_at(meter, time_ms, seq)
        if base is None:
            return first_step(period.spec, reading)
        if not period.first and base.time_ms < period.since_ms and self._counts_changed(meter, base, period):
            step = first_step(period.spec, reading)
            if not step.accepted:
                return step
            return Step(
                True, ZERO, ZERO, frozenset({"settings"}),
                f"first reading under the settings from {when(period.since_ms)}: a new baseline; the"
                f" movement from {base.reading} at {when(base.time_ms)} is not billed",
            )  # fmt: skip
        return judge(
            period.spec, base.reading, self._elapsed(meter, base.time_ms, time_ms), reading, last_raw
        )

    def _elapsed(self, meter: str, since_ms: int, time_ms: int) -> float:
        """Seconds from `since_ms` to a row at `time_ms` as the clock that stamped them measured:
        rows a step back spread (`clock_step`) stand closer together by the spread's ratio than
        they were taken. Judged by the new stamps alone, a meter running near max_rate was a
        `jump` at every spread row and every reading after (each against the last accepted)."""
        elapsed = (time_ms - since_ms) / 1000
        if meter not in self._spreads:
            got = self._query(
                "SELECT step_ms, first_ms, last_ms, noticed_ms FROM clock_steps WHERE meter=? AND spread=1",
                (meter,),
            )
            windows = []
            for row in got:
                step, first, last, noticed = (int(str(x)) for x in row)
                # The spread rows' new stamps lie in [first + step, the new clock's time then +
                # the 2 s tolerance]: the new clock's own readings after it are judged as taken.
                if last - first + step > 0:
                    hi = min(last, noticed + 2000)
                    windows.append((first + step, hi, (last - first) / (last - first + step)))
            self._spreads[meter] = windows
        for lo, hi, factor in self._spreads[meter]:
            if lo <= time_ms <= hi:
                elapsed *= factor
        return elapsed

    def _write(
        self, meter: str, time_ms: int, seq: int, reading: Decimal, step: Step, mark: bool = True
    ) -> Row:
        """Buffer one row; `mark=False` when the caller marks it only if it changed."""
        if mark:
            self._mark(meter, time_ms)
        row = Row(
            meter=meter,
            time_ms=time_ms,
            seq=seq,
            reading=reading,
            accepted=step.accepted,
            counts=step.counts,
            volume=step.volume,
            flags=order_flags(step.flags),
            message=step.message,
            limit=step.limit,
        )
        self._writes.append(
            (meter, time_ms, seq, str(reading), int(row.accepted), str(row.counts), str(row.volume),
             ",".join(row.flags), row.message, "" if row.limit is None else str(row.limit))
        )  # fmt: skip
        last = self._last.get(meter)
        if last is None or row.key >= last.key:
            self._last[meter] = row
        if row.accepted:
            base = self._baseline.get(meter)
            if base is None or row.key >= base.key:
                self._baseline[meter] = row
        return row

    def _rejudge(self, meter: str, start: tuple[int, int]) -> list[Row]:
        """Judge every row from `start` on again, in order; returns the rows that changed."""
        self.spec(meter)
        base = self._accepted_before(meter, start)
        before = self._select(
            meter, "AND (time_ms < ? OR (time_ms = ? AND seq < ?)) ORDER BY time_ms DESC, seq DESC LIMIT 1",
            start[0], *start,
        )  # fmt: skip
        last_raw = before[0].reading if before else None
        self._last.pop(meter, None)
        self._baseline.pop(meter, None)
        changed: list[Row] = []
        for old in self._select(meter, "AND (time_ms > ? OR (time_ms = ? AND seq >= ?))", start[0], *start):
            if old.seq == NEW_INITIAL:
                step = Step(True, ZERO, ZERO, frozenset({"replacement"}))
            else:
                judged_from, raw = base, last_raw
                if old.seq == OLD_FINAL and self.old_side(meter, old.time_ms)[1] == READING:
                    # A swap at a settings change: a reading at its time is the new settings' own,
                    # so the old meter's final is judged from the rows before that time.
                    judged_from = self._accepted_before(meter, (old.time_ms, READING))
                    prior = self._select(meter, "AND time_ms < ? ORDER BY time_ms DESC, seq DESC LIMIT 1",
                                         old.time_ms)  # fmt: skip
                    raw = prior[0].reading if prior else None
                step = self._judge(meter, judged_from, old.time_ms, old.seq, old.reading, raw)
                if old.seq == OLD_FINAL:
                    step = Step(
                        step.accepted, step.counts, step.volume, step.flags | {"replacement"}, step.message
                    )
            row = self._write(meter, old.time_ms, old.seq, old.reading, step, mark=False)
            if row != old:  # the InfluxDB copy holds the point as it was: mark it
                self._mark(meter, old.time_ms)
                changed.append(row)
            last_raw = row.reading
            if row.accepted:
                base = row
        return changed

    # -- a step back of the gateway clock -------------------------------------------------

    def clock_step(
        self,
        step: float,
        now: float,
        keep: Collection[str] = (),
        tolerance: float = 2.0,
        reach: float = REACH,
        only: str | None = None,
        found: bool = False,
    ) -> dict[str, list[Row]]:
        """The gateway clock stepped back by `step` s (< 0), noticed when the new clock read
        `now`: move each meter's rows the old clock stamped ahead of the new one by the step,
        as the engine's history is moved, in one transaction with an audit record per meter
        (`clock_steps`). Left there, every reading of the new clock sorted before them and
        re-judged them `backwards` (a false meter alarm for up to the step's length), and one
        sharing a time with them was dropped as a conflict.

        Which rows: those stamped within (`now` + `tolerance`, the old clock's `now` +
        `tolerance`] (as `ClockWatch.restamp` decides for queued readings), and the rows
        before them down to a gap of at least the step (the old clock's run began after it:
        a boot, a step forward), so that no moved row lands among rows left where they were:
        the order of the readings, and so every register delta, is kept. Without such a gap
        within `reach` (and `STEPS_REACH` steps) before them (a meter polled every second, a
        small step after a drift), the rows within it are spread over it instead, each moved by
        at most the step, in order: never the whole history in one transaction, and a small
        step (a time source stepping 5 s every minute) a few minutes of rows, not a day's. The
        meters in `keep` are stamped by their device's clock: not moved. `only`: this meter
        alone; `found`: a step found at start (`ahead`), audited so, that never moves the rows
        not ahead of the clock: rows ahead that do not fit above them are spread between the
        newest of them and `now` (pass `tolerance` 0). The moved rows are re-judged (only
        the first one's interval changed) and marked unsent at their new times; their old
        times stay marked, so the InfluxDB copy's old-time points are overwritten by a
        rejected `restamped` one (`MeterBook.take_records`). Returns the re-judged rows that
        changed, per meter moved."""
        if step >= 0:
            return {}
        step_ms, now_ms, tol = to_ms(step), to_ms(now), to_ms(tolerance)
        lo, hi = now_ms + tol, now_ms - step_ms + tol
        floor = lo + step_ms - min(to_ms(reach), STEPS_REACH * -step_ms)
        out: dict[str, list[Row]] = {}
        with self._tx():
            for meter in self.meters():
                if meter in keep or (only is not None and meter != only):
                    continue
                cut, spread = lo, False
                while True:
                    (first,) = self._db.execute(
                        "SELECT min(time_ms) FROM readings WHERE meter=? AND time_ms > ? AND time_ms <= ?",
                        (meter, cut, hi),
                    ).fetchone()
                    if first is None:
                        break
                    (below,) = self._db.execute(
                        "SELECT max(time_ms) FROM readings WHERE meter=? AND time_ms <= ?", (meter, cut)
                    ).fetchone()
                    if below is None or below < first + step_ms:
                        break
                    if found:  # the rows not ahead are on this clock: those ahead go above them
                        cut, spread = below, True
                        break
                    cut = first + step_ms - 1  # the rows it would land among move too
                    if cut < floor:
                        cut, spread = floor, True
                        break
                if first is None:
                    continue
                out[meter] = self._move(meter, cut, hi, step_ms, now_ms, spread, found)
        if out:
            self._last.clear()
            self._baseline.clear()
            self._periods.clear()
        return out

    def _move(
        self, meter: str, cut: int, hi: int, step_ms: int, now_ms: int, spread: bool, found: bool = False
    ) -> list[Row]:
        """Move `meter`'s rows (and what is recorded at their times) within (cut, hi] by
        `step_ms` (`spread`: onto (cut, hi + step_ms], in proportion, in order), within the
        caller's transaction; record it; re-judge from the first."""
        db = self._db
        span = (meter, cut, hi)
        within = "WHERE meter=? AND time_ms > ? AND time_ms <= ?"
        got = db.execute(f"SELECT DISTINCT time_ms FROM readings {within} ORDER BY time_ms", span)
        times = [int(t) for (t,) in got]
        ratio = (hi + step_ms - cut) / (hi - cut)

        def new(t: int) -> int:
            return t + step_ms if not spread else cut + max(1, round((t - cut) * ratio))

        moved: dict[int, int] = {}
        last = cut if spread else -(2**62)
        for t in times:  # strictly in order, as the rows were
            last = moved[t] = max(new(t), last + 1)
        n = db.execute(
            "SELECT count(*) FROM readings WHERE meter=? AND time_ms > ? AND time_ms <= ? AND seq=?",
            (*span, READING),
        ).fetchone()[0]
        # Delete and insert, not UPDATE: a row moved onto a time another moved row still holds
        # would break the primary key halfway through.
        for table in ("readings", "replacements", "conflicts"):
            held = db.execute(f"SELECT * FROM {table} {within}", span).fetchall()
            if not held:
                continue
            db.execute(f"DELETE FROM {table} {within}", span)
            marks = ",".join("?" * len(held[0]))
            db.executemany(
                f"INSERT INTO {table} VALUES ({marks})",
                [(r[0], moved.get(r[1]) or new(r[1]), *r[2:]) for r in held],
            )
        # In time order: each time moves back, never onto one still to be moved.
        for table, column in (("amendments", "time_ms"), ("settings", "since_ms")):
            got = db.execute(
                f"SELECT DISTINCT {column} FROM {table} WHERE meter=? AND {column} > ? AND {column} <= ?"
                f" ORDER BY {column}",
                span,
            )
            db.executemany(
                f"UPDATE {table} SET {column} = ? WHERE meter=? AND {column} = ?",
                [(moved.get(t) or new(t), meter, t) for (t,) in got.fetchall()],
            )
        # The old times stay marked: their InfluxDB points are overwritten as re-stamped.
        db.executemany(
            "INSERT OR IGNORE INTO unsent VALUES (?, ?)",
            [(meter, t) for t in times] + [(meter, moved[t]) for t in times],
        )
        self.marked += 1
        db.execute(
            "INSERT INTO clock_steps (meter, noticed_ms, step_ms, rows, first_ms, last_ms, spread, found)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (meter, now_ms, step_ms, int(n), times[0], times[-1], int(spread), int(found)),
        )
        self._last.pop(meter, None)
        self._baseline.pop(meter, None)
        self._periods.pop(meter, None)
        self._spreads.pop(meter, None)
        log.warning(
            "meter %s: %d reading(s) stamped %s ... %s by the gateway clock before it stepped back%s %s"
            " to %s ... %s (recorded in the ledger's clock_steps)",
            meter, n, iso(times[0] / 1000), iso(times[-1] / 1000),
            " (found at start: they were ahead of the clock; taken for a step the ledger did not follow)"
            if found else "",
            "spread (no gap of the step before them)" if spread else "moved by the step",
            iso(moved[times[0]] / 1000), iso(moved[times[-1]] / 1000),
        )  # fmt: skip
        if meter not in self.specs:  # no longer configured: kept, moved, not judged again
            return []
        return self._rejudge(meter, (moved[times[0]], READING))

    def clock_steps(
        self, meter: str | None = None, after_ms: int | None = None, until_ms: int | None = None
    ) -> list[ClockStep]:
        """The recorded steps (of `meter`) whose moved rows' new times or notice fall in
        (after_ms, until_ms], in the order they were noticed."""
        lo = -(2**62) if after_ms is None else after_ms
        hi = 2**62 if until_ms is None else until_ms
        got = self._query(
            "SELECT meter, noticed_ms, step_ms, rows, first_ms, last_ms, spread, found FROM clock_steps"
            " WHERE (? IS NULL OR meter = ?) AND noticed_ms > ? AND first_ms + step_ms <= ? ORDER BY id",
            (meter, meter, lo, hi),
        )
        out = []
        for m, *rest in got:
            noticed, step, rows, first, last, spread, found = (int(str(x)) for x in rest)
            out.append(ClockStep(str(m), noticed, step, rows, first, last, bool(spread), bool(found)))
        return out

    def ahead(self, now: float, tolerance: float, keep: Collection[str] = ()) -> dict[str, int]:
        """Per meter (but those in `keep`, stamped by their device's clock), its newest row's
        stamp where that is ahead of `now` by more than `tolerance`: at start, the rows of a
        clock step back the ledger did not follow (`MeterBook.found_at_start`)."""
        got = self._query(  # each meter's newest row by the primary key: no scan of the history
            "SELECT meter, newest FROM (SELECT m.meter AS meter, (SELECT max(r.time_ms) FROM readings r"
            " WHERE r.meter = m.meter) AS newest FROM meters m) WHERE newest > ? ORDER BY meter",
            (to_ms(now) + to_ms(tolerance),),
        )
        return {str(m): int(str(t)) for m, t in got if str(m) not in keep}

    def newest(self, keep: Collection[str] = ()) -> dict[str, int]:
        """Per meter with rows (but those in `keep`), its newest row's stamp (ms)."""
        got = self._query(
            "SELECT meter, newest FROM (SELECT m.meter AS meter, (SELECT max(r.time_ms) FROM readings r"
            " WHERE r.meter = m.meter) AS newest FROM meters m) WHERE newest IS NOT NULL ORDER BY meter"
        )
        return {str(m): int(str(t)) for m, t in got if str(m) not in keep}

    def count_ahead(self, meter: str, now: float, tolerance: float) -> int:
        """How many of the meter's rows are stamped ahead of `now` by more than `tolerance`."""
        got = self._query(
            "SELECT count(*) FROM readings WHERE meter = ? AND time_ms > ?",
            (meter, to_ms(now) + to_ms(tolerance)),
        )
        return int(str(got[0][0]))

    def stepped_spans(self, meter: str, lo_ms: int, hi_ms: int) -> list[tuple[int, int, int]]:
        """(id, first_ms, last_ms) of the meter's recorded steps whose moved rows' old stamps
        overlap [lo_ms, hi_ms]: a row written there may share its time with a point a step
        overwrote `restamped` (`MeterBook.stepped`). Read from the steps ending at or after
        `lo_ms` (`clock_steps_by_last`), not every step of the meter: a take of today's rows
        costs the same with a month of steps every minute recorded as with none."""
        got = self._query(
            "SELECT id, first_ms, last_ms FROM clock_steps INDEXED BY clock_steps_by_last"
            " WHERE meter = ? AND last_ms >= ? AND first_ms <= ?",
            (meter, lo_ms, hi_ms),
        )
        return [(int(str(i)), int(str(a)), int(str(b))) for i, a, b in got]

    def restamped_reading(self, meter: str, time_ms: int) -> tuple[ClockStep, Decimal, int] | None:
        """The step that moved the reading stamped `time_ms` away, the reading now at (or,
        spread, last before) its time moved by the step, for the InfluxDB point left at its old
        time, and the step's id (ids only grow); None if no step did. The latest step first, in
        the table's order (NOT INDEXED): the step that moved a point just sent is found at once,
        however many were recorded (each key read every step before: 49 s a take with a month
        of steps every minute)."""
        got = self._query(
            "SELECT meter, noticed_ms, step_ms, rows, first_ms, last_ms, spread, found, id FROM clock_steps"
            " NOT INDEXED WHERE meter = ? AND first_ms <= ? AND last_ms >= ? ORDER BY id DESC LIMIT 1",
            (meter, time_ms, time_ms),
        )
        if not got:
            return None
        m, *rest = got[0]
        noticed, step, rows, first, last, spread, found, step_id = (int(str(x)) for x in rest)
        cs = ClockStep(str(m), noticed, step, rows, first, last, bool(spread), bool(found))
        held = self._query(
            "SELECT reading FROM readings WHERE meter=? AND time_ms <= ?"
            " ORDER BY time_ms DESC, seq DESC LIMIT 1",
            (meter, time_ms + cs.step_ms),
        )
        return cs, Decimal(str(held[0][0])) if held else ZERO, step_id

    # -- queries -----------------------------------------------------------------------

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            self._flush()
            return list(self._db.execute(sql, params).fetchall())
        except sqlite3.Error as exc:
            raise StateError(f"meter ledger {self.path}: {exc}") from exc

    def _select(self, meter: str, where: str, *params: object) -> list[Row]:
        sql = f"SELECT {ROW_COLUMNS} FROM readings r WHERE meter=? "
        if "ORDER BY" not in where:
            where += " ORDER BY time_ms, seq"
        return [_row(meter, columns) for columns in self._query(sql + where, (meter, *params))]

    def _accepted_before(self, meter: str, key: tuple[int, int]) -> Row | None:
        rows = self._select(
            meter,
            "AND accepted=1 AND (time_ms < ? OR (time_ms = ? AND seq < ?))"
            " ORDER BY time_ms DESC, seq DESC LIMIT 1",
            key[0], *key,
        )  # fmt: skip
        return rows[0] if rows else None

    def last(self, meter: str) -> Row | None:
        """The latest row of a meter (accepted or not)."""
        if not self._db.in_transaction:
            self._refresh()
        if meter not in self._last:
            rows = self._select(meter, "ORDER BY time_ms DESC, seq DESC LIMIT 1")
            self._last[meter] = rows[0] if rows else None
        return self._last[meter]

    def baseline(self, meter: str) -> Row | None:
        """The latest accepted row: what the next reading is judged against."""
        if not self._db.in_transaction:
            self._refresh()
        if meter not in self._baseline:
            self._baseline[meter] = self._accepted_before(meter, (2**62, 0))
        return self._baseline[meter]

    def accepted_at_or_before(self, meter: str, time_ms: int) -> Row | None:
        return self._accepted_before(meter, (time_ms, NEW_INITIAL + 1))

    def accepted_after(self, meter: str, time_ms: int) -> Row | None:
        """The first accepted row after `time_ms` (a later time)."""
        rows = self._select(meter, "AND accepted=1 AND time_ms > ? ORDER BY time_ms, seq LIMIT 1", time_ms)
        return rows[0] if rows else None

    def rows(self, meter: str, after_ms: int | None = None, until_ms: int | None = None) -> list[Row]:
        """Rows with after_ms < time_ms <= until_ms (a billing period), in order."""
        lo = -(2**62) if after_ms is None else after_ms
        hi = 2**62 if until_ms is None else until_ms
        return self._select(meter, "AND time_ms > ? AND time_ms <= ?", lo, hi)

    # -- what the InfluxDB copy does not hold yet ------------------------------------------

    def unsent(self, limit: int | None = None) -> tuple[list[tuple[str, int]], list[Row]]:
        """Up to `limit` marked points of the configured meters, oldest first per meter, and
        their rows (none for a voided swap with no reading at its time). A meter no longer
        configured keeps its marks until it is configured again (no settings to write with)."""
        meters = sorted(self.specs)
        if not meters:
            return [], []
        marks = ",".join("?" * len(meters))
        # The marked points' rows only (a correction years back and today's reading are two
        # points, not the history between them).
        got = self._query(
            f"SELECT u.meter, u.time_ms, {ROW_COLUMNS} FROM (SELECT meter, time_ms FROM unsent"
            f" WHERE meter IN ({marks}) ORDER BY meter, time_ms"
            + ("" if limit is None else f" LIMIT {int(limit)}")
            + ") u LEFT JOIN readings r ON r.meter = u.meter AND r.time_ms = u.time_ms"
            " ORDER BY u.meter, u.time_ms, r.seq",
            tuple(meters),
        )
        keys: list[tuple[str, int]] = []
        rows: list[Row] = []
        for meter, time_ms, *columns in got:
            key = (str(meter), int(str(time_ms)))
            if not keys or keys[-1] != key:
                keys.append(key)
            if columns[1] is not None:  # seq: a point with rows (a voided swap may have none)
                rows.append(_row(key[0], columns))
        return keys, rows

    def unsent_count(self) -> int:
        """How many points of the configured meters are marked (what `unsent` would read all of)."""
        meters = sorted(self.specs)
        if not meters:
            return 0
        marks = ",".join("?" * len(meters))
        got = self._query(f"SELECT count(*) FROM unsent WHERE meter IN ({marks})", tuple(meters))
        return int(str(got[0][0]))

    def unsent_unconfigured(self) -> dict[str, int]:
        """Per meter no longer configured, its points marked for InfluxDB: kept (`unsent` has
        no settings to write them with) until it is configured again."""
        meters = sorted(self.specs)
        marks = ",".join("?" * len(meters))
        got = self._query(
            f"SELECT meter, count(*) FROM unsent WHERE meter NOT IN ({marks}) GROUP BY meter ORDER BY meter",
            tuple(meters),
        )
        return {str(m): int(str(n)) for m, n in got}

    def clear_unsent(self, keys: list[tuple[str, int]], version: int, marked: int) -> bool:
        """The outbox holds these points as they were read at `data_version` `version`, when
        this connection had marked `marked` times: unmark them, unless the ledger changed since
        (another process or this one wrote: a point may have been marked again after it was
        read; left marked, it goes out again, which InfluxDB overwrites). No fsync: a clear
        lost to a power cut only sends the points again."""
        if not keys:
            return True
        self._synchronous("NORMAL")
        try:
            with self._tx():
                if self._version != version or self.marked != marked:
                    return False
                self._db.executemany("DELETE FROM unsent WHERE meter=? AND time_ms=?", keys)
            return True
        finally:
            self._synchronous("FULL")

    def _synchronous(self, level: str) -> None:
        try:
            self._db.execute(f"PRAGMA synchronous={level}")
        except sqlite3.Error as exc:
            raise StateError(f"meter ledger {self.path}: {exc}") from exc

    def conflicts(self, meter: str, after_ms: int | None = None, until_ms: int | None = None) -> int:
        lo = -(2**62) if after_ms is None else after_ms
        hi = 2**62 if until_ms is None else until_ms
        got = self._query(
            "SELECT count(*) FROM conflicts WHERE meter=? AND time_ms > ? AND time_ms <= ?", (meter, lo, hi)
        )
        return int(str(got[0][0]))

    def meters(self) -> list[str]:
        """Meters with rows, configured or not (a meter removed from config keeps its history)."""
        return [str(m) for (m,) in self._query("SELECT DISTINCT meter FROM readings ORDER BY meter")]

    def count(self, meter: str) -> int:
        return int(str(self._query("SELECT count(*) FROM readings WHERE meter=?", (meter,))[0][0]))
