"""`monitor billing rate|export`: the §139-3 rate and the quarterly rent-charge export."""

from __future__ import annotations

import argparse
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.errors import MeterError, MonitorError
from monitor.meters.billing import export_rows, quarter, rate, write_csv, write_export, write_json
from monitor.meters.book import open_ledger
from monitor.model import iso

HELP = "billing: the §139-3 rate per 1,000 ft3, and the quarterly export from the meter ledger"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("rate", help="§139-3: O&M budget / prior calendar year's consumption in kcf")
    p.add_argument("--budget", required=True, help="operation and maintenance budget, dollars")
    p.add_argument(
        "--prior-year-kcf", required=True, help="prior calendar year's water consumption, 1,000 ft3"
    )
    p.add_argument("--places", type=int, default=2, help="decimal places of the rate (default 2, cents)")
    p = sub.add_parser("export", help="one row per account and meter for a billing quarter")
    add_config_argument(p)
    p.add_argument("--quarter", required=True, help="e.g. 2026Q3 (quarters of the billing year)")
    p.add_argument("--out", required=True, help="output file, or - for stdout")
    p.add_argument("--format", choices=("csv", "json"), default="csv", help="file format (default csv)")


def _decimal(text: str, what: str) -> Decimal:
    try:
        value = Decimal(text.replace(",", "").replace("$", "").strip())
    except InvalidOperation:
        raise MeterError(f"{what} {text!r} is not a number") from None
    if not value.is_finite():
        raise MeterError(f"{what} {text!r} is not a number")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "rate":
            return _rate(args)
        return _export(args)
    except MonitorError as exc:
        print(f"monitor billing {args.action}: {exc}", file=sys.stderr)
        return 1


def _rate(args: argparse.Namespace) -> int:
    budget = _decimal(args.budget, "budget")
    kcf = _decimal(args.prior_year_kcf, "prior-year kcf")
    exact = rate(budget, kcf)
    rounded = exact.quantize(Decimal(1).scaleb(-max(args.places, 0)), rounding="ROUND_HALF_UP")
    print(f"rate_per_kcf: {rounded}")
    print(f"# §139-3: ${budget} O&M budget / {kcf} kcf prior-year consumption = {exact.normalize():f} $/kcf")
    return 0


def _export(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    if config.billing is None:
        raise MeterError(f"{args.config} has no billing section")
    q = quarter(args.quarter, config.billing.year_start_month)
    ledger = open_ledger(config)
    try:
        rows = export_rows(config, ledger, q)
    finally:
        ledger.close()
    if q.end.timestamp() > time.time():
        print(f"warning: {q} ends {iso(q.end.timestamp())}, which is still to come: figures are provisional",
              file=sys.stderr)  # fmt: skip
    if args.out == "-":
        (write_json if args.format == "json" else write_csv)(rows, sys.stdout)
    else:
        write_export(rows, Path(args.out), args.format)
        print(
            f"{q}: {iso(q.start.timestamp())} to {iso(q.end.timestamp())}, {len(rows)} row(s) -> {args.out}",
            file=sys.stderr,
        )
    return 0
