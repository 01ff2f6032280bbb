"""`monitor fleet serve|status --config FLEET.yaml`: every station from the broker's retained topics.

`serve` runs the fleet page and API until stopped; `status` listens for a moment
(`--listen`, 2 s) and prints the fleet once, as JSON or a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from typing import Any

from monitor.commands import print_config_error, run_bounded
from monitor.config.fleet import FleetConfig, load_fleet_config
from monitor.errors import ConfigError, MonitorError

HELP = "one view of every station on a broker: status, alarms, acknowledge (serve | status)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fleet_command", metavar="ACTION")
    sub.required = False
    for name, text in (
        ("serve", "serve the fleet page and API (the default)"),
        ("status", "listen for a moment and print every station once"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--config", required=True, help="fleet config YAML (keys mqtt and fleet)")
        if name == "status":
            p.add_argument("--listen", type=float, default=2.0, help="seconds to listen before printing")
            p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
        else:
            p.add_argument("--port", type=int, help="override fleet.port")
    parser.add_argument("--config", dest="top_config", help="fleet config YAML (for plain `monitor fleet`)")


def _load(path: str) -> FleetConfig:
    try:
        return load_fleet_config(path)
    except ConfigError as exc:
        print_config_error(exc)
        raise SystemExit(2) from None


def run(args: argparse.Namespace) -> int:
    command = args.fleet_command or "serve"
    path = getattr(args, "config", None) or args.top_config
    if path is None:
        print("monitor fleet: --config is required", file=sys.stderr)
        return 2
    config = _load(path)
    if command == "status":
        return _status(config, args.listen, args.format)
    if getattr(args, "port", None) is not None:
        config = config.model_copy(update={"fleet": config.fleet.model_copy(update={"port": args.port})})
    return run_bounded(_serve(config))


def _status(config: FleetConfig, listen: float, fmt: str) -> int:
    from monitor.fleet.service import FleetService

    service = FleetService(config)
    service.start()
    try:
        try:
            service.link.wait_connected(timeout=max(listen, 5.0))
        except MonitorError as exc:
            print(f"monitor fleet: {exc}", file=sys.stderr)
            return 1
        threading.Event().wait(listen)  # retained messages arrive right after subscribing
        doc = service.snapshot()
    finally:
        service.stop()
    if fmt == "json":
        print(json.dumps(doc, indent=2))
    else:
        _print_table(doc)
    return 0


def _print_table(doc: dict[str, Any]) -> None:
    for s in doc["stations"]:
        state = "online " if s["online"] else "OFFLINE"
        unacked = sum(s["unacknowledged_by_priority"].values())
        print(f"{s['id']:<20} {state} last seen {s['last_seen'] or '-':<24} "
              f"{len(s['alarms'])} alarm(s), {unacked} unacknowledged")  # fmt: skip
        for a in s["alarms"]:
            stale = " (stale)" if a["stale"] else ""
            print(f"    {a['priority'] or '-':<9} {a['sensor']} {a['rule']}: {a['state']}{stale}")
    if not doc["stations"]:
        print("no stations seen on the broker")


async def _serve(config: FleetConfig) -> int:
    from monitor.config import Console
    from monitor.fleet.app import create_fleet_app
    from monitor.fleet.service import FleetService
    from monitor.web.server import ConsoleServer

    service = FleetService(config)
    service.start()
    server = ConsoleServer(
        create_fleet_app(service), Console(host=config.fleet.host, port=config.fleet.port, token=None)
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    task = asyncio.create_task(server.serve())
    try:
        await server.wait_started()
        print(f"fleet: http://{config.fleet.host}:{server.port}/", flush=True)
        await task
    except MonitorError as exc:
        print(f"monitor fleet: {exc}", file=sys.stderr)
        return 1
    finally:
        service.stop()
    return 0
