"""Smoke tests: each real service starts, answers a round trip, and stops."""

from __future__ import annotations

import queue
import urllib.parse

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.services import InfluxDB1, Mosquitto, VictoriaMetrics, http, port_open


def test_mosquitto_round_trip(mosquitto: Mosquitto) -> None:
    received: queue.Queue[bytes] = queue.Queue()
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="smoke-sub")
    sub.on_message = lambda c, u, msg: received.put(bytes(msg.payload))
    subscribed: queue.Queue[bool] = queue.Queue()
    sub.on_subscribe = lambda *a: subscribed.put(True)
    sub.connect("127.0.0.1", mosquitto.port)
    sub.loop_start()
    try:
        sub.subscribe("smoke/#", qos=1)
        assert subscribed.get(timeout=10)
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="smoke-pub")
        pub.connect("127.0.0.1", mosquitto.port)
        pub.loop_start()
        pub.publish("smoke/x", b"42.5", qos=1).wait_for_publish(timeout=10)
        pub.loop_stop()
        pub.disconnect()
        assert received.get(timeout=10) == b"42.5"
    finally:
        sub.loop_stop()
        sub.disconnect()


def test_victoria_metrics_round_trip(victoria: VictoriaMetrics) -> None:
    victoria.write(["smoke,station=ps-1,sensor=outfall.flow value=123.25 1767225600000000000"])
    series = victoria.export('{__name__="smoke_value"}')
    assert len(series) == 1
    assert series[0]["metric"]["sensor"] == "outfall.flow"
    assert series[0]["values"] == [123.25]
    assert series[0]["timestamps"] == [1767225600000]


def test_influxdb1_round_trip(influxdb1: InfluxDB1) -> None:
    influxdb1.query("CREATE DATABASE smoke")
    line = b"smoke,sensor=outfall.ph value=7.25 1767225600000000000\n"
    q = urllib.parse.urlencode({"db": "smoke"})
    status, body = http("POST", f"{influxdb1.url}/write?{q}", line)
    assert status == 204, body
    result = influxdb1.query('SELECT "value" FROM "smoke"', db="smoke")
    assert result["results"][0]["series"][0]["values"] == [[1767225600000, 7.25]]


def test_restart_keeps_port(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    server = Mosquitto(tmp_path / "m")
    server.start()
    try:
        port = server.port
        server.stop()
        assert not port_open(port)
        server.start()
        assert port_open(port)
    finally:
        server.stop()
