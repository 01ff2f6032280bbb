"""Incidents on disk: `state_dir/incidents.sqlite` (WAL) and the frozen evidence files.

Plain sqlite3 with WAL for now (the shared open helper is being written elsewhere).
The daemon's tracker writes incident rows and evidence; `monitor incidents` and the
console only append notes and closes, in their own tables, so a note written while
the daemon updates the figures is never lost to a read-modify-write race.

Evidence is kept here, not in the series store, so the 30-day prune never touches
it. Since schema 2 it is stored a batch at a time, one `evidence_block` row of NumPy
columns per batch and sensor: a row per sample cost more than judging the samples. Since
schema 3 a block's times and values may be encoded (`blocks.py`: a regular grid of times
as first and step, rounded readings as scaled integers, each only when it decodes bit for
bit); blocks written before are raw and read as they were. Since schema 4 each block
carries a CRC-32 of its codec and blobs, checked when it is read, and every block's times
must run from its `first` to its `last` column: a damaged block is an error naming the
incident, the sensor and the row, never other numbers. Rows a schema 1 store holds in
`evidence` are read alongside.

When an incident is final its evidence is written once to
`state_dir/incidents/<id>/evidence.csv` and the SHA-256 of those bytes is recorded;
`verify` recomputes the hash and the CSV from the rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sqlite3
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from monitor import writeonce
from monitor.durable import make_dirs, replace_file
from monitor.errors import StateError
from monitor.incidents.blocks import BlockError, checksum, decode, encode, times
from monitor.incidents.evidence import HEADER, csv_parts
from monitor.incidents.model import Figures, Incident, Note, NoteKind
from monitor.sqlite import Schema, connect, translate
from monitor.writeonce import WriteKey

SCHEMA_VERSION = 5
FILE = "incidents.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS incident (
    id TEXT PRIMARY KEY,
    sensor TEXT NOT NULL,
    rule TEXT NOT NULL,
    start REAL NOT NULL,
    frozen INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incident_start ON incident (start);
CREATE TABLE IF NOT EXISTS note (
    incident TEXT NOT NULL,
    time REAL NOT NULL,
    by TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    due REAL
);
CREATE TABLE IF NOT EXISTS closing (
    incident TEXT PRIMARY KEY,
    time REAL NOT NULL,
    by TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evidence (
    incident TEXT NOT NULL,
    sensor TEXT NOT NULL,
    t REAL NOT NULL,
    value REAL,
    quality INTEGER NOT NULL,
    PRIMARY KEY (incident, sensor, t)
) WITHOUT ROWID;
"""
# Version 2: evidence a batch at a time (the `evidence` rows of version 1 are still read).
_BLOCKS = """
CREATE TABLE IF NOT EXISTS evidence_block (
    incident TEXT NOT NULL,
    sensor TEXT NOT NULL,
    first REAL NOT NULL,
    last REAL NOT NULL,
    t BLOB NOT NULL,
    value BLOB NOT NULL,
    quality BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_block_of ON evidence_block (incident, sensor, first);
"""
# Version 3: how a block's blobs are encoded (`blocks.py`); 0, raw, for every older block.
_CODEC = "ALTER TABLE evidence_block ADD COLUMN codec INTEGER NOT NULL DEFAULT 0;"
# Version 4: each block's `blocks.checksum` when written; NULL (not checked) for older blocks.
_CRC = "ALTER TABLE evidence_block ADD COLUMN crc INTEGER;"
# Version 5: the console's request ids (`monitor/writeonce.py`), in the transaction of the
# note or close they record.
SCHEMA = Schema("incident store", (_SCHEMA, _BLOCKS, _CODEC, _CRC, writeonce.TABLE))  # SCHEMA_VERSION (5)
CSV_HEADER = HEADER.decode() + "\n"
_ADD_BLOCK = (
    "INSERT INTO evidence_block (incident, sensor, first, last, codec, t, value, quality, crc)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
BLOCK_ROWS = 4096  # a block grows by appends up to this many samples
# A block's codec and blobs as `_decode` takes them. SQLite keeps any type in any column:
# what a hand edit left as TEXT is read as its bytes (its text may not even be UTF-8, which
# sqlite3 fails on while fetching) and refused by its type, named; so is a codec not an integer.
_BLOCK = (
    "CASE typeof(codec) WHEN 'integer' THEN codec ELSE typeof(codec) END,"
    " CAST(t AS BLOB), CAST(value AS BLOB), CAST(quality AS BLOB), typeof(t), typeof(value), typeof(quality),"
    " first, last, CASE typeof(crc) WHEN 'integer' THEN crc WHEN 'null' THEN NULL ELSE -1 END"
)

Columns = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int8]]


class DamagedEvidenceError(StateError):
    """One incident's evidence block does not decode: an error of that incident and sensor
    alone (the tracker marks it and goes on with the others), not of the store as a whole.
    `since`: the block's `first` column, where its evidence may begin (None if not a number)."""

    def __init__(self, message: str, iid: str, sensor: str, rowid: int, since: float | None) -> None:
        super().__init__(message)
        self.iid = iid
        self.sensor = sensor
        self.rowid = rowid
        self.since = since


@dataclass(frozen=True, slots=True)
class Damage:
    """A damaged block `intact_columns` left out: its error (which incident, sensor, row) and
    `since`, the time from which the sensor's evidence is not whole: the block's first time,
    or when that column is damaged too, just after the last intact sample read before it
    (blocks are written in time order); None with nothing before it to place it by."""

    error: DamagedEvidenceError
    since: float | None


def _bound(since: float | None, before: list[Columns]) -> float | None:
    if since is not None:
        return since
    last = max((float(t[-1]) for t, _, _ in before if t.size), default=None)
    return None if last is None else float(np.nextafter(last, math.inf))


def _spans(t: npt.NDArray[np.float64], first: float, last: float) -> None:
    """A block's times run from its `first` to its `last` column (written from the same
    array): a grid's first or step, or a count, that changed would give other times of
    the right length. The values have no such witness."""
    if not t.size or t[0] != first or t[-1] != last:
        got = f"{float(t[0])!r} to {float(t[-1])!r}" if t.size else "none"
        raise BlockError(f"times {got}, not {first!r} to {last!r} as the block says")


def csv_lines(columns: dict[str, Columns]) -> int:
    """What `data.count(b"\\n") - 1` gives for `evidence_csv`'s bytes of these columns, without
    reading them: a line a sample, plus the newlines a sensor's name would hold."""
    return sum(t.size * (1 + name.count("\n")) for name, (t, _, _) in columns.items())


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _record(inc: Incident) -> str:
    f = inc.figures
    data = {
        "station": inc.station,
        "method": inc.method,
        "citation": inc.citation,
        "discharger": inc.discharger,
        "unit": inc.unit,
        "threshold": inc.threshold,
        "factor": inc.factor,
        "alarm_time": inc.alarm_time,
        "end": inc.end,
        "statement_due": inc.statement_due,
        "flow_sensor": inc.flow_sensor,
        "clear_time": inc.clear_time,
        "activations": inc.activations,
        "evidence_sha256": inc.evidence_sha256,
        "evidence_rows": inc.evidence_rows,
        "evidence_until": _num(inc.evidence_until),
        "judged_until": _num(inc.judged_until),
        "evidence_broken_at": inc.evidence_broken_at,
        "evidence_broken": inc.evidence_broken,
        "figures": {
            "baseline": _num(f.baseline),
            "peak_value": _num(f.peak_value),
            "peak_time": f.peak_time,
            "peak_multiple": _num(f.peak_multiple),
            "mean_multiple": _num(f.mean_multiple),
            "excess_volume_gal": _num(f.excess_volume_gal),
            "excess_volume_ft3": _num(f.excess_volume_ft3),
            "excess_mass_lb": _num(f.excess_mass_lb),
            "coverage": _num(f.coverage),
            "samples": f.samples,
        },
    }
    return json.dumps(data, allow_nan=False)


def _incident(row: tuple[str, str, str, float, int, str]) -> Incident:
    iid, sensor, rule, start, frozen, text = row
    d = json.loads(text)
    f = d["figures"]
    until = d.get("evidence_until")
    judged = d.get("judged_until")
    return Incident(
        id=iid,
        station=d["station"],
        sensor=sensor,
        rule=rule,
        method=d["method"],
        citation=d["citation"],
        discharger=d.get("discharger"),
        unit=d["unit"],
        threshold=d["threshold"],
        factor=d.get("factor"),
        alarm_time=d["alarm_time"],
        end=d.get("end"),
        figures=Figures(start=start, **f),
        statement_due=d["statement_due"],
        flow_sensor=d.get("flow_sensor"),
        clear_time=d.get("clear_time"),
        activations=d.get("activations", 1),
        evidence_sha256=d.get("evidence_sha256"),
        evidence_rows=d.get("evidence_rows", 0),
        evidence_until=-math.inf if until is None else until,
        judged_until=-math.inf if judged is None else judged,
        evidence_broken_at=d.get("evidence_broken_at"),
        evidence_broken=d.get("evidence_broken"),
        frozen=bool(frozen),
    )


class NotRegularFileError(OSError):
    """A frozen evidence file that is not a regular file (a FIFO, a device): never read."""


class IncidentStore:
    """Incident rows, notes, closes and evidence for one station."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE
        # One owner at a time (the daemon's loop, or a command), as with the alarm journal.
        # Version 1 is `_SCHEMA`, 2 adds `_BLOCKS`; add a migration to SCHEMA to change a
        # table, never edit one.
        self._db = connect(self.path, SCHEMA, synchronous="NORMAL", check_same_thread=False)
        self.keys = writeonce.Keys(self._db, f"incident store {self.path}")  # the console's request ids

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> IncidentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, sql: str, args: Iterable[object] = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, tuple(args))
        except sqlite3.Error as exc:
            raise StateError(f"incident store {self.path}: {exc}") from exc

    # --- incidents ----------------------------------------------------------------------

    def save(self, inc: Incident) -> None:
        self._run(
            "INSERT INTO incident (id, sensor, rule, start, frozen, data) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET start = excluded.start, frozen = excluded.frozen,"
            " data = excluded.data",
            (inc.id, inc.sensor, inc.rule, inc.start, int(inc.frozen), _record(inc)),
        )

    def get(self, iid: str) -> Incident | None:
        row = self._run("SELECT id, sensor, rule, start, frozen, data FROM incident WHERE id = ?", (iid,))
        found = row.fetchone()
        return None if found is None else self._complete(_incident(found))

    def closed(self, iid: str) -> bool:
        """Whether the incident is on record and its case closed (`get` without reading it all)."""
        row = self._run(
            "SELECT 1 FROM incident JOIN closing ON closing.incident = incident.id WHERE incident.id = ?",
            (iid,),
        )
        return row.fetchone() is not None

    def incidents(self, *, unfrozen_only: bool = False) -> list[Incident]:
        where = " WHERE frozen = 0" if unfrozen_only else ""
        rows = self._run(
            f"SELECT id, sensor, rule, start, frozen, data FROM incident{where} ORDER BY start, id"
        )
        return [self._complete(_incident(r)) for r in rows.fetchall()]

    def marked_count(self) -> int:
        """How many incidents on record are marked `evidence incomplete` (a damaged evidence
        block): read once when a tracker starts, for /api/health and /metrics."""
        row = self._run(
            "SELECT count(*) FROM incident WHERE json_extract(data, '$.evidence_broken') IS NOT NULL"
        )
        return int(row.fetchone()[0])

    def frozen_spans(self) -> list[tuple[str, str, str, float, float]]:
        """(id, sensor, rule, start, last) of every frozen incident, `last` its end or its
        clear, whichever is later: the history it stands for, read in one query (`incidents`
        reads each one's notes and close too) when a tracker starts."""
        rows = self._run(
            "SELECT id, sensor, rule, start, data FROM incident WHERE frozen = 1 ORDER BY start, id"
        )
        out: list[tuple[str, str, str, float, float]] = []
        for iid, sensor, rule, start, text in rows.fetchall():
            d = json.loads(text)
            ends = [x for x in (d.get("end"), d.get("clear_time")) if x is not None]
            out.append((iid, sensor, rule, start, max(ends, default=start)))
        return out

    def _complete(self, inc: Incident) -> Incident:
        notes = tuple(
            Note(time=t, by=by, text=text, kind=NoteKind(kind), due=due)
            for t, by, kind, text, due in self._run(
                "SELECT time, by, kind, text, due FROM note WHERE incident = ? ORDER BY time, rowid",
                (inc.id,),
            ).fetchall()
        )
        closing = self._run("SELECT time, by, reason FROM closing WHERE incident = ?", (inc.id,)).fetchone()
        if closing is None:
            return inc.with_(notes=notes)
        return inc.with_(notes=notes, closed_at=closing[0], closed_by=closing[1], close_reason=closing[2])

    def add_note(self, iid: str, note: Note, key: WriteKey | None = None) -> None:
        """`key`: the console's request id, kept in the note's transaction."""
        with self.batch():
            self._run(
                "INSERT INTO note (incident, time, by, kind, text, due) VALUES (?, ?, ?, ?, ?, ?)",
                (iid, note.time, note.by, str(note.kind), note.text, note.due),
            )
            if key is not None:
                self._claim(key, note.time)

    def close_case(self, iid: str, time: float, by: str, reason: str, key: WriteKey | None = None) -> bool:
        """Close an incident's case; False when it was closed already (`key` then not kept)."""
        with self.batch():
            cur = self._run(
                "INSERT OR IGNORE INTO closing (incident, time, by, reason) VALUES (?, ?, ?, ?)",
                (iid, time, by, reason),
            )
            if cur.rowcount == 1 and key is not None:
                self._claim(key, time)
        return cur.rowcount == 1

    def _claim(self, key: WriteKey, time: float) -> None:
        try:
            writeonce.claim(self._db, key, time)
        except sqlite3.Error as exc:
            raise StateError(f"incident store {self.path}: cannot keep the request id: {exc}") from exc

    # --- evidence -----------------------------------------------------------------------

    def add_evidence(
        self,
        iid: str,
        sensor: str,
        t: npt.NDArray[np.float64],
        v: npt.NDArray[np.float64],
        q: npt.NDArray[np.int8],
        past_damage: bool = False,
    ) -> int:
        """Store the samples not stored yet (first one wins at a time, as INSERT OR IGNORE
        did with rows) as one block; returns how many were new. A damaged last block is an
        `DamagedEvidenceError`, unless `past_damage` (an incident marked already): then the samples
        start a new block beside it, never joined to it (see `_put_block`)."""
        if not t.size:
            return 0
        t, v, q = np.asarray(t, np.float64), np.asarray(v, np.float64), np.asarray(q)
        if not (t[1:] > t[:-1]).all():  # in time order, one a time (a step's): as it is, no sort
            t, first = np.unique(t, return_index=True)
            v, q = v[first], q[first]
        try:
            with self.batch():
                stored = self._stored_times(iid, sensor, float(t[0]), float(t[-1]))
                if stored.size:
                    new = ~np.isin(t, stored)
                    t, v, q = t[new], v[new], q[new]
                if t.size:
                    self._put_block(iid, sensor, t, v, q, past_damage)
        except sqlite3.Error as exc:
            raise StateError(f"incident store {self.path}: cannot add evidence: {exc}") from exc
        return int(t.size)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for the writes within (`add_evidence`, `save`): all of them or,
        after an exception (or a crash), none. Within a batch already, the outer one decides.
        The tracker copies a step's evidence in one: a COMMIT per incident and sensor was a
        third of the replay's tracker thread."""
        if self._db.in_transaction:
            yield
            return
        self._run("BEGIN IMMEDIATE")
        try:
            yield
            self._run("COMMIT")
        except BaseException:
            # SQLITE_FULL (a full disk) and some I/O errors roll back on their own: a
            # ROLLBACK then raised "no transaction is active" over the real cause
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """Within a `batch`: the writes within undone alone after an exception, the batch's
        others kept (one incident's damaged evidence must not undo the other incidents').
        After an error SQLite rolled the whole transaction back on its own (a full disk), the
        exception is raised as it is: there is no savepoint left to go back to. Outside a
        batch it is one (BEGIN IMMEDIATE: a deferred SAVEPOINT that reads, then writes, fails
        at once when another connection -- the replay's freezer -- committed in between)."""
        if not self._db.in_transaction:
            with self.batch():
                yield
            return
        self._run("SAVEPOINT evidence")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK TO evidence")
                    self._db.execute("RELEASE evidence")
            raise
        self._run("RELEASE evidence")

    def _put_block(
        self,
        iid: str,
        sensor: str,
        t: npt.NDArray[np.float64],
        v: npt.NDArray[np.float64],
        q: npt.NDArray[np.int8],
        past_damage: bool = False,
    ) -> None:
        """New samples later than the sensor's last block join it while it is small (live,
        a batch brings one sample: a block each would make a day of evidence 86,400 blocks).
        The last block's columns are read only to join it (a replay step's block is too big
        to join, and reading it back each time cost as much as writing it).

        A damaged last block is never joined: re-encoding it would mean writing over the
        bytes a restore or a forensic read needs with what could not be read. With
        `past_damage` the samples go to a new block of their own (its own CRC), so the
        evidence after the damage stays readable and checked; the next batches join that one."""
        last = self._db.execute(
            "SELECT rowid, last, length(quality) FROM evidence_block"
            " WHERE incident = ? AND sensor = ? ORDER BY rowid DESC LIMIT 1",
            (iid, sensor),
        ).fetchone()
        if last is not None and float(t[0]) > last[1] and last[2] + t.size <= BLOCK_ROWS:
            block = self._db.execute(f"SELECT {_BLOCK} FROM evidence_block WHERE rowid = ?", (last[0],))
            try:
                old_t, old_v, old_q = self._decode((iid, sensor, last[0]), block.fetchone())
            except DamagedEvidenceError:
                if not past_damage:
                    raise
                new = encode(t, v, q)
                self._db.execute(_ADD_BLOCK, (iid, sensor, float(t[0]), float(t[-1]), *new, checksum(*new)))
                return
            both = encode(np.concatenate((old_t, t)), np.concatenate((old_v, v)), np.concatenate((old_q, q)))
            self._db.execute(
                "UPDATE evidence_block SET last = ?, codec = ?, t = ?, value = ?, quality = ?, crc = ?"
                " WHERE rowid = ?",
                (float(t[-1]), *both, checksum(*both), last[0]),
            )
            return
        new = encode(t, v, q)
        self._db.execute(_ADD_BLOCK, (iid, sensor, float(t[0]), float(t[-1]), *new, checksum(*new)))

    def _decode(self, block: tuple[str, str, int], row: Sequence[Any]) -> Columns:
        """One block's columns from its `_BLOCK` row; `block` (incident, sensor, rowid) names
        it if it is damaged."""
        codec, t, v, q, *kinds, first, last, crc = row
        try:
            for name, kind in zip(("t", "value", "quality"), kinds, strict=True):
                if kind != "blob":
                    raise BlockError(f"{name} is {kind}, not a blob")
            columns = decode(codec, t, v, q, crc)
            _spans(columns[0], first, last)
            return columns
        except BlockError as exc:
            raise self._damaged(block, exc, first) from exc

    def _damaged(
        self, block: tuple[str, str, int], exc: BlockError, first: object = None
    ) -> DamagedEvidenceError:
        """The error for a block that does not decode: which incident's evidence, which sensor
        and which row, so an operator knows what a restore must bring back (never numbers)."""
        iid, sensor, rowid = block
        since = float(first) if isinstance(first, int | float) and math.isfinite(first) else None
        return DamagedEvidenceError(
            f"incident store {self.path}: incident {iid}, sensor {sensor}: an evidence block"
            f" (evidence_block rowid {rowid}) is damaged: {exc}; restore incidents.sqlite from a backup",
            iid,
            sensor,
            rowid,
            since,
        )

    def _stored_times(self, iid: str, sensor: str, lo: float, hi: float) -> npt.NDArray[np.float64]:
        """Times already stored for the sensor within [lo, hi] (none, unless a batch is re-sent)."""
        found = [
            np.array(
                [
                    r[0]
                    for r in self._db.execute(
                        "SELECT t FROM evidence WHERE incident = ? AND sensor = ? AND t BETWEEN ? AND ?",
                        (iid, sensor, lo, hi),
                    )
                ],
                np.float64,
            )
        ]
        for rowid, codec, blob, count, first, last, *kinds in self._db.execute(
            "SELECT rowid, CASE typeof(codec) WHEN 'integer' THEN codec ELSE typeof(codec) END,"
            " CAST(t AS BLOB), length(quality), first, last, typeof(t), typeof(quality)"
            " FROM evidence_block WHERE incident = ? AND sensor = ? AND first <= ? AND last >= ?",
            (iid, sensor, hi, lo),
        ):
            try:
                for name, kind in zip(("t", "quality"), kinds, strict=True):
                    if kind != "blob":  # (length() of TEXT counts characters: not the count)
                        raise BlockError(f"{name} is {kind}, not a blob")
                found.append(times(codec, blob, count))
                _spans(found[-1], first, last)
            except BlockError as exc:
                raise self._damaged((iid, sensor, rowid), exc, first) from exc
        return np.concatenate(found)

    def columns(self, iid: str, sensor: str | None = None) -> dict[str, Columns]:
        """Each sensor's evidence (of one sensor, or all) in time order: schema 1 rows, then
        the blocks. The blocks of a replay or a live run come in time order: they are only
        concatenated, not sorted again (a sort and three copies each time figures were read)."""
        return self._columns(iid, sensor, None)

    def intact_columns(self, iid: str) -> tuple[dict[str, Columns], list[Damage]]:
        """`columns` of every sensor without the damaged blocks, each named instead (never read
        as numbers), for an export of what is intact up to the damage: the caller cuts the
        columns at the earliest `Damage.since` (blocks after a damaged one are intact too, but
        the evidence is not whole from there)."""
        damaged: list[Damage] = []
        return self._columns(iid, None, damaged), damaged

    def _columns(self, iid: str, sensor: str | None, damaged: list[Damage] | None) -> dict[str, Columns]:
        """`columns`; with `damaged`, a damaged block is left out and added to it, not raised."""
        where = "incident = ?" if sensor is None else "incident = ? AND sensor = ?"
        args = (iid,) if sensor is None else (iid, sensor)
        parts: dict[str, list[Columns]] = {}
        what = f"incident store {self.path}: incident {iid}: cannot read its evidence"
        legacy = self._read(
            what, f"SELECT sensor, t, value, quality FROM evidence WHERE {where} ORDER BY sensor, t", args
        )
        if legacy:
            names = [r[0] for r in legacy]
            t = np.array([r[1] for r in legacy], np.float64)
            v = np.array([math.nan if r[2] is None else r[2] for r in legacy], np.float64)
            q = np.array([r[3] for r in legacy], np.int8)
            for name in dict.fromkeys(names):
                i, j = names.index(name), len(names) - names[::-1].index(name)
                parts.setdefault(name, []).append((t[i:j], v[i:j], q[i:j]))
        blocks = self._read(
            what, f"SELECT rowid, sensor, {_BLOCK} FROM evidence_block WHERE {where} ORDER BY rowid", args
        )
        for rowid, name, *row in blocks:
            try:  # decoded before `setdefault`: a sensor whose only block is damaged has none
                block = self._decode((iid, name, rowid), row)
            except DamagedEvidenceError as exc:
                if damaged is None:
                    raise
                damaged.append(Damage(exc, _bound(exc.since, parts.get(name, []))))
                continue
            parts.setdefault(name, []).append(block)
        out: dict[str, Columns] = {}
        for name in sorted(parts):
            t = np.concatenate([c[0] for c in parts[name]]).astype(np.float64, copy=False)
            v = np.concatenate([c[1] for c in parts[name]]).astype(np.float64, copy=False)
            q = np.concatenate([c[2] for c in parts[name]])
            if not (t[1:] >= t[:-1]).all():  # a stable sort of what is in order changes nothing
                order = np.argsort(t, kind="stable")
                t, v, q = t[order], v[order], q[order]
            out[name] = (t, v, q)
        return out

    def _read(self, what: str, sql: str, args: tuple[str, ...]) -> list[Any]:
        """All rows of a query, an SQLite error (a damaged page: 'database disk image is
        malformed', in the query or while its rows are fetched) as `what` failing, in words."""
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, what) from exc

    def evidence(
        self, iid: str, sensor: str | None = None
    ) -> tuple[list[str], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int8]]:
        """(sensor names, times, values (NaN for none), qualities), by sensor then time."""
        cols = self.columns(iid, sensor)
        if not cols:
            return [], np.empty(0, np.float64), np.empty(0, np.float64), np.empty(0, np.int8)
        names = [name for name, (t, _, _) in cols.items() for _ in range(t.size)]
        t, v, q = (np.concatenate(c) for c in zip(*cols.values(), strict=True))
        return names, t, v, q

    def evidence_csv(self, iid: str, columns: dict[str, Columns] | None = None) -> bytes:
        """The evidence as CSV, byte for byte what is hashed: time (ISO UTC), sensor, value,
        quality. `columns`: `columns(iid)`, when the caller has read them already."""
        return b"".join(self.evidence_parts(iid, columns))  # one copy of the whole, not two

    def evidence_parts(self, iid: str, columns: dict[str, Columns] | None = None) -> list[bytes | bytearray]:
        """`evidence_csv` in parts (the header, then chunks of rows), for `write_evidence`:
        joining them copied each file's bytes once more (94 MB in a 10 M-row replay)."""
        cols = self.columns(iid) if columns is None else columns
        parts: list[bytes | bytearray] = [CSV_HEADER.encode("utf-8")]
        for name, (t, v, q) in cols.items():
            parts.extend(csv_parts(name, t, v, q))
        return parts

    def evidence_path(self, iid: str) -> Path:
        return self.dir / "incidents" / iid / "evidence.csv"

    def frozen_file(self, iid: str, sha256: str | None) -> tuple[str, bytes | None]:
        """The frozen evidence file's SHA-256, and its bytes when that is `sha256` (None: what
        is on disk is not the frozen evidence). Hashed a chunk at a time before it is read
        whole, so a file of any size put there is never held in memory (Path.read_bytes of a
        2 GiB file: a MemoryError). `NotRegularFileError` when it is not a regular file, as
        the freeze writes (a FIFO put there blocked the read for ever, a link to /dev/zero
        would never end it): opened without blocking, checked before anything is read."""
        path = self.evidence_path(iid)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFileError(f"{path} is not a regular file")
            digest = hashlib.sha256()
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
            sha = digest.hexdigest()
            if sha != sha256:
                return sha, None
            fh.seek(0)
            data = fh.read()
        sha = hashlib.sha256(data).hexdigest()  # the bytes held, should it change between reads
        return sha, data if sha == sha256 else None

    def freeze_evidence(self, iid: str, columns: dict[str, Columns] | None = None) -> tuple[str, int]:
        """Write the evidence file once (atomically) and return (SHA-256, rows)."""
        cols = self.columns(iid) if columns is None else columns
        return self.write_evidence(iid, self.evidence_parts(iid, cols), csv_lines(cols))

    def write_evidence(
        self, iid: str, data: bytes | bytearray | Sequence[bytes | bytearray], rows: int | None = None
    ) -> tuple[str, int]:
        """`freeze_evidence`'s durable half, no database access: safe in another thread, so
        the fsyncs of incidents frozen together overlap. `data`: the file's bytes, or its
        parts in order (`evidence_parts`: written and hashed one after the other, never
        joined). `rows`: `csv_lines` of the columns `data` was made of, when the caller has
        them (counting a day's lines in the bytes took as long as hashing them).
        Through `replace_file`, so a symlink left at the `.tmp` is replaced, not followed
        (its target was overwritten), and with its directory fsynced, as is the incident's
        new directory in `incidents/`: the caller saves the record frozen after this returns,
        and a power cut must not leave a frozen record whose file is gone."""
        parts = [data] if isinstance(data, bytes | bytearray) else data
        path = self.evidence_path(iid)
        try:
            make_dirs(path.parent)
            replace_file(path, lambda fh: fh.writelines(parts))
        except OSError as exc:
            raise StateError(f"cannot write incident evidence {path}: {exc.strerror or exc}") from exc
        sha = hashlib.sha256()
        for part in parts:
            sha.update(part)
        if rows is None:
            rows = sum(part.count(b"\n") for part in parts) - 1
        return sha.hexdigest(), rows

    def verify(self, inc: Incident) -> bool:
        """True when the evidence file and the rows both still hash to the recorded SHA-256."""
        if inc.evidence_sha256 is None:
            return False
        try:
            on_disk, _ = self.frozen_file(inc.id, None)
        except OSError:
            return False
        return (
            on_disk == inc.evidence_sha256
            and hashlib.sha256(self.evidence_csv(inc.id)).hexdigest() == inc.evidence_sha256
        )
