"""The shared vocabulary: samples, qualities, conditions, alarm states and the clock.

Everything downstream of a source works on event time (`Sample.time`, epoch
seconds UTC as a float), never on the wall clock, so live polling, replay of
history and tests run the same code. Timer rules read a `Clock` instead.
"""

from __future__ import annotations

import json as _json
import math
import time as _time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Protocol


class Kind(StrEnum):
    """What a sensor measures; decides units, physical range and default rules."""

    FLOW = "flow"
    PH = "ph"
    TEMPERATURE = "temperature"
    CONCENTRATION = "concentration"
    METER = "meter"
    # The pumping station itself (monitor/station): wet well, pumps, on/off signals, rain.
    LEVEL = "level"
    PUMP = "pump"
    STATUS = "status"
    RAIN = "rain"
    CONDUCTIVITY = "conductivity"
    TURBIDITY = "turbidity"
    GAS = "gas"
    SPEED = "speed"
    CURRENT = "current"
    # Computed from other sensors by an expression (monitor/station/derive.py).
    DERIVED = "derived"


class Quality(IntEnum):
    """Quality of one reading, written to InfluxDB as an integer field."""

    GOOD = 0
    BAD_DATA = 1  # the device answered, the value is not believable (NaN, out of range)
    COMM_FAILURE = 2  # the device did not answer; value is NaN


class Rule(StrEnum):
    """The rule behind a condition; also the last MQTT topic level of an alarm."""

    SLUG = "slug"
    HIGH = "high"
    LOW = "low"
    STALE = "stale"
    COMM_LOSS = "comm_loss"
    METER = "meter"
    OUTBOX = "outbox"
    DISK_FULL = "disk_full"
    DISK_LOW = "disk_low"
    NOTIFY = "notify"  # a callout channel keeps failing (diagnostic)
    BAD_VALUE = "bad_value"  # diagnostic: only unbelievable readings for a while
    FROZEN = "frozen"  # instrument: good readings unchanged for longer than frozen_after
    CLOCK = "clock"  # diagnostic: the gateway clock stepped
    STATE = "state"  # a damaged state file was set aside at start
    INCIDENTS = "incidents"  # diagnostic: the incident store refuses to record (incident_store)
    # The pumping station (monitor/station): on a level or pump sensor.
    HIGH_LEVEL = "high_level"
    OVERFLOW = "overflow"
    FAIL_TO_START = "fail_to_start"
    PUMP_STARTS = "pump_starts"
    LONG_RUN = "long_run"


class ConditionState(StrEnum):
    ACTIVE = "active"
    CLEARED = "cleared"


class Priority(StrEnum):
    """Alarm priority as an operator reads it (ISA-18.2 uses 3–4 levels)."""

    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class AlarmState(StrEnum):
    """ISA-18.2 alarm states."""

    NORMAL = "normal"
    UNACK = "active_unacknowledged"
    ACKED = "active_acknowledged"
    RTN_UNACK = "returned_unacknowledged"
    SHELVED = "shelved"
    SUPPRESSED = "suppressed"
    OUT_OF_SERVICE = "out_of_service"


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading: which sensor, when it was true (event time), value, quality."""

    sensor: str
    time: float
    value: float
    quality: Quality = Quality.GOOD


@dataclass(frozen=True, slots=True)
class Condition:
    """A rule's transition for one sensor, as the engine reports it.

    `limit` is the threshold in force at that moment (for a slug, factor x
    baseline); `citation` is the ordinance section the rule enforces.
    """

    time: float
    sensor: str
    rule: Rule
    state: ConditionState
    value: float
    limit: float | None
    citation: str
    message: str = ""
    extra: dict[str, float | str] = field(default_factory=dict)

    def __reduce__(self) -> tuple[Callable[..., Condition], tuple[object, ...]]:
        """Pickled as a `new_condition` call: a replay hands tens of thousands to its incident
        worker (monitor/incidents/worker.py), and a slotted dataclass's own pickling looks
        its fields up again for each one (six times slower)."""
        return (
            new_condition,
            (self.time, self.sensor, self.rule, self.state, self.value, self.limit, self.citation,
             self.message, self.extra),
        )  # fmt: skip

    def to_json(self) -> dict[str, object]:
        """The wire form used by `monitor replay --events` and the MQTT events topic."""
        return {
            "time": iso(self.time),
            "sensor": self.sensor,
            "rule": str(self.rule),
            "state": str(self.state),
            "value": _finite_or_none(self.value),
            "limit": _finite_or_none(self.limit),
            "citation": self.citation,
        }


_new = object.__new__
_SET = tuple(
    getattr(Condition, f).__set__
    for f in ("time", "sensor", "rule", "state", "value", "limit", "citation", "message", "extra")
)


def new_condition(
    time: float,
    sensor: str,
    rule: Rule,
    state: ConditionState,
    value: float,
    limit: float | None,
    citation: str,
    message: str = "",
    extra: dict[str, float | str] | None = None,
) -> Condition:
    """`Condition(...)` at less than half the cost: the slots are set directly, not through
    the frozen dataclass's `__init__` (a busy replay builds tens of thousands)."""
    c = _new(Condition)
    s_time, s_sensor, s_rule, s_state, s_value, s_limit, s_citation, s_message, s_extra = _SET
    s_time(c, time)
    s_sensor(c, sensor)
    s_rule(c, rule)
    s_state(c, state)
    s_value(c, value)
    s_limit(c, limit)
    s_citation(c, citation)
    s_message(c, message)
    s_extra(c, {} if extra is None else extra)
    return c


def number(x: float | None, spec: str = "g") -> str:
    """`x` as a message shows it: `-0.0` (or a value that rounds to it) is `0`, not `-0`,
    which read on a page as a reading below zero. `-` for none."""
    if x is None:
        return "-"
    text = format(x, spec)
    if text.startswith("-") and set(text[1:]) <= set("0."):
        return text[1:]
    return text


def amount(value: float, unit: str) -> str:
    """`603.2 gpm`, `9.5` (pH has no unit): how a reading or limit reads in a message."""
    return f"{number(value, '.4g')} {unit}" if unit else number(value, ".4g")


def _finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x, 6)


EventHead = tuple[str, str, str, str]  # an event's sensor, rule, state and citation


def event_lines(conditions: Iterable[Condition]) -> str:
    """JSON lines, each byte for byte `json.dumps(c.to_json(), ensure_ascii=False)`
    (`event_lines_of` the conditions' fields)."""
    conds = conditions if isinstance(conditions, list) else list(conditions)
    if not conds:
        return ""
    ids: dict[EventHead, int] = {}
    keys = [ids.setdefault((c.sensor, c.rule, c.state, c.citation), len(ids)) for c in conds]
    return event_lines_of(
        [c.time for c in conds], keys, list(ids), [c.value for c in conds], [c.limit for c in conds]
    )


def event_lines_of(
    times: list[float],
    keys: list[int],
    heads_of: Sequence[EventHead],
    values: list[float],
    limits: list[float | None],
) -> str:
    """Events as columns (`keys[i]` indexes `heads_of`), as JSON lines, built without a
    dict and an encoder per event: a replay writes tens of thousands. A time is its hour's
    text (formatted once per hour, in one NumPy call) and its minute and second from a
    table, the text between the time and the value is built once per sensor, rule, state
    and citation, a limit's number once per value."""
    if not times:
        return ""
    hours, at, seconds = _stamps(times)
    mmss = _MMSS or _mmss()
    texts: dict[str, str] = {}
    heads = [
        (
            f'", "sensor": {_text(sensor, texts)}, "rule": {_text(str(rule), texts)},'
            f' "state": {_text(str(state), texts)}, "value": ',
            f', "citation": {_text(citation, texts)}}}\n',
        )
        for sensor, rule, state, citation in heads_of
    ]
    numbers: dict[float, str] = {}
    out: list[str] = []
    for k, hour, second, value, limit in zip(keys, at, seconds, values, limits, strict=True):
        head = heads[k]
        if type(value) is float and (1e-3 <= value < 1e9 or -1e9 < value <= -1e-3):
            # `repr(round(value, 6))` at a third of the cost (53,409 values: 36 -> 14 ms): both
            # round the exact value to 6 decimals the same way (dtoa, mode 3), and a decimal of at
            # most 15 digits is the shortest text of the float it reads as, so the zeros stripped
            # are all repr would differ by (no exponent between 1e-4 and 1e16).
            v = f"{value:.6f}".rstrip("0")
            if v[-1] == ".":
                v += "0"
        elif type(value) is float and value - value == 0:  # finite: `x - x` is NaN for inf and NaN
            v = _repr(round(value, 6))
        else:
            v = _number(value)
        # A limit is mostly one of a few: cached, but for zero (0.0 and -0.0: one key, two texts).
        lim = numbers.get(limit) if type(limit) is float and limit else None
        if lim is None:
            lim = _number(limit)
            if type(limit) is float and limit:
                numbers[limit] = lim
        out.append(f'{{"time": "{hours[hour]}{mmss[second]}{head[0]}{v}, "limit": {lim}{head[1]}')
    return "".join(out)


_repr = float.__repr__
_MMSS: list[str] = []  # "MM:SSZ" of each second of an hour, then "" (built by the first event line)


def _mmss() -> list[str]:
    _MMSS.extend([f"{m:02d}:{s:02d}Z" for m in range(60) for s in range(60)] + [""])
    return _MMSS


def _stamps(times: list[float]) -> tuple[list[str], list[int], list[int]]:
    """`iso(t)` of each time as `hours[at[i]] + _MMSS[seconds[i]]`: whole seconds of years
    1970 to 9999 as their hour's text (once per distinct hour, one NumPy call) and the
    second within the hour; any other time is `iso` whole in `hours` (and what fails there
    fails the same) with the empty text after it."""
    import numpy as np

    t = np.array(times, dtype=np.float64)
    whole = (t == np.floor(t)) & (t >= 0) & (t < _LAST_SECOND)
    hour, second = np.divmod(np.where(whole, t, 0).astype(np.int64), 3600)
    found, at = np.unique(hour, return_inverse=True)
    hours = [s + ":" for s in np.datetime_as_string(found.astype("datetime64[h]")).tolist()]
    if not whole.all():
        for i in np.flatnonzero(~whole).tolist():
            at[i], second[i] = len(hours), 3600
            hours.append(iso(times[i]))
    return hours, at.tolist(), second.tolist()


def _text(s: str, cache: dict[str, str]) -> str:
    found = cache.get(s)
    if found is None:
        found = cache[s] = _json.dumps(s, ensure_ascii=False)
    return found


def _number(x: float | None) -> str:
    r = _finite_or_none(x)
    if r is None:
        return "null"
    return float.__repr__(r) if isinstance(r, float) else _json.dumps(r)


_LAST_SECOND = 253402300800  # 10000-01-01: later times go the long way (and fail there)


@dataclass(frozen=True, slots=True)
class Alarm:
    """An alarm as operators, MQTT subscribers and the console see it (ISA-18.2).

    One alarm per (sensor, rule). The alarm manager owns the state machine and
    hands out these immutable snapshots; notifiers only read them.
    """

    sensor: str
    rule: Rule
    state: AlarmState
    priority: Priority
    value: float | None
    limit: float | None
    citation: str
    message: str = ""
    active: bool = False  # the condition is active now (independent of shelving)
    acknowledged: bool = False
    activated_at: float | None = None
    cleared_at: float | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    ack_note: str | None = None
    shelved_by: str | None = None
    shelved_until: float | None = None
    shelve_reason: str | None = None
    chattering: bool = False
    updated_at: float = 0.0

    @property
    def key(self) -> tuple[str, Rule]:
        return (self.sensor, self.rule)

    def to_json(self) -> dict[str, object]:
        def t(x: float | None) -> str | None:
            return None if x is None else iso(x)

        return {
            "sensor": self.sensor,
            "rule": str(self.rule),
            "state": str(self.state),
            "priority": str(self.priority),
            "active": self.active,
            "acknowledged": self.acknowledged,
            "value": _finite_or_none(self.value),
            "limit": _finite_or_none(self.limit),
            "citation": self.citation,
            "message": self.message,
            "activated_at": t(self.activated_at),
            "cleared_at": t(self.cleared_at),
            "acked_by": self.acked_by,
            "acked_at": t(self.acked_at),
            "ack_note": self.ack_note,
            "shelved_by": self.shelved_by,
            "shelved_until": t(self.shelved_until),
            "shelve_reason": self.shelve_reason,
            "chattering": self.chattering,
            "updated_at": t(self.updated_at),
        }


class Emit(Protocol):
    """How a source hands over what it read: samples, and conditions it detected
    itself (comm-loss). Called on the daemon's event loop thread only; a source with
    a thread of its own (paho) crosses over with `loop.call_soon_threadsafe`."""

    def __call__(self, items: Sequence[Sample | Condition], /) -> None: ...


class AckedEmit(Protocol):
    """`Emit` for a source whose readings are acknowledged (MQTT QoS 1): `ack` is
    called once the items are stored and judged, never before."""

    def __call__(self, items: Sequence[Sample | Condition], ack: Callable[[], None] | None, /) -> None: ...


class Clock(Protocol):
    """Where timer rules, shelving and retries read the current time from."""

    def now(self) -> float: ...


class RefusedAhead(Protocol):
    """The readings a source refused because their own time was further ahead of the
    gateway clock than it allows (MQTT `max_skew`): the stale rule says so, so the
    technician checks the gateway's time sync rather than a device that is fine."""

    def latest(self, sensor: str) -> tuple[float, float, int] | None:
        """(arrived on the gateway clock, how far ahead, how many in a row) of the last one
        refused since the sensor's last reading taken; None when there is none."""
        ...

    def taken(self, sensor: str, stamp: float) -> int:
        """A reading of `sensor` stamped `stamp` was judged (later than the last: one
        dropped, a frozen stamp, is none): its run of refusals is over, unless the last
        refusal arrived after this reading did; how many it had (0: none, or not over)."""
        ...

    def shift(self, delta: float, clock: float | None = None) -> None:
        """The gateway clock stepped by `delta`: the refusals' arrival times move with it,
        each onto the new clock (`clock`: its reading less the clock watch's monotonic time)
        from the clock it arrived on: not at all if that is the new one (a refusal between the
        step and the watch noticing it), by the last of two steps noticed as one."""
        ...


class WallClock:
    """The real clock, for the live daemon."""

    def now(self) -> float:
        return _time.time()


class ScaledClock:
    """Time running `speed` times faster than the wall clock from `start` (the demo
    and the simulator share one, so a day of station life passes in minutes)."""

    def __init__(self, speed: float, start: float | None = None, origin: float | None = None) -> None:
        self.speed = speed
        self.start = _time.time() if start is None else start  # the wall time it runs from
        self.origin = self.start if origin is None else origin  # its time at `start`

    def now(self) -> float:
        return self.origin + (_time.time() - self.start) * self.speed


class ManualClock:
    """A clock tests and replay move by hand."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        self._now = t

    def advance(self, seconds: float) -> None:
        self._now += seconds


def step_text(seconds: float) -> str:
    """A clock step as an operator reads it: 3d 0h 5m, 2h 10m, 42s (here, not in the
    engine, so the meter ledger can say it without importing NumPy)."""
    s = abs(seconds)
    if s < 60:
        return f"{s:.0f}s"
    days, rest = divmod(round(s), 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days}d {hours}h {minutes}m"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m"


def iso(t: float) -> str:
    """Epoch seconds as ISO 8601 UTC with `Z`, milliseconds only when present."""
    dt = datetime.fromtimestamp(t, tz=UTC)
    if dt.microsecond:
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return dt.isoformat(timespec="seconds").replace("+00:00", "Z")


CLOCK_AHEAD_ADVICE = "the gateway clock is behind (check NTP/time sync), or the device's clock is ahead"
"""What a reading refused as stamped ahead of the gateway clock advises, said alike in the
stale alarm and the console (which clock to check first)."""


def about(seconds: float) -> str:
    """A span rounded for a person: `400 s`, `35 min`, `1.0 h`, `3.2 days`."""
    if seconds < 600:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def parse_time(text: str | float | int) -> float:
    """Parse epoch seconds or ISO 8601 (with `Z` or an offset) into epoch seconds.

    A naive ISO time (no offset) is refused: guessing the zone would shift a
    billing period or an alarm by hours.
    """
    if isinstance(text, (int, float)):
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"time {text!r} is not finite")
        return value
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"time {text!r} is not finite")
        return value
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"time {text!r} is neither epoch seconds nor ISO 8601") from exc
    if dt.tzinfo is None:
        raise ValueError(f"time {text!r} has no zone; add Z or an offset")
    return dt.timestamp()
