"""A station's daily totals when the state disk fills between a batch's store and the outbox
append of the day just closed: before, `DailyFeed` appended without a guard, so the outbox's
`OutboxError` was a "pipeline listener failed" traceback and the day's pump and station totals,
already taken from the tracker, were lost for InfluxDB. Now they are kept, said once, and
queued with the next batch once the disk has room.

A real tmpfs filled to its last byte (needs root); the InfluxDB is a port held refusing, so the
outbox keeps what it gets.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from monitor.config import load_config
from monitor.daemon import Daemon, DailyFeed
from monitor.model import Alarm, Condition, ManualClock, Sample
from tests.conftest import fill_disk, tmpfs_disk
from tests.services import refused_port

ROOT = Path(__file__).resolve().parent.parent
MIDNIGHT = 1_767_225_600.0  # 2026-01-01T00:00:00Z

NOBODY = contextlib.ExitStack().enter_context(refused_port())


def station_on(disk: Path) -> Path:
    """The two-pump lift station of config/pump-station.yaml (UTC days), its state on `disk`."""
    raw = yaml.safe_load((ROOT / "config" / "pump-station.yaml").read_text(encoding="utf-8"))
    raw["station"]["timezone"] = "UTC"
    raw["state_dir"] = str(disk / "state")
    raw["profile"] = str(ROOT / "monitor" / "profiles" / "barton-139.yaml")
    raw["console"] = {"enabled": False}
    raw["influx"] = {"url": f"http://127.0.0.1:{NOBODY}", "api": "v1", "database": "plant"}
    raw["store"] = {"free_space_floor": 0}
    path = disk.parent / "station.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def poll(t: float) -> list[Sample]:
    """One poll of the station: the well low, both pumps off, nothing pumped."""
    return [Sample("ps.level", t, 3.0), Sample("ps.pump1", t, 0.0), Sample("ps.pump2", t, 0.0),
            Sample("ps.flow", t, 0.0), Sample("mill.flow", t, 10.0)]  # fmt: skip


class FillsTheDisk:
    """Fills the disk once the batch that crosses midnight was stored and judged, before the
    daily totals reach the outbox: the moment a real disk fills (another process, the series
    store's checkpoint) cannot be asked of it, so this listener, ahead of the daemon's own,
    makes it. The disk is real and full; nothing is faked."""

    def __init__(self, disk: Path) -> None:
        self.disk = disk
        self.ballast: Path | None = None

    def judged(
        self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
    ) -> None:
        if self.ballast is None and any(s.time >= MIDNIGHT for s in samples):
            self.ballast = fill_disk(self.disk)


@pytest.fixture
def state_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MB tmpfs: the station's SQLite files and their WALs take ~30 KB a poll before
    they checkpoint, more than `tiny_disk`'s 3 MB holds for an hour of polls."""
    with tmpfs_disk(tmp_path, "size=16m") as mount:
        yield mount


def test_daily_totals_the_full_disk_refused_are_queued_once_it_has_room(
    state_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = Daemon(load_config(station_on(state_disk)), ManualClock(MIDNIGHT - 3600))
    filler = FillsTheDisk(state_disk)
    daemon.pipeline._listeners.insert(0, filler)  # ahead of DailyFeed (see FillsTheDisk)
    outbox = daemon.sink.outbox
    assert outbox is not None

    def daily() -> list[str]:
        kinds = ("pump_daily,", "station_daily,")
        return [ln for ln in outbox.pending_lines(100_000) if ln.startswith(kinds)]

    try:
        with caplog.at_level(logging.INFO):
            for t in range(int(MIDNIGHT - 3600), int(MIDNIGHT) + 60, 60):  # 23:00 to 00:00 UTC
                daemon.pipeline.process(poll(float(t)))
            assert filler.ballast is not None  # the midnight batch was stored, then the disk filled
            assert daily() == []  # refused by the full disk
            feed = next(x for x in daemon.pipeline._listeners if isinstance(x, DailyFeed))
            for _ in range(2):  # timer work telling the listeners while the disk is still full
                feed.judged((), (), ())  # kept, not said again
            assert daily() == []
            filler.ballast.unlink()  # an operator frees space
            daemon.pipeline.process(poll(MIDNIGHT + 180))
        assert daemon.pipeline.stats.listener_errors == 0
        assert not [r for r in caplog.records if "listener" in r.getMessage()], caplog.text
        said = [r.getMessage() for r in caplog.records if "daily totals" in r.getMessage()]
        assert len(said) == 2 and "not queued" in said[0] and "queued" in said[1], said  # once, then back
        lines = daily()
        assert {ln.split(",")[0] for ln in lines} == {"pump_daily", "station_daily"}, lines
        assert sum(1 for ln in lines if ln.startswith("pump_daily,")) == 2  # one a pump, the day once
    finally:
        daemon.station.close()
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()


def test_daily_totals_kept_at_a_restart_are_closed_again_from_the_station_store(
    state_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kept lines are in memory: a restart while the disk was full lost that day for
    InfluxDB. The station store holds what they are made of (runs, overflows, silences) and
    notes the last day queued, so the restarted daemon closes the days after it again."""
    config = load_config(station_on(state_disk))
    daemon = Daemon(config, ManualClock(MIDNIGHT - 3600))
    filler = FillsTheDisk(state_disk)
    daemon.pipeline._listeners.insert(0, filler)  # ahead of DailyFeed (see FillsTheDisk)
    try:
        for t in range(int(MIDNIGHT - 3600), int(MIDNIGHT) + 60, 60):  # 23:00 to 00:00 UTC
            daemon.pipeline.process(poll(float(t)))
        feed = next(x for x in daemon.pipeline._listeners if isinstance(x, DailyFeed))
        assert feed.kept is not None
        kept = list(feed.kept.waiting)
        assert {ln.split(",")[0] for ln in kept} == {"pump_daily", "station_daily"}, kept
        assert filler.ballast is not None
        filler.ballast.unlink()  # space freed, and the daemon restarted before a batch came
    finally:
        daemon.station.close()
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()

    again = Daemon(config, ManualClock(MIDNIGHT + 120))
    outbox = again.sink.outbox
    assert outbox is not None
    try:
        again.pipeline.process(poll(MIDNIGHT + 120))
        queued = [
            ln for ln in outbox.pending_lines(100_000) if ln.startswith(("pump_daily,", "station_daily,"))
        ]
        assert sorted(queued) == sorted(kept)  # the same points, once
        again.pipeline.process(poll(MIDNIGHT + 180))
        queued = [
            ln for ln in outbox.pending_lines(100_000) if ln.startswith(("pump_daily,", "station_daily,"))
        ]
        assert sorted(queued) == sorted(kept)  # and not again
    finally:
        again.station.close()
        again.meters.close()
        again.alarms.close()
        again.sink.close()
