"""The demo's lift station: a wet well with two pumps beside the outfall (issue 15).

A second simulated device (`simulators.lift_station` over Modbus TCP) on the demo's
clock. A day of its history is seeded with the rest; in the live run, within the first
wall minutes at 60x: pump 1 fails to start (station minutes 20..60), then a storm
overflows the well (from station hour 2). The console's `/station` page shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from monitor.model import Sample

if TYPE_CHECKING:  # imported when the demo runs, not when `monitor` lists its commands
    from simulators.lift_station import LiftStation

HOUR = 3600.0
PUMPS = ["ps.pump1", "ps.pump2"]


def station_sensors() -> list[dict[str, Any]]:
    return [
        {"id": "ps.level", "kind": "level", "unit": "ft", "name": "Wet well level",
         "setpoints": {"off": 2.0, "lead_on": 5.0, "lag_on": 6.5, "high": 8.0, "overflow": 9.0}},
        {"id": "ps.pump1", "kind": "pump", "name": "Pump 1",
         "pump": {"capacity": "500 gpm", "max_starts_per_hour": 8, "max_run": "2h"}},
        {"id": "ps.pump2", "kind": "pump", "name": "Pump 2",
         "pump": {"capacity": "500 gpm", "max_starts_per_hour": 8, "max_run": "2h"}},
        {"id": "ps.flow", "kind": "flow", "unit": "gpm", "name": "Force main flow", "slug": False},
        {"id": "ps.inflow", "kind": "derived", "unit": "gpm", "name": "Station inflow",
         "expression": "ps.flow + area * rate(ps.level, 60s)", "constants": {"area": "80 ft2"}},
    ]  # fmt: skip


def station_device(port: int, poll_interval: float = 1.0) -> dict[str, Any]:
    """The lift station's PLC; polled as often as the outfall device (a station minute at most)."""
    bit = {"type": "BIT"}
    return {
        "name": "lift-station-sim",
        "host": "127.0.0.1",
        "port": port,
        "poll_interval": poll_interval,
        "fields": [
            {"sensor": "ps.level", "register": "holding", "address": 0, "type": "FLOAT32"},
            {"sensor": "ps.flow", "register": "holding", "address": 2, "type": "FLOAT32"},
            {"sensor": "ps.pump1", "register": "coil", "address": 0, **bit},
            {"sensor": "ps.pump2", "register": "discrete", "address": 0, **bit},
        ],
    }


def wet_well() -> dict[str, Any]:
    return {
        "level": "ps.level",
        "pumps": PUMPS,
        "inflow": "ps.inflow",
        "fail_to_start_delay": "2m",
        "weir": {"length": "2 ft"},
    }


def lift_station(start: float, history: float) -> LiftStation:
    """Simulated from `history` station seconds before `start` to a day after it."""
    from simulators.lift_station import LiftStation

    return LiftStation(
        start - history,
        days=(history + 24 * HOUR) / 86400.0,
        seed=11,
        storm=(history + 2 * HOUR, 3 * HOUR, 1150.0),
        failure=(history + HOUR / 3, 2 * HOUR / 3),
        slug=None,
    ).run()


def readings(sim: LiftStation, t: float) -> list[Sample]:
    """What the lift station's PLC reads at station time `t` (the seeded history)."""
    values = sim.values(t)
    return [Sample(s, t, values[s]) for s in ("ps.level", "ps.flow", *PUMPS)]
