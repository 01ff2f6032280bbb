"""`monitor run`: one station's sources, engine, alarms and outputs in one asyncio process.

Data flows one way. Sources call `emit` with samples (and comm-loss conditions);
the pipeline task takes them in batches: every sample is committed to the local
store and the outbox first, then judged (the engine, or the meter book for
meters), and the conditions become alarms, which the dispatcher hands to the
log, the webhook and MQTT. A timer drives what event time alone cannot: stale
data, shelve expiry, reminders, checkpoints and the systemd watchdog.

Shutdown is bounded: sources stop, what was emitted is processed, the outbox
gets a short chance to drain (what remains stays on disk for next time),
baselines are checkpointed, connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor.alarms import AlarmManager, Dispatcher, Notifier
from monitor.alarms.mqtt import AlarmPublisher, MqttCommands
from monitor.alarms.webhook import people_notifiers
from monitor.callout import Callout, Heartbeat
from monitor.config import Config
from monitor.engine import (
    CHECKPOINT_FILE,
    CheckpointSchedule,
    ClockWatch,
    Engine,
    load_checkpoint_or_start_fresh,
    slug_status,
)
from monitor.errors import MonitorError
from monitor.health import health_snapshot, readiness
from monitor.incidents import IncidentTracker
from monitor.incidents.influx import incident_lines
from monitor.meters.book import MeterBook
from monitor.model import (
    Alarm,
    Clock,
    Condition,
    ConditionState,
    Kind,
    Quality,
    Rule,
    Sample,
    WallClock,
)
from monitor.sdnotify import notify, watchdog_interval
from monitor.sinks.pipeline import SampleSink, open_sink
from monitor.sources.modbus import ModbusPoller
from monitor.sources.mqtt import MqttLink
from monitor.sources.mqtt_ingest import MqttSource
from monitor.station.live import LiveStation
from monitor.web.view import SensorReading

log = logging.getLogger(__name__)

_ENGINE_RULES = frozenset({Rule.SLUG, Rule.HIGH, Rule.LOW, Rule.STALE, Rule.COMM_LOSS, Rule.BAD_VALUE})
CHECKPOINT_INTERVAL = 300.0  # wall seconds between baseline checkpoints
TICK = 1.0  # wall seconds between timer ticks
STOP_DRAIN = 5.0  # wall seconds the outbox may drain at shutdown


@dataclass
class Counters:
    """Pipeline figures for /metrics and the console's health panel."""

    samples_by_source: dict[str, int] = field(default_factory=dict)
    conditions: int = 0
    batches: int = 0
    last_sample_wall: float | None = None


class Daemon:
    """The running station. Also the console's `StationView`."""

    def __init__(self, config: Config, clock: Clock | None = None, *, console: bool = True) -> None:
        self.config = config
        self.clock = clock or WallClock()
        self.with_console = console and config.console.enabled
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.counters = Counters()
        self.engine = Engine(config.rules, self.clock)
        self.checkpoint_path = config.state_dir / CHECKPOINT_FILE
        self.restored = load_checkpoint_or_start_fresh(self.engine, self.checkpoint_path)
        self.checkpoints = CheckpointSchedule(self.engine, self.checkpoint_path, CHECKPOINT_INTERVAL)
        self.alarms = AlarmManager.open(config, self.clock)
        self.clock_watch = ClockWatch.for_clock(self.engine, self.clock, self.alarms.active_conditions())
        self.sink: SampleSink = open_sink(config, self.clock, on_condition=self._outbox_condition)
        self.meters = MeterBook.open(config)
        self.station = LiveStation(config, self.alarms.active_conditions())  # pumps, wet well, derived
        # Incidents (issue 16): fed each judged batch in `_track_incidents`.
        self.incidents = (
            IncidentTracker(config, history=self.sink.store.query) if config.incidents.enabled else None
        )
        self._incident_error = False
        self._kinds = {s.id: s.kind for s in config.sensors}
        self._latest: dict[str, Sample] = {}
        self._queue: deque[Sample | Condition] = deque()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self.ready = asyncio.Event()
        self.reloading = False  # set before stop() when a new daemon takes over (SIGHUP)
        self.console_url: str | None = None
        self.modbus = ModbusPoller(config.modbus.devices, self.clock) if config.modbus else None
        self.mqtt_link: MqttLink | None = None
        self.mqtt_source: MqttSource | None = None
        self.publisher: AlarmPublisher | None = None
        self.commands: MqttCommands | None = None
        if config.mqtt is not None:
            self.mqtt_link = MqttLink(config.mqtt, config.station.id)
            if config.mqtt.subscriptions:
                self.mqtt_source = MqttSource(
                    self.mqtt_link, config.mqtt, config.station.id, sensors=self._kinds, clock=self.clock
                )
            if config.mqtt.publish_alarms:
                self.publisher = AlarmPublisher(self.mqtt_link, config.mqtt.topic_prefix, config.station.id)
            if config.mqtt.command_users:
                self.commands = MqttCommands(
                    self.mqtt_link,
                    config.mqtt.topic_prefix,
                    config.station.id,
                    config.mqtt.command_users,
                    self.alarms,
                )
        mirrors: list[Notifier] = [self.publisher] if self.publisher is not None else []
        self.notifiers = people_notifiers(config)
        self.dispatcher = Dispatcher(config.alarms, self.clock, notifiers=self.notifiers, mirrors=mirrors)
        self.dispatcher.attach(self.alarms)
        self.alarms.listen(lambda _entry, alarm: self.sink.write_alarms([alarm]))
        # --- callout (monitor/callout): escalation along rosters, dead-man heartbeat ---
        notify_cfg = config.notify
        self.callout = None
        if notify_cfg is not None and notify_cfg.pipelines:
            self.callout = Callout(config, self.alarms, self.clock, on_condition=self._outbox_condition)
        self.heartbeat = None
        if notify_cfg is not None and notify_cfg.heartbeat is not None:
            self.heartbeat = Heartbeat(notify_cfg.heartbeat, lambda: readiness(self.health()))
        # --- end callout ---
        # Alarms the journal restored as active that the engine does not hold active
        # (no checkpoint, or the condition ended while we were down): the engine would
        # never send their CLEARED, so the first judged sample decides for it.
        self._unconfirmed: set[tuple[str, Rule]] = {
            (sensor, rule)
            for sensor, rule in self.alarms.active_conditions()
            if rule in _ENGINE_RULES
            and sensor in config.rules
            and rule not in self.engine.status(sensor).active
        }

    # --- the pipeline ----------------------------------------------------------------

    def emit(self, items: Sequence[Sample | Condition]) -> None:
        """Sources hand over what they read (on the loop thread); never blocks."""
        self._queue.extend(items)
        self._wake.set()

    def _source_emit(self, source: str) -> Callable[[Sequence[Sample | Condition]], None]:
        by_source = self.counters.samples_by_source
        by_source.setdefault(source, 0)

        def emit(items: Sequence[Sample | Condition]) -> None:
            by_source[source] += sum(1 for i in items if isinstance(i, Sample))
            self.emit(items)

        return emit

    def process(self, items: Sequence[Sample | Condition]) -> list[Alarm]:
        """Store, judge and alarm one batch; returns the alarm transitions it caused."""
        samples: list[Sample] = []
        meter_samples: list[Sample] = []
        conditions: list[Condition] = self.clock_watch.check() if self.clock_watch else []
        for item in self.station.expand(items):  # + derived samples (monitor/station)
            if isinstance(item, Condition):
                conditions.append(item)
                continue
            sample = self.engine.validate(item)
            samples.append(sample)
            if self._kinds.get(sample.sensor) is Kind.METER:
                meter_samples.append(sample)
            conditions.extend(self.engine.process(sample))
            conditions.extend(self.station.track(sample))
            if self._unconfirmed and sample.quality is Quality.GOOD:
                conditions.extend(self._reconcile(sample))
            previous = self._latest.get(sample.sensor)
            if previous is None or sample.time >= previous.time:
                self._latest[sample.sensor] = sample
        # Committed to disk (store, outbox) before anything counts as taken.
        self.sink.write_samples(samples)
        daily = self.station.take_daily()  # pump and station totals of a local day just closed
        if daily and self.sink.outbox is not None:
            self.sink.outbox.append(daily)
        if meter_samples:
            conditions.extend(self.meters.ingest(meter_samples))
        # Ledger rows to InfluxDB, with their verdict; also rows a replacement recorded through
        # the console re-judged since the last batch.
        self.sink.write_meter_records(self.meters.take_records())
        changed = self._raise(conditions)
        self._track_incidents(samples, conditions)
        return changed

    def _track_incidents(self, samples: Sequence[Sample], conditions: Sequence[Condition]) -> None:
        """Incidents (issue 16) from what was just judged; a failing incident store is
        logged once and never stops the pipeline."""
        if self.incidents is None:
            return
        try:
            changed = self.incidents.observe(samples, conditions)
        except (MonitorError, OSError) as exc:
            if not self._incident_error:
                log.error("incidents not recorded: %s", exc)
            self._incident_error = True
            return
        if self._incident_error:
            log.info("incidents recorded again")
            self._incident_error = False
        if changed and self.sink.outbox is not None:
            self.sink.outbox.append(incident_lines(changed))

    def _reconcile(self, sample: Sample) -> list[Condition]:
        status = self.engine.status(sample.sensor)
        if status.quality is not Quality.GOOD:
            return []
        out = []
        for key in [k for k in self._unconfirmed if k[0] == sample.sensor]:
            rule = key[1]
            if rule is Rule.SLUG and status.warming_up:
                continue  # cannot judge a slug yet; the alarm stays as it was
            self._unconfirmed.discard(key)
            alarm = self.alarms.get(*key)
            if rule in status.active or alarm is None:
                continue
            out.append(
                Condition(
                    time=sample.time,
                    sensor=sample.sensor,
                    rule=rule,
                    state=ConditionState.CLEARED,
                    value=sample.value,
                    limit=alarm.limit,
                    citation=alarm.citation,
                    message="not active after restart",
                )
            )
        return out

    def _raise(self, conditions: Sequence[Condition]) -> list[Alarm]:
        if not conditions:
            return []
        self.sink.write_conditions(conditions)
        self.counters.conditions += len(conditions)
        changed: list[Alarm] = []
        for cond in conditions:
            changed.extend(self.alarms.apply(cond))
        return changed

    def _outbox_condition(self, condition: Condition) -> None:
        """The outbox cap alarm; it may fire inside `write_samples`, so queue it."""
        self._queue.append(condition)
        self._wake.set()

    async def _pipeline(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._process_queued()

    def _process_queued(self) -> None:
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), 5000))]
            self.process(batch)
            self.counters.batches += 1
            self.counters.last_sample_wall = time.time()

    def tick(self) -> None:
        """Timer work on the clock: stale data, shelve expiry, reminders, floods."""
        if self.clock_watch is not None:
            self._raise(self.clock_watch.check())
        now = self.clock.now()
        self._raise(self.engine.tick(now))
        self.alarms.tick(now)
        self.dispatcher.tick(now)
        if self.callout is not None:
            self.callout.tick(now)

    # --- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()`; then shut down within a bounded time."""
        tasks: list[asyncio.Task[Any]] = []

        def start(coro: Awaitable[Any], name: str) -> None:
            tasks.append(asyncio.ensure_future(coro))
            tasks[-1].set_name(name)

        server = None
        if self.mqtt_link is not None:
            self.mqtt_link.start()
        if self.publisher is not None:
            self.publisher.republish(self.alarms.alarms())
        start(self._pipeline(), "pipeline")
        start(self.dispatcher.run(), "alarm dispatcher")
        if self.sink.drainer is not None:
            start(self.sink.drainer.run(), "outbox drainer")
        if self.modbus is not None:
            start(self.modbus.run(self._source_emit("modbus")), "modbus")
        if self.mqtt_source is not None:
            start(self.mqtt_source.run(self._source_emit("mqtt")), "mqtt")
        if self.commands is not None:
            start(self.commands.run(), "mqtt commands")
        start(self._timers(), "timers")
        if self.callout is not None:  # callout
            self.callout.resume()
            start(self.callout.run(), "callout")
        if self.with_console:
            from monitor.web.service import console_server

            server = console_server(self)
            start(server.serve(), "console")
            try:
                await server.wait_started()
            except MonitorError:
                await self._shutdown(tasks, server)
                raise
            self.console_url = f"http://{self.config.console.host}:{server.port}/"
        warming = sum(1 for s in self.engine.statuses() if s.warming_up)
        log.info(
            "station %s running: %d sensor(s), %s%s%s",
            self.config.station.id,
            len(self.config.sensors),
            "baselines restored from checkpoint" if self.restored else "baselines not (all) restored",
            f", {warming} baseline(s) warming up" if warming else "",
            f", console {self.console_url}" if self.console_url else "",
        )
        notify("READY=1")
        self.ready.set()
        if self.heartbeat is not None:  # callout: pings only once the daemon is up
            start(self.heartbeat.run(), "heartbeat")
        stop_wait = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop_wait and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            stop_wait.cancel()
            # STOPPING=1 would make systemd treat a reload as the service ending
            # (and kill it after TimeoutStopSec); the next daemon sends READY=1.
            if self.reloading:
                notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
            else:
                notify("STOPPING=1")
            await self._shutdown(tasks, server)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop gracefully; a second request while stopping exits at once (the
        outbox, journal and ledger are committed on disk, so nothing is lost)."""
        if self._stopping.is_set():
            log.warning("second stop request: exiting without a clean shutdown")
            os._exit(1)
        self._stopping.set()

    async def _shutdown(self, tasks: list[asyncio.Task[Any]], server: Any) -> None:
        if server is not None:
            server.stop()
        # Sources, pipeline, timers and drainer stop first; the dispatcher keeps
        # running until what it was handed is delivered (bounded).
        late = {"console", "alarm dispatcher", "outbox drainer"}
        early = [t for t in tasks if t.get_name() not in late]
        await _cancel(early)
        # The drainer is asked, not cancelled: it settles the request on the wire, so
        # the batch is acknowledged once rather than sent again at the next start.
        if self.sink.drainer is not None:
            self.sink.drainer.stop()
            drainer = [t for t in tasks if t.get_name() == "outbox drainer"]
            await asyncio.wait(drainer, timeout=STOP_DRAIN)
        self._process_queued()
        self.tick()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.dispatcher.drain(), timeout=STOP_DRAIN)
        # Let uvicorn finish its own shutdown: cancelled mid-way it leaves the listening
        # socket open, and the daemon a SIGHUP reload starts cannot bind the port.
        console = [t for t in tasks if t.get_name() == "console"]
        if console:
            await asyncio.wait(console, timeout=STOP_DRAIN)
        await _cancel(tasks)
        left = await self.sink.drain(STOP_DRAIN) if self.sink.drainer is not None else 0
        if left:
            log.warning("%d point(s) stay in the outbox for the next start", left)
        self.checkpoint()
        if self.mqtt_link is not None:
            self.mqtt_link.stop()
        for notifier in self.notifiers:
            aclose = getattr(notifier, "aclose", None)
            if aclose is not None:
                await aclose()
        for closing in (self.callout, self.heartbeat):  # callout
            if closing is not None:
                await closing.aclose()
        self.sink.close()
        self.station.close()
        self.meters.close()
        if self.incidents is not None:
            self.incidents.close()
        self.alarms.close()
        log.info("station %s stopped", self.config.station.id)

    async def _timers(self) -> None:
        watchdog = watchdog_interval()
        last_watchdog = time.monotonic()
        self.checkpoints.last_saved = last_watchdog
        while True:
            await asyncio.sleep(TICK)
            self.tick()
            now = time.monotonic()
            self.checkpoints.save_if_due(now)
            self.station.save_if_due(now)
            if watchdog is not None and now - last_watchdog >= watchdog:
                notify("WATCHDOG=1")
                last_watchdog = now

    def checkpoint(self) -> None:
        self.checkpoints.save(time.monotonic())

    # --- StationView (the console) ---------------------------------------------------

    @property
    def meter_book(self) -> MeterBook:
        """The console mounts its meter routes (replacement through the API) on this."""
        return self.meters

    @property
    def station_id(self) -> str:
        return self.config.station.id

    @property
    def station_name(self) -> str:
        return self.config.station.name

    def now(self) -> float:
        return self.clock.now()

    def sensors(self) -> Sequence[SensorReading]:
        out = []
        for sensor in self.config.sensors:
            latest = self._latest.get(sensor.id)
            status = self.engine.status(sensor.id)
            value = latest.value if latest is not None and latest.quality is Quality.GOOD else None
            out.append(
                SensorReading(
                    id=sensor.id,
                    kind=str(sensor.kind),
                    unit=sensor.effective_unit,
                    value=value,
                    quality=latest.quality.name.lower() if latest is not None else "no_data",
                    time=latest.time if latest is not None else None,
                    baseline=status.baseline_mean,
                    name=sensor.name,
                    slug=slug_status(status, self.config.rules[sensor.id]),
                )
            )
        return out

    def series(self, sensor: str, since: float, until: float) -> Sequence[tuple[float, float]]:
        if sensor not in self._kinds:
            raise KeyError(sensor)
        return [(s.time, s.value) for s in self.sink.store.query(sensor, since, until)]

    def health(self) -> Mapping[str, object]:
        return health_snapshot(self)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel and wait, bounded: a library task that swallows its cancellation must
    not hold the shutdown (and the outbox, journal and checkpoint) hostage."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, stuck = await asyncio.wait(tasks, timeout=STOP_DRAIN)
    if stuck:
        log.warning(
            "shutdown: %s did not stop within %gs; carrying on",
            ", ".join(sorted(t.get_name() for t in stuck)),
            STOP_DRAIN,
        )
