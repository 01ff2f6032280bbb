"""MQTT packet size and handler failures against a real Mosquitto, on both protocols."""

from __future__ import annotations

import logging
import threading

import pytest

from monitor.sources.mqtt import MqttLink
from tests.mqtt_tools import Peer, mqtt_config
from tests.services import Mosquitto, wait_until

BIG = 8 << 20  # 8 MB against max_payload 64 KB


class Inbox:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.got: list[tuple[str, int]] = []

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.got.append((topic, len(payload)))

    def sizes(self) -> list[int]:
        with self.lock:
            return [n for _, n in self.got]


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_an_oversized_payload_is_refused_unread_and_not_sent_again(broker: Mosquitto, protocol: str) -> None:
    cfg = mqtt_config(broker.port, protocol=protocol, max_payload=65536)
    inbox = Inbox()
    link = MqttLink(cfg, "ps-1", client_id=f"guard-{protocol}")
    link.subscribe("plant/ph", 1, inbox)
    link.start()
    link.wait_connected()
    peer = Peer(broker.port, f"guard-peer-{protocol}")
    try:
        peer.publish("plant/ph", b"x" * BIG, qos=1)
        peer.publish("plant/ph", b"7.25", qos=1)
        wait_until(lambda: 4 in inbox.sizes(), timeout=20, what="the small message after the big one")
        assert max(inbox.sizes()) < 65536
        if protocol == "3.1.1":
            # 3.1.1 has no Maximum Packet Size: the broker sent it, the guard threw it away unread.
            assert link.oversized == 1
        else:
            # MQTT 5: the broker honoured Maximum Packet Size and never sent it.
            assert link.oversized == 0
        link.stop()
        # Same client id, persistent session: the refused message was acknowledged, not queued again.
        again = Inbox()
        link = MqttLink(cfg, "ps-1", client_id=f"guard-{protocol}")
        link.subscribe("plant/ph", 1, again)
        link.start()
        link.wait_connected()
        peer.publish("plant/ph", b"7.5", qos=1)
        wait_until(lambda: 3 in again.sizes(), timeout=20, what="a message after the reconnect")
        assert max(again.sizes()) < 65536 and link.oversized == 0
    finally:
        peer.close()
        link.stop()


def test_a_failing_handler_logs_one_traceback_per_topic_and_counts_each(
    broker: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = mqtt_config(broker.port)
    seen: list[bytes] = []

    def broken(topic: str, payload: bytes) -> None:
        seen.append(payload)
        raise RuntimeError("handler bug")

    link = MqttLink(cfg, "ps-1", client_id="guard-handler")
    link.subscribe("plant/#", 1, broken)
    link.start()
    link.wait_connected()
    peer = Peer(broker.port, "guard-handler-peer")
    try:
        with caplog.at_level(logging.DEBUG, logger="monitor.sources.mqtt"):
            peer.publish_many([("plant/ph", b"%d" % i) for i in range(20)] + [("plant/flow", b"1")])
            wait_until(lambda: link.handler_errors == 21, timeout=20, what="21 failed messages")
    finally:
        peer.close()
        link.stop()
    tracebacks = [r for r in caplog.records if r.exc_info and r.name == "monitor.sources.mqtt"]
    assert len(seen) == 21
    assert sorted(r.getMessage().split("topic ")[1].split(" ")[0] for r in tracebacks) == [
        "'plant/flow'",
        "'plant/ph'",
    ]
