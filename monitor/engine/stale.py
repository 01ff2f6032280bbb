"""The stale-data rule: a sensor with no good sample for longer than `stale_after`
raises a stale condition at the first clock tick after that; the next good sample
clears it, at its own time or, arriving stamped earlier, at the clock's (never before the
raise). The live form is `Engine.tick`; this is the batch form, which ticks at
every time in the batch as replay does.
"""

from __future__ import annotations

import math

import numpy as np

from monitor.engine.baseline import Floats
from monitor.engine.state import SensorState
from monitor.model import CLOCK_AHEAD_ADVICE, Condition, ConditionState, Rule, about, iso, new_condition

STALE_CITATION = "station config: stale_after"


NO_GOOD_SAMPLE = "no good sample"


def stale_condition(
    sensor: str,
    t: float,
    value: float,
    stale_after: float,
    state: ConditionState,
    message: str = NO_GOOD_SAMPLE,
) -> Condition:
    return new_condition(t, sensor, Rule.STALE, state, value, stale_after, STALE_CITATION, message)


def frozen_stamp(last_time: float) -> str:
    """The stale message of a device-stamped sensor whose readings still arrive but none is
    later than the last one judged: a PLC whose RTC died (the same stamp again and again) or
    stepped back. Said apart from a silence: the technician checks the clock, not the link."""
    return (
        f"{NO_GOOD_SAMPLE}: readings arrive, but stamped no later than {iso(last_time)}"
        " (the device's clock stopped or stepped back); none judged"
    )


def stamped_ahead(ahead: float, count: int) -> str:
    """The stale message of a sensor whose readings arrive but are refused as stamped ahead of
    the gateway clock by more than MQTT `max_skew`: most often the gateway booted on an unset
    clock and NTP has not answered. Said apart from a silence: the technician checks the
    gateway's time sync first, not the PLC."""
    readings = "1 reading" if count == 1 else f"{count:,} readings"
    return (
        f"{NO_GOOD_SAMPLE}: readings arrive but are stamped ahead of the gateway clock by ~{about(ahead)}"
        f" ({readings} refused, over max_skew): {CLOCK_AHEAD_ADVICE}"
    )


def first_tick_after(ticks: Floats, since: float, stale_after: float, until: float) -> float | None:
    """The first tick at which `tick - since > stale_after` holds, exactly as `tick()`
    computes it, and that is not later than `until`; None when there is none."""
    j = int(np.searchsorted(ticks, since + stale_after, side="left"))
    while j > 0 and ticks[j - 1] - since > stale_after:
        j -= 1
    while j < ticks.size and not ticks[j] - since > stale_after:
        j += 1
    if j < ticks.size and ticks[j] <= until:
        return float(ticks[j])
    return None


def _quiet(ticks: Floats, since: float, gt: Floats, sa: float, max_step: float | None = None) -> bool:
    """True when no good sample of the batch comes, nor its last tick, more than `sa` after
    the one before (or `since`): `stale_batch`'s candidates, each compared as it compares
    them, without its arrays of run starts and ends (most batches)."""
    last, first, end = float(ticks[-1]), float(gt[0]), float(gt[-1])
    if not end <= last or first - since > sa or last - end > sa:  # first <= end <= last
        return False
    if max_step is not None:
        return not max_step > sa
    return not bool((gt[1:] - gt[:-1] > sa).any())


def stale_batch(
    st: SensorState,
    ticks: Floats,
    gt: Floats,
    gv: Floats,
    max_step: float | None = None,
    last_tick: float = -math.inf,
) -> list[Condition]:
    """Stale conditions over a batch, as `tick` at each batch time would raise them;
    `max_step`: the largest step of `gt` (rising times), when the caller knows it (the
    times many sensors share, in a time-major batch: one pass for all of them);
    `last_tick`: the engine's clock before the batch. A stale alarm carried into the batch
    was raised at or before it, so a first reading stamped earlier (rows of a file sorted
    by sensor, replayed late) ends it there, as `process` does, never before the raise."""
    out: list[Condition] = []
    sa = st.stale_after
    since = st.fresh
    if math.isnan(since) and ticks.size:
        since = float(ticks[0])
    carried = st.stale_active
    if carried and gt.size:
        ended = max(float(gt[0]), last_tick)
        out.append(stale_condition(st.sensor, ended, float(gv[0]), sa, ConditionState.CLEARED))
    active_at_end = carried and not gt.size
    if ticks.size and not (gt.size and _quiet(ticks, since, gt, sa, max_step)):
        starts = np.concatenate(([since], gt))
        ends = np.concatenate((gt, [math.inf]))
        values = np.concatenate(([st.last_good], gv))
        reach = np.minimum(ends, ticks[-1])
        for i in np.flatnonzero(reach - starts > sa).tolist():
            if i == 0 and carried:
                continue
            tau = first_tick_after(ticks, float(starts[i]), sa, float(ends[i]))
            if tau is None:
                continue
            out.append(stale_condition(st.sensor, tau, float(values[i]), sa, ConditionState.ACTIVE))
            if i < gt.size:
                out.append(stale_condition(st.sensor, float(gt[i]), float(gv[i]), sa, ConditionState.CLEARED))
            else:
                active_at_end = True
    st.stale_active = active_at_end
    if gt.size:
        st.fresh = float(gt[-1])
        st.last_good = float(gv[-1])
    else:
        st.fresh = since
    return out
