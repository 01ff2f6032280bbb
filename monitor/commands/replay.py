"""`monitor replay`: run recorded samples through the detection engine, write the events.

    monitor replay --config CONFIG --input SAMPLES.csv [--input MORE.csv ...] --events EVENTS.jsonl

Each alarm-condition transition becomes one JSON line, in time order. Bad rows are
counted and reported on stderr at the end; they never stop the replay. Prints a
one-line summary and exits 0; a bad config exits 2, an unreadable input file 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from monitor.commands import load_config_or_exit
from monitor.engine import Engine, ReplayStep, replay_steps
from monitor.errors import SourceError
from monitor.meters.book import MeterBook
from monitor.model import Kind, ManualClock, Rule
from monitor.sources.replay import ReadReport, Samples, read_csv

HELP = "replay recorded samples (CSV) through the rules and write the alarm events (JSON lines)"
EVENT_RULES = frozenset({Rule.SLUG, Rule.HIGH, Rule.LOW, Rule.STALE})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="station config YAML")
    parser.add_argument(
        "--input",
        required=True,
        action="append",
        metavar="SAMPLES.csv",
        help="CSV with time,sensor,value; repeatable",
    )
    parser.add_argument("--events", required=True, metavar="EVENTS.jsonl", help="where to write the events")
    parser.add_argument(
        "--no-ledger",
        action="store_true",
        help="do not add meter readings to the meter ledger under state_dir (default: add them)",
    )


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config)
    engine = Engine(config.rules, ManualClock())
    started = time.perf_counter()
    try:
        samples, reports = read_inputs(args.input, engine.sensors)
    except SourceError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    events = 0
    try:
        out = Path(args.events).open("w", encoding="utf-8")  # noqa: SIM115 - closed by `with out` below
    except OSError as exc:
        print(f"replay: cannot write events to {args.events}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    # Meter readings go to the station's ledger, as live polling does: re-replaying or
    # replaying what was polled live does not double count (one row per meter and time).
    book = (
        None
        if args.no_ledger or not any(s.kind is Kind.METER for s in config.sensors)
        else MeterBook.open(config, records=False)  # with an InfluxDB sink: records=True, write them
    )
    meter_transitions = 0
    try:
        with out:
            for step in replay(engine, samples):
                events += write_events(step, out)
                if book is not None:
                    meter_transitions += len(
                        book.ingest_arrays(
                            engine.sensors, step.sensor, step.time, step.value, step.quality, step.accepted
                        )
                    )
    finally:
        if book is not None:
            print(
                f"replay: meter readings added to {book.ledger.path} ({meter_transitions} meter alarm"
                f" transition(s); `monitor meters list` shows them)",
                file=sys.stderr,
            )
            book.close()
    elapsed = max(time.perf_counter() - started, 1e-9)
    for report in reports:
        for line in report.lines():
            print(f"replay: {line}", file=sys.stderr)
    for line in engine_report(engine):
        print(f"replay: {line}", file=sys.stderr)
    seen = len(set(samples.sensor[samples.sensor >= 0].tolist()))
    n = engine.counters.samples
    print(f"replay: {n} samples, {seen} sensors, {events} events, {n / elapsed:.0f} samples/s")
    return 0


def read_inputs(paths: list[str], sensors: tuple[str, ...]) -> tuple[Samples, list[ReadReport]]:
    """All inputs, merged into one stream in time order."""
    parts: list[Samples] = []
    reports: list[ReadReport] = []
    for path in paths:
        samples, report = read_csv(path, sensors)
        parts.append(samples)
        reports.append(report)
    return (parts[0] if len(parts) == 1 else Samples.concat(parts)), reports


def replay(engine: Engine, samples: Samples) -> Iterator[ReplayStep]:
    """The replay loop: batches of samples with their conditions. A sink that should also
    receive the samples (an InfluxDB outbox) consumes these same steps."""
    yield from replay_steps(engine, samples.sensor, samples.time, samples.value, samples.quality)


def write_events(step: ReplayStep, out: TextIO) -> int:
    n = 0
    for cond in step.conditions:
        if cond.rule in EVENT_RULES:
            out.write(json.dumps(cond.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


def engine_report(engine: Engine) -> list[str]:
    c = engine.counters
    lines = []
    if c.out_of_order:
        lines.append(f"{c.out_of_order} sample(s) not later than the same sensor's previous one (skipped)")
    if c.bad_values:
        per = ", ".join(f"{s} {n}" for s, n in sorted(c.bad_by_sensor.items()))
        lines.append(f"{c.bad_values} value(s) not believable, flagged bad data and not judged ({per})")
    return lines
