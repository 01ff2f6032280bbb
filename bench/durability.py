"""What `synchronous=FULL` costs the meter ledger and the alarm journal, against NORMAL.

The ledger and the journal are records of money and compliance, so they commit with
`synchronous=FULL` (each commit fsyncs the WAL: it survives a power cut); NORMAL
survives any process crash but may lose the last commits on power loss. The peer is
the same store, same work, same disk, same run, with NORMAL.

    python -m bench.durability [--readings 2000] [--batch 10] [--entries 500]

Ledger: meter readings in `add_many` batches of `--batch` (one transaction each, as the
daemon commits one pipeline batch). Journal: one `append` per transition (as alarms happen).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

from monitor.alarms.journal import Entry, Journal
from monitor.meters.ledger import Ledger
from monitor.meters.totalizer import MeterSpec
from monitor.model import Rule

T0 = 1_780_000_000.0
SPEC = {"m": MeterSpec("m", "ft3", 8, Decimal(1), None)}


def ledger_run(path: Path, sync: str, readings: int, batch: int) -> float:
    ledger = Ledger(path, SPEC)
    ledger._db.execute(f"PRAGMA synchronous={sync}")  # the one knob under test
    start = time.perf_counter()
    for i in range(0, readings, batch):
        ledger.add_many([("m", T0 + (i + j) * 60, Decimal(1000 + i + j)) for j in range(batch)])
    elapsed = time.perf_counter() - start
    ledger.close()
    return elapsed


def journal_run(path: Path, sync: str, entries: int) -> float:
    journal = Journal(path)
    journal._db.execute(f"PRAGMA synchronous={sync}")
    start = time.perf_counter()
    for i in range(entries):
        journal.append(Entry(T0 + i, "outfall.ph", Rule.HIGH, "activated", "unack_active", "high", value=9.5))
    elapsed = time.perf_counter() - start
    journal.close()
    return elapsed


def compare(name: str, unit: str, count: int, run: Callable[[Path, str], float]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-durability-") as tmp:
        full = run(Path(tmp) / "full.sqlite", "FULL")
        normal = run(Path(tmp) / "normal.sqlite", "NORMAL")
    print(
        f"{name:<8} FULL {count / full:>9,.0f} {unit}/s ({full * 1000 / count:.3f} ms each)   "
        f"peer NORMAL {count / normal:>9,.0f} {unit}/s ({normal * 1000 / count:.3f} ms each)   "
        f"ratio FULL/NORMAL {(count / full) / (count / normal):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--entries", type=int, default=500)
    args = parser.parse_args()
    compare("ledger", "readings", args.readings, lambda p, s: ledger_run(p, s, args.readings, args.batch))
    compare("journal", "entries", args.entries, lambda p, s: journal_run(p, s, args.entries))


if __name__ == "__main__":
    main()
