"""A restored low-pH alarm with a deadband and an off-delay (the low side of
tests/test_restart_reconcile.py's high alarm): a backlog from before the activation, long
enough for the off-delay, does not end it; the deadband and off-delay do, from readings
after it; and the engine raises the next excursion as usual.

In process, with the daemon's real parts, on a manual clock.
"""

from __future__ import annotations

from pathlib import Path

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from tests.test_pipeline import close as crash

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
LIMITS = {"low": 6, "high": 9, "deadband": 0.5, "off_delay": "30s"}


def station(state: Path) -> Config:
    ph = {"id": "outfall.ph", "kind": "ph", "stale_after": "1h", "limits": LIMITS}
    return build_config(
        {
            "station": {"id": "ps-low"},
            "state_dir": str(state),
            "sensors": [ph],
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )


def journal(daemon: Daemon) -> list[tuple[str, float]]:
    entries = daemon.alarms.journal.entries(sensor="outfall.ph")
    return [(e.event, e.time - T0) for e in entries if e.rule is Rule.LOW]


def feed(daemon: Daemon, value: float, *at: int) -> None:
    daemon.pipeline.process([Sample("outfall.ph", T0 + k, value) for k in at])


def test_a_restored_low_alarm_keeps_its_deadband_and_off_delay_and_is_raised_again(tmp_path: Path) -> None:
    """Checkpoint at +10 s, pH 5 at +60 s raises the low alarm, a crash. The backlog, pH 7
    from +15 s to +55 s (40 s back within, longer than the 30 s off-delay), is from before
    the activation and ends nothing (the rule alone would clear it at +45 s, journaled at
    the activation as an early clear). pH 6.3 after it is within the 0.5 deadband: still
    active. pH 7 from +130 s clears it at +160 s; pH 5 at +180 s raises it again."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "s"), clock)
    feed(first, 7.0, 0, 10)
    first.checkpoint()
    feed(first, 5.0, 60)
    assert journal(first) == [("activated", 60.0)]
    crash(first)
    again = Daemon(station(tmp_path / "s"), clock)
    try:
        feed(again, 7.0, *range(15, 56, 5))
        feed(again, 6.3, 70, 80, 120)
        assert journal(again) == [("activated", 60.0)]
        feed(again, 7.0, 130, 150, 160, 170)
        assert journal(again) == [("activated", 60.0), ("cleared", 160.0)]
        feed(again, 5.0, 180)
        assert journal(again) == [("activated", 60.0), ("cleared", 160.0), ("activated", 180.0)]
        assert again.alarms.early_clears == 0
    finally:
        crash(again)
