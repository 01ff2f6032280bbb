"""The acknowledge-link table's index: the run-time persist (`CalloutStore.serve`, every 10 s
while a callout runs) touches the live links only, not every link ever handed out.

See `monitor.callout.store` and docs/callout.md.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest

from monitor.callout.store import STORE_SCHEMA, CalloutStore
from monitor.sqlite import Schema, connect
from tests.conftest import fill_disk

TTL = 86_400.0
SERVE = "UPDATE link SET age = age + ? WHERE used_at IS NULL AND age < ?"  # as `serve` does


def links(path: Path, spent: int, live: int) -> None:
    """`spent` links used or aged past the TTL (a station's years of pages) and `live` ones."""
    db = sqlite3.connect(path)
    rows = [
        (f"n{i}", 1, "ann", 1e9, 1e9 if i % 2 else None, TTL if i % 2 == 0 else 0.0) for i in range(spent)
    ]
    rows += [(f"l{i}", 2, "bob", 2e9, None, 60.0) for i in range(live)]
    db.executemany(
        "INSERT INTO link (nonce, escalation, person, expires, used_at, age) VALUES (?,?,?,?,?,?)", rows
    )
    db.commit()
    db.close()


def plan(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        return " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {SERVE}", (10.0, TTL)))
    finally:
        db.close()


def test_the_run_time_persist_reads_the_live_links_by_an_index(tmp_path: Path) -> None:
    """100,000 links spent or expired and 3 live: before, the persist scanned the whole table
    (`SCAN link`, 50 ms a persist measured); now it searches an index of the unspent links by
    age and touches the 3. The ages move as before."""
    path = tmp_path / "callout.sqlite"
    CalloutStore(path).close()
    links(path, 100_000, 3)
    store = CalloutStore(path)
    try:
        assert "SEARCH link USING INDEX link_live" in plan(path), plan(path)
        store.serve(10.0, TTL)
        assert store.link("l0") is not None and store.link("l0").age == 70.0  # type: ignore[union-attr]
        assert store.link("n0").age == TTL  # type: ignore[union-attr]  # expired: not aged
    finally:
        store.close()


def test_a_file_the_last_release_wrote_gains_the_index_and_the_last_release_still_opens_it(
    tmp_path: Path,
) -> None:
    """The index is made when the store is opened (CREATE INDEX IF NOT EXISTS), not by a schema
    version: a file of the last release (schema 3, no index) gains it, and keeps version 3, so
    the last release (which refuses a newer version) still opens it after a downgrade; its
    writes keep the index up to date (SQLite maintains every index on a table)."""
    path = tmp_path / "callout.sqlite"
    last = Schema("callout store", STORE_SCHEMA.migrations)
    connect(path, last).close()
    links(path, 10, 1)
    store = CalloutStore(path)
    store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(last.migrations)
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")]
        assert "link_live" in names, names
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()
    connect(path, last).close()  # the last release's open: no "written by a newer station-monitor"


def test_a_nearly_full_disk_at_the_first_open_after_the_upgrade_opens_the_store_without_the_index(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first start after the upgrade finds the state disk nearly full (a real tmpfs, 160 KB
    left: the daemon's disk-full alarm territory, where it still starts and stops intake) and a
    file of the last release with 20,000 links never used (people acknowledge on the console).
    The last release opens it there; making the index is a write larger than the room left
    (SQLITE_FULL), and the callout store, so the daemon, did not open. The index is a speed-up:
    the store opens without it (said once), works, and the next open with room gains it."""
    path = tiny_disk / "callout.sqlite"
    last = Schema("callout store", STORE_SCHEMA.migrations)
    connect(path, last).close()
    links(path, 0, 20_000)
    ballast = fill_disk(tiny_disk)
    os.truncate(ballast, ballast.stat().st_size - 160 * 1024)
    connect(path, last).close()  # the last release opens it on this disk
    with caplog.at_level(logging.WARNING):
        store = CalloutStore(path)
    try:
        assert store.link("l0") is not None
        assert "SCAN link" in plan(path), plan(path)
        (said,) = [r.getMessage() for r in caplog.records if "link_live" in r.getMessage()]
        assert "without it" in said, said
    finally:
        store.close()
    ballast.unlink()
    CalloutStore(path).close()
    assert "SEARCH link USING INDEX link_live" in plan(path), plan(path)
