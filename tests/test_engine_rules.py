"""The rules as chapter 139 states them: slug timing and long slugs, warm-up, limits with
unit conversion, deadband and delays, stale data on an injected clock, bad values.

Each scenario runs through the live path and the replay path; both must agree."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from monitor.engine import Engine
from monitor.model import Condition, ConditionState, ManualClock, Quality, Rule, Sample, new_condition
from tests.engine_helpers import T0, canon, every, live, run_live, station

ACTIVE, CLEARED = ConditionState.ACTIVE, ConditionState.CLEARED
FLOW = station(
    {"id": "outfall.flow", "kind": "flow", "unit": "gpm"}
)  # profile: 5x 24 h, > 15 min, 20 h warm-up


def both(config: Any, sensor: str, points: list[tuple[float, float]]) -> tuple[Engine, list[Condition]]:
    """Run live and replay; assert they agree; return the live engine and its conditions."""
    engine, conds = run_live(config, sensor, points)
    other = Engine(config.rules, ManualClock())
    idx = np.full(len(points), other.index(sensor))
    t = np.array([p[0] for p in points])
    v = np.array([p[1] for p in points])
    assert canon(other.replay(idx, t, v).conditions) == canon(conds)
    return engine, conds


def flow_day(hours: float = 21.0, level: float = 100.0) -> list[tuple[float, float]]:
    """A quiet history every 10 s with a little ripple, long enough to leave warm-up."""
    n = int(hours * 360)
    return every(10.0, [level + (i % 7) for i in range(n)])


def then(points: list[tuple[float, float]], seconds: float, value: float) -> list[tuple[float, float]]:
    """Append `seconds` of `value` at 10 s spacing after the last point."""
    start = points[-1][0] + 10.0
    return points + every(10.0, [value] * int(seconds / 10), start)


def slugs(conds: list[Condition]) -> list[Condition]:
    return [c for c in conds if c.rule is Rule.SLUG]


@pytest.mark.parametrize(("minutes", "alarm"), [(14, False), (15, False), (16, True)])
def test_slug_needs_longer_than_15_minutes(minutes: int, alarm: bool) -> None:
    history = flow_day()
    start = history[-1][0] + 10.0
    points = then(then(history, minutes * 60, 603.2), 600, 100.0)
    _, conds = both(FLOW, "outfall.flow", points)
    if not alarm:
        assert slugs(conds) == []
        return
    active, cleared = slugs(conds)
    assert (active.state, cleared.state) == (ACTIVE, CLEARED)
    assert active.time == start + 15 * 60 + 10  # the first sample over for longer than 15 min
    assert active.citation == "§139-11"
    assert active.limit == pytest.approx(5 * 103.0, rel=1e-3)  # 5x the 24 h average (100..106)
    assert cleared.time == start + minutes * 60  # the first sample no longer over


def test_six_hour_slug_is_one_alarm_active_for_six_hours() -> None:
    history = flow_day()
    start = history[-1][0] + 10.0
    points = then(then(history, 6 * 3600, 620.0), 1800, 101.0)
    engine, conds = both(FLOW, "outfall.flow", points)
    active, cleared = slugs(conds)
    assert active.state is ACTIVE and cleared.state is CLEARED
    assert (active.time, cleared.time) == (start + 910, start + 6 * 3600)
    # The slug stayed out of the baseline: the average is still the quiet one.
    mean = engine.baseline_mean("outfall.flow")
    assert mean is not None and mean == pytest.approx(103.0, rel=1e-3)
    assert cleared.limit == pytest.approx(active.limit, rel=1e-3)


def test_no_slug_is_judged_while_warming_up() -> None:
    points = then(flow_day(hours=2.0), 3600, 900.0)  # a huge slug two hours in
    engine, conds = both(FLOW, "outfall.flow", points)
    assert slugs(conds) == []
    assert engine.warming_up("outfall.flow") and engine.status("outfall.flow").warming_up
    engine2, _ = both(FLOW, "outfall.flow", flow_day(hours=20.1))
    assert not engine2.warming_up("outfall.flow")


def test_a_gap_longer_than_max_sample_gap_breaks_the_run() -> None:
    history = flow_day()
    over = then(history, 600, 700.0)  # 10 min over
    gap_start = over[-1][0]
    rest = every(10.0, [700.0] * 60, gap_start + 6 * 60)  # silent 6 min, then 10 min over
    _, conds = both(FLOW, "outfall.flow", [*over, *rest])
    assert slugs(conds) == []  # two runs of 10 min, not one of 26
    rest = every(10.0, [700.0] * 60, gap_start + 4 * 60)  # silent 4 min (< max_sample_gap 5 min)
    _, conds = both(FLOW, "outfall.flow", [*over, *rest])
    assert [c.state for c in slugs(conds)] == [ACTIVE]


TEMPS = station(
    {"id": "outfall.temp", "kind": "temperature", "unit": "degF"},
    {"id": "influent.temp", "kind": "temperature", "unit": "degF", "influent": True},
)


def test_fahrenheit_sensor_is_judged_against_65_celsius() -> None:
    points = every(10.0, [140.0, 149.0, 149.2, 140.0])  # 149 degF is exactly 65 degC: not beyond
    _, conds = both(TEMPS, "outfall.temp", points)
    active, cleared = conds
    assert (active.rule, active.state, active.time) == (Rule.HIGH, ACTIVE, T0 + 20)
    assert active.value == pytest.approx((149.2 - 32) * 5 / 9) and active.limit == 65.0
    assert active.citation == "§139-15 D(1)"
    assert cleared.time == T0 + 30 and cleared.value == pytest.approx(60.0)
    _, conds = both(TEMPS, "influent.temp", every(10.0, [104.0, 104.5]))  # influent: 40 degC
    assert [(c.time, c.limit) for c in conds] == [(T0 + 10, 40.0)]


def test_flow_limit_in_another_unit() -> None:
    config = station(
        {"id": "f", "kind": "flow", "unit": "gpm", "limits": {"high": 1.0, "unit": "cfs"}, "slug": False}
    )
    # 1 cfs = 448.83 gpm
    _, conds = both(config, "f", every(10.0, [448.0, 449.0, 440.0]))
    active, cleared = conds
    assert active.time == T0 + 10 and active.value == pytest.approx(449.0 / 448.831169, rel=1e-6)
    assert cleared.time == T0 + 20


PH = station(
    {
        "id": "ph",
        "kind": "ph",
        "limits": {"deadband": 0.2, "on_delay": "30s", "off_delay": "60s"},
        "stale_after": "1h",
    }
)


def test_on_delay_deadband_and_off_delay() -> None:
    values = [7.0, 9.1, 9.1, 9.1, 7.0]  # beyond for 20 s only: no alarm (on-delay 30 s)
    values += [9.0]  # exactly the limit is not beyond
    values += [9.2, 9.2, 9.2, 9.2]  # beyond from t=60: active at t=90
    values += [8.9] * 10  # inside, but within the 0.2 deadband: stays active
    values += [8.7] * 5 + [9.1] + [8.7] * 7  # back inside for 50 s, beyond again, then 60 s inside
    _, conds = both(PH, "ph", every(10.0, values))
    active, cleared = conds
    assert (active.state, active.time, active.value, active.limit) == (ACTIVE, T0 + 90, 9.2, 9.0)
    assert active.citation == "§139-15 C(3)"
    clear_from = T0 + 10 * (len(values) - 7)
    assert (cleared.state, cleared.time) == (CLEARED, clear_from + 60)


def test_low_limit_is_strictly_below() -> None:
    _, conds = both(PH, "ph", every(40.0, [5.0, 4.9, 4.9, 5.3, 5.3, 5.3]))
    assert [(c.rule, c.state, c.time) for c in conds] == [
        (Rule.LOW, ACTIVE, T0 + 80),
        (Rule.LOW, CLEARED, T0 + 200),
    ]


STALE = station({"id": "ph", "kind": "ph", "stale_after": "2m"}, {"id": "m", "kind": "meter"})


def test_stale_follows_the_injected_clock() -> None:
    clock = ManualClock(T0)
    engine = Engine(STALE.rules, clock)
    assert engine.tick() == []  # the watch starts
    assert engine.process(Sample("ph", T0 + 5, 7.0)) == []
    clock.set(T0 + 125)
    assert engine.tick() == []  # exactly 2 min: not yet
    clock.set(T0 + 126)
    (stale,) = engine.tick()
    assert (stale.rule, stale.state, stale.time, stale.limit) == (Rule.STALE, ACTIVE, T0 + 126, 120.0)
    clock.advance(60)
    assert engine.tick() == []  # raised once
    assert engine.process(Sample("ph", T0 + 190, float("nan"), Quality.COMM_FAILURE)) == []
    assert engine.process(Sample("ph", T0 + 195, 20.0)) == []  # bad data is not fresh data either
    assert Rule.STALE in engine.status("ph").active
    (cleared,) = engine.process(Sample("ph", T0 + 200, 7.1))
    assert (cleared.state, cleared.time, cleared.value) == (CLEARED, T0 + 200, 7.1)


def test_a_sensor_that_never_reports_goes_stale() -> None:
    clock = ManualClock(T0)
    engine = Engine(STALE.rules, clock)
    engine.tick()
    clock.advance(121)
    assert [(c.sensor, c.rule) for c in engine.tick()] == [("ph", Rule.STALE)]  # meters are billing's


def test_bad_values_are_flagged_counted_and_kept_out(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(FLOW.rules, ManualClock())
    engine.process(Sample("outfall.flow", T0, 100.0))
    engine.process(Sample("outfall.flow", T0 + 60, 100.0))
    before = engine.baseline_mean("outfall.flow")
    caplog.set_level(logging.WARNING)
    for i, bad in enumerate([float("nan"), float("inf"), -5.0]):
        sample = Sample("outfall.flow", T0 + 120 + i, bad)
        assert engine.validate(sample).quality is Quality.BAD_DATA
        assert engine.process(sample) == []
    engine.process(Sample("outfall.flow", T0 + 180, 100.0))
    engine.process(Sample("outfall.flow", T0 + 181, -1.0))
    assert engine.counters.bad_values == 4
    assert engine.counters.bad_by_sensor == {"outfall.flow": 4}
    assert engine.baseline_mean("outfall.flow") == before == 100.0
    assert caplog.text.count("not believable") == 2  # once per episode
    assert engine.status("outfall.flow").quality is Quality.BAD_DATA
    ph = Engine(PH.rules, ManualClock())
    assert ph.validate(Sample("ph", T0, 14.5)).quality is Quality.BAD_DATA  # pH is 0-14
    assert ph.validate(Sample("ph", T0, 14.0)).quality is Quality.GOOD


def test_unknown_out_of_order_and_meters_pass_through() -> None:
    engine = Engine(STALE.rules, ManualClock())
    assert engine.process(Sample("nope", T0, 1.0)) == []
    assert engine.process(Sample("m", T0, 1e6)) == []
    assert engine.process(Sample("m", T0, 1e6 + 1)) == []  # same time again
    assert engine.process(Sample("m", T0 - 1, 1e6)) == []
    c = engine.counters
    assert (c.unknown_sensor, c.out_of_order, c.samples) == (1, 2, 1)
    status = engine.status("m")
    assert status.value == 1e6 and status.baseline_mean is None and not status.warming_up


def test_replay_of_whole_arrays_matches_live_for_a_station() -> None:
    config = station(
        {"id": "flow", "kind": "flow", "unit": "gpm", "slug": {"window": "2h", "warmup": "1h"}},
        {"id": "ph", "kind": "ph"},
    )
    pts = then(every(10.0, [100.0] * 720), 1200, 700.0)
    samples = [Sample("flow", t, v) for t, v in pts] + [Sample("ph", t + 5, 9.5) for t, _ in pts[::30]]
    samples.sort(key=lambda s: s.time)
    engine = Engine(config.rules, ManualClock())
    expected = live(engine, samples)
    other = Engine(config.rules, ManualClock())
    got = other.replay(
        np.array([other.index(s.sensor) for s in samples]),
        np.array([s.time for s in samples]),
        np.array([s.value for s in samples]),
    )
    assert canon(got.conditions) == canon(expected)
    assert {(c.sensor, c.rule) for c in expected} == {("flow", Rule.SLUG), ("ph", Rule.HIGH)}
    assert got.accepted.all() and (got.quality == 0).all()


def test_engine_public_surface_is_small() -> None:
    import monitor.engine

    assert sorted(monitor.engine.__all__) == sorted(
        ["CHECKPOINT_FILE", "CheckpointSchedule", "ClockWatch", "Counters", "Engine", "ReplayResult",
         "ReplayStep", "SensorStatus", "load_checkpoint_or_start_fresh", "replay_steps",
         "restore_checkpoint", "save_checkpoint", "slug_status"]
    )  # fmt: skip
    for name in monitor.engine.__all__:
        assert hasattr(monitor.engine, name)


def test_profile_limit_keeps_its_meaning_in_another_limit_unit() -> None:
    # Writing limits in degF must not turn the profile's 65 degC into 65 degF.
    config = station(
        {"id": "t", "kind": "temperature", "unit": "degC", "limits": {"unit": "degF", "low": 100}},
        {"id": "i", "kind": "temperature", "unit": "degC", "influent": True, "limits": {"unit": "degF"}},
    )
    t, i = config.rules["t"].limits, config.rules["i"].limits
    assert t is not None and i is not None
    assert t.low == 100.0 and t.high == pytest.approx(149.0) and t.unit == "degF"
    assert i.high == pytest.approx(104.0) and i.unit == "degF"
    _, conds = both(config, "t", every(10.0, [64.9, 65.1, 37.0, 37.9]))  # 100 degF = 37.8 degC
    assert [(c.rule, c.state) for c in conds] == [
        (Rule.HIGH, ACTIVE),
        (Rule.HIGH, CLEARED),
        (Rule.LOW, ACTIVE),
        (Rule.LOW, CLEARED),
    ]
    assert conds[0].value == pytest.approx(149.18)


def test_new_condition_is_the_constructors_condition_and_pickles_as_one() -> None:
    """The engine builds conditions with `new_condition` (slots set directly): equal to
    `Condition(...)`, with a dict of its own, frozen, and a pickle round trip keeps it."""
    import dataclasses
    import pickle

    args = (T0, "ph1", Rule.HIGH, ACTIVE, 9.5, 9.0, "§139-15 D(1)")
    fast, slow = (
        new_condition(*args, "9.5 above the high limit 9"),
        Condition(*args, message="9.5 above the high limit 9"),
    )
    assert fast == slow and repr(fast) == repr(slow)
    assert new_condition(*args).extra == {} and new_condition(*args).extra is not new_condition(*args).extra
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.value = 1.0  # type: ignore[misc]
    extra: dict[str, float | str] = {"k": 1.0}
    back = pickle.loads(pickle.dumps(new_condition(*args, "m", extra)))
    assert back == Condition(*args, message="m", extra=extra) and back.extra == extra


@pytest.mark.parametrize("unit", ["degC", "pH", "gpm"])
@pytest.mark.parametrize("high", [True, False])
def test_batch_limit_conditions_carry_the_live_messages(unit: str, high: bool) -> None:
    """The batch builds its transitions' texts once for many: each condition, message
    included, is what `condition` gives for it one at a time."""
    from monitor.config.sensors import LimitRule
    from monitor.engine.rules import LimitState

    rule = LimitRule(low=2.0, high=9.0, unit=unit, deadband=0.5, on_delay=0.0, off_delay=0.0, citation="§ x")
    lim = LimitState("s1", rule, unit, high)
    times = [T0, T0 + 1, T0 + 2.5]
    values = [12.345678, 0.001234, 1e6]
    states = [True, False, True]
    got = lim._run(np.array(times), np.array(values), np.array(states)).conditions()
    expected = [
        lim.condition(t, x, ACTIVE if on else CLEARED) for t, x, on in zip(times, values, states, strict=True)
    ]
    assert got == expected and [c.message for c in got] == [c.message for c in expected]
    assert got[0].message.startswith(
        "12.35" + (" " + unit if unit != "pH" else "") + (" above" if high else " below")
    )


@pytest.mark.parametrize("on_delay", [0.0, 20.0])
@pytest.mark.parametrize("off_delay", [0.0, 30.0])
@pytest.mark.parametrize("last", [T0 + 1e4, float("inf")])
def test_batch_limit_without_delays_equals_the_steps(on_delay: float, off_delay: float, last: float) -> None:
    """A side with no on or off delay switches without computing its runs' starts; what it
    raises and the timers it keeps are the live steps' (also when the last time is +inf,
    where `inf - inf` is NaN and the live rule does not switch)."""
    from monitor.config.sensors import LimitRule
    from monitor.engine.rules import LimitState

    rng = np.random.default_rng(7)
    times = np.append(T0 + np.cumsum(rng.choice([1.0, 5.0, 10.0], 400)), last)
    values = rng.choice([1.0, 8.5, 8.9, 9.5, 20.0], times.size)
    values[-2:] = [1.0, 20.0]  # the last sample starts a run beyond the high limit
    rule = LimitRule(
        low=None, high=9.0, unit="pH", deadband=0.3, on_delay=on_delay, off_delay=off_delay, citation="x"
    )
    batch, steps = LimitState("s", rule, "pH", True), LimitState("s", rule, "pH", True)
    with np.errstate(invalid="ignore"):  # inf - inf, as in the live step
        got = batch.batch(times[:200], values[:200]) + batch.batch(times[200:], values[200:])
    expected = [c for t, v in zip(times.tolist(), values.tolist(), strict=True) if (c := steps.step(t, v))]
    assert got == expected and len(got) >= 2
    assert (batch.active, batch.a_start, batch.b_start) == (steps.active, steps.a_start, steps.b_start)


@pytest.mark.parametrize("seed", range(20))
def test_transitions_are_where_the_hysteresis_state_changes(seed: int) -> None:
    """`transitions` gives the indices and final state that the full state array gives."""
    from monitor.engine.rules import hysteresis, transitions

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    pick = rng.choice(3, n, p=[0.6, 0.2, 0.2])  # 0 neither, 1 on, 2 off
    on, off = pick == 1, pick == 2
    for initial in (False, True):
        state = hysteresis(on, off, initial)
        prev = np.concatenate(([initial], state[:-1]))
        at, final = transitions(on, off, initial)
        assert at.tolist() == np.flatnonzero(state != prev).tolist()
        assert final == (bool(state[-1]) if n else initial)


@pytest.mark.parametrize("seed", range(40))
def test_a_quiet_stale_batch_is_one_with_no_candidate(seed: int) -> None:
    """`_quiet` (the stale rule's short cut) holds exactly when the general pass finds no
    sample, nor the last tick, more than `stale_after` after the one before it (a last
    time of +inf, never ticked, is left to the general pass)."""
    from monitor.engine.stale import _quiet

    rng = np.random.default_rng(seed)
    sa = float(rng.choice([30.0, 300.0]))
    gaps = rng.choice([1.0, 10.0, 29.0, 30.0, 31.0, 299.0, 300.0, 301.0], int(rng.integers(1, 30)))
    ticks = T0 + np.cumsum(gaps)
    gt = np.sort(rng.choice(ticks, int(rng.integers(1, ticks.size + 1)), replace=False))
    if seed % 5 == 0:
        gt[-1] = np.inf  # admitted, but never ticked
    since = float(ticks[0] - rng.choice([0.0, 20.0, 400.0]))
    starts = np.concatenate(([since], gt))
    ends = np.concatenate((gt, [np.inf]))
    with np.errstate(invalid="ignore"):
        candidates = np.minimum(ends, ticks[-1]) - starts > sa
    assert _quiet(ticks, since, gt, sa) == (not candidates.any() and bool(np.isfinite(gt[-1])))


@pytest.mark.parametrize("spike", [None, 1.0, 30.0])
def test_a_warm_quiet_slug_batch_ends_as_the_live_steps(spike: float | None) -> None:
    """A warm batch with nothing carried over is settled from each bucket's largest value
    (no per-sample threshold): quiet, or with one sample over (a short run) or a slug of
    `spike` minutes inside it, its conditions and the rule's state are the live path's."""
    points = flow_day(22.0)
    later = every(10.0, [100.0 + (i % 7) for i in range(720)], start=points[-1][0] + 10.0)
    if spike is not None:
        for j in range(300, 300 + max(1, int(spike * 6))):
            later[j] = (later[j][0], 900.0)
    engine, conds = run_live(FLOW, "outfall.flow", points + later)
    other = Engine(FLOW.rules, ManualClock())
    got: list[Condition] = []
    for part in (points, later):
        t = np.array([p[0] for p in part])
        v = np.array([p[1] for p in part])
        got += other.replay(np.zeros(t.size, dtype=np.int64), t, v).conditions
    assert canon(got) == canon(conds) and len(conds) == (2 if spike == 30.0 else 0)
    mine, theirs = other.sensor_states()[0].slug, engine.sensor_states()[0].slug
    assert mine is not None and theirs is not None
    assert (mine.prev_t, mine.warm_since, mine.last_mean, mine.active, mine.pending) == (
        theirs.prev_t, theirs.warm_since, theirs.last_mean, theirs.active, theirs.pending,
    )  # fmt: skip
    assert other.baselines.win_sum == engine.baselines.win_sum
