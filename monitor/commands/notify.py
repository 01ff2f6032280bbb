"""`monitor notify test --config C --person NAME`: one test message through each of a
person's channels, so a roster is proven before the night it is needed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from monitor.callout import build_senders
from monitor.callout.message import local_time
from monitor.commands import EXIT_CONFIG, load_config_or_exit
from monitor.config import Config
from monitor.errors import MonitorError

HELP = "callout: send a test message to a person through each of their channels"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    test = sub.add_parser("test", help="send a test message through each of a person's channels")
    test.add_argument("--config", required=True, help="station config YAML")
    test.add_argument("--person", required=True, help="a key of notify.people")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config)
    if config.notify is None or args.person not in config.notify.people:
        known = ", ".join(sorted(config.notify.people)) if config.notify else "none (no notify: section)"
        print(f"notify.people: no person {args.person!r}; known: {known}", file=sys.stderr)
        return EXIT_CONFIG
    failures = asyncio.run(send_test(config, args.person))
    return 1 if failures else 0


async def send_test(config: Config, person_id: str) -> int:
    """Sends, prints one line per channel, returns how many failed."""
    assert config.notify is not None
    person = config.notify.people[person_id]
    station = config.station.name or config.station.id
    senders = build_senders(config.notify, station)
    when = local_time(time.time(), config.station.zone)
    subject = f"[{station}] callout test"
    text = f"{station}: test message for {person.name} at {when}. No action needed."
    failures = 0
    try:
        for channel, address in person.contacts.items():
            try:
                await senders[channel].send(address, subject, text, None)
            except MonitorError as exc:
                failures += 1
                print(f"{channel:<10} {address}: FAILED {exc}")
            else:
                print(f"{channel:<10} {address}: sent")
    finally:
        for sender in senders.values():
            await sender.aclose()
    return failures
