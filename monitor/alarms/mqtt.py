"""Alarms over MQTT: retained alarm state, the events stream, and operator commands.

Topics, for `<p>` = `mqtt.topic_prefix` and `<s>` = the station id:

    <p>/<s>/alarms/<sensor>/<rule>   retained, QoS 1: the alarm as JSON; an empty
                                     retained message once it is normal again
                                     (cleared and acknowledged)
    <p>/<s>/events                   QoS 1, not retained: every transition
    <p>/<s>/status                   retained: online / offline (the link's birth / last will)
    <p>/<s>/commands/<user>          operator commands, JSON; <user> must be the MQTT
                                     username, which the broker ACL enforces with
                                     `pattern write <p>/+/commands/%u`
    <p>/<s>/commands/<user>/reply    the outcome of each command, for that user only

A command published with the retain flag is ignored (logged once per topic,
with the advice to publish without it): the broker would hand it to every new
session, and the daemon would apply it again at every start. A command may say
when it was sent (`"sent"`, ISO 8601 with a zone or epoch seconds); one older
than `mqtt.command_max_age` (it waited in the broker's session while the
daemon was down) is refused, so an 8-hour-old shelve is not applied now.

This module knows nothing of paho: it talks to a `Link` (publish + subscribe),
which `monitor.sources.mqtt.MqttLink` is, and to `AlarmActions`, which the alarm
manager is. It never decides an alarm's state; it mirrors snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from monitor.config.types import parse_duration
from monitor.errors import AlarmError, MonitorError
from monitor.model import Alarm, AlarmState, Clock, Rule, WallClock, parse_time

log = logging.getLogger(__name__)

MAX_COMMAND_BYTES = 4096
MAX_TEXT = 500
_SENSOR_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


class Publisher(Protocol):
    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, /) -> None: ...


class Delivery(Protocol):
    """How a received command is acknowledged (`monitor.sources.mqtt.Receipt`)."""

    @property
    def retain(self) -> bool: ...

    def done(self) -> None: ...


class Link(Publisher, Protocol):
    def subscribe(
        self, topic_filter: str, qos: int, handler: Callable[[str, bytes, Delivery], None], *, acked: bool
    ) -> None: ...


class AlarmActions(Protocol):
    """The operator actions commands map onto (the alarm manager provides them)."""

    def acknowledge(self, sensor: str, rule: Rule | str, by: str, note: str | None = None) -> Alarm: ...

    def shelve(
        self,
        sensor: str,
        rule: Rule | str,
        by: str,
        reason: str,
        until: float | None = None,
        duration: float | None = None,
    ) -> Alarm: ...

    def unshelve(self, sensor: str, rule: Rule | str, by: str) -> Alarm: ...


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


class AlarmPublisher:
    """Mirrors alarm transitions to retained per-alarm topics and the events topic.

    Usable as a mirror for the alarm dispatcher (`name`, `notify`, `flood`) or
    called directly with `publish(alarm)`.
    """

    name = "mqtt"

    def __init__(self, publisher: Publisher, prefix: str, station: str) -> None:
        self.publisher = publisher
        self.station = station
        self.base = f"{prefix}/{station}"
        self.events_topic = f"{self.base}/events"
        self.published = 0

    def alarm_topic(self, sensor: str, rule: Rule | str) -> str:
        return f"{self.base}/alarms/{sensor}/{rule}"

    def publish(self, alarm: Alarm) -> None:
        """One transition: the retained state (or its clearing), then the event."""
        doc = {"station": self.station, **alarm.to_json()}
        self._retain(alarm, doc)
        self.publisher.publish(self.events_topic, _dumps(doc), 1, False)
        self.published += 1

    def republish(self, alarms: Iterable[Alarm]) -> None:
        """Set every alarm's retained topic as it is now (at start-up), without events."""
        for alarm in alarms:
            self._retain(alarm, {"station": self.station, **alarm.to_json()})

    def _retain(self, alarm: Alarm, doc: dict[str, object]) -> None:
        # NORMAL means cleared and acknowledged: nothing for a late subscriber to see.
        payload = b"" if alarm.state is AlarmState.NORMAL else _dumps(doc)
        self.publisher.publish(self.alarm_topic(alarm.sensor, alarm.rule), payload, 1, True)

    async def notify(self, alarm: Alarm, reminder: bool = False) -> None:
        if not reminder:  # a reminder is no transition; the retained state already says it
            self.publish(alarm)

    async def flood(self, flood: object) -> None:
        """Floods are for people; retained state is exact per alarm regardless."""


Action = Literal["ack", "shelve", "unshelve"]
_FIELDS: dict[str, frozenset[str]] = {
    "ack": frozenset({"action", "sensor", "rule", "user", "note", "id", "sent"}),
    "shelve": frozenset({"action", "sensor", "rule", "user", "reason", "until", "duration", "id", "sent"}),
    "unshelve": frozenset({"action", "sensor", "rule", "user", "id", "sent"}),
}


@dataclass(frozen=True, slots=True)
class AlarmCommand:
    """A validated operator command; `user` is the MQTT username from the topic."""

    action: Action
    sensor: str
    rule: Rule
    user: str
    note: str | None = None
    reason: str | None = None
    until: float | None = None
    duration: float | None = None
    id: str | None = None
    sent: float | None = None


def parse_command(topic: str, payload: bytes, base: str, users: Collection[str]) -> AlarmCommand:
    """Validate a command published on `<base>/commands/<user>`; raise `AlarmError` why not."""
    prefix = f"{base}/commands/"
    user = topic[len(prefix) :] if topic.startswith(prefix) else ""
    if not user or "/" in user:
        raise AlarmError(f"topic {topic!r} is not {prefix}<user>")
    if user not in users:
        raise AlarmError(f"user {user!r} may not command alarms (not in mqtt.command_users)")
    if len(payload) > MAX_COMMAND_BYTES:
        raise AlarmError(f"command of {len(payload)} bytes is over {MAX_COMMAND_BYTES}")
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise AlarmError("command is not a JSON object") from None
    if not isinstance(doc, dict):
        raise AlarmError("command is not a JSON object")
    action = doc.get("action")
    if action not in ("ack", "shelve", "unshelve"):
        raise AlarmError(f"action must be ack, shelve or unshelve, not {_show(action)}")
    unknown = sorted(set(doc) - _FIELDS[action])
    if unknown:
        raise AlarmError(f"{action}: unknown key(s) {', '.join(unknown)}")
    sensor = doc.get("sensor")
    if not isinstance(sensor, str) or not sensor or not set(sensor) <= _SENSOR_CHARS:
        raise AlarmError(f"sensor must be a sensor id, not {_show(sensor)}")
    rule_name = doc.get("rule")
    if rule_name not in {r.value for r in Rule}:
        raise AlarmError(f"rule must be one of {', '.join(r.value for r in Rule)}, not {_show(rule_name)}")
    rule = Rule(rule_name)
    claimed = doc.get("user", user)
    if claimed != user:
        raise AlarmError(f"user {_show(claimed)} in the command is not the sender {user!r}")
    cmd = AlarmCommand(
        action=action,
        sensor=sensor,
        rule=rule,
        user=user,
        note=_text(doc, "note"),
        reason=_text(doc, "reason"),
        until=_until(doc.get("until")),
        duration=_duration(doc.get("duration")),
        id=_text(doc, "id"),
        sent=_time(doc.get("sent"), "sent"),
    )
    if action == "shelve" and not cmd.reason:
        raise AlarmError("shelve needs a reason")
    return cmd


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(doc: dict[str, object], key: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise AlarmError(f"{key} must be text of at most {MAX_TEXT} characters")
    return value


def _until(value: object) -> float | None:
    return _time(value, "until")


def _time(value: object, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AlarmError(f"{key} must be ISO 8601 with a zone, or epoch seconds")
    try:
        t = parse_time(value)
    except (ValueError, OverflowError) as exc:
        raise AlarmError(f"{key}: {exc}") from None
    if not math.isfinite(t):
        raise AlarmError(f"{key} must be a finite time")
    return t


def _duration(value: object) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise AlarmError(f"duration: {exc}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise AlarmError("duration must be positive, e.g. 30m or 2h")
    return seconds


class MqttCommands:
    """Listens on `<base>/commands/+`, applies accepted commands, replies to the sender.

    Construct it before the link starts, so commands kept for our session find a
    listener; `run()` applies them on the event loop, one at a time, in order.
    """

    def __init__(
        self,
        link: Link,
        prefix: str,
        station: str,
        users: Collection[str],
        actions: AlarmActions,
        *,
        clock: Clock | None = None,
        max_age: float = 300.0,
    ) -> None:
        self.link = link
        self.base = f"{prefix}/{station}"
        self.users = frozenset(users)
        self.actions = actions
        self.clock: Clock = clock or WallClock()
        self.max_age = max_age
        self.accepted = 0
        self.refused = 0
        self.retained = 0
        self._retained_logged: set[str] = set()
        self._queue: deque[tuple[str, bytes, Delivery | None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        link.subscribe(f"{self.base}/commands/+", 1, self._on_message, acked=True)

    def _on_message(self, topic: str, payload: bytes, delivery: Delivery) -> None:  # paho's thread
        self._queue.append((topic, payload, delivery))
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        """Apply commands until cancelled."""
        self._loop = asyncio.get_running_loop()
        try:
            while True:
                self._wake.clear()
                while self._queue:
                    topic, payload, delivery = self._queue.popleft()
                    try:
                        if delivery is not None and delivery.retain:
                            self._ignore_retained(topic)
                        else:
                            self.handle(topic, payload)
                    finally:
                        if delivery is not None:
                            delivery.done()  # applied (journaled) or refused: not again
                await self._wake.wait()
        finally:
            self._loop = None

    def _ignore_retained(self, topic: str) -> None:
        self.retained += 1
        if topic in self._retained_logged:
            return
        self._retained_logged.add(topic)
        log.warning(
            "MQTT command on %r ignored: it was published with the retain flag, so the broker would"
            " deliver it again at every start; publish commands without retain, and clear this one"
            " with an empty retained message (mosquitto_pub -r -n -t %s)",
            topic,
            topic,
        )

    def handle(self, topic: str, payload: bytes) -> Alarm | None:
        """Validate and apply one command; the reply says what happened either way."""
        user = topic.rsplit("/", 1)[-1]
        command_id: str | None = None
        try:
            cmd = parse_command(topic, payload, self.base, self.users)
            command_id = cmd.id
            if cmd.sent is not None:
                age = self.clock.now() - cmd.sent
                if age > self.max_age:
                    raise AlarmError(
                        f"command sent {age:.0f} s ago is older than mqtt.command_max_age"
                        f" ({self.max_age:g} s); send it again if it still applies"
                    )
                if -age > self.max_age:  # a sender's clock off by more than the age allowed
                    raise AlarmError(f"command sent {-age:.0f} s in the future: check the sender's clock")
            alarm = self._apply(cmd)
        except AlarmError as exc:
            self.refused += 1
            log.warning("MQTT command on %r refused: %s", topic, exc)
            self._reply(user, {"ok": False, "error": str(exc), "id": command_id})
            return None
        except MonitorError as exc:  # e.g. the journal could not be written: not the sender's fault
            self.refused += 1
            log.error("MQTT command on %r failed: %s", topic, exc)
            self._reply(user, {"ok": False, "error": f"not applied: {exc}", "id": command_id})
            return None
        self.accepted += 1
        log.info("MQTT command %s %s/%s by %s accepted", cmd.action, cmd.sensor, cmd.rule, cmd.user)
        self._reply(user, {"ok": True, "id": command_id, "alarm": alarm.to_json()})
        return alarm

    def _apply(self, cmd: AlarmCommand) -> Alarm:
        if cmd.action == "ack":
            return self.actions.acknowledge(cmd.sensor, cmd.rule, cmd.user, cmd.note)
        if cmd.action == "shelve":
            assert cmd.reason is not None
            return self.actions.shelve(cmd.sensor, cmd.rule, cmd.user, cmd.reason, cmd.until, cmd.duration)
        return self.actions.unshelve(cmd.sensor, cmd.rule, cmd.user)

    def _reply(self, user: str, doc: dict[str, object]) -> None:
        if user and "/" not in user and "+" not in user and "#" not in user:
            self.link.publish(f"{self.base}/commands/{user}/reply", _dumps(doc), 1, False)
