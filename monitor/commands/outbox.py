"""`monitor outbox status|drain --config C`: what waits for InfluxDB, and deliver it now."""

from __future__ import annotations

import argparse
import asyncio
import sys

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.errors import SinkError
from monitor.model import iso
from monitor.sinks.batch import OutboxStats
from monitor.sinks.pipeline import open_drainer, open_outbox, outbox_path

HELP = "show the InfluxDB outbox (status) or deliver what it holds (drain)"

EXIT_LEFT = 1  # drain: points remain (server unreachable or too slow)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    status = sub.add_parser("status", help="pending points, oldest pending, dead letters, dropped")
    add_config_argument(status)
    status.add_argument("--dead-letters", type=int, default=0, metavar="N", help="also print N dead letters")
    drain = sub.add_parser("drain", help="deliver pending points; exit 0 when empty, 1 with the count left")
    add_config_argument(drain)
    drain.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up after S seconds")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    path = outbox_path(config)
    if args.action == "status":
        if not path.exists():
            print(f"outbox  {path}: none yet (nothing was ever queued)")
            return 0
        try:
            with open_outbox(config) as outbox:
                print(format_status(str(path), outbox.stats()))
                for d in outbox.dead_letters(args.dead_letters) if args.dead_letters else []:
                    print(f"  dead letter {d.id} at {iso(d.failed)} HTTP {d.status}: {d.reason[:200]}")
                    print(f"    {d.line[:300]}")
        except SinkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if config.influx is None:
        print("no influx section in the config: nothing to drain to", file=sys.stderr)
        return 2
    try:
        with open_outbox(config) as outbox:
            drainer = open_drainer(config, outbox)
            try:
                left = asyncio.run(drainer.drain(args.timeout))
            finally:
                drainer.close()
            stats = outbox.stats()
    except SinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"delivered {drainer.stats.written} point(s) to {drainer.writer.target}")
    if drainer.stats.dead_letters:
        print(f"{drainer.stats.dead_letters} point(s) rejected by the server, moved to dead letters")
    if left:
        print(
            f"{left} point(s) still pending after {args.timeout:g}s: {drainer.stats.last_error}",
            file=sys.stderr,
        )
        return EXIT_LEFT
    print(format_status(str(path), stats))
    return 0


def format_status(path: str, s: OutboxStats) -> str:
    oldest = "-" if s.oldest_queued is None else iso(s.oldest_queued)
    return "\n".join(
        [
            f"outbox          {path}",
            f"pending         {s.pending} point(s), {s.pending_bytes} bytes (cap {s.max_bytes})",
            f"oldest pending  {oldest}",
            f"dead letters    {s.dead_letters}",
            f"dropped         {s.dropped}",
            f"written         {s.written}",
        ]
    )
