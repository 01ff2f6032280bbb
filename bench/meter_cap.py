"""The cost of offering held meter points to an outbox at its cap.

A daemon (real pipeline, ledger and outbox; no InfluxDB listening) reads a meter while
InfluxDB is down until the outbox is at its 64 KiB cap with meter points alone and the
ledger keeps the rest marked. Then the outbox drains slowly: each round one delivery of
`--drain` points is settled (as the drainer does once InfluxDB acknowledged it) and the
timer's offer (`Pipeline.send_meter_points`) runs. Printed: the time of an offer, median
and worst, and the points it moved (an offer that reads more of the ledger than the outbox
can take shows here as time spent for nothing), and the time of a health snapshot, which
counts the points held back.

    python -m bench.meter_cap [--marked 20000] [--drain 10] [--rounds 50]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from monitor.config import build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Sample, parse_time

T0 = parse_time("2026-04-01T00:00:00Z")
METER = "shop.meter"


def capped(state: Path) -> dict[str, object]:
    return {
        "station": {"id": "bench-cap", "timezone": "UTC"},
        "state_dir": str(state),
        "sensors": [{"id": METER, "kind": "meter", "unit": "ft3", "register_digits": 9, "account": "shop"}],
        "influx": {"url": "http://127.0.0.1:9", "api": "v1", "database": "plant", "outbox_max_bytes": 65536},
        "billing": {"rate_per_kcf": "4.25", "accounts": [{"id": "shop", "class": "commercial"}]},
        "console": {"enabled": False},
        "store": {"free_space_floor": 0},
    }


def marks(ledger: sqlite3.Connection) -> int:
    """Points marked for InfluxDB, counted beside the daemon (not part of the figure)."""
    return int(ledger.execute("SELECT count(*) FROM unsent").fetchone()[0])


def run(marked: int, drain: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wall = ManualClock(T0)
        daemon = Daemon(build_config(capped(Path(tmp) / "state")), wall)
        try:
            outbox = daemon.sink.outbox
            assert outbox is not None
            for b in range(0, marked, 500):  # a meter read each minute while InfluxDB is down
                wall.set(T0 + 60 * (b + 499))
                daemon.pipeline.process(
                    [Sample(METER, T0 + 60 * i, 1000.0 + 7 * i) for i in range(b, min(marked, b + 500))]
                )
            daemon.pipeline.process_queued()  # the cap alarm's conditions, queued
            ledger = sqlite3.connect(Path(tmp) / "state" / "ledger.sqlite")
            left = marks(ledger)
            size = outbox.stats().pending_bytes
            print(f"{marked} readings; outbox {size} bytes, {left} marked in the ledger")
            times: list[float] = []
            moved = 0
            for _ in range(rounds):
                batch = outbox.peek(drain)
                if batch is not None:
                    outbox.settle(batch)  # a slow delivery: a few points' room
                daemon.pipeline.process_queued()
                before = marks(ledger)
                started = time.perf_counter()
                daemon.pipeline.send_meter_points()
                times.append(time.perf_counter() - started)
                moved += before - marks(ledger)
            ledger.close()
            started = time.perf_counter()
            held = daemon.health().meters.held_back
            asked = time.perf_counter() - started
            print(
                f"offer at the cap ({drain} points delivered before each): median"
                f" {statistics.median(times) * 1000:.1f} ms, worst {max(times) * 1000:.1f} ms;"
                f" {moved} points moved in {rounds} offers"
            )
            print(f"/api/health with {held} points held back: {asked * 1000:.1f} ms")
        finally:
            daemon.sink.close()
            daemon.meters.close()
            daemon.alarms.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marked", type=int, default=20_000, help="meter readings while InfluxDB is down")
    parser.add_argument("--drain", type=int, default=10, help="points delivered before each offer")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    run(args.marked, args.drain, args.rounds)


if __name__ == "__main__":
    main()
