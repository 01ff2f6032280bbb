"""Faults with real servers: VictoriaMetrics taken away mid-run, SIGKILL mid-drain, the cap.

Each test starts its own VictoriaMetrics so it can stop and restart it.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

from monitor.model import Condition, ConditionState, ManualClock, Rule, Sample
from monitor.sinks.outbox import Outbox
from monitor.sinks.pipeline import open_sink, outbox_path, serializer_for
from tests.services import LINES_INVALID, DedupVictoriaMetrics, VictoriaMetrics, wait_until
from tests.sink_config import SENSORS, write_config
from tests.waiting import until

T0 = 1_700_000_000.0


def _chunk(k: int, per_sensor: int = 250) -> list[Sample]:
    """The k-th slice of a replay: `per_sensor` seconds of every sensor."""
    return [
        Sample(s["id"], T0 + k * per_sensor + i, k * 1000 + i + j / 10)
        for i in range(per_sensor)
        for j, s in enumerate(SENSORS)
    ]


def _points(vm: VictoriaMetrics) -> Counter[tuple[str, int, float]]:
    """(sensor, ms, value) -> how many times the server holds it."""
    got: Counter[tuple[str, int, float]] = Counter()
    for series in vm.export('{__name__="sensor_value"}'):
        for t, v in zip(series["timestamps"], series["values"], strict=True):
            got[(series["metric"]["sensor"], t, v)] += 1
    return got


def _want(samples: list[Sample]) -> Counter[tuple[str, int, float]]:
    return Counter((s.sensor, round(s.time * 1000), s.value) for s in samples)


def _count(path: Path, query: str) -> int:
    """One number from the outbox file, read beside (or after) a drain process."""
    db = sqlite3.connect(path, timeout=10)
    try:
        return int(db.execute(query).fetchone()[0])
    finally:
        db.close()


def test_server_stopped_mid_replay_every_point_arrives_exactly_once(tmp_path: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")  # no dedup: repeats would show
    vm.start()
    try:
        _, config = write_config(
            tmp_path,
            {"url": vm.url, "org": "o", "bucket": "b", "batch_size": 500, "flush_interval": 0.05},
        )
        sink = open_sink(config)
        assert sink.drainer is not None and sink.outbox is not None
        drainer, outbox = sink.drainer, sink.outbox
        drainer.backoff.initial, drainer.backoff.maximum = 0.05, 0.2
        sent: list[Sample] = []
        before_stop = 0  # lines delivered before the stop; the server's counters restart at 0

        def feed(k: int) -> None:
            chunk = _chunk(k)
            sink.write_samples(chunk)
            sent.extend(chunk)

        async def scenario() -> int:
            nonlocal before_stop
            task = asyncio.create_task(drainer.run())
            feed(0)
            await until(lambda: outbox.pending == 0, 20, "first slice delivered")
            before_stop = drainer.stats.written
            await asyncio.to_thread(vm.stop)
            for k in (1, 2, 3):
                feed(k)
            await until(lambda: drainer.stats.failures >= 3, 20, "failed attempts while down")
            assert outbox.pending == 3 * 250 * len(SENSORS)
            await asyncio.to_thread(vm.start)
            feed(4)
            await until(lambda: outbox.pending == 0, 30, "backlog delivered after restart")
            drainer.stop()
            await task
            return await drainer.drain(10)

        assert asyncio.run(scenario()) == 0
        stats = outbox.stats()
        sink.close()
        vm.wait_for_lines(drainer.stats.written - before_stop)
        got = _points(vm)
        assert got == _want(sent)  # every point, each exactly once
        assert max(got.values()) == 1
        assert (stats.pending, stats.dropped, stats.dead_letters, stats.written) == (0, 0, 0, len(sent))
    finally:
        vm.stop()


def test_sigkill_mid_drain_then_restart_loses_nothing(tmp_path: Path, repo_root: Path) -> None:
    vm = DedupVictoriaMetrics(tmp_path / "vm")
    vm.start()
    try:
        config_path, config = write_config(
            tmp_path, {"url": vm.url, "org": "o", "bucket": "b", "batch_size": 500}
        )
        samples = [s for k in range(80) for s in _chunk(k)]  # 80,000 points
        with Outbox(outbox_path(config)) as outbox:
            for k in range(80):  # appended slice by slice, as a replay or the daemon appends them
                outbox.append(serializer_for(config).samples(_chunk(k)))
        drain = [
            sys.executable,
            "-m",
            "monitor",
            "outbox",
            "drain",
            "--config",
            str(config_path),
            "--timeout",
            "60",
        ]

        def pending() -> int:
            return _count(outbox_path(config), "SELECT pending_rows FROM meta")

        def dead_letters() -> int:
            return _count(outbox_path(config), "SELECT COUNT(*) FROM dead_letter")

        proc = subprocess.Popen(drain, cwd=repo_root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: pending() <= len(samples) - 5000, timeout=30, what="drain under way")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        left = pending()
        assert 0 < left < len(samples), "the kill must land mid-drain"
        assert len(_points(vm)) < len(samples)

        taken = vm.lines_taken()
        again = subprocess.run(drain, cwd=repo_root, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert pending() == 0
        # Each step on its own, so a failure says where a point went missing: settled only as
        # delivered (no dead letter), parsed by the server, then stored.
        assert f"delivered {left} point(s)" in again.stdout, again.stdout
        assert dead_letters() == 0, again.stdout
        # VictoriaMetrics 1.79 answers 204 before its unmarshal workers parse the lines
        # (influx ParseStream schedules them and returns): one loaded CI run read the counter
        # unchanged right after the drain had settled 73,500. Wait for it, bounded; a line never
        # sent never counts, and the read after the restart below compares every point.
        vm.wait_for_lines(taken + left)
        assert vm.counter(LINES_INVALID) == 0
        # Read after a graceful restart, not a bounded wait: a stop waits for VictoriaMetrics'
        # one-second flusher and writes every buffered row to disk, while /internal/force_flush
        # does not wait for a conversion that flusher has begun (1 read in 123 runs under load
        # differed; the same data directory restarted held all 80,000, once each).
        vm.restart()
        got = _points(vm)
        assert got == _want(samples)  # nothing lost, one point per series and timestamp
    finally:
        vm.stop()


def test_cap_reached_drops_oldest_counts_and_alarms(tmp_path: Path, repo_root: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")
    vm.start()
    vm.stop()  # the server is away while the backlog grows past the cap
    try:
        cap = 1 << 16
        config_path, config = write_config(
            tmp_path, {"url": vm.url, "org": "o", "bucket": "b", "outbox_max_bytes": cap}
        )
        raised: list[Condition] = []
        clock = ManualClock(T0 + 10_000)  # the alarm's time, as a replay would set it
        sink = open_sink(config, clock=clock, on_condition=raised.append)
        assert sink.outbox is not None
        samples = [s for k in range(3) for s in _chunk(k)]  # about 3x the cap
        for i in range(0, len(samples), 100):
            sink.write_samples(samples[i : i + 100])
        stats = sink.outbox.stats()
        health = sink.health()
        assert health["dropped"] == stats.dropped and health["pending"] == stats.pending
        assert stats.dropped > 0
        assert stats.pending_bytes <= cap
        assert [(c.rule, c.state) for c in raised] == [(Rule.OUTBOX, ConditionState.ACTIVE)]
        sink.close()

        status = subprocess.run(
            [sys.executable, "-m", "monitor", "outbox", "status", "--config", str(config_path)],
            cwd=repo_root,
            capture_output=True,
            text=True,
        )
        assert status.returncode == 0
        assert f"dropped         {stats.dropped}" in status.stdout
        assert f"pending         {stats.pending} point(s)" in status.stdout

        vm.start()
        clock.advance(60)
        sink = open_sink(config, clock=clock, on_condition=raised.append)  # a restart: the episode is on disk
        pending = sink.outbox.pending_lines(10**6) if sink.outbox else []
        assert asyncio.run(sink.drain(30)) == 0
        sink.close()
        assert sink.drainer is not None
        vm.wait_for_lines(sink.drainer.stats.written)  # a server started after the backlog grew
        # the cap alarm clears once the backlog is delivered, and its clear reaches InfluxDB
        assert [c.state for c in raised] == [ConditionState.ACTIVE, ConditionState.CLEARED]
        assert raised[1].value == stats.dropped
        kept = [line for line in pending if line.startswith("sensor,")]
        # exactly the newest samples arrive: what was dropped is the oldest
        assert _points(vm) == _want(samples[len(samples) - len(kept) :])
        assert len(samples) - len(kept) <= stats.dropped
        (alarm,) = vm.export('{__name__="alarm_active",rule="outbox"}')
        assert alarm["metric"]["sensor"] == "outbox"
        assert alarm["values"] == [0]  # the raise itself was among the oldest, dropped
        assert alarm["timestamps"] == [round((T0 + 10_060) * 1000)]
    finally:
        vm.stop()


def test_outbox_drain_cli_reports_what_is_left_when_unreachable(tmp_path: Path, repo_root: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")  # its port, with nothing listening
    config_path, config = write_config(tmp_path, {"url": vm.url, "org": "o", "bucket": "b"})
    sink = open_sink(config)
    sink.write_samples(_chunk(0, per_sensor=10))
    sink.close()
    cmd = [sys.executable, "-m", "monitor", "outbox", "drain", "--config", str(config_path), "--timeout", "1"]
    down = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1
    assert "40 point(s) still pending" in down.stderr
    vm.start()
    try:
        up = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, up.stderr
        assert "delivered 40 point(s)" in up.stdout
        vm.wait_for_lines(40)
        assert len(_points(vm)) == 40
    finally:
        vm.stop()
