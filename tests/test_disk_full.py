"""A full state disk mid-stream (a real, small tmpfs), then freed: `monitor run`
stays up, says so with a critical alarm, logs the real cause once, stops taking
readings from the broker, and resumes by itself with nothing acknowledged lost.

Needs root for `mount -t tmpfs` (the test machines run as root).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import tmpfs_disk
from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port, refused_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
SENSORS = ["a.flow", "b.flow"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs_disk(tmp_path, "size=24m,mode=0700") as mount:
        yield mount


def alarms(console: int) -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{console}/api/alarms", timeout=5) as resp:
            return list(json.loads(resp.read()))
    except OSError:
        return []


def disk_alarm(console: int, rule: str) -> dict[str, Any] | None:
    return next((a for a in alarms(console) if a["sensor"] == "state_disk" and a["rule"] == rule), None)


def stored(state: Path) -> int:
    db = sqlite3.connect(f"file:{state / 'series.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM sample").fetchone()[0])
    finally:
        db.close()


@pytest.fixture
def refused() -> Iterator[int]:
    """The InfluxDB port, refusing for the whole test. It was a bare `free_port()`: under load
    another test's server could bind it a moment later and answer (a VictoriaMetrics takes
    /write), and the outbox's deliveries then met the full disk (tests/test_drain_disk_full.py)."""
    with refused_port() as port:
        yield port


def test_full_disk_stops_intake_with_an_alarm_and_resumes_when_freed(
    tmp_path: Path, small_disk: Path, broker: Mosquitto, refused: int
) -> None:
    state = small_disk / "state"
    console = free_port()
    config = tmp_path / "station.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "ps-disk"},
                "state_dir": str(state),
                "sensors": [{"id": s, "kind": "flow", "unit": "gpm", "slug": False} for s in SENSORS],
                "store": {"free_space_floor": 3 << 20},
                "mqtt": {
                    "host": "127.0.0.1",
                    "port": broker.port,
                    "client_id": "disk-station",
                    "max_skew": "2d",
                    "publish_alarms": False,
                    "subscriptions": [
                        {"topic": "disk/+/v", "sensor": "{1}", "format": "json", "value_path": "v",
                         "time_path": "t"}
                    ],
                },
                # InfluxDB is unreachable, so the outbox grows on the same disk too.
                "influx": {"url": f"http://127.0.0.1:{refused}", "api": "v1", "database": "x",
                           "max_backoff": "1s"},
                "console": {"host": "127.0.0.1", "port": console},
            }
        )
    )  # fmt: skip
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon, closing(Peer(broker.port, "disk-field")) as peer:
        wait_until(lambda: "connected as" in log.read_text(), timeout=90, what="the daemon's MQTT session")
        # Leave about 1.5 MB for the stores to fill.
        st = os.statvfs(small_disk)
        ballast = small_disk / "ballast"
        ballast.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - (3 << 19)))
        wait_until(
            lambda: disk_alarm(console, "disk_low") is not None, timeout=30, what="the low-space alarm"
        )

        base = time.time() - 3600
        total = 30_000
        messages = [
            (f"disk/{SENSORS[i % 2]}/v", json.dumps({"v": float(i), "t": base + i / 100}).encode())
            for i in range(total)
        ]
        for chunk in range(0, total, 1000):
            peer.publish_many(messages[chunk : chunk + 1000])
        wait_until(
            lambda: (disk_alarm(console, "disk_full") or {}).get("active") is True,
            timeout=60,
            what=f"the disk-full alarm; log:\n{log.read_text()[-2000:]}",
        )
        full = disk_alarm(console, "disk_full")
        assert full is not None and full["priority"] == "critical"
        assert daemon.proc.poll() is None, "the daemon must not exit on a full disk"
        held = stored(state)
        assert held < total  # the disk really filled before everything was in
        with urllib.request.urlopen(f"http://127.0.0.1:{console}/metrics", timeout=5) as resp:
            assert 'station_monitor_intake_stalled{station="ps-disk"} 1.0' in resp.read().decode()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{console}/readyz", timeout=5)
            raise AssertionError("/readyz must say not ready while the state disk refuses writes")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and "state disk refuses writes" in exc.read().decode()

        ballast.unlink()  # an operator frees space; the daemon resumes by itself
        wait_until(
            lambda: stored(state) >= total, timeout=120, what=f"resume; log:\n{log.read_text()[-2000:]}"
        )
        wait_until(
            lambda: (disk_alarm(console, "disk_full") or {}).get("active") is False,
            timeout=30,
            what="the disk-full alarm returning",
        )
        daemon.stop(timeout=60)

    text = log.read_text()
    assert text.count("state disk refused a write") == 1, text[-3000:]
    assert "database or disk is full" in text  # the real cause
    assert "no transaction is active" not in text
    assert "Traceback" not in text
    db = sqlite3.connect(state / "series.sqlite")
    rows = db.execute("SELECT value FROM sample ORDER BY value").fetchall()
    db.close()
    assert [int(v) for (v,) in rows] == list(range(total))  # every reading once
