"""A read-only state disk (issue 13 item 2): the daemon does not exit, stops taking
readings (nothing acknowledged that is not stored), raises the critical `disk_full`
alarm naming the real cause (read-only, not "full"), logs it once, and resumes by
itself when writes succeed again, with nothing acknowledged lost.

Two parts, because no real mechanism gives both the fault and its end on demand:

- **Real, in the kernel** (`test_a_real_read_only_file_system_...`): the state
  directory on an ext4 file system (a loop device, `errors=remount-ro`), switched
  read-only under the open databases with `/sys/fs/ext4/<dev>/trigger_fs_error`.
  SQLite then really fails with `SQLITE_IOERR_WRITE` ("disk I/O error": it drops the
  errno, EROFS). That is what this test checks the daemon survives and names. Ext4's
  emergency read-only lasts until unmount, so it cannot show the resume.
- **Injected at the SQLite boundary** (`test_read_only_stores_...`): `PRAGMA
  query_only=ON` on every open state database (series store, outbox, ledger, alarm
  journal), so SQLite refuses each write with SQLITE_READONLY ("attempt to write a
  readonly database"), then OFF again. A fake, because what a real read-only disk
  would need cannot be done with the files open: `mount -o remount,bind,ro` (and a
  tmpfs `remount,ro`) fail with EBUSY while any file on the mount is open for writing,
  which the daemon's databases always are.

Needs root for `mount` and loop devices (the test machines run as root).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0
STALL_LINE = "state disk refused a write"


def station(state: Path) -> Config:
    return build_config(
        {
            "station": {"id": "ps-ro"},
            "state_dir": str(state),
            "sensors": [
                {"id": "outfall.ph", "kind": "ph"},
                {"id": "shop.meter", "kind": "meter", "register_digits": 6},
            ],
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
            # nothing listens there: points stay in the outbox, where the test counts them
            "influx": {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"},
        }
    )


def close(daemon: Daemon) -> None:
    daemon.sink.close()
    daemon.meters.close()
    daemon.alarms.close()


def batch(n: int) -> list[Sample]:
    """Batch n: ten pH readings and one meter reading, each at its own time."""
    ph = [Sample("outfall.ph", T0 + n * 10 + k, 7.0 + k / 100) for k in range(10)]
    return [*ph, Sample("shop.meter", T0 + n * 10, 100.0 + n)]


def databases(daemon: Daemon) -> list[sqlite3.Connection]:
    assert daemon.sink.outbox is not None
    return [
        daemon.sink.store._db,
        daemon.sink.outbox._db,
        daemon.meters.ledger._db,
        daemon.alarms.journal._db,
    ]


def read_only(daemon: Daemon, on: bool) -> None:
    for db in databases(daemon):
        db.execute(f"PRAGMA query_only={'ON' if on else 'OFF'}")


def retry_now(daemon: Daemon) -> bool:
    daemon.pipeline._retry_at = 0.0  # the retry timer's wait, skipped (a monotonic deadline)
    return daemon.pipeline.process_queued()


def stall_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if STALL_LINE in r.getMessage()]


def test_read_only_stores_stop_intake_with_an_alarm_naming_it_and_resume_by_themselves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    daemon = Daemon(station(tmp_path / "state"), ManualClock(T0))
    acked: list[int] = []
    told: list[tuple[str, str]] = []  # what the console and the MQTT mirror are told
    daemon.alarms.listen(lambda entry, alarm: told.append((alarm.sensor, entry.event)))
    try:
        daemon.pipeline.emit(batch(0), functools.partial(acked.append, 0))
        assert daemon.pipeline.process_queued() is True and acked == [0]

        read_only(daemon, True)
        for n in (1, 2):
            daemon.pipeline.emit(batch(n), functools.partial(acked.append, n))
        assert daemon.pipeline.process_queued() is False  # stalled, no exception
        assert acked == [0]  # nothing acknowledged that is not stored
        judged = daemon.engine.counters.samples
        stalled = daemon.pipeline.stats.stalled
        assert stalled is not None and "read-only" in stalled and "full" not in stalled
        alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
        assert alarm is not None and alarm.active, "the disk alarm must be on the console"
        assert str(alarm.priority) == "critical"
        assert "read-only" in alarm.message and "disk is full" not in alarm.message
        assert ("state_disk", "activated") in told
        for _ in range(3):  # still refused: tried again, not logged again, nothing acknowledged
            assert retry_now(daemon) is False
        assert acked == [0] and daemon.engine.counters.samples == judged
        assert len(stall_lines(caplog)) == 1, stall_lines(caplog)
        assert daemon.pipeline.stats.stalls == 1

        read_only(daemon, False)  # writes succeed again: resumes by itself on the next try
        assert retry_now(daemon) is True
        assert acked == [0, 1, 2]
        alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
        assert alarm is not None and not alarm.active
        assert daemon.pipeline.stats.stalled is None and len(stall_lines(caplog)) == 1
        # the journal could not take the activation while read-only: it holds it now, in order
        events = [e.event for e in daemon.alarms.journal.entries(sensor="state_disk")]
        assert events == ["activated", "cleared"]

        # every acknowledged reading once in every store that must have it
        ph = daemon.sink.store.query("outfall.ph")
        assert sorted(s.time for s in ph) == sorted(s.time for n in (0, 1, 2) for s in batch(n)[:10])
        rows = daemon.meters.ledger.rows("shop.meter", 0, 10**15)
        assert [int(r.reading) for r in rows] == [100, 101, 102]
        assert daemon.sink.outbox is not None
        lines = "\n".join(daemon.sink.outbox.pending_lines(10_000)).splitlines()
        assert sum(1 for ln in lines if ln.startswith("sensor,") and "sensor=outfall.ph" in ln) == 30
        assert sum(1 for ln in lines if ln.startswith("meter,") and "meter=shop.meter" in ln) == 3
        assert daemon.sink.store.held() == []
    finally:
        close(daemon)


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A small ext4 file system on a loop device; yields (mount point, its sysfs dir)."""
    image = tmp_path / "ext4.img"
    with image.open("wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-O", "^has_journal", str(image)], check=True)
    mount = tmp_path / "ext4"
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mount)], check=True)
    try:
        source = subprocess.run(
            ["findmnt", "-no", "SOURCE", str(mount)], check=True, capture_output=True, text=True
        ).stdout.strip()
        yield mount, Path("/sys/fs/ext4") / os.path.basename(source)
    finally:
        subprocess.run(["umount", "-d", "-l", str(mount)], check=True)


def test_a_real_read_only_file_system_stalls_intake_and_names_the_cause(
    ext4: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    mount, sysfs = ext4
    daemon = Daemon(station(mount / "state"), ManualClock(T0))
    acked: list[int] = []
    try:
        daemon.pipeline.emit(batch(0), functools.partial(acked.append, 0))
        assert daemon.pipeline.process_queued() is True and acked == [0]

        (sysfs / "trigger_fs_error").write_text("station-monitor test: read-only now\n")
        with pytest.raises(OSError) as probe:  # the kernel really refuses writes now
            (mount / "probe").write_bytes(b"x")
        assert probe.value.errno == 30  # EROFS

        daemon.pipeline.emit(batch(1), functools.partial(acked.append, 1))
        assert daemon.pipeline.process_queued() is False  # stalled, no exception
        assert retry_now(daemon) is False
        assert acked == [0]  # nothing acknowledged that is not stored
        stalled = daemon.pipeline.stats.stalled
        assert stalled is not None and "read-only" in stalled.lower(), stalled
        lines = stall_lines(caplog)
        assert len(lines) == 1 and "read-only" in lines[0].lower(), lines
        alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
        assert alarm is not None and alarm.active, "the disk alarm must be on the console"
        assert "read-only" in alarm.message.lower()
    finally:
        close(daemon)


def test_monitor_run_on_a_disk_gone_read_only_stays_up_and_says_so(
    tmp_path: Path, ext4: tuple[Path, Path]
) -> None:
    """Against `monitor run` itself, with MQTT in: the real ext4 read-only switch."""
    mount, sysfs = ext4
    broker = Mosquitto(tmp_path / "broker")
    broker.start()
    state = mount / "state"
    console = free_port()
    config = tmp_path / "station.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "ps-ro"},
                "state_dir": str(state),
                "sensors": [{"id": "a.flow", "kind": "flow", "unit": "gpm", "slug": False}],
                "store": {"free_space_floor": 0},
                "mqtt": {
                    "host": "127.0.0.1",
                    "port": broker.port,
                    "client_id": "ro-station",
                    "max_skew": "2d",
                    "subscriptions": [
                        {"topic": "ro/+/v", "sensor": "{1}", "format": "json", "value_path": "v",
                         "time_path": "t"}
                    ],
                },
                "console": {"host": "127.0.0.1", "port": console},
            }
        )
    )  # fmt: skip
    log = tmp_path / "daemon.log"
    with ExitStack() as stack:
        stack.callback(broker.stop)
        daemon = stack.enter_context(running_daemon(config, log, grace=60))
        peer = stack.enter_context(closing(Peer(broker.port, "ro-field")))
        watcher = stack.enter_context(closing(Peer(broker.port, "ro-watcher")))
        wait_until(lambda: "connected as" in log.read_text(), timeout=90, what="the daemon's MQTT session")
        watcher.subscribe("#")
        base = time.time() - 600
        peer.publish_many(readings(base, range(100)))
        wait_until(lambda: stored(state) == 100, timeout=30, what="the first readings stored")

        (sysfs / "trigger_fs_error").write_text("station-monitor test: read-only now\n")
        peer.publish_many(
            [("ro/a.flow/v", json.dumps({"v": i, "t": base + i}).encode()) for i in range(100, 200)]
        )
        wait_until(
            lambda: (disk_alarm(console) or {}).get("active") is True,
            timeout=30,
            what=f"the disk alarm on the console; log:\n{log.read_text()[-2000:]}",
        )
        alarm = disk_alarm(console)
        assert alarm is not None and alarm["priority"] == "critical"
        assert "Read-only file system" in alarm["message"], alarm
        wait_until(
            lambda: any(
                "state_disk" in t and b"Read-only file system" in p for t, p, _ in watcher.received()
            ),
            timeout=30,
            what="the disk alarm on MQTT",
        )
        assert daemon.proc.poll() is None, "the daemon must not exit on a read-only disk"
        assert stored(state) == 100  # nothing more taken in
        lines = [ln for ln in log.read_text().splitlines() if STALL_LINE in ln]
        assert len(lines) == 1 and "Read-only file system (EROFS)" in lines[0], lines
        assert "Traceback" not in log.read_text()


def readings(base: float, numbers: range) -> list[tuple[str, bytes]]:
    return [("ro/a.flow/v", json.dumps({"v": i, "t": base + i}).encode()) for i in numbers]


def disk_alarm(console: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{console}/api/alarms", timeout=5) as resp:
            found = list(json.loads(resp.read()))
    except OSError:
        return None
    return next((a for a in found if a["sensor"] == "state_disk" and a["rule"] == "disk_full"), None)


def stored(state: Path) -> int:
    """Rows in the series store (read-only: the mount may be)."""
    db = sqlite3.connect(f"file:{state / 'series.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM sample").fetchone()[0])
    finally:
        db.close()
