"""The stale rule where a run of bad readings meets `stale_after`: a pH probe reporting
every 10 s sends bad readings (quality BAD_DATA, comm failure, or the PLC's error value in
`bad_values`) for a while, then good ones again.

Each history is judged four ways: replay of a station's export (the 2-D path), replay of
the same rows in another order (the per-sensor path), the live path as replay defines it
(`tick(t)` then `process(sample)`), and the daemon's own clock (a timer tick every second,
between the readings). A silence that ends on the first tick of the replay's clock past
`stale_after` is raised and cleared at that tick (0 s): the daemon shows the same alarm
from its first tick past the limit to the same good reading. It is kept, not dropped: it
is a real silence longer than `stale_after`, and without it a history whose only ticks
are one sensor's readings would never show a stale probe (docs/engine.md, "Stale data").
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.engine import Engine
from monitor.model import Condition, ConditionState, ManualClock, Quality, Rule, Sample
from tests.engine_helpers import T0, canon, live, station

ACTIVE, CLEARED = ConditionState.ACTIVE, ConditionState.CLEARED
ERROR_CODE = -9999.0  # the PLC's "no reading" value, listed in the probe's bad_values
CONFIG = station(
    {"id": "outfall.ph", "kind": "ph", "stale_after": "60s", "bad_values": [ERROR_CODE]},
    {"id": "outfall.flow", "kind": "flow", "unit": "gpm", "stale_after": "10m"},
)
GOOD_PH = 7.0
# A bad pH reading three ways: flagged by the source, a device error value, no answer.
BAD = {
    "bad_data": (GOOD_PH, Quality.BAD_DATA),
    "error_code": (ERROR_CODE, Quality.GOOD),
    "comm_failure": (math.nan, Quality.COMM_FAILURE),
}
Reading = tuple[float, float, Quality]  # time, pH, quality


def probe(
    bad_from: int, bad_steps: int, steps: int, bad: str, missing: range = range(0)
) -> list[Reading | None]:
    """The pH probe every 10 s from T0: good, `bad_steps` bad readings from step
    `bad_from`, good again; None where the whole station sent nothing (`missing`)."""
    value, quality = BAD[bad]
    out: list[Reading | None] = []
    for k in range(steps):
        t = T0 + 10.0 * k
        if k in missing:
            out.append(None)
        elif bad_from <= k < bad_from + bad_steps:
            out.append((t, value, quality))
        else:
            out.append((t, GOOD_PH, Quality.GOOD))
    return out


def rows(readings: list[Reading | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A station export: at each step the probe, then the flow meter (always good)."""
    sensor, time, value, quality = [], [], [], []
    for r in readings:
        if r is None:
            continue
        t, v, q = r
        sensor += [0, 1]
        time += [t, t]
        value += [v, 100.0]
        quality += [int(q), int(Quality.GOOD)]
    return np.array(sensor), np.array(time), np.array(value), np.array(quality, dtype=np.int8)


def stale(conditions: list[Condition]) -> list[tuple[ConditionState, float]]:
    """The probe's stale transitions, as (state, seconds after T0)."""
    return [(c.state, c.time - T0) for c in conditions if c.rule is Rule.STALE and c.sensor == "outfall.ph"]


def judged(readings: list[Reading | None]) -> tuple[list[Condition], list[Condition]]:
    """Replay's conditions (checked equal on the 2-D path, the per-sensor path and the
    live path as replay defines it) and the daemon's (a tick every second)."""
    sensor, time, value, quality = rows(readings)
    together = Engine(CONFIG.rules, ManualClock()).replay(sensor, time, value, quality).conditions
    swap = np.arange(time.size).reshape(-1, 2)[:, ::-1].ravel()  # flow first: not time-major
    apart = Engine(CONFIG.rules, ManualClock()).replay(sensor[swap], time[swap], value[swap], quality[swap])
    ids = ("outfall.ph", "outfall.flow")
    samples = [
        Sample(ids[i], t, v, Quality(q))
        for i, t, v, q in zip(sensor.tolist(), time.tolist(), value.tolist(), quality.tolist(), strict=True)
    ]
    one_by_one = live(Engine(CONFIG.rules, ManualClock()), samples)
    assert canon(together) == canon(apart.conditions) == canon(one_by_one)
    # The daemon: its timer ticks every second, half a second off the readings' times.
    daemon = Engine(CONFIG.rules, ManualClock(T0))
    out: list[Condition] = []
    now = T0 - 0.5
    for s in samples:
        while now + 1.0 < s.time:
            now += 1.0
            out += daemon.tick(now)
        out += daemon.process(s)
    return together, out


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_run_ending_on_the_first_tick_past_the_limit_is_a_0_s_alarm_in_replay(bad: str) -> None:
    """The reviewer's 07:50: good to 07:48:50, bad 07:49:00-07:49:50, good at 07:50:00. No
    good reading for 70 s > 60 s: stale. Replay's clock first passes the limit at 07:50:00,
    the good reading's own time (07:49:50 is exactly 60 s: not longer); the daemon's at
    07:49:50.5. Both clear it with that reading."""
    replayed, daemon = judged(probe(bad_from=1, bad_steps=6, steps=12, bad=bad))
    assert stale(replayed) == [(ACTIVE, 70.0), (CLEARED, 70.0)]
    assert stale(daemon) == [(ACTIVE, 60.5), (CLEARED, 70.0)]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_one_more_bad_reading_makes_the_alarm_last_until_the_good_one(bad: str) -> None:
    """A bad reading past the limit is a tick of replay's clock: raised there, cleared by
    the next good reading (a bad reading clears nothing)."""
    replayed, daemon = judged(probe(bad_from=1, bad_steps=7, steps=12, bad=bad))
    assert stale(replayed) == [(ACTIVE, 70.0), (CLEARED, 80.0)]
    assert stale(daemon) == [(ACTIVE, 60.5), (CLEARED, 80.0)]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_run_of_exactly_stale_after_raises_nothing(bad: str) -> None:
    """Good at 0 s and 60 s, bad between: never longer than 60 s without a good reading."""
    replayed, daemon = judged(probe(bad_from=1, bad_steps=5, steps=12, bad=bad))
    assert stale(replayed) == stale(daemon) == []


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_gap_that_ends_in_a_bad_reading_is_stale_from_that_reading(bad: str) -> None:
    """The whole station silent from 10 s to 60 s, then a bad pH reading at 70 s (the first
    tick of replay's clock past the limit), good at 80 s."""
    readings = probe(bad_from=7, bad_steps=1, steps=12, bad=bad, missing=range(1, 7))
    replayed, daemon = judged(readings)
    assert stale(replayed) == [(ACTIVE, 70.0), (CLEARED, 80.0)]
    assert stale(daemon) == [(ACTIVE, 60.5), (CLEARED, 80.0)]


def test_a_gap_that_ends_in_a_good_reading_is_a_0_s_alarm_in_replay() -> None:
    """The whole station silent for 70 s: replay's first tick past the limit is the good
    reading that ends it. Raised and cleared there, not dropped: the probe was silent."""
    readings = probe(bad_from=0, bad_steps=0, steps=12, bad="bad_data", missing=range(1, 7))
    replayed, daemon = judged(readings)
    assert stale(replayed) == [(ACTIVE, 70.0), (CLEARED, 70.0)]
    assert stale(daemon) == [(ACTIVE, 60.5), (CLEARED, 70.0)]


@pytest.mark.parametrize(("judged_at", "stamped"), [(61, 59.0), (90, 59.0), (90, 60.5)])
def test_a_late_reading_stamped_before_the_alarm_clears_it_when_judged_never_before(
    judged_at: int, stamped: float
) -> None:
    """The daemon's clock raises stale at +61 s (no reading had arrived for more than 60 s);
    a reading stamped before that (a device's own time, a backlog after a broker outage, a
    Modbus poll stamped at its start) arrives after the clock reached `judged_at`. It ends
    the alarm there, when the engine judged it, not at its own earlier time: a clear
    before the raise would be a negative duration in the journal, console and reports."""
    engine = Engine(CONFIG.rules, ManualClock(T0))
    out = engine.process(Sample("outfall.ph", T0, GOOD_PH))
    for k in range(1, judged_at + 1):
        out += engine.tick(T0 + k)
    out += engine.process(Sample("outfall.ph", T0 + stamped, GOOD_PH))
    assert stale(out) == [(ACTIVE, 61.0), (CLEARED, float(judged_at))]


def test_a_reading_stamped_after_the_clock_still_clears_at_its_own_time() -> None:
    """The usual case is unchanged: a reading newer than the last tick clears at its time."""
    engine = Engine(CONFIG.rules, ManualClock(T0))
    out = engine.process(Sample("outfall.ph", T0, GOOD_PH))
    for k in range(1, 71):
        out += engine.tick(T0 + k)
    out += engine.process(Sample("outfall.ph", T0 + 70.5, GOOD_PH))
    assert stale(out) == [(ACTIVE, 61.0), (CLEARED, 70.5)]


def test_a_limit_alarm_cannot_clear_before_it_was_raised_a_reading_out_of_order_is_ignored() -> None:
    """The same pattern for the limit rules cannot happen: they judge each sensor's readings
    in time order, and one not later than the sensor's last is counted and ignored."""
    engine = Engine(CONFIG.rules, ManualClock(T0))
    out = engine.process(Sample("outfall.ph", T0, GOOD_PH))
    out += engine.process(Sample("outfall.ph", T0 + 10, 10.0))  # above 9.0: active (no on-delay)
    out += engine.process(Sample("outfall.ph", T0 + 5, GOOD_PH))  # stamped earlier: ignored
    out += engine.process(Sample("outfall.ph", T0 + 20, GOOD_PH))
    high = [(c.state, c.time - T0) for c in out if c.rule is Rule.HIGH]
    assert high == [(ACTIVE, 10.0), (CLEARED, 20.0)]
    assert engine.counters.out_of_order == 1


def test_rows_replayed_late_end_a_stale_alarm_at_the_replay_clock_as_live_does() -> None:
    """Replay's form of the late reading: a file sorted by sensor, not by time, replays the
    flow meter's rows first (its times are the clock), then the probe's, earlier than the
    clock (counted as late by the reader). The probe went stale at +70 s on the flow
    meter's clock; its first row, stamped +0 s, ends that at the clock (+200 s), never
    before the raise; the live path as replay defines it agrees."""
    times = T0 + 10.0 * np.arange(21, dtype=np.float64)
    engine = Engine(CONFIG.rules, ManualClock())
    out = engine.replay(np.ones(21, int), times, np.full(21, 100.0)).conditions
    out += engine.replay(np.zeros(21, int), times, np.full(21, GOOD_PH)).conditions
    assert stale(out) == [(ACTIVE, 70.0), (CLEARED, 200.0)]
    samples = [Sample("outfall.flow", t, 100.0) for t in times.tolist()]
    samples += [Sample("outfall.ph", t, GOOD_PH) for t in times.tolist()]
    assert canon(live(Engine(CONFIG.rules, ManualClock()), samples)) == canon(out)
