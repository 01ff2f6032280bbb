"""Outbox throughput: appends, and end to end into a real VictoriaMetrics, against the direct peer.

The peer is influxdb-client's fastest path: the same pre-serialised line
protocol joined into one body per batch, written synchronously with no outbox.
Both write the same points (under different station tags, so the series do
not collide) to the same VictoriaMetrics, started here, in the same run.

    python -m bench.outbox [--points 500000] [--batch 5000]

Targets (issue 6): appends >= 200 k points/s; end to end >= 0.5x direct.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from monitor.config import Influx
from monitor.model import Sample
from monitor.sinks.drain import Drainer
from monitor.sinks.influx import InfluxV2Writer
from monitor.sinks.lineproto import SampleSerializer, SeriesInfo
from monitor.sinks.outbox import Outbox
from tests.services import VictoriaMetrics

SENSORS = 200
T0 = 1_700_000_000.0


def make_samples(points: int) -> list[Sample]:
    per_sensor = points // SENSORS
    return [
        Sample(f"s{j:03d}.flow", T0 + i, 100.0 + (i * 7 + j) % 1000 / 7.0)
        for i in range(per_sensor)
        for j in range(SENSORS)
    ]


def serialise(station: str, samples: list[Sample]) -> list[str]:
    series = {f"s{j:03d}.flow": SeriesInfo("flow", "gpm") for j in range(SENSORS)}
    return SampleSerializer(station, series).samples(samples)


def direct(url: str, lines: list[str], batch: int) -> float:
    """The peer: influxdb-client, joined line protocol per batch; returns seconds."""
    writer = InfluxV2Writer(Influx(url=url, org="bench", bucket="direct", batch_size=batch))
    start = time.perf_counter()
    for i in range(0, len(lines), batch):
        writer.write("\n".join(lines[i : i + batch]).encode())
    elapsed = time.perf_counter() - start
    writer.close()
    return elapsed


def through_outbox(url: str, lines: list[str], batch: int, path: Path) -> tuple[float, float]:
    """Append in `batch`-row transactions while the drainer runs, as in the daemon.

    Returns (seconds the appends took, seconds until the last point was acknowledged).
    """
    outbox = Outbox(path)
    writer = InfluxV2Writer(Influx(url=url, org="bench", bucket="outbox", batch_size=batch))
    drainer = Drainer(outbox, writer, batch_size=batch, flush_interval=0.005)

    async def run() -> tuple[float, float]:
        start = time.perf_counter()
        task = asyncio.create_task(drainer.run())
        for i in range(0, len(lines), batch):
            outbox.append(lines[i : i + batch])
            await asyncio.sleep(0)  # let the drainer take its turn between transactions
        appended = time.perf_counter()
        while outbox.pending:
            await asyncio.sleep(0.001)
        done = time.perf_counter()
        drainer.stop()
        await task
        return appended - start, done - start

    append_s, total_s = asyncio.run(run())
    assert outbox.pending == 0 and drainer.stats.written == len(lines)
    drainer.close()
    outbox.close()
    return append_s, total_s


def append_only(lines: list[str], batch: int, path: Path) -> float:
    """Appends alone, nothing draining; returns seconds."""
    outbox = Outbox(path)
    start = time.perf_counter()
    for i in range(0, len(lines), batch):
        outbox.append(lines[i : i + batch])
    elapsed = time.perf_counter() - start
    outbox.close()
    return elapsed


def backlog(url: str, path: Path, batch: int, points: int) -> float:
    """Drain the backlog `append_only` left (catching up after an outage); returns seconds."""
    outbox = Outbox(path)
    writer = InfluxV2Writer(Influx(url=url, org="bench", bucket="backlog", batch_size=batch))
    drainer = Drainer(outbox, writer, batch_size=batch)
    start = time.perf_counter()
    left = asyncio.run(drainer.drain(600))
    elapsed = time.perf_counter() - start
    assert left == 0 and drainer.stats.written == points
    drainer.close()
    outbox.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument(
        "--rounds", type=int, default=3, help="best of N, interleaved (the machine is shared)"
    )
    args = parser.parse_args()
    samples = make_samples(args.points)
    n = len(samples)
    start = time.perf_counter()
    lines = {name: serialise(f"bench-{name}", samples) for name in ("direct", "outbox", "backlog")}
    serialise_s = (time.perf_counter() - start) / 3
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, seconds), seconds)

    with tempfile.TemporaryDirectory() as tmp:
        vm = VictoriaMetrics(Path(tmp) / "vm")
        vm.start()
        try:
            direct(vm.url, lines["direct"][: args.batch * 4], args.batch)  # warm-up
            for r in range(args.rounds):
                keep("direct", direct(vm.url, lines["direct"], args.batch))
                keep("append", append_only(lines["backlog"], args.batch, Path(tmp) / f"backlog{r}.sqlite"))
                keep("backlog", backlog(vm.url, Path(tmp) / f"backlog{r}.sqlite", args.batch, n))
                concurrent, e2e = through_outbox(
                    vm.url, lines["outbox"], args.batch, Path(tmp) / f"o{r}.sqlite"
                )
                keep("concurrent", concurrent)
                keep("e2e", e2e)
        finally:
            vm.stop()
    peer = n / best["direct"]
    print(
        f"points                    {n:,} ({SENSORS} sensors),"
        f" batches of {args.batch:,}, best of {args.rounds}"
    )
    print(f"serialise (Sample -> LP)  {n / serialise_s:12,.0f} points/s")
    print(f"outbox append (WAL, FULL) {n / best['append']:12,.0f} points/s   target >= 200,000")
    print(f"outbox append, draining   {n / best['concurrent']:12,.0f} points/s")
    print(
        f"backlog drain -> VM       {n / best['backlog']:12,.0f} points/s"
        f"   {n / best['backlog'] / peer:.2f}x direct"
    )
    print(
        f"end to end -> VM          {n / best['e2e']:12,.0f} points/s   {n / best['e2e'] / peer:.2f}x direct"
    )
    print("  (first append to last acknowledgement, appends and drain running together)")
    print(f"direct influxdb-client    {peer:12,.0f} points/s   (peer: joined LP per batch, no outbox)")


if __name__ == "__main__":
    main()
