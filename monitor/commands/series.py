"""`monitor series --config C --sensor ID [--since 24h]`: read the local series store."""

from __future__ import annotations

import argparse
import math
import sys

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.config import parse_duration
from monitor.model import iso, parse_time
from monitor.sinks.pipeline import store_path
from monitor.sinks.store import SeriesStore

HELP = "print a sensor's series from the local store (what the console's sparklines show)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--sensor", help="sensor id (omit to list the latest value of every sensor)")
    parser.add_argument(
        "--since", default="24h", help="a duration back from the newest sample (24h) or a time (ISO 8601)"
    )
    parser.add_argument("--until", help="end time (ISO 8601 or epoch seconds), exclusive")
    parser.add_argument("--max-points", type=int, help="average into at most this many points")


def _since(text: str, newest: float) -> float:
    try:
        return newest - parse_duration(text)
    except ValueError:
        return parse_time(text)


def _fmt(value: float) -> str:
    return "NaN" if math.isnan(value) else f"{value:g}"


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    path = store_path(config)
    if not path.exists():
        print(f"no series store at {path} yet", file=sys.stderr)
        return 1
    with SeriesStore(path, retention=config.store.retention) as store:
        latest = store.latest()
        if args.sensor is None:
            for name, s in sorted(latest.items()):
                print(f"{name}\t{iso(s.time)}\t{_fmt(s.value)}\t{s.quality.name.lower()}")
            return 0
        if args.sensor not in latest:
            print(f"no samples for sensor {args.sensor!r} in {path}", file=sys.stderr)
            return 1
        newest = latest[args.sensor].time if args.until is None else parse_time(args.until)
        try:
            since = _since(args.since, newest)
        except ValueError as exc:
            print(f"--since: {exc}", file=sys.stderr)
            return 2
        until = None if args.until is None else parse_time(args.until)
        for s in store.query(args.sensor, since, until, args.max_points):
            print(f"{iso(s.time)}\t{_fmt(s.value)}\t{s.quality.name.lower()}")
    return 0
