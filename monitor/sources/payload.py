"""MQTT payloads -> samples: topic filters, sensor binding, number and JSON forms.

Pure code (no paho, no I/O) so the parser can be fuzzed with thousands of random
payloads in a second. Every refusal is a `PayloadError` whose text says why; the
ingest source counts and logs them per topic (`BadPayloads`) and carries on.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from monitor.config.clocks import sensor_pattern
from monitor.config.sources import Subscription, check_topic_filter
from monitor.errors import PayloadError, StampAheadError
from monitor.model import Sample, parse_time

SENSOR_ID = re.compile(r"^[A-Za-z0-9_.:-]+$")
_PLACEHOLDER = re.compile(r"\{(\d+)\}")
EPOCH_MS_ABOVE = 1e11
"""A numeric timestamp above this is milliseconds: 1e11 s is the year 5138, 1e11 ms is 1973."""


def split_path(path: str) -> tuple[str, ...]:
    """`reading.value` -> ("reading", "value"); a numeric part also indexes a JSON list."""
    parts = tuple(path.split("."))
    if not path or any(not p for p in parts):
        raise ValueError(f"path {path!r} has an empty part")
    return parts


def placeholders(template: str) -> list[int]:
    return [int(n) for n in _PLACEHOLDER.findall(template)]


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching (`+` one level, `#` the rest); `$SYS` topics only by name."""
    flevels = topic_filter.split("/")
    tlevels = topic.split("/")
    if topic.startswith("$") and flevels[0] in ("+", "#"):
        return False
    for i, f in enumerate(flevels):
        if f == "#":
            return True
        if i >= len(tlevels) or (f != "+" and f != tlevels[i]):
            return False
    return len(flevels) == len(tlevels)


@dataclass(frozen=True, slots=True)
class Route:
    """One subscription compiled for the hot path: which levels bind the sensor, which
    form the payload takes, where the value and the time sit in JSON."""

    filter: str
    sensor: str
    format: Literal["number", "json"]
    value_path: tuple[str, ...]
    time_path: tuple[str, ...] | None
    qos: int | None
    wild_levels: tuple[int, ...] = field(default=())

    @classmethod
    def compile(cls, sub: Subscription) -> Route:
        check_topic_filter(sub.topic)
        levels = sub.topic.split("/")
        wild = tuple(i for i, level in enumerate(levels) if level == "+")
        for n in placeholders(sub.sensor):
            if not 1 <= n <= len(wild):
                raise ValueError(f"sensor {sub.sensor!r}: {{{n}}} but the topic has {len(wild)} '+' level(s)")
        return cls(
            filter=sub.topic,
            sensor=sub.sensor,
            format=sub.format,
            value_path=split_path(sub.value_path),
            time_path=split_path(sub.time_path) if sub.time_path else None,
            qos=sub.qos,
            wild_levels=wild,
        )

    def feeds(self, sensor: str) -> bool:
        """Whether some topic matching this filter binds `sensor` (for comm-loss)."""
        if "{" not in self.sensor:
            return sensor == self.sensor
        return sensor_pattern(self.sensor).fullmatch(sensor) is not None

    def sensor_for(self, topic: str) -> str:
        """The sensor id, with `{n}` replaced by the topic level the n-th `+` matched."""
        if not self.wild_levels or "{" not in self.sensor:
            return self.sensor
        levels = topic.split("/")
        if len(levels) <= self.wild_levels[-1]:
            raise PayloadError(f"topic {topic!r} does not match {self.filter!r}")
        out = self.sensor
        for n, index in enumerate(self.wild_levels, start=1):
            out = out.replace(f"{{{n}}}", levels[index])
        if not SENSOR_ID.match(out):
            raise PayloadError(f"topic {topic!r} binds sensor id {out!r}, which is not a valid sensor id")
        return out


@dataclass(frozen=True, slots=True)
class Limits:
    """What the parser refuses: oversized payloads and timestamps from the future."""

    max_payload: int = 65536
    max_skew: float = 300.0


def parse(route: Route, topic: str, payload: bytes, received: float, limits: Limits = Limits()) -> Sample:
    """Turn one message into a sample, or raise `PayloadError` saying why not."""
    if len(payload) > limits.max_payload:
        raise PayloadError(f"payload of {len(payload)} bytes is over max_payload ({limits.max_payload})")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(f"payload is not UTF-8 (byte {exc.start})") from None
    sensor = route.sensor_for(topic)
    if route.format == "number":
        value = _number_text(text)
        return Sample(sensor, received, value)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"payload is not JSON: {_short(exc)}") from None
    value = _number(_lookup(doc, route.value_path), "value", route.value_path)
    when = received
    if route.time_path is not None:
        when = _timestamp(_lookup(doc, route.time_path), route.time_path)
        if when > received + limits.max_skew:
            ahead = when - received
            raise StampAheadError(
                f"timestamp {when:.3f} is {ahead:.0f} s in the future (max_skew {limits.max_skew:g} s):"
                " the gateway clock is behind, or the device's clock is ahead",
                sensor,
                ahead,
            )
    return Sample(sensor, when, value)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _number_text(text: str) -> float:
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        shown = s if len(s) <= 40 else s[:37] + "..."
        raise PayloadError(f"payload {shown!r} is not a number") from None
    if not math.isfinite(value):
        raise PayloadError(f"value {s!r} is not finite")
    return value


def _lookup(doc: object, path: tuple[str, ...]) -> object:
    node = doc
    for depth, part in enumerate(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PayloadError(f"JSON has no {'.'.join(path[: depth + 1])!r}")
    return node


def _number(node: object, what: str, path: tuple[str, ...]) -> float:
    where = ".".join(path)
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise PayloadError(f"{what} at {where!r} is {_kind(node)}, not a number")
    try:
        value = float(node)
    except OverflowError:
        raise PayloadError(f"{what} at {where!r} is out of range") from None
    if not math.isfinite(value):
        raise PayloadError(f"{what} at {where!r} is not finite ({value})")
    return value


def _timestamp(node: object, path: tuple[str, ...]) -> float:
    """Epoch seconds, epoch milliseconds (told apart by size) or ISO 8601 with a zone. An ISO
    time is never milliseconds: a garbage clock at year 9999 is out of range, not 1978."""
    epoch = True
    if isinstance(node, str):
        try:
            t = parse_time(node)
        except (ValueError, OverflowError) as exc:
            raise PayloadError(f"time at {'.'.join(path)!r}: {_short(exc)}") from None
        try:
            float(node)
        except ValueError:
            epoch = False
    else:
        t = _number(node, "time", path)
    if epoch and abs(t) > EPOCH_MS_ABOVE:
        t /= 1000.0
    if not 0.0 <= t < EPOCH_MS_ABOVE:  # before 1970 is no device's clock: a garbage stamp
        raise PayloadError(f"time at {'.'.join(path)!r} is out of range (before 1970 or after 5138)")
    return t


def _kind(node: object) -> str:
    if node is None:
        return "null"
    if isinstance(node, bool):
        return "a boolean"
    if isinstance(node, str):
        return "a string"
    if isinstance(node, (list, dict)):
        return "a list" if isinstance(node, list) else "an object"
    return type(node).__name__


class BadPayloads:
    """Counts refused payloads per topic and decides when to log: the first one on a
    topic at once, then at most once per `interval` with how many came in between.

    The topic table is capped so a publisher inventing topics cannot grow it without
    end; past the cap, new topics are counted under `(other topics)`.
    """

    OTHER = "(other topics)"

    def __init__(self, interval: float = 60.0, max_topics: int = 10_000) -> None:
        self.interval = interval
        self.max_topics = max_topics
        self.counts: dict[str, int] = {}
        self._last_logged: dict[str, float] = {}
        self._since_log: dict[str, int] = {}
        self.total = 0

    def record(self, topic: str, now: float) -> int | None:
        """Count one refusal; return how many refusals the log line stands for, or None
        when this one should not be logged."""
        if topic not in self.counts and len(self.counts) >= self.max_topics:
            topic = self.OTHER
        self.total += 1
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self._since_log[topic] = self._since_log.get(topic, 0) + 1
        last = self._last_logged.get(topic)
        if last is not None and now - last < self.interval:
            return None
        self._last_logged[topic] = now
        return self._since_log.pop(topic)

    def topics(self) -> Iterable[tuple[str, int]]:
        return sorted(self.counts.items())


SAME_CLOCK = 0.5
"""Seconds between a refusal's offset (gateway clock less monotonic) and the clock's now
within which it arrived on the clock of now: the jitter of reading the two clocks, not a step."""

RUN_GAP = 3600.0
"""Seconds without a refusal after which the next one of the same sensor starts a new run
(a WARNING again): a gateway clock behind for days with the device silent between is news
when the device reports again. A device reporting less often than this warns at each report."""


class StampsAhead:
    """The readings refused for a time ahead of the gateway clock (`StampAheadError`), per
    sensor: when the last one arrived (gateway clock), how far ahead it was, and how many
    in a row since the sensor's last reading taken (`taken`, which the engine calls for a
    reading it judged: one it drops, a frozen stamp, ends nothing) or since a silence of
    `RUN_GAP`. Only a reading received after the run's last refusal ends it (`received`
    notes its stamp on paho's thread): one received before, judged after on the loop's
    thread, is no sign the device's clock is right again. The stale rule reads `latest`
    (`model.RefusedAhead`), health `total`, `last` and `worst`. The arrival times are on
    the gateway clock and move with its steps (`shift`, called where the engine's stale
    watches move); each also notes the gateway clock's reading less the `monotonic` time
    when it arrived, so a step moves each onto the clock of now from the clock it arrived
    on (one that arrived after the step but before the clock watch noticed it, under a second
    later, was moved by the step as well: after a step back it read as the step's length
    old, and health dropped the sensor's line until the next refusal).

    Written on paho's thread (`record`, `received`), on the loop's (`taken`, `shift`): one lock.
    The table is capped like `BadPayloads`'s; past the cap only the totals count.
    """

    def __init__(self, max_sensors: int = 10_000, on_end: Callable[[str, int], None] | None = None) -> None:
        """`on_end(sensor, refused)`: a run ended by a reading taken (the source logs it)."""
        self.max_sensors = max_sensors
        self.on_end = on_end
        self.total = 0
        self.last: tuple[float, float] | None = None  # (arrived, ahead) of the last one, any sensor
        self._by_sensor: dict[str, tuple[float, float, int]] = {}
        # The earliest stamp of a good reading received since the sensor's last refusal, if
        # any: a judged reading stamped at least that ends the run (`taken`).
        self._answered: dict[str, float] = {}
        # The clock watch's monotonic clock (the daemon sets it, `Daemon.watch_clock`), and
        # per sensor (the last one, any sensor's) the arrival less it: which clock stamped it.
        self.monotonic: Callable[[], float] = time.monotonic
        self._offsets: dict[str, float] = {}
        self._last_offset = 0.0
        self._lock = threading.Lock()

    def record(self, sensor: str, ahead: float, arrived: float) -> int:
        """Count one refusal; return its place in the sensor's run (1: a run starts, said
        once in the log), or 0 past the cap (not tracked)."""
        offset = arrived - self.monotonic()
        with self._lock:
            self.total += 1
            self.last, self._last_offset = (arrived, ahead), offset
            entry = self._by_sensor.get(sensor)
            if entry is None and len(self._by_sensor) >= self.max_sensors:
                return 0
            run = 1 if entry is None or arrived - entry[0] > RUN_GAP else entry[2] + 1
            self._by_sensor[sensor] = (arrived, ahead, run)
            self._offsets[sensor] = offset
            self._answered.pop(sensor, None)  # readings received before it end nothing now
            return run

    def received(self, sensor: str, stamp: float) -> None:
        """A good reading of `sensor` stamped `stamp` was received (paho's thread, before it
        is queued): if the engine judges it, or a later one, the run before it is over."""
        if not self._by_sensor:  # the common case, without the lock
            return
        with self._lock:
            if sensor in self._by_sensor and stamp < self._answered.get(sensor, math.inf):
                self._answered[sensor] = stamp

    def taken(self, sensor: str, stamp: float) -> int:
        """A reading of `sensor` stamped `stamp` was judged: a run of refusals, if any, is
        over if a reading received after its last refusal was stamped no later; how many
        it had (0: none, or not over: a refusal came while this reading waited)."""
        if not self._by_sensor:  # the common case, without the lock
            return 0
        with self._lock:
            if not stamp >= self._answered.get(sensor, math.inf):
                return 0
            del self._answered[sensor]
            entry = self._by_sensor.pop(sensor, None)
            self._offsets.pop(sensor, None)
        if entry is None:
            return 0
        if self.on_end is not None:
            self.on_end(sensor, entry[2])
        return entry[2]

    def shift(self, delta: float, clock: float | None = None) -> None:
        """The gateway clock stepped by `delta`: the refusals happened where they did.
        `clock`: the new clock's reading less the monotonic time (the clock watch's, when
        it noticed the step): each refusal moves onto it by its own offset's difference from
        it, so one that arrived on the new clock already stays, and one that arrived between
        two steps the watch noticed as one (a step back of 1 h, then forward 30 min) moves
        by the second only (moved by all or none, it read 30 min away from when it came).
        None: every one moves by `delta`."""

        def moved(offset: float) -> float:
            if clock is None:
                return delta
            by = clock - offset
            return by if abs(by) > SAME_CLOCK else 0.0

        with self._lock:
            if self.last is not None:
                by = moved(self._last_offset)
                self.last, self._last_offset = (self.last[0] + by, self.last[1]), self._last_offset + by
            by_sensor: dict[str, tuple[float, float, int]] = {}
            for s, (at, a, n) in self._by_sensor.items():
                by = moved(self._offsets.get(s, clock - delta if clock is not None else 0.0))
                by_sensor[s] = (at + by, a, n)
                if s in self._offsets:
                    self._offsets[s] += by
            self._by_sensor = by_sensor

    def latest(self, sensor: str) -> tuple[float, float, int] | None:
        return self._by_sensor.get(sensor)

    @property
    def full(self) -> bool:
        """Whether the table is at its cap (a refused sensor may be missing from it)."""
        return len(self._by_sensor) >= self.max_sensors

    def sensors(self, since: float) -> list[str]:
        """The sensors whose last refusal arrived at or after `since`."""
        return sorted(s for s, (at, _, _) in list(self._by_sensor.items()) if at >= since)

    def worst(self, since: float) -> float | None:
        """How far ahead the furthest of the sensors' last refusals at or after `since` was
        (the last refusal's, any sensor's, past the table's cap), None if none."""
        aheads = [a for at, a, _ in list(self._by_sensor.values()) if at >= since]
        if self.full and self.last is not None and self.last[0] >= since:
            aheads.append(self.last[1])
        return max(aheads, default=None)
