"""`monitor run`'s daemon polling a Modbus TCP station whose high-level float bounces at the
spill crest while the level reads live just under `overflow`, its call-out mailing a real SMTP
server: one spill is one page (tests/test_station_overflow_crest.py has the tracker's side).
The station runs 200x faster than the wall clock (one shared clock)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import yaml

from monitor.config import load_config
from monitor.daemon import Daemon
from monitor.model import ScaledClock
from simulators.modbus_server import StationServer, encode
from simulators.scenarios import Station
from tests.services import free_port
from tests.smtp import MailServer
from tests.test_callout import ALICE, certs, raw_config, smtp
from tests.test_station_live import write_config

__all__ = ["certs", "smtp"]  # the call-out tests' fixtures: a real SMTP server

SPEED = 200.0
BOUNCES = 8
ON, OFF = 240.0, 40.0  # the float on 4 min, then off for 40 s (a few 10-s polls: a slow poll misses none)
BEGIN = 60.0  # station seconds after the clock's start


class CrestServer(StationServer):
    """The wet well at the crest: level 8.95 ft (under the 9 ft setpoint) in holding 0, the
    float switch in coil 1 bouncing `BOUNCES` times, then off and the level down to 8 ft."""

    def __init__(self, clock: ScaledClock, port: int) -> None:
        super().__init__({1: Station(seed=1)}, port=port, clock=clock.now, update_interval=0)
        self.origin = clock.origin

    def float_on(self, t: float) -> bool:
        p = t - self.origin - BEGIN
        return 0.0 <= p < BOUNCES * (ON + OFF) and p % (ON + OFF) < ON

    def _image(self, unit: int) -> dict[str, list[tuple[int, list[int]]]]:
        t = self.clock()
        over = t - self.origin - BEGIN > BOUNCES * (ON + OFF) + 30.0
        level = 8.0 if over else 8.95
        on = int(self.float_on(t))
        # Coils are packed 16 to a word: coil 0 (pump 1, off) is bit 0, coil 1 (the float) bit 1.
        return {"holding": [(0, encode(level, "FLOAT32"))], "input": [], "coil": [(0, [on << 1])],
                "discrete": [(0, [0])]}  # fmt: skip


def _config(tmp_path: Path, port: int, smtp_port: int) -> Path:
    raw: dict[str, Any] = yaml.safe_load(write_config(tmp_path, "live").read_text(encoding="utf-8"))
    raw["sensors"].append({"id": "ps.float", "kind": "status", "name": "High-level float"})
    raw["wet_well"]["overflow_switch"] = "ps.float"
    raw["notify"] = raw_config(tmp_path, smtp_port, delay="1h", match={"rules": ["overflow"]})["notify"]
    bit = {"type": "BIT"}
    raw["modbus"] = {
        "devices": [
            {
                "name": "plc",
                "host": "127.0.0.1",
                "port": port,
                "poll_interval": "50ms",  # 10 station seconds
                "fields": [
                    {"sensor": "ps.level", "register": "holding", "address": 0, "type": "FLOAT32"},
                    {"sensor": "ps.pump1", "register": "coil", "address": 0, **bit},
                    {"sensor": "ps.float", "register": "coil", "address": 1, **bit},
                    {"sensor": "ps.pump2", "register": "discrete", "address": 0, **bit},
                ],
            }
        ]
    }
    path = tmp_path / "crest.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_the_daemon_pages_once_for_a_float_bouncing_at_the_crest(tmp_path: Path, smtp: MailServer) -> None:
    """Before: eight overflow records and eight mails to the person on call (each clear ended
    the escalation, each on began one). Now eight records, seven continuing the first, and
    one mail; each of the seven activations resumes the escalation the clear before ended
    unacknowledged (Bob's step due an hour after Alice's page, not yet), each ended by its
    own clear."""
    clock = ScaledClock(SPEED)
    port = free_port()
    config = load_config(_config(tmp_path, port, smtp.port))

    async def run() -> tuple[list[Any], list[dict[str, Any]]]:
        server = CrestServer(clock, port)
        await server.start()
        daemon = Daemon(config, clock)
        task = asyncio.create_task(daemon.run())
        deadline = time.monotonic() + 60
        recs: list[Any] = []
        escs: list[dict[str, Any]] = []
        try:
            while time.monotonic() < deadline:
                tracker, callout = daemon.station.tracker, daemon.callout
                assert tracker is not None and tracker.store is not None and callout is not None
                recs = tracker.store.overflows(clock.origin, clock.now() + 60)
                escs = cast(list[dict[str, Any]], callout.status()["escalations"])
                told = [m for e in escs for m in e["told"]]
                if (
                    len(recs) >= BOUNCES
                    and all(r.end is not None for r in recs)
                    and len(escs) >= BOUNCES
                    and all(m["state"] != "pending" for m in told)
                ):
                    return recs, escs
                await asyncio.sleep(0.2)
            raise AssertionError(f"the float's bounces never all ended: {recs} {escs}")
        finally:
            daemon.stop()
            await task
            await server.stop()

    recs, escs = asyncio.run(run())
    assert len(recs) == BOUNCES
    assert [r.continues for r in recs] == [None] + [recs[0].start] * (BOUNCES - 1)
    assert [e["status"] for e in escs] == ["cleared"] * BOUNCES
    assert len(smtp.to(ALICE)) == 1
