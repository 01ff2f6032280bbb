"""MQTT QoS 1 readings through `monitor run`, acknowledged only once stored and judged.

A broker may hold only so many unacknowledged messages per client in flight
(Mosquitto's `max_inflight_messages`, 100 in `deploy/mosquitto/mosquitto.conf`;
an MQTT 5 client's receive maximum), and the daemon acknowledges a reading after
its batch is committed. This measures what that costs: the same readings into
the same daemon with the shipped in-flight limit, and with no limit (the peer:
the broker never waits for an acknowledgement), same run, same machine.

    python -m bench.mqtt_acked [--readings 20000]
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.mqtt_tools import Peer
from tests.services import Mosquitto, wait_until

ROOT = Path(__file__).resolve().parent.parent


def stored(state: Path) -> int:
    path = state / "series.sqlite"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM sample").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def run(work: Path, inflight: int, readings: int) -> float:
    broker = Mosquitto(work / "broker", extra=f"max_inflight_messages {inflight}\n")
    broker.start()
    state = work / "state"
    config = work / "station.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "bench-acked"},
                "state_dir": str(state),
                "sensors": [{"id": f"s{i}.flow", "kind": "flow", "unit": "gpm"} for i in range(10)],
                "mqtt": {
                    "host": "127.0.0.1",
                    "port": broker.port,
                    "client_id": "bench-acked",
                    "protocol": "3.1.1",
                    "max_skew": "2d",
                    "publish_alarms": False,
                    "subscriptions": [{"topic": "b/+/v", "sensor": "{1}.flow"}],
                },
                "console": {"enabled": False},
            }
        )
    )
    log = work / "daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)], cwd=ROOT, stderr=out
        )
    peer = Peer(broker.port, "bench-acked-field")
    try:
        wait_until(lambda: "connected as" in log.read_text(), timeout=30, what="the daemon's session")
        daemon.send_signal(signal.SIGSTOP)  # the backlog waits on the broker, as after an outage
        peer.publish_many((f"b/s{i % 10}/v", json.dumps(float(i)).encode()) for i in range(readings))
        start = time.perf_counter()
        daemon.send_signal(signal.SIGCONT)
        wait_until(lambda: stored(state) >= readings, timeout=600, what="every reading stored")
        return time.perf_counter() - start
    finally:
        peer.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readings", type=int, default=20_000)
    args = parser.parse_args()
    n = args.readings
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        limited = run(Path(a), 100, n)
        unlimited = run(Path(b), 0, n)
    print(f"{n:,} QoS 1 readings (MQTT 3.1.1) waiting on the broker, drained by monitor run")
    print(f"  peer: no in-flight limit                    {n / unlimited:>10,.0f} readings/s")
    print(f"  ours: max_inflight_messages 100 (shipped)   {n / limited:>10,.0f} readings/s"
          f"   ({limited / unlimited:.2f}x the peer's time)")  # fmt: skip


if __name__ == "__main__":
    main()
