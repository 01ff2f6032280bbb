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

Time is stored as integer milliseconds (the resolution InfluxDB keeps too).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

from monitor.errors import MeterError, StateError
from monitor.meters.amend import Amendments
from monitor.meters.rows import (
    NEW_INITIAL,
    OLD_FINAL,
    READING,
    SCHEMA,
    SCHEMA_VERSION,
    Replacement,
    Row,
    to_ms,
)
from monitor.meters.totalizer import RULES, ZERO, MeterSpec, Step, first_step, judge, order_flags
from monitor.model import iso
from monitor.sqlite import Schema, connect, translate

__all__ = ["NEW_INITIAL", "OLD_FINAL", "READING", "Ledger", "Replacement", "Row", "to_ms"]

log = logging.getLogger(__name__)
LEDGER_SCHEMA = Schema("meter ledger", (SCHEMA,))  # add a migration to change a table; never edit one


class Ledger(Amendments):
    """SQLite meter ledger under the state directory; one writer (the daemon or a command)."""

    def __init__(self, path: Path, specs: Mapping[str, MeterSpec]) -> None:
        self.path = path
        self.specs = dict(specs)
        # FULL: a committed reading is what the bill is cut from; it must survive a power cut.
        self._db = connect(path, LEDGER_SCHEMA, synchronous="FULL")
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
        with self._tx():
            for meter, spec in self.specs.items():
                self._check_spec(meter, spec)

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
                # SQLite may have rolled back already (a full disk): a second ROLLBACK
                # would hide the real cause behind "no transaction is active".
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._last.clear()  # the caches may hold rows that were rolled back
                self._baseline.clear()
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

    def spec(self, meter: str) -> MeterSpec:
        try:
            return self.specs[meter]
        except KeyError:
            raise MeterError(f"unknown meter {meter!r} (configured: {', '.join(self.specs)})") from None

    def _check_spec(self, meter: str, spec: MeterSpec) -> None:
        """A changed register width, multiplier, unit or max_rate re-judges the meter's rows,
        and so do changed checks (`totalizer.RULES`): rows are a function of both."""
        config = f"{spec.unit}|{spec.digits}|{spec.multiplier}|{spec.max_rate}"
        text = f"{config}|rules {RULES}"
        got = self._db.execute("SELECT spec FROM meters WHERE meter=?", (meter,)).fetchone()
        if got is not None and got[0] == text:
            return
        self._db.execute("INSERT OR REPLACE INTO meters VALUES (?, ?)", (meter, text))
        if got is not None:
            held = str(got[0])
            if held.partition("|rules ")[0] == config:  # a ledger judged by older checks
                log.warning(
                    "meter %s: the meter checks changed since its rows were judged; re-judging them", meter
                )
            else:
                log.warning(
                    "meter %s: config changed (%s -> %s); re-judging its ledger rows", meter, held, text
                )
            self._rejudge(meter, (-(2**62), 0))

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
                spec = self.spec(meter)
                time_ms = to_ms(time)
                key = (time_ms, READING)
                if meter in rejudge:
                    if not self._duplicate(meter, time_ms, reading):
                        rejudge[meter] = min(rejudge[meter], key)
                        self._write(meter, time_ms, READING, reading, first_step(spec, reading))
                    continue
                last = self.last(meter)
                if last is not None and key <= last.key:  # not after the latest row: maybe held already
                    if self._duplicate(meter, time_ms, reading):
                        continue
                    rejudge[meter] = key
                    self._write(meter, time_ms, READING, reading, first_step(spec, reading))
                    continue
                step = self._judge(
                    spec, self.baseline(meter), time_ms, reading, None if last is None else last.reading
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
        self, spec: MeterSpec, base: Row | None, time_ms: int, reading: Decimal, last_raw: Decimal | None
    ) -> Step:
        if base is None:
            return first_step(spec, reading)
        return judge(spec, base.reading, (time_ms - base.time_ms) / 1000, reading, last_raw)

    def _write(self, meter: str, time_ms: int, seq: int, reading: Decimal, step: Step) -> Row:
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
        spec = self.spec(meter)
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
                step = self._judge(spec, base, old.time_ms, old.reading, last_raw)
                if old.seq == OLD_FINAL:
                    step = Step(
                        step.accepted, step.counts, step.volume, step.flags | {"replacement"}, step.message
                    )
            row = self._write(meter, old.time_ms, old.seq, old.reading, step)
            if row != old:
                changed.append(row)
            last_raw = row.reading
            if row.accepted:
                base = row
        return changed

    # -- queries -----------------------------------------------------------------------

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            self._flush()
            return list(self._db.execute(sql, params).fetchall())
        except sqlite3.Error as exc:
            raise StateError(f"meter ledger {self.path}: {exc}") from exc

    def _select(self, meter: str, where: str, *params: object) -> list[Row]:
        sql = (
            "SELECT time_ms, seq, reading, accepted, counts, volume, flags, message, lim"
            " FROM readings WHERE meter=? "
        )
        if "ORDER BY" not in where:
            where += " ORDER BY time_ms, seq"
        out = []
        for t, seq, reading, accepted, counts, volume, flags, message, lim in self._query(
            sql + where, (meter, *params)
        ):
            assert isinstance(t, int) and isinstance(seq, int) and isinstance(flags, str)
            out.append(
                Row(meter, t, seq, Decimal(str(reading)), bool(accepted), Decimal(str(counts)),
                    Decimal(str(volume)), tuple(f for f in flags.split(",") if f), str(message),
                    Decimal(str(lim)) if lim else None)
            )  # fmt: skip
        return out

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

    def rows(self, meter: str, after_ms: int | None = None, until_ms: int | None = None) -> list[Row]:
        """Rows with after_ms < time_ms <= until_ms (a billing period), in order."""
        lo = -(2**62) if after_ms is None else after_ms
        hi = 2**62 if until_ms is None else until_ms
        return self._select(meter, "AND time_ms > ? AND time_ms <= ?", lo, hi)

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
