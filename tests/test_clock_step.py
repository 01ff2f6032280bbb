"""The gateway clock (issue 12, item 5), driven by injected wall and monotonic clocks:
a step back is noticed, raises a diagnostic, and judging goes on (limits within their
on-delay, stale on time); a restart after a step is not blind; a step forward restarts
warm-up without a false alarm."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from monitor.config import Config, build_config, load_config
from monitor.daemon import Daemon
from monitor.engine import ClockWatch, Engine, restore_checkpoint, save_checkpoint
from monitor.engine.clock_step import HOLD
from monitor.model import Condition, ConditionState, ManualClock, Rule, Sample, WallClock, iso
from monitor.reconcile import device_stamped
from monitor.web.service import StationCollector
from monitor.web.station import StationAdapter
from tests.engine_helpers import T0, station
from tests.test_pipeline import close
from tests.test_pipeline import station as pipeline_station

CONFIG = station(
    {"id": "ph", "kind": "ph", "limits": {"on_delay": "10s"}, "stale_after": "60s"},
    {"id": "flow", "kind": "flow", "unit": "gpm", "stale_after": "1h"},
)
DAYS3 = 3 * 86400.0
ACTIVE, CLEARED = ConditionState.ACTIVE, ConditionState.CLEARED


def watched_daemon(config: Config, start: float = T0) -> tuple[Daemon, ManualClock, ManualClock]:
    """The daemon with its clock watch on injected clocks: the wall clock (the daemon's, from
    `start`) and the monotonic one (from 1000 s) that tests set to step the gateway clock."""
    wall, mono = ManualClock(start), ManualClock(1000.0)
    daemon = Daemon(config, wall)
    daemon.watch_clock(ClockWatch(daemon.engine, wall=wall.now, monotonic=mono.now))
    return daemon, wall, mono


def clocks_at(wall: ManualClock, mono: ManualClock, k: float, gateway: float) -> None:
    """`k` s of real time into the test (the monotonic clock at 1000 + k), the gateway's
    wall clock reading `gateway` (T0 + k, or off by the error a step corrects)."""
    wall.set(gateway)
    mono.set(1000.0 + k)


class Gateway:
    """An engine fed the way the daemon feeds it: readings stamped by the wall clock,
    a tick a second, the clock watch before each."""

    def __init__(self, engine: Engine, wall: ManualClock, mono: ManualClock) -> None:
        self.engine, self.wall, self.mono = engine, wall, mono
        self.watch = ClockWatch(engine, wall=wall.now, monotonic=mono.now)
        self.conditions: list[Condition] = []

    def second(self, **readings: float) -> None:
        """One second passes on both clocks; then a tick and the readings."""
        self.wall.advance(1.0)
        self.mono.advance(1.0)
        out = self.watch.check()
        out += self.engine.tick(self.wall.now())
        for sensor, value in readings.items():
            out += self.engine.process(Sample(sensor, self.wall.now(), value))
        self.conditions += out

    def of(self, rule: Rule) -> list[Condition]:
        return [c for c in self.conditions if c.rule is rule]


def gateway(start: float = T0) -> Gateway:
    return Gateway(Engine(CONFIG.rules, ManualClock()), ManualClock(start), ManualClock(1000.0))


def test_after_a_step_back_a_ph_excursion_still_alarms_within_its_on_delay_and_stale_still_works() -> None:
    gw = gateway()
    for _ in range(3600):
        gw.second(ph=7.0, flow=100.0)
    gw.wall.advance(-DAYS3)  # NTP steps the gateway clock back by 3 days
    for _ in range(20):
        gw.second(ph=12.5, flow=100.0)
    (clock,) = gw.of(Rule.CLOCK)
    assert clock.state is ACTIVE and clock.sensor == "gateway"
    assert clock.message == "gateway clock stepped back by 3d 0h 0m"
    step_at = T0 + 3600 - DAYS3
    (high,) = gw.of(Rule.HIGH)
    assert high.state is ACTIVE and high.time == step_at + 11.0  # 10 s on-delay, judged on
    assert gw.engine.counters.out_of_order == 0
    status = gw.engine.status("ph")
    assert status.value == 12.5 and status.time == gw.wall.now()
    # pH stops reporting: stale after 60 s, measured on the monotonic clock.
    for _ in range(62):
        gw.second(flow=100.0)
    (stale,) = [c for c in gw.of(Rule.STALE) if c.sensor == "ph"]
    assert stale.state is ACTIVE and stale.time == step_at + 20.0 + 61.0


def test_a_stale_alarm_across_a_step_back_clears_on_the_stepped_clock() -> None:
    """The late-reading rule stamps a stale clear at the later of the reading and the last
    tick: across a step back that tick is re-based with the readings, so the clear is the
    reading's own (new) time, not the clock before the step, an hour in the future."""
    gw = gateway()
    for _ in range(600):
        gw.second(ph=7.0, flow=100.0)
    for _ in range(62):  # pH stops reporting: stale after 60 s
        gw.second(flow=100.0)
    (raised,) = [c for c in gw.of(Rule.STALE) if c.sensor == "ph"]
    assert raised.state is ACTIVE
    gw.wall.advance(-3600.0)  # NTP steps the gateway clock back by an hour
    gw.second(flow=100.0)
    gw.second(ph=7.0, flow=100.0)
    cleared = [c for c in gw.of(Rule.STALE) if c.sensor == "ph" and c.state is CLEARED]
    assert [c.time for c in cleared] == [gw.wall.now()]
    assert [c.sensor for c in gw.of(Rule.CLOCK)] == ["gateway"]


def test_without_the_watch_every_reading_after_a_step_back_is_dropped() -> None:
    """The failure this fixes, so the test above can fail."""
    engine = Engine(CONFIG.rules, ManualClock())
    for i in range(60):
        engine.process(Sample("ph", T0 + i, 7.0))
    for i in range(20):
        assert engine.process(Sample("ph", T0 + 60 + i - DAYS3, 12.5)) == []
    assert engine.counters.out_of_order == 20


def test_the_clock_diagnostic_clears_after_a_steady_clock() -> None:
    gw = gateway()
    gw.second(ph=7.0)
    gw.wall.advance(-600.0)
    for _ in range(301):
        gw.second(ph=7.0)
    assert [c.state for c in gw.of(Rule.CLOCK)] == [ACTIVE, CLEARED]
    assert gw.of(Rule.CLOCK)[0].message == "gateway clock stepped back by 10m"


def test_a_restart_after_a_step_back_is_not_blind(tmp_path: Path) -> None:
    gw = gateway()
    for _ in range(600):
        gw.second(ph=7.0, flow=100.0)
    save_checkpoint(gw.engine, tmp_path / "cp.npz")
    # The daemon restarts while the clock has been stepped back by 3 days.
    engine = Engine(CONFIG.rules, ManualClock())
    restore_checkpoint(engine, tmp_path / "cp.npz", restart_watch=True)
    mean = engine.baseline_mean("flow")
    again = Gateway(engine, ManualClock(gw.wall.now() - DAYS3), ManualClock(5.0))
    for _ in range(20):
        again.second(ph=12.5, flow=100.0)
    (clock,) = again.of(Rule.CLOCK)
    assert "stepped back by 3d 0h 0m at least (while the daemon was stopped)" in clock.message
    assert [c.state for c in again.of(Rule.HIGH)] == [ACTIVE]
    assert engine.counters.out_of_order == 0
    assert engine.baseline_mean("flow") == mean  # the baseline came through the step


def test_a_restart_on_an_unset_clock_keeps_the_baseline_once_ntp_sets_it(tmp_path: Path) -> None:
    """A gateway without a battery-backed clock restarts (a minute's reboot) on a clock a year
    behind, before NTP answers, with a warm 25 h checkpoint: its history is "from the future",
    moved back a year (`check_restored`: judging goes on, the pH limit judges). Two minutes
    later NTP steps the clock forward the year. Before, the history stayed a year back: the
    next flow reading was a year after it, the baseline warmed up again and the slug rule was
    blind for 19.8 h more (measured). The step that sets the clock moves the history forward
    by the start's move: the baseline goes on, the gap is the reboot's."""
    gw = gateway()
    for _ in range(25 * 60):  # 25 hours of flow, a reading a minute: the baseline warm
        gw.wall.advance(59.0)
        gw.mono.advance(59.0)
        gw.second(ph=7.0, flow=100.0)
    assert not gw.engine.warming_up("flow")
    save_checkpoint(gw.engine, tmp_path / "cp.npz")
    engine = Engine(CONFIG.rules, ManualClock())
    restore_checkpoint(engine, tmp_path / "cp.npz", restart_watch=True)
    year = 365 * 86400.0
    again = Gateway(engine, ManualClock(gw.wall.now() + 60 - year), ManualClock(5.0))
    for _ in range(120):
        again.second(ph=7.0, flow=100.0)
    again.wall.advance(year)  # NTP
    for _ in range(60):
        again.second(ph=7.0, flow=100.0)
    assert not engine.warming_up("flow") and engine.baseline_mean("flow") == 100.0
    assert engine.counters.out_of_order == 0
    assert [c.message for c in again.of(Rule.CLOCK) if c.state is ACTIVE] == [
        "gateway clock stepped back by 364d 23h 59m at least (while the daemon was stopped)",
        "gateway clock stepped forward by 365d 0h 0m",
    ]


def test_a_step_forward_by_days_restarts_warm_up_without_a_false_alarm() -> None:
    gw = gateway()
    for _ in range(600):
        gw.second(ph=7.0, flow=100.0)
    gw.wall.advance(2 * 86400.0)
    for _ in range(120):
        gw.second(ph=7.0, flow=100.0)
    assert [c.rule for c in gw.conditions] == [Rule.CLOCK]
    assert gw.conditions[0].message == "gateway clock stepped forward by 2d 0h 0m"
    assert gw.engine.warming_up("flow")


CASES = Path(__file__).resolve().parent / "cases" / "clock"


def run_clock_case(case: Path) -> list[dict[str, object]]:
    """Feed a case the way the daemon does: per wall second, the watch, a tick, the readings."""
    config = load_config(case / "config.yaml")
    engine = Engine(config.rules, ManualClock())
    wall, mono = ManualClock(), ManualClock()
    with (case / "input.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    watch = None
    out: list[Condition] = []
    for (w, m), group in itertools.groupby(rows, key=lambda r: (float(r["wall"]), float(r["monotonic"]))):
        wall.set(w)
        mono.set(m)
        if watch is None:
            watch = ClockWatch(engine, wall=wall.now, monotonic=mono.now)
        out += watch.check()
        out += engine.tick(w)
        for r in group:
            out += engine.process(Sample(r["sensor"], w, float(r["value"])))
    return [c.to_json() | {"message": c.message} for c in out]


@pytest.mark.parametrize("case", sorted(CASES.iterdir()), ids=lambda p: p.name)
def test_golden_clock_case(case: Path) -> None:
    expected = [json.loads(line) for line in (case / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    assert run_clock_case(case) == expected


if __name__ == "__main__":  # regenerate a case's events.jsonl after a reviewed change
    for line in run_clock_case(Path(sys.argv[1])):
        print(json.dumps(line, ensure_ascii=False))


def test_a_clock_alarm_restored_as_active_clears_after_a_steady_clock() -> None:
    engine = Engine(CONFIG.rules, ManualClock())
    assert ClockWatch.for_clock(engine, ManualClock()) is None  # only the real clock is watched
    watch = ClockWatch.for_clock(engine, WallClock(), active=[("gateway", Rule.CLOCK)])
    assert watch is not None
    # From here on the watch reads clocks the test moves (monotonic from where it started).
    wall, mono = ManualClock(T0), ManualClock(watch._mono0)
    watch.wall, watch.monotonic, watch._wall0 = wall.now, mono.now, T0
    assert watch.check() == []
    # Not before HOLD of a steady clock; then it clears. (Whole seconds either side: the
    # monotonic origin is any float, so `(m + HOLD) - m` need not be exactly HOLD.)
    wall.advance(HOLD - 1)
    mono.advance(HOLD - 1)
    assert watch.check() == []
    wall.advance(2)
    mono.advance(2)
    assert [c.state for c in watch.check()] == [CLEARED]


def test_a_quick_restart_with_a_device_clock_ahead_is_no_clock_step(tmp_path: Path) -> None:
    """MQTT payload times come from the device's clock, accepted up to mqtt.max_skew
    (300 s) ahead of the gateway's. A restart within that lead saw readings "from the
    future" and raised a false "gateway clock stepped back" alarm, moving every sensor's
    history back. The gateway's own clock is its last tick: that is what is compared."""
    config = station(
        {"id": "ph", "kind": "ph", "stale_after": "1h"},
        {"id": "mq", "kind": "flow", "unit": "gpm", "stale_after": "1h"},
    )
    gw = Gateway(Engine(config.rules, ManualClock()), ManualClock(T0), ManualClock(1000.0))
    for _ in range(120):
        gw.second(ph=7.0)
        gw.conditions += gw.engine.process(Sample("mq", gw.wall.now() + 60.0, 100.0))  # 60 s fast
    save_checkpoint(gw.engine, tmp_path / "cp.npz")
    engine = Engine(config.rules, ManualClock())
    restore_checkpoint(engine, tmp_path / "cp.npz", restart_watch=True)
    again = Gateway(engine, ManualClock(gw.wall.now() + 5.0), ManualClock(5.0))  # back 5 s later
    for _ in range(3):
        again.second(ph=7.0)
        again.conditions += engine.process(Sample("mq", again.wall.now() + 60.0, 100.0))
    assert again.of(Rule.CLOCK) == []
    assert engine.counters.out_of_order == 0


def test_a_limit_alarm_across_a_step_back_while_running_ends_on_the_new_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The decision of docs/alarms.md ("The gateway clock steps back while the daemon runs"),
    through the daemon's pipeline and journal with the watch on injected clocks: pH 11 from
    +0 s raises the high alarm at +0 s; at +65 s the clock steps back an hour. The re-based
    engine judges the readings on the new clock: pH 7 from -3530 s ends the alarm after its
    30 s off-delay, at -3500 s (35 s of real time after the step), not at the first reading
    and not an hour later when the new clock passes the activation; the clear, stamped before
    the activation, is journaled at it and counted as an early clear. A new excursion at
    -3400 s is raised on the new clock."""
    config = build_config(
        {
            "station": {"id": "ps-step"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "ph", "kind": "ph", "limits": {"on_delay": "0s", "off_delay": "30s"}}],
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )
    daemon, wall, mono = watched_daemon(config)
    try:
        for k in range(0, 61, 10):
            clocks_at(wall, mono, k, T0 + k)
            daemon.pipeline.process([Sample("ph", T0 + k, 11.0)])
        wall.set(T0 + 65 - 3600)  # NTP steps the gateway clock back by an hour
        mono.set(1000.0 + 65)
        with caplog.at_level(logging.WARNING, logger="monitor.alarms.manager"):
            for k in range(70, 201, 10):
                clocks_at(wall, mono, k, T0 + k - 3600)
                daemon.pipeline.process([Sample("ph", T0 + k - 3600, 7.0 if k < 200 else 11.0)])
        assert f"ph/high: clear stamped {iso(T0 - 3500)}, before its activation at {iso(T0)}" in caplog.text
        entries = daemon.alarms.journal.entries(sensor="ph")
        assert [(e.event, e.time - T0) for e in entries if e.rule is Rule.HIGH] == [
            ("activated", 0.0),
            ("cleared", 0.0),  # stamped -3500 s on the new clock: journaled at the activation
            ("activated", -3400.0),
        ]
        assert daemon.alarms.early_clears == 1
        (step,) = [e for e in daemon.alarms.journal.entries(sensor="gateway") if e.event == "activated"]
        assert step.rule is Rule.CLOCK
    finally:
        close(daemon)


def test_the_wet_well_and_derived_sensors_are_judged_on_after_a_step_back_while_running(
    tmp_path: Path,
) -> None:
    """A pumping station, its clock stepped back an hour while the daemon runs. Before, the
    station's tracker and the derived sensors kept the old clock's times: every pump, level
    and switch reading stamped on the new clock was "older" and ignored for the whole hour
    (the level at 9.5 ft raised neither high level nor overflow) and the derived inflow made
    nothing. Now they move with the engine: p1 runs from +0 s, the clock steps back at
    +65 s, the level reaches 9.5 ft at -3530 s: high level and overflow raised then; p1
    stops at -3500 s: its run lasted the 100 s that passed (one record, moved to start at
    -3600 s), and with the well above lead_on and no pump running fail to start is raised
    after its 2 min, at -3380 s; the derived inflow goes on, one a poll."""
    config = build_config(
        {
            "station": {"id": "ps-step-well", "timezone": "UTC"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft",
                 "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                {"id": "rise", "kind": "derived", "unit": "gpm", "expression": "area * rate(lvl, 60s)",
                 "constants": {"area": "80 ft2"}},
            ],
            "wet_well": {"level": "lvl", "pumps": ["p1"], "fail_to_start_delay": "2m"},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip
    daemon, wall, mono = watched_daemon(config)

    def poll(k: int, pump: float, level: float) -> None:
        """A poll `k` s of real time after the start; the clock an hour back from +65 s."""
        t = T0 + k - (3600 if k > 65 else 0)
        clocks_at(wall, mono, k, t)
        daemon.pipeline.process([Sample("p1", t, pump), Sample("lvl", t, level)])

    try:
        for k in range(0, 61, 10):
            poll(k, 1.0, 4.0)
        for k in range(70, 300, 10):
            poll(k, 1.0 if k < 100 else 0.0, 4.0 if k < 70 else 9.5)
        journal = [(e.rule, e.event, e.time - T0) for e in daemon.alarms.journal.entries(sensor="lvl")]
        assert sorted(journal, key=lambda x: (x[2], x[0])) == [
            (Rule.HIGH_LEVEL, "activated", -3530.0),
            (Rule.OVERFLOW, "activated", -3530.0),
            (Rule.FAIL_TO_START, "activated", -3380.0),
        ]
        store = daemon.station.store
        assert store is not None
        runs = [(r.start - T0, None if r.end is None else r.end - T0) for r in store.runs(0, 2 * T0)]
        assert runs == [(-3600.0, -3500.0)]
        (overflow,) = store.open_overflows()
        assert overflow.start == T0 - 3530
        # On the new clock: +60 s's pending one re-based to -3540 s, then one a poll.
        derived = [s.time - T0 for s in daemon.sink.store.query("rise") if s.time < T0]
        assert derived == [float(k) for k in range(-3540, -3319, 10)]
    finally:
        close(daemon)


def step_station(tmp_path: Path) -> Config:
    """A wet well with a weir, one pump with duty limits, a derived rise, a pH probe."""
    return build_config(
        {
            "station": {"id": "ps-step-station", "timezone": "UTC"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft",
                 "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                {"id": "p1", "kind": "pump",
                 "pump": {"capacity": "500 gpm", "max_starts_per_hour": 3, "max_run": "5m"}},
                {"id": "rise", "kind": "derived", "unit": "gpm", "expression": "area * rate(lvl, 60s)",
                 "constants": {"area": "80 ft2"}},
                {"id": "ph", "kind": "ph", "limits": {"on_delay": "0s", "off_delay": "30s"}},
            ],
            "wet_well": {"level": "lvl", "pumps": ["p1"], "fail_to_start_delay": "2m",
                         "weir": {"length": "24 in", "coefficient": 3.33}},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip


class Stepped:
    """The daemon with the watch on injected clocks; the gateway clock steps by `step` s
    after +65 s of real time."""

    def __init__(self, tmp_path: Path, step: float) -> None:
        self.step = step
        self.daemon, self.wall, self.mono = watched_daemon(step_station(tmp_path))

    def at(self, k: float) -> float:
        """The gateway clock's time `k` s of real time after the start."""
        return T0 + k + (self.step if k > 65 else 0.0)

    def poll(self, k: float, **readings: float) -> None:
        t = self.at(k)
        clocks_at(self.wall, self.mono, k, t)
        self.daemon.pipeline.process([Sample(sensor, t, v) for sensor, v in readings.items()])

    def journal(self, sensor: str) -> list[tuple[Rule, str, float]]:
        """(rule, event, seconds of real time after the start) of `sensor`'s journal."""
        entries = self.daemon.alarms.journal.entries(sensor=sensor)
        return [(e.rule, e.event, self.real(e.time)) for e in entries]

    def real(self, t: float) -> float:
        """Seconds of real time after the start at the gateway clock's `t` (these tests
        stay within the step's length of it)."""
        x = t - T0
        new_clock = x > 65 if self.step > 0 else x < 0
        return x - self.step if new_clock else x


def test_a_step_forward_while_running_does_not_stretch_a_pump_run_or_forget_its_starts(
    tmp_path: Path,
) -> None:
    """The clock steps forward an hour at +65 s. p1 starts at +10, +40 and +60 s, runs
    across the step and stops at +80 s, starts again at +90 s: the fourth start in 80 s
    raises pump_starts (max 3 an hour) at +90 s, and no long_run (max_run 5 min): the run
    across the step lasted the 20 s that passed. Before: the run was 3,620 s long (long_run
    raised at +70 s) and the starts before the step were an hour old after it (no
    pump_starts)."""
    gw = Stepped(tmp_path, 3600.0)
    try:
        state = {0: 0.0, 10: 1.0, 20: 0.0, 40: 1.0, 50: 0.0, 60: 1.0, 70: 1.0, 80: 0.0, 90: 1.0, 100: 1.0}
        for k, on in state.items():
            gw.poll(k, p1=on, lvl=4.0)
        assert gw.journal("p1") == [(Rule.PUMP_STARTS, "activated", 90.0)]
        store = gw.daemon.station.store
        assert store is not None
        runs = [(r.start - T0, None if r.end is None else r.end - T0) for r in store.runs(0, 2 * T0)]
        # The runs of the hour moved with the step, as the tracker's starts did (a restart
        # takes its starts per hour from them), the open one too.
        assert runs == [(3610.0, 3620.0), (3640.0, 3650.0), (3660.0, 3680.0), (3690.0, None)]
    finally:
        close(gw.daemon)


def test_a_step_forward_while_running_does_not_stretch_a_delay_or_an_overflow(tmp_path: Path) -> None:
    """The well above lead_on from +0 s with p1 off, at the weir's crest +0.5 ft from +30 s;
    the clock steps forward an hour at +65 s. fail_to_start is raised after its 2 min of real
    time, at +120 s, and the overflow's volume is the weir's flow for the 170 s that passed
    by +200 s; the open record starts at +30 s moved by the step. The derived rise of the
    level spans the time that passed. Before: fail_to_start was raised at +70 s (3,670 s
    "above lead_on"), the volume counted the hour that did not pass (22 times too much)
    and the rise read 0 from the first poll after the step (its window lost the level)."""
    gw = Stepped(tmp_path, 3600.0)
    try:
        for k in range(0, 201, 10):
            gw.poll(k, p1=0.0, lvl=6.0 if k < 30 else 9.5)
        assert gw.journal("lvl") == [
            (Rule.HIGH_LEVEL, "activated", 30.0),
            (Rule.OVERFLOW, "activated", 30.0),
            (Rule.FAIL_TO_START, "activated", 120.0),
        ]
        tracker = gw.daemon.station.tracker
        assert tracker is not None and tracker.overflow is not None
        q = 3.33 * 2.0 * 0.5**1.5 * 448.831169  # gpm over the weir at 0.5 ft of head
        assert tracker.overflow.start == T0 + 3630
        assert tracker.overflow.volume_gal == pytest.approx(q * 170 / 60, rel=1e-6)
        # The level's rise over the last 60 s of real time, a poll late: the +60 s one made
        # after the step, on the new clock; as without a step.
        rise = [(s.time - T0, round(s.value, 2)) for s in gw.daemon.sink.store.query("rise")]
        assert rise[:8] == [(10.0, 0.0), (20.0, 0.0), (30.0, 4189.09), (40.0, 3141.82), (50.0, 2513.45),
                            (3660.0, 2094.55), (3670.0, 2094.55), (3680.0, 2094.55)]  # fmt: skip
        assert rise[8:] == [(3600.0 + k, 0.0) for k in range(90, 191, 10)]
    finally:
        close(gw.daemon)


def test_readings_stamped_before_a_step_back_and_judged_after_it_move_onto_the_new_clock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The clock steps back an hour at +65 s; the poll of +60 s (stamped on the old clock,
    pH 7, p1 running, the level 4 ft) waits in the queue and is judged after the re-base,
    which the timer tick noticed first. It is moved onto the new clock by the step (to
    -3540 s, the time it was taken on the clock that is right), stored and judged there, and
    counted and logged once. The polls of the new clock go on being judged: pH 11 from
    -3530 s raises the high alarm at once, the level at 9.5 ft raises the overflow, p1's run
    goes on. Before: the +60 s poll was judged at +60 s after a history moved to -3540 s, and
    every reading of those sensors on the new clock was dropped as out of order for the
    hour (no high pH, no overflow)."""
    gw = Stepped(tmp_path, -3600.0)
    daemon = gw.daemon
    try:
        for k in range(0, 51, 10):
            gw.poll(k, ph=7.0, p1=1.0, lvl=4.0)
        gw.wall.set(gw.at(70))  # NTP steps the clock back; the tick notices it first
        gw.mono.set(1000.0 + 70)
        daemon.tick()
        with caplog.at_level(logging.WARNING, logger="monitor.engine.clock_step"):
            daemon.pipeline.process([Sample("ph", T0 + 60, 7.0), Sample("p1", T0 + 60, 1.0)])
            daemon.pipeline.process([Sample("lvl", T0 + 60, 4.0)])
            for k in range(70, 101, 10):
                gw.poll(k, ph=11.0, p1=1.0, lvl=9.5)
        assert daemon.engine.counters.out_of_order == 0
        stored = sorted(s.time - T0 for s in daemon.sink.store.query("ph"))
        assert stored == [-3540.0, -3530.0, -3520.0, -3510.0, -3500.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
        assert gw.journal("ph") == [(Rule.HIGH, "activated", 70.0)]
        assert (Rule.OVERFLOW, "activated", 70.0) in gw.journal("lvl")
        store = daemon.station.store
        assert store is not None and [r.start - T0 for r in store.open_runs()] == [-3600.0]
        assert daemon.pipeline.stats.restamped == 3
        assert daemon.health().to_json()["pipeline"]["restamped"] == 3  # type: ignore[index]
        registry = CollectorRegistry()
        registry.register(StationCollector(StationAdapter(daemon)))  # what /metrics serves
        assert b'station_monitor_clock_restamped_total{station="ps-step-station"} 3.0' in generate_latest(
            registry
        )
        (line,) = [r.getMessage() for r in caplog.records if "stamped before" in r.getMessage()]
        assert line.startswith(f"ph at {iso(T0 + 60)} was stamped before the gateway clock stepped back")
        assert f"moved by -1h 0m to {iso(T0 - 3540)}" in line
        latest = daemon.pipeline.latest["ph"]  # the console's reading: the new clock's
        assert (latest.time, latest.value) == (T0 - 3500, 11.0)
    finally:
        close(daemon)


def test_a_reading_stamped_before_a_step_forward_and_judged_after_it_moves_with_the_station(
    tmp_path: Path,
) -> None:
    """The clock steps forward an hour at +65 s; p1 runs from +40 s and its "off" of +60 s
    waits in the queue until after the tick noticed the step. The station moved forward
    with the step (its run from +40 s now starts at +3640 s): the reading is moved by the
    step too, to +3660 s, and ends the run there: 20 s, stored at +3660 s. Before: the
    tracker took it for older than the run's start and dropped it, uncounted, while the
    engine stored and judged it at +60 s; the run ended at the next poll (+3670 s, 30 s)."""
    gw = Stepped(tmp_path, 3600.0)
    daemon = gw.daemon
    try:
        for k in (0, 10, 20, 30, 40, 50):
            gw.poll(k, p1=1.0 if k >= 40 else 0.0, lvl=4.0)
        clocks_at(gw.wall, gw.mono, 70, gw.at(70))
        daemon.tick()
        daemon.pipeline.process([Sample("p1", T0 + 60, 0.0)])
        gw.poll(70, p1=0.0, lvl=4.0)
        store = daemon.station.store
        assert store is not None
        runs = [(r.start - T0, None if r.end is None else r.end - T0) for r in store.runs(0, 2 * T0)]
        assert runs == [(3640.0, 3660.0)]
        assert sorted(s.time - T0 for s in daemon.sink.store.query("p1"))[-2:] == [3660.0, 3670.0]
        assert daemon.pipeline.stats.restamped == 1
    finally:
        close(daemon)


def test_which_readings_are_taken_for_the_old_clock_after_a_step_back() -> None:
    """Stamped ahead of the new clock by more than the tolerance: the old clock's, moved by
    the step. A sensor stamped by its device's own clock (`flow` here) is left alone,
    however far ahead. Once the new clock has passed the old one's last stamp nothing is
    moved."""
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    watch = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=wall.now, monotonic=mono.now)
    watch.device = frozenset({"flow"})
    assert watch.check() == []
    wall.set(T0 + 5 - 600)  # stepped back 10 min within 5 s
    mono.advance(5)
    assert [c.rule for c in watch.check()] == [Rule.CLOCK]
    now = wall.now()
    items = [Sample("ph", now + 1, 7.0), Sample("ph", now + 30, 7.0), Sample("flow", T0 + 4, 1.0),
             Sample("ph", T0 + 4, 7.0), Sample("ph", T0 + 600, 7.0)]  # fmt: skip
    moved, count = watch.restamp(items)
    assert [s.time for s in moved] == [now + 1, now + 30 - 600, T0 + 4, T0 + 4 - 600, T0 + 600]
    assert count == 2
    wall.set(T0 + 5 + 1)  # ten minutes of real time later the new clock passed every old stamp
    assert watch.restamp([Sample("ph", T0 + 4, 7.0)]) == ([Sample("ph", T0 + 4, 7.0)], 0)


PH_FIELD: dict[str, Any] = {
    "sensor": "ph",
    "register": "holding",
    "address": 0,
    "type": "UINT16",
    "scale": 0.01,
}
# the plant's temperature devices, stamping each reading with their own clock (`time_path`)
PLANT_TEMP: dict[str, Any] = {
    "topic": "plant/+/temp",
    "sensor": "plant.{1}",
    "format": "json",
    "value_path": "v",
    "time_path": "t",
}


def two_clock_station(
    tmp_path: Path,
    station: dict[str, Any],
    sensors: list[dict[str, Any]],
    polled: list[dict[str, Any]],
    subscriptions: list[dict[str, Any]],
    **sections: Any,
) -> Config:
    """A station on two clocks: the PLC `plc` polled over Modbus for `polled` (the gateway's
    clock, the one that steps) and MQTT `subscriptions` (a device's own time where they
    give a `time_path`); console off, no free-space floor. `sections`: a wet well."""
    return build_config(
        {
            "station": station,
            "state_dir": str(tmp_path / "state"),
            "sensors": sensors,
            **sections,
            "modbus": {"devices": [{"name": "plc", "host": "127.0.0.1", "port": 5020, "fields": polled}]},
            "mqtt": {"subscriptions": subscriptions},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )


def device_station(tmp_path: Path) -> Config:
    """pH polled over Modbus (stamped by the gateway clock) and an effluent temperature
    over MQTT that takes its time from the payload (stamped by the device's own clock)."""
    return two_clock_station(
        tmp_path,
        {"id": "ps-device-clock"},
        [
            {"id": "ph", "kind": "ph", "limits": {"on_delay": "0s"}},
            {"id": "plant.temp", "kind": "temperature", "unit": "degC",
             "limits": {"on_delay": "5m", "off_delay": "0s"}, "stale_after": "1h"},
        ],
        polled=[PH_FIELD],
        subscriptions=[PLANT_TEMP],
    )  # fmt: skip


def test_a_step_back_leaves_the_history_of_a_sensor_stamped_by_its_own_device_where_it_is(
    tmp_path: Path,
) -> None:
    """An NTP correction at boot: the gateway's RTC ran 3 h ahead; the MQTT device stamps
    its readings with its own, correct clock. The effluent temperature is over 65 °C for
    90 s (T0+30 .. T0+110), short of its 5 min on-delay: no alarm is due. At +65 s the
    gateway clock is stepped back to true time; the +60 s poll (pH, the gateway's clock)
    and the device's +60 s reading arrive in one batch after the step. Before: the step
    moved every sensor's history back 3 h, the temperature's too, whose stamps were never
    wrong: its excursion looked 3 h old at the next reading and a false high temperature
    alarm (§139-15 D(1)) was raised at once. Now only the gateway-stamped history moves;
    the pH poll is moved onto the new clock, the device's reading is not."""
    config = device_station(tmp_path)
    ahead = 3 * 3600.0
    daemon, wall, mono = watched_daemon(config, T0 + ahead)

    def at(k: float, *items: Sample) -> None:
        clocks_at(wall, mono, k, T0 + k + (ahead if k < 65 else 0.0))
        daemon.pipeline.process(list(items))

    def temp(k: float) -> Sample:
        return Sample("plant.temp", T0 + k, 70.0 if 30 <= k <= 110 else 40.0)

    try:
        for k in range(0, 51, 10):
            at(k, Sample("ph", T0 + ahead + k, 7.0), temp(k))
        at(70, Sample("ph", T0 + ahead + 60, 7.0), temp(60))  # queued across the step
        for k in range(70, 401, 10):
            at(k, Sample("ph", T0 + k, 7.0), temp(k))
        assert [(e.rule, e.event) for e in daemon.alarms.journal.entries(sensor="plant.temp")] == []
        assert daemon.engine.counters.out_of_order == 0
        assert [s.time - T0 for s in daemon.sink.store.query("plant.temp")] == [
            float(k) for k in range(0, 401, 10)
        ]
        ph = sorted(s.time - T0 for s in daemon.sink.store.query("ph"))
        assert ph == [*range(60, 401, 10), *(ahead + k for k in range(0, 51, 10))]
        assert daemon.pipeline.stats.restamped == 1
    finally:
        close(daemon)


def test_a_step_forward_leaves_a_device_stamped_backlog_reading_at_its_stamp(tmp_path: Path) -> None:
    """The gateway's RTC ran an hour behind; NTP steps it forward at +65 s. The broker then
    delivers a reading the device stamped (with its correct clock) 4200 s before the step,
    queued while the daemon was away, with the +60 s pH poll of the old clock. The poll is
    moved forward by the step; the device's reading is not (before, it fell within one step
    of the old clock and was moved an hour later, to a time it was not taken)."""
    config = device_station(tmp_path)
    daemon, wall, mono = watched_daemon(config, T0 - 3600.0)
    try:
        for k in range(0, 51, 10):
            clocks_at(wall, mono, k, T0 - 3600.0 + k)
            daemon.pipeline.process([Sample("ph", T0 - 3600.0 + k, 7.0)])
        clocks_at(wall, mono, 70, T0 + 70)
        daemon.pipeline.process(
            [Sample("ph", T0 - 3600.0 + 60, 7.0), Sample("plant.temp", T0 - 4200.0, 40.0)]
        )
        assert [s.time - T0 for s in daemon.sink.store.query("plant.temp")] == [-4200.0]
        assert sorted(s.time - T0 for s in daemon.sink.store.query("ph"))[-1] == 60.0
        assert daemon.pipeline.stats.restamped == 1
    finally:
        close(daemon)


def test_a_poll_queued_across_a_step_back_shorter_than_max_skew_is_moved(tmp_path: Path) -> None:
    """A station with a device-stamped MQTT sensor (so `mqtt.max_skew`, 300 s, applies to
    those readings); the gateway clock steps back 2 min at +65 s; the +60 s pH poll (the
    gateway's clock) is judged after the step. It is moved onto the new clock, and pH 11
    from the next poll raises the high alarm at once. Before: the window for readings of
    the old clock started 2 s + max_skew ahead of the new clock, so a step shorter than
    max_skew moved nothing: the poll put pH back on the old clock, every pH reading of
    the next 2 min was dropped as out of order and pH 11 raised nothing until then."""
    config = device_station(tmp_path)
    daemon, wall, mono = watched_daemon(config)
    try:
        for k in range(0, 51, 10):
            clocks_at(wall, mono, k, T0 + k)
            daemon.pipeline.process([Sample("ph", T0 + k, 7.0)])
        for k in range(70, 131, 10):
            clocks_at(wall, mono, k, T0 + k - 120)
            queued = [Sample("ph", T0 + 60, 7.0)] if k == 70 else []
            daemon.pipeline.process([*queued, Sample("ph", T0 + k - 120, 11.0)])
        assert daemon.engine.counters.out_of_order == 0
        assert [(e.rule, e.event, e.time - T0) for e in daemon.alarms.journal.entries(sensor="ph")] == [
            (Rule.HIGH, "activated", -50.0)
        ]
        assert daemon.pipeline.stats.restamped == 1
    finally:
        close(daemon)


def test_a_batch_the_full_disk_held_across_a_step_back_is_moved_onto_the_new_clock(tiny_disk: Path) -> None:
    """The state disk fills (a real 3 MB tmpfs) and a batch of pH polls waits, prepared
    on the old clock; NTP steps the clock back an hour meanwhile (the timer tick notices);
    the disk is freed. The held batch is moved onto the new clock by the step before it is
    stored and judged, as a batch still in the queue would be, and pH 11 on the new clock
    raises the high alarm. Before: it was stored and judged at its old stamps, an hour
    after the re-based history, and every pH reading of the next hour was dropped as out
    of order (pH 11 raised nothing)."""
    daemon, wall, mono = watched_daemon(pipeline_station(tiny_disk / "state"))
    try:
        st = os.statvfs(tiny_disk)
        ballast = tiny_disk / "ballast"
        ballast.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (64 << 10)))
        n = 0
        while daemon.pipeline.stats.stalled is None:  # until the disk refuses
            wall.set(T0 + n + 1)
            mono.set(1000.0 + n + 1)
            daemon.pipeline.emit([Sample("outfall.ph", T0 + n + k / 1000, 7.0) for k in range(500)])
            daemon.pipeline.process_queued()
            n += 1
            assert n < 1000, "the disk never filled"
        wall.set(T0 + n + 1 - 3600)  # NTP steps the clock back an hour; the tick notices
        mono.set(1000.0 + n + 1)
        daemon.tick()
        ballast.unlink()
        daemon.pipeline._retry_at = 0.0  # the retry timer's wait, skipped (a monotonic deadline)
        assert daemon.pipeline.process_queued() is True
        assert daemon.pipeline.stats.restamped == 500
        for k in range(2, 6):
            wall.set(T0 + n + k - 3600)
            mono.set(1000.0 + n + k)
            daemon.pipeline.process([Sample("outfall.ph", T0 + n + k - 3600, 11.0)])
        assert daemon.engine.counters.out_of_order == 0
        high = [e for e in daemon.alarms.journal.entries(sensor="outfall.ph") if e.rule is Rule.HIGH]
        assert [e.event for e in high] == ["activated"]
        stored = daemon.sink.store.query("outfall.ph")
        assert max(s.time for s in stored) == T0 + n - 2 + 0.499  # the last batch stored before the stall
        assert sum(1 for s in stored if T0 + n - 1 - 3600 <= s.time < T0 + n - 3600) == 500
    finally:
        close(daemon)


def test_starts_per_hour_restored_after_a_step_back_counts_the_starts_of_the_hour_that_passed(
    tmp_path: Path,
) -> None:
    """p1 starts at +10, +30 and +50 s (three in the hour: max_starts_per_hour 3, no
    alarm); the clock steps back an hour at +65 s; the daemon restarts (a crash) and p1
    starts again at +3700 s of real time, more than an hour after the first three: one
    start in the hour, no alarm. Before: the station store kept the three runs at their
    old-clock stamps (+10..+50 s, on the new clock 40-90 s before +3700 s of real time),
    the restarted tracker took them as starts of the last hour and a false `pump_starts`
    was raised at the fourth."""
    gw = Stepped(tmp_path, -3600.0)
    for k in range(0, 61, 10):
        gw.poll(k, p1=1.0 if k in (10, 30, 50) else 0.0, lvl=4.0)
    gw.poll(70, p1=0.0, lvl=4.0)  # on the new clock
    assert gw.journal("p1") == []
    close(gw.daemon)  # a crash: no shutdown
    again = Daemon(step_station(tmp_path), gw.wall)
    gw.daemon = again
    again.watch_clock(ClockWatch(again.engine, wall=gw.wall.now, monotonic=gw.mono.now))
    try:
        for k in (3690, 3700):
            gw.poll(k, p1=1.0 if k == 3700 else 0.0, lvl=4.0)
        assert [(r, e) for r, e, _ in gw.journal("p1")] == []
    finally:
        close(again)


def test_which_sensors_are_stamped_by_their_device(tmp_path: Path) -> None:
    """Fed only by subscriptions with a payload time (a templated sensor matched against
    the configured ids): the device's clock. Polled, or fed without a payload time, too:
    the gateway's (its readings may be on either clock, and the gateway's is the one that
    steps). A derived sensor is never fed: made only of device-stamped readings it carries
    their time (`twice`, of x.flow), so it is the device's too."""
    config = build_config(
        {
            "station": {"id": "ps-which"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [*({"id": i, "kind": "ph"} for i in ("a.ph", "b.ph", "c.ph", "polled", "plain")),
                        {"id": "x.flow", "kind": "flow", "unit": "gpm"},
                        {"id": "twice", "kind": "derived", "unit": "gpm", "expression": "x.flow * 2"}],
            "modbus": {"devices": [{"name": "plc", "host": "127.0.0.1", "port": 5020, "fields": [
                {"sensor": s, "register": "holding", "address": n, "type": "UINT16"}
                for n, s in enumerate(("polled", "c.ph"))]}]},
            "mqtt": {"subscriptions": [
                {"topic": "site/+/ph", "sensor": "{1}.ph", "format": "json", "time_path": "t"},
                {"topic": "b/ph/raw", "sensor": "b.ph"},
                {"topic": "plain", "sensor": "plain"},
                {"topic": "any/+", "sensor": "{1}", "format": "json", "time_path": "t"}]},
        }
    )  # fmt: skip
    # `{1}` could feed any id but these
    assert device_stamped(config) == frozenset({"a.ph", "x.flow", "twice"})


def test_a_small_step_forward_keeps_the_on_delay_and_the_stale_watch_on_the_time_that_passed() -> None:
    """pH 12.5 from +1 s (on-delay 10 s); NTP steps the clock forward 3 s (just over the
    2 s tolerance) at +5 s: the high alarm is raised 10 s of real time after the excursion
    began (+11 s, +14 s on the new clock), as without the step. Then pH stops reporting at
    +30 s (stale after 60 s); another 3 s step forward at +60 s: stale 61 s of real time
    after the last reading. Before: a step forward restarted both: the on-delay began again
    at the first reading after the step (the alarm 5 s late; with a 15 min on-delay, up to
    15 min late) and the stale watch at the next tick (30 s late; up to `stale_after`)."""
    gw = gateway()
    for k in range(1, 31):
        if k in (6, 61):
            gw.wall.advance(3.0)  # stepped forward by 3 s
        gw.second(ph=12.5 if k < 30 else 7.0)
    for k in range(31, 100):
        if k == 61:
            gw.wall.advance(3.0)
        gw.second()
    (high,) = [c for c in gw.of(Rule.HIGH) if c.state is ACTIVE]
    assert high.time == T0 + 11 + 3
    (stale,) = [c for c in gw.of(Rule.STALE) if c.sensor == "ph"]
    assert stale.time == T0 + 30 + 61 + 6
    assert [c.message for c in gw.of(Rule.CLOCK)] == ["gateway clock stepped forward by 3s"] * 2


def test_a_step_forward_within_the_sample_gap_does_not_lengthen_a_slug_run() -> None:
    """Flow at 600 gpm against a 100 gpm average for 12 min of real time, short of the
    15 min of §139-11: no slug. NTP steps the clock forward 4 min (under the 5 min
    `max_sample_gap`, so the run goes on) 9 min into it. Before: the run was measured on
    the clock, 12 min + the 4 min that did not pass, and a false slug alarm was raised
    15 min 10 s into the run on the clock (11 min 10 s of real time)."""
    config = station(
        {"id": "flow", "kind": "flow", "unit": "gpm", "stale_after": "1h",
         "slug": {"window": "1h", "warmup": "30m"}}
    )  # fmt: skip
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    engine = Engine(config.rules, ManualClock())
    watch = ClockWatch(engine, wall=wall.now, monotonic=mono.now)
    out: list[Condition] = []
    for k in range(0, 70 * 60, 10):  # k: seconds of real time
        clocks_at(wall, mono, k, T0 + k + (240.0 if k >= 49 * 60 else 0.0))
        out += watch.check()
        out += engine.tick(wall.now())
        out += engine.process(Sample("flow", wall.now(), 600.0 if 40 * 60 <= k < 52 * 60 else 100.0))
    assert [(c.rule, c.state) for c in out] == [(Rule.CLOCK, ACTIVE), (Rule.CLOCK, CLEARED)]


def test_the_real_watch_measures_steps_on_a_clock_that_counts_a_suspend() -> None:
    """On Linux `time.monotonic()` stops during a suspend (CLOCK_MONOTONIC) while the kernel
    moves the wall clock on by it at resume: the watch took an hour's suspend for a step
    forward of an hour and moved the callout's steps an hour later. The real watch measures on
    CLOCK_BOOTTIME, which counts the suspend; the heartbeat's steady run stays on the clock that
    stops (`awake`: NTP could not step the clock while it slept). A suspend cannot be made on
    demand in a test: this checks which clocks the watch reads; the suspend itself is played
    on injected clocks (`test_callout.py::test_a_suspend_of_an_hour_...`)."""
    watch = ClockWatch.for_clock(Engine(CONFIG.rules, ManualClock()), WallClock())
    assert watch is not None
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    measured = watch.monotonic()
    assert before <= measured <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert watch.awake is time.monotonic
    # A test that injects one monotonic clock has it for both (it cannot suspend).
    mono = ManualClock(1000.0)
    injected = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=ManualClock(T0).now, monotonic=mono.now)
    assert injected.awake == mono.now


def test_a_suspend_of_an_hour_is_no_clock_step(tmp_path: Path) -> None:
    """The gateway sleeps an hour (a suspend: the wall clock and CLOCK_BOOTTIME move on by it at
    resume, the awake clock does not; played on injected clocks, a suspend cannot be made on
    demand). No step is noticed: no `clock` alarm, nothing counted; the stale watch is not
    moved forward by it (pH, silent through the hour, is stale at resume, as it was)."""
    config = build_config(
        {
            "station": {"id": "ps-sleep"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "ph", "kind": "ph", "stale_after": "60s"}],
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )
    wall, boot, awake = ManualClock(T0), ManualClock(1000.0), ManualClock(1000.0)
    daemon = Daemon(config, wall)
    daemon.watch_clock(ClockWatch(daemon.engine, wall=wall.now, monotonic=boot.now, awake=awake.now))
    try:
        daemon.pipeline.process([Sample("ph", T0, 7.0)])
        daemon.tick()
        wall.advance(3600.0)
        boot.advance(3600.0)  # the suspend: the awake clock stays
        daemon.tick()
        assert daemon.clock_watch is not None and daemon.clock_watch.step_log.steps == 0
        rules = {(a.sensor, a.rule) for a in daemon.alarms.active()}
        assert ("ph", Rule.STALE) in rules and not [r for r in rules if r[1] is Rule.CLOCK]
    finally:
        close(daemon)
