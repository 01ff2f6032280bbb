"""Incidents on disk: `state_dir/incidents.sqlite` (WAL) and the frozen evidence files.

Plain sqlite3 with WAL for now (the shared open helper is being written elsewhere).
The daemon's tracker writes incident rows and evidence; `monitor incidents` and the
console only append notes and closes, in their own tables, so a note written while
the daemon updates the figures is never lost to a read-modify-write race.

Evidence is kept here, not in the series store, so the 30-day prune never touches
it. When an incident is final its evidence is written once to
`state_dir/incidents/<id>/evidence.csv` and the SHA-256 of those bytes is recorded;
`verify` recomputes the hash and the CSV from the rows.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from monitor.errors import StateError
from monitor.incidents.model import Figures, Incident, Note, NoteKind
from monitor.model import iso
from monitor.sqlite import Schema, connect

SCHEMA_VERSION = 1
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
SCHEMA = Schema("incident store", (_SCHEMA,))  # its version is SCHEMA_VERSION (1)
CSV_HEADER = "time,sensor,value,quality\n"
_ADD_EVIDENCE = "INSERT OR IGNORE INTO evidence (incident, sensor, t, value, quality) VALUES (?, ?, ?, ?, ?)"


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
        frozen=bool(frozen),
    )


class IncidentStore:
    """Incident rows, notes, closes and evidence for one station."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE
        # One owner at a time (the daemon's loop, or a command), as with the alarm journal.
        # Version 1 is `_SCHEMA`; add a migration to SCHEMA to change a table, never edit one.
        self._db = connect(self.path, SCHEMA, synchronous="NORMAL", check_same_thread=False)

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

    def incidents(self, *, unfrozen_only: bool = False) -> list[Incident]:
        where = " WHERE frozen = 0" if unfrozen_only else ""
        rows = self._run(
            f"SELECT id, sensor, rule, start, frozen, data FROM incident{where} ORDER BY start, id"
        )
        return [self._complete(_incident(r)) for r in rows.fetchall()]

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

    def add_note(self, iid: str, note: Note) -> None:
        self._run(
            "INSERT INTO note (incident, time, by, kind, text, due) VALUES (?, ?, ?, ?, ?, ?)",
            (iid, note.time, note.by, str(note.kind), note.text, note.due),
        )

    def close_case(self, iid: str, time: float, by: str, reason: str) -> bool:
        """Close an incident's case; False when it was closed already."""
        cur = self._run(
            "INSERT OR IGNORE INTO closing (incident, time, by, reason) VALUES (?, ?, ?, ?)",
            (iid, time, by, reason),
        )
        return cur.rowcount == 1

    # --- evidence -----------------------------------------------------------------------

    def add_evidence(
        self,
        iid: str,
        sensor: str,
        t: npt.NDArray[np.float64],
        v: npt.NDArray[np.float64],
        q: npt.NDArray[np.int8],
    ) -> int:
        if not t.size:
            return 0
        rows = [
            (iid, sensor, ti, vi if math.isfinite(vi) else None, qi)
            for ti, vi, qi in zip(t.tolist(), v.tolist(), q.tolist(), strict=True)
        ]
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.executemany(
                    _ADD_EVIDENCE,
                    rows,
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StateError(f"incident store {self.path}: cannot add evidence: {exc}") from exc
        return int(cur.rowcount)

    def evidence(
        self, iid: str, sensor: str | None = None
    ) -> tuple[list[str], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int8]]:
        """(sensor names, times, values (NaN for none), qualities), by sensor then time."""
        sql = "SELECT sensor, t, value, quality FROM evidence WHERE incident = ?"
        args: tuple[object, ...] = (iid,)
        if sensor is not None:
            sql += " AND sensor = ?"
            args += (sensor,)
        rows = self._run(sql + " ORDER BY sensor, t", args).fetchall()
        names = [r[0] for r in rows]
        t = np.array([r[1] for r in rows], np.float64)
        v = np.array([math.nan if r[2] is None else r[2] for r in rows], np.float64)
        q = np.array([r[3] for r in rows], np.int8)
        return names, t, v, q

    def evidence_csv(self, iid: str) -> bytes:
        """The evidence as CSV, byte for byte what is hashed: time (ISO UTC), sensor, value, quality."""
        names, t, v, q = self.evidence(iid)
        out = io.StringIO()
        out.write(CSV_HEADER)
        for name, ti, vi, qi in zip(names, t.tolist(), v.tolist(), q.tolist(), strict=True):
            out.write(f"{iso(ti)},{name},{repr(vi) if math.isfinite(vi) else ''},{qi}\n")
        return out.getvalue().encode("utf-8")

    def evidence_path(self, iid: str) -> Path:
        return self.dir / "incidents" / iid / "evidence.csv"

    def freeze_evidence(self, iid: str) -> tuple[str, int]:
        """Write the evidence file once (atomically) and return (SHA-256, rows)."""
        data = self.evidence_csv(iid)
        path = self.evidence_path(iid)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise StateError(f"cannot write incident evidence {path}: {exc.strerror or exc}") from exc
        return hashlib.sha256(data).hexdigest(), data.count(b"\n") - 1

    def verify(self, inc: Incident) -> bool:
        """True when the evidence file and the rows both still hash to the recorded SHA-256."""
        if inc.evidence_sha256 is None:
            return False
        try:
            on_disk = self.evidence_path(inc.id).read_bytes()
        except OSError:
            return False
        return (
            hashlib.sha256(on_disk).hexdigest() == inc.evidence_sha256
            and hashlib.sha256(self.evidence_csv(inc.id)).hexdigest() == inc.evidence_sha256
        )
