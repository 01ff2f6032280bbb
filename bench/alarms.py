"""Alarm manager throughput: conditions through the ISA-18.2 machine and the journal.

Peer: bare sqlite3 INSERTs of the same number of rows with the same settings (WAL,
synchronous=NORMAL, one autocommit statement per row), the floor the journal's
write-before-apply design sits on. Also the start-up replay rate.
"""

from __future__ import annotations

import sqlite3
import tempfile
import time
from pathlib import Path

from monitor.alarms import AlarmManager, Journal
from monitor.config import Alarms
from monitor.model import Condition, ConditionState, ManualClock, Rule

ALARMS = 200
TRANSITIONS = 20_000


def run_manager(path: Path) -> float:
    clock = ManualClock(1_780_000_000.0)
    manager = AlarmManager(Alarms(chatter_count=1000), Journal(path), clock)
    start = time.perf_counter()
    for i in range(TRANSITIONS):
        sensor = f"s{i % ALARMS}"
        state = ConditionState.ACTIVE if (i // ALARMS) % 2 == 0 else ConditionState.CLEARED
        clock.advance(1)
        manager.apply(Condition(clock.now(), sensor, Rule.HIGH, state, 10.0, 5.0, "§139-15 D(2)"))
    elapsed = time.perf_counter() - start
    manager.close()
    return elapsed


def run_bare(path: Path) -> float:
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE j (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, sensor TEXT, rule TEXT, event TEXT)"
    )
    start = time.perf_counter()
    for i in range(TRANSITIONS):
        db.execute(
            "INSERT INTO j VALUES (NULL, ?, ?, ?, ?)", (float(i), f"s{i % ALARMS}", "high", "activated")
        )
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def run_restore(path: Path) -> float:
    start = time.perf_counter()
    manager = AlarmManager(Alarms(), Journal(path), ManualClock(0))
    elapsed = time.perf_counter() - start
    assert len(manager.alarms()) == ALARMS
    manager.close()
    return elapsed


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ours = run_manager(Path(tmp) / "journal.sqlite")
        peer = run_bare(Path(tmp) / "bare.sqlite")
        restore = run_restore(Path(tmp) / "journal.sqlite")
    print(f"alarm manager: {TRANSITIONS} transitions in {ours:.2f} s = {TRANSITIONS / ours:,.0f}/s")
    print(f"bare sqlite3 insert (peer): {TRANSITIONS} rows in {peer:.2f} s = {TRANSITIONS / peer:,.0f}/s")
    print(f"ratio manager / bare sqlite3: {ours / peer:.2f}x the time")
    print(
        f"restart replay: {TRANSITIONS} journal entries in {restore:.2f} s = {TRANSITIONS / restore:,.0f}/s"
    )


if __name__ == "__main__":
    main()
