"""What incident records cost the pipeline: the tracker beside the engine, live and replay.

Measures, in the same run:
- live path, as the daemon runs it: each batch (one sample per sensor) committed to the
  series store and judged by `Engine.process` (the peer), then the same plus
  `IncidentTracker.observe` reading its look back from that store; samples/s of both and
  the ratio;
- replay path: `Engine.replay` (the peer), then the same plus the tracker fed the step's
  columns; samples/s of both and the ratio;
- the recent-sample buffer the tracker keeps per sensor after the run: live the qualifying
  run plus half an hour (the day before comes from the store), replay the whole day.

The data: `--sensors` flow sensors at one sample per `--step` s for 26 h; one of them
slugs (10x) for an hour at hour 22, which opens, ends and freezes one incident.

    .venv/bin/python -m bench.incidents [--sensors 20] [--step 10]
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import Config, build_config
from monitor.engine import Engine
from monitor.incidents import IncidentTracker
from monitor.model import ManualClock, Quality, Sample
from monitor.sinks.store import SeriesStore

T0 = 1_780_000_000.0
HOURS = 26


def station(n: int, state: Path) -> Config:
    sensors = [{"id": f"f{i:03d}", "kind": "flow", "unit": "gpm", "stale_after": "10m"} for i in range(n)]
    return build_config({"station": {"id": "bench"}, "state_dir": str(state), "sensors": sensors})


def data(n: int, step: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    times = T0 + step * np.arange(int(HOURS * 3600 / step))
    sensor = np.tile(np.arange(n), times.size)
    t = np.repeat(times, n)
    v = 100.0 + 5.0 * np.sin(2 * math.pi * t / 86400.0) + 0.1 * (sensor % 7)
    slug = (sensor == 0) & (t >= T0 + 22 * 3600) & (t < T0 + 23 * 3600)
    v = np.where(slug, 1000.0, v)
    return sensor, t, v


def live(
    config: Config, sensor: np.ndarray, t: np.ndarray, v: np.ndarray, n: int, track: bool
) -> tuple[float, int]:
    """As the daemon does it: store the batch (series store), judge it, then the tracker."""
    engine = Engine(config.rules, ManualClock())
    store = SeriesStore(config.state_dir / "series.sqlite")
    tracker = IncidentTracker(config, history=store.query) if track else None
    names = engine.sensors
    samples = [
        Sample(names[i], ti, vi) for i, ti, vi in zip(sensor.tolist(), t.tolist(), v.tolist(), strict=True)
    ]
    started = time.perf_counter()
    for k in range(0, len(samples), n):
        batch = samples[k : k + n]
        store.append(batch)
        conditions = []
        for s in batch:
            conditions.extend(engine.process(s))
        if tracker is not None:
            tracker.observe(batch, conditions)
    elapsed = time.perf_counter() - started
    found = 0
    if tracker is not None:
        found = len(tracker.incidents())
        buffer = sum(r.nbytes for r in tracker.recent.values()) / len(tracker.recent)
        print(f"live: recent-sample buffer after 26 h: {buffer / 1e3:.1f} KB per sensor (capacity)")
        tracker.close()
    store.close()
    return elapsed, found


def replay(
    config: Config, sensor: np.ndarray, t: np.ndarray, v: np.ndarray, track: bool
) -> tuple[float, int]:
    engine = Engine(config.rules, ManualClock())
    tracker = IncidentTracker(config) if track else None
    q = np.full(t.size, int(Quality.GOOD), np.int8)
    started = time.perf_counter()
    result = engine.replay(sensor, t, v, q)
    if tracker is not None:
        tracker.add_columns(engine.sensors, sensor, t, v, result.quality, result.accepted)
        tracker.apply(result.conditions)
        tracker.advance(final=True)
    elapsed = time.perf_counter() - started
    found = 0
    if tracker is not None:
        found = len(tracker.incidents())
        buffer = sum(r.nbytes for r in tracker.recent.values()) / len(tracker.recent)
        print(f"replay: recent-sample buffer after 26 h: {buffer / 1e3:.1f} KB per sensor (capacity)")
        tracker.close()
    return elapsed, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=20)
    parser.add_argument("--step", type=float, default=10.0, help="seconds between samples of a sensor")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    sensor, t, v = data(args.sensors, args.step)
    n = int(t.size)
    print(f"data: {args.sensors} flow sensors x {HOURS} h at 1 sample / {args.step:g} s = {n:,} samples")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        peer, _ = live(station(args.sensors, root / "a"), sensor, t, v, args.sensors, track=False)
        ours, found = live(station(args.sensors, root / "b"), sensor, t, v, args.sensors, track=True)
        print(
            f"live path: engine alone {n / peer:,.0f} samples/s,"
            f" engine + incidents {n / ours:,.0f} samples/s, ratio {peer / ours:.2f} ({found} incident)"
        )
        peer, _ = replay(station(args.sensors, root / "c"), sensor, t, v, track=False)
        ours, found = replay(station(args.sensors, root / "d"), sensor, t, v, track=True)
        print(
            f"replay path: engine alone {n / peer:,.0f} samples/s,"
            f" engine + incidents {n / ours:,.0f} samples/s, ratio {peer / ours:.2f} ({found} incident)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
