"""The fleet view on a live broker: one listening link, and commands sent per person."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from monitor.config.fleet import FleetConfig
from monitor.fleet.view import FleetView
from monitor.model import Rule
from monitor.sources.mqtt import CommandOutcome, MqttLink, send_command


class FleetService:
    """Subscribes to `<prefix>/+/status`, `/alarms/#` and `/events`; serves snapshots.

    paho calls `handle` on its own thread, the web app reads on the event loop: one
    lock keeps the view whole for each."""

    def __init__(self, config: FleetConfig, client_id: str | None = None) -> None:
        self.config = config
        prefix = config.mqtt.topic_prefix
        self.view = FleetView(prefix, config.fleet.consoles, max_stations=config.fleet.max_stations)
        self._lock = threading.Lock()
        self.link = MqttLink(
            config.mqtt,
            "fleet",
            client_id=client_id or config.mqtt.client_id or f"station-monitor-fleet-{time.time_ns() % 10**9}",
            announce=False,
        )
        for suffix in ("status", "bridge", "alarms/#", "events"):
            self.link.subscribe(f"{prefix}/+/{suffix}", 1, self._on_message)

    def _on_message(self, topic: str, payload: bytes) -> None:  # paho's thread
        with self._lock:
            self.view.handle(topic, payload, time.time())

    def start(self) -> None:
        self.link.start()

    def stop(self) -> None:
        self.link.stop()

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        with self._lock:
            self.view.connection(self.link.connected)
            return self.view.snapshot(time.time() if now is None else now)

    async def acknowledge(
        self, station: str, sensor: str, rule: Rule, user: str, password: str, note: str | None
    ) -> CommandOutcome:
        """Send `ack` to `station` as `user`; the broker's ACL decides, the station journals."""
        command: dict[str, Any] = {"action": "ack", "sensor": sensor, "rule": str(rule)}
        if note:
            command["note"] = note
        return await asyncio.to_thread(
            send_command,
            self.config.mqtt,
            station,
            user,
            password,
            command,
            self.config.fleet.command_timeout,
        )
