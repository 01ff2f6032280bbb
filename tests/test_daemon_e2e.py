"""`monitor run` as a separate process against the Modbus simulator, a real
Mosquitto and a real VictoriaMetrics: the whole path from a register to an alarm
on MQTT, the console and the database, then a clean stop and a warm restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, closing
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess, running_daemon
from tests.mqtt_tools import Peer
from tests.services import (
    Mosquitto,
    SimulatorProcess,
    VictoriaMetrics,
    free_port,
    port_open,
    simulator_process,
    wait_until,
)
from tests.simulator_device import simulator_device, write_station_yaml

ROOT = Path(__file__).resolve().parent.parent
STATION = "ps-e2e"
TOKEN = {"E2E_TOKEN": "e2e-secret-0123456789"}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


# The daemon runs on an accelerated station clock (`monitor run --clock-speed`): the
# baseline is the mean of whole minutes before a sample, so a slug can be judged only
# after a minute boundary, which at 60x passes in one wall second instead of sixty.
SPEED = 60.0


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    """The station simulator; `trigger()` starts a slug of 90 station seconds (1.5 s)."""
    with simulator_process("--speed", str(SPEED), "--on-sigusr1", "slug+90s") as sim:
        yield sim


def write_config(tmp_path: Path, modbus_port: int, mqtt_port: int, vm_url: str, console_port: int) -> Path:
    config = {
        "station": {"id": STATION, "name": "End-to-end"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {
                "id": "outfall.flow",
                "kind": "flow",
                "unit": "gpm",
                # A short warm-up so the test judges slugs after seconds, not 20 hours; a
                # window (an hour: a wall minute) that outlasts the stop and warm restart
                # under load, so the restored baseline is the one judged after the restart.
                "slug": {"window": "1h", "warmup": "4s", "duration": "3s", "max_sample_gap": "1m"},
            },
            {"id": "outfall.ph", "kind": "ph"},
        ],
        "modbus": {"devices": [simulator_device(modbus_port, ("outfall.flow", "outfall.ph"))]},
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
    return write_station_yaml(tmp_path, config)


def daemon_at_speed(config: Path, log: Path, clock_start: float) -> AbstractContextManager[DaemonProcess]:
    """`monitor run` at SPEED from `clock_start`, so a restart continues the same station time."""
    clock = ["--clock-speed", str(SPEED), "--clock-start", repr(clock_start)]
    return running_daemon(config, log, env=TOKEN, extra_args=clock)


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


def flow(base: str) -> dict[str, Any]:
    sensors = {s["id"]: s for s in get_json(f"{base}/api/sensors")}
    found: dict[str, Any] = sensors["outfall.flow"]
    return found


def flow_baseline(base: str) -> float | None:
    value: float | None = flow(base)["baseline"]
    return value


def flow_time(base: str) -> float | None:
    """Event time of the latest flow reading; None before the first."""
    latest = flow(base)["time"]
    return None if latest is None else datetime.fromisoformat(latest).timestamp()


def test_slug_reaches_mqtt_console_and_database_then_clean_stop_and_warm_restart(
    tmp_path: Path, simulator: SimulatorProcess, own_services: tuple[Mosquitto, VictoriaMetrics]
) -> None:
    mosquitto, victoria = own_services
    console_port = free_port()
    config = write_config(tmp_path, simulator.port, mosquitto.port, victoria.url, console_port)
    log = tmp_path / "daemon.log"
    topic = f"station-monitor/{STATION}/alarms/outfall.flow/slug"
    watcher = Peer(mosquitto.port, "e2e-watch")
    watcher.subscribe(topic)
    clock_start = time.time()
    with closing(watcher), daemon_at_speed(config, log, clock_start) as daemon:
        base = f"http://127.0.0.1:{console_port}"
        wait_until(lambda: port_open(console_port), timeout=90, what="console")
        assert get_json(f"{base}/healthz")["status"] == "ok"

        def slug_on_mqtt() -> bool:
            return any(json.loads(p or b"{}").get("active") for t, p, _ in watcher.received() if t == topic)

        # The slug starts once there are three station minutes of baseline to judge it by
        # (three wall seconds), not at a guessed second. Counted from the first reading
        # seen, not from the clock's start: a daemon slow to start under load (5 wall s
        # are 5 station min) would otherwise have its first reading already "3 min in",
        # with no whole minute of baseline before it.
        wait_until(lambda: flow_time(base) is not None, timeout=60, what="a flow reading")
        first = flow_time(base)
        assert first is not None
        wait_until(lambda: (flow_time(base) or first) - first > 3 * 60, timeout=60, what="3 min of flow")
        assert flow_baseline(base) is not None
        assert not slug_on_mqtt()
        simulator.trigger()
        wait_until(slug_on_mqtt, timeout=60, what=f"slug alarm on {topic}; log:\n{log.read_text()}")
        alarm = next(json.loads(p) for t, p, _ in watcher.received() if t == topic and p)
        assert alarm["citation"] == "§139-11"
        assert alarm["state"] == "active_unacknowledged"
        assert alarm["value"] > alarm["limit"] > 0
        console_alarms = get_json(f"{base}/api/alarms")
        assert any(a["sensor"] == "outfall.flow" and a["rule"] == "slug" for a in console_alarms)
        assert flow_baseline(base) is not None

        assert "stopped" in daemon.stop(timeout=30)

    # Nothing left in the outbox; the series and the alarm are in the database.
    status = subprocess.run(
        [sys.executable, "-m", "monitor", "outbox", "status", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **TOKEN},
        check=True,
    )
    assert re.search(r"^pending\s+0 point", status.stdout, re.MULTILINE), status.stdout
    written = re.search(r"^written\s+(\d+)$", status.stdout, re.MULTILINE)
    assert written is not None, status.stdout
    victoria.wait_for_lines(int(written[1]))  # the test's own server: every line since it started
    station_now = clock_start + (time.time() - clock_start) * SPEED
    flow = victoria.export(
        f'{{__name__="sensor_value",station="{STATION}",sensor="outfall.flow"}}', end=station_now + 60
    )
    # Three station minutes of readings (one per 0.25 s x SPEED station seconds, less the
    # daemon's start-up) before the slug, and the slug itself (over 5x) made it to the database.
    assert flow and len(flow[0]["values"]) > 180 / (0.25 * SPEED) / 2
    assert max(flow[0]["values"]) > 5 * min(flow[0]["values"])
    # A series written in the last moments (the shutdown drain) becomes searchable in
    # VictoriaMetrics' index a little after its points are flushed: wait for it, bounded.
    slug_series = f'{{__name__=~"alarm_.*",station="{STATION}",sensor="outfall.flow",rule="slug"}}'
    wait_until(
        lambda: bool(victoria.export(slug_series, end=station_now + 60)),
        timeout=15,
        what="the slug alarm transition in VictoriaMetrics",
    )

    # A restart resumes with the baselines it had: judged at once, no new warm-up.
    with daemon_at_speed(config, log, clock_start) as daemon:
        wait_until(
            lambda: "baselines restored from checkpoint" in log.read_text(), timeout=90, what="restart"
        )
        wait_until(lambda: port_open(console_port), timeout=90, what="console after restart")
        assert flow_baseline(base) is not None
        # ... and still there once the restarted daemon has judged a reading of its own.
        # Right after the restart the console may show no reading yet (none polled) or the
        # one the checkpoint had: wait for a newer one either way.
        stopped_at = flow_time(base) or 0.0
        wait_until(lambda: (flow_time(base) or 0.0) > stopped_at, timeout=30, what="a reading after restart")
        assert flow_baseline(base) is not None
        daemon.stop(timeout=30)
