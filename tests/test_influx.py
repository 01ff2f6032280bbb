"""Round trips through real servers: v2 API into VictoriaMetrics, v1 into InfluxDB 1.6."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from pathlib import Path

import pytest

from monitor.model import Condition, ConditionState, Quality, Rule, Sample
from monitor.sinks.pipeline import open_sink
from tests.cli import run_monitor
from tests.services import InfluxDB1, VictoriaMetrics
from tests.sink_config import SENSORS, write_config

T0 = 1_700_000_000.0


def _samples(n: int) -> list[Sample]:
    """n samples per sensor, 1 s apart, ms-resolution times and awkward floats."""
    out = []
    for k in range(n):
        for j, s in enumerate(SENSORS):
            value = (k * 0.1 + j) / 3.0 if k % 17 else -0.0 + j * 1e-9
            out.append(Sample(s["id"], T0 + k + 0.125 * j, value))
    out.append(Sample("outfall.oil", T0 + n, math.nan, Quality.COMM_FAILURE))
    return out


def _expected(samples: list[Sample]) -> dict[str, dict[int, float]]:
    want: dict[str, dict[int, float]] = defaultdict(dict)
    for s in samples:
        if not math.isnan(s.value):
            want[s.sensor][round(s.time * 1000)] = s.value
    return want


def test_v2_round_trip_into_victoriametrics(tmp_path: Path, victoria: VictoriaMetrics) -> None:
    _, config = write_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "b"}, station="rt-v2")
    before = victoria.lines_taken()
    samples = _samples(300)
    cond = Condition(T0 + 5, "outfall.ph", Rule.HIGH, ConditionState.ACTIVE, 9.5, 9.0, "§139-15 C(3)")
    sink = open_sink(config)
    sink.write_samples(samples)
    sink.write_conditions([cond])
    sink.write_meter("outfall.flow", T0, 1234.5, 10.25)
    assert asyncio.run(sink.drain(30)) == 0
    sink.close()
    assert sink.drainer is not None
    victoria.wait_for_lines(before + sink.drainer.stats.written)

    got: dict[str, dict[int, float]] = defaultdict(dict)
    for series in victoria.export('{__name__="sensor_value",station="rt-v2"}'):
        assert series["metric"]["kind"] in {"flow", "ph", "temperature", "concentration"}
        for t, v in zip(series["timestamps"], series["values"], strict=True):
            got[series["metric"]["sensor"]][t] = v
    want = _expected(samples)
    assert got.keys() == want.keys()
    for sensor, points in want.items():
        assert got[sensor].keys() == points.keys(), sensor
        # VictoriaMetrics keeps 12 significant decimal digits (its storage format); InfluxDB is exact.
        for t, v in points.items():
            assert math.isclose(got[sensor][t], v, rel_tol=1e-11), (sensor, t, got[sensor][t], v)
    (quality,) = [
        s
        for s in victoria.export('{__name__="sensor_quality",station="rt-v2",sensor="outfall.oil"}')
        if 2 in s["values"]
    ]
    assert quality["timestamps"][quality["values"].index(2)] == round((T0 + 300) * 1000)
    (active,) = victoria.export('{__name__="alarm_active",station="rt-v2",sensor="outfall.ph"}')
    assert active["metric"]["rule"] == "high" and active["metric"]["priority"] == "high"
    assert active["metric"]["citation"] == "§139-15 C(3)"
    assert active["values"] == [1]
    (limit,) = victoria.export('{__name__="alarm_limit",station="rt-v2"}')
    assert limit["values"] == [9.0]
    (consumption,) = victoria.export('{__name__="meter_consumption_ft3",station="rt-v2"}')
    assert consumption["values"] == [10.25]


def test_v1_round_trip_into_influxdb_1(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    influxdb1.query("CREATE DATABASE rt_v1")
    _, config = write_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": "rt_v1"})
    samples = _samples(200)
    sink = open_sink(config)
    sink.write_samples(samples)
    sink.write_conditions(
        [Condition(T0 + 9, "outfall.temp", Rule.HIGH, ConditionState.CLEARED, 140.0, 149.0, "§139-15 D(1)")]
    )
    assert asyncio.run(sink.drain(30)) == 0
    sink.close()

    result = influxdb1.query('SELECT "value" FROM "sensor" GROUP BY "sensor", "unit", "kind"', db="rt_v1")
    got: dict[str, dict[int, float]] = defaultdict(dict)
    for series in result["results"][0]["series"]:
        for t, v in series["values"]:
            got[series["tags"]["sensor"]][t] = v
    assert got == _expected(samples)
    units = {s["tags"]["sensor"]: s["tags"]["unit"] for s in result["results"][0]["series"]}
    assert units["outfall.temp"] == "degF" and units["outfall.ph"] == "pH"
    alarm = influxdb1.query('SELECT "active", "value", "limit" FROM "alarm"', db="rt_v1")
    assert alarm["results"][0]["series"][0]["values"] == [[round((T0 + 9) * 1000), 0, 140.0, 149.0]]


def test_malformed_point_goes_to_dead_letters_while_the_rest_arrive(
    tmp_path: Path, influxdb1: InfluxDB1, repo_root: Path
) -> None:
    """InfluxDB 1.6 answers 400 to a bad line (VictoriaMetrics would answer 204)."""
    influxdb1.query("CREATE DATABASE dead")
    config_path, config = write_config(
        tmp_path, {"url": influxdb1.url, "api": "v1", "database": "dead", "batch_size": 50}
    )
    sink = open_sink(config)
    assert sink.outbox is not None
    good = [f"sensor,sensor=s{i % 5} value={i}.0 {i}000000000" for i in range(1, 121)]
    bad = "sensor,sensor=s1 value=not-a-number 77000000001"
    conflict = 'sensor,sensor=s2 value="a string" 88000000001'  # type conflict with the float field
    sink.outbox.append([*good[:60], bad, *good[60:100], conflict, *good[100:]])
    assert asyncio.run(sink.drain(30)) == 0
    dead = sink.outbox.dead_letters()
    stats = sink.outbox.stats()
    sink.close()
    assert sorted(d.line for d in dead) == sorted([bad, conflict])
    assert all(d.status == 400 for d in dead)
    assert any("unable to parse" in d.reason for d in dead)
    assert any("conflict" in d.reason for d in dead)
    assert (stats.pending, stats.dead_letters) == (0, 2)
    count = influxdb1.query('SELECT COUNT("value") FROM "sensor"', db="dead")
    assert count["results"][0]["series"][0]["values"][0][1] == 120
    status = run_monitor(
        "outbox", "status", "--config", str(config_path), "--dead-letters", "5", cwd=repo_root
    )
    assert status.returncode == 0, status.stderr
    assert "dead letters    2" in status.stdout
    assert "HTTP 400" in status.stdout and bad in status.stdout and conflict in status.stdout


def test_v1_with_username_and_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real InfluxDB 1.6 with auth on: credentials go in the Authorization header."""
    server = InfluxDB1(tmp_path / "influx-auth", auth=True)
    server.start()
    try:
        server.query("CREATE USER admin WITH PASSWORD 's3cret' WITH ALL PRIVILEGES")
        server.query("CREATE DATABASE secured", auth=("admin", "s3cret"))
        monkeypatch.setenv("INFLUX_PW", "s3cret")
        influx = {"url": server.url, "api": "v1", "database": "secured", "username": "admin"}
        _, config = write_config(tmp_path, {**influx, "password": "${INFLUX_PW}"})
        sink = open_sink(config)
        sink.write_samples([Sample("outfall.ph", T0, 7.25)])
        assert asyncio.run(sink.drain(10)) == 0
        sink.close()
        assert "s3cret" not in (sink.drainer.writer.target if sink.drainer else "")
        got = server.query('SELECT "value" FROM "sensor"', db="secured", auth=("admin", "s3cret"))
        assert got["results"][0]["series"][0]["values"] == [[round(T0 * 1000), 7.25]]
        monkeypatch.setenv("INFLUX_PW", "wrong")
        _, config = write_config(tmp_path / "wrong", {**influx, "password": "${INFLUX_PW}"})
        sink = open_sink(config)
        sink.write_samples([Sample("outfall.ph", T0 + 1, 7.5)])
        assert asyncio.run(sink.drain(0.5)) == 1  # 401 is retried, never dropped
        assert sink.drainer is not None and "401" in (sink.drainer.stats.last_error or "")
        sink.close()
    finally:
        server.stop()


def test_replay_columns_through_open_sink(tmp_path: Path, victoria: VictoriaMetrics) -> None:
    """What `monitor replay` calls: columns per batch, conditions, then drain before exit."""
    _, config = write_config(tmp_path, {"url": victoria.url, "org": "o", "bucket": "b"}, station="cols")
    names = tuple(s["id"] for s in SENSORS)
    before = victoria.lines_taken()
    sink = open_sink(config)
    sensor = [k % len(names) for k in range(400)]
    times = [T0 + 86400 + k // len(names) for k in range(400)]
    values = [float(k) for k in range(400)]
    sink.write_columns(names, sensor, times, values, [0] * 400)
    assert sink.pending == 400
    assert asyncio.run(sink.drain(30)) == 0
    sink.close()
    victoria.wait_for_lines(before + 400)
    got = {
        (s["metric"]["sensor"], t)
        for s in victoria.export('{__name__="sensor_value",station="cols"}')
        for t in s["timestamps"]
    }
    assert got == {(names[i], round(t * 1000)) for i, t in zip(sensor, times, strict=True)}


def test_segments_of_any_size_cut_into_batches_arrive_once(tmp_path: Path, victoria: VictoriaMetrics) -> None:
    """Appends of 1 to 1,200 points drained in batches of 64: pieces of segments, prefetch across them."""
    _, config = write_config(
        tmp_path, {"url": victoria.url, "org": "o", "bucket": "b", "batch_size": 64}, station="segments"
    )
    before = victoria.lines_taken()
    sink = open_sink(config)
    sent: list[Sample] = []
    t = T0 + 2 * 86400
    for size in (1, 7, 500, 3, 1200, 2, 64, 65):
        chunk = [Sample("outfall.flow", t + k, float(k)) for k in range(size)]
        t += size
        sink.write_samples(chunk)
        sent.extend(chunk)
    assert asyncio.run(sink.drain(30)) == 0
    assert sink.outbox is not None and sink.outbox.stats().written == len(sent)
    sink.close()
    victoria.wait_for_lines(before + len(sent))
    got = [
        (t, v)
        for s in victoria.export('{__name__="sensor_value",station="segments",sensor="outfall.flow"}')
        for t, v in zip(s["timestamps"], s["values"], strict=True)
    ]
    assert sorted(got) == [(round(s.time * 1000), s.value) for s in sent]
