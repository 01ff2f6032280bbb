"""Meter ledger throughput and the cost of a quarterly export.

Measures, in the same run:
- readings/s through `MeterBook.ingest` (every reading judged, stored with its verdict,
  one transaction per batch) for live-sized batches (one poll cycle of all meters) and
  replay-sized batches;
- the peer: the same rows inserted with plain `sqlite3.executemany` into an equivalent
  WAL table with no judging at all (the storage floor), and the ratio;
- `billing export` of one quarter from the ledger.

    python -m bench.meters [--meters 50] [--days 92]

The daemon needs a few readings per second per meter at most, so the point is the margin.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from monitor.config import build_config
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook
from monitor.model import Sample, parse_time

T0 = parse_time("2026-06-30T23:00:00Z")


def config_for(meters: int, state: Path) -> dict[str, object]:
    return {
        "station": {"id": "bench"},
        "state_dir": str(state),
        "sensors": [
            {
                "id": f"m{i:03d}",
                "kind": "meter",
                "unit": "ft3",
                "register_digits": 6,
                "account": f"a{i:03d}",
                "max_rate": 1000,
            }
            for i in range(meters)
        ],
        "billing": {"rate_per_kcf": "4.25", "accounts": [{"id": f"a{i:03d}"} for i in range(meters)]},
    }


def readings(meters: int, hours: int) -> list[list[Sample]]:
    """One list per hour: a poll cycle of every meter."""
    return [
        [
            Sample(f"m{i:03d}", T0 + h * 3600.0, float((i * 1000 + h * (100 + i)) % 1_000_000))
            for i in range(meters)
        ]
        for h in range(hours)
    ]


def bench_book(meters: int, cycles: list[list[Sample]], state: Path, batch_cycles: int) -> float:
    config = build_config(config_for(meters, state))
    book = MeterBook.open(config)
    started = time.perf_counter()
    for i in range(0, len(cycles), batch_cycles):
        book.ingest([s for cycle in cycles[i : i + batch_cycles] for s in cycle])
    elapsed = time.perf_counter() - started
    book.close()
    return elapsed


def bench_sqlite(cycles: list[list[Sample]], path: Path, batch_cycles: int) -> float:
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE readings (meter TEXT, time_ms INTEGER, seq INTEGER, reading TEXT, accepted INTEGER,"
        " counts TEXT, volume TEXT, flags TEXT, message TEXT, lim TEXT, PRIMARY KEY (meter, time_ms, seq))"
        " WITHOUT ROWID"
    )
    started = time.perf_counter()
    for i in range(0, len(cycles), batch_cycles):
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO readings VALUES (?, ?, 0, ?, 1, '0', '0', '', '', '')",
            [
                (s.sensor, round(s.time * 1000), repr(s.value))
                for c in cycles[i : i + batch_cycles]
                for s in c
            ],
        )
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meters", type=int, default=50)
    parser.add_argument("--days", type=int, default=92)
    args = parser.parse_args()
    cycles = readings(args.meters, args.days * 24 + 2)
    n = sum(len(c) for c in cycles)
    print(f"{args.meters} meters x {len(cycles)} hourly readings = {n} readings")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for label, batch in (
            ("live (one poll cycle per transaction)", 1),
            ("replay (1,000 cycles per batch)", 1000),
        ):
            book_s = bench_book(args.meters, cycles, root / f"book-{batch}", batch)
            peer_s = bench_sqlite(cycles, root / f"peer-{batch}.sqlite", batch)
            print(
                f"{label}: ledger {n / book_s:,.0f} readings/s,"
                f" plain sqlite3 executemany {n / peer_s:,.0f} rows/s, ratio {peer_s / book_s:.2f}"
            )
        config = build_config(config_for(args.meters, root / "book-1000"))
        book = MeterBook.open(config)
        started = time.perf_counter()
        rows = export_rows(config, book.ledger, quarter("2026Q3"))
        elapsed = time.perf_counter() - started
        book.close()
        print(f"export 2026Q3: {len(rows)} rows in {elapsed * 1000:.0f} ms")


if __name__ == "__main__":
    main()
