"""A pump's duty alarms across a restart (monitor/station/tracker.py, pumps.py).

`long_run` and `pump_starts` are raised by the tracker from a pump's readings; after a
restart the journal holds them active and the tracker adopts them. They follow the rule of
every restored alarm (monitor/engine/restored.py, as `fail_to_start` does since 676369d):
only a reading stamped after the activation ends one, so a pump's backlog from before the
raise (a device's buffer, a queued MQTT message) ends nothing. And `pump_starts` keeps its
evidence: the starts that raised it come back from the station store, so it clears when
they leave the hour, as it would have without the restart.

In process, with the daemon's real parts, its real journal and station store, as
tests/test_restart_fail_to_start.py; a crash is the daemon dropped without its shutdown.
"""

from __future__ import annotations

from pathlib import Path

from monitor.config import Config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from monitor.station.store import FILE as STATION_FILE
from tests.engine_helpers import wet_well_station
from tests.test_pipeline import close as crash

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def station(state: Path) -> Config:
    pump = {"capacity": "500 gpm", "max_starts_per_hour": 3, "max_run": "5m"}
    return wet_well_station("ps-pump", state, {"id": "p1", "kind": "pump", "pump": pump})


def journal(daemon: Daemon, rule: Rule) -> list[tuple[str, float]]:
    return [(e.event, e.time - T0) for e in daemon.alarms.journal.entries(sensor="p1") if e.rule is rule]


def pump(daemon: Daemon, clock: ManualClock, k: float, on: bool) -> None:
    """p1's reading stamped +`k` s, judged with the clock there (or later, if it is ahead)."""
    clock.set(max(clock.now(), T0 + k))
    daemon.pipeline.process([Sample("p1", T0 + k, 1.0 if on else 0.0)])


def test_an_off_reading_from_before_the_raise_does_not_end_a_restored_long_run(tmp_path: Path) -> None:
    """p1 off at +0 s, running from +10 s: long_run (max_run 5 min) raised at +320 s, a
    crash. The restarted daemon (clock +500 s) first gets p1's buffered "off" stamped
    +200 s, before the raise: it ends neither the alarm nor the run. p1 still running at
    +500 s; "off" at +520 s ends both then: one run, +10 s to +520 s. Before: the +200 s
    reading ended the run there and the alarm, journaled at +320 s (0 s long) and counted
    as an early clear, while the pump ran on; the +500 s reading started a second run."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s"), clock)
    for k in range(0, 401, 10):
        pump(first, clock, k, k > 0)
    assert journal(first, Rule.LONG_RUN) == [("activated", 320.0)]
    crash(first)
    clock.set(T0 + 500)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        pump(again, clock, 200, False)  # the device's buffer: from before the raise
        alarm = again.alarms.get("p1", Rule.LONG_RUN)
        assert alarm is not None and alarm.active, "ended by a reading older than its activation"
        pump(again, clock, 500, True)
        pump(again, clock, 520, False)
        assert journal(again, Rule.LONG_RUN) == [("activated", 320.0), ("cleared", 520.0)]
        assert again.alarms.early_clears == 0
        store = again.station.store
        assert store is not None
        assert [(r.start - T0, r.end and r.end - T0) for r in store.runs(0, 2 * T0)] == [(10.0, 520.0)]
    finally:
        crash(again)


def lose_the_station_store(daemon: Daemon, state: Path) -> None:
    """A crash, then the station store is gone (a replaced state disk, the file removed);
    the journal still holds the alarms."""
    crash(daemon)
    daemon.station.close()
    for path in state.glob(STATION_FILE + "*"):
        path.unlink()


def test_a_restored_long_run_whose_run_the_store_lost_ends_at_the_first_off_after_it(tmp_path: Path) -> None:
    """Raised at +320 s, the station store lost: the restarted tracker does not know p1 was
    running. p1 "off" at +500 s ends the alarm (its length not known). Before: the first
    reading only set the pump's state and the alarm stood until a later run ended."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s"), clock)
    for k in range(0, 401, 10):
        pump(first, clock, k, k > 0)
    lose_the_station_store(first, tmp_path / "s")
    clock.set(T0 + 500)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        pump(again, clock, 500, False)
        assert journal(again, Rule.LONG_RUN) == [("activated", 320.0), ("cleared", 500.0)]
    finally:
        crash(again)


def cycle(daemon: Daemon, clock: ManualClock) -> None:
    """p1 off at +0 s, four 50 s runs starting +10, +110, +210 and +310 s: the fourth start
    in the hour (max 3) raises pump_starts at +310 s."""
    pump(daemon, clock, 0, False)
    for start in (10, 110, 210, 310):
        pump(daemon, clock, start, True)
        pump(daemon, clock, start + 50, False)
    assert journal(daemon, Rule.PUMP_STARTS) == [("activated", 310.0)]


def test_a_restored_pump_starts_keeps_its_starts_and_clears_when_they_leave_the_hour(tmp_path: Path) -> None:
    """Raised at +310 s by the fourth start in the hour, a crash. After the restart the
    starts come back from the station store: p1's readings "off" at +400 s and +3605 s keep
    the alarm (four starts in the hour to each); at +3610 s the first start (+10 s) is an
    hour old: cleared then, as without the restart (a buffered "on" stamped +300 s, before
    the raise, ends nothing and is no start). Before: cleared at +400 s, the first reading
    after the restart, with the starts that raised it still inside the hour."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s"), clock)
    cycle(first, clock)
    crash(first)
    clock.set(T0 + 400)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        pump(again, clock, 300, True)  # buffered, before the raise
        pump(again, clock, 400, False)
        pump(again, clock, 3605, False)
        alarm = again.alarms.get("p1", Rule.PUMP_STARTS)
        assert alarm is not None and alarm.active, "cleared with its starts still in the hour"
        pump(again, clock, 3610, False)
        assert journal(again, Rule.PUMP_STARTS) == [("activated", 310.0), ("cleared", 3610.0)]
        assert again.station.tracker is not None and again.station.tracker.pumps["p1"].starts == 0
    finally:
        crash(again)


def test_a_restored_pump_starts_without_its_starts_holds_until_the_hour_from_its_activation(
    tmp_path: Path,
) -> None:
    """The station store lost (a replaced state disk, the file removed): the journal still
    holds pump_starts active, raised at +310 s, but no start is known. It cannot tell when
    the window empties, only that every start that raised it is at or before +310 s: held
    until +3910 s, then cleared by the next reading."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s"), clock)
    cycle(first, clock)
    lose_the_station_store(first, tmp_path / "s")
    clock.set(T0 + 400)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        pump(again, clock, 400, False)
        pump(again, clock, 3900, False)
        alarm = again.alarms.get("p1", Rule.PUMP_STARTS)
        assert alarm is not None and alarm.active
        pump(again, clock, 3910, False)
        assert journal(again, Rule.PUMP_STARTS) == [("activated", 310.0), ("cleared", 3910.0)]
    finally:
        crash(again)


def test_starts_before_a_restart_count_in_the_hour_after_it(tmp_path: Path) -> None:
    """A pump that short-cycles across a restart: three starts (+10, +110, +210 s), a crash,
    a fourth at +410 s: the fourth in the hour raises pump_starts, as without the restart.
    Before: the restarted tracker counted from nothing and raised it at the seventh."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s"), clock)
    pump(first, clock, 0, False)
    for start in (10, 110, 210):
        pump(first, clock, start, True)
        pump(first, clock, start + 50, False)
    crash(first)
    clock.set(T0 + 400)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        pump(again, clock, 400, False)
        pump(again, clock, 410, True)
        assert journal(again, Rule.PUMP_STARTS) == [("activated", 410.0)]
    finally:
        crash(again)
