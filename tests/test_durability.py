"""`monitor run` killed with SIGKILL at random moments while tens of thousands of QoS 1
readings arrive: every reading ends up in the series store, in InfluxDB (through the
outbox) and, for the meter, in the ledger, each exactly once.

The daemon is a real process, the broker a real Mosquitto and the database a real
InfluxDB 1.6; the kills are real SIGKILLs, so they land during ingest, during the
outbox drain and while InfluxDB is unreachable. The random moments come from a
seeded generator, so a failure can be run again as it was.
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.daemon_process import DaemonProcess, spawn_daemon
from tests.mqtt_tools import Peer
from tests.services import InfluxDB1, Mosquitto, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
STATION = "ps-dur"
FLOWS = ["a.flow", "b.flow", "c.flow"]
METER = "shop.meter"
SENSORS = [*FLOWS, METER]


def station(state: Path, broker: int, influx_url: str, database: str) -> dict[str, Any]:
    return {
        "station": {"id": STATION},
        "state_dir": str(state),
        "sensors": [
            *({"id": s, "kind": "flow", "unit": "gpm", "slug": False} for s in FLOWS),
            {"id": METER, "kind": "meter", "register_digits": 9},
        ],
        "mqtt": {
            "host": "127.0.0.1",
            "port": broker,
            "client_id": "dur-station",
            "max_skew": "2d",
            "publish_alarms": False,
            "subscriptions": [
                {"topic": "dur/+/v", "sensor": "{1}", "format": "json", "value_path": "v", "time_path": "t"}
            ],
        },
        "influx": {
            "url": influx_url,
            "api": "v1",
            "database": database,
            "flush_interval": "200ms",
            "max_backoff": "1s",
        },
        "console": {"enabled": False},
    }


def readings(start_index: int, count: int, base: float) -> list[tuple[str, bytes]]:
    """Reading i goes to sensor i % 4 at time base + i/100 with value i."""
    out = []
    for i in range(start_index, start_index + count):
        sensor = SENSORS[i % len(SENSORS)]
        value = 1000 + i if sensor == METER else float(i)
        out.append((f"dur/{sensor}/v", json.dumps({"v": value, "t": base + i / 100}).encode()))
    return out


def stored(state: Path) -> int:
    """Readings in the series store, read from outside as any SQLite reader would."""
    path = state / "series.sqlite"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM sample").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        db.close()


class Killer:
    """Runs the daemon and SIGKILLs it at seeded random points of its work, starting it again.

    A kill point is an amount of progress, not a time: the daemon is killed once it has
    stored `rng.randint(1, 1500)` readings more than when it started (or once InfluxDB holds
    that many more points), so each kill lands while it works, under any load, and the run
    takes as long as the work and the start-ups, not a timer.
    """

    def __init__(
        self, config: Path, log: Path, rng: random.Random, daemon: DaemonProcess | None = None
    ) -> None:
        self.config, self.log, self.rng = config, log, rng
        self.running_before = _running(log)
        self.daemon = daemon or spawn_daemon(config, log)  # a start-up costs seconds: take over a running one
        self.kills = 0

    def kill_after(self, progress: Callable[[], int], limit: int, what: str) -> None:
        """Kill the daemon once `progress()` has grown by a random amount (or reached `limit`,
        when less work is left), then start it again."""
        before, step = progress(), self.rng.randint(1, 1500)
        target = min(before + step, limit)
        wait_until(lambda: progress() >= target, timeout=120, what=f"{target - before} more {what}")
        self.daemon.proc.send_signal(signal.SIGKILL)
        self.daemon.proc.wait(timeout=10)
        self.kills += 1
        self.running_before = _running(self.log)
        self.daemon = spawn_daemon(self.config, self.log)

    def stop(self) -> None:
        if self.daemon.proc.poll() is None:
            self.daemon.proc.send_signal(signal.SIGKILL)
            self.daemon.proc.wait(timeout=10)


class Publisher:
    """The field side: publishes a phase's readings in chunks of 500 from its own thread,
    while the daemon is killed and started again (QoS 1: the broker keeps them meanwhile)."""

    def __init__(self, peer: Peer, batch: list[tuple[str, bytes]]) -> None:
        self._thread = threading.Thread(target=self._run, args=(peer, batch), daemon=True)
        self.error: BaseException | None = None

    def _run(self, peer: Peer, batch: list[tuple[str, bytes]]) -> None:
        try:
            for chunk in range(0, len(batch), 500):
                peer.publish_many(batch[chunk : chunk + 500])
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the publisher did not finish"
        if self.error is not None:
            raise self.error


KILLS = (5, 4)  # kill points in phase 1 (InfluxDB down) and phase 2 (up)


def test_sigkill_at_random_moments_loses_and_doubles_nothing(
    tmp_path: Path, broker: Mosquitto, influxdb1: InfluxDB1
) -> None:
    rng = random.Random(1313)
    state = tmp_path / "state"
    config = tmp_path / "station.yaml"
    log = tmp_path / "daemon.log"
    database = f"dur_{os.getpid()}"
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: InfluxDB is down
    config.write_text(yaml.safe_dump(station(state, broker.port, down, database)))
    base = time.time() - 86400
    first, second = 12_000, 8_000
    total = first + second

    daemon = spawn_daemon(config, log)
    try:
        wait_until(
            lambda: "connected as" in log.read_text(),
            timeout=30,
            what=f"MQTT connect; log:\n{log.read_text()}",
        )
    except BaseException:  # a daemon that never connected does not outlive the test
        daemon.proc.kill()
        daemon.proc.wait(timeout=10)
        raise
    peer = Peer(broker.port, "dur-field")
    try:
        # Phase 1, InfluxDB down: readings pour in while the daemon is killed again and again.
        killer = Killer(config, log, rng, daemon)
        try:
            with Publisher(peer, readings(0, first, base)):
                for _ in range(KILLS[0]):
                    killer.kill_after(functools.partial(stored, state), first, "readings stored")
            wait_until(lambda: stored(state) >= first, timeout=120, what="phase 1 readings stored")
        finally:
            killer.stop()
        phase1_kills = killer.kills

        # Phase 2, InfluxDB up: killed during ingest and during the outbox drain.
        config.write_text(yaml.safe_dump(station(state, broker.port, influxdb1.url, database)))
        influxdb1.query(f'CREATE DATABASE "{database}"')
        killer = Killer(config, log, rng)
        try:
            with Publisher(peer, readings(first, second, base)):
                for k in range(KILLS[1]):
                    if k % 2:
                        points = functools.partial(_influx_count, influxdb1, database, "sensor")
                        killer.kill_after(points, total - total // 4, "points in InfluxDB")
                    else:
                        killer.kill_after(functools.partial(stored, state), total, "readings stored")
            assert phase1_kills + killer.kills >= 6, "the test must kill the daemon several times"

            # The daemon started after the last kill is the last, clean run: it takes the rest
            # of the readings and empties the outbox into InfluxDB.
            final = killer.daemon
            wait_until(lambda: stored(state) >= total, timeout=120, what="phase 2 readings stored")
            wait_until(lambda: _influx_count(influxdb1, database, "sensor") >= total - total // 4,
                       timeout=120, what="the outbox drained")  # fmt: skip
            wait_until(lambda: _influx_count(influxdb1, database, "meter") >= total // 4, timeout=60,
                       what="meter rows drained")  # fmt: skip
            wait_until(lambda: _running(log) > killer.running_before, timeout=30, what="start")
            final.stop(timeout=60)
        finally:
            killer.stop()
    finally:
        peer.close()

    # Series store: every reading, once, with its value.
    db = sqlite3.connect(state / "series.sqlite")
    rows = db.execute(
        "SELECT sensor.name, sample.t, sample.value FROM sample JOIN sensor ON sensor.id = sample.sensor"
    ).fetchall()
    assert db.execute("SELECT COUNT(*) FROM intake").fetchone()[0] == 0  # nothing left held
    db.close()
    expected = {}
    for i in range(total):
        sensor = SENSORS[i % len(SENSORS)]
        expected[(sensor, round((base + i / 100) * 1000))] = float(1000 + i if sensor == METER else i)
    got = {(name, round(t * 1000)): value for name, t, value in rows}
    assert len(rows) == total
    assert got == expected

    # InfluxDB: one point per reading (a point sent twice after a kill is the same point).
    per_sensor = influxdb1.query(
        f"SELECT count(value) FROM sensor WHERE station = '{STATION}' GROUP BY sensor", db=database
    )
    counts = {s["tags"]["sensor"]: s["values"][0][1] for s in per_sensor["results"][0]["series"]}
    assert counts == {s: total // len(SENSORS) for s in SENSORS}
    assert _influx_count(influxdb1, database, "meter") == total // len(SENSORS)

    # Ledger: every meter reading once.
    ledger = sqlite3.connect(state / "ledger.sqlite")
    held = [
        int(r)
        for (r,) in ledger.execute("SELECT reading FROM readings WHERE meter = ? AND seq = 0", (METER,))
    ]
    ledger.close()
    meter_values = [1000 + i for i in range(total) if SENSORS[i % len(SENSORS)] == METER]
    assert sorted(held) == meter_values


def _running(log: Path) -> int:
    """How many daemons have logged that they run."""
    return log.read_text().count("running: 4 sensor(s)")


def _influx_count(influx: InfluxDB1, database: str, measurement: str) -> int:
    field = "value" if measurement == "sensor" else "reading"
    result = influx.query(f"SELECT count({field}) FROM {measurement}", db=database)
    series = result["results"][0].get("series")
    return int(series[0]["values"][0][1]) if series else 0
