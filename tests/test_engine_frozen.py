"""The frozen-value rule: a sensor whose good readings have not changed (beyond
`frozen_band`) for longer than `frozen_after` raises an instrument alarm, cleared by the
first change. A fouled pH probe, a latched input card or a PLC holding its last register
value after the loop broke all report one value, good quality, for hours: without this
rule the monitor says pH 7.00 all night while the discharge may be at pH 3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import build_config
from monitor.engine import ClockWatch, Engine, replay_steps, restore_checkpoint, save_checkpoint
from monitor.errors import ConfigError
from monitor.model import Condition, ConditionState, ManualClock, Quality, Rule, Sample
from tests.engine_helpers import T0, as_samples, canon, cut_by_a_checkpoint, every, live, run_live, station
from tests.examples import examples
from tests.test_config import run_monitor

ACTIVE, CLEARED = ConditionState.ACTIVE, ConditionState.CLEARED
HOUR = 3600.0

PH = station({"id": "ph", "kind": "ph", "frozen_after": "6h", "stale_after": "5m"})


def frozen(conditions: list[Condition]) -> list[Condition]:
    return [c for c in conditions if c.rule is Rule.FROZEN]


def test_a_held_ph_raises_frozen_after_its_time_and_clears_on_the_first_change() -> None:
    held = every(10.0, [7.0] * (6 * 360 + 5))  # 7.00 every 10 s for 6 h 40 s
    points = [*held, (held[-1][0] + 10.0, 7.01)]
    _, out = run_live(PH, "ph", points)
    raised, cleared = frozen(out)
    assert raised.state is ACTIVE and raised.time == T0 + 6 * HOUR + 10.0  # first one past 6 h
    assert raised.sensor == "ph" and raised.value == 7.0 and raised.limit == 6 * HOUR
    assert raised.message == "pH reads 7.00 unchanged for 6 h 0 min: probe fouled or signal held?"
    assert raised.citation == "station config: frozen_after"
    assert cleared.state is CLEARED and cleared.time == points[-1][0] and cleared.value == 7.01
    assert "7.01" in cleared.message


def test_exactly_frozen_after_unchanged_raises_nothing() -> None:
    _, out = run_live(PH, "ph", every(10.0, [7.0] * (6 * 360 + 1)))  # the last is 6 h to the second
    assert frozen(out) == []


def test_frozen_is_off_unless_configured() -> None:
    config = station({"id": "ph", "kind": "ph", "stale_after": "5m"})
    _, out = run_live(config, "ph", every(60.0, [7.0] * (3 * 24 * 60)))  # three days of 7.00
    assert frozen(out) == []


def test_values_within_the_band_count_as_unchanged_but_a_drift_beyond_it_is_a_change() -> None:
    config = station(
        {"id": "temp", "kind": "temperature", "unit": "degC", "frozen_after": "1h", "frozen_band": 0.05}
    )
    flicker = [21.50, 21.52, 21.48, 21.54, 21.46] * 80  # the last digit flickers: 400 x 10 s
    _, out = run_live(config, "temp", every(10.0, flicker))
    (raised,) = frozen(out)
    assert raised.time == T0 + 3610.0
    assert raised.message == (
        "temperature reads 21.5 degC unchanged (within 0.05) for 1 h 0 min: transmitter stuck or signal held?"
    )
    # A slow real rise, 0.01 degC a sample, never stays within 0.05 of where a run began.
    _, rising = run_live(config, "temp", every(10.0, [20.0 + 0.01 * i for i in range(1000)]))
    assert frozen(rising) == []


def test_a_gap_makes_the_sensor_stale_not_frozen_and_restarts_the_count() -> None:
    """Readings hours apart are no evidence of a held signal: a silence longer than
    `stale_after` restarts the count at the next good reading; the stale alarm covers it."""
    first = every(10.0, [7.0] * 360)  # 1 h of 7.00
    back = every(10.0, [7.0] * 400, start=first[-1][0] + 6 * HOUR)  # 6 h silent, then 7.00 again
    engine, out = run_live(PH, "ph", [*first, *back])
    assert frozen(out) == []
    assert [c.state for c in out if c.rule is Rule.STALE] == [ACTIVE, CLEARED]
    # The count restarted at the first reading after the gap: 6 h later it is frozen.
    more = every(10.0, [7.0] * 2000, start=back[-1][0] + 10.0)
    (raised,) = frozen(live(engine, [Sample("ph", t, v) for t, v in more]))
    assert raised.time == back[0][0] + 6 * HOUR + 10.0


def test_a_gap_is_no_change_an_active_frozen_alarm_stays() -> None:
    engine, out = run_live(PH, "ph", every(10.0, [7.0] * (6 * 360 + 2)))
    assert [c.state for c in frozen(out)] == [ACTIVE]
    later = every(10.0, [7.0] * 10, start=T0 + 8 * HOUR)  # silent 2 h (stale), then the same 7.00
    after = live(engine, [Sample("ph", t, v) for t, v in later])
    assert frozen(after) == [] and engine.status("ph").active == (Rule.FROZEN,)


def test_bad_and_comm_failed_readings_neither_count_nor_break_the_run() -> None:
    engine = Engine(PH.rules, ManualClock(T0))
    out: list[Condition] = []
    for i in range(6 * 360 + 10):
        t = T0 + 10.0 * i
        out += engine.tick(t)
        if i % 7 == 3:  # an error code and a failed poll now and then
            out += engine.process(Sample("ph", t, 3.4028235e38))
        elif i % 11 == 5:
            out += engine.process(Sample("ph", t, 4.0, Quality.COMM_FAILURE))
        else:
            out += engine.process(Sample("ph", t, 7.0))
    assert [c.state for c in frozen(out)] == [ACTIVE]


def test_a_step_forward_of_the_gateway_clock_makes_no_frozen_alarm() -> None:
    """A step measures no time that passed: an hour of 7.00 and a 7 h step is not 6 h held."""
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    engine = Engine(PH.rules, ManualClock())
    watch = ClockWatch(engine, wall=wall.now, monotonic=mono.now)
    out: list[Condition] = []

    def second() -> None:
        wall.advance(1.0)
        mono.advance(1.0)
        out.extend(watch.check())
        out.extend(engine.tick(wall.now()))
        out.extend(engine.process(Sample("ph", wall.now(), 7.0)))

    for _ in range(3600):
        second()
    wall.advance(7 * HOUR)  # NTP steps the gateway clock forward by 7 h
    for _ in range(60):
        second()
    assert [c.rule for c in out if c.rule is Rule.CLOCK] == [Rule.CLOCK]
    assert frozen(out) == []
    for _ in range(5 * 3600):  # 6 h of 7.00 that really passed: frozen
        second()
    (raised,) = frozen(out)
    assert raised.time == T0 + 7 * HOUR + 6 * HOUR + 1.0 + 1.0


def test_a_step_back_keeps_the_unchanged_run_on_the_time_that_passed() -> None:
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    engine = Engine(PH.rules, ManualClock())
    watch = ClockWatch(engine, wall=wall.now, monotonic=mono.now)
    out: list[Condition] = []
    for i in range(6 * 3600 + 2):
        if i == 3600:
            wall.advance(-3 * 86400.0)  # stepped back by 3 days after an hour of 7.00
        wall.advance(1.0)
        mono.advance(1.0)
        out += watch.check()
        out += engine.tick(wall.now())
        out += engine.process(Sample("ph", wall.now(), 7.0))
    (raised,) = frozen(out)
    assert raised.time == T0 - 3 * 86400.0 + 6 * 3600 + 2.0  # the run began at T0 + 1


def test_frozen_is_an_instrument_alarm_stale_priority_no_incident() -> None:
    config = build_config(
        {"station": {"id": "ps"}, "sensors": [{"id": "ph", "kind": "ph", "frozen_after": "6h"}]}
    )
    assert config.alarms.priority_of("ph", Rule.FROZEN) == config.alarms.priority_of("ph", Rule.STALE)
    from monitor.incidents.transitions import INCIDENT_RULES

    assert Rule.FROZEN not in INCIDENT_RULES and Rule.STALE not in INCIDENT_RULES


def test_a_restart_keeps_the_unchanged_run(tmp_path: Path) -> None:
    first = Engine(PH.rules, ManualClock())
    live(first, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * 1800)])  # 5 h of 7.00
    save_checkpoint(first, tmp_path / "engine.npz")
    second = Engine(PH.rules, ManualClock())
    restore_checkpoint(second, tmp_path / "engine.npz")
    out = live(second, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * 400, start=T0 + 18000.0)])
    (raised,) = frozen(out)
    assert raised.time == T0 + 6 * HOUR + 10.0
    assert second.forget_active("ph", Rule.FROZEN) and not second.forget_active("ph", Rule.FROZEN)


# --- config ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sensor", "message"),
    [
        ({"frozen_after": float("nan")}, "sensors[0].frozen_after:"),
        ({"frozen_after": float("inf")}, "sensors[0].frozen_after:"),
        ({"frozen_after": "-1h"}, "sensors[0].frozen_after:"),
        ({"frozen_after": "0s"}, "sensors[0].frozen_after:"),
        ({"frozen_after": "6h", "frozen_band": -0.1}, "sensors[0].frozen_band:"),
        ({"frozen_after": "6h", "frozen_band": float("nan")}, "sensors[0].frozen_band:"),
        ({"frozen_band": 0.1}, "sensors[0].frozen_band: needs frozen_after"),
    ],
)
def test_bad_frozen_settings_are_refused_naming_the_key(sensor: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"station": {"id": "ps"}, "sensors": [{"id": "ph", "kind": "ph", **sensor}]})
    assert message in str(err.value)


def test_a_meter_has_no_frozen_rule() -> None:
    with pytest.raises(ConfigError) as err:
        build_config(
            {"station": {"id": "ps"}, "sensors": [{"id": "m", "kind": "meter", "frozen_after": "1h"}]}
        )
    assert "sensors[0].frozen_after:" in str(err.value)


def test_check_config_exits_2_naming_a_bad_frozen_after(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text("station: {id: ps-1}\nsensors: [{id: ph, kind: ph, frozen_after: .nan}]\n")
    result = run_monitor("check-config", str(config))
    assert result.returncode == 2, result.stderr
    assert "sensors[0].frozen_after:" in result.stderr and "Traceback" not in result.stderr


# --- replay equals live --------------------------------------------------------------

CONFIG = station(
    {"id": "ph", "kind": "ph", "frozen_after": "10m", "stale_after": "3m"},
    {"id": "temp", "kind": "temperature", "unit": "degC", "frozen_after": "5m", "frozen_band": 0.5},
    {"id": "flow", "kind": "flow", "unit": "gpm", "stale_after": "2m"},
    {"id": "oil", "kind": "concentration", "frozen_after": "90s", "frozen_band": 0.0, "stale_after": "1m"},
)
Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@st.composite
def held_streams(draw: st.DrawFn) -> Stream:
    """Readings that hold a value for a while, flicker within a band, drift, go silent
    for longer than `stale_after`, with bad values and failed polls among them."""
    n = draw(st.integers(1, 600))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = rng.choice(
        [0.0, 1.0, 10.0, 30.0, 60.0, 200.0, 1000.0], size=n, p=[0.05, 0.2, 0.4, 0.2, 0.1, 0.04, 0.01]
    )
    time = T0 + np.cumsum(steps) + draw(st.sampled_from([0.0, 0.5]))
    sensor = rng.choice(4, size=n)
    held = np.cumsum(rng.random(n) < draw(st.floats(0.0, 0.1)))  # the value changes now and then
    base = rng.uniform(5.0, 9.0, held.max() + 1)[held]
    flicker = rng.choice([0.0, 0.0, 0.2, -0.2, 0.45, -0.6], size=n)
    drift = np.cumsum(rng.choice([0.0, 0.1], size=n, p=[0.9, 0.1]))
    value = np.select(
        [sensor == 0, sensor == 1, sensor == 2],
        [np.round(base, 2), np.round(base * 3 + flicker + drift, 2), np.round(base * 10, 1)],
        np.round(base, 1),
    )
    bad = rng.random(n) < 0.03
    value[bad] = rng.choice([np.nan, np.inf, 1e9], size=int(bad.sum()))
    quality = np.where(rng.random(n) < 0.03, 2, 0)
    return sensor, time, value, quality


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=held_streams(), batch=st.integers(1, 400))
def test_replay_equals_live_for_frozen(stream: Stream, batch: int) -> None:
    sensor, time, value, quality = stream
    a = Engine(CONFIG.rules, ManualClock())
    expected = live(a, as_samples(CONFIG, *stream))
    b = Engine(CONFIG.rules, ManualClock())
    got: list[Condition] = []
    for step in replay_steps(b, sensor, time, value, quality, batch_size=batch):
        got += step.conditions
    assert canon(got) == canon(expected)
    for s in a.sensors:
        assert a.status(s) == b.status(s)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=held_streams(), batch=st.integers(1, 400))
def test_time_major_batches_equal_live_for_frozen(stream: Stream, batch: int) -> None:
    """Every sensor once per step (a station's export): the engine's 2-D path."""
    _, t, value, quality = stream
    m = max(1, t.size // 4)
    time = np.repeat(t[:m], 4)
    sensor = np.tile(np.arange(4), m)
    value, quality = value[: m * 4], quality[: m * 4]
    if value.size < m * 4:
        value, quality = np.resize(value, m * 4), np.resize(quality, m * 4)
    value = np.where(sensor == 2, 100.0, value)  # the flow held too, no rule: nothing
    a = Engine(CONFIG.rules, ManualClock())
    expected = live(a, as_samples(CONFIG, sensor, time, value, quality))
    b = Engine(CONFIG.rules, ManualClock())
    got: list[Condition] = []
    for step in replay_steps(b, sensor, time, value, quality, batch_size=batch):
        got += step.conditions
    assert canon(got) == canon(expected)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=held_streams(), cut=st.floats(0, 1), use_replay=st.booleans())
def test_checkpoint_and_restore_give_the_same_frozen_events(
    stream: Stream, cut: float, use_replay: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("ckpt") / "engine.npz"
    whole, cut_up = cut_by_a_checkpoint(CONFIG, stream, cut, use_replay, path)
    assert canon(cut_up) == canon(whole)


def test_a_frozen_alarm_the_journal_holds_after_a_restart_ends_only_on_a_change(tmp_path: Path) -> None:
    """No checkpoint (a crash before the first save): the reconciler's rule for restored
    alarms would end it at the first reading, still 7.00, while the probe is still fouled."""
    from monitor.daemon import Daemon
    from tests.test_pipeline import close

    raw = {
        "station": {"id": "ps-frozen"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [{"id": "ph", "kind": "ph", "frozen_after": "1h", "stale_after": "5m"}],
        "console": {"enabled": False},
        "store": {"free_space_floor": 0},
    }
    config = build_config(raw)
    first = Daemon(config, ManualClock(T0))
    try:
        first.pipeline.process([Sample("ph", T0 + 60.0 * i, 7.0) for i in range(62)])
        assert first.alarms.get("ph", Rule.FROZEN).active  # type: ignore[union-attr]
    finally:
        close(first)
    assert not (tmp_path / "state" / "engine-checkpoint.npz").exists()
    again = Daemon(config, ManualClock(T0 + 3800.0))
    try:
        again.pipeline.process([Sample("ph", T0 + 3800.0 + i, 7.0) for i in range(3)])
        alarm = again.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and alarm.active
        again.pipeline.process([Sample("ph", T0 + 3810.0, 6.9)])
        alarm = again.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 3810.0
    finally:
        close(again)


@pytest.mark.parametrize("seed", range(6))
def test_a_long_batch_with_a_band_finds_every_run_as_live_does(seed: int) -> None:
    """Thousands of readings in one batch: a stuck transmitter with a flickering digit, a
    slow drift (a change every few readings, no jump: the runs are searched) and noise with
    jumps (many runs at once: found in rounds); `frozen_after` short enough that every run's
    exact start decides an alarm."""
    rng = np.random.default_rng(seed)
    n = 20_000
    part = (np.arange(n) // 1000) % 3
    flicker = rng.choice([0.0, 0.02, -0.02], size=n)
    drift = 20.0 + np.cumsum(rng.choice([0.0, 0.01], size=n)) + flicker
    jumps = rng.choice([0.0, 0.03, 0.06, 0.2], size=n, p=[0.3, 0.3, 0.3, 0.1]) * rng.choice([-1.0, 1.0], n)
    value = np.round(np.select([part == 0, part == 1], [21.5 + flicker, drift], 30.0 + jumps), 3)
    config = station(
        {"id": "temp", "kind": "temperature", "unit": "degC", "frozen_after": "30s", "frozen_band": 0.05}
    )
    samples = [Sample("temp", T0 + 5.0 * i, float(v)) for i, v in enumerate(value)]
    expected = frozen(live(Engine(config.rules, ManualClock()), samples))
    batch = Engine(config.rules, ManualClock())
    times = T0 + 5.0 * np.arange(n, dtype=np.float64)
    got = frozen(batch.replay(np.zeros(n, np.int32), times, value).conditions)
    assert len(expected) >= 100 and canon(got) == canon(expected)
    assert [c.message for c in got] == [c.message for c in expected]


def test_a_restored_frozen_alarm_with_its_checkpoint_clears_on_a_change_during_the_downtime(
    tmp_path: Path,
) -> None:
    """The journal and the checkpoint both hold it: the reference is the checkpoint's, so
    the first reading after the restart, changed while the daemon was down, clears it."""
    engine = Engine(PH.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * (6 * 360 + 2))])
    save_checkpoint(engine, tmp_path / "engine.npz")
    again = Engine(PH.rules, ManualClock())
    restore_checkpoint(again, tmp_path / "engine.npz")
    assert again.restore_active("ph", Rule.FROZEN, T0 + 6 * HOUR + 10.0)
    (cleared,) = frozen(live(again, [Sample("ph", T0 + 7 * HOUR, 6.5)]))
    assert cleared.state is CLEARED and cleared.message == "pH reading changed: 6.50 (was 7.00)"
