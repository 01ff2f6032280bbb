"""`monitor incidents`: list, show, note, close and export incident records.

    monitor incidents list   --config C [--format text|json] [--status open|ended|closed|overdue]
    monitor incidents show   --config C --id ID [--format text|json]
    monitor incidents note   --config C --id ID --by NAME --text TEXT
                             [--kind note|statement|notice] [--due DATE]
    monitor incidents close  --config C --id ID --by NAME --reason TEXT
    monitor incidents export --config C --id ID --out DIR

Reads and writes `state_dir/incidents.sqlite` beside a running daemon (WAL; notes and
closes go to their own tables, so nothing the daemon writes is overwritten).
Exit 0 done, 1 unknown incident or unusable store, 2 bad config or arguments, 3 (`export`)
the package is written but the incident's evidence is incomplete (a damaged evidence block):
it holds the evidence up to the damage, and stderr and its manifest say from when. A frozen
incident whose store is damaged but whose evidence file verifies is exported from that file,
whole: exit 0, the damage said on stderr and in the manifest (the code says what the
package is; a script must not set aside the one package that is the frozen evidence).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from datetime import date
from pathlib import Path

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.config import Config
from monitor.errors import StateError
from monitor.incidents.due import check_time_limit, dues, local_midnight
from monitor.incidents.export import export
from monitor.incidents.model import Incident, Note, NoteKind, Status
from monitor.incidents.package import verified_file
from monitor.incidents.report import detail_lines, incident_json, summary_line
from monitor.incidents.store import FILE, IncidentStore
from monitor.model import parse_time

EXIT_INCOMPLETE = 3  # export: written, with the evidence up to the damage only (`export.Incomplete`)
HELP = "incident records for the Superintendent: list, show, note, close, export"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="incidents, newest last (open, ended, closed; overdue flagged)")
    show = sub.add_parser("show", help="one incident in full")
    note = sub.add_parser("note", help="add a note, a received §139-15 statement, or a served notice")
    close = sub.add_parser("close", help="close an incident's case")
    exp = sub.add_parser("export", help="HTML report with plot, CSV evidence, JSON and a SHA-256 manifest")
    for p in (listing, show, note, close, exp):
        add_config_argument(p)
    for p in (show, note, close, exp):
        p.add_argument("--id", required=True, help="incident id (from `monitor incidents list`)")
    for p in (listing, show):
        p.add_argument("--format", choices=("text", "json"), default="text", help="default text")
    listing.add_argument(
        "--status",
        choices=("open", "ended", "closed", "overdue"),
        default=None,
        help="only these (default: all)",
    )
    for p in (note, close):
        p.add_argument("--by", required=True, help="who (recorded with the time)")
    note.add_argument("--text", required=True, help="what to record (kept with who and when)")
    note.add_argument(
        "--kind", choices=[str(k) for k in NoteKind], default="note", help="a note, a statement or a notice"
    )
    note.add_argument(
        "--due", default=None, help="notice only: time limit for correction (local date or ISO time)"
    )
    close.add_argument("--reason", required=True, help="why the case is closed (kept in the record)")
    exp.add_argument("--out", required=True, help="directory for the report files")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    path = config.state_dir / FILE
    if not path.exists():
        if args.action == "list":
            print("[]" if args.format == "json" else "no incidents recorded")
            return 0
        print(f"no incident store at {path}: no incident has been recorded here yet", file=sys.stderr)
        return 1
    try:
        with IncidentStore(config.state_dir) as store:
            return _run(config, store, args, time.time())
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(config: Config, store: IncidentStore, args: argparse.Namespace, now: float) -> int:
    zone = config.station.zone
    if args.action == "list":
        found = store.incidents()
        if args.status == "overdue":
            found = [i for i in found if any(d.overdue for d in dues(i, now))]
        elif args.status is not None:
            found = [i for i in found if i.status is Status(args.status)]
        if args.format == "json":
            print(json.dumps([incident_json(i, zone, now) for i in found], indent=2, ensure_ascii=False))
        else:
            print("\n".join(summary_line(i, zone, now) for i in found) if found else "no incidents")
        return 0
    inc = store.get(args.id)
    if inc is None:
        print(f"no incident {args.id!r} (see `monitor incidents list`)", file=sys.stderr)
        return 1
    if args.action == "show":
        if args.format == "json":
            print(json.dumps(incident_json(inc, zone, now), indent=2, ensure_ascii=False))
        else:
            print("\n".join(detail_lines(inc, zone, now)))
            try:
                verifies = store.verify(inc)
            except StateError:  # a damaged evidence block: the verdict, then which block (exit 1)
                print("  evidence DOES NOT VERIFY")
                raise
            print(
                "  evidence "
                + (
                    "verifies"
                    if verifies
                    else "not frozen yet"
                    if not inc.frozen
                    else _not_verified(store, inc)
                )
            )
        return 0
    if args.action == "note":
        return _note(config, store, inc, args, now)
    if args.action == "close":
        by, reason = args.by.strip(), args.reason.strip()
        if not by or not reason:  # as `note` and the API: a case closed by nobody is no record
            print("--by and --reason must not be empty", file=sys.stderr)
            return 2
        if not store.close_case(inc.id, now, by, reason):
            print(f"incident {inc.id} is closed already", file=sys.stderr)
            return 1
        print(f"incident {inc.id} closed by {by}")
        return 0
    if inc.evidence_note is not None:  # said before the damaged block's error, if it comes
        print(f"incident {inc.id}: {inc.evidence_note}", file=sys.stderr)
    package = export(store, inc, Path(args.out), zone, now)
    for name, sha in package.hashes.items():
        print(f"{sha}  {Path(args.out) / name}")
    print(f"manifest: {Path(args.out) / 'manifest.json'}")
    if package.store_damaged is not None:  # the package is whole: said, exit 0 (docs/commands.md)
        print(f"incident {inc.id}: {package.store_damaged.statement}", file=sys.stderr)
    if package.file_not_verified is not None:  # whole too, from the store: the file's state said
        print(f"incident {inc.id}: {package.file_not_verified.statement}", file=sys.stderr)
    if package.incomplete is not None:  # last, where a script's log and a person's eye land
        print(f"incident {inc.id}: {package.incomplete.statement}", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


def _not_verified(store: IncidentStore, inc: Incident) -> str:
    """`show`'s verdict on a frozen incident that does not verify, saying which half is wrong:
    a file lost to a power cut, with rows that verify, is not rows tampered with."""
    _, why, _ = verified_file(store, inc)
    rows = hashlib.sha256(store.evidence_csv(inc.id)).hexdigest() == inc.evidence_sha256
    file = f"the frozen evidence file {why or 'verifies'}"
    if rows:
        export = "`monitor incidents export` builds the package from them"
        return f"DOES NOT VERIFY: {file}; the store's rows verify ({export})"
    return f"DOES NOT VERIFY: {file}; the store's rows do not" + ("" if why else " (`export` uses the file)")


def _note(config: Config, store: IncidentStore, inc: Incident, args: argparse.Namespace, now: float) -> int:
    kind = NoteKind(args.kind)
    due = None
    if args.due is not None:
        if kind is not NoteKind.NOTICE:
            print("--due goes with --kind notice (the notice's time limit for correction)", file=sys.stderr)
            return 2
        try:
            due = check_time_limit(parse_due(args.due, config), inc.start, config.station.zone)
        except ValueError as exc:
            print(f"--due: {exc}", file=sys.stderr)
            return 2
    text = args.text.strip()
    if not text or not args.by.strip():
        print("--text and --by must not be empty", file=sys.stderr)
        return 2
    store.add_note(inc.id, Note(time=now, by=args.by.strip(), text=text, kind=kind, due=due))
    print(f"note added to {inc.id}")
    return 0


def parse_due(text: str, config: Config) -> float:
    """A local date (`2026-12-15`: due by the end of that day in the station's zone) or a time."""
    try:
        day = date.fromisoformat(text.strip())
    except ValueError:
        return parse_time(text)
    return local_midnight(date.fromordinal(day.toordinal() + 1), config.station.zone)
