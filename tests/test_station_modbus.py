"""`monitor run`'s daemon polling the lift-station simulator over real Modbus TCP (pump run
feedback from a coil and a discrete input), then `monitor replay` of what it recorded: the same
pump figures and alarms. The station runs 200x faster than the wall clock (one shared clock)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from monitor.config import load_config
from monitor.daemon import Daemon
from monitor.model import Rule, ScaledClock
from monitor.sinks.pipeline import store_path
from monitor.sinks.store import SeriesStore
from simulators.lift_station import LiftStation, lift_server
from tests.services import free_port
from tests.test_station_live import ROOT, write_config

SPEED = 200.0


def report(config: Path, start: float, end: float) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "pumps", "report", "--config", str(config),
         "--start", repr(start), "--end", repr(end), "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_run_against_modbus_and_replay_of_its_recording_agree(tmp_path: Path) -> None:
    clock = ScaledClock(SPEED)
    # Pump 1 fails to start for the first 15 min: the lag pump covers, fail_to_start is raised.
    sim = LiftStation(clock.start, days=0.1, storm=None, failure=(0.0, 900.0), slug=None).run()
    port = free_port()
    live_cfg = write_config(tmp_path, "live")
    raw = yaml.safe_load(live_cfg.read_text(encoding="utf-8"))
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
                    {"sensor": "ps.flow", "register": "holding", "address": 2, "type": "FLOAT32"},
                    {"sensor": "mill.flow", "register": "holding", "address": 4, "type": "FLOAT32"},
                    {"sensor": "ps.pump1", "register": "coil", "address": 0, **bit},
                    {"sensor": "ps.pump2", "register": "discrete", "address": 0, **bit},
                ],
            }
        ]
    }
    live_cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = load_config(live_cfg)

    async def run() -> float:
        server = lift_server(sim, port, clock.now)
        await server.start()
        daemon = Daemon(config, clock)
        task = asyncio.create_task(daemon.run())
        deadline = time.monotonic() + 120
        try:
            # Until a fail-to-start alarm came and went and both pumps have cycled.
            while time.monotonic() < deadline:
                fail = daemon.alarms.get("ps.level", Rule.FAIL_TO_START)
                tracker = daemon.station.tracker
                assert tracker is not None
                if (
                    fail is not None
                    and not fail.active
                    and all(p.starts >= 2 for p in tracker.pumps.values())
                ):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError("the station never cycled through a fail to start")
            return clock.now()
        finally:
            daemon.stop()
            await task
            await server.stop()
            assert set(server.function_codes) <= {1, 2, 3, 4}  # read-only towards the device

    end = asyncio.run(run())
    # What `monitor run` recorded, as a replay CSV (derived ps.inflow too: replay computes it again).
    rows = ["time,sensor,value"]
    with SeriesStore(store_path(config)) as store:
        for sensor in store.sensors():
            rows += [f"{s.time!r},{sensor},{s.value!r}" for s in store.query(sensor)]
    csv = tmp_path / "recorded.csv"
    csv.write_text("\n".join(rows) + "\n", encoding="utf-8")
    replay_cfg = write_config(tmp_path, "replayed")
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--config", str(replay_cfg), "--input", str(csv),
         "--events", str(tmp_path / "ev.jsonl")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    live = report(live_cfg, clock.start, end + 60)
    assert live == report(replay_cfg, clock.start, end + 60)
    pumps = live["pumps"]
    assert isinstance(pumps, list) and all(p["starts"] >= 2 for p in pumps)
    events = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text(encoding="utf-8").splitlines()]
    assert any(e["rule"] == "fail_to_start" and e["state"] == "active" for e in events)
