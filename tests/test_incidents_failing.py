"""An incident store that fails, in the running station (issue 16 records are what the
Superintendent acts on): one incident's damaged evidence marks that incident and the
others go on; a store that fails as a whole raises the `incident_store` diagnostic alarm,
cleared when recording works again. Faults are real: a block's bytes changed in the file
by another connection, a real full file system (tmpfs) under the store."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.daemon import Daemon
from monitor.model import Rule, Sample
from monitor.web.station import StationAdapter
from tests.console import call
from tests.incident_helpers import close_daemon, feed, load, monitor, run_live

T0 = 1_780_000_000.0


def two_oil_sensors(tmp_path: Path, state: Path | None = None) -> Path:
    """Two oil sensors judged by their limit only, each its own incidents."""
    raw = tmp_path / "station.yaml"
    raw.write_text(
        f"station: {{id: ps-1}}\nstate_dir: {state or tmp_path / 'state'}\nconsole: {{enabled: false}}\n"
        "sensors:\n"
        "  - {id: a.oil, kind: concentration, substance: oil, slug: false, stale_after: 10m}\n"
        "  - {id: b.oil, kind: concentration, substance: oil, slug: false, stale_after: 10m}\n",
        encoding="utf-8",
    )
    return raw


def readings(minutes: range) -> list[Sample]:
    """a.oil over its limit in minutes 60-69, b.oil in minutes 120-129, 20 mg/L otherwise."""
    out = []
    for m in minutes:
        out.append(Sample("a.oil", T0 + 60 * m, 150.0 if 60 <= m < 70 else 20.0))
        out.append(Sample("b.oil", T0 + 60 * m, 150.0 if 120 <= m < 130 else 20.0))
    return out


def blocks(state: Path, iid: str) -> list[tuple[int, float, float, int]]:
    """(rowid, first, last, bytes of t) of each of the incident's blocks, read by a connection
    of the test's own."""
    db = sqlite3.connect(state / "incidents.sqlite")
    try:
        rows = db.execute(
            "SELECT rowid, first, last, length(t) FROM evidence_block WHERE incident = ? ORDER BY rowid",
            (iid,),
        ).fetchall()
    finally:
        db.close()
    return [(int(r), float(f), float(la), int(n)) for r, f, la, n in rows]


def test_a_damaged_evidence_block_marks_its_incident_and_the_others_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """a.oil's incident is open when its evidence block is damaged in the file (its grid of
    times cut to 15 bytes, as a bad disk or a bad restore would): the next batches still record
    b.oil's incident to the end (frozen, its figures whole), a.oil's is marked "evidence
    incomplete from T" (logged once) with the figures it had, its later samples in a new block
    of their own (the damaged one left as it is), ended and not frozen; after a restart the
    same, no crash, and `incidents show` prints the mark. Before, every batch failed as a
    whole: b.oil's incident was never recorded."""
    config = load(two_oil_sensors(tmp_path))
    state = tmp_path / "state"
    data = readings(range(0, 300))
    daemon = run_live(config, data[: 2 * 66])  # a.oil's incident open since minute 60
    try:
        assert daemon.incidents is not None
        (a,) = daemon.incidents.incidents()
        assert a.sensor == "a.oil" and a.end is None
        (damaged, first, last, _) = blocks(state, a.id)[-1]
        db = sqlite3.connect(state / "incidents.sqlite")
        db.execute("UPDATE evidence_block SET t = substr(t, 1, 15) WHERE rowid = ?", (damaged,))
        db.commit()
        db.close()
        before = daemon.incidents.store.get(a.id)
        assert before is not None

        with caplog.at_level(logging.ERROR):
            feed(daemon, data[2 * 66 :])
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not [e for e in errors if e.startswith("incidents not recorded")], errors
        marked = [e for e in errors if "evidence incomplete" in e and "ended" not in e]
        assert len(marked) == 1 and a.id in marked[0] and "a grid of times is 16 bytes, not 15" in marked[0]

        got = {i.sensor: i for i in daemon.incidents.incidents()}
        b = got["b.oil"]
        assert b.frozen and b.evidence_broken is None and b.end == T0 + 60 * 130
        assert b.figures.samples == 11 and b.figures.peak_value == 150.0
        a = got["a.oil"]
        assert a.end == T0 + 60 * 70 and not a.frozen and a.evidence_sha256 is None
        assert a.evidence_broken_at == first == T0  # the damaged block's first sample
        assert a.evidence_note is not None and a.evidence_note.startswith(
            "evidence incomplete from 2026-05-28T20:26:40Z: incident store"
        )
        assert a.figures == before.figures  # never numbers from part of the evidence
        assert a.id not in daemon.incidents.live  # no longer holding the buffer
        after = blocks(state, a.id)
        assert after[0] == (damaged, first, last, 15)  # left as it was
        assert len(after) == 2 and after[1][2] == T0 + 60 * 130  # the rest, to 1 h past the end
        assert daemon.incidents.evidence_incomplete == 1
        health = daemon.health().to_json()["incidents"]
        assert isinstance(health, dict) and health["evidence_incomplete"] == 1
    finally:
        close_daemon(daemon)

    again = Daemon(config, daemon.clock)  # restored: tried once more, still not frozen, no crash
    try:
        feed(again, readings(range(300, 320)))
        assert again.incidents is not None
        (a2,) = [i for i in again.incidents.incidents() if i.sensor == "a.oil"]
        assert not a2.frozen and a2.evidence_broken_at == T0
    finally:
        close_daemon(again)
    shown = monitor("incidents", "show", "--config", str(tmp_path / "station.yaml"), "--id", a.id)
    assert "EVIDENCE     evidence incomplete from" in shown.stdout, shown.stdout + shown.stderr
    assert "Traceback" not in shown.stderr
