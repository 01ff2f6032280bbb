"""What an alarm's value and limit are, in words a person on call reads right.

An alarm carries two numbers, `value` and `limit`, and what they measure depends on its
rule: a reading and its threshold in the sensor's unit (limits, slug, level), but failed
polls (Modbus comm loss), seconds (stale, frozen, broker comm loss, a clock step), hours
(a pump's run), bytes (the state disk, the outbox) or a count (pump starts). Printing
every one as "value 5 degF, limit 3 degF" paged a comm loss as a temperature. One table
here, used by the page, the mail and the log line, so each says what its numbers are.
"""

from __future__ import annotations

import math

from monitor.model import Alarm, Rule, number

__all__ = ["READING_RULES", "figures", "lasting", "reading"]

# The rules whose value is a reading in the sensor's unit (and limit its threshold, or for
# frozen and stale a time). Every other rule is worded below; one not worded (a rule added
# later) gives bare numbers, never the sensor's unit.
READING_RULES = frozenset(
    {
        *(Rule.SLUG, Rule.HIGH, Rule.LOW, Rule.HIGH_LEVEL, Rule.OVERFLOW, Rule.FAIL_TO_START),
        *(Rule.FROZEN, Rule.STALE),
    }
)


def lasting(seconds: float) -> str:
    """How long, as a person says it on a phone at night: `42 s`, `10 min`, `1 h 30 min`,
    `24 h` (up to two days in hours: a day-long link reads `24 h`, not `1d 0h`), `3 days 2 h`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} days {hours} h" if hours else f"{days} days"


def reading(x: float | None, unit: str) -> str:
    """`68 degF`, `0 degC` (never `-0`), `-` for none."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"{number(x)} {unit}".strip()


def _count(x: float, one: str, many: str) -> str:
    n = number(x)
    return f"{n} {one if n == '1' else many}"


def _mib(x: float) -> str:
    return f"{number(x / 2**20, '.0f')} MiB"


def _known(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def figures(alarm: Alarm, unit: str) -> str:
    """The alarm's value and limit, each in its real unit; "" when it has none to show."""
    v, lim, rule = alarm.value, alarm.limit, alarm.rule
    if rule is Rule.FROZEN and _known(lim):
        assert lim is not None
        return f"value {reading(v, unit)}, unchanged for longer than {lasting(lim)}"
    if rule is Rule.STALE and _known(lim):
        assert lim is not None
        silent = f"no reading for longer than {lasting(lim)}"
        return f"last value {reading(v, unit)}, {silent}" if _known(v) else silent
    if rule is Rule.COMM_LOSS:
        return _comm_loss(alarm)
    if rule is Rule.BAD_VALUE:  # the value is the unbelievable reading itself, no limit
        return f"last bad reading {number(v)}" if _known(v) else ""
    if rule is Rule.CLOCK and _known(v):
        assert v is not None
        within = f" (tolerance {lasting(lim)})" if _known(lim) and lim is not None else ""
        return f"stepped {'back' if v < 0 else 'forward'} by {lasting(abs(v))}{within}"
    if rule in (Rule.DISK_LOW, Rule.DISK_FULL):
        if not _known(v):
            return ""
        assert v is not None
        floor = f", floor {_mib(lim)}" if _known(lim) and lim is not None else ""
        return f"{_mib(v)} free{floor}"
    if rule is Rule.OUTBOX and _known(v):
        assert v is not None
        cap = f", cap {number(lim, '.0f')} bytes" if _known(lim) and lim is not None else ""
        return f"{_count(v, 'point', 'points')} dropped{cap}"
    if rule is Rule.NOTIFY:
        return f"{_count(v, 'failed attempt', 'failed attempts')}" if _known(v) and v else ""
    if rule in (Rule.STATE, Rule.INCIDENTS):  # a flag, not a figure: the message says it
        return ""
    if rule is Rule.PUMP_STARTS and _known(v):
        assert v is not None
        most = f", at most {number(lim)} allowed" if _known(lim) else ""
        return f"{_count(v, 'start', 'starts')} in the last hour{most}"
    if rule is Rule.LONG_RUN:  # hours, both
        run = f"running for {lasting(v * 3600.0)}" if _known(v) and v is not None else ""
        most = f"max_run {lasting(lim * 3600.0)}" if _known(lim) and lim is not None else ""
        return ", ".join(x for x in (run, most) if x)
    if rule is Rule.OVERFLOW and not _known(v):  # the level dead or stale: the float's word
        return f"level not read, overflow at {reading(lim, unit)}" if _known(lim) else "level not read"
    if rule is Rule.METER:  # the register as read (counts), and the volume that could pass
        if not _known(v):
            return ""
        assert v is not None
        could = f", at most {reading(lim, unit)} could pass" if _known(lim) else ""
        return f"register reading {number(v)}{could}"
    if rule not in READING_RULES:  # a rule not worded here: its numbers, never the sensor's unit
        return _bare(v, lim)
    if not _known(v) and not _known(lim):
        return ""
    if not _known(v):  # "value -" said nothing
        return f"limit {reading(lim, unit)}"
    return f"value {reading(v, unit)}, limit {reading(lim, unit)}"


def _comm_loss(alarm: Alarm) -> str:
    """A Modbus device's comm loss counts failed polls (`comm_loss_after` polls); a broker's
    counts seconds without it (`comm_loss_after` a duration). The alarm does not carry which
    source raised it, only the message each source writes ("modbus device ..." or "MQTT
    broker ..."); an unknown one gives its numbers with no unit at all, never the sensor's."""
    v, lim = alarm.value, alarm.limit
    if alarm.message.startswith("modbus device"):
        polls = _count(v, "failed poll", "failed polls") if _known(v) and v is not None else ""
        after = f"alarm after {number(lim)}" if _known(lim) and lim is not None else ""
        return ", ".join(x for x in (polls, after) if x)
    if alarm.message.startswith("MQTT broker"):
        down = f"no broker for {lasting(v)}" if _known(v) and v is not None else ""
        after = f"alarm after {lasting(lim)}" if _known(lim) and lim is not None else ""
        return ", ".join(x for x in (down, after) if x)
    return _bare(v, lim)


def _bare(v: float | None, lim: float | None) -> str:
    """Numbers whose unit is not known here: no unit at all rather than a wrong one."""
    parts = [f"value {number(v)}" if _known(v) else "", f"limit {number(lim)}" if _known(lim) else ""]
    return ", ".join(x for x in parts if x)
