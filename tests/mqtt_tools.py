"""Helpers for the MQTT tests: a plain paho client on the other side, a test CA, and
a way to run an ingest source until it has seen what a test waits for."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from monitor.config import Mqtt
from monitor.model import Condition, Sample
from monitor.sources.mqtt_ingest import MqttSource
from tests.services import wait_until


class Peer:
    """A plain paho client: what a field device, an HMI or an operator's phone would be."""

    def __init__(
        self,
        port: int,
        client_id: str,
        username: str | None = None,
        password: str | None = None,
        ca: Path | None = None,
    ) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        if username:
            self.client.username_pw_set(username, password)
        if ca:
            self.client.tls_set(ca_certs=str(ca))
        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self.subacks: list[int] = []
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subacks.append(mid)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def received(self) -> list[tuple[str, bytes, bool]]:
        with self._lock:
            return list(self.messages)

    def subscribe(self, topic: str, qos: int = 1) -> None:
        _rc, mid = self.client.subscribe(topic, qos)
        wait_until(lambda: mid in self.subacks, timeout=10, what=f"SUBACK for {topic}")

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=qos, retain=retain).wait_for_publish(timeout=10)

    def publish_many(self, items: Iterable[tuple[str, bytes]], qos: int = 1) -> None:
        infos = [self.client.publish(t, p, qos=qos) for t, p in items]
        for info in infos:
            info.wait_for_publish(timeout=30)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def mqtt_config(port: int, **kw: object) -> Mqtt:
    return Mqtt.model_validate({"host": "127.0.0.1", "port": port, **kw})


def acking(
    got: list[Any], kind: type
) -> Callable[[Sequence[Sample | Condition], Callable[[], None] | None], None]:
    """An emit for `MqttSource.run` that keeps items of `kind` and acknowledges at once."""

    def emit(items: Sequence[Sample | Condition], ack: Callable[[], None] | None) -> None:
        got.extend(i for i in items if isinstance(i, kind))
        if ack is not None:
            ack()

    return emit


async def collect(
    source: MqttSource, done: Callable[[list[Sample]], bool], timeout: float = 20.0
) -> list[Sample]:
    """Run `source` until `done(samples)` holds; fail after `timeout` seconds."""
    got: list[Sample] = []

    def emit(items: Iterable[Sample | Condition], ack: Callable[[], None] | None = None) -> None:
        got.extend(i for i in items if isinstance(i, Sample))
        if ack is not None:
            ack()  # stored (here: collected), so the broker may forget the messages

    task = asyncio.create_task(source.run(emit))
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done(got):
            if loop.time() > deadline:
                raise TimeoutError(f"timed out after {timeout}s; have {len(got)} samples")
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return got


def make_ca(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=station-monitor test CA",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "san.ext", "-out", "server.crt")  # fmt: skip
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=someone else",
        "-keyout", "other.key", "-out", "other.crt")  # fmt: skip
    return {
        "ca": d / "ca.crt",
        "cert": d / "server.crt",
        "key": d / "server.key",
        "other_ca": d / "other.crt",
    }
