"""`monitor meters list|show|replace|correct|void-replacement|ingest`: the ledger from the CLI."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.errors import InputUsageError, MeterError, MonitorError
from monitor.meters.amend import iter_history
from monitor.meters.book import MeterBook, ledger_path
from monitor.meters.ledger import to_ms
from monitor.model import Sample, iso, parse_time
from monitor.sources.inputs import input_path, pipes_once
from monitor.sqlite import StateLockedError, quick_check

COLUMNS = ("time", "sensor", "value")
EARLIEST, LATEST = 0.0, 4_102_444_800.0  # 1970-01-01 and 2100-01-01: a meter reading is in between
HELP = "meter ledger: list, show, record or void a meter replacement, correct a misread, ingest readings"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("list", help="each meter with its latest reading and alarm state")
    add_config_argument(p)
    p = sub.add_parser("show", help="a meter's ledger rows")
    add_config_argument(p)
    p.add_argument("--meter", required=True, help="the meter's sensor id")
    p.add_argument("--since", help="ISO 8601 or epoch seconds (exclusive)")
    p.add_argument("--until", help="ISO 8601 or epoch seconds (inclusive)")
    p = sub.add_parser("replace", help="record a meter replacement (old final and new initial reading)")
    add_config_argument(p)
    p.add_argument("--meter", required=True, help="the meter's sensor id")
    p.add_argument("--time", required=True, help="when it was swapped, ISO 8601 with Z or an offset")
    p.add_argument("--old-final", required=True, help="the old meter's final register reading (counts)")
    p.add_argument("--new-initial", required=True, help="the new meter's initial register reading (counts)")
    p.add_argument("--by", default="", help="who recorded it (kept in the ledger)")
    p.add_argument("--note", default="", help="why, e.g. the work order (kept in the ledger)")
    p = sub.add_parser("correct", help="correct a misread reading (appended to the ledger with who and why)")
    add_config_argument(p)
    p.add_argument("--meter", required=True, help="the meter's sensor id")
    p.add_argument("--time", required=True, help="the reading's exact time, as `meters show` prints it")
    p.add_argument("--reading", required=True, help="the right register reading (counts)")
    p.add_argument("--by", required=True, help="who corrects it (kept in the ledger)")
    p.add_argument("--why", required=True, help="why (kept in the ledger, shown with the bill)")
    p = sub.add_parser(
        "void-replacement", help="void a wrongly recorded replacement (appended; readings re-judged)"
    )
    add_config_argument(p)
    p.add_argument("--meter", required=True, help="the meter's sensor id")
    p.add_argument("--time", required=True, help="the replacement's time, as `meters show` prints it")
    p.add_argument("--by", required=True, help="who voids it (kept in the ledger)")
    p.add_argument("--why", required=True, help="why (kept in the ledger, shown with the bill)")
    p = sub.add_parser("ingest", help="add meter readings from CSV files (time,sensor,value) to the ledger")
    add_config_argument(p)
    p.add_argument(
        "--input",
        required=True,
        action="append",
        help="CSV with header time,sensor,value; repeatable; may come from a pipe: - (standard"
        " input, e.g. from zcat) or a named pipe",
    )


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    try:
        damage = quick_check(ledger_path(config), timeout=config.store.lock_wait)
    except StateLockedError as exc:  # locked is not damaged: say which, never "ok", never "DAMAGED"
        print(f"monitor meters: meter ledger {exc}", file=sys.stderr)
        return 1
    if damage is not None:  # never "ok" from a damaged ledger
        print(f"monitor meters: meter ledger {ledger_path(config)} is DAMAGED ({damage}); restore it from "
              "the backup (docs/operator-guide.md, State files)", file=sys.stderr)  # fmt: skip
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
        if action == "correct":
            return _amend(book, args, "corrected")
        if action == "void-replacement":
            return _amend(book, args, "voided")
        try:
            paths = _inputs(args.input)
        except InputUsageError as exc:  # the command line is at fault: exit 2 naming the flag
            print(f"monitor meters ingest: --input {exc}", file=sys.stderr)
            return 2
        return _ingest(book, paths)
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
    after = to_ms(_when(args.since)) if args.since else None
    until = to_ms(_when(args.until)) if args.until else None
    print(f"meter {spec.meter} ({spec.unit} x{spec.multiplier}), account {spec.account or '-'}")
    print("  settings periods:")
    for period in ledger.periods(args.meter, superseded=True):
        print("    " + period.describe())
    for row in ledger.rows(args.meter, after, until):
        print("  " + row.describe() + (f"  {row.message}" if row.message else ""))
    for line in iter_history(ledger, args.meter, after, until):
        print("  " + line)
    for step in ledger.clock_steps(args.meter, after, until):
        first, last = iso(step.first_ms / 1000), iso(step.last_ms / 1000)
        print(f"  {step.describe()} (stamped {first} ... {last} on the clock before)")
    return 0


def _when(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as exc:
        raise MeterError(str(exc)) from None


def _replace(book: MeterBook, args: argparse.Namespace) -> int:
    when = _when(args.time)
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


def _amend(book: MeterBook, args: argparse.Namespace, done: str) -> int:
    """`correct` and `void-replacement`: appended, then the meter's later rows re-judged."""
    when = _when(args.time)
    if done == "corrected":
        conditions = book.correct(args.meter, when, args.reading, args.by, args.why)
        what = f"reading at {iso(when)} corrected to {args.reading}"
    else:
        conditions = book.void_replacement(args.meter, when, args.by, args.why)
        what = f"replacement at {iso(when)} voided"
    print(
        f"meter {args.meter}: {what} by {args.by} (ledger {book.ledger.path}); quarters re-judged from there"
    )
    for c in conditions:
        print(f"  meter alarm {c.state}: {c.message}")
    return 0


def _columns(path: Path, header: list[str]) -> tuple[int, int, int]:
    """Where time, sensor and value are, matched without case or blanks (as replay does);
    a file without them is refused by name before anything is added."""
    names = [h.strip().lower() for h in header]
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise MeterError(f"{path}: header {','.join(header)!r} lacks column(s) {', '.join(missing)}")
    time, sensor, value = (names.index(c) for c in COLUMNS)
    return time, sensor, value


def _inputs(names: list[str]) -> list[Path]:
    """The `--input` files, with `monitor replay`'s conventions (`monitor.sources.inputs`)."""
    paths = [Path(input_path(name, "the readings in (zcat r.csv.gz | ...)")) for name in names]
    pipes_once(paths)
    return paths


def _ingest(book: MeterBook, paths: list[Path]) -> int:
    """Read CSVs as `monitor replay` does (bad rows counted, not fatal) and add the meter rows.
    Each is opened once and read once, front to back, so a pipe reads as a file does."""
    samples: list[Sample] = []
    bad = other = 0
    for path in paths:
        try:
            # -sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark, as replay allows
            fh = path.open(encoding="utf-8-sig", newline="")
        except OSError as exc:
            raise MeterError(f"cannot read {path}: {exc.strerror}") from None
        with fh:
            try:
                rows = list(csv.reader(fh))
            except (UnicodeDecodeError, csv.Error) as exc:
                raise MeterError(f"{path}: not a readable CSV file ({exc})") from None
            at = _columns(path, rows[0] if rows else [])
            for lineno, cells in enumerate(rows[1:], start=2):
                if not cells:  # a blank line, as DictReader skipped it
                    continue
                try:
                    if len(cells) <= max(at):
                        raise ValueError(f"{len(cells)} cell(s), the header has {len(rows[0])}")
                    time, sensor, value = (cells[i] for i in at)
                    sample = Sample(sensor, parse_time(time), float(value))
                    if not EARLIEST <= sample.time < LATEST:
                        raise ValueError(f"time {time} is outside 1970-2100")
                except (TypeError, ValueError) as exc:
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
