"""`monitor alarms`: the alarm list, the journal and the ISA-18.2 / EEMUA 191 report."""

from __future__ import annotations

import argparse
import json
import sys
import time

from monitor.alarms import AlarmManager, Journal, journal_path
from monitor.alarms.figures import figures
from monitor.alarms.report import build_report, render
from monitor.commands import add_config_argument, load_config_or_exit
from monitor.config import Config, parse_duration
from monitor.errors import StateError
from monitor.model import Kind, WallClock, iso, parse_time

HELP = "active alarms, the alarm journal, and the alarm-system report (ISA-18.2, EEMUA 191)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    report = sub.add_parser("report", help="alarm rates, floods, top 10, chattering, stale, pH excursion")
    listing = sub.add_parser("list", help="alarms that are not normal (from the journal)")
    journal = sub.add_parser("journal", help="journal entries, newest last")
    for p in (report, listing, journal):
        add_config_argument(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")
    for p in (report, journal):
        p.add_argument("--since", default="30d", help="a duration back from --until (30d, 12h) or a time")
        p.add_argument("--until", default=None, help="end of the period (ISO 8601 or epoch); default now")
    listing.add_argument("--all", action="store_true", help="include alarms in the normal state")
    journal.add_argument("--sensor", default=None, help="only this sensor")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    path = journal_path(config)
    if not path.exists():
        print(f"no alarm journal at {path}: the daemon has not raised an alarm here yet", file=sys.stderr)
        return 1
    try:
        if args.action == "list":
            return _list(config, args)
        since, until = _period(args.since, args.until)
        if args.action == "journal":
            return _journal(config, args, since, until)
        return _report(config, args, since, until)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _period(since_text: str, until_text: str | None) -> tuple[float, float]:
    until = time.time() if until_text is None else parse_time(until_text)
    try:
        since = until - parse_duration(since_text)
    except ValueError:
        since = parse_time(since_text)
    if since >= until:
        raise ValueError(f"--since {since_text} is not before --until")
    return since, until


def _report(config: Config, args: argparse.Namespace, since: float, until: float) -> int:
    journal = Journal(journal_path(config))
    ph = {s.id for s in config.sensors if s.kind is Kind.PH}
    rep = build_report(journal.entries(), since, until, ph, config.alarms.flood_count)
    journal.close()
    print(json.dumps(rep.to_json(), indent=2, ensure_ascii=False) if args.json else render(rep))
    return 0


def _list(config: Config, args: argparse.Namespace) -> int:
    manager = AlarmManager.open(config, WallClock())
    alarms = manager.alarms() if args.all else manager.active()
    manager.close()
    if args.json:
        print(json.dumps([a.to_json() for a in alarms], indent=2, ensure_ascii=False))
        return 0
    if not alarms:
        print("no active alarms")
    units = {s.id: s.effective_unit for s in config.sensors}
    for a in alarms:
        since = iso(a.activated_at) if a.activated_at else "-"
        extra = ""
        if a.acked_by:
            extra += f" acked by {a.acked_by}"
        if a.shelved_until:
            extra += f" shelved until {iso(a.shelved_until)} by {a.shelved_by}: {a.shelve_reason}"
        if a.chattering:
            extra += " CHATTERING"
        shown = figures(a, units.get(a.sensor, ""))  # "value 3", of a comm loss, was 3 polls
        value = f" {shown}" if shown else ""
        print(
            f"{a.priority.value:8} {a.state.value:24} {a.sensor}/{a.rule} since {since}{value}"
            f" [{a.citation}]{extra}"
        )
    return 0


def _journal(config: Config, args: argparse.Namespace, since: float, until: float) -> int:
    journal = Journal(journal_path(config))
    entries = list(journal.entries(since=since, until=until, sensor=args.sensor))
    journal.close()
    if args.json:
        print(json.dumps([e.to_json() for e in entries], indent=2, ensure_ascii=False))
        return 0
    for e in entries:
        who = f" by {e.actor}" if e.actor else ""
        note = f": {e.note}" if e.note else ""
        print(f"{iso(e.time)}  {e.sensor}/{e.rule}  {e.event}{who}{note} -> {e.state}")
    return 0
