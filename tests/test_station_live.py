"""The daemon's live path gives the station figures replay gives, and survives a restart.

The daemon is fed as a poller feeds it (one batch per poll, every sensor read at that
time), on a manual clock; `monitor replay` reads the same samples from a CSV.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from monitor.config import load_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from simulators.lift_station import LiftStation

pytestmark = pytest.mark.integration  # whole commands over golden cases: `make test`, not `make check`

ROOT = Path(__file__).resolve().parent.parent
START = 1_767_225_600.0
DAY = 86400.0


def write_config(tmp: Path, state: str) -> Path:
    raw = yaml.safe_load((ROOT / "config" / "pump-station.yaml").read_text(encoding="utf-8"))
    raw["state_dir"] = str(tmp / state)
    raw["profile"] = str(ROOT / "monitor" / "profiles" / "barton-139.yaml")
    raw["console"] = {"enabled": False}
    path = tmp / f"{state}.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def report(config: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "pumps", "report", "--config", str(config),
         "--start", "2026-01-01T00:00:00Z", "--end", "2026-01-03T00:00:00Z", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def polls(csv: Path) -> list[list[Sample]]:
    by_time: dict[float, list[Sample]] = defaultdict(list)
    for line in csv.read_text(encoding="utf-8").splitlines()[1:]:
        t, sensor, value = line.split(",")
        by_time[float(t)].append(Sample(sensor, float(t), float(value)))
    return [by_time[t] for t in sorted(by_time)]


def test_live_and_replay_record_the_same_runs_overflows_and_alarms(tmp_path: Path) -> None:
    sim = LiftStation(
        START, days=1.5, storm=(0.9 * DAY, 3 * 3600.0, 1150.0), failure=(0.3 * DAY, 4 * 3600.0), slug=None
    ).run()
    csv = tmp_path / "s.csv"
    sim.write_csv(csv, 10.0)
    replayed = write_config(tmp_path, "replayed")
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--config", str(replayed), "--input", str(csv),
         "--events", str(tmp_path / "ev.jsonl")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    events = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text(encoding="utf-8").splitlines()]

    live_config = write_config(tmp_path, "live")
    batches = polls(csv)
    half = len(batches) // 2
    # Stopped half way (an open run or overflow stays open on disk), then started again.
    for part in (batches[:half], batches[half:]):
        clock = ManualClock(part[0][0].time)
        daemon = Daemon(load_config(live_config), clock)
        try:
            for batch in part:
                clock.set(batch[0].time)
                daemon.pipeline.process(batch)
            daemon.station.close()
        finally:
            daemon.meters.close()
            daemon.alarms.close()
            daemon.sink.close()
    live = report(live_config)
    assert live == report(replayed)
    pumps = live["pumps"]
    assert isinstance(pumps, list) and live["overflows"]
    assert all(p["starts"] > 50 for p in pumps)

    # The alarm journal holds the station's alarms as the replay's events have them.
    daemon = Daemon(load_config(live_config), ManualClock(batches[-1][0].time))
    try:
        fail = daemon.alarms.get("ps.level", Rule.FAIL_TO_START)
        overflow = daemon.alarms.get("ps.level", Rule.OVERFLOW)
        assert fail is not None and overflow is not None
        assert str(overflow.priority) == "critical" and not overflow.active
        raised = [e for e in events if e["rule"] == "fail_to_start" and e["state"] == "active"]
        assert raised and fail.activated_at is not None
        assert json.loads(json.dumps(fail.to_json()))["activated_at"] == raised[-1]["time"]
    finally:
        daemon.station.close()
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()
