"""The engine's checkpoint holds an alarm active that the alarm journal has cleared.

The checkpoint is saved every five minutes, the journal at each transition: a high pH
cleared after the last checkpoint and then a crash (power cut, kill -9), or a sensor
removed from the config (its alarm retired, monitor/reconcile.py) and added again after a
restart that saved no checkpoint, leave the engine holding the limit or bad-value alarm
active while the journal, console and callouts say normal. A new breach then passed for
the old one going on: nothing was raised for as long as it lasted. Now the restart judges
such a rule afresh (`Engine.forget_active`), so the breach is raised after its on-delay
(a slug: its duration), timed from the first reading after the restart.

In process, with the daemon's real parts, as tests/test_restart_removed_sensor.py.
"""

from __future__ import annotations

from pathlib import Path

from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from tests import test_restart_reconcile as slugs
from tests.test_pipeline import close
from tests.test_pipeline import close as crash
from tests.test_restart_removed_sensor import INLET, OUTFALL, T0, station


def journal(daemon: Daemon, rule: Rule) -> list[tuple[str, float]]:
    entries = daemon.alarms.journal.entries(sensor="outfall.ph")
    return [(e.event, e.time - T0) for e in entries if e.rule is rule]


def breach(state: Path, clock: ManualClock, value: float, rule: Rule) -> list[tuple[str, float]]:
    """outfall.ph at `value` every 10 s from +180 s to +390 s; its journal for `rule`."""
    daemon = Daemon(station(state, OUTFALL, INLET), clock)
    try:
        for k in range(180, 400, 10):
            clock.set(T0 + k)
            daemon.pipeline.process([Sample("outfall.ph", T0 + k, value)])
        return journal(daemon, rule)
    finally:
        close(daemon)


def cleared_after_the_checkpoint_then_crash(state: Path, clock: ManualClock, raising: list[Sample]) -> None:
    """`raising` judged and checkpointed (outfall.ph's alarm active in the checkpoint), pH 7
    at +120 s clears it in the journal, then a crash before the next checkpoint."""
    first = Daemon(station(state, OUTFALL, INLET), clock)
    first.pipeline.process(raising)
    first.checkpoint()
    clock.set(T0 + 120)
    first.pipeline.process([Sample("outfall.ph", T0 + 120, 7.0)])
    crash(first)


def test_a_high_alarm_cleared_after_the_checkpoint_is_raised_again_after_a_crash(tmp_path: Path) -> None:
    """pH 11 at +60 s (checkpoint saved, the alarm active), pH 7 at +120 s clears it, then
    a crash. From +180 s pH 11 again: raised at +180 s. Before: the engine took the
    checkpoint's active alarm as its own, nothing was raised for the whole breach."""
    clock = ManualClock(T0 + 60)
    cleared_after_the_checkpoint_then_crash(tmp_path / "s", clock, [Sample("outfall.ph", T0 + 60, 11.0)])
    got = breach(tmp_path / "s", clock, 11.0, Rule.HIGH)
    assert got == [("activated", 60.0), ("cleared", 120.0), ("activated", 180.0)]


def test_a_bad_value_alarm_cleared_after_the_checkpoint_is_raised_again_after_a_crash(
    tmp_path: Path,
) -> None:
    """The same for a bad value: pH 99 from +0 s raises it, checkpoint, pH 7 at +120 s
    clears it, a crash, pH 99 again from +180 s: raised after its minute, at +240 s, as any
    bad run."""
    clock = ManualClock(T0 + 60)
    bad = [Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)]
    cleared_after_the_checkpoint_then_crash(tmp_path / "s", clock, bad)
    got = breach(tmp_path / "s", clock, 99.0, Rule.BAD_VALUE)
    assert got == [("activated", 60.0), ("cleared", 120.0), ("activated", 240.0)]


def test_a_sensor_removed_then_added_again_raises_its_breach(tmp_path: Path) -> None:
    """A SIGHUP reload without outfall.ph while its high pH alarm is active retires the
    alarm; that daemon dies before saving a checkpoint; the next reload adds the probe back,
    still at pH 11: raised at its first reading (+180 s), not silent for ever after."""
    clock = ManualClock(T0 + 60)
    first = Daemon(station(tmp_path / "s", OUTFALL, INLET), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + 60, 11.0)])
    first.checkpoint()
    close(first)
    clock.set(T0 + 120)
    second = Daemon(station(tmp_path / "s", INLET), clock)
    second.pipeline.process([Sample("inlet.ph", T0 + 120, 7.0)])  # retires outfall.ph/high
    crash(second)
    got = breach(tmp_path / "s", clock, 11.0, Rule.HIGH)
    assert got == [("activated", 60.0), ("cleared", 120.0), ("activated", 180.0)]


def test_a_slug_cleared_after_the_checkpoint_is_raised_again_after_a_crash(tmp_path: Path) -> None:
    """A warm 100 gpm baseline, a slug of 1,000 gpm from +190 s raised at +195 s and
    checkpointed, 100 gpm from +240 s clears it, a crash. From +300 s 1,000 gpm again for
    100 s: raised once its duration (3 s) is over, at +305 s. Before: nothing."""
    clock = ManualClock(T0 + 300)
    first = Daemon(slugs.station(tmp_path / "s"), clock)
    first.pipeline.process([Sample("outfall.flow", T0 + k, 100.0) for k in range(0, 181, 10)])
    first.pipeline.process([Sample("outfall.flow", T0 + k, 1000.0) for k in range(190, 231, 5)])
    first.checkpoint()
    first.pipeline.process([Sample("outfall.flow", T0 + k, 100.0) for k in range(240, 300, 10)])
    crash(first)
    again = Daemon(slugs.station(tmp_path / "s"), clock)
    try:
        again.pipeline.process([Sample("outfall.flow", T0 + k, 1000.0) for k in range(300, 400, 5)])
        got = [(e.event, e.time - T0) for e in again.alarms.journal.entries(sensor="outfall.flow")]
        assert got == [("activated", 195.0), ("cleared", 240.0), ("activated", 305.0)]
    finally:
        close(again)


def test_a_stale_alarm_cleared_after_the_checkpoint_is_raised_again_after_a_crash(tmp_path: Path) -> None:
    """outfall.ph silent for an hour: stale at +3700 s, checkpointed; a reading at +3800 s
    clears it, a crash. The probe falls silent again: the restarted watch (from its first
    tick, +3900 s) raises stale an hour later, at +7560 s with a tick a minute. Before: the
    engine held the checkpoint's stale as active and three hours of silence raised nothing."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "s", OUTFALL, INLET), clock)
    first.pipeline.process([Sample("outfall.ph", T0, 7.0), Sample("inlet.ph", T0, 7.0)])
    clock.set(T0 + 3700)
    first.pipeline.tick(T0 + 3700)
    first.checkpoint()
    clock.set(T0 + 3800)
    first.pipeline.process([Sample("outfall.ph", T0 + 3800, 7.0), Sample("inlet.ph", T0 + 3800, 7.0)])
    crash(first)
    again = Daemon(station(tmp_path / "s", OUTFALL, INLET), clock)
    try:
        for k in range(3900, 3 * 3600 + 3900, 60):
            clock.set(T0 + k)
            again.pipeline.tick(T0 + k)
        want = [("activated", 3700.0), ("cleared", 3800.0), ("activated", 7560.0)]
        assert journal(again, Rule.STALE) == want
    finally:
        close(again)
