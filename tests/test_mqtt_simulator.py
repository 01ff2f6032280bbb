"""The MQTT publisher runs the shared station model; the monitor ingests it over a real broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from monitor.config import load_config
from monitor.sources.mqtt import MqttLink
from monitor.sources.mqtt_ingest import MqttSource
from simulators.mqtt_publisher import TOPICS, messages
from simulators.scenarios import SENSORS, Station
from tests.mqtt_tools import collect
from tests.services import Mosquitto


def test_messages_are_the_station_model_values() -> None:
    station = Station(seed=3, start=1000.0)
    station.inject("ph_excursion", 0, "1h", value=3.5, ramp=1)
    t = 1060.0
    out = dict(messages(station, t))
    values = station.values(t)
    assert set(TOPICS) == set(SENSORS)
    for name, topic in TOPICS.items():
        doc = json.loads(out[f"plant/{topic}"])
        assert doc == {"value": round(values[name], 6), "ts": 1_060_000}
    assert json.loads(out["plant/outfall/ph"])["value"] == 3.5
    assert float(dict(messages(station, t, fmt="number"))["plant/outfall/ph"]) == 3.5


def test_device_offline_publishes_nothing() -> None:
    station = Station(start=0.0)
    station.inject("device_offline", "10s", "1m")
    assert messages(station, 5.0)
    assert messages(station, 20.0) == []


def test_simulator_feeds_every_sensor_of_the_example_config(mosquitto: Mosquitto, repo_root: Path) -> None:
    config = load_config(repo_root / "config" / "simulator-mqtt.yaml")
    assert config.mqtt is not None
    mqtt = config.mqtt.model_copy(update={"port": mosquitto.port})
    link = MqttLink(mqtt, config.station.id, client_id="t-sim-monitor")
    source = MqttSource(link, mqtt, config.station.id, sensors=[s.id for s in config.sensors])
    link.start()
    link.wait_connected()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulators.mqtt_publisher", "--port", str(mosquitto.port),
         "--client-id", "t-sim-pub", "--interval", "0.05", "--rounds", "5",
         "--scenario", "ph_excursion@0s+1h:value=3.5,ramp=0.001"],
        cwd=repo_root, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        samples = asyncio.run(collect(source, lambda got: len(got) >= 30))
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        link.stop()
    assert {s.sensor for s in samples} == {s.id for s in config.sensors}
    ph = [s.value for s in samples if s.sensor == "outfall.ph"]
    assert len(ph) == 5 and ph[1:] == [3.5] * 4  # the excursion, ramped in from the first reading
    assert source.bad.total == 0
