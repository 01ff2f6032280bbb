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
(table `settings`): a changed setting takes effect from a time (`settings_since` in the
config, else the gateway time the ledger is first opened with it), readings before it
keep the settings of their time, and the first reading after it starts a new baseline.

Time is stored as integer milliseconds (the resolution InfluxDB keeps too).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import sqlite3
import time as _time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

from monitor.errors import MeterError, StateError
from monitor.meters.amend import Amendments, when
from monitor.meters.rows import (
    FIRST_MS,
    NEW_INITIAL,
    OLD_FINAL,
    READING,
    SCHEMA,
    SCHEMA_VERSION,
    SETTINGS,
    Replacement,
    Row,
    to_ms,
)
from monitor.meters.totalizer import RULES, ZERO, MeterSpec, Step, first_step, judge, order_flags
from monitor.model import iso
from monitor.sqlite import Schema, connect, translate

__all__ = [
    "NEW_INITIAL", "OLD_FINAL", "READING", "Ledger", "Period", "Replacement", "Row", "settings_text", "to_ms",
]  # fmt: skip

log = logging.getLogger(__name__)
# Add a migration to change a table; never edit one. 2: settings periods (`rows.SETTINGS`).
LEDGER_SCHEMA = Schema("meter ledger", (SCHEMA, SETTINGS))
# meta key + meter -> the id of the meter's latest settings row the InfluxDB copy follows.
COPIED = "influx copy settings id: "


def settings_text(spec: MeterSpec) -> str:
    """The settings a meter's rows are judged with, as the ledger keeps them."""
    return f"{spec.unit}|{spec.digits}|{spec.multiplier}|{spec.max_rate}"


def _from_text(current: MeterSpec, text: str) -> MeterSpec:
    """The spec of a held period: its settings, the meter's current account."""
    unit, digits, multiplier, max_rate = text.split("|")
    return dataclasses.replace(
        current,
        unit=unit,
        digits=None if digits == "None" else int(digits),
        multiplier=Decimal(multiplier),
        max_rate=None if max_rate == "None" else Decimal(max_rate),
        since=None,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Period:
    """One settings period of a meter: in force for readings at or after `since_ms`
    (the first period: `FIRST_MS`, from the first reading) until the next period."""

    meter: str
    since_ms: int
    spec: MeterSpec
    source: str
    recorded_at_ms: int
    superseded: bool = False  # a first period corrected later (kept for `meters show`)

    @property
    def first(self) -> bool:
        return self.since_ms == FIRST_MS

    def describe(self) -> str:
        s = self.spec
        start = "from the first reading" if self.first else f"from {when(self.since_ms)}"
        by = {
            "migrated": "held before settings periods",
            "config": "config without settings_since, from when it was first opened",
            "settings_since": "config settings_since",
            "corrected": "config, corrected from the first reading",
        }
        # A new meter's first settings were recorded whenever it was first configured: not news.
        plain = self.first and self.source in ("config", "migrated")
        recorded = "" if plain else f", recorded {when(self.recorded_at_ms)}"
        head = "superseded: " if self.superseded else ""
        return (f"{head}{start}: unit {s.unit}, register_digits {s.digits}, multiplier {s.multiplier},"
                f" max_rate {s.max_rate} ({by.get(self.source, self.source)}{recorded})")  # fmt: skip


def change(old: MeterSpec, new: MeterSpec) -> str:
    """What changed between two settings, in the config's words: `multiplier 1 -> 10`."""
    names = (("unit", "unit"), ("register_digits", "digits"), ("multiplier", "multiplier"),
             ("max_rate", "max_rate"))  # fmt: skip
    parts = [
        f"{key} {getattr(old, attr)} -> {getattr(new, attr)}"
        for key, attr in names
        if getattr(old, attr) != getattr(new, attr)
    ]
    return ", ".join(parts).replace("None", "none")


class Ledger(Amendments):
    """SQLite meter ledger under the state directory; one writer (the daemon or a command)."""

    def __init__(self, path: Path, specs: Mapping[str, MeterSpec], now: float | None = None) -> None:
        """`now`: the gateway's time, from which a changed setting without `settings_since`
        takes effect (the daemon's clock; the wall clock when not given)."""
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
        self._periods: dict[str, tuple[list[int], list[Period]]] = {}
        # Rows this open re-judged (a settings change from a past time, changed checks): the
        # InfluxDB copy holds them as they were, so `MeterBook` sends them again.
        self.rejudged: list[Row] = []
        now_ms = to_ms(_time.time() if now is None else now)
        try:
            with self._tx():
                for meter in self.specs:  # where the InfluxDB copy stands, before any change now
                    self._db.execute(
                        "INSERT OR IGNORE INTO meta SELECT ?, coalesce(max(id), 0) FROM settings"
                        " WHERE meter=?",
                        (COPIED + meter, meter),
                    )
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
                # SQLite may have rolled back already (a full disk): a second ROLLBACK
                # would hide the real cause behind "no transaction is active".
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._last.clear()  # the caches may hold rows that were rolled back
                self._baseline.clear()
                self._periods.clear()
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

    def refresh(self) -> None:
        """Forget what another connection's commit made stale (outside a transaction)."""
        if not self._db.in_transaction:
            self._refresh()

    def spec(self, meter: str) -> MeterSpec:
        try:
            return self.specs[meter]
        except KeyError:
            raise MeterError(f"unknown meter {meter!r} (configured: {', '.join(self.specs)})") from None

    def _check_spec(self, meter: str, spec: MeterSpec, now_ms: int) -> None:
        """Bring the meter's settings periods in line with its config. Changed settings take
        effect from `settings_since` (else `now_ms`) and re-judge the rows from there; at or
        before the first reading they correct the whole history. Changed checks
        (`totalizer.RULES`) re-judge every row: rows are a function of both."""
        config = settings_text(spec)
        text = f"{config}|rules {RULES}"
        got = self._db.execute("SELECT spec FROM meters WHERE meter=?", (meter,)).fetchone()
        periods = self.periods(meter)
        start: tuple[int, int] | None = None
        if not periods:  # a new meter (or one configured before any reading was held)
            self._add_period(meter, FIRST_MS, config, "config", now_ms)
        elif settings_text(periods[-1].spec) != config:
            since = self._settings_start(meter, spec, periods, now_ms)
            old = periods[-1].spec
            if since is None:
                # "corrected" re-judged rows (their quarters are flagged); with none held yet, the
                # settings are simply replaced before any figure was made with them.
                held = self._db.execute("SELECT 1 FROM readings WHERE meter=? LIMIT 1", (meter,)).fetchone()
                self._add_period(meter, FIRST_MS, config, "corrected" if held else "config", now_ms)
                start = (FIRST_MS, 0)
                log.warning(
                    "meter %s: settings corrected from its first reading (%s); re-judging its whole history",
                    meter, change(old, spec),
                )  # fmt: skip
            else:
                source = "config" if spec.since is None else "settings_since"
                self._add_period(meter, since, config, source, now_ms)
                start = (since, READING)
                log.warning(
                    "meter %s: settings changed (%s) from %s%s; readings from then on are re-judged,"
                    " earlier ones keep the settings of their time",
                    meter, change(old, spec), when(since),
                    " (settings_since)" if spec.since is not None
                    else " (the time the ledger was opened)" if since == now_ms
                    else " (just after the latest reading held: the clock is behind it)",
                )  # fmt: skip
        if got is not None and str(got[0]).partition("|rules ")[2] != str(RULES):
            log.warning(
                "meter %s: the meter checks changed since its rows were judged; re-judging them", meter
            )
            start = (FIRST_MS, 0)
        if got is None or got[0] != text:
            self._db.execute("INSERT OR REPLACE INTO meters VALUES (?, ?)", (meter, text))
        if start is not None:
            self.rejudged.extend(self._rejudge(meter, start))

    def _settings_start(self, meter: str, spec: MeterSpec, periods: list[Period], now_ms: int) -> int | None:
        """When changed settings take effect; None: from the first reading (the whole history)."""
        key = "settings_since"
        if spec.since is None:
            since, what = now_ms, f"the time the ledger is opened ({when(now_ms)})"
            latest = self._db.execute("SELECT max(time_ms) FROM readings WHERE meter=?", (meter,)).fetchone()
            if latest and isinstance(latest[0], int) and latest[0] >= now_ms:
                # The gateway's clock is behind readings held already (set back, or a replay of
                # later history): those were recorded under the old settings and keep them.
                since = latest[0] + 1
                what = f"just after the latest reading held ({when(latest[0])}; the clock: {when(now_ms)})"
        else:
            since, what = to_ms(spec.since), f"{key} {when(to_ms(spec.since))}"
            if since > now_ms:
                raise MeterError(f"meter {meter}: {what} is in the future (now {when(now_ms)})")
        got = self._db.execute(
            "SELECT min(time_ms) FROM readings WHERE meter=? AND seq=?", (meter, READING)
        ).fetchone()
        first_ms = got[0] if got and isinstance(got[0], int) else None
        if len(periods) == 1 and (first_ms is None or since <= first_ms):
            return None
        if since <= periods[-1].since_ms:
            raise MeterError(
                f"meter {meter}: settings changed ({change(periods[-1].spec, spec)}) from {what}, which is"
                f" not after the settings in force since {when(periods[-1].since_ms)}; give {key} after it"
                " (periods already recorded are not moved: `monitor meters show` lists them)"
            )
        return since

    def data_version(self) -> int:
        """Changes when another connection commits (a `monitor meters` command)."""
        return int(str(self._query("PRAGMA data_version")[0][0]))

    def settings_not_copied(self, meter: str) -> tuple[int, int] | None:
        """(the earliest start, the latest id) of the meter's settings rows recorded since the
        InfluxDB copy last followed them (`mark_copied`), whoever recorded them; None if none.
        The rows from that start on were re-judged in the ledger and must be sent again."""
        got = self._query(
            "SELECT min(since_ms), max(id) FROM settings WHERE meter=?"
            " AND id > (SELECT CAST(value AS INTEGER) FROM meta WHERE key=?)",
            (meter, COPIED + meter),
        )
        since, last = got[0] if got else (None, None)
        return None if since is None else (int(str(since)), int(str(last)))

    def mark_copied(self, meter: str, last_id: int) -> None:
        with self._tx():
            self._db.execute("UPDATE meta SET value=? WHERE key=?", (str(last_id), COPIED + meter))

    def settings_refusals(self, specs: Mapping[str, MeterSpec], now: float) -> list[str]:
        """What opening the ledger with `specs` would refuse (a settings_since in the future or
        not after the latest period), writing nothing: a reload checks it before it stops the
        running daemon, so a refused change leaves that daemon running. It reads the periods
        the ledger holds: those of a meter the running config dropped (added back now), and
        those another process (`monitor meters` with an edited config) recorded meanwhile."""
        out = []
        self.refresh()
        for meter, spec in specs.items():
            periods = self.periods(meter)
            if periods and settings_text(periods[-1].spec) != settings_text(spec):
                try:
                    self._settings_start(meter, spec, periods, to_ms(now))
                except MeterError as exc:
                    out.append(str(exc))
        return out

    def _add_period(self, meter: str, since_ms: int, text: str, source: str, now_ms: int) -> None:
        self._db.execute(
            "INSERT INTO settings (meter, since_ms, spec, source, recorded_at) VALUES (?, ?, ?, ?, ?)",
            (meter, since_ms, text, source, now_ms),
        )
        self._periods.pop(meter, None)

    def periods(self, meter: str, superseded: bool = False) -> list[Period]:
        """The meter's settings periods in force, oldest first (with `superseded`, the
        corrected ones too, in the order they were recorded)."""
        if not superseded and meter in self._periods:
            return self._periods[meter][1]
        current = self.spec(meter) if meter in self.specs else None
        rows = self._query(
            "SELECT id, since_ms, spec, source, recorded_at FROM settings WHERE meter=?"
            " ORDER BY since_ms, id",
            (meter,),
        )
        latest: dict[int, int] = {}
        for ident, since, *_ in rows:
            latest[int(str(since))] = int(str(ident))
        out = []
        for ident, since, text, source, at in rows:
            gone = latest[int(str(since))] != ident
            if gone and not superseded:
                continue
            base = current or MeterSpec(meter, "ft3", None, Decimal(1), None)
            out.append(
                Period(meter, int(str(since)), _from_text(base, str(text)), str(source), int(str(at)), gone)
            )
        if not superseded:
            self._periods[meter] = ([p.since_ms for p in out], out)
        return out

    def period_at(self, meter: str, time_ms: int, seq: int = READING) -> Period:
        """The settings period a row is judged by: the period in force at its time; an old
        meter's final reading at a change's very time belongs to the settings before it."""
        if meter not in self._periods:
            self.periods(meter)
        starts, periods = self._periods[meter]
        at = time_ms - 1 if seq == OLD_FINAL else time_ms
        i = bisect.bisect_right(starts, at) - 1
        return periods[max(i, 0)]

    def old_side(self, meter: str, time_ms: int) -> tuple[int, int]:
        """Where the old meter's final reading of a swap at `time_ms` is judged from: after
        a reading at the same time, unless the settings change at that very time (a reading
        stamped at a change belongs to the new settings, so it is no base for the old meter)."""
        changes = self.period_at(meter, time_ms).since_ms == time_ms
        return (time_ms, READING) if changes else (time_ms, OLD_FINAL)

    def spec_at(self, meter: str, time_ms: int, seq: int = READING) -> MeterSpec:
        return self.period_at(meter, time_ms, seq).spec

    def settings_changes(self, meter: str, after_ms: int, until_ms: int) -> list[tuple[Period, Period]]:
        """(before, after) for each change that took effect in after_ms < time <= until_ms."""
        periods = self.periods(meter)
        return [(a, b) for a, b in itertools.pairwise(periods) if after_ms < b.since_ms <= until_ms]

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
        return judge(period.spec, base.reading, (time_ms - base.time_ms) / 1000, reading, last_raw)

    def _counts_changed(self, meter: str, base: Row, period: Period) -> bool:
        """Whether what a count is worth (unit, register_digits, multiplier) changed in any
        period from the base's to `period`: a change of max_rate alone is a new bound for the
        checks, not a new register, so the movement across it is billed as ever."""
        periods = self._periods[meter][1]
        lo = self.period_at(meter, base.time_ms, base.seq)
        between = periods[periods.index(lo) : periods.index(period) + 1]
        return len({(p.spec.unit, p.spec.digits, p.spec.multiplier) for p in between}) > 1

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
