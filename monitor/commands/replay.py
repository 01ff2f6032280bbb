"""`monitor replay`: run recorded samples through the detection engine, write the events.

    monitor replay --config CONFIG --input SAMPLES.csv [--input MORE.csv ...] --events EVENTS.jsonl

Each alarm-condition transition becomes one JSON line, in time order. Bad rows are
counted and reported on stderr at the end; they never stop the replay. Prints a
one-line summary and exits 0; a bad config exits 2, an unreadable input file 1.

With an `influx` section in the config, the samples and every alarm transition
also go through the outbox to InfluxDB, drained while the replay runs and once
more before exit (`--drain-timeout`); what cannot be delivered in time stays in
the outbox for `monitor outbox drain`, and the replay still exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from monitor.commands import load_config_or_exit
from monitor.engine import Engine, ReplayStep, replay_steps
from monitor.errors import MonitorError, SourceError
from monitor.incidents import IncidentTracker
from monitor.incidents.influx import incident_lines
from monitor.meters.book import MeterBook
from monitor.model import Kind, ManualClock, Rule
from monitor.sinks.pipeline import SampleSink, open_sink, outbox_path
from monitor.sources.replay import ReadReport, Samples, read_csv
from monitor.station import StationStore, StationTracker, station_steps
from monitor.station.replay import has_station

HELP = "replay recorded samples (CSV) through the rules and write the alarm events (JSON lines)"
EVENT_RULES = frozenset(
    {
        Rule.SLUG,
        Rule.HIGH,
        Rule.LOW,
        Rule.STALE,
        *(Rule.HIGH_LEVEL, Rule.OVERFLOW, Rule.FAIL_TO_START, Rule.PUMP_STARTS, Rule.LONG_RUN),
    }
)


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
        "--drain-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="with InfluxDB configured: seconds to deliver the outbox before exit (default 60)",
    )
    parser.add_argument(
        "--no-incidents",
        action="store_true",
        help="do not record incidents under state_dir (default: record them, as `monitor run` does)",
    )
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
    left: int | None = None
    try:
        out = Path(args.events).open("w", encoding="utf-8")  # noqa: SIM115 - closed by `with out` below
    except OSError as exc:
        print(f"replay: cannot write events to {args.events}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    sink = open_sink(config) if config.influx is not None else None
    # Meter readings go to the station's ledger, as live polling does: re-replaying or
    # replaying what was polled live does not double count (one row per meter and time).
    book = (
        None
        if args.no_ledger or not any(s.kind is Kind.METER for s in config.sensors)
        else MeterBook.open(config, records=sink is not None)
    )
    meter_transitions = 0
    tracker: IncidentTracker | None = None
    if not args.no_incidents and config.incidents.enabled:
        try:
            tracker = IncidentTracker(config)
        except (MonitorError, OSError) as exc:
            print(f"replay: incidents not recorded: {exc}", file=sys.stderr)
    recorded: set[str] = set()

    def track(step: ReplayStep | None) -> None:
        """Incidents (issue 16) from the same step the events come from; an incident store
        that fails (a full disk) is reported once and the replay goes on without it."""
        nonlocal tracker
        if tracker is None:
            return
        try:
            if step is not None:
                tracker.add_columns(
                    engine.sensors, step.sensor, step.time, step.value, step.quality, step.accepted
                )
                tracker.apply(step.conditions)
            changed = tracker.advance(final=step is None)
        except (MonitorError, OSError) as exc:
            print(f"replay: incidents not recorded from here on: {exc}", file=sys.stderr)
            tracker.close()
            tracker = None
            return
        recorded.update(i.id for i in changed)
        if sink is not None and sink.outbox is not None and changed:
            sink.outbox.append(incident_lines(changed))

    # The pumping station (monitor/station): derived sensors, pump runs, overflow records.
    station = StationStore.open(config.state_dir) if has_station(config) else None
    station_tracker = StationTracker(config, station) if station is not None else None

    def steps() -> Iterator[ReplayStep]:
        nonlocal meter_transitions
        source = (
            station_steps(config, engine, samples, station_tracker) if station else replay(engine, samples)
        )
        for step in source:
            track(step)
            if book is not None:
                meter_transitions += len(
                    book.ingest_arrays(
                        engine.sensors, step.sensor, step.time, step.value, step.quality, step.accepted
                    )
                )
                if sink is not None:
                    sink.write_meter_records(book.take_records())
            yield step
        track(None)

    try:
        with out:
            if sink is None:
                for step in steps():
                    events += write_events(step, out)
            else:
                events, left = asyncio.run(
                    replay_to_influx(steps(), engine.sensors, out, sink, args.drain_timeout)
                )
    finally:
        if sink is not None:
            sink.close()
        if station is not None:
            station.close()
        if book is not None:
            print(
                f"replay: meter readings added to {book.ledger.path} ({meter_transitions} meter alarm"
                f" transition(s); `monitor meters list` shows them)",
                file=sys.stderr,
            )
            book.close()
        if tracker is not None:
            tracker.close()
    if tracker is not None and recorded:
        print(
            f"replay: {len(recorded)} incident(s) recorded in {tracker.store.path}"
            f" (`monitor incidents list --config {args.config}`)",
            file=sys.stderr,
        )
    elapsed = max(time.perf_counter() - started, 1e-9)
    for report in reports:
        for line in report.lines():
            print(f"replay: {line}", file=sys.stderr)
    for line in engine_report(engine):
        print(f"replay: {line}", file=sys.stderr)
    seen = len(set(samples.sensor[samples.sensor >= 0].tolist()))
    n = engine.counters.samples
    print(f"replay: {n} samples, {seen} sensors, {events} events, {n / elapsed:.0f} samples/s")
    if sink is not None and sink.drainer is not None:
        if left:
            print(
                f"replay: {left} point(s) remain in the outbox {outbox_path(config)}"
                f" ({sink.drainer.stats.last_error or 'not delivered in time'});"
                f" `monitor outbox drain --config {args.config}` delivers them",
                file=sys.stderr,
            )
        else:
            print(
                f"replay: outbox drained, {sink.drainer.stats.written} point(s) written"
                f" to {sink.drainer.writer.target}"
            )
    return 0


async def replay_to_influx(
    steps: Iterable[ReplayStep], names: tuple[str, ...], out: TextIO, sink: SampleSink, drain_timeout: float
) -> tuple[int, int]:
    """Replay with the outbox drained alongside, then drain what is left for up to
    `drain_timeout` seconds; returns (events, points left in the outbox)."""
    assert sink.drainer is not None
    drainer = sink.drainer
    task = asyncio.create_task(drainer.run(), name="outbox drainer")
    events = 0
    try:
        for step in steps:
            events += write_events(step, out)
            write_step(sink, names, step)
            await asyncio.sleep(0)  # the drainer's turn: settle the last batch, post the next
    finally:
        drainer.stop()  # settles the request on the wire, cuts a backoff short
        await task
    return events, await sink.drain(drain_timeout)


def write_step(sink: SampleSink, names: tuple[str, ...], step: ReplayStep) -> None:
    """A replay batch into the outbox: the accepted samples, then every alarm transition."""
    ok = step.accepted
    sink.write_columns(
        names,
        step.sensor[ok].tolist(),
        step.time[ok].tolist(),
        step.value[ok].tolist(),
        step.quality[ok].tolist(),
    )
    sink.write_conditions(step.conditions)


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
