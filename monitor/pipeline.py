"""The sample pipeline: store, then judge, then acknowledge. The one way into the alarms.

Sources hand over batches with `emit(items, ack)`. For each batch, in this order:

1. **store**: the samples are committed to the series store (with an intake record,
   see below), the outbox and, for meters, the ledger, whose rows also go to the
   outbox;
2. **judge**: the engine (and the meter book's verdicts) turn the batch into
   conditions, the conditions into alarm transitions (journaled by the manager);
3. **acknowledge**: the source's `ack` runs (an MQTT source sends the PUBACKs).

So a crash at any point loses nothing that was acknowledged: an unacknowledged
QoS 1 message is delivered again by the broker, and stored again idempotently.

**Why the stores agree after a crash: an idempotent re-apply, not one transaction.**
The series store, outbox and ledger are three SQLite files in WAL mode, and SQLite
only makes a transaction across ATTACHed databases atomic in rollback-journal mode;
in WAL mode a crash can leave one file committed and another not. So the series
store's transaction also holds the batch as an *intake* record, released once the
outbox and ledger committed. At start, every held batch is applied again to the
outbox and the ledger (`monitor.recovery.recover`). Each step is idempotent by key: the series store
and the ledger keep one row per (sensor, time), and InfluxDB keeps one point per
series and timestamp, so a repeated outbox line overwrites itself. Re-applying a
held batch any number of times gives the same stores, so recovery converges even
if it is itself interrupted.

**A store that fails** (disk full, read-only, I/O error) stalls the pipeline: the
batch stays at the head of the queue unacknowledged, a critical `disk_full` alarm
is raised, the cause is logged once (`sqlite.real_cause`: SQLite calls a file system gone
read-only a "disk I/O error", so the disk is asked), and the batch is tried again every
`RETRY` seconds until it is stored. MQTT readings wait on the broker (nothing is
acknowledged); Modbus readings are kept up to `HOLD_MAX` items, beyond which the
oldest unacknowledged-less (Modbus) items are dropped and counted.

**Listeners** (incidents): `listen(listener)` registers a `BatchListener`; after
each batch is stored and judged (and after timer work or an operator action that
raised conditions), it gets the batch's samples, the conditions and the alarm
transitions they caused, before the source is acknowledged. A listener that raises
is logged with its traceback and counted (`stats.listener_errors`); it cannot stop
the pipeline or the acknowledgement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from monitor import diskspace
from monitor.alarms import AlarmManager
from monitor.config import Config
from monitor.diskspace import DiskWatch
from monitor.engine import ClockWatch, Engine
from monitor.errors import SinkError, StateError
from monitor.meters.book import MeterBook
from monitor.model import Alarm, Clock, Condition, ConditionState, Kind, Rule, Sample
from monitor.reconcile import Reconciler
from monitor.sinks.pipeline import SampleSink
from monitor.sqlite import real_cause
from monitor.station.live import LiveStation

log = logging.getLogger(__name__)

Ack = Callable[[], None]
BATCH = 5000  # items per store transaction
RETRY = 2.0  # seconds between attempts while the state disk refuses writes
HOLD_MAX = 100_000  # Modbus items kept while stalled; MQTT waits on the broker instead
DISK_SENSOR = diskspace.SENSOR
DISK_CITATION = diskspace.CITATION


class BatchListener(Protocol):
    """Told about every stored and judged batch (incidents hook in here): its samples as
    stored, the conditions they (or a timer, or an operator action) caused, and the alarm
    transitions those made."""

    def judged(
        self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
    ) -> None: ...


@dataclass
class PipelineStats:
    """Pipeline figures for the health snapshot and /metrics."""

    samples_by_source: dict[str, int] = field(default_factory=dict)
    conditions: int = 0
    batches: int = 0
    last_batch_wall: float | None = None
    stalled: str | None = None  # the store's error while the state disk refuses writes
    stalls: int = 0
    dropped: int = 0  # Modbus items dropped while stalled (beyond HOLD_MAX)
    recovered: int = 0  # held intake batches re-applied at start (`monitor.recovery`)
    listener_errors: int = 0
    unjournaled: int = 0  # alarm transitions the journal refused (a full disk)
    restamped: int = 0  # readings stamped before a gateway clock step, moved onto the new clock


@dataclass
class _Entry:
    items: Sequence[Sample | Condition]
    ack: Ack | None
    handed: float = -math.inf  # the clock watch's monotonic time it was handed over (`ClockWatch.forget`)


@dataclass
class _Batch:
    """One batch on its way through the stores; the stage survives a failed attempt,
    so a retry does not append what already committed a second time."""

    entries: list[_Entry]
    raw: list[Sample]  # as the source read them: the engine judges (and counts bad values) these
    samples: list[Sample]  # as stored: an unbelievable value marked BAD_DATA
    meter_samples: list[Sample]
    conditions: list[Condition]
    held: int | None = None  # intake record in the series store
    in_outbox: bool = False
    in_ledger: bool = False
    generation: int = 0  # the clock it was last moved onto (`ClockWatch.generation`)


class SourceEmit:
    """What a source calls with its readings: counted per source, then `Pipeline.emit`."""

    def __init__(self, pipeline: Pipeline, name: str) -> None:
        self.pipeline = pipeline
        self.name = name

    def __call__(self, items: Sequence[Sample | Condition], ack: Ack | None = None, /) -> None:
        by_source = self.pipeline.stats.samples_by_source
        by_source[self.name] += sum(1 for i in items if isinstance(i, Sample))
        self.pipeline.emit(items, ack)


class Pipeline:
    """Owns the order of store, judge and acknowledge, and every path into the alarms."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        engine: Engine,
        alarms: AlarmManager,
        sink: SampleSink,
        meters: MeterBook,
        reconciler: Reconciler,
        disk: DiskWatch | None = None,
        clock_watch: ClockWatch | None = None,
        station: LiveStation | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.engine = engine
        self.alarms = alarms
        self.sink = sink
        self.meters = meters
        self.reconciler = reconciler
        self.disk = disk
        self.clock_watch = clock_watch  # the gateway clock's check (engine/clock_step.py)
        self.station = station  # derived samples into each batch, pumps and wet well judged
        self.stats = PipelineStats()
        self.latest: dict[str, Sample] = {}
        self._kinds = {s.id: s.kind for s in config.sensors}
        self._queue: deque[_Entry] = deque()
        self._held = 0  # items in the queue
        self._wake = asyncio.Event()
        self._listeners: list[BatchListener] = []
        self._retry_at = 0.0
        self._stuck: _Batch | None = None  # the batch a store refused, tried again first
        self._meters_failing = False  # `send_meter_points` failed and said so

    # --- intake ------------------------------------------------------------------------

    def source(self, name: str) -> SourceEmit:
        """An `Emit` (and `AckedEmit`) for one source that counts its samples."""
        self.stats.samples_by_source.setdefault(name, 0)
        return SourceEmit(self, name)

    def emit(self, items: Sequence[Sample | Condition], ack: Ack | None = None) -> None:
        """Take over what a source read (on the loop thread); never blocks."""
        self._queue.append(_Entry(items, ack, self._handed()))
        self._held += len(items)
        if self.stats.stalled is not None and self._held > HOLD_MAX:
            self._shed()
        self._wake.set()

    def _shed(self) -> None:
        """While stalled, drop the oldest entries nobody waits on (Modbus polls); an
        entry with an `ack` stays, its reading is still the broker's."""
        keep: deque[_Entry] = deque()
        for entry in self._queue:
            if self._held > HOLD_MAX and entry.ack is None and _samples_only(entry.items):
                self._held -= len(entry.items)
                self.stats.dropped += len(entry.items)
                continue
            keep.append(entry)
        self._queue = keep

    def _handed(self) -> float:
        watch = self.clock_watch
        return -math.inf if watch is None else watch.monotonic()

    def listen(self, listener: BatchListener) -> None:
        self._listeners.append(listener)

    # --- the batch ---------------------------------------------------------------------

    def process(self, items: Sequence[Sample | Condition]) -> list[Alarm]:
        """Store and judge one batch now; raises `SinkError`/`StateError` when a store
        refuses (nothing judged then). For tests and the demo's history seeding."""
        batch = self._prepare([_Entry(items, None, self._handed())])
        self._store(batch)
        return self._judge(batch)

    def process_queued(self, retry_now: bool = False) -> bool:
        """Work the queue; False when a store refused and the pipeline is stalled.

        `retry_now` (the daemon's stop) tries a held batch without waiting out the `RETRY`
        pause: a stop right after the operator freed space would otherwise drop the readings
        held in memory on a disk that takes writes again."""
        while True:
            batch = self._stuck
            if batch is not None:
                now = time.monotonic()
                if now < self._retry_at and not retry_now:
                    return False
                retry_now = False  # once: a disk that refuses again waits as before
                if self.disk is not None and not self.disk.room():
                    self._retry_at = now + RETRY  # the journal's room first
                    return False
                self._restamp_held(batch)
            if batch is None:
                if not self._queue:
                    return True
                entries: list[_Entry] = []
                count = 0
                while self._queue and (not entries or count + len(self._queue[0].items) <= BATCH):
                    entry = self._queue.popleft()
                    entries.append(entry)
                    count += len(entry.items)
                batch = self._prepare(entries)
            try:
                self._store(batch)
            except (SinkError, StateError) as exc:
                self._stuck = batch
                self._stall(exc)
                return False
            self._stuck = None
            self._held -= sum(len(e.items) for e in batch.entries)
            if self.stats.stalled is not None:
                self._resume()
            self._judge(batch)
            for entry in batch.entries:
                if entry.ack is not None:
                    entry.ack()
            self.stats.batches += 1
            self.stats.last_batch_wall = time.time()

    def _prepare(self, entries: list[_Entry]) -> _Batch:
        raw: list[Sample] = []
        samples: list[Sample] = []
        meters: list[Sample] = []
        conditions: list[Condition] = []
        watch = self.clock_watch
        if watch is not None:
            # A clock step re-bases the engine and the station (derived sensors too) before
            # the batch's derived samples are made and it is judged.
            conditions.extend(watch.check())
            watch.forget(entries[0].handed)  # the oldest reading still held: nothing before it
        for entry in entries:
            taken = entry.items
            if watch is not None:  # stamped before a step: onto the new clock, stored there
                taken, moved = watch.restamp(taken, handed=entry.handed)
                self.stats.restamped += moved
            # + the derived samples the batch makes due (monitor/station), stored like the rest
            items = taken if self.station is None else self.station.expand(taken)
            for item in items:
                if isinstance(item, Condition):
                    conditions.append(item)
                    continue
                raw.append(item)
                sample = self.engine.validate(item)
                samples.append(sample)
                if self._kinds.get(sample.sensor) is Kind.METER:
                    meters.append(sample)
        generation = 0 if watch is None else watch.generation
        return _Batch(entries, raw, samples, meters, conditions, generation=generation)

    def _restamp_held(self, batch: _Batch) -> None:
        """A batch a store refused was prepared on the clock of its time: a step noticed
        while it waited moves it onto the new clock as `_prepare` moves a queued one, so
        it is stored and judged where the history it follows now is (judged at its old
        stamps after a step back, its sensors would drop every reading as out of order for
        the length of the step). Only while no store has taken any of it: one that has
        holds the old stamps, and the copies must agree (then it is judged as stored)."""
        watch = self.clock_watch
        if watch is None or batch.held is not None or batch.in_outbox or batch.in_ledger:
            return
        self.raise_conditions(watch.check())  # a step is told now, not when the disk has room
        if watch.generation == batch.generation:  # moved onto this clock already
            return
        watch.forget(batch.entries[0].handed)
        raw, moved = watch.restamp(batch.raw, since=batch.generation, handed=batch.entries[0].handed)
        batch.generation = watch.generation
        if not moved:
            return
        self.stats.restamped += moved
        batch.raw = [r for r in raw if isinstance(r, Sample)]
        batch.samples = [replace(s, time=r.time) for s, r in zip(batch.samples, batch.raw, strict=True)]
        batch.meter_samples = [s for s in batch.samples if self._kinds.get(s.sensor) is Kind.METER]

    def _store(self, batch: _Batch) -> None:
        """Every store that must have the batch, each step at most once per batch."""
        sink = self.sink
        if batch.held is None and batch.samples:
            batch.held = sink.store.hold(batch.samples)
        if not batch.in_outbox:
            sink.write_samples_to_outbox(batch.samples)
            batch.in_outbox = True
        if not batch.in_ledger and batch.meter_samples:
            batch.conditions.extend(self.meters.ingest(batch.meter_samples))
            batch.in_ledger = True
        # The ledger's points marked for InfluxDB (this batch's rows with their verdict, rows it
        # or an amendment re-judged, whoever made it), unmarked once the outbox holds them.
        if self.meters.due():
            self.meters.send(sink.write_meter_records, room=sink.meter_room)
        if batch.held is not None:
            sink.store.release(batch.held)

    def _judge(self, batch: _Batch) -> list[Alarm]:
        conditions = batch.conditions
        if self.reconciler.retired:  # alarms of sensors no longer configured: once, first
            conditions[:0] = self.reconciler.retire(self.clock.now())
        for raw, sample in zip(batch.raw, batch.samples, strict=True):
            taken = self.engine.counters.samples
            conditions.extend(self.engine.process(raw))  # counts and logs a bad value once per episode
            if self.station is not None:
                conditions.extend(self.station.track(sample))
            if self.engine.counters.samples > taken:  # judged: not refused as out of order
                conditions.extend(self.reconciler.judged(sample))
            previous = self.latest.get(sample.sensor)
            if previous is None or sample.time >= previous.time:
                self.latest[sample.sensor] = sample
        alarms = self._raise(conditions)
        self._tell(batch.samples, conditions, alarms)
        return alarms

    def shift(self, delta: float) -> None:
        """The gateway clock stepped back (`delta` < 0): the latest reading of each sensor
        moves with the engine's history, so the console shows the readings of the new clock
        (they were older than the last of the old one and not taken for the step's length)."""
        if delta < 0:
            keep = self.clock_watch.device if self.clock_watch is not None else frozenset()
            self.latest = {
                k: s if k in keep else replace(s, time=s.time + delta) for k, s in self.latest.items()
            }

    def submit(self, conditions: Sequence[Condition]) -> list[Alarm]:
        """Conditions from outside the sample stream (a meter replacement the console
        recorded, the outbox cap): recorded and raised like the engine's."""
        if not conditions:
            return []
        alarms = self._raise(conditions)
        self._tell((), conditions, alarms)
        return alarms

    def _raise(self, conditions: Sequence[Condition]) -> list[Alarm]:
        if not conditions:
            return []
        try:
            self.sink.write_conditions(conditions)
        except SinkError as exc:  # the alarm matters more than its copy for InfluxDB
            log.warning("%d alarm transition(s) not queued for InfluxDB: %s", len(conditions), exc)
        self.stats.conditions += len(conditions)
        changed: list[Alarm] = []
        for cond in conditions:
            try:
                changed.extend(self.alarms.apply(cond))
            except StateError as exc:  # the journal cannot be written: never a crash
                self.stats.unjournaled += 1
                log.error("alarm %s/%s %s not recorded: %s", cond.sensor, cond.rule, cond.state, exc)
        return changed

    def _tell(
        self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
    ) -> None:
        for listener in self._listeners:
            try:
                listener.judged(samples, conditions, alarms)
            except Exception:
                self.stats.listener_errors += 1
                log.exception("pipeline listener %r failed", listener)

    def tick(self, now: float) -> None:
        """Timer work on the clock: stale data, shelve expiry."""
        if self.reconciler.retired:
            self.raise_conditions(self.reconciler.retire(now))
        self.raise_conditions(self.engine.tick(now))
        self.alarms.tick(now)
        self.send_meter_points()
        watch = self.clock_watch
        if watch is not None and self._stuck is None and not self._queue:
            # Nothing held: only a reading not handed over yet (`SETTLE`) can be stamped
            # before a step. Without this, a flapping clock while no reading came filled
            # the watch's memory to `MAX_STEPS` and said readings waited.
            watch.forget(watch.monotonic())

    def send_meter_points(self) -> None:
        """Ledger points marked for InfluxDB with no batch to carry them: an amendment or a
        settings change a `monitor meters` command (or the console) recorded, the rest of a
        large re-judge. A ledger or outbox that fails leaves them marked for the next try."""
        if self._stuck is not None or self._queue:
            return  # the next batch takes them
        try:
            # At the outbox's cap with meter points alone, an offer reads only what its room
            # holds, and nothing until deliveries made room for a few (`MeterBook.send`).
            due = self.meters.due()
            sent = self.meters.send(self.sink.write_meter_records, room=self.sink.meter_room) if due else 0
        except (SinkError, StateError) as exc:
            if not self._meters_failing:  # once per episode, not every tick
                log.warning("meter points not handed to the outbox yet (kept in the ledger): %s", exc)
            self._meters_failing = True
            return
        self._meters_failing = False
        if sent:
            log.info(
                "%d meter point(s) the ledger held for InfluxDB handed to the outbox (rows an amendment,"
                " a settings change or a late reading re-judged, or a crash left unsent)",
                sent,
            )

    def raise_conditions(self, conditions: Sequence[Condition]) -> None:
        """Raise conditions and tell the listeners what changed (timer work, recovery)."""
        if conditions:
            self._tell((), conditions, self._raise(conditions))

    # --- a store that refuses ----------------------------------------------------------

    def _stall(self, exc: Exception) -> None:
        self._retry_at = time.monotonic() + RETRY
        if self.stats.stalled is None:
            why = real_cause(exc, self.config.state_dir)
            self.stats.stalls += 1
            self.stats.stalled = why
            if self.disk is not None:
                self.disk.release_reserve()  # room to journal the alarm that says so
            log.error(
                "state disk refused a write, intake paused (nothing is acknowledged until it is stored;"
                " retrying every %gs): %s",
                RETRY,
                why,
            )
            self.raise_conditions([self._disk_condition(ConditionState.ACTIVE, why)])
        else:
            log.debug("state disk still refuses writes: %s", exc)

    def _resume(self) -> None:
        log.info("state disk takes writes again; intake resumed (%d item(s) waited)", self._held)
        self.stats.stalled = None
        self.raise_conditions([self._disk_condition(ConditionState.CLEARED, "writes succeed again")])
        if self.disk is not None:
            self.disk.keep_reserve()

    def _disk_condition(self, state: ConditionState, why: str) -> Condition:
        return Condition(
            time=self.clock.now(),
            sensor=DISK_SENSOR,
            rule=Rule.DISK_FULL,
            state=state,
            value=math.nan,
            limit=math.nan,
            citation=DISK_CITATION,
            message=f"state disk {self.config.state_dir}: {why}",
        )

    # --- the task ----------------------------------------------------------------------

    async def run(self) -> None:
        """Work the queue until cancelled; retries on its own while stalled."""
        while True:
            if self.process_queued():
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), RETRY)
            self._wake.clear()

    @property
    def waiting(self) -> int:
        """Items emitted and not yet stored (for health)."""
        return self._held


def _samples_only(items: Sequence[Sample | Condition]) -> bool:
    return all(isinstance(i, Sample) for i in items)


__all__ = ["Ack", "BatchListener", "Pipeline", "PipelineStats"]
