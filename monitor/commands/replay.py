"""`monitor replay`: run recorded samples through the detection engine, write the events.

    monitor replay --config CONFIG --input SAMPLES.csv|.parquet [--input MORE ...] --events EVENTS.jsonl
    monitor replay --config CONFIG --from-influx --start T --end T --events EVENTS.jsonl
    monitor replay --config CONFIG (--input ... | --from-influx ...) --what-if CANDIDATE.yaml [--format json]
    zcat SAMPLES.csv.gz | monitor replay --config CONFIG --input - --events EVENTS.jsonl

Each alarm-condition transition becomes one JSON line, in time order. Bad rows are
counted and reported on stderr at the end; they never stop the replay. Prints a
one-line summary and exits 0; a bad config exits 2, an unreadable input file 1, and a
state dir a daemon or another replay holds 75 (monitor/statelock.py: a replay that writes
incidents, ledger, outbox or station records into state_dir holds it while it runs).
CSV may come from a pipe (`-` is standard input); Parquet from a pipe exits 2.

With an `influx` section in the config, the samples and every alarm transition
also go through the outbox to InfluxDB, drained while the replay runs and once
more before exit (`--drain-timeout`); what cannot be delivered in time stays in
the outbox for `monitor outbox drain`, and the replay still exits 0. Replaying
from the historian (`--from-influx`) writes nothing back: not to InfluxDB, the ledger or
the incident store (the live run recorded those already).

`--what-if` runs the config and a candidate over the same samples in one pass and
prints what each would have raised (`replay_whatif.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from monitor.commands import add_config_argument, load_config_or_exit
from monitor.config import Config
from monitor.engine import Engine, ReplayStep, replay_steps
from monitor.errors import InputUsageError, MonitorError, SourceError
from monitor.heap import keep_freed_memory
from monitor.model import Kind, ManualClock, Rule, iso, parse_time
from monitor.sources.inputs import input_path
from monitor.sources.replay import ReadReport, Samples, merge, stream
from monitor.statelock import EXIT_IN_USE, StateDirInUseError, hold_state_dir

if TYPE_CHECKING:
    from monitor.incidents.worker import ReplayTracker
    from monitor.sinks.pipeline import SampleSink
    from monitor.station import StationStore, StationTracker

# The historian readers (monitor.sources.historian: http.client, ssl), imported by --from-influx
# only; their names are spelled here so --help lists them (a test keeps the two the same).
HISTORIANS = ("influxql", "flux", "victoriametrics")

# The incident worker (multiprocessing, the tracker, the store) is imported when incidents
# are recorded, not for --no-incidents, --from-influx or a station without them.

# What only some replays need (the outbox and asyncio, the meter ledger, the station's parts,
# the historian, --what-if) is imported where it is used: start-up is part of every replay.

HELP = "replay recorded samples (CSV, Parquet, the historian) through the rules; write the alarm events"
EVENT_RULES = frozenset(
    {
        Rule.SLUG,
        Rule.HIGH,
        Rule.LOW,
        Rule.STALE,
        Rule.FROZEN,
        Rule.BAD_VALUE,
        *(Rule.HIGH_LEVEL, Rule.OVERFLOW, Rule.FAIL_TO_START, Rule.PUMP_STARTS, Rule.LONG_RUN),
    }
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        action="append",
        metavar="SAMPLES",
        help="CSV or Parquet file with time,sensor,value columns; repeatable; CSV may come"
        " from a pipe: - (standard input, e.g. from zcat) or a named pipe",
    )
    source.add_argument(
        "--from-influx",
        action="store_true",
        help="read the station's stored samples back from the config's influx section (needs --start, --end)",
    )
    parser.add_argument(
        "--start", type=_time_arg, metavar="T", help="with --from-influx: ISO 8601 or epoch s"
    )
    parser.add_argument("--end", type=_time_arg, metavar="T", help="with --from-influx: end (exclusive)")
    parser.add_argument(
        "--historian",
        choices=("auto", *HISTORIANS),
        default="auto",
        help="with --from-influx: how to read it (auto: InfluxQL for api v1, else asks the server)",
    )
    parser.add_argument("--events", metavar="EVENTS.jsonl", help="where to write the events")
    parser.add_argument(
        "--what-if",
        metavar="CANDIDATE.yaml",
        help="also run a candidate config over the same samples and report the alarms that differ",
    )
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="the --what-if report's format"
    )
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


def _time_arg(text: str) -> float:
    """ISO 8601 with a zone or epoch seconds, 1970..2100 as the historian stores them; epoch
    milliseconds (a Grafana URL's `from=`) are refused with the seconds to type instead."""
    from monitor.sources.replay import T_MAX, T_MIN

    try:
        t = parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if t < T_MIN:
        raise argparse.ArgumentTypeError(f"time {text} is before 1970")
    if t > T_MAX:
        hint = ""
        if T_MIN <= t / 1000 <= T_MAX:
            seconds = f"{t / 1000:.3f}".rstrip("0").rstrip(".")
            hint = f" (epoch milliseconds? {seconds} is {iso(float(seconds))})"
        raise argparse.ArgumentTypeError(f"time {text} is after 2100 as epoch seconds{hint}")
    return t


def open_samples(
    args: argparse.Namespace, config: Config, sensors: tuple[str, ...]
) -> tuple[Iterable[Samples], list[ReadReport]]:
    """The files, or the historian's stored series, as time-ordered batches."""
    if not args.from_influx:
        return stream([input_path(p, _PIPE_IN) for p in args.input], sensors)
    from monitor.sources.historian import open_history

    history = open_history(config, args.start, args.end, args.historian, sensors)
    return merge([history]), [history.report]


_PIPE_IN = "the samples in (zcat day.csv.gz | ...)"  # the advice when `-` is a terminal


def input_error(exc: SourceError) -> int:
    """Prints why the input could not be read; 2 when the command line is at fault
    (`--input` named, as a bad flag is), else 1."""
    if isinstance(exc, InputUsageError):
        print(f"replay: --input {exc}", file=sys.stderr)
        return 2
    print(f"replay: {exc}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    if args.from_influx and (args.start is None or args.end is None or args.start >= args.end):
        print("replay: --from-influx needs --start and a later --end", file=sys.stderr)
        return 2
    if not args.from_influx and (args.start is not None or args.end is not None):
        print("replay: --start and --end only go with --from-influx (a file replays whole)", file=sys.stderr)
        return 2
    if args.what_if is not None and args.events is not None:
        print("replay: --what-if writes no events; run without --what-if for --events", file=sys.stderr)
        return 2
    if args.what_if is None and args.format != "text":
        print("replay: --format is the --what-if report's; events are always JSON lines", file=sys.stderr)
        return 2
    if args.what_if is None and args.events is None:
        print("replay: --events is required (or --what-if for a comparison)", file=sys.stderr)
        return 2
    config = load_config_or_exit(args.config, args.env_file)
    if args.what_if is not None:
        from monitor.commands.replay_whatif import run_what_if

        return run_what_if(args, config, load_config_or_exit(args.what_if), open_samples)
    writes = state_writes(args, config)
    try:  # a running daemon's (or another replay's) state dir is not written into
        lock = hold_state_dir(config.state_dir, "monitor replay") if writes else None
    except StateDirInUseError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return EXIT_IN_USE
    try:
        return record(args, config, writes)
    finally:
        if lock is not None:
            lock.release()


def state_writes(args: argparse.Namespace, config: Config) -> frozenset[str]:
    """What this replay writes under state_dir; from the historian nothing (the live run
    recorded it), and --what-if never comes here (it writes nothing at all)."""
    if args.from_influx:
        return frozenset()
    writes = {
        "incidents": not args.no_incidents and config.incidents.enabled,
        "outbox": config.influx is not None,
        "ledger": not args.no_ledger and any(s.kind is Kind.METER for s in config.sensors),
        "station": config.has_station,
    }
    return frozenset(name for name, yes in writes.items() if yes)


def record(args: argparse.Namespace, config: Config, writes: frozenset[str]) -> int:
    """The replay itself, with the state dir's lock held when it writes there."""
    engine = Engine(config.rules, ManualClock())
    keep_freed_memory()  # before the incident worker is forked: it inherits the setting
    started = time.perf_counter()
    # Before the input is opened: the worker is forked, and no reader thread runs yet.
    tracker: ReplayTracker | None = None
    if "incidents" in writes:
        from monitor.incidents.worker import replay_tracker

        try:
            tracker = replay_tracker(config)  # in a process of its own
        except (MonitorError, OSError) as exc:
            print(f"replay: incidents not recorded: {exc}", file=sys.stderr)
    try:
        batches, reports = open_samples(args, config, engine.sensors)
    except SourceError as exc:
        if tracker is not None:
            tracker.close()
        return input_error(exc)
    seen = np.zeros(len(engine.sensors), dtype=bool)
    events = 0
    left: int | None = None
    try:
        out = Path(args.events).open("w", encoding="utf-8")  # noqa: SIM115 - closed by `with out` below
    except OSError as exc:
        print(f"replay: cannot write events to {args.events}: {exc.strerror or exc}", file=sys.stderr)
        if tracker is not None:
            tracker.close()
        return 1
    # From the historian nothing is written back: it holds these samples already.
    sink: SampleSink | None = None
    book = None
    station: StationStore | None = None
    station_tracker: StationTracker | None = None
    try:
        if "outbox" in writes:
            from monitor.sinks.pipeline import open_sink

            sink = open_sink(config)
        # Meter readings go to the station's ledger, as live polling does: re-replaying or
        # replaying what was polled live does not double count (one row per meter and time).
        if "ledger" in writes:
            from monitor.meters.book import MeterBook

            book = MeterBook.open(config, records=sink is not None)
        # The pumping station (monitor/station): derived sensors, pump runs, overflow records
        # (not recorded again from the historian: the live run recorded them).
        if config.has_station:
            from monitor.reconcile import device_stamped
            from monitor.station import StationStore, StationTracker

            station = StationStore.open(config.state_dir) if "station" in writes else None
            station_tracker = StationTracker(config, station, device=device_stamped(config))
    except BaseException as exc:  # what is open is closed here, the worker stopped and reaped
        for part in (station, book, sink, out, tracker):
            if part is not None:
                part.close()
        if not isinstance(exc, MonitorError | OSError):
            raise
        print(f"replay: {exc}", file=sys.stderr)  # a ledger or station store that cannot be opened
        return 1
    meter_transitions = 0
    recorded: set[str] = set()

    def track(step: ReplayStep | None) -> None:
        """Incidents (issue 16) from the same step the events come from; an incident store
        that fails (a full disk) is reported once and the replay goes on without it."""
        nonlocal tracker
        if tracker is None:
            return
        from monitor.incidents.worker import hand_over

        try:
            if step is not None:
                hand_over(tracker, engine.sensors, step)
            changed = tracker.advance(final=step is None)
        except (MonitorError, OSError) as exc:
            print(f"replay: incidents not recorded from here on: {exc}", file=sys.stderr)
            tracker.close()
            tracker = None
            return
        recorded.update(i.id for i in changed)
        if sink is not None and sink.outbox is not None and changed:
            from monitor.incidents.influx import incident_lines

            sink.outbox.append(incident_lines(changed))

    def steps() -> Iterator[ReplayStep]:
        nonlocal meter_transitions
        if station_tracker is not None:
            from monitor.station import station_steps

            source = station_steps(config, engine, batches, station_tracker)
        else:
            source = replay(engine, batches)
        unseen = True  # some sensor has no accepted sample yet
        for step in source:
            if unseen:  # a mask and a gather of every row: 22 ms at 10 M rows, once all are seen none
                seen[step.sensor[step.accepted]] = True
                unseen = not seen.all()
            track(step)
            daily = station_tracker.take_daily() if station_tracker is not None else []
            if daily and sink is not None and sink.outbox is not None:
                sink.outbox.append(daily)  # pump and station totals of each local day
            if book is not None:
                meter_transitions += len(
                    book.ingest_arrays(
                        engine.sensors, step.sensor, step.time, step.value, step.quality, step.accepted
                    )
                )
                if sink is not None:  # at the outbox's cap, only what its room holds
                    book.send(sink.write_meter_records, limit=None, room=sink.meter_room)
            yield step
        track(None)

    try:
        with out:
            if sink is None:
                for step in steps():
                    events += write_events(step, out)
            else:
                import asyncio

                events, left = asyncio.run(
                    replay_to_influx(steps(), engine.sensors, out, sink, args.drain_timeout)
                )
    except SourceError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the events file: a full disk, /dev/full, a yanked USB stick
        print(f"replay: cannot write events to {args.events}: {exc.strerror or exc}", file=sys.stderr)
        return 1
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
            f"replay: {len(recorded)} incident(s) recorded in {tracker.path}"
            f" (`monitor incidents list --config {args.config}`)",
            file=sys.stderr,
        )
    elapsed = max(time.perf_counter() - started, 1e-9)
    for report in reports:
        for line in report.lines():
            print(f"replay: {line}", file=sys.stderr)
    for line in engine_report(engine):
        print(f"replay: {line}", file=sys.stderr)
    if args.from_influx and seen.any() and not seen.all():  # renamed since, or never recorded
        missing = [name for name, ok in zip(engine.sensors, seen.tolist(), strict=True) if not ok]
        line = f"{len(missing)} sensor(s) of the config without a sample in this range: {', '.join(missing)}"
        print(f"replay: {line}", file=sys.stderr)
    n = engine.counters.samples
    print(f"replay: {n} samples, {int(seen.sum())} sensors, {events} events, {n / elapsed:.0f} samples/s")
    if sink is not None and sink.drainer is not None:
        from monitor.sinks.pipeline import outbox_path

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
    import asyncio

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


def replay(engine: Engine, batches: Iterable[Samples]) -> Iterator[ReplayStep]:
    """The replay loop: batches of samples with their conditions. A sink that should also
    receive the samples (an InfluxDB outbox) consumes these same steps."""
    for b in batches:
        yield from replay_steps(engine, b.sensor, b.time, b.value, b.quality)


def write_events(step: ReplayStep, out: TextIO) -> int:
    """The step's event lines, in one write, from its columns (no object each)."""
    text, events = step.columns.event_lines(EVENT_RULES)
    if events:
        out.write(text)
    return events


def engine_report(engine: Engine) -> list[str]:
    c = engine.counters
    lines = []
    if c.out_of_order:
        lines.append(f"{c.out_of_order} sample(s) not later than the same sensor's previous one (skipped)")
    if c.bad_values:
        per = ", ".join(f"{s} {n}" for s, n in sorted(c.bad_by_sensor.items()))
        lines.append(f"{c.bad_values} value(s) not believable, flagged bad data and not judged ({per})")
    return lines
