"""Line protocol for the three measurements station-monitor writes.

Pure functions, no I/O, so the outbox, the bench and the tests share one
serialiser. The schema (docs/outputs.md, "Schema"):

    sensor,station=<id>,sensor=<id>,kind=<kind>,unit=<unit> value=<float>,quality=<int>i <ns>
    alarm,station=<id>,sensor=<id>,rule=<rule>,priority=<p>,citation=<§> active=<0|1>i,value=..,limit=.. <ns>
    meter,station=<id>,meter=<id>,account=<id>,unit=<unit> reading=<float>,consumption_ft3=<float> <ns>

Only numeric fields: VictoriaMetrics stores numbers only (a string field turns
into a bogus 0), so states are integers. Non-finite numbers cannot be written in
line protocol and are left out of the line (a COMM_FAILURE sample keeps its
`quality` field). A reading that is not GOOD is written without its value: a
BAD_DATA reading's number is by definition not believable (a finite 1e300 made a
historian turn neighbouring good readings into 0.0), so only its quality goes out;
the same for the value of a bad-value diagnostic alarm. Tags hold identifiers
only, never values, so cardinality stays at sensors x rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from monitor.model import Alarm, AlarmState, Condition, ConditionState, Rule, Sample

_SPACE = {" ": r"\ ", "\n": r"\ ", "\r": r"\ ", "\t": r"\ "}  # line breaks cannot be escaped
_KEY = str.maketrans({",": r"\,", "=": r"\=", "\\": "\\\\", **_SPACE})
_MEASUREMENT = str.maketrans({",": r"\,", "\\": "\\\\", **_SPACE})

# ISA-18.2 states as integers (VictoriaMetrics cannot store the names).
ALARM_STATE_CODE: dict[AlarmState, int] = {
    AlarmState.NORMAL: 0,
    AlarmState.UNACK: 1,
    AlarmState.ACKED: 2,
    AlarmState.RTN_UNACK: 3,
    AlarmState.SHELVED: 4,
    AlarmState.SUPPRESSED: 5,
    AlarmState.OUT_OF_SERVICE: 6,
}


def escape_key(text: str) -> str:
    """Escape a tag key, tag value or field key (comma, equals, space, backslash).

    Newlines and tabs cannot be carried in these positions at all and become spaces.
    """
    return text.translate(_KEY)


def escape_measurement(text: str) -> str:
    return text.translate(_MEASUREMENT)


def ns(t: float) -> int:
    """Epoch seconds -> integer nanoseconds, exact at microsecond resolution.

    `round(t * 1e9)` would turn ...123 ms into ...122999999 ns.
    """
    return round(t * 1_000_000) * 1000


def fmt_float(x: float) -> str:
    """Shortest text that reads back to the same float (repr), always with a dot or exponent."""
    return repr(float(x))


def line(
    measurement: str,
    tags: Mapping[str, str],
    fields: Mapping[str, float | int | bool],
    time: float,
) -> str:
    """One point in line protocol. Tags are sorted (what InfluxDB does anyway);
    empty tag values are skipped (InfluxDB rejects them); non-finite floats are
    skipped. At least one field must remain."""
    head = escape_measurement(measurement)
    for key in sorted(tags):
        tag = tags[key]
        if tag:
            head += f",{escape_key(key)}={escape_key(tag)}"
    parts = []
    for name, value in fields.items():
        text = _field_value(value)
        if text is not None:
            parts.append(f"{escape_key(name)}={text}")
    if not parts:
        raise ValueError(f"point {measurement} {dict(tags)} has no finite field")
    return f"{head} {','.join(parts)} {ns(time)}"


def _field_value(value: float | int | bool) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if not math.isfinite(value):
        return None
    return fmt_float(value)


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    """What the tags of one sensor's series say: its kind and unit."""

    kind: str
    unit: str


class SampleSerializer:
    """Sample -> `sensor` line, with each sensor's tag prefix built once.

    The hot path: one f-string per sample, no dict or sort per point.
    """

    def __init__(self, station: str, series: Mapping[str, SeriesInfo]) -> None:
        self.station = station
        self._series = dict(series)
        self._prefix: dict[str, str] = {}

    def prefix(self, sensor: str) -> str:
        found = self._prefix.get(sensor)
        if found is None:
            info = self._series.get(sensor)
            tags = {"station": self.station, "sensor": sensor}
            if info is not None:
                tags["kind"] = info.kind
                tags["unit"] = info.unit
            head = "sensor"
            for key in sorted(tags):
                head += f",{key}={escape_key(tags[key])}"
            found = self._prefix[sensor] = head + " "
        return found

    def sample(self, s: Sample) -> str:
        return self.samples((s,))[0]

    def samples(self, samples: Iterable[Sample]) -> list[str]:
        out = []
        get = self._prefix.get
        for s in samples:
            head = get(s.sensor) or self.prefix(s.sensor)
            v = float(s.value)
            t = round(s.time * 1_000_000) * 1000
            if v - v == 0.0 and s.quality == 0:  # finite and GOOD (v - v: faster than isfinite)
                out.append(f"{head}value={v!r},quality={int(s.quality)}i {t}")
            else:
                out.append(f"{head}quality={int(s.quality)}i {t}")
        return out

    def columns(
        self,
        names: Sequence[str],
        sensor: Iterable[int],
        time: Iterable[float],
        value: Iterable[float],
        quality: Iterable[int],
    ) -> list[str]:
        """The same lines from columns (a replay batch: sensor indexes into `names`),
        without building a Sample per point."""
        heads = [self.prefix(name) for name in names]
        out = []
        for i, t, v, q in zip(sensor, time, value, quality, strict=True):
            ts = round(t * 1_000_000) * 1000
            if v - v == 0.0 and q == 0:
                out.append(f"{heads[i]}value={float(v)!r},quality={int(q)}i {ts}")
            else:
                out.append(f"{heads[i]}quality={int(q)}i {ts}")
        return out


def condition_line(station: str, cond: Condition, priority: str = "") -> str:
    """An alarm transition as the engine reported it: `active` 1 on raise, 0 on clear. An
    overflow that continues an earlier one (monitor/station/tracker.py) carries `continues`,
    that spill's first record's start (Unix seconds: a number, which every server stores)."""
    fields: dict[str, float | int | bool] = {
        "active": 1 if cond.state is ConditionState.ACTIVE else 0,
        "value": math.nan if cond.rule is Rule.BAD_VALUE else float(cond.value),
        "limit": math.nan if cond.limit is None else float(cond.limit),
    }
    continues = cond.extra.get("continues") if cond.rule is Rule.OVERFLOW else None
    if isinstance(continues, float):
        fields["continues"] = continues
    return line(
        "alarm",
        {
            "station": station,
            "sensor": cond.sensor,
            "rule": str(cond.rule),
            "priority": priority,
            "citation": cond.citation,
        },
        fields,
        cond.time,
    )


def alarm_line(station: str, alarm: Alarm) -> str:
    """An ISA-18.2 alarm snapshot (state change, ack, shelve) at `updated_at`."""
    fields: dict[str, float | int | bool] = {
        "active": int(alarm.active),
        "state_code": ALARM_STATE_CODE[alarm.state],
        "acknowledged": int(alarm.acknowledged),
    }
    if alarm.value is not None and alarm.rule is not Rule.BAD_VALUE:
        fields["value"] = float(alarm.value)
    if alarm.limit is not None:
        fields["limit"] = float(alarm.limit)
    return line(
        "alarm",
        {
            "station": station,
            "sensor": alarm.sensor,
            "rule": str(alarm.rule),
            "priority": str(alarm.priority),
            "citation": alarm.citation,
        },
        fields,
        alarm.updated_at,
    )


def meter_line(
    station: str,
    meter: str,
    time: float,
    reading: float,
    consumption_ft3: float | None = None,
    account: str = "",
    unit: str = "",
) -> str:
    """A meter read: the register `reading` in the meter's unit, and the consumption
    in ft3 since the previous read (what §139-3 bills per 1,000 ft3)."""
    fields: dict[str, float | int | bool] = {"reading": float(reading)}
    if consumption_ft3 is not None:
        fields["consumption_ft3"] = float(consumption_ft3)
    return line(
        "meter",
        {"station": station, "meter": meter, "account": account, "unit": unit},
        fields,
        time,
    )


class MeterPoint(Protocol):
    """What a meter ledger row offers as a point (`monitor.meters.book.MeterRecord`
    fits; sinks may not import meters, so this is structural)."""

    @property
    def meter(self) -> str: ...
    @property
    def account(self) -> str: ...
    @property
    def unit(self) -> str: ...
    @property
    def time(self) -> float: ...
    @property
    def reading(self) -> float: ...
    @property
    def consumption(self) -> float: ...
    @property
    def consumption_ft3(self) -> float: ...
    @property
    def accepted(self) -> bool: ...
    @property
    def flags(self) -> str: ...
    @property
    def restamped(self) -> int | None: ...
    @property
    def corrected(self) -> bool: ...


def meter_point_line(station: str, rec: MeterPoint) -> str:
    """A ledger row: reading and consumption in the meter's unit, consumption_ft3
    (0 for a rejected reading) and `accepted` 1/0; `restamped` N on the point clock step N
    moved a reading away from (overwritten rejected, billing nothing), -N on a reading at a
    time step N moved readings from: VictoriaMetrics keeps the values the point had before
    too, and the larger step says which came last."""
    fields: dict[str, float | int] = {
        "reading": float(rec.reading),
        "consumption": float(rec.consumption),
        "consumption_ft3": float(rec.consumption_ft3),
        "accepted": int(rec.accepted),
    }
    if rec.restamped is not None:
        fields["restamped"] = rec.restamped
    if rec.corrected:  # sent again by a correction (`MeterBook.corrected`); absent otherwise
        fields["corrected"] = 1
    return line("meter", {"station": station, "meter": rec.meter, "account": rec.account, "unit": rec.unit},
                fields, rec.time)  # fmt: skip
