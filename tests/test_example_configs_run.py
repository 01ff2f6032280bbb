"""`monitor run` on every example config under config/ that has MQTT subscriptions, against a
real Mosquitto, as a station would first start it: the daemon on the real clock builds its
clock watch before the MQTT source (the first cut of the refusals-ahead timing read the
source before it existed and every such start crashed), takes a reading stamped a day ahead
as a refusal, reloads on SIGHUP (a new source, a new watch: the wiring again) and stops
cleanly. Only the ports, the state dir and the Influx URL are the test's."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "config").glob("*.yaml") if "mqtt" in yaml.safe_load(p.read_text()))
USER, PASSWORD = "station-monitor", "broker-pw"  # station.example.yaml's username
DAY = 86_400.0


def test_the_examples_with_mqtt_are_found() -> None:
    """The parametrised test below must not pass by running on nothing."""
    assert {"simulator-mqtt.yaml", "station.example.yaml"} <= set(EXAMPLES)


def local(name: str, tmp_path: Path, broker: int) -> tuple[Path, int, dict[str, Any]]:
    """The example with this test's ports and state dir; every device, server and broker it
    names on loopback (a Modbus device or InfluxDB not there is a logged failure, as on a
    bench)."""
    raw = yaml.safe_load((ROOT / "config" / name).read_text())
    raw["mqtt"]["port"] = broker
    raw["state_dir"] = str(tmp_path / "state")
    console = free_port()
    raw["console"] = {**raw.get("console", {}), "host": "127.0.0.1", "port": console}
    if "influx" in raw:
        raw["influx"]["url"] = f"http://127.0.0.1:{free_port()}"
    for device in raw.get("modbus", {}).get("devices", []):
        if "host" in device:
            device["port"] = free_port()
    raw.setdefault("store", {})["free_space_floor"] = 0
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path, console, raw


def mqtt_health(console: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{console}/api/health", timeout=5) as resp:
            doc = json.loads(resp.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None  # not up yet, or restarting on the reload
    return next((s for s in doc.get("sources", []) if "stamped_ahead" in s), None)


@pytest.mark.parametrize("name", EXAMPLES)
def test_monitor_run_on_an_example_config_with_mqtt_takes_refusals_ahead_and_reloads(
    tmp_path: Path, name: str
) -> None:
    login = "username" in yaml.safe_load((ROOT / "config" / name).read_text())["mqtt"]
    broker = Mosquitto(tmp_path / "mosquitto", users={USER: PASSWORD, "operator": "op-pw"} if login else None)
    broker.start()
    try:
        path, console, raw = local(name, tmp_path, broker.port)
        sub = raw["mqtt"]["subscriptions"][0]
        topic = sub["topic"].replace("+", "outfall") if "+" in sub["topic"] else sub["topic"]
        sensor = sub["sensor"].replace("{1}", "outfall").replace("{2}", "outfall")
        sensors = {s["id"] for s in raw["sensors"]}
        if sensor not in sensors:  # a template: bind it to a configured sensor
            topic, sensor = "plant/outfall/ph", "outfall.ph"
        assert sensor in sensors, (name, sensor)
        env = {"MQTT_PASSWORD": PASSWORD, "INFLUX_TOKEN": "token", "CONSOLE_TOKEN": "a console token, 16+"}
        peer = Peer(broker.port, "t-example-plc", USER if login else None, PASSWORD if login else None)
        with running_daemon(path, tmp_path / "daemon.log", env=env) as daemon:
            for run in (1, 2):

                def started(n: int = run) -> bool:
                    return daemon.text().count(" running: ") == n

                wait_until(started, timeout=60, what=f"start {run}")
                wait_until(lambda: mqtt_health(console) is not None, timeout=60, what="the console")

                def refused() -> bool:
                    ahead = (time.time() + DAY) * 1000.0  # a PLC a day ahead of the gateway
                    peer.client.publish(
                        topic, json.dumps({sub["value_path"]: 7.0, sub["time_path"]: ahead}), 1
                    )
                    h = mqtt_health(console)
                    return h is not None and sensor in h["stamped_ahead_sensors"]

                wait_until(refused, timeout=30, what=f"the refusal ahead named in health (start {run})")
                if run == 1:
                    daemon.proc.send_signal(signal.SIGHUP)
            text = daemon.stop()
        peer.client.loop_stop()
        peer.client.disconnect()
        assert "Traceback" not in text and "CRITICAL" not in text, text[-3000:]
    finally:
        broker.stop()
