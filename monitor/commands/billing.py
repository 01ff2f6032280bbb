"""`monitor billing rate|export`: the §139-3 rate and the quarterly rent-charge export."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING

from monitor.commands import load_config_or_exit
from monitor.errors import MeterError, MonitorError
from monitor.meters.billing import export_rows, rate, unconfigured, write_csv, write_export, write_json
from monitor.meters.periods import presentation, quarter
from monitor.model import iso

if TYPE_CHECKING:
    from monitor.commands.billing_historian import Sheets

# The historian (pyarrow), the ledger (NumPy) and openpyxl are imported by the export
# that needs them: `billing rate` is arithmetic and starts without them.

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
    p.add_argument(
        "--config",
        required=True,
        action="append",
        help="station config; with --from-influx give it once per station (each its own accounts and rate)",
    )
    p.add_argument(
        "--env-file",
        metavar="FILE",
        help="read NAME=value lines (the systemd unit's secrets.env) into the environment first",
    )
    p.add_argument(
        "--from-influx",
        action="store_true",
        help="read the meter records from each config's influx server (InfluxDB 1.x or VictoriaMetrics)"
        " instead of the local ledger; adds a station column",
    )
    p.add_argument(
        "--quarter",
        required=True,
        action="append",
        help="e.g. 2026Q3 (quarters of the billing year, cut at local midnight in station.timezone);"
        " repeat for several (one XLSX sheet each)",
    )
    p.add_argument("--out", required=True, help="output file, or - for stdout (csv, json)")
    p.add_argument("--format", choices=("csv", "json", "xlsx"), default="csv", help="default csv")
    p.add_argument(
        "--presented",
        metavar="YYYY-MM-DD",
        help="§139-4: the date the bill is presented; adds presented, penalty_from_30, penalty_from_60",
    )


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
    if args.format == "xlsx" and args.out == "-":
        raise MeterError("an XLSX export needs --out FILE")
    from monitor.commands.billing_historian import Sheets, export_from_historian
    from monitor.meters.book import ledger_path, open_ledger

    if args.from_influx:
        return _write(args, export_from_historian(args), "the historian")
    if len(args.config) > 1:
        raise MeterError("one --config per export from the ledger (several stations need --from-influx)")
    config = load_config_or_exit(args.config[0], args.env_file)
    billing = config.billing
    if billing is None:
        raise MeterError(f"{args.config[0]} has no billing section")
    quarters = [quarter(text, billing.year_start_month, config.station.zone) for text in args.quarter]
    if len({str(q) for q in quarters}) < len(quarters):
        raise MeterError("a --quarter is given twice")
    if args.presented and len(quarters) > 1:
        raise MeterError("--presented dates one bill: give one --quarter with it")
    bill = presentation(args.presented, quarters[0]) if args.presented else None
    path = ledger_path(config)
    if not path.is_file():  # opening it would make an empty one, and bill every meter nothing
        raise MeterError(
            f"no meter ledger at {path} (state_dir of {args.config[0]}): no reading was kept there;"
            " point state_dir at the station's state directory, or use --from-influx"
        )
    ledger = open_ledger(config)
    try:
        sheets = [(str(q), export_rows(config, ledger, q, bill)) for q in quarters]
        for q in quarters:
            for meter, n in unconfigured(ledger, q):
                print(
                    f"warning: {q}: meter {meter} has {n} reading(s) in the ledger but is not in the config:"
                    " not billed",
                    file=sys.stderr,
                )
    finally:
        ledger.close()
    notes = [
        f"{q}: {q.first_day} to {q.last_day} ({config.station.timezone}),"
        f" {iso(q.start.timestamp())} to {iso(q.end.timestamp())}"
        for q in quarters
    ]
    return _write(args, Sheets(sheets, [q.end.timestamp() for q in quarters], notes), "the ledger")


def _write(args: argparse.Namespace, sheets: Sheets, source: str) -> int:
    for (q, _), end in zip(sheets.sheets, sheets.ends, strict=True):
        if end > time.time():
            print(
                f"warning: {q} ends {iso(end)}, still to come: figures are provisional",
                file=sys.stderr,
            )
    rows = [row for _, sheet in sheets.sheets for row in sheet]
    if args.out == "-":
        (write_json if args.format == "json" else write_csv)(rows, sys.stdout)
        return 0
    if args.format == "xlsx":
        from monitor.meters.xlsx import write_xlsx

        as_of = datetime.fromtimestamp(max(sheets.ends), UTC)  # not the clock: same figures, same bytes
        write_xlsx(sheets.sheets, Path(args.out), as_of)
    else:
        write_export(rows, Path(args.out), args.format)
    for note in sheets.notes:
        print(f"{note} -> {args.out}", file=sys.stderr)
    print(f"{len(rows)} row(s) from {source} -> {args.out}", file=sys.stderr)
    return 0
