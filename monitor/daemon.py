"""`monitor run`: one station's sources, engine, alarms and outputs in one asyncio process.

This module is wiring and lifecycle only. The order in which a reading is stored,
judged and acknowledged lives in `monitor.pipeline`; alarms restored from the
journal after a restart in `monitor.reconcile`; the health snapshot in
`monitor.health`. The console is not imported here: `monitor run` builds it on top
(`monitor.web.station`) and hands it to `run(console=...)`.

A timer drives what event time alone cannot: stale data, shelve expiry, reminders,
the low-space check, checkpoints and the systemd watchdog.

Shutdown is bounded: sources stop, what was emitted is processed, the outbox
gets a short chance to drain (one attempt when the database is already down; what
remains stays on disk for next time), baselines are checkpointed, connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from monitor.alarms import AlarmManager, Dispatcher, Notifier
from monitor.alarms.mqtt import AlarmPublisher, MqttCommands
from monitor.alarms.people import people_notifiers
from monitor.callout import Callout, HeartbeatPinger
from monitor.clockfile import CLOCK_FILE, ClockFile
from monitor.config import Config
from monitor.diskspace import DiskWatch
from monitor.engine import (
    CHECKPOINT_FILE,
    CheckpointSchedule,
    ClockWatch,
    Engine,
    load_checkpoint_or_start_fresh,
)
from monitor.engine.restored import TOLERANCE
from monitor.errors import MonitorError
from monitor.health import ClockHealth, Health, IncidentHealth, MeterHealth, gather, readiness
from monitor.incidents import IncidentTracker
from monitor.incidents.influx import incident_lines
from monitor.kernelclock import Kernel, KernelClock
from monitor.meters.book import UNSYNCED_AT_START, Evidence, MeterBook
from monitor.model import Alarm, Clock, Condition, ConditionState, Rule, Sample, WallClock, iso
from monitor.pipeline import Pipeline
from monitor.reconcile import Reconciler, device_named, device_skew, device_stamped, gateway_fed
from monitor.recovery import recover
from monitor.sdnotify import notify, watchdog_interval
from monitor.sinks.kept import AlarmCopy, KeptLines
from monitor.sinks.pipeline import SampleSink, open_sink
from monitor.sources.modbus import ModbusPoller
from monitor.sources.mqtt import MqttLink
from monitor.sources.mqtt_ingest import MqttSource
from monitor.station.live import LiveStation

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL = 300.0  # wall seconds between baseline checkpoints
TICK = 1.0  # wall seconds between timer ticks
STOP_DRAIN = 5.0  # wall seconds the outbox may drain at shutdown
JOURNAL_LOOK = 100  # newest journal entries read at start for one the gateway clock stamped


class ServedConsole(Protocol):
    """What the daemon needs from the console server it is given (`ConsoleServer`)."""

    @property
    def port(self) -> int: ...

    async def serve(self) -> None: ...

    async def wait_started(self, timeout: float = 10.0) -> None: ...

    def stop(self) -> None: ...


class Daemon:
    """The running station: its parts, wired; `run()` until `stop()`."""

    def __init__(
        self,
        config: Config,
        clock: Clock | None = None,
        kernel: Kernel | None = None,
        steady_since: float | None = None,
    ) -> None:
        """`kernel`: the kernel's word on the clock (NTP synchronised, the boot), asked only
        of the real clock unless a test passes its own. `steady_since`: a reload's, the steady
        run in doubt of the daemon it replaces (`ClockFile.steady_since`), counted on."""
        self.config = config
        self.clock = clock or WallClock()
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.engine = Engine(config.rules, self.clock)
        self.engine.stamped_by_device(device_stamped(config))  # their stale watch: on arrival
        self.checkpoint_path = config.state_dir / CHECKPOINT_FILE
        self.restored = load_checkpoint_or_start_fresh(self.engine, self.checkpoint_path, CHECKPOINT_INTERVAL)
        self.checkpoints = CheckpointSchedule(self.engine, self.checkpoint_path, CHECKPOINT_INTERVAL)
        self.alarms = AlarmManager.open(config, self.clock)
        self.sink: SampleSink = open_sink(config, self.clock, on_condition=lambda c: self.pipeline.emit([c]))
        self.meters = MeterBook.open(config)
        with contextlib.suppress(MonitorError):  # a ledger that refuses a read says so where it is used
            self.meters.unconfigured()  # a removed meter's marks: said once, counted
        skew = device_skew(config)
        reconciler = Reconciler(self.engine, self.alarms, config.rules, skew)
        self.disk = DiskWatch(config.state_dir, config.store.free_space_floor, self.clock)
        active = [a for a in self.alarms.alarms() if a.active]  # what the journal holds active
        # pumps, wet well, derived
        self.station = LiveStation(config, active, self.clock, skew, device_stamped(config))
        self.station.restore_deliveries(
            {st.sensor: st.device for st in self.engine.sensor_states() if st.device is not None}
        )  # the checkpoint's, restored above: a backlog after a restart is as old there too
        self.pipeline = Pipeline(
            config,
            self.clock,
            self.engine,
            self.alarms,
            self.sink,
            self.meters,
            reconciler,
            self.disk,
            station=self.station,
        )
        # The station's last known good time (monitor/clockfile.py), and what else the state
        # says the station wrote last: at start, whether the clock is set (`found_at_start`).
        if kernel is None and isinstance(self.clock, WallClock):
            kernel = KernelClock()
        self.clock_file = ClockFile(config.state_dir / CLOCK_FILE, kernel=kernel, steady_since=steady_since)
        self.start_evidence = self._evidence()
        # The gateway clock (engine/clock_step.py): checked before each batch is judged and
        # on every tick; None for a test's or the demo's clock.
        self.clock_watch: ClockWatch | None = None
        self.watch_clock(ClockWatch.for_clock(self.engine, self.clock, self.alarms.active_conditions()))
        self.pipeline.listen(DailyFeed(self.station, self.sink))  # pump and station totals per local day
        # Incidents (issue 16): fed every judged batch through the pipeline's hook.
        self.incidents = (
            IncidentTracker(config, history=self.sink.store.query) if config.incidents.enabled else None
        )
        self.incident_feed: IncidentFeed | None = None
        raised = self.alarms.get(INCIDENT_SENSOR, Rule.INCIDENTS)
        if self.incidents is None and raised is not None and raised.active:
            # nothing else would end it: incidents were turned off while it stood active
            self.pipeline.emit(
                [store_condition(self.clock.now(), ConditionState.CLEARED, "incidents are not enabled")]
            )
        if self.incidents is not None:
            # A store that refuses as a whole raises the `incident_store` alarm through the
            # queue, as the outbox's cap does (never from within the listener's own call).
            self.incident_feed = IncidentFeed(
                self.incidents,
                self.sink,
                self.clock,
                on_condition=lambda c: self.pipeline.emit([c]),
                raised=raised is not None and raised.active,
            )
            self.pipeline.listen(self.incident_feed)
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
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
                    self.mqtt_link,
                    config.mqtt,
                    config.station.id,
                    sensors=[s.id for s in config.sensors],
                    gateway=gateway_fed(config),
                    device=device_named(config),
                    clock=self.clock,
                )
                self.engine.refused_ahead(self.mqtt_source.ahead)  # the stale alarm names them
                if self.clock_watch is not None:  # the watch's clock tells which clock a refusal came on
                    self.mqtt_source.ahead.monotonic = self.clock_watch.monotonic
            if config.mqtt.publish_alarms:
                self.publisher = AlarmPublisher(self.mqtt_link, config.mqtt.topic_prefix, config.station.id)
                self.mqtt_link.on_connected(self._on_connected)
            if config.mqtt.command_users:
                self.commands = MqttCommands(
                    self.mqtt_link,
                    config.mqtt.topic_prefix,
                    config.station.id,
                    config.mqtt.command_users,
                    self.alarms,
                    clock=self.clock,
                    max_age=config.mqtt.command_max_age,
                )
        mirrors: list[Notifier] = [self.publisher] if self.publisher is not None else []
        self.notifiers = people_notifiers(config)
        self.dispatcher = Dispatcher(config.alarms, self.clock, notifiers=self.notifiers, mirrors=mirrors)
        self.dispatcher.attach(self.alarms)
        if self.sink.outbox is not None:  # snapshots a full disk refused wait in memory (sinks/kept.py)
            self.alarm_copy = AlarmCopy(config.station.id, self.sink.outbox)
            self.alarms.listen(self.alarm_copy)
            self.pipeline.listen(self.alarm_copy)
        # --- callout (monitor/callout): escalation along rosters, dead-man heartbeat ---
        notify_cfg = config.notify
        self.callout: Callout | None = None
        if notify_cfg is not None and notify_cfg.pipelines:
            self.callout = Callout(
                config, self.alarms, self.clock, on_condition=lambda c: self.pipeline.emit([c]),
                monotonic=time.monotonic if self.clock_watch is None else self.clock_watch.monotonic,
                clock_set=self._clock_set,
            )  # fmt: skip
        self.heartbeat: HeartbeatPinger | None = None
        if notify_cfg is not None and notify_cfg.heartbeat is not None:
            self.heartbeat = HeartbeatPinger(notify_cfg.heartbeat, lambda: readiness(self.health().to_json()))
        # --- end callout ---
        recover(self.pipeline)

    def _on_connected(self) -> None:  # paho's thread
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(self.republish)

    def republish(self) -> None:
        """The retained state of every alarm as the console shows it, after every
        (re)connect: a broker that restarted without its retained messages gets
        them back, and an alarm that went normal while we were away is cleared."""
        if self.publisher is not None:
            self.publisher.republish(self.alarms.alarms())

    def watch_clock(self, watch: ClockWatch | None) -> None:
        """Check the gateway clock with `watch` before each batch and on each tick; a step
        re-bases the engine and moves the station's times with it, back or forward (a test
        passes a watch on clocks it moves)."""
        self.clock_watch = watch
        self.pipeline.clock_watch = watch
        if watch is not None:
            watch.device = device_stamped(self.config)  # stamped by their own clocks: not moved
            source: MqttSource | None = getattr(self, "mqtt_source", None)  # a watch before it is built
            if source is not None:  # a refusal ahead notes which clock it arrived on
                source.ahead.monotonic = watch.monotonic
            watch.on_step.append(lambda step: self.station.shift(step, watch.device))
            watch.on_step.append(self.pipeline.shift)
            watch.on_step.append(lambda step: self._meter_step(watch, step))
            watch.on_step.append(self._schedules_step)
            callout: Callout | None = getattr(self, "callout", None)  # a watch after it is built
            if callout is not None:
                callout.use_monotonic(watch.monotonic)  # the run time its steps have waited
            watch.on_step.append(lambda _step: self._clock_stepped(watch))
            # A heartbeat ahead of a clock the kernel says is synchronised was written by a clock
            # wrong in the future: so were the other records ahead (`ClockFile.judge`).
            sure = self.clock_file.judge(watch.wall(), watch.awake())
            if sure is not None:
                self.start_evidence = [
                    e for e in self.start_evidence if e.time <= sure.time + UNSYNCED_AT_START
                ]
                self.start_evidence.append(sure)
            # Before the watch's first check: the ledger's own newest rows measure its step, and
            # the restored history's step (`check_restored`) then finds nothing left ahead.
            self._found_at_start(watch.wall(), self.start_evidence)
            self._judged_start()

    def _found_at_start(self, now: float, evidence: Sequence[Evidence]) -> None:
        """The meter rows ahead of the clock `now` moved, or kept for an unset clock, as
        `evidence` says (`MeterBook.found_at_start`)."""
        watch = self.clock_watch
        if watch is None:
            return
        with contextlib.suppress(MonitorError):  # counted and logged by the book, kept for the next try
            found = self.meters.found_at_start(now, TOLERANCE, watch.device, evidence, self.clock_file.floor)
            self.pipeline.raise_conditions(found)

    def _clock_stepped(self, watch: ClockWatch) -> None:
        """A step while running restarts a steady run in doubt (`ClockFile.stepped`); not the
        restored history's at the first tick (`check_restored`: the start's, not the clock's)."""
        if watch.generation:
            self.clock_file.stepped(watch.wall(), watch.awake())

    def _settle_clock(self, now: float) -> None:
        """A clock in doubt at start (behind the heartbeat, nothing said which is right) taken
        as right (`ClockFile.settle`): the meter rows the wrong clock stamped ahead move now,
        and the heartbeat is written from now on."""
        if self.clock_watch is None:
            return
        steady_since, awake = self.clock_file.steady_since, self.clock_watch.awake()
        sure = self.clock_file.settle(now, awake)
        if sure is None:
            return
        if self.callout is not None and steady_since is not None:  # its starts were this clock's
            self.callout.unset_starts.taken_as_right(now - (awake - steady_since) - TOLERANCE)
        self.meters.unset_at_start.clear()
        self.meters.unset_rows.clear()
        self._found_at_start(now, [sure])
        self.clock_file.not_before = now

    def _evidence(self) -> list[Evidence]:
        """Times the gateway clock stamped outside the meter ledger, read before anything is
        written this run: the heartbeat, the engine checkpoint's last tick, the alarm journal's
        last entry of a gateway-stamped sensor (not a meter's: its alarm carries the meter row's
        stamp, a bad one too; not a device-stamped one's, `device_stamped`). Not the outbox:
        empty whenever InfluxDB is up."""
        out = self.clock_file.evidence()
        if math.isfinite(self.engine.restored_tick):
            tick = self.engine.restored_tick
            out.append(Evidence(f"the engine checkpoint's last tick ({iso(tick)})", tick))
        other = set(self.meters.ledger.specs) | device_stamped(self.config)
        with contextlib.suppress(MonitorError):  # an unreadable journal says so where it is used
            for entry in self.alarms.journal.entries(limit=JOURNAL_LOOK, newest_first=True):
                if entry.sensor not in other:
                    what = f"the alarm journal's last entry ({entry.sensor}, {iso(entry.time)})"
                    out.append(Evidence(what, entry.time))
                    break
        return out

    def _judged_start(self) -> None:
        """The heartbeat is written from now on, once the clock is within a day of what the
        station held at start (the evidence, and the meter rows taken for an unset clock's)."""
        held = [e.time for e in self.start_evidence] + list(self.meters.unset_at_start.values())
        self.clock_file.not_before = max(held, default=-math.inf)

    def _clock_set(self, now: float) -> bool:
        """Whether the gateway clock reading `now` is set, as the heartbeat judges it (not
        before the release, not a day behind the station's evidence); not judged (a test's or
        the demo's clock): set."""
        return self.clock_file.not_before is None or self.clock_file.plausible(now)

    def _meter_step(self, watch: ClockWatch, step: float) -> None:
        """The meter ledger's rows the old clock stamped ahead of the new one move with a step
        back (`Ledger.clock_step`). A ledger that cannot be written stays as it was (one
        transaction); the book keeps the move, counts and logs it once, and makes it before
        its next write (`MeterBook.move_pending`, also tried on each tick); judging goes on."""
        now = watch.wall()
        # Not the rows of a meter the start took for an unset clock's while the clock is still
        # that far behind them: the engine checkpoint's step (`check_restored`, the first tick)
        # moved them a year back on every station that has a checkpoint.
        unset = {m for m, t in self.meters.unset_at_start.items() if t - now > UNSYNCED_AT_START}
        with contextlib.suppress(MonitorError):  # counted and logged by the book, kept for the next try
            self.pipeline.raise_conditions(self.meters.clock_step(step, now, watch.device | unset))

    def _schedules_step(self, step: float) -> None:
        """The reminders' and the callout's schedules follow a step of the gateway clock
        (`Dispatcher.clock_step`, `Callout.clock_step`)."""
        dispatcher: Dispatcher | None = getattr(self, "dispatcher", None)  # a step before it is built
        if dispatcher is not None:
            dispatcher.clock_step(step)
        callout: Callout | None = getattr(self, "callout", None)
        if callout is not None:
            callout.clock_step(step)

    def _meter_steps_pending(self) -> None:
        """A clock step move the ledger refused, tried again on the timer: readings may not
        come (a meter polled hourly) to carry it. Not while the intake is stalled or the disk
        has no room (the journal's reserve is not the ledger's): the held batch carries it."""
        if not self.meters.clock_steps_pending or self.pipeline.stats.stalled is not None:
            return
        if not self.disk.room():
            return
        with contextlib.suppress(MonitorError):  # still refused: counted and logged once, tried again
            self.pipeline.raise_conditions(self.meters.move_pending())

    def tick(self) -> None:
        """Timer work on the clock: stale data, shelve expiry, reminders, floods, disk space."""
        if self.clock_watch is not None:
            self.pipeline.raise_conditions(self.clock_watch.check())
        self._meter_steps_pending()
        now = self.clock.now()
        self._settle_clock(now)
        self.clock_file.beat(now)
        self.pipeline.tick(now)
        self.pipeline.submit(self.disk.check(now))
        self.dispatcher.tick(now)
        if self.callout is not None:
            self.callout.tick(now)

    def health(self) -> Health:
        return gather(
            modbus=self.modbus,
            mqtt_link=self.mqtt_link,
            mqtt_source=self.mqtt_source,
            sink=self.sink,
            engine=self.engine,
            pipeline=self.pipeline.stats,
            waiting=self.pipeline.waiting,
            restored=self.restored,
            alarm_listener_failures=self.alarms.listener_failures,
            alarm_early_clears=self.alarms.early_clears,
            incidents=self.incident_feed.health() if self.incident_feed is not None else None,
            meters=MeterHealth(
                self.meters.clock_step_failures,
                self.meters.clock_steps_pending,
                self.meters.unsent_unconfigured,
                self.meters.held_back(),
            ),
            clock=self._clock_health(),
        )

    def _clock_health(self) -> ClockHealth:
        """The gateway clock's steps; none under a test's or the demo's clock (not watched)."""
        if self.clock_watch is None:
            return ClockHealth()
        steps = self.clock_watch.step_log
        ahead, left, disagrees = self.clock_file.doubt(self.clock.now(), self.clock_watch.awake())
        # Held back: a configured meter's new readings; a removed meter's rows ahead hold nothing.
        specs = self.meters.ledger.specs
        rows = {m: n for m, n in self.meters.unset_rows.items() if m in specs} if ahead > 0 else {}
        return ClockHealth(
            steps.steps,
            steps.episode_steps,
            steps.episode_largest,
            ahead,
            left,
            disagrees,
            meter_rows_ahead=sum(rows.values()),
            meters_ahead=len(rows),
        )

    # --- lifecycle -------------------------------------------------------------------

    async def run(self, console: ServedConsole | None = None) -> None:
        """Run until `stop()`; then shut down within a bounded time."""
        tasks: list[asyncio.Task[Any]] = []

        def start(coro: Awaitable[Any], name: str) -> None:
            tasks.append(asyncio.ensure_future(coro))
            tasks[-1].set_name(name)

        self._loop = asyncio.get_running_loop()
        if self.mqtt_link is not None:
            self.mqtt_link.start()
        start(self.pipeline.run(), "pipeline")
        start(self.dispatcher.run(), "alarm dispatcher")
        if self.sink.drainer is not None:
            start(self.sink.drainer.run(), "outbox drainer")
        if self.modbus is not None:
            start(self.modbus.run(self.pipeline.source("modbus")), "modbus")
        if self.mqtt_source is not None:
            start(self.mqtt_source.run(self.pipeline.source("mqtt")), "mqtt")
        if self.commands is not None:
            start(self.commands.run(), "mqtt commands")
        start(self._timers(), "timers")
        if self.callout is not None:  # callout
            self.callout.resume()
            start(self.callout.run(), "callout")
        if console is not None:
            start(console.serve(), "console")
            try:
                await console.wait_started()
            except MonitorError:
                await self._shutdown(tasks, console)
                raise
            self.console_url = f"http://{self.config.console.host}:{console.port}/"
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
            await self._shutdown(tasks, console)

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

    async def _shutdown(self, tasks: list[asyncio.Task[Any]], console: ServedConsole | None) -> None:
        if console is not None:
            console.stop()
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
        if not self.pipeline.process_queued(retry_now=True):
            log.warning("%d reading(s) not stored at shutdown (state disk)", self.pipeline.waiting)
        self.tick()
        if self.clock_watch is not None:  # a flapping clock's steps not summarised yet
            self.clock_watch.step_log.flush(self.clock_watch.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.dispatcher.drain(), timeout=STOP_DRAIN)
        # Let uvicorn finish its own shutdown: cancelled mid-way it leaves the listening
        # socket open, and the daemon a SIGHUP reload starts cannot bind the port.
        console_task = [t for t in tasks if t.get_name() == "console"]
        if console_task:
            await asyncio.wait(console_task, timeout=STOP_DRAIN)
        await _cancel(tasks)
        # With the database already down (the drainer's last attempt failed), one more
        # attempt rather than STOP_DRAIN seconds of retries: the rest waits on disk.
        down = self.sink.drainer is not None and self.sink.drainer.failing
        left = await self.sink.drain(0.0 if down else STOP_DRAIN)
        if left:
            log.warning("%d point(s) stay in the outbox for the next start", left)
        self.checkpoint()
        self.clock_file.beat(self.clock.now(), force=True)
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


class DailyFeed:
    """The station's daily totals (a local day just closed) to the outbox for InfluxDB.

    The tracker hands a day's lines over once; an outbox that refuses them (a full or failing
    state disk) leaves them kept (`monitor/sinks/kept.py`), said once per episode, and they go
    with the next batch or timer work once it takes them. Only a restart before that loses
    them from memory; the station store notes the last day the outbox took, and a restart
    closes the days after it again from the store's records (`DailyTotals.resumed`)."""

    def __init__(self, station: LiveStation, sink: SampleSink) -> None:
        self.station = station
        self.kept = KeptLines(sink.outbox, "daily totals") if sink.outbox is not None else None

    def judged(
        self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
    ) -> None:
        lines = self.station.take_daily()
        if self.kept is None:  # no InfluxDB: nothing to send again after a restart either
            if lines:
                self.station.daily_queued()
            return
        sent = bool(lines or self.kept.waiting)
        if self.kept.add(lines) and sent:
            self.station.daily_queued()  # else a restart closes those days again from the store


INCIDENT_SENSOR = "incident_store"  # the pseudo-sensor of the `incidents` diagnostic alarm
INCIDENT_CITATION = "station-monitor incident store"


class IncidentFeed:
    """Incidents (issue 16) from what the pipeline just judged. One incident's damaged
    evidence is the tracker's to mark (the others go on); a store that fails as a whole (full
    or read-only disk, damaged file) never stops the pipeline: logged once, counted, and the
    high-priority `incident_store/incidents` alarm raised, cleared by the first batch recorded
    again (the next batches copy what was missed from the tracker's buffer). `raised`: the
    journal holds that alarm active from before a restart, so the first success clears it."""

    def __init__(
        self,
        tracker: IncidentTracker,
        sink: SampleSink,
        clock: Clock,
        on_condition: Callable[[Condition], None] | None = None,
        raised: bool = False,
    ) -> None:
        self.tracker = tracker
        self.sink = sink
        self.clock = clock
        self.on_condition = on_condition
        self.failing: str | None = "(before a restart)" if raised else None
        self.failures = 0  # batches whose incidents were not recorded (/metrics)

    def health(self) -> IncidentHealth:
        return IncidentHealth(
            failing=self.failing,
            failures=self.failures,
            evidence_incomplete=self.tracker.evidence_incomplete,
        )

    def judged(
        self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
    ) -> None:
        try:
            changed = self.tracker.observe(samples, conditions)
        except (MonitorError, OSError) as exc:
            self.failures += 1
            if self.failing is None:
                self.failing = str(exc)
                log.error("incidents not recorded: %s", exc)
                self._alarm(ConditionState.ACTIVE, f"incidents not recorded: {exc}")
            return
        if self.failing is not None:
            log.info("incidents recorded again")
            self.failing = None
            self._alarm(ConditionState.CLEARED, "incidents recorded again")
        if changed and self.sink.outbox is not None:
            try:
                self.sink.outbox.append(incident_lines(changed))
            except MonitorError as exc:
                log.warning("%d incident point(s) not queued for InfluxDB: %s", len(changed), exc)

    def _alarm(self, state: ConditionState, message: str) -> None:
        if self.on_condition is not None:
            self.on_condition(store_condition(self.clock.now(), state, message))


def store_condition(now: float, state: ConditionState, message: str) -> Condition:
    """The `incident_store/incidents` diagnostic's transition."""
    return Condition(
        time=now,
        sensor=INCIDENT_SENSOR,
        rule=Rule.INCIDENTS,
        state=state,
        value=math.nan,
        limit=None,
        citation=INCIDENT_CITATION,
        message=message,
    )


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
