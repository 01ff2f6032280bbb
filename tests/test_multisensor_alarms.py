"""Alarms that depend on several sensors, when one sensor's readings arrive late.

A derived sensor (`kind: derived`) and the wet well's fail-to-start (level and every
pump's run feedback) are judged from readings of several sensors, and those need not
arrive in time order: a source polled on its own schedule, a device's buffer replayed
after an outage, a queued MQTT message. An alarm is never ended by evidence stamped
before it began (the rule of monitor/reconcile.py and the engine's stale clear): the
manager would journal such a clear at the activation and count it as an early clear.

In process, with the daemon's real parts (engine, station tracker, journal, series
store), fed as pollers feed it, on a manual clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def station(state: Path, sensors: list[dict[str, Any]], **more: Any) -> Config:
    return build_config(
        {
            "station": {"id": "ps-multi"},
            "state_dir": str(state),
            "sensors": sensors,
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
            **more,
        }
    )


@contextmanager
def running(config: Config, clock: ManualClock) -> Iterator[Daemon]:
    daemon = Daemon(config, clock)
    try:
        yield daemon
    finally:
        daemon.station.close()
        daemon.sink.close()
        daemon.meters.close()
        daemon.alarms.close()


def journal(daemon: Daemon, sensor: str, rule: Rule) -> list[tuple[str, float]]:
    return [(e.event, e.time - T0) for e in daemon.alarms.journal.entries(sensor=sensor) if e.rule is rule]


def poll(daemon: Daemon, clock: ManualClock, at: float, samples: list[Sample]) -> None:
    """One poller's batch, judged at `at` (seconds after T0), then the daemon's tick."""
    clock.set(T0 + at)
    daemon.pipeline.process(samples)
    daemon.pipeline.tick(T0 + at)


# --- derived sensors --------------------------------------------------------------------

FLOWS = [
    {"id": "a.flow", "kind": "flow", "unit": "gpm", "slug": False, "limits": False, "stale_after": "1h"},
    {"id": "b.flow", "kind": "flow", "unit": "gpm", "slug": False, "limits": False, "stale_after": "1h"},
]


def total(**more: Any) -> dict[str, Any]:
    return {
        "id": "total.flow",
        "kind": "derived",
        "unit": "gpm",
        "expression": "a.flow + b.flow",
        "slug": False,
        "limits": {"high": 1000},
        **more,
    }


def test_a_derived_limit_alarm_is_not_ended_by_an_input_reading_from_before_it(tmp_path: Path) -> None:
    """Pin, no code change: it cannot happen. total = a + b, both polled every 10 s until
    +80 s; then a jumps to 950 gpm while b's source lags. The derived sample at +90 s (a at
    +90 s with b's last known +80 s) is over 1,000 gpm and raises `high` at +90 s. b's late
    readings (+85, +95, +105 s: 10 gpm) arrive at +112 s, the first stamped before the
    activation. They make no derived sample at their own time: a derived sample is made at
    the latest time its inputs have reached (monitor/station/derive.py), so they count in
    the next one, +110 s, which ends the alarm after it began. The engine refuses a derived
    sample not later than the last one, so a derived alarm's clear comes after its
    activation."""
    clock = ManualClock(T0)
    with running(station(tmp_path / "s", [*FLOWS, total()]), clock) as daemon:
        for k in range(9):  # +0..+80 s: 500 + 100
            poll(
                daemon,
                clock,
                10 * k,
                [Sample("a.flow", T0 + 10 * k, 500.0), Sample("b.flow", T0 + 10 * k, 100.0)],
            )
        for at in (90, 100, 110):  # a jumps to 950; b is silent (its source lags)
            poll(daemon, clock, at, [Sample("a.flow", T0 + at, 950.0)])
        # a at +100 s made the +90 s sample due: 950 + 100 (b at +80 s)
        assert journal(daemon, "total.flow", Rule.HIGH) == [("activated", 90.0)]
        # b's backlog, the first reading stamped before the activation, low enough to end it
        poll(daemon, clock, 112, [Sample("b.flow", T0 + at, 10.0) for at in (85, 95, 105)])
        assert journal(daemon, "total.flow", Rule.HIGH) == [("activated", 90.0)]
        poll(daemon, clock, 120, [Sample("a.flow", T0 + 120, 950.0)])
        assert journal(daemon, "total.flow", Rule.HIGH) == [("activated", 90.0), ("cleared", 110.0)]
        assert daemon.alarms.early_clears == 0


def test_a_derived_stale_alarm_is_not_ended_before_it_began_by_an_inputs_backlog(tmp_path: Path) -> None:
    """Pin, no code change: it cannot happen. b's source goes quiet after +0 s while a is
    polled on time; with b older than `max_input_age` (20 s) no derived sample is made after
    +20 s, so total goes stale at the first tick more than 30 s later (stale_after), +60 s.
    Then b's backlog arrives, every reading stamped before the raise but the last: the
    derived samples it completes are stamped no earlier than the inputs' latest time, and a
    stale alarm ends when its reading is judged (the later of its time and the last tick,
    monitor/engine/engine.py), never before the raise."""
    clock = ManualClock(T0)
    config = station(tmp_path / "s", [*FLOWS, total(stale_after="30s", max_input_age="20s", limits=False)])
    with running(config, clock) as daemon:
        poll(daemon, clock, 0, [Sample("a.flow", T0, 500.0), Sample("b.flow", T0, 100.0)])
        for at in range(10, 61, 10):
            poll(daemon, clock, at, [Sample("a.flow", T0 + at, 500.0)])
        assert journal(daemon, "total.flow", Rule.STALE) == [("activated", 60.0)]
        # b's buffer replayed at +65 s: +10..+60 s, all but the last before the raise
        poll(daemon, clock, 65, [Sample("b.flow", T0 + at, 100.0) for at in range(10, 61, 10)])
        poll(daemon, clock, 70, [Sample("a.flow", T0 + 70, 500.0), Sample("b.flow", T0 + 70, 100.0)])
        stale = journal(daemon, "total.flow", Rule.STALE)
        assert stale == [("activated", 60.0), ("cleared", 65.0)]
        assert daemon.alarms.early_clears == 0


# --- the wet well: fail to start ---------------------------------------------------------

WELL: list[dict[str, Any]] = [
    {"id": "lvl", "kind": "level", "unit": "ft", "stale_after": "1h",
     "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
    {"id": "p1", "kind": "pump", "stale_after": "1h"},
    {"id": "p2", "kind": "pump", "stale_after": "1h"},
]  # fmt: skip


def well(state: Path) -> Config:
    return station(state, WELL, wet_well={"level": "lvl", "pumps": ["p1", "p2"], "fail_to_start_delay": "2m"})


def test_fail_to_start_is_not_ended_by_a_pump_reading_from_before_it_began(tmp_path: Path) -> None:
    """The level (Modbus, on time) is above lead_on from +10 s with both pumps last seen off
    at +10 s; pump 1's run feedback comes from a source that lags. Fail to start is raised at
    +130 s (two minutes). Then pump 1's backlog arrives: running from +120 s, before the
    raise. That is evidence from before the alarm began: it neither ends the alarm at
    +120 s (the tracker used to, and the manager journaled the clear at the activation,
    counted as an early clear) nor is lost: the next reading after the activation, the
    level at +140 s with pump 1 known running, ends it at +140 s. (`monitor replay` of the
    same readings takes them in time order, pump 1 running at +120 s before the level at
    +130 s, and raises nothing: live differs only because its readings came out of order;
    in order, live and replay agree, tests/test_station_live.py.)"""
    clock = ManualClock(T0)
    with running(well(tmp_path / "s"), clock) as daemon:
        poll(daemon, clock, 0, [Sample("lvl", T0, 4.0), Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)])
        poll(
            daemon,
            clock,
            10,
            [Sample("lvl", T0 + 10, 5.5), Sample("p1", T0 + 10, 0.0), Sample("p2", T0 + 10, 0.0)],
        )
        for at in range(20, 131, 10):  # pump 2 on time, off; pump 1 silent
            poll(daemon, clock, at, [Sample("lvl", T0 + at, 5.5), Sample("p2", T0 + at, 0.0)])
        assert journal(daemon, "lvl", Rule.FAIL_TO_START) == [("activated", 130.0)]
        backlog = [Sample("p1", T0 + at, 0.0) for at in range(20, 120, 10)] + [Sample("p1", T0 + 120, 1.0)]
        poll(daemon, clock, 135, backlog)
        assert journal(daemon, "lvl", Rule.FAIL_TO_START) == [("activated", 130.0)]
        alarm = daemon.alarms.get("lvl", Rule.FAIL_TO_START)
        assert alarm is not None and alarm.active
        poll(daemon, clock, 140, [Sample("lvl", T0 + 140, 5.4), Sample("p2", T0 + 140, 0.0)])
        assert journal(daemon, "lvl", Rule.FAIL_TO_START) == [("activated", 130.0), ("cleared", 140.0)]
        assert daemon.alarms.early_clears == 0
