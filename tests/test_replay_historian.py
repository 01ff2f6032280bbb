"""`monitor replay --from-influx`: the golden case written to the real InfluxDB 1.6 and
VictoriaMetrics by `monitor replay`, read back in chunks, gives the same events."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from monitor.config import Config, load_config
from monitor.engine import Engine, replay_steps
from monitor.model import ManualClock
from monitor.sources import historian
from monitor.sources.replay import Samples, merge, read_csv
from tests.services import InfluxDB1, VictoriaMetrics

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "replay" / "station-day"
START, END = "2026-06-03T00:00:00Z", "2026-06-04T00:00:00Z"


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "monitor", "replay", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def station_config(tmp_path: Path, influx: dict[str, Any]) -> tuple[Path, Config]:
    raw: dict[str, Any] = yaml.safe_load((CASE / "config.yaml").read_text())
    raw["station"]["id"] = f"ps-{uuid.uuid4().hex[:8]}"  # the servers are shared by the session
    raw["state_dir"] = str(tmp_path / "state")
    raw["influx"] = influx
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def stored(config: Config) -> Samples:
    """What `monitor replay` accepted from the golden input: what the historian holds."""
    engine = Engine(config.rules, ManualClock())
    samples, _ = read_csv(CASE / "input.csv", engine.sensors)
    parts = []
    for step in replay_steps(engine, samples.sensor, samples.time, samples.value, samples.quality):
        ok = step.accepted
        parts.append(
            Samples(step.sensor[ok].astype(np.int32), step.time[ok], step.value[ok], step.quality[ok])
        )
    return Samples.concat(parts)


def write_then_read_back(tmp_path: Path, config_path: Path, flush: Any = None) -> None:
    written = replay(
        "--config", str(config_path), "--input", str(CASE / "input.csv"), "--events", "/dev/null"
    )
    assert written.returncode == 0, written.stderr
    assert "outbox drained" in written.stdout
    if flush is not None:
        flush()
    out = tmp_path / "events.jsonl"
    args = [
        "--config",
        str(config_path),
        "--from-influx",
        "--start",
        START,
        "--end",
        END,
        "--events",
        str(out),
    ]
    back = replay(*args)
    assert back.returncode == 0, back.stderr
    assert events(out) == events(CASE / "events.jsonl")
    assert "replay: 592 samples, 3 sensors, 8 events" in back.stdout
    assert "outbox" not in back.stdout  # nothing written back to the historian


def test_influxdb_1_history_replays_to_the_golden_events(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    db = f"h{uuid.uuid4().hex[:8]}"
    influxdb1.query(f"CREATE DATABASE {db}")
    config_path, _ = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
    write_then_read_back(tmp_path, config_path)


def test_victoriametrics_history_replays_to_the_golden_events(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    influx = {"url": victoria.url, "org": "barton", "bucket": "replay"}
    config_path, _ = station_config(tmp_path, influx)
    write_then_read_back(tmp_path, config_path, flush=lambda: victoria.export('{__name__="none"}'))


@pytest.mark.parametrize("kind", ["influxql", "victoriametrics"])
def test_history_read_in_small_chunks_is_the_stored_samples(
    tmp_path: Path,
    influxdb1: InfluxDB1,
    victoria: VictoriaMetrics,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    if kind == "influxql":
        db = f"h{uuid.uuid4().hex[:8]}"
        influxdb1.query(f"CREATE DATABASE {db}")
        config_path, config = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
    else:
        influx = {"url": victoria.url, "org": "barton", "bucket": "replay"}
        config_path, config = station_config(tmp_path, influx)
    written = replay(
        "--config", str(config_path), "--input", str(CASE / "input.csv"), "--events", "/dev/null"
    )
    assert written.returncode == 0, written.stderr
    victoria.export('{__name__="none"}')  # flush
    monkeypatch.setattr(historian, "CHUNK_POINTS", 37)
    monkeypatch.setattr(historian, "WINDOW_S", 1800.0)
    history = historian.open_history(config, 1780444800.0, 1780531200.0, kind)
    batches = list(merge([history]))
    assert len(batches) > 5
    got, want = Samples.concat(batches), stored(config)
    order_got = np.lexsort((got.sensor, got.time))
    order_want = np.lexsort((want.sensor, want.time))
    assert got.time[order_got].tolist() == want.time[order_want].tolist()
    assert got.sensor[order_got].tolist() == want.sensor[order_want].tolist()
    np.testing.assert_array_equal(got.value[order_got], want.value[order_want])
    assert got.quality[order_got].tolist() == want.quality[order_want].tolist()


def test_from_influx_without_an_influx_section_or_range_says_so(tmp_path: Path) -> None:
    no_range = replay("--config", str(CASE / "config.yaml"), "--from-influx", "--events", "/dev/null")
    assert no_range.returncode == 2 and "--from-influx needs --start and a later --end" in no_range.stderr
    args = ["--config", str(CASE / "config.yaml"), "--from-influx", "--start", START, "--end", END]
    no_influx = replay(*args, "--events", "/dev/null")
    assert no_influx.returncode == 1
    assert "needs an `influx` section" in no_influx.stderr and "Traceback" not in no_influx.stderr


def test_an_unreachable_historian_exits_1_with_a_line(tmp_path: Path) -> None:
    config_path, _ = station_config(tmp_path, {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"})
    args = [
        "--config",
        str(config_path),
        "--from-influx",
        "--start",
        START,
        "--end",
        END,
        "--events",
        "/dev/null",
    ]
    result = replay(*args)
    assert result.returncode == 1
    assert "cannot read the history" in result.stderr and "Traceback" not in result.stderr
