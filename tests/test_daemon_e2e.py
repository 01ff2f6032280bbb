"""`monitor run` as a separate process against the Modbus simulator, a real
Mosquitto and a real VictoriaMetrics: the whole path from a register to an alarm
on MQTT, the console and the database, then a clean stop and a warm restart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.mqtt_tools import Peer
from tests.services import Mosquitto, VictoriaMetrics, free_port, port_open, simulator_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
STATION = "ps-e2e"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture
def simulator() -> Iterator[int]:
    """The station simulator at real speed with a slug from second 62 to second 90.

    The baseline is the mean of whole minutes before a sample, so a slug can be
    judged only after the first minute boundary; 62 s is past it wherever it falls."""
    with simulator_process("--scenario", "slug@62s+28s") as port:
        yield port


def write_config(tmp_path: Path, modbus_port: int, mqtt_port: int, vm_url: str, console_port: int) -> Path:
    config = {
        "station": {"id": STATION, "name": "End-to-end"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {
                "id": "outfall.flow",
                "kind": "flow",
                "unit": "gpm",
                # A short window so the test judges slugs after seconds, not 20 hours.
                "slug": {"window": "10m", "warmup": "4s", "duration": "3s", "max_gap": "1m"},
            },
            {"id": "outfall.ph", "kind": "ph"},
        ],
        "modbus": {
            "devices": [
                {
                    "name": "sim",
                    "host": "127.0.0.1",
                    "port": modbus_port,
                    "poll_interval": "250ms",
                    "fields": [
                        {"sensor": "outfall.flow", "register": "holding", "address": 0, "type": "FLOAT32"},
                        {"sensor": "outfall.ph", "register": "holding", "address": 2, "type": "FLOAT32"},
                    ],
                }
            ]
        },
        "mqtt": {"host": "127.0.0.1", "port": mqtt_port, "topic_prefix": "station-monitor"},
        "influx": {
            "url": vm_url,
            "org": "o",
            "bucket": "b",
            "token": "${E2E_TOKEN}",
            "flush_interval": "200ms",
        },
        "console": {"host": "127.0.0.1", "port": console_port, "token": "${E2E_TOKEN}"},
    }
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "E2E_TOKEN": "e2e-secret-0123456789"},
        )


@pytest.fixture
def own_services(tmp_path: Path) -> Iterator[tuple[Mosquitto, VictoriaMetrics]]:
    """A broker and a database of this test's own, so its retained alarms and series
    never meet the other tests' (which share the session-wide ones)."""
    broker, victoria = Mosquitto(tmp_path / "mosquitto"), VictoriaMetrics(tmp_path / "vm")
    broker.start()
    try:
        victoria.start()
        try:
            yield broker, victoria
        finally:
            victoria.stop()
    finally:
        broker.stop()


def test_slug_reaches_mqtt_console_and_database_then_clean_stop_and_warm_restart(
    tmp_path: Path, simulator: int, own_services: tuple[Mosquitto, VictoriaMetrics]
) -> None:
    mosquitto, victoria = own_services
    console_port = free_port()
    config = write_config(tmp_path, simulator, mosquitto.port, victoria.url, console_port)
    log = tmp_path / "daemon.log"
    topic = f"station-monitor/{STATION}/alarms/outfall.flow/slug"
    watcher = Peer(mosquitto.port, "e2e-watch")
    watcher.subscribe(topic)
    daemon = start_daemon(config, log)
    try:
        base = f"http://127.0.0.1:{console_port}"
        wait_until(lambda: port_open(console_port), timeout=30, what="console")
        assert get_json(f"{base}/healthz")["status"] == "ok"

        def slug_on_mqtt() -> bool:
            return any(json.loads(p or b"{}").get("active") for t, p, _ in watcher.received() if t == topic)

        wait_until(slug_on_mqtt, timeout=120, what=f"slug alarm on {topic}; log:\n{log.read_text()}")
        alarm = next(json.loads(p) for t, p, _ in watcher.received() if t == topic and p)
        assert alarm["citation"] == "§139-11"
        assert alarm["state"] == "active_unacknowledged"
        assert alarm["value"] > alarm["limit"] > 0
        console_alarms = get_json(f"{base}/api/alarms")
        assert any(a["sensor"] == "outfall.flow" and a["rule"] == "slug" for a in console_alarms)
        sensors = {s["id"]: s for s in get_json(f"{base}/api/sensors")}
        assert sensors["outfall.flow"]["baseline"] is not None

        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, log.read_text()
        assert "stopped" in log.read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
        watcher.close()

    # Nothing left in the outbox; the series and the alarm are in the database.
    status = subprocess.run(
        [sys.executable, "-m", "monitor", "outbox", "status", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "E2E_TOKEN": "e2e-secret-0123456789"},
        check=True,
    )
    assert re.search(r"^pending\s+0 point", status.stdout, re.MULTILINE), status.stdout
    flow = victoria.export(f'{{__name__="sensor_value",station="{STATION}",sensor="outfall.flow"}}')
    assert flow and len(flow[0]["values"]) > 20
    # A series written in the last moments (the shutdown drain) becomes searchable in
    # VictoriaMetrics' index a little after its points are flushed: wait for it, bounded.
    wait_until(
        lambda: bool(
            victoria.export(f'{{__name__=~"alarm_.*",station="{STATION}",sensor="outfall.flow",rule="slug"}}')
        ),
        timeout=15,
        what="the slug alarm transition in VictoriaMetrics",
    )

    # A restart resumes with the baselines it had: judged at once, no new warm-up.
    daemon = start_daemon(config, log)
    try:
        wait_until(
            lambda: "baselines restored from checkpoint" in log.read_text(), timeout=30, what="restart"
        )
        wait_until(lambda: port_open(console_port), timeout=30, what="console after restart")
        sensors = {s["id"]: s for s in get_json(f"http://127.0.0.1:{console_port}/api/sensors")}
        assert sensors["outfall.flow"]["baseline"] is not None
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
