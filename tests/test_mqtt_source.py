"""MQTT ingestion against a real Mosquitto: payload forms, auth, TLS, sessions, restarts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.alarms.figures import figures
from monitor.errors import SourceError
from monitor.model import Alarm, AlarmState, Condition, ConditionState, Priority, Rule, Sample
from monitor.sources.mqtt import MqttLink
from monitor.sources.mqtt_ingest import MqttSource
from tests.mqtt_tools import Peer, acking, collect, make_ca, mqtt_config
from tests.services import Mosquitto, wait_until
from tests.waiting import until

SUBS = [
    {"topic": "plant/+/ph", "sensor": "{1}.ph"},
    {"topic": "plant/+/flow", "sensor": "{1}.flow", "format": "json", "value_path": "v", "time_path": "t"},
    {"topic": "lab/temp", "sensor": "lab.temp", "format": "json", "value_path": "reading.celsius"},
]
SENSORS = ["outfall.ph", "mill.ph", "outfall.flow", "lab.temp"]


def test_each_payload_form_and_bad_payloads_never_stop_ingestion(
    mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = mqtt_config(mosquitto.port, subscriptions=SUBS)
    link = MqttLink(cfg, "ps-1", client_id="t-forms")
    source = MqttSource(link, cfg, "ps-1", sensors=SENSORS)
    link.start()
    link.wait_connected()
    peer = Peer(mosquitto.port, "t-forms-peer")
    try:
        messages: list[tuple[str, bytes]] = [
            ("plant/outfall/ph", b"7.25"),
            ("plant/outfall/ph", b"\xff\xfe"),  # not UTF-8
            ("plant/mill/ph", b"6.5"),
            ("plant/outfall/flow", json.dumps({"v": 120.5, "t": 1_767_225_600}).encode()),  # epoch s
            ("plant/outfall/flow", json.dumps({"v": 121.0, "t": 1_767_225_601_500}).encode()),  # epoch ms
            ("plant/outfall/flow", json.dumps({"v": 122.0, "t": "2026-01-01T00:00:02Z"}).encode()),  # ISO
            ("plant/outfall/flow", b'{"v": NaN, "t": 1767225603}'),  # not finite
            ("plant/outfall/flow", b"not json"),
            ("plant/ghost/ph", b"7.0"),  # binds a sensor the station does not have
            ("plant/outfall/ph", b"nan"),
            ("lab/temp", json.dumps({"reading": {"celsius": 21.5}}).encode()),  # no time: receive time
            ("plant/outfall/ph", b"x" * 70_000),  # over max_payload
            ("plant/outfall/ph", b"7.5"),
        ]
        with caplog.at_level(logging.WARNING, logger="monitor.sources.mqtt_ingest"):
            peer.publish_many(messages)
            samples = asyncio.run(collect(source, lambda got: len(got) >= 7))
        by_sensor: dict[str, list[Sample]] = {}
        for s in samples:
            by_sensor.setdefault(s.sensor, []).append(s)
        assert [s.value for s in by_sensor["outfall.ph"]] == [7.25, 7.5]
        assert [s.value for s in by_sensor["mill.ph"]] == [6.5]
        flow = by_sensor["outfall.flow"]
        assert [(s.time, s.value) for s in flow] == [
            (1_767_225_600.0, 120.5),
            (1_767_225_601.5, 121.0),
            (1_767_225_602.0, 122.0),
        ]
        (lab,) = by_sensor["lab.temp"]
        assert lab.value == 21.5 and abs(lab.time - by_sensor["outfall.ph"][0].time) < 30
        assert source.bad.counts == {
            "plant/outfall/ph": 3,
            "plant/outfall/flow": 2,
            "plant/ghost/ph": 1,
        }
        text = caplog.text
        assert "topic 'plant/outfall/ph': bad payload: payload is not UTF-8" in text
        assert "topic 'plant/ghost/ph': bad payload: sensor 'ghost.ph' is not configured" in text
        assert "topic 'plant/outfall/flow': bad payload: value at 'v' is not finite" in text
        assert source.received == len(messages)  # the good 7.5 came last, after every bad one
        # once per topic per interval: the 2nd and 3rd bad payload on outfall/ph are not logged
        assert text.count("topic 'plant/outfall/ph'") == 1
    finally:
        peer.close()
        link.stop()


def test_password_broker_accepts_the_right_password_and_reports_a_wrong_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = Mosquitto(tmp_path / "auth", users={"station-monitor": "s3cret-pw", "field": "f1eld"})
    server.start()
    try:
        monkeypatch.setenv("T_MQTT_PW", "s3cret-pw")
        cfg = mqtt_config(
            server.port, username="station-monitor", password="${T_MQTT_PW}", subscriptions=SUBS
        )
        link = MqttLink(cfg, "ps-1", client_id="t-auth-good")
        source = MqttSource(link, cfg, "ps-1")
        link.start()
        link.wait_connected()
        peer = Peer(server.port, "t-auth-peer", "field", "f1eld")
        try:
            peer.publish("plant/outfall/ph", b"7.1")
            (sample,) = asyncio.run(collect(source, lambda got: len(got) >= 1))
            assert sample.value == 7.1
        finally:
            peer.close()
            link.stop()

        monkeypatch.setenv("T_MQTT_PW", "wrong-horse-battery")
        bad_cfg = mqtt_config(server.port, username="station-monitor", password="${T_MQTT_PW}")
        bad = MqttLink(bad_cfg, "ps-1", client_id="t-auth-bad")
        with caplog.at_level(logging.DEBUG, logger="monitor.sources.mqtt"):
            bad.start()
            try:
                with pytest.raises(SourceError) as err:
                    bad.wait_connected()
            finally:
                bad.stop()
        message = str(err.value)
        assert (
            f"MQTT broker 127.0.0.1:{server.port} refused the connection for user station-monitor" in message
        )
        assert re.search(r": (Not authorized|Bad user name or password) \(check mqtt.username", message)
        assert "wrong-horse-battery" not in message + caplog.text + repr(bad) + repr(bad_cfg)
        assert "refused the connection" in caplog.text
    finally:
        server.stop()


def test_tls_with_a_test_ca(tmp_path: Path) -> None:
    certs = make_ca(tmp_path / "pki")
    server = Mosquitto(tmp_path / "tls", tls=certs)
    server.start()
    try:
        cfg = mqtt_config(server.port, tls={"ca_file": str(certs["ca"])}, subscriptions=SUBS)
        link = MqttLink(cfg, "ps-1", client_id="t-tls")
        source = MqttSource(link, cfg, "ps-1")
        link.start()
        link.wait_connected()
        peer = Peer(server.port, "t-tls-peer", ca=certs["ca"])
        try:
            peer.publish("plant/outfall/ph", b"8.0")
            (sample,) = asyncio.run(collect(source, lambda got: len(got) >= 1))
            assert sample.value == 8.0
        finally:
            peer.close()
            link.stop()

        wrong = mqtt_config(server.port, tls={"ca_file": str(certs["other_ca"])})
        untrusting = MqttLink(wrong, "ps-1", client_id="t-tls-wrong-ca")
        untrusting.start()
        try:
            with pytest.raises(SourceError, match=rf"127.0.0.1:{server.port}: .*certificate verify failed"):
                untrusting.wait_connected()
        finally:
            untrusting.stop()
    finally:
        server.stop()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_messages_published_while_disconnected_are_all_delivered(mosquitto: Mosquitto, protocol: str) -> None:
    cfg = mqtt_config(mosquitto.port, protocol=protocol, subscriptions=SUBS[:1])
    client_id = f"t-session-{protocol}"
    first = MqttLink(cfg, "ps-1", client_id=client_id)
    source = MqttSource(first, cfg, "ps-1")
    first.start()
    first.wait_connected()
    peer = Peer(mosquitto.port, f"t-session-peer-{protocol}")
    try:
        peer.publish("plant/outfall/ph", b"7.0")
        asyncio.run(collect(source, lambda got: len(got) >= 1))
        first.stop()  # the daemon goes away; its session stays on the broker

        peer.publish_many((f"plant/p{i}/ph", f"{i}".encode()) for i in range(500))

        second = MqttLink(cfg, "ps-1", client_id=client_id)
        again = MqttSource(second, cfg, "ps-1")
        second.start()
        try:
            samples = asyncio.run(collect(again, lambda got: len(got) >= 500))
            assert sorted(int(s.value) for s in samples) == list(range(500))
            assert [s.sensor for s in samples[:3]] == ["p0.ph", "p1.ph", "p2.ph"]  # in order
        finally:
            second.stop()
    finally:
        peer.close()


def _restart(broker: Mosquitto, forget: bool) -> None:
    broker.stop()
    if forget:  # a broker that lost its persistence file: our session and subscription are gone
        (broker.workdir / "mosquitto.db").unlink()
    broker.start()


@pytest.mark.parametrize("forget", [False, True], ids=["broker-keeps-session", "broker-forgets-session"])
def test_broker_restart_mid_stream_resumes_without_help(broker: Mosquitto, forget: bool) -> None:
    cfg = mqtt_config(broker.port, subscriptions=SUBS[:1])
    link = MqttLink(cfg, "ps-1", client_id="t-restart", reconnect_min=1, reconnect_max=2)
    source = MqttSource(link, cfg, "ps-1")
    status = Peer(broker.port, "t-restart-watch")
    link.start()
    link.wait_connected()

    async def scenario() -> list[Sample]:
        got: list[Sample] = []
        task = asyncio.create_task(source.run(acking(got, Sample)))
        for i in range(20):
            await asyncio.to_thread(_publish_one, broker.port, f"before-{i}", f"{i}")
        await until(lambda: len(got) >= 20)
        await asyncio.to_thread(_restart, broker, forget)
        # A broker that forgot its sessions delivers nothing to us until it has our
        # subscriptions again: publish after it acknowledged them (they are re-made on connect).
        await until(lambda: link.subscribed, timeout=30)
        for i in range(20):
            await asyncio.to_thread(_publish_one, broker.port, f"after-{i}", f"{100 + i}")
        await until(lambda: len({s.value for s in got}) >= 40)
        task.cancel()
        return got

    try:
        samples = asyncio.run(scenario())
        # QoS 1 is at least once: the restarted broker may deliver again what it had not
        # recorded as acknowledged, so count distinct readings; none may be missing.
        assert sorted({int(s.value) for s in samples}) == [*range(20), *range(100, 120)]
    finally:
        link.stop()
        status.close()


def _publish_one(port: int, client_id: str, payload: str) -> None:
    peer = Peer(port, f"t-restart-{client_id}")
    try:
        peer.publish("plant/outfall/ph", payload)
    finally:
        peer.close()


LINK_PROCESS = """
import sys, threading
from monitor.config import Mqtt
from monitor.sources.mqtt import MqttLink
link = MqttLink(Mqtt(host="127.0.0.1", port=int(sys.argv[1])), "ps-9", client_id="t-will")
link.start()
link.wait_connected()
print("up", flush=True)
threading.Event().wait()
"""


def test_birth_and_last_will_on_the_status_topic(mosquitto: Mosquitto, repo_root: Path) -> None:
    watcher = Peer(mosquitto.port, "t-will-watch")
    watcher.subscribe("station-monitor/ps-9/status")
    proc = subprocess.Popen(
        [sys.executable, "-c", LINK_PROCESS, str(mosquitto.port)],
        cwd=repo_root, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(repo_root)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        wait_until(lambda: b"online" in [m[1] for m in watcher.received()], what="birth message")
        proc.send_signal(signal.SIGKILL)  # the gateway dies without a goodbye
        proc.wait(timeout=10)
        wait_until(lambda: watcher.received()[-1][1] == b"offline", what="last will")
        late = Peer(mosquitto.port, "t-will-late")
        late.subscribe("station-monitor/ps-9/status")
        wait_until(
            lambda: late.received() == [("station-monitor/ps-9/status", b"offline", True)], what="retained"
        )
        late.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        watcher.close()


def test_broker_outage_raises_and_clears_comm_loss_on_the_fed_sensors(broker: Mosquitto) -> None:
    cfg = mqtt_config(broker.port, subscriptions=SUBS, comm_loss_after="0.3s")
    link = MqttLink(cfg, "ps-1", client_id="t-comm-loss", reconnect_min=1, reconnect_max=1)
    source = MqttSource(link, cfg, "ps-1", sensors=[*SENSORS, "outfall.temp"])
    assert source.fed == ["lab.temp", "mill.ph", "outfall.flow", "outfall.ph"]  # not outfall.temp
    link.start()
    link.wait_connected()

    async def scenario() -> list[Condition]:
        got: list[Condition] = []
        task = asyncio.create_task(source.run(acking(got, Condition)))
        await asyncio.to_thread(broker.stop)
        await until(lambda: len(got) == 4)
        await asyncio.to_thread(broker.start)
        await until(lambda: len(got) == 8, timeout=30)
        task.cancel()
        return got

    try:
        conditions = asyncio.run(scenario())
    finally:
        link.stop()
    assert {(c.sensor, c.rule, c.state) for c in conditions[:4]} == {
        (s, Rule.COMM_LOSS, ConditionState.ACTIVE) for s in source.fed
    }
    assert f"MQTT broker 127.0.0.1:{broker.port}: no broker for" in conditions[0].message
    # The page and the log line read this as a time without the broker, not in the sensor's unit.
    c = conditions[0]
    shown = figures(
        Alarm(c.sensor, c.rule, AlarmState.UNACK, Priority.MEDIUM, c.value, c.limit, "", c.message), "gpm"
    )
    assert shown.startswith("no broker for ") and shown.endswith(", alarm after 0 s"), shown
    assert {c.state for c in conditions[4:]} == {ConditionState.CLEARED}
