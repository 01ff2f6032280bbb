"""`monitor demo`: the whole daemon against a simulated station, on embedded defaults.

It starts the pumping-station simulator on loopback with a clock running 60x,
seeds a day of history through the same pipeline the live samples take (so the
24 h baselines are warm), runs the real daemon against the simulator with the
local store, and prints the console URL. Within about a minute of wall time a
slug and a pH excursion fire and clear; the console shows them live.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monitor.commands import demo_station, print_config_error, run_bounded
from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.errors import ConfigError
from monitor.model import Sample, ScaledClock
from monitor.statelock import EXIT_IN_USE, StateDirInUseError, hold_state_dir
from monitor.web.station import console_for

if TYPE_CHECKING:
    # The simulators are imported when the demo runs, not when `monitor` lists its commands.
    from simulators.lift_station import LiftStation
    from simulators.scenarios import Station

HELP = "run the monitor against a simulated station (console URL printed; Ctrl-C stops)"

HISTORY = 86400.0  # station seconds of history seeded before the live run
SEED_STEP = 60.0  # one seeded sample per sensor per station minute
SEED_BATCH = 60  # seeded steps (station minutes) stored and judged as one batch
# Every station hour of the live run (a wall minute at 60x) for a day: a slug from minute 2 for
# 20 minutes, and a pH excursion from minute 30 for 8 minutes.
SCENARIOS = (("slug", 120.0, 1200.0), ("ph_excursion", 1800.0, 480.0))
CYCLE, CYCLES = 3600.0, 24
SLUG_LEVEL = 8.0  # the demo's slug, in multiples of the daily mean flow
# Simulator value -> sensor id, as in config/simulator.yaml.
SENSORS = {
    "flow": "outfall.flow",
    "ph": "outfall.ph",
    "temperature": "outfall.temp",
    "oil": "outfall.oil",
    "meter": "station.meter",
    "mill_meter": "mill.meter",
}
TOKEN_ENV = "MONITOR_DEMO_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speed", type=float, default=60.0, help="station seconds per wall second")
    parser.add_argument("--port", type=int, default=8080, help="console port (a free one if taken)")
    parser.add_argument(
        "--modbus-port", type=int, default=25020,
        help="the simulated station's Modbus TCP port, the lift station's the next one (a free one if"
        " taken; 0: any free ports, for demos side by side)",
    )  # fmt: skip
    parser.add_argument("--state-dir", help="keep state here (default: a fresh temporary directory)")
    parser.add_argument("--duration", type=float, help="stop after this many wall seconds")
    parser.add_argument("--influx-url", help="also write to this InfluxDB (v2 API; INFLUX_TOKEN env)")
    parser.add_argument("--influx-org", default="barton", help="InfluxDB organisation (default barton)")
    parser.add_argument("--influx-bucket", default="station", help="InfluxDB bucket (default station)")


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen: int = s.getsockname()[1]
            return chosen
    raise OSError("no free port")


def demo_config(
    state_dir: Path, modbus_port: int, console_port: int, args: argparse.Namespace, lift_port: int = 25021
) -> Config:
    """The embedded station: the simulator's map (config/simulator.yaml), local store."""
    field = {"register": "holding", "type": "FLOAT32"}
    # A reading each station minute at most, so at any --speed the slug rule sees a run
    # (its max_sample_gap is 5 min) and the wet well a fill; once a second at 60x.
    poll_interval = min(1.0, max(0.1, 60.0 / args.speed))
    # The wet well's PLC every 15 station seconds (4 times a second at 60x): pump 1's failure
    # to start shows for about a station minute before the lag pump takes over, and one read a
    # minute, late under load, could miss it entirely.
    lift_interval = min(1.0, max(0.1, 15.0 / args.speed))
    raw: dict[str, Any] = {
        "station": {"id": "demo", "name": "Demo pumping station (simulated)"},
        "state_dir": str(state_dir),
        "sensors": [
            {"id": "outfall.flow", "kind": "flow", "unit": "gpm", "name": "Outfall discharge flow"},
            {"id": "outfall.ph", "kind": "ph", "name": "Outfall pH", "limits": {"deadband": 0.1},
             "frozen_after": "6h"},
            {"id": "outfall.temp", "kind": "temperature", "unit": "degC", "name": "Outfall temperature",
             "frozen_after": "12h"},
            {"id": "outfall.oil", "kind": "concentration", "unit": "mg/L", "substance": "oil",
             "name": "Oil analyser"},
            {"id": "station.meter", "kind": "meter", "unit": "ft3", "register_digits": 8,
             "account": "town", "name": "Station water meter"},
            {"id": "mill.meter", "kind": "meter", "unit": "ft3", "register_digits": 8,
             "account": "mill", "name": "Mill water meter"},
            *demo_station.station_sensors(),
        ],
        "wet_well": demo_station.wet_well(),
        "modbus": {
            "devices": [
                {
                    "name": "station-sim",
                    "host": "127.0.0.1",
                    "port": modbus_port,
                    "poll_interval": poll_interval,
                    "fields": [
                        {"sensor": "outfall.flow", "address": 0, **field},
                        {"sensor": "outfall.ph", "address": 2, **field},
                        {"sensor": "outfall.temp", "address": 4, **field},
                        {"sensor": "outfall.oil", "register": "input", "address": 0, "type": "FLOAT32",
                         "byte_order": "CDAB"},
                        {"sensor": "station.meter", "register": "holding", "address": 8, "type": "UINT32"},
                        {"sensor": "mill.meter", "register": "holding", "address": 10, "type": "UINT32"},
                    ],
                },
                demo_station.station_device(lift_port, lift_interval),
            ]
        },
        "console": {"host": "127.0.0.1", "port": console_port, "token": "${" + TOKEN_ENV + "}"},
        "billing": {
            "rate_per_kcf": "4.25",
            "minimum_charge": "25.00",
            "accounts": [
                {"id": "town", "name": "Town system", "class": "residential"},
                {"id": "mill", "name": "Barton Mill", "class": "industrial"},
            ],
        },
    }  # fmt: skip
    if args.influx_url:
        raw["influx"] = {
            "url": args.influx_url,
            "org": args.influx_org,
            "bucket": args.influx_bucket,
            "token": "${INFLUX_TOKEN}",
        }
    return build_config(raw, source="monitor demo")


def run(args: argparse.Namespace) -> int:
    if args.influx_url and "INFLUX_TOKEN" not in os.environ:
        os.environ["INFLUX_TOKEN"] = ""  # InfluxDB 1.8+/VictoriaMetrics accept an empty token
    os.environ[TOKEN_ENV] = secrets.token_urlsafe(12)
    with contextlib.ExitStack() as stack:
        if args.state_dir:
            state_dir = Path(args.state_dir).resolve()
        else:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="monitor-demo-")))
        try:
            modbus, lift = (args.modbus_port, args.modbus_port + 1) if args.modbus_port else (0, 0)
            config = demo_config(state_dir, free_port(modbus), free_port(args.port), args, free_port(lift))
        except ConfigError as exc:
            print_config_error(exc)
            return 2
        try:  # a --state-dir a daemon (or another demo) runs on is not shared
            stack.enter_context(hold_state_dir(state_dir, "monitor demo"))
        except StateDirInUseError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return EXIT_IN_USE
        return run_bounded(_demo(config, args))
    return 0


def slug_factor(station: Station, el: float, duration: float) -> float:
    """A slug factor that takes the flow to SLUG_LEVEL x the daily mean at any hour.

    The simulated flow follows a diurnal profile (night low ~40 % of the mean), so a
    fixed factor on the night-time flow stays under the ordinance's 5x the 24 h
    average and the demo would raise no slug between about 00:00 and 05:00 UTC.
    Scaling by the lowest point of the profile over the slug, less the wander's 4 %,
    keeps every sample of it over the limit whenever the demo runs."""
    low = min(station.relative_flow(el + m * 60.0) for m in range(int(duration // 60.0) + 1))
    return max(SLUG_LEVEL, SLUG_LEVEL / (0.96 * low))


def schedule(station: Station, live: float) -> None:
    """The slugs and pH excursions of every station hour, counted from `live` (station
    seconds since the simulation began) when the live run starts, so the first slug
    comes two station minutes after the console URL however long the seeding took."""
    for cycle in range(CYCLES):
        for name, at, duration in SCENARIOS:
            el = live + cycle * CYCLE + at
            params = {"factor": slug_factor(station, el, duration)} if name == "slug" else {}
            station.inject(name, el, duration, **params)


def seed_history(
    daemon: Daemon, station: Station, start: float, speed: float, lift: LiftStation | None = None
) -> int:
    """A day of readings before the live run, through the daemon's own pipeline.

    A station hour of readings per batch, as the live pipeline merges queued polls:
    one transaction per store and hour instead of one per minute (the ledger's
    synchronous=FULL commit took most of the seeding's time, 7 of 11 s)."""
    steps = int(HISTORY / SEED_STEP)
    count = 0
    batch: list[Sample] = []
    for i in range(steps):
        st = start - HISTORY + i * SEED_STEP  # station time
        values = station.values(start + (st - start) / speed)
        batch += [Sample(SENSORS[k], st, v) for k, v in values.items() if k in SENSORS]
        if lift is not None:
            batch += demo_station.readings(lift, st)
        if (i + 1) % SEED_BATCH and i != steps - 1:
            continue
        daemon.pipeline.process(batch)
        count += len(batch)
        batch = []
        done = (i + 1) / steps
        print(f"\rseeding a day of history: {done:4.0%} ({count:,} readings)", end="", flush=True)
    print(flush=True)
    return count


async def _demo(config: Config, args: argparse.Namespace) -> int:
    from simulators.lift_station import lift_server
    from simulators.modbus_server import StationServer
    from simulators.scenarios import Station

    start = time.time()
    clock = ScaledClock(args.speed, start)
    # The simulated station began a day before the live run, so the seeded history
    # (meter totals included) is what it really read; same clock as `clock`.
    station = Station(seed=7, speed=args.speed, start=start - HISTORY / args.speed, origin=start - HISTORY)
    device = config.modbus.devices[0] if config.modbus else None
    assert device is not None and isinstance(device.port, int)
    server = StationServer(station, host="127.0.0.1", port=device.port)
    logging.getLogger("pymodbus").setLevel(logging.WARNING)
    await server.start()
    # The lift station (wet well, two pumps) on its own simulated device, same clock.
    lift = demo_station.lift_station(start, HISTORY)
    lift_device = config.modbus.devices[1] if config.modbus and len(config.modbus.devices) > 1 else None
    assert lift_device is not None and isinstance(lift_device.port, int)
    lift_server_ = lift_server(lift, lift_device.port, clock.now)
    await lift_server_.start()
    daemon = Daemon(config, clock)
    try:
        seed_history(daemon, station, start, args.speed, lift)
        # The live run continues the seeded day where it ends, however long the seeding
        # took (seconds on a busy machine: station hours at 240x): the station clock,
        # the simulators on it included, starts now at `start`.
        clock.start = time.time()
        station.start = clock.start - HISTORY / args.speed
        schedule(station, station.elapsed(clock.start))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, daemon.stop)
        runner = asyncio.create_task(daemon.run(console_for(daemon)))
        await daemon.ready.wait()
        token = os.environ[TOKEN_ENV]
        print(f"simulated station on modbus tcp://127.0.0.1:{device.port}, clock {args.speed:g}x")
        print(f"console: {daemon.console_url}  (token for acknowledge and shelve: {token})")
        print(
            "every station hour: a slug from minute 2 (alarm after 15 min over 5x the 24 h "
            "average), a pH excursion from minute 30; Ctrl-C stops",
            flush=True,
        )
        print(
            f"wet well and pumps: {daemon.console_url}station (pump 1 fails to start from station"
            " minute 20, a storm overflows the well from hour 2)",
            flush=True,
        )
        if args.duration is not None:
            loop.call_later(args.duration, daemon.stop)
        await runner
    finally:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.stop(), timeout=5.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lift_server_.stop(), timeout=5.0)
    active = [a for a in daemon.alarms.alarms() if a.activated_at is not None]
    where = f"state kept in {config.state_dir}" if args.state_dir else "temporary state removed"
    print(f"demo stopped; {len(active)} alarm(s) raised, {where}", file=sys.stderr)
    return 0
