"""The InfluxDB copy of the `disk_full` alarm: raised because the state disk is full, its
snapshot cannot be queued in the outbox on that same disk. Before, the alarm manager's
listener raised the OutboxError: "alarm listener failed" with a traceback, counted, and the
snapshot lost for InfluxDB. Now it is kept in memory (bounded), said once, and queued once
the disk takes writes again.

A real tmpfs filled to its last byte (needs root); the InfluxDB is a port that refuses, so
the outbox keeps what it gets.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from monitor.alarms.journal import Entry
from monitor.daemon import Daemon
from monitor.errors import OutboxError
from monitor.model import Alarm, ManualClock, Rule, Sample
from monitor.sinks.kept import KeptLines
from monitor.sinks.outbox import Outbox
from tests.conftest import fill_disk
from tests.test_pipeline import T0, close, station


def disk_full_lines(outbox: Outbox) -> list[str]:
    """The alarm manager's snapshots of `disk_full` (with `state_code`), not the condition line
    the pipeline queued before the alarm manager saw it."""
    return [
        ln
        for ln in outbox.pending_lines(100_000)
        if ln.startswith("alarm,") and "rule=disk_full" in ln and "state_code=" in ln
    ]


class FillsTheDisk:
    """Fills the disk again once the `disk_full` alarm is raised, before the daemon's InfluxDB
    copy sees it: the pipeline released the disk reserve for the alarm journal, and another
    process on the state disk (a log, a backup) took that room. The moment cannot be asked of
    a real disk, so this alarm listener, ahead of the daemon's own, makes it. The disk is real
    and full; nothing is faked."""

    def __init__(self, disk: Path) -> None:
        self.disk = disk
        self.ballast: Path | None = None

    def __call__(self, entry: Entry, alarm: Alarm) -> None:
        if self.ballast is None and alarm.rule is Rule.DISK_FULL and alarm.active:
            self.ballast = fill_disk(self.disk)


def test_the_disk_full_alarm_snapshots_reach_the_outbox_once_the_disk_has_room(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = Daemon(station(tiny_disk / "state", influx=True), ManualClock(T0))
    filler = FillsTheDisk(tiny_disk)
    daemon.alarms._listeners.insert(0, filler)  # ahead of the InfluxDB copy (see FillsTheDisk)
    outbox = daemon.sink.outbox
    assert outbox is not None
    try:
        daemon.pipeline.process([Sample("outfall.ph", T0, 7.0)])
        fill_disk(tiny_disk)  # the state disk fills: the next batch is refused
        acked: list[int] = []
        with caplog.at_level(logging.INFO):
            batch = [Sample("outfall.ph", T0 + 1 + k / 1000, 7.0) for k in range(500)]
            daemon.pipeline.emit(batch, functools.partial(acked.append, 1))
            daemon.pipeline.process_queued()
            assert daemon.pipeline.stats.stalled is not None and acked == []
            alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
            assert alarm is not None and alarm.active and filler.ballast is not None
            assert disk_full_lines(outbox) == []  # the disk it sits on refused it
            filler.ballast.unlink()  # an operator frees space (fill_disk wrote one file, twice)
            daemon.pipeline._retry_at = 0.0  # the retry timer's wait, skipped (a monotonic deadline)
            assert daemon.pipeline.process_queued() is True
        assert acked == [1]
        alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
        assert alarm is not None and not alarm.active
        assert daemon.alarms.listener_failures == {}, daemon.alarms.listener_failures
        assert not [r for r in caplog.records if "listener" in r.getMessage()], caplog.text
        assert not [r for r in caplog.records if r.exc_info], caplog.text  # expected: no traceback
        said = [r.getMessage() for r in caplog.records if "alarm snapshots" in r.getMessage()]
        assert len(said) == 2 and "not queued" in said[0] and "queued" in said[1], said  # once, then back
        active = sorted(ln.split("active=")[1].split(",")[0] for ln in disk_full_lines(outbox))
        assert active == ["0i", "1i"], disk_full_lines(outbox)  # raised while full, then cleared
    finally:
        close(daemon)


class Refusing:
    """An outbox that refuses every append: the bound is about memory, not the disk (a real
    full disk is in the test above; filling one this many times would add nothing)."""

    def __init__(self) -> None:
        self.taken: list[str] = []
        self.refuse = True

    def append(self, lines: Sequence[str], last: bool = False) -> int:
        if self.refuse:
            raise OutboxError("disk full")
        self.taken += lines
        return 0


def test_kept_lines_are_bounded_dropping_the_oldest_and_saying_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = Refusing()
    kept = KeptLines(outbox, "alarm snapshots", limit=3)
    with caplog.at_level(logging.INFO):
        for i in range(5):
            kept.add([f"l{i}"])
        assert kept.waiting == ["l2", "l3", "l4"] and kept.dropped == 2
        outbox.refuse = False
        kept.add([])
    assert outbox.taken == ["l2", "l3", "l4"] and kept.waiting == []
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3 and "not queued" in said[0] and "dropping the oldest" in said[1], said  # each once
    assert "2 dropped" in said[2], said
