"""Station benchmark: the cost of derived sensors and pump statistics on the live path.

A lift station of 10 sensors, 2 of them derived (20 %): station inflow from the
pumped flow and the wet well's rate of level, and a mass loading (mg/L x gpm -> lb/d);
two pumps and the wet well tracked. Seven simulated days at one poll every 10 s.

Times are this process's CPU time (`time.process_time`): the machine is shared, and
wall time would mostly measure the neighbours. Figures from the same run: the live path
with the station parts (derive, judge, track, one sample at a time) and the engine alone
over the same samples (the derived ones given as if measured), their ratio, and the cost
per sample of each part.

    .venv/bin/python bench/station.py [--days 7]   (also printed by bench/engine.py)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.config import Config, build_config
from monitor.engine import Engine
from monitor.model import ManualClock, Sample
from monitor.station import Derivation, StationTracker
from simulators.lift_station import LiftStation

T0 = 1_767_225_600.0
STEP = 10


def station() -> Config:
    raw: dict[str, Any] = {
        "station": {"id": "bench-ps"},
        "sensors": [
            {"id": "ps.level", "kind": "level", "unit": "ft",
             "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6.5, "high": 8, "overflow": 9}},
            {"id": "ps.pump1", "kind": "pump", "pump": {"capacity": "500 gpm", "max_starts_per_hour": 8}},
            {"id": "ps.pump2", "kind": "pump", "pump": {"capacity": "500 gpm", "max_starts_per_hour": 8}},
            {"id": "ps.flow", "kind": "flow", "unit": "gpm", "slug": False},
            {"id": "mill.flow", "kind": "flow", "unit": "gpm"},
            {"id": "mill.oil", "kind": "concentration", "substance": "oil"},
            {"id": "mill.ph", "kind": "ph"},
            {"id": "mill.temp", "kind": "temperature", "unit": "degF"},
            {"id": "ps.inflow", "kind": "derived", "unit": "gpm",
             "expression": "ps.flow + area * rate(ps.level, 60s)", "constants": {"area": "80 ft2"}},
            {"id": "mill.load", "kind": "derived", "unit": "lb/d", "expression": "mill.oil * mill.flow"},
        ],
        "wet_well": {"level": "ps.level", "inflow": "ps.inflow", "weir": {"length": "2 ft"}},
    }  # fmt: skip
    return build_config(raw)


def polls(days: float) -> list[Sample]:
    sim = LiftStation(T0, days=days).run()
    rng = np.random.default_rng(2)
    out: list[Sample] = []
    for i in range(0, sim.level.size, STEP):
        t = float(sim.t[i])
        for sensor, value in sim.values(t).items():
            out.append(Sample(sensor, t, value))
        out.append(Sample("mill.oil", t, float(12.0 + rng.normal(0, 0.5))))
        out.append(Sample("mill.ph", t, float(7.2 + rng.normal(0, 0.1))))
        out.append(Sample("mill.temp", t, float(64.0 + rng.normal(0, 0.5))))
    return out


def live(config: Config, samples: list[Sample], *, derive: bool, track: bool) -> tuple[float, int]:
    """The daemon's per-sample path: (derive), tick, judge, (track). Returns (seconds, samples)."""
    engine = Engine(config.rules, ManualClock())
    derivation = Derivation(config.derived, config.rules) if derive else None
    tracker = StationTracker(config) if track else None
    last = -1.0
    process, tick = engine.process, engine.tick
    feed = derivation.feed if derivation is not None else None
    tracking = tracker.feed if tracker is not None else None

    def judge(x: Sample) -> None:
        nonlocal last
        if x.time != last:
            tick(x.time)
            last = x.time
        process(x)
        if tracking is not None:
            tracking(x)

    start = time.process_time()
    for s in samples:
        if feed is not None:
            for x in feed(s):
                judge(x)
        judge(s)
    made = derivation.flush() if derivation is not None else []
    for x in made:
        judge(x)
    elapsed = time.process_time() - start
    n = len(samples) + (derivation.made if derivation is not None else 0)
    return elapsed, n


def report(days: float, repeat: int = 3) -> None:
    logging.disable(logging.WARNING)
    config = station()
    measured = polls(days)
    # The engine alone over the same stream: derived samples made beforehand, given as measured.
    d = Derivation(config.derived, config.rules)
    premade: list[Sample] = []
    for s in measured:
        premade.extend(d.feed(s))
        premade.append(s)
    premade.extend(d.flush())
    derived_share = 1 - len(measured) / len(premade)
    print(
        f"station: 10 sensors (2 derived), {days:g} days at 1 poll / {STEP} s = {len(premade):,} samples"
        f" ({derived_share:.0%} derived)"
    )
    best = {}
    for name, kwargs, stream in (
        ("engine alone", {"derive": False, "track": False}, premade),
        ("+ derived", {"derive": True, "track": False}, measured),
        ("+ derived + pumps", {"derive": True, "track": True}, measured),
    ):
        runs = [live(config, stream, **kwargs) for _ in range(repeat)]
        secs, n = min(runs)
        best[name] = (secs, n)
    base_s, base_n = best["engine alone"]
    full_s, full_n = best["+ derived + pumps"]
    der_s, der_n = best["+ derived"]
    assert base_n == full_n == der_n, (base_n, der_n, full_n)
    print(f"live path, engine alone (peer):               {base_n / base_s / 1e6:7.3f} M samples/s")
    print(
        f"live path, derived sensors + pump statistics: {full_n / full_s / 1e6:7.3f} M samples/s"
        f" (target >= 0.25; ratio to the engine alone {base_s / full_s:.2f})"
    )
    print(f"cost per sample: derived sensors {(der_s - base_s) / base_n * 1e9:6.0f} ns,"
          f" pump statistics {(full_s - der_s) / base_n * 1e9:6.0f} ns,"
          f" engine {base_s / base_n * 1e9:6.0f} ns")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    report(args.days, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
