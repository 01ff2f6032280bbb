"""`monitor meters list|show|replace|ingest`: the meter ledger from the command line."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from monitor.commands import load_config_or_exit
from monitor.errors import MeterError, MonitorError
from monitor.meters.book import MeterBook, ledger_path
from monitor.meters.ledger import to_ms
from monitor.model import Sample, iso, parse_time
from monitor.sqlite import quick_check

HELP = "meter ledger: list meters, show readings, record a meter replacement, ingest readings"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="each meter with its latest reading and alarm state")
    p.add_argument("--config", required=True)
    p = sub.add_parser("show", help="a meter's ledger rows")
    p.add_argument("--config", required=True)
    p.add_argument("--meter", required=True)
    p.add_argument("--since", help="ISO 8601 or epoch seconds (exclusive)")
    p.add_argument("--until", help="ISO 8601 or epoch seconds (inclusive)")
    p = sub.add_parser("replace", help="record a meter replacement (old final and new initial reading)")
    p.add_argument("--config", required=True)
    p.add_argument("--meter", required=True, help="the meter's sensor id")
    p.add_argument("--time", required=True, help="when it was swapped, ISO 8601 with Z or an offset")
    p.add_argument("--old-final", required=True, help="the old meter's final register reading (counts)")
    p.add_argument("--new-initial", required=True, help="the new meter's initial register reading (counts)")
    p.add_argument("--by", default="", help="who recorded it (kept in the ledger)")
    p.add_argument("--note", default="")
    p = sub.add_parser("ingest", help="add meter readings from CSV files (time,sensor,value) to the ledger")
    p.add_argument("--config", required=True)
    p.add_argument("--input", required=True, action="append", help="CSV with header time,sensor,value")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config)
    damage = quick_check(ledger_path(config))
    if damage is not None:  # never "ok" from a damaged ledger
        print(f"monitor meters: meter ledger {ledger_path(config)} is DAMAGED ({damage}); restore it from "
              "the backup (README: State files, restore)", file=sys.stderr)  # fmt: skip
        return 1
    try:
        book = MeterBook.open(config, records=False)
    except MonitorError as exc:
        print(f"monitor meters: {exc}", file=sys.stderr)
        return 1
    try:
        action = args.action
        if action == "list":
            return _list(book)
        if action == "show":
            return _show(book, args)
        if action == "replace":
            return _replace(book, args)
        return _ingest(book, [Path(p) for p in args.input])
    except MonitorError as exc:
        print(f"monitor meters {args.action}: {exc}", file=sys.stderr)
        return 1
    finally:
        book.close()


def _list(book: MeterBook) -> int:
    ledger = book.ledger
    print(f"ledger {ledger.path}")
    for meter, spec in ledger.specs.items():
        last = ledger.last(meter)
        base = ledger.baseline(meter)
        digits = f"{spec.digits} digits" if spec.digits else "no rollover"
        rate = f"max {spec.max_rate} {spec.unit}/h" if spec.max_rate is not None else "no max rate"
        head = f"{meter}  account {spec.account or '-'}  {spec.unit} x{spec.multiplier}, {digits}, {rate}"
        if last is None:
            print(f"{head}\n  no readings")
            continue
        state = "ALARM: " + last.message if not last.accepted else "ok"
        shown = base.reading if base else "-"
        when = iso(base.time) if base else "-"
        print(f"{head}\n  {ledger.count(meter)} rows, last accepted {shown} at {when}; {state}")
    return 0


def _show(book: MeterBook, args: argparse.Namespace) -> int:
    ledger = book.ledger
    spec = ledger.spec(args.meter)
    after = to_ms(parse_time(args.since)) if args.since else None
    until = to_ms(parse_time(args.until)) if args.until else None
    print(f"meter {spec.meter} ({spec.unit} x{spec.multiplier}), account {spec.account or '-'}")
    for row in ledger.rows(args.meter, after, until):
        print("  " + row.describe() + (f"  {row.message}" if row.message else ""))
    for rep in ledger.replacements(args.meter):
        who = f" by {rep.recorded_by}" if rep.recorded_by else ""
        print(
            f"  replaced at {iso(rep.time_ms / 1000)}: old final {rep.old_final},"
            f" new initial {rep.new_initial}{who}"
        )
    return 0


def _replace(book: MeterBook, args: argparse.Namespace) -> int:
    try:
        when = parse_time(args.time)
    except ValueError as exc:
        raise MeterError(str(exc)) from None
    conditions = book.record_replacement(
        args.meter, when, args.old_final, args.new_initial, args.by, args.note
    )
    print(
        f"meter {args.meter} replaced at {iso(when)}: old final {args.old_final},"
        f" new initial {args.new_initial}"
        f" (ledger {book.ledger.path})"
    )
    for c in conditions:
        print(f"  meter alarm {c.state}: {c.message}")
    return 0


def _ingest(book: MeterBook, paths: list[Path]) -> int:
    """Read CSVs as `monitor replay` does (bad rows counted, not fatal) and add the meter rows."""
    samples: list[Sample] = []
    bad = other = 0
    for path in paths:
        try:
            fh = path.open(encoding="utf-8", newline="")
        except OSError as exc:
            raise MeterError(f"cannot read {path}: {exc.strerror}") from None
        with fh:
            for lineno, rec in enumerate(csv.DictReader(fh), start=2):
                try:
                    sample = Sample(rec["sensor"], parse_time(rec["time"]), float(rec["value"]))
                except (KeyError, TypeError, ValueError) as exc:
                    bad += 1
                    if bad == 1:
                        print(f"{path}:{lineno}: skipped: {exc}", file=sys.stderr)
                    continue
                if not book.is_meter(sample.sensor):
                    other += 1
                    continue
                samples.append(sample)
    conditions = book.ingest(samples)
    print(
        f"{len(samples)} meter reading(s) from {len(paths)} file(s),"
        f" {len(conditions)} meter alarm transition(s),"
        f" {other} other row(s), {bad} bad row(s); ledger {book.ledger.path}"
    )
    return 0
