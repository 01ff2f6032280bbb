"""The wet well's fail_to_start alarm across a restart (monitor/station/tracker.py).

The tracker raises it when the level stays above `lead_on` for `fail_to_start_delay` with
no pump running, and ends it when a pump runs or the level falls to `lead_on`. After a
restart the journal holds it active and the tracker adopts it; it used to adopt it without
its raise time and without a known level, so
- a pump's feedback stamped before the raise (a device's buffer, a queued MQTT message)
  ended it: the clear was journaled at the activation (0 s, counted as an early clear)
  while the wet well was still rising and no pump had started;
- the first pump or overflow-switch reading after the restart ended it even when stamped
  after the raise and saying "off": with the level not known yet the well did not look
  "calling", so the alarm was cleared with the level figure NaN.
Now it follows the rule of the other restored alarms (monitor/engine/restored.py): only a
reading stamped after the activation ends it, and only one that shows the condition over
(a pump running, or the level known and back at `lead_on`).

In process, with the daemon's real parts and its real journal, as
tests/test_restart_journal_cleared.py.
"""

from __future__ import annotations

import math
from pathlib import Path

from monitor.config import Config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from tests.engine_helpers import wet_well_station
from tests.test_pipeline import close as crash

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def station(state: Path) -> Config:
    return wet_well_station(
        "ps-fail",
        state,
        {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
        {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
    )


def raise_fail_to_start(state: Path, clock: ManualClock) -> None:
    """Pumps off, the level above lead_on (6 ft) from +0 s: raised at +120 s; then a crash."""
    first = Daemon(station(state), clock)
    for k in range(0, 121, 10):
        clock.set(T0 + k)
        first.pipeline.process(
            [Sample("p1", T0 + k, 0.0), Sample("p2", T0 + k, 0.0), Sample("lvl", T0 + k, 6.0)]
        )
    fail = first.alarms.get("lvl", Rule.FAIL_TO_START)
    assert fail is not None and fail.active and fail.activated_at == T0 + 120
    crash(first)


def journal(daemon: Daemon) -> list[tuple[str, float]]:
    entries = daemon.alarms.journal.entries(sensor="lvl")
    return [(e.event, e.time - T0) for e in entries if e.rule is Rule.FAIL_TO_START]


def test_a_pump_reading_from_before_the_raise_does_not_end_a_restored_fail_to_start(tmp_path: Path) -> None:
    """Raised at +120 s, a crash; the restarted daemon (clock +300 s) first gets p2's
    buffered "running" stamped +60 s, before the raise: evidence from before the alarm
    began, it ends nothing. The level still at 6 ft at +300 s keeps it; p2 running at
    +310 s ends it, at +310 s with the level 6 ft. Before: cleared by the +60 s reading,
    journaled at +120 s (0 s long) and counted as an early clear."""
    clock = ManualClock(T0)
    raise_fail_to_start(tmp_path / "s", clock)
    clock.set(T0 + 300)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        again.pipeline.process([Sample("p2", T0 + 60, 1.0)])
        again.pipeline.process([Sample("p2", T0 + 70, 0.0)])  # the buffer's last: off again
        again.pipeline.process([Sample("lvl", T0 + 300, 6.0), Sample("p1", T0 + 300, 0.0)])
        fail = again.alarms.get("lvl", Rule.FAIL_TO_START)
        assert fail is not None and fail.active
        clock.set(T0 + 310)
        again.pipeline.process([Sample("p2", T0 + 310, 1.0)])
        assert journal(again) == [("activated", 120.0), ("cleared", 310.0)]
        fail = again.alarms.get("lvl", Rule.FAIL_TO_START)
        assert fail is not None and not fail.active and fail.value == 6.0
        assert again.alarms.early_clears == 0
    finally:
        crash(again)


def test_a_pump_off_reading_with_the_level_not_known_yet_does_not_end_it(tmp_path: Path) -> None:
    """Raised at +120 s, a crash; after the restart p1 and p2 read "off" at +300 s before
    any level reading: nothing says the well stopped calling, so the alarm stays. The level
    falls to 4 ft at +320 s: cleared then, showing 4 ft. Before: cleared at +300 s by the
    pump reading, its level figure NaN (the well's level was not known yet)."""
    clock = ManualClock(T0)
    raise_fail_to_start(tmp_path / "s", clock)
    clock.set(T0 + 300)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        again.pipeline.process([Sample("p1", T0 + 300, 0.0), Sample("p2", T0 + 300, 0.0)])
        fail = again.alarms.get("lvl", Rule.FAIL_TO_START)
        assert fail is not None and fail.active, "ended with the level unknown"
        clock.set(T0 + 320)
        again.pipeline.process([Sample("lvl", T0 + 320, 4.0)])
        assert journal(again) == [("activated", 120.0), ("cleared", 320.0)]
        fail = again.alarms.get("lvl", Rule.FAIL_TO_START)
        assert fail is not None and fail.value == 4.0 and not math.isnan(fail.value)
    finally:
        crash(again)


def test_after_a_clock_step_back_while_down_the_first_reading_that_shows_it_over_ends_it(
    tmp_path: Path,
) -> None:
    """Raised at +120 s, a crash, and the gateway clock comes back an hour behind (-3600 s):
    every new reading is stamped before the activation. As for the other restored alarms,
    the first reading that shows the condition over (p2 running at -3590 s) ends it rather
    than the alarm standing for an hour on a running pump; journaled at the activation and
    counted as an early clear."""
    clock = ManualClock(T0)
    raise_fail_to_start(tmp_path / "s", clock)
    clock.set(T0 - 3600)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        again.pipeline.process([Sample("lvl", T0 - 3600, 6.0), Sample("p1", T0 - 3600, 0.0)])
        fail = again.alarms.get("lvl", Rule.FAIL_TO_START)
        assert fail is not None and fail.active
        clock.set(T0 - 3590)
        again.pipeline.process([Sample("p2", T0 - 3590, 1.0)])
        assert journal(again) == [("activated", 120.0), ("cleared", 120.0)]
        assert again.alarms.early_clears == 1
    finally:
        crash(again)


def test_a_level_reading_from_before_the_raise_does_not_end_a_restored_high_level(tmp_path: Path) -> None:
    """The wet well's high-level alarm, raised by the level reading too, follows the same
    rule: 7 ft to +50 s, 8.5 ft at +60 s raises it (p1 running), a crash; the restarted
    daemon gets the buffered 7 ft stamped +30 s (ends nothing), then 7.5 ft at +300 s ends
    it at +300 s. Before: cleared by the +30 s reading, journaled at +60 s, an early clear."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s"), clock)
    for k in range(0, 61, 10):
        clock.set(T0 + k)
        first.pipeline.process([Sample("p1", T0 + k, 1.0), Sample("lvl", T0 + k, 8.5 if k == 60 else 7.0)])
    crash(first)
    clock.set(T0 + 300)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        again.pipeline.process([Sample("lvl", T0 + 30, 7.0)])
        high = again.alarms.get("lvl", Rule.HIGH_LEVEL)
        assert high is not None and high.active
        again.pipeline.process([Sample("lvl", T0 + 300, 7.5)])
        entries = again.alarms.journal.entries(sensor="lvl")
        got = [(e.event, e.time - T0) for e in entries if e.rule is Rule.HIGH_LEVEL]
        assert got == [("activated", 60.0), ("cleared", 300.0)]
        assert again.alarms.early_clears == 0
    finally:
        crash(again)
