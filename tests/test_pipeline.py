"""The pipeline's order (store, judge, acknowledge) and its recovery, in process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Quality, Rule, Sample
from monitor.web.service import console_server
from monitor.web.station import StationAdapter
from tests.services import free_port

T0 = 1_767_225_600.0


def station(state: Path, influx: bool = False) -> Config:
    raw: dict[str, object] = {
        "station": {"id": "ps-pipe"},
        "state_dir": str(state),
        "sensors": [
            {"id": "outfall.ph", "kind": "ph"},
            {"id": "shop.meter", "kind": "meter", "register_digits": 6},
        ],
        "console": {"enabled": False},
        "store": {"free_space_floor": 0},
    }
    if influx:  # nothing listens there: points stay in the outbox, where the test reads them
        raw["influx"] = {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"}
    return build_config(raw)


def close(daemon: Daemon) -> None:
    daemon.sink.close()
    daemon.meters.close()
    daemon.alarms.close()


def test_a_bad_value_is_counted_stored_as_bad_and_raises_nothing(tmp_path: Path) -> None:
    """Regression: the pipeline marked it bad before the engine saw it, so
    station_monitor_bad_values_total stayed 0."""
    daemon = Daemon(station(tmp_path / "state"), ManualClock(T0))
    try:
        daemon.pipeline.process([Sample("outfall.ph", T0, 7.0), Sample("outfall.ph", T0 + 1, 99.0)])
        assert daemon.engine.counters.bad_values == 1
        assert daemon.health().to_json()["engine"]["bad_values"] == 1  # type: ignore[index]
        stored = daemon.sink.store.query("outfall.ph")
        assert [s.quality for s in stored] == [Quality.GOOD, Quality.BAD_DATA]
        assert daemon.alarms.get("outfall.ph", Rule.HIGH) is None
    finally:
        close(daemon)


def test_a_batch_a_crash_left_between_the_stores_is_applied_again_at_start(tmp_path: Path) -> None:
    config = station(tmp_path / "state", influx=True)
    daemon = Daemon(config, ManualClock(T0))
    readings = [Sample("shop.meter", T0 + 60 * i, 100.0 + i) for i in range(3)]
    # The crash: the series store committed the batch (and its intake record); the
    # outbox and the ledger never saw it.
    daemon.sink.store.hold(readings)
    close(daemon)

    again = Daemon(config, ManualClock(T0))
    try:
        assert again.pipeline.stats.recovered == 1
        assert again.sink.store.held() == []
        rows = again.meters.ledger.rows("shop.meter", 0, 10**15)
        assert [int(r.reading) for r in rows] == [100, 101, 102]
        assert again.sink.outbox is not None
        body = "\n".join(again.sink.outbox.pending_lines(1000))
        lines = body.splitlines()
        assert sum(1 for ln in lines if ln.startswith("sensor,") and "sensor=shop.meter" in ln) == 3
        assert sum(1 for ln in lines if ln.startswith("meter,") and "meter=shop.meter" in ln) == 3
    finally:
        close(again)
    # Applying it again changes nothing: the ledger and store are idempotent by key.
    third = Daemon(config, ManualClock(T0))
    try:
        assert third.pipeline.stats.recovered == 0
        assert len(third.meters.ledger.rows("shop.meter", 0, 10**15)) == 3
    finally:
        close(third)


def test_a_refused_store_judges_and_acknowledges_nothing_until_it_is_stored(tiny_disk: Path) -> None:
    daemon = Daemon(station(tiny_disk / "state"), ManualClock(T0))
    try:
        st = os.statvfs(tiny_disk)
        ballast = tiny_disk / "ballast"
        ballast.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (64 << 10)))
        acked: list[int] = []
        n = 0
        while daemon.pipeline.stats.stalled is None:  # until the disk refuses
            batch = [Sample("outfall.ph", T0 + n + k / 1000, 12.0) for k in range(500)]
            daemon.pipeline.emit(batch, functools.partial(acked.append, n))
            daemon.pipeline.process_queued()
            n += 1
            assert n < 1000, "the disk never filled"
        judged = daemon.engine.counters.samples
        assert acked == list(range(n - 1))  # the refused batch is not acknowledged
        alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
        assert alarm is not None and alarm.active
        assert daemon.pipeline.process_queued() is False  # not retried before RETRY
        assert daemon.engine.counters.samples == judged  # nothing judged while refused

        ballast.unlink()
        daemon.pipeline._retry_at = 0.0  # the retry timer's wait, skipped (a monotonic deadline)
        assert daemon.pipeline.process_queued() is True
        assert acked == list(range(n))
        assert daemon.engine.counters.samples == judged + 500
        alarm = daemon.alarms.get("state_disk", Rule.DISK_FULL)
        assert alarm is not None and not alarm.active
        assert daemon.pipeline.stats.stalls == 1
    finally:
        close(daemon)


def test_a_meter_alarm_the_ledger_holds_but_the_journal_missed_is_raised_at_start(tmp_path: Path) -> None:
    config = station(tmp_path / "state")
    daemon = Daemon(config, ManualClock(T0))
    daemon.pipeline.process([Sample("shop.meter", T0 + 60 * i, 500.0 + i) for i in range(3)])
    # The crash: the ledger committed a reading that went backwards; the journal never
    # heard of the alarm it raises.
    assert daemon.meters.ingest([Sample("shop.meter", T0 + 240, 10.0)])
    close(daemon)

    again = Daemon(config, ManualClock(T0))
    try:
        alarm = again.alarms.get("shop.meter", Rule.METER)
        assert alarm is not None and alarm.active and "backwards" in alarm.message
    finally:
        close(again)
    third = Daemon(config, ManualClock(T0))  # in line now: nothing raised twice
    try:
        entries = [e.event for e in third.alarms.journal.entries() if e.sensor == "shop.meter"]
        assert entries == ["activated"]
    finally:
        close(third)


def stale_station(state: Path, console_port: int | None = None, on_delay: str | None = None) -> Config:
    console: dict[str, object] = {"enabled": False}
    if console_port is not None:
        console = {"host": "127.0.0.1", "port": console_port}
    ph: dict[str, object] = {"id": "outfall.ph", "kind": "ph", "stale_after": "60s"}
    if on_delay is not None:
        ph["limits"] = {"on_delay": on_delay}
    return build_config(
        {
            "station": {"id": "ps-pipe"},
            "state_dir": str(state),
            "sensors": [ph],
            "console": console,
            "store": {"free_space_floor": 0},
        }
    )


def test_a_late_reading_never_clears_a_stale_alarm_before_it_was_raised(tmp_path: Path) -> None:
    """The reviewer's case through the daemon: its clock ticks every second and raises
    stale at +61 s; a reading stamped +59 s (a backlog after a broker outage) is judged at
    +90 s. The journal, the console's alarm and the listeners (MQTT, callout, reports) get
    the clear at +90 s, when the reading arrived, never at +59 s, before the raise."""
    clock = ManualClock(T0)
    daemon = Daemon(stale_station(tmp_path / "state"), clock)
    try:
        daemon.pipeline.process([Sample("outfall.ph", T0, 7.0)])
        for k in range(1, 91):
            clock.set(T0 + k)
            daemon.tick()
        daemon.pipeline.process([Sample("outfall.ph", T0 + 59, 7.0), Sample("outfall.ph", T0 + 60, 7.0)])
        rows = [(e.event, e.time - T0) for e in daemon.alarms.journal.entries(sensor="outfall.ph")]
        assert rows == [("activated", 61.0), ("cleared", 90.0)]
        alarm = daemon.alarms.get("outfall.ph", Rule.STALE)
        assert alarm is not None and alarm.activated_at is not None and alarm.cleared_at is not None
        assert (alarm.activated_at - T0, alarm.cleared_at - T0) == (61.0, 90.0)
    finally:
        close(daemon)


def test_after_a_crash_a_late_reading_clears_a_restored_stale_alarm_when_it_is_judged(tmp_path: Path) -> None:
    """After a crash (no checkpoint) the engine no longer knows when the stale alarm the
    journal holds was raised (+61 s); the daemon is back at +300 s and the first good reading,
    stamped +59 s (a backlog), ends it (the reconciler) when it is judged, at +300 s: the
    alarm covers the downtime, as the live path would stamp it, and nothing is early."""
    clock = ManualClock(T0)
    first = Daemon(stale_station(tmp_path / "state"), clock)
    first.pipeline.process([Sample("outfall.ph", T0, 7.0)])
    for k in range(1, 71):
        clock.set(T0 + k)
        first.tick()
    close(first)  # a crash: no checkpoint, the journal is what was committed
    clock.set(T0 + 300)
    again = Daemon(stale_station(tmp_path / "state"), clock)
    try:
        again.pipeline.process([Sample("outfall.ph", T0 + 59, 7.0)])
        rows = [(e.event, e.time - T0) for e in again.alarms.journal.entries(sensor="outfall.ph")]
        assert rows == [("activated", 61.0), ("cleared", 300.0)]
        alarm = again.alarms.get("outfall.ph", Rule.STALE)
        assert alarm is not None and alarm.activated_at is not None and alarm.cleared_at is not None
        assert (alarm.activated_at - T0, alarm.cleared_at - T0) == (61.0, 300.0)
        assert again.alarms.early_clears == 0
    finally:
        close(again)


def test_an_early_clear_is_counted_in_metrics_and_in_the_health_snapshot(tmp_path: Path) -> None:
    """A clear that still comes stamped before its activation, through the daemon: pH 12 from
    +0 s raised the high alarm at +60 s (a 60 s on-delay); after a crash (no checkpoint) the
    gateway clock steps back an hour while the daemon is down (an RTC without its battery),
    so the restarted engine, which takes the alarm as its own (`Engine.restore_active`),
    judges a pH 7 reading stamped -3600 s: the activation is in the clock's future, stamps
    cannot tell what came first, and the rule ends the alarm at the reading's time. Served
    as `monitor run` serves it (the console with /metrics, on a real port), the clear
    journaled at the activation shows as station_monitor_alarm_early_clears_total and as
    `alarm_early_clears` in /api/health, so a gateway's keeper sees it without reading the
    log. (Without the clock step, a reading older than a restored alarm does not end it at
    all: tests/test_restart_reconcile.py.)"""
    clock = ManualClock(T0 + 120)
    first = Daemon(stale_station(tmp_path / "state", on_delay="60s"), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 12.0) for k in range(0, 61, 10)])
    assert [e.event for e in first.alarms.journal.entries(sensor="outfall.ph")] == ["activated"]
    close(first)  # a crash: no checkpoint
    clock.set(T0 - 3600)
    port = free_port()
    again = Daemon(stale_station(tmp_path / "state", console_port=port, on_delay="60s"), clock)
    try:
        with served(again):
            metric = 'station_monitor_alarm_early_clears_total{station="ps-pipe"}'
            assert f"{metric} 0.0" in get(f"http://127.0.0.1:{port}/metrics")
            # On this thread (the stores' SQLite connections are this thread's); the server
            # answers nothing meanwhile: each request above and below has its answer first.
            again.pipeline.process([Sample("outfall.ph", T0 - 3600, 7.0)])
            rows = [(e.event, e.rule, e.time - T0) for e in again.alarms.journal.entries(sensor="outfall.ph")]
            assert rows == [("activated", "high", 60.0), ("cleared", "high", 60.0)]
            assert f"{metric} 1.0" in get(f"http://127.0.0.1:{port}/metrics")
            health = json.loads(get(f"http://127.0.0.1:{port}/api/health"))
            assert health["alarm_early_clears"] == 1
        assert again.health().to_json()["alarm_early_clears"] == 1
    finally:
        close(again)


def test_a_transition_the_journal_refused_is_counted_in_metrics_and_in_the_health_snapshot(
    tmp_path: Path,
) -> None:
    """The bad-value alarm is due at +60 s while the alarm journal refuses writes and the
    series store takes them: the transition is not recorded (never a crash), counted in
    the pipeline's `unjournaled`, and shown both in /api/health and, so a gateway's keeper
    can alert on it, as station_monitor_alarm_unjournaled_total in /metrics (served as
    `monitor run` serves it). The refusal is injected (`PRAGMA query_only` on the journal
    alone): a real full or read-only disk refuses the series store first, and the pipeline
    then stalls before it judges anything (tests/test_disk_full.py, test_readonly_disk.py)."""
    port = free_port()
    daemon = Daemon(stale_station(tmp_path / "state", console_port=port), ManualClock(T0))
    try:
        with served(daemon):
            metric = 'station_monitor_alarm_unjournaled_total{station="ps-pipe"}'
            assert f"{metric} 0.0" in get(f"http://127.0.0.1:{port}/metrics")
            daemon.alarms.journal._db.execute("PRAGMA query_only=ON")
            daemon.pipeline.process([Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)])
            daemon.alarms.journal._db.execute("PRAGMA query_only=OFF")
            assert list(daemon.alarms.journal.entries(sensor="outfall.ph")) == []
            assert daemon.pipeline.stats.unjournaled == 1
            assert f"{metric} 1.0" in get(f"http://127.0.0.1:{port}/metrics")
            health = json.loads(get(f"http://127.0.0.1:{port}/api/health"))
            assert health["pipeline"]["unjournaled"] == 1
            # and first in the console's gateway panel, not the 30th counter
            assert {
                "level": "warning",
                "text": "1 alarm transition the alarm journal did not record",
            } in health["attention"]
    finally:
        close(daemon)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


@contextlib.contextmanager
def served(daemon: Daemon) -> Iterator[None]:
    """The daemon's console server (`console_server`, as `monitor run` builds it) on its own
    event loop in a thread."""
    server = console_server(StationAdapter(daemon))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve()))
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.wait_started(), loop).result(timeout=15)
        yield
    finally:
        loop.call_soon_threadsafe(server.stop)
        thread.join(timeout=15)
        loop.close()


def test_a_stop_right_after_the_disk_is_freed_stores_the_held_readings(tiny_disk: Path) -> None:
    # `systemctl restart` right after the operator freed space: the stop fell inside the 2 s
    # retry pause (`RETRY`), and the held batch was not tried again, so Modbus readings held
    # in memory were lost at a clean stop on a disk that took writes.
    daemon = Daemon(station(tiny_disk / "state"), ManualClock(T0))
    ballast = tiny_disk / "ballast"
    st = os.statvfs(tiny_disk)
    ballast.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (64 << 10)))
    n = 0
    while daemon.pipeline.stats.stalled is None:  # until the disk refuses
        daemon.pipeline.emit([Sample("outfall.ph", T0 + n + k / 1000, 7.0) for k in range(500)], None)
        daemon.pipeline.process_queued()
        n += 1
        assert n < 1000, "the disk never filled"
    assert daemon.pipeline.waiting == 500
    ballast.unlink()
    asyncio.run(daemon._shutdown([], None))  # at once: inside the retry pause
    assert daemon.pipeline.waiting == 0
    assert daemon.pipeline.stats.stalled is None
