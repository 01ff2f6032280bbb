"""A two-pump constant-speed lift station, simulated second by second, with its own counts.

The wet well's level follows inflow minus pumping (level += (Qin - Qout) / area dt);
the lead pump starts at `lead_on`, the lag pump at `lag_on`, both stop at `off`, and
the lead alternates every cycle. Above the overflow crest the well spills over a weir
(Francis: Q = 3.33 L H^1.5 cfs). Inflow is a diurnal domestic flow plus an industrial
discharger's flow (`mill.flow`); scenarios add a storm that overflows, a pump that fails
to start, and a slug in the discharger's flow.

Unlike `scenarios.Station` (a pure function of time) the wet well has memory, so
`LiftStation.run()` integrates the whole horizon once (1 s steps) and then answers
`values(t)` for any moment, and keeps the simulator's own figures (`truth`): run
seconds and starts per pump, overflow volume, fail-to-start moments. Tests replay
its samples and compare the monitor's figures with these.

    python -m simulators.lift_station --days 7 --out station.csv --truth truth.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from simulators.modbus_server import StationServer, encode
from simulators.scenarios import Station

GALLONS_PER_FT3 = 7.480519480519481
GPM_PER_CFS = GALLONS_PER_FT3 * 60.0
DAY = 86400.0
# Sensor ids of the example config (config/station.example.yaml, docs/station.md).
LEVEL, PUMP1, PUMP2, FLOW, MILL = "ps.level", "ps.pump1", "ps.pump2", "ps.flow", "mill.flow"


@dataclass
class Truth:
    """What really happened, by the simulator's own count."""

    run_seconds: dict[str, float] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    overflow_gal: float = 0.0
    overflows: list[tuple[float, float]] = field(default_factory=list)
    # (start, end) of each time the level stood above lead_on with no pump running
    fail_to_start: list[tuple[float, float]] = field(default_factory=list)
    slug: tuple[float, float] | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "run_hours": {p: s / 3600.0 for p, s in self.run_seconds.items()},
            "starts": self.starts,
            "overflow_gal": self.overflow_gal,
            "overflows": self.overflows,
            "fail_to_start": self.fail_to_start,
            "slug": self.slug,
        }


@dataclass
class LiftStation:
    start: float  # epoch seconds of the first step
    days: float = 7.0
    seed: int = 1
    area_ft2: float = 80.0
    off: float = 2.0
    lead_on: float = 5.0
    lag_on: float = 6.5
    overflow: float = 9.0
    pump_gpm: float = 500.0
    weir_length_ft: float = 2.0
    weir_c: float = 3.33
    domestic_gpm: float = 200.0  # daily mean of the domestic part
    mill_gpm: float = 50.0  # daily mean of the discharger
    storm: tuple[float, float, float] | None = (2.4 * DAY, 4 * 3600.0, 1150.0)  # start, length, peak gpm
    failure: tuple[float, float] | None = (1.4 * DAY, 8 * 3600.0)  # pump1 does not start
    slug: tuple[float, float, float] | None = (4.3 * DAY, 40 * 60.0, 8.0)  # mill flow x factor
    level_noise_ft: float = 0.005
    truth: Truth = field(default_factory=Truth)

    def run(self) -> LiftStation:
        n = int(self.days * DAY)
        t = self.start + np.arange(n, dtype=np.float64)
        el = t - self.start
        rng = np.random.default_rng(self.seed)
        hours = (t % DAY) / 3600.0
        diurnal = (
            1.0
            + 0.38 * np.cos(2 * math.pi * (hours - 13.0) / 24.0)
            + 0.22 * np.cos(4 * math.pi * (hours - 9.0) / 24.0)
        )
        domestic = self.domestic_gpm * diurnal * (1.0 + 0.03 * np.sin(el / 5400.0))
        mill = self.mill_gpm * (0.8 + 0.4 * (hours > 7) * (hours < 19)) / 0.92
        if self.slug is not None:
            s0, length, factor = self.slug
            mill = np.where((el >= s0) & (el < s0 + length), mill * factor, mill)
            self.truth.slug = (self.start + s0, self.start + s0 + length)
        storm = np.zeros(n)
        if self.storm is not None:
            s0, length, peak = self.storm
            x = (el - s0) / length
            inside = (x >= 0) & (x < 1)
            storm[inside] = np.sin(math.pi * x[inside]) ** 0.5 * (peak - self.domestic_gpm)
        self.inflow = domestic + mill + storm
        self.mill = mill
        self._integrate(n, el)
        self.t = t
        self.level_read = self.level + rng.normal(0.0, self.level_noise_ft, n)
        return self

    def _integrate(self, n: int, el: npt.NDArray[np.float64]) -> None:
        """The wet well, one second at a time."""
        level = np.empty(n)
        p1 = np.zeros(n, dtype=np.int8)
        p2 = np.zeros(n, dtype=np.int8)
        spill = np.zeros(n)
        h = self.off + 1.0
        on = [False, False]
        lead = 0
        calling = 0  # pumps called: 0, 1 (lead), 2 (lead and lag)
        fail0, fail1 = self.failure if self.failure is not None else (math.inf, 0.0)
        runs = [0.0, 0.0]
        starts = [0, 0]
        overflow_gal = 0.0
        in_overflow = False
        over_start = 0.0
        idle_since: float | None = None
        per_ft = 1.0 / (self.area_ft2 * GPM_PER_CFS)  # ft per second per gpm
        inflow = self.inflow.tolist()
        elapsed = el.tolist()
        t0 = self.start
        for i in range(n):
            e = elapsed[i]
            if h >= self.lead_on and calling == 0:
                calling = 1
            if h >= self.lag_on and calling == 1:
                calling = 2
            if h <= self.off and calling:
                calling = 0
                lead = 1 - lead
            want = [False, False]
            if calling >= 1:
                want[lead] = True
            if calling == 2:
                want[1 - lead] = True
            if fail0 <= e < fail0 + fail1:
                want[0] = False
            for k in (0, 1):
                if want[k] and not on[k]:
                    starts[k] += 1
                on[k] = want[k]
                if on[k]:
                    runs[k] += 1.0
            head = h - self.overflow
            q_spill = self.weir_c * self.weir_length_ft * head**1.5 * GPM_PER_CFS if head > 0 else 0.0
            if head > 0 and not in_overflow:
                in_overflow, over_start = True, t0 + e
            elif head <= 0 and in_overflow:
                in_overflow = False
                self.truth.overflows.append((over_start, t0 + e))
            overflow_gal += q_spill / 60.0
            idle = h > self.lead_on and not (on[0] or on[1])
            if idle and idle_since is None:
                idle_since = t0 + e
            elif not idle and idle_since is not None:
                self.truth.fail_to_start.append((idle_since, t0 + e))
                idle_since = None
            pumped = self.pump_gpm * (on[0] + on[1])
            level[i] = h
            p1[i], p2[i] = on[0], on[1]
            spill[i] = q_spill
            h = max(0.0, h + (inflow[i] - pumped - q_spill) * per_ft)
        self.level, self.p1, self.p2, self.spill = level, p1, p2, spill
        self.truth.run_seconds = {PUMP1: runs[0], PUMP2: runs[1]}
        self.truth.starts = {PUMP1: starts[0], PUMP2: starts[1]}
        self.truth.overflow_gal = overflow_gal

    def values(self, t: float) -> dict[str, float]:
        """What the instruments read at `t` (the step at or before it)."""
        i = min(max(int(t - self.start), 0), self.level.size - 1)
        return {
            LEVEL: round(float(self.level_read[i]), 3),
            PUMP1: float(self.p1[i]),
            PUMP2: float(self.p2[i]),
            FLOW: self.pump_gpm * float(self.p1[i] + self.p2[i]),
            MILL: round(float(self.mill[i]), 2),
        }

    def write_csv(self, path: Path, interval: float = 10.0) -> int:
        """Samples every `interval` seconds as a replay CSV (time,sensor,value); returns rows."""
        rows = 0
        with path.open("w", encoding="utf-8") as out:
            out.write("time,sensor,value\n")
            step = max(1, int(interval))
            for i in range(0, self.level.size, step):
                t = float(self.t[i])
                for sensor, value in self.values(t).items():
                    out.write(f"{t:.0f},{sensor},{value:g}\n")
                    rows += 1
        return rows


# The lift station's register map (`LiftServer`, and the modbus section of docs/station.md's example):
#   holding 0  FLOAT32  level, ft        holding 2  FLOAT32  force-main flow, gpm
#   holding 4  FLOAT32  mill flow, gpm   holding 6  UINT16   bit 0 pump 1, bit 1 pump 2 (run feedback)
#   coil 0     pump 1 running            discrete 0  pump 2 running
LIFT_MAP: tuple[tuple[int, str], ...] = ((0, LEVEL), (2, FLOW), (4, MILL))


def lift_server(sim: LiftStation, port: int, clock: Callable[[], float]) -> StationServer:
    """The simulated station as a Modbus TCP server (pymodbus), read-only, on `clock`'s time."""

    class LiftServer(StationServer):
        def _image(self, unit: int) -> dict[str, list[tuple[int, list[int]]]]:
            v = sim.values(self.clock())
            p1, p2 = int(v[PUMP1]), int(v[PUMP2])
            holding = [(address, encode(v[sensor], "FLOAT32")) for address, sensor in LIFT_MAP]
            holding.append((6, [p1 | (p2 << 1)]))
            return {"holding": holding, "input": [], "coil": [(0, [p1])], "discrete": [(0, [p2])]}

    return LiftServer({1: Station(seed=sim.seed)}, port=port, clock=clock, update_interval=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--start", type=float, default=1_767_225_600.0, help="epoch seconds (2026-01-01)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--truth", type=Path)
    args = parser.parse_args(argv)
    sim = LiftStation(args.start, days=args.days, seed=args.seed).run()
    rows = sim.write_csv(args.out, args.interval)
    if args.truth:
        args.truth.write_text(json.dumps(sim.truth.to_json(), indent=2) + "\n", encoding="utf-8")
    print(f"{rows} samples to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
