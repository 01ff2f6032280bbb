"""MQTT sensor ingestion: subscriptions in, samples out to the engine.

paho calls our handler on its network thread. The handler parses the payload
there (microseconds, no I/O, no locks), appends the sample to a deque and, at
most once per drain, wakes the event loop with `call_soon_threadsafe`; the loop
hands samples to the engine in batches. So paho's thread never waits on the loop,
nothing is dropped when the loop is busy, and a flood costs one wake-up per batch.

Each message's `Receipt` travels with its sample (or alone, for a refused
payload, so acknowledgements keep the order the broker sent in); the batch's
`ack` completes them once the pipeline has stored and judged the batch. Until
then the broker holds the messages as in flight, and delivers them again to the
next session if the daemon dies.

Why parse on paho's thread: with the GIL, a loop thread busy parsing makes paho's
thread wait up to the switch interval after every socket call, and a QoS 1
backlog then drains at half speed (measured with bench/mqtt_ingest.py). Parsing
where the bytes arrive keeps all per-message work on one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from monitor.config.sources import Mqtt
from monitor.errors import PayloadError, StampAheadError
from monitor.model import AckedEmit, Clock, Condition, ConditionState, Rule, Sample, WallClock
from monitor.sources.mqtt_receipt import Receipt
from monitor.sources.payload import BadPayloads, Limits, Route, StampsAhead, parse

log = logging.getLogger(__name__)

BATCH = 5000
"""Samples handed over per loop turn before yielding, so a backlog never stalls the loop."""


class Subscriber(Protocol):
    """What ingestion needs from the broker link (an `MqttLink`)."""

    @property
    def where(self) -> str: ...

    @property
    def connected(self) -> bool: ...

    @property
    def last_error(self) -> str | None: ...

    def subscribe(self, topic_filter: str, qos: int, handler: _Handler, *, acked: bool) -> None: ...


class _Handler(Protocol):
    def __call__(self, topic: str, payload: bytes, receipt: Receipt, /) -> None: ...


class MqttSource:
    """Samples from the subscriptions in `config.subscriptions`.

    Construct it before `link.start()`: the subscriptions are registered here, so
    messages the broker kept for our persistent session find a listener.
    """

    def __init__(
        self,
        link: Subscriber,
        config: Mqtt,
        station: str,
        *,
        sensors: Collection[str] | None = None,
        gateway: Collection[str] = (),
        device: Collection[str] = (),
        clock: Clock | None = None,
        log_interval: float = 60.0,
        linger: float = 0.005,
    ) -> None:
        self.link = link
        self.station = station
        self.routes = [Route.compile(sub) for sub in config.subscriptions]
        self.comm_loss_after = config.comm_loss_after
        self.fed = sorted(
            {r.sensor for r in self.routes if "{" not in r.sensor}
            | {s for s in sensors or () if any(r.feeds(s) for r in self.routes)}
        )  # the sensors a broker outage silences, for comm-loss
        self.comm_loss = False
        self._down_since: float | None = None
        self.limits = Limits(max_payload=config.max_payload, max_skew=config.max_skew)
        self.sensors = frozenset(sensors) if sensors is not None else None
        # Stamped by the gateway clock (polled, or fed without a time_path: `reconcile.gateway_fed`):
        # a message with a payload time for one is refused, so no sensor is judged on two clocks.
        self.gateway = frozenset(gateway)
        # Named literally with a time_path (`reconcile.device_named`): a message of a template
        # without one that binds such a sensor is refused, for the same reason.
        self.device = frozenset(device)
        self.clock = clock or WallClock()
        self.bad = BadPayloads(interval=log_interval)
        # Refused as stamped ahead of the gateway clock: the stale alarm and health say so.
        self.ahead = StampsAhead(on_end=self._taken_again)
        self.linger = linger
        self.received = 0
        self.samples = 0
        self._queue: deque[tuple[Sample | None, Receipt]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._wake_pending = False
        for route in self.routes:
            link.subscribe(
                route.filter,
                route.qos if route.qos is not None else config.qos,
                self._handler(route),
                acked=True,
            )

    def _handler(self, route: Route) -> _Handler:
        queue = self._queue
        now = self.clock.now
        limits = self.limits
        sensors = self.sensors
        gateway = self.gateway if route.time_path is not None else frozenset()
        device = self.device if route.time_path is None else frozenset()
        ahead = self.ahead if route.time_path is not None else None

        def on_message(topic: str, payload: bytes, receipt: Receipt) -> None:  # paho's thread
            received = now()
            self.received += 1
            sample: Sample | None = None
            try:
                sample = parse(route, topic, payload, received, limits)
                if sensors is not None and sample.sensor not in sensors:
                    raise PayloadError(f"sensor {sample.sensor!r} is not configured in sensors")
                if sample.sensor in gateway:
                    raise PayloadError(
                        f"sensor {sample.sensor!r} is stamped by the gateway clock (polled over Modbus,"
                        " or fed without a time_path); a payload time would judge it on two clocks"
                    )
                if sample.sensor in device:
                    raise PayloadError(
                        f"sensor {sample.sensor!r} takes its time from the payload (a subscription with a"
                        " time_path names it); a reading stamped at receipt would judge it on two clocks"
                    )
                if ahead is not None:  # received after a refusal ahead: judged, it ends the run
                    ahead.received(sample.sensor, sample.time)
            except PayloadError as exc:
                run = 0
                if (
                    ahead is not None
                    and isinstance(exc, StampAheadError)
                    and (sensors is None or exc.sensor in sensors)
                    and exc.sensor not in gateway
                ):
                    run = ahead.record(exc.sensor, exc.ahead, received)
                self._refused(topic, exc, received, ahead_run=run)
                sample = None  # acknowledged in turn: the broker must not send it again
            queue.append((sample, receipt))
            if not self._wake_pending and self._loop is not None:
                self._wake_pending = True
                # RuntimeError: the loop closed during shutdown; nothing left to hand to.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._wake_up)

        return on_message

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def run(self, emit: AckedEmit) -> None:
        """Hand samples to `emit` until cancelled."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        log.info(
            "MQTT ingest for station %s: %d subscription(s): %s",
            self.station, len(self.routes), ", ".join(f"{r.filter} -> {r.sensor}" for r in self.routes),
        )  # fmt: skip
        watch = asyncio.create_task(self._watch(emit))
        try:
            while True:
                # Clear the flag before draining: a message appended after this either
                # gets drained below or schedules a new wake-up. Nothing can fall between.
                self._wake_pending = False
                while self._queue:
                    self.drain(emit)
                    await asyncio.sleep(0)
                await self._wake.wait()
                self._wake.clear()
                # Let a burst gather: one wake-up per `linger` instead of one per message
                # keeps the loop and paho's thread from trading the GIL for every reading.
                await asyncio.sleep(self.linger)
        finally:
            watch.cancel()
            self._loop = None

    async def _watch(self, emit: AckedEmit, every: float = 1.0) -> None:
        """Raise comm-loss on the fed sensors once the broker has been away for
        `comm_loss_after`, and clear it when the link is back."""
        while True:
            conditions = self.check_link(self.clock.now())
            if conditions:
                emit(conditions, None)
            await asyncio.sleep(every)

    def check_link(self, now: float) -> list[Condition]:
        """One look at the link; the comm-loss transitions it causes, if any."""
        if self.link.connected:
            self._down_since = None
            if not self.comm_loss:
                return []
            self.comm_loss = False
            log.info(
                "MQTT %s: broker back, comm-loss cleared on %d sensor(s)", self.link.where, len(self.fed)
            )
            return self._conditions(ConditionState.CLEARED, now, 0.0, "broker reachable again")
        if self._down_since is None:
            self._down_since = now
        down = now - self._down_since
        if self.comm_loss or down < self.comm_loss_after:
            return []
        self.comm_loss = True
        why = self.link.last_error or "connection lost"
        log.warning(
            "MQTT %s: comm-loss on %s (%s)", self.link.where, ", ".join(self.fed) or "no sensors", why
        )
        return self._conditions(ConditionState.ACTIVE, now, down, f"no broker for {down:.0f} s: {why}")

    def _conditions(self, state: ConditionState, now: float, down: float, why: str) -> list[Condition]:
        message = f"MQTT broker {self.link.where}: {why}"
        return [
            Condition(
                time=now,
                sensor=sensor,
                rule=Rule.COMM_LOSS,
                state=state,
                value=down,
                limit=self.comm_loss_after,
                citation="",
                message=message,
                extra={"broker": self.link.where},
            )
            for sensor in self.fed
        ]

    def drain(self, emit: AckedEmit, limit: int = BATCH) -> int:
        """Emit up to `limit` queued messages in one batch, with the `ack` that
        acknowledges them; returns how many messages."""
        queue = self._queue
        count = min(limit, len(queue))
        if count:
            taken = [queue.popleft() for _ in range(count)]
            batch = [s for s, _ in taken if s is not None]
            self.samples += len(batch)
            emit(batch, _acker([r for _, r in taken]))
        return count

    def _taken_again(self, sensor: str, run: int) -> None:
        """A run of refusals ahead ended by a reading the engine judged (the loop's thread)."""
        log.info(
            "MQTT station %s sensor %r: readings taken again after %d refused as stamped ahead of"
            " the gateway clock", self.station, sensor, run,
        )  # fmt: skip

    def _refused(self, topic: str, exc: PayloadError, now: float, ahead_run: int = 0) -> None:
        """Count a refusal and log it (paho's thread): once a minute per topic with how many came
        between; one stamped ahead of the gateway clock (`ahead_run`, its place in the sensor's
        run) once per run instead (a gateway hours behind would say it every minute on every
        topic until NTP answers), DEBUG while it lasts, INFO when a reading is taken again."""
        count = self.bad.record(topic, now)
        if ahead_run and isinstance(exc, StampAheadError):
            level = logging.WARNING if ahead_run == 1 else logging.DEBUG
            log.log(level, "MQTT station %s topic %r sensor %r: bad payload: %s (refused ahead: %d in a row)",
                    self.station, topic, exc.sensor, exc, ahead_run)  # fmt: skip
            return
        if count is None:
            return
        more = f" ({count} bad payloads on this topic since the last report)" if count > 1 else ""
        log.warning("MQTT station %s topic %r: bad payload: %s%s", self.station, topic, exc, more)

    def pending(self) -> int:
        """Samples parsed but not yet handed to the engine (for health and metrics)."""
        return len(self._queue)


def _acker(receipts: Sequence[Receipt]) -> Callable[[], None]:
    def ack() -> None:
        for receipt in receipts:
            receipt.done()

    return ack
