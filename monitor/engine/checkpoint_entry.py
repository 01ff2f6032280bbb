"""What a sound sensor entry of the engine checkpoint is.

The checkpoint is JSON a person can edit and a disk can damage. Taken with `bool()` and
`float()`, `"active": "false"` was True (an alarm held active that was never raised), a
string number was a number, and a slug run that began after the sensor's last reading, or
at NaN, was restored as if it were one. Each entry is checked here, strictly: a flag must be
a JSON bool, a number a JSON number (a bool is an int to Python, a string one to `float()`),
a time NaN (not set) or finite, and a run's start no later than the latest time the engine
had seen when it saved (`latest`: the sensor's last reading or the last timer tick, whichever
is later: a gateway clock step forward moves the runs and the tick, not the last reading).
An entry that fails is dropped by the caller with one warning naming the sensor (it starts
afresh, as a sensor new to the file), and the rest of the checkpoint is restored.
"""

from __future__ import annotations

import math
from typing import Any

from monitor.engine.state import SensorState
from monitor.errors import StateError
from monitor.model import Quality

_FLAGS = ("stale_active", "bad_episode", "ooo_episode", "bad_active")
_READINGS = ("value", "last_good")  # a reading (NaN before the first), not a time
_SLUG_TIMES = ("run_start", "prev_t", "warm_since")
_BASE = ("bucket", "cur_sum", "cur_count", "win_sum", "win_count")


class UnsoundEntryError(StateError):
    """Why an entry cannot be restored (the text goes in the warning)."""


def _number(d: dict[str, Any], key: str, where: str = "") -> float:
    x = d.get(key)
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise UnsoundEntryError(f"{where}{key} is {x!r}, not a number")
    try:
        return float(x)
    except OverflowError:  # an integer past a float (10**400)
        raise UnsoundEntryError(f"{where}{key} is too large") from None


def _time(d: dict[str, Any], key: str, where: str = "") -> float:
    """A time: NaN (not set) or finite."""
    t = _number(d, key, where)
    if math.isinf(t):
        raise UnsoundEntryError(f"{where}{key} is {t!r}, not a time")
    return t


def _flag(d: dict[str, Any], key: str, where: str = "") -> bool:
    x = d.get(key)
    if not isinstance(x, bool):
        raise UnsoundEntryError(f"{where}{key} is {x!r}, not true or false")
    return x


def _int(x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise UnsoundEntryError(f"{what} is {x!r}, not a whole number")
    return x


def _dict(x: object, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise UnsoundEntryError(f"{what} is {x!r:.60}, not an object")
    return x


def _not_after(start: float, latest: float, what: str) -> None:
    if start > latest:  # NaN compares False: a run not begun
        raise UnsoundEntryError(f"{what} {start!r} is after the last reading or tick {latest!r}")


def check_entry(st: SensorState, entry: object, has_row: bool, last_tick: float) -> None:
    """Raise `UnsoundEntryError` saying what is wrong with sensor `st`'s checkpoint `entry`;
    `last_tick` the file's."""
    d = _dict(entry, "the entry")
    last_time = _number(d, "last_time")
    if math.isnan(last_time) or last_time == math.inf:  # -inf: no reading yet
        raise UnsoundEntryError(f"last_time is {last_time!r}")
    last = max(last_time, last_tick)
    for k in _FLAGS:
        _flag(d, k)
    for k in _READINGS:
        _number(d, k)
    _time(d, "fresh")
    _not_after(_time(d, "bad_since"), last, "bad_since")
    q = d.get("quality")
    if q is not None and (_int(q, "quality") not in set(Quality)):
        raise UnsoundEntryError(f"quality is {q!r}")
    if has_row:
        b = _dict(d.get("baseline"), "baseline")
        for k in _BASE:
            _int(b.get(k), f"baseline.{k}")
    if st.slug is not None:
        _check_slug(_dict(d.get("slug"), "slug"), last_time, last)
    limits = _dict(d.get("limits"), "limits")
    for lim in st.limits:
        s = limits.get(str(lim.rule))
        if s is None:  # a limit side this sensor did not have before starts fresh
            continue
        where = f"limits.{lim.rule}."
        s = _dict(s, where[:-1])
        _flag(s, "active", where)
        for k in ("a_start", "b_start"):
            _not_after(_time(s, k, where), last, f"{where}{k}")


def _check_slug(s: dict[str, Any], last_time: float, last: float) -> None:
    _flag(s, "active", "slug.")
    run_start, prev_t, warm_since = (_time(s, k, "slug.") for k in _SLUG_TIMES)
    _not_after(run_start, last, "slug.run_start")  # later: the slug held off by as much
    _not_after(prev_t, last_time, "slug.prev_t")  # a good reading's time, not moved by a step
    _not_after(warm_since, last_time, "slug.warm_since")
    mean = _number(s, "last_mean", "slug.")
    if math.isinf(mean):  # a threshold of inf never alarms
        raise UnsoundEntryError(f"slug.last_mean is {mean!r}")
    pending, period = s.get("pending"), s.get("period")
    if not isinstance(pending, list) or not isinstance(period, list):
        raise UnsoundEntryError("slug.pending or slug.period is not a list")
    for p in pending:
        if not isinstance(p, list) or len(p) != 3:
            raise UnsoundEntryError(f"slug.pending holds {p!r:.60}")
        for x in p:
            _int(x, "a slug.pending figure")
    for p in period:
        if not isinstance(p, list) or len(p) != 2:
            raise UnsoundEntryError(f"slug.period holds {p!r:.60}")
        _not_after(_time({"t": p[0]}, "t", "slug.period "), last, "a slug.period time")
        _int(p[1], "a slug.period figure")


def delivery(kept: object) -> tuple[float, float] | None:
    """A device-stamped sensor's kept (lag, lag_at), or None when no watch could have held it
    (a hand edit, a flipped bit): NaN or -inf would take every reading at NaN or -inf (a stale
    alarm that never clears, or one raised for good). The key is optional, so an unusable one
    is learnt again like a missing one, not a reason to refuse every baseline."""
    if not isinstance(kept, dict):
        return None
    lag, at = kept.get("lag"), kept.get("lag_at")
    if not isinstance(lag, (int, float)) or not isinstance(at, (int, float)):
        return None
    if math.isfinite(lag) and math.isfinite(at):
        return float(lag), float(at)
    if lag == math.inf and at == -math.inf:  # none learnt yet, as a new watch holds it
        return math.inf, -math.inf
    return None


def frozen_run(entry: object) -> tuple[float, float, float, bool] | None:
    """The frozen-value rule's run (ref, since, last, active) from a checkpoint entry, or None
    when it makes no sense: then the run starts at the next reading, as from a file without
    the entry, and the rest of the file is restored. `since` later than the run's last
    reading, or not a number, silenced the rule until the value changed (a held value never
    does); `active: "false"` held an alarm never raised; a string threw the file away."""
    if not isinstance(entry, dict):
        return None
    # JSON numbers only (a bool is an int to Python, a string one to float()).
    values = [x for k in ("ref", "since", "last") if isinstance(x := entry.get(k), int | float)]
    if any(isinstance(x, bool) for x in values):
        return None
    active = entry.get("active")
    if not isinstance(active, bool) or len(values) != 3:
        return None
    ref, since, last = (float(x) for x in values)
    if math.isnan(ref):  # no run yet (or an alarm the journal held, waiting for its reading)
        return math.nan, math.nan, math.nan, active
    if not (math.isfinite(ref) and math.isfinite(since) and math.isfinite(last) and since <= last):
        return None
    return ref, since, last, active
