"""The pipeline's store step with its intake record, against the same stores without it.

The intake record is what keeps the series store, the outbox and the ledger in
agreement after a crash (`monitor/pipeline.py`): the batch is kept in the series
store's transaction until the outbox and the ledger have it. The peer is the
store step as it was before: series store append, then outbox append, with no
record and no release. Same samples, same batch size, same disk, same run.

    python -m bench.pipeline [--samples 200000] [--batch 5000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from monitor.config import build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Sample
from monitor.sinks.lineproto import SampleSerializer, SeriesInfo
from monitor.sinks.outbox import Outbox
from monitor.sinks.store import SeriesStore

SENSORS = 50
T0 = 1_767_225_600.0


def batches(total: int, size: int) -> list[list[Sample]]:
    samples = [Sample(f"s{i % SENSORS:02d}.flow", T0 + i / SENSORS, float(i % 977)) for i in range(total)]
    return [samples[i : i + size] for i in range(0, total, size)]


def timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def peer(work: Path, data: list[list[Sample]]) -> float:
    """Series store append, then outbox append: the store step without an intake record."""
    store = SeriesStore(work / "series.sqlite")
    outbox = Outbox(work / "outbox.sqlite")
    ser = SampleSerializer("bench", {f"s{i:02d}.flow": SeriesInfo("flow", "gpm") for i in range(SENSORS)})

    def run() -> None:
        for batch in data:
            store.append(batch)
            outbox.append(ser.samples(batch))

    try:
        return timed(run)
    finally:
        store.close()
        outbox.close()


def ours(work: Path, data: list[list[Sample]], judge: bool) -> float:
    """The daemon's pipeline: hold, outbox, release (and with `judge`, the engine and alarms)."""
    config = build_config(
        {
            "station": {"id": "bench"},
            "state_dir": str(work),
            "sensors": [{"id": f"s{i:02d}.flow", "kind": "flow", "unit": "gpm"} for i in range(SENSORS)],
            "influx": {"url": "http://127.0.0.1:9", "api": "v1", "database": "bench"},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )
    daemon = Daemon(config, ManualClock(T0))
    pipeline = daemon.pipeline

    def run() -> None:
        for batch in data:
            if judge:
                pipeline.process(batch)
            else:
                b = pipeline._prepare([])  # an empty batch, filled below: the store step only
                b.samples = batch
                pipeline._store(b)

    try:
        return timed(run)
    finally:
        daemon.sink.close()
        daemon.meters.close()
        daemon.alarms.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5000)
    args = parser.parse_args()
    data = batches(args.samples, args.batch)
    with (
        tempfile.TemporaryDirectory() as a,
        tempfile.TemporaryDirectory() as b,
        tempfile.TemporaryDirectory() as c,
    ):
        t_peer = peer(Path(a), data)
        t_store = ours(Path(b), data, judge=False)
        t_all = ours(Path(c), data, judge=True)
    n = args.samples
    print(f"pipeline store step, {n:,} samples in batches of {args.batch:,} ({SENSORS} sensors)")
    print(f"  peer: series store + outbox, no intake record  {n / t_peer:>12,.0f} samples/s")
    print(f"  ours: + intake record held and released       {n / t_store:>12,.0f} samples/s"
          f"   ({t_store / t_peer:.2f}x the peer's time)")  # fmt: skip
    print(f"  ours: store, judge (engine, alarms), whole     {n / t_all:>12,.0f} samples/s")


if __name__ == "__main__":
    main()
