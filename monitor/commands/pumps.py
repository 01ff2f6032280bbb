"""`monitor pumps report`: pump run hours and starts, and overflow records, over a period.

    monitor pumps report --config C --start T --end T [--format json|text]

Reads what `monitor run` or `monitor replay` recorded under state_dir; times are
ISO 8601 (with Z or an offset) or epoch seconds. Exit 0; a bad config 2; no station
state, or an unreadable one, 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.config.station import pump_ids
from monitor.errors import MonitorError
from monitor.model import Kind, parse_time
from monitor.station.report import report
from monitor.station.store import FILE, StationStore

HELP = "pumping station: pump run hours and starts, overflow records, over a period"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("report", help="run hours and starts per pump, overflows, between --start and --end")
    add_config_argument(p)
    p.add_argument("--start", required=True, help="ISO 8601 with Z or an offset, or epoch seconds")
    p.add_argument("--end", required=True, help="ISO 8601 with Z or an offset, or epoch seconds")
    p.add_argument("--format", choices=("json", "text"), default="text", help="default text")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    try:
        start, end = parse_time(args.start), parse_time(args.end)
    except ValueError as exc:
        print(f"monitor pumps report: {exc}", file=sys.stderr)
        return 2
    if not end > start:
        print("monitor pumps report: --end must be after --start", file=sys.stderr)
        return 2
    path = config.state_dir / FILE
    if not path.exists():
        print(
            f"monitor pumps report: no station state at {path}; run `monitor replay` or `monitor run` first",
            file=sys.stderr,
        )
        return 1
    pumps = (
        pump_ids(config.wet_well, config.sensors)
        if config.wet_well
        else [s.id for s in config.sensors if s.kind is Kind.PUMP]
    )
    try:
        store = StationStore(path)
    except MonitorError as exc:
        print(f"monitor pumps report: {exc}", file=sys.stderr)
        return 1
    try:
        stale = config.rules[config.wet_well.level].stale_after if config.wet_well else math.inf
        figures = report(store, pumps, start, end, config.station.zone, stale)
    finally:
        store.close()
    if args.format == "json":
        print(json.dumps(figures, ensure_ascii=False))
        return 0
    zone = config.station.zone
    print(f"station {config.station.id}: {args.start} .. {args.end}")
    total_h = total_s = 0
    pumps_out = figures["pumps"]
    assert isinstance(pumps_out, list)
    for p in pumps_out:
        total_h += p["run_hours"]
        total_s += p["starts"]
        print(
            f"  {p['sensor']:<16} {p['run_hours']:9.2f} h  {p['starts']:6d} starts"
            f"  {p['starts_per_hour']:.2f}/h  longest {p['longest_run_hours']:.2f} h"
        )
    print(f"  {'station':<16} {total_h:9.2f} h  {total_s:6d} starts")
    unmonitored = max((p["unmonitored_hours"] for p in pumps_out), default=0.0)
    if unmonitored > 0:  # the run hours are of the rest, as the daily points' are
        print(f"  {'not monitored':<16} {unmonitored:9.2f} h  (no reading of the station: not in run hours)")
    overflows = figures["overflows"]
    assert isinstance(overflows, list)
    if not overflows:
        print("  no overflows")

    def local(stamp: str) -> str:
        """In the station's zone, as the start: an end in UTC beside a local start (16:26 EDT
        to 20:28:40Z) read as an overflow four hours long."""
        return f"{datetime.fromisoformat(stamp.replace('Z', '+00:00')).astimezone(zone):%Y-%m-%d %H:%M %Z}"

    for o in overflows:
        volume = "volume unknown" if o["volume_gal"] is None else f"{o['volume_gal']:.0f} gal"
        if o["volume_note"]:  # why unknown, or what part of the overflow it measured
            volume += f" ({o['volume_note']})"
        # Open with the level stale: nothing said it ended, not that it goes on.
        since = o["level_not_read_since"]
        to = local(o["end"]) if o["end"] else f"? (level not read since {local(since)})" if since else "now"
        # One spill, one event: the SSO report's start is the spill's first record's.
        link = ""
        if o["continues"]:
            link = f"; continues the overflow from {local(o['continues'])}"
            if o["continues_gap_level"] is not None:  # a float bouncing at the crest: the level read
                gap = _seconds(o["start"]) - _seconds(o["continues_gap_from"])
                link += (
                    f" (the overflow switch off for {gap:.0f} s, the level read"
                    f" {o['continues_gap_level']:g}, under overflow)"
                )
            else:
                link += f" (not measured from its end, {local(o['continues_gap_from'])}, to this start)"
        print(
            f"  overflow {o['sensor']} from {local(o['start'])} to {to}:"
            f" {volume}, peak {o['peak_level']}, report due {o['report_due_local']}{link}"
        )
    return 0


def _seconds(stamp: str) -> float:
    """A report's ISO 8601 UTC time as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
