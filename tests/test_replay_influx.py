"""`monitor replay` with an `influx` section: samples and alarm transitions through the outbox."""

from __future__ import annotations

import asyncio
import io
import json
import math
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from monitor.commands.replay import replay_to_influx
from monitor.config import Config, load_config
from monitor.engine import Engine, ReplayStep, replay_steps
from monitor.model import ManualClock
from monitor.sinks.pipeline import open_sink
from monitor.sources.replay import read_csv
from tests.cli import run_monitor
from tests.services import VictoriaMetrics, wait_until

CASE = Path(__file__).parent / "cases" / "replay" / "station-day"

Points = Counter[tuple[str, int, float]]


def _config(tmp_path: Path, url: str) -> tuple[Path, Config]:
    raw: dict[str, Any] = yaml.safe_load((CASE / "config.yaml").read_text())
    raw["state_dir"] = str(tmp_path / "state")
    raw["influx"] = {"url": url, "org": "barton", "bucket": "replay", "batch_size": 100}
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def _steps(config: Config, batch: int = 1_000_000) -> Iterator[ReplayStep]:
    engine = Engine(config.rules, ManualClock())
    samples, _ = read_csv(CASE / "input.csv", engine.sensors)
    yield from replay_steps(engine, samples.sensor, samples.time, samples.value, samples.quality, batch)


def _expected(config: Config) -> Points:
    """What the engine accepted from the golden input as GOOD, with a finite value: what must
    arrive with a value (a bad reading goes out with its quality only, issue 12)."""
    names = tuple(config.rules)
    want: Points = Counter()
    for step in _steps(config):
        rows = zip(step.sensor, step.time, step.value, step.accepted, step.quality, strict=True)
        for i, t, v, ok, q in rows:
            if ok and q == 0 and math.isfinite(v):
                want[(names[int(i)], round(float(t) * 1000), float(v))] += 1
    return want


def _got(vm: VictoriaMetrics) -> Points:
    got: Points = Counter()
    for s in vm.export('{__name__="sensor_value",station="ps-1"}'):
        for t, v in zip(s["timestamps"], s["values"], strict=True):
            got[(s["metric"]["sensor"], t, v)] += 1
    return got


def _replay(
    config_path: Path, tmp_path: Path, repo_root: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = ["replay", "--config", str(config_path)]
    cmd += ["--input", str(CASE / "input.csv"), "--events", str(tmp_path / "events.jsonl"), *extra]
    return run_monitor(*cmd, cwd=repo_root)


def test_replay_writes_samples_and_alarm_transitions(tmp_path: Path, repo_root: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")
    vm.start()
    try:
        config_path, config = _config(tmp_path, vm.url)
        done = _replay(config_path, tmp_path, repo_root)
        assert done.returncode == 0, done.stderr
        assert "outbox drained" in done.stdout
        assert _got(vm) == _expected(config)
        events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert events == [json.loads(x) for x in (CASE / "events.jsonl").read_text().splitlines()]
        transitions: Points = Counter()
        for s in vm.export('{__name__="alarm_active"}'):
            for v in s["values"]:
                transitions[(s["metric"]["sensor"], s["metric"]["rule"], float(v))] += 1
        want = Counter((e["sensor"], e["rule"], float(e["state"] == "active")) for e in events)
        assert transitions == want
    finally:
        vm.stop()


def test_replay_with_the_server_away_exits_0_and_leaves_the_points(tmp_path: Path, repo_root: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")  # not started yet: its port refuses connections
    config_path, config = _config(tmp_path, vm.url)
    # Incidents (issue 16) add their own points to the outbox; this test counts samples and
    # transitions, so it leaves them out.
    done = _replay(config_path, tmp_path, repo_root, "--drain-timeout", "1", "--no-incidents")
    assert done.returncode == 0, done.stderr
    want = _expected(config)
    steps = list(_steps(config))
    queued = sum(int(s.accepted.sum()) + len(s.conditions) for s in steps)  # samples and transitions
    assert f"{queued} point(s) remain in the outbox" in done.stderr
    assert "monitor outbox drain" in done.stderr
    vm.start()
    try:
        delivered = run_monitor("outbox", "drain", "--config", str(config_path), cwd=repo_root)
        assert delivered.returncode == 0, delivered.stderr
        assert _got(vm) == want
    finally:
        vm.stop()


def test_server_stopped_for_part_of_a_replay_every_point_arrives_once(tmp_path: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")  # no dedup: a repeat would show
    vm.start()
    try:
        _, config = _config(tmp_path, vm.url)
        sink = open_sink(config)
        assert sink.drainer is not None
        drainer = sink.drainer
        drainer.backoff.initial, drainer.backoff.maximum = 0.05, 0.2
        drainer.flush_interval = 0.01
        restarted = threading.Event()

        def restart_after_failures() -> None:
            wait_until(lambda: drainer.stats.failures >= 2, timeout=60, what="failed attempts")
            vm.start()
            restarted.set()

        def steps() -> Iterator[ReplayStep]:
            for k, step in enumerate(_steps(config, batch=40)):
                if k == 3:
                    vm.stop()  # the link drops a few batches into the replay ...
                    threading.Thread(target=restart_after_failures, daemon=True).start()
                yield step  # ... and comes back once the drainer has met it, mid-replay or at the drain

        events, left = asyncio.run(replay_to_influx(steps(), tuple(config.rules), io.StringIO(), sink, 60))
        sink.close()
        assert restarted.is_set()
        assert left == 0 and events > 0
        assert _got(vm) == _expected(config)  # every point, exactly once
    finally:
        vm.stop()
