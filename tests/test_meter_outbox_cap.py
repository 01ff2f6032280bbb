"""Meter points and the outbox's size cap.

The ledger unmarks a point once the outbox holds it (`MeterBook.send`): from then on the
outbox is the only thing that knows InfluxDB lacks it. At its cap the outbox drops its
oldest points to take new ones (counted, an OUTBOX alarm); a meter point among them was
gone for good, and the historian's quarter billed less than the ledger with nothing in the
ledger left to send it again. The cap drops every other point before a meter point, and
never a meter point: those alone over the cap stay marked in the ledger until there is room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from monitor.config import load_config
from monitor.daemon import Daemon
from monitor.health import attention
from monitor.meters.billing import export_rows
from monitor.meters.ledger import Ledger
from monitor.meters.periods import quarter
from monitor.meters.totalizer import MeterSpec
from monitor.model import ManualClock, Sample
from monitor.web.service import StationCollector
from monitor.web.station import StationAdapter
from tests.engine_helpers import T0
from tests.services import InfluxDB1, free_port, refused_port
from tests.test_pipeline import close

METER = "shop.meter"


# The InfluxDB nobody listens on: a port bound and not listening for as long as this test
# process runs, so it refuses and no other test's server can take it (a bare free_port()
# could be bound by one a moment later, which then answers /write).
NOBODY = contextlib.ExitStack().enter_context(refused_port())


def scrape(daemon: Daemon) -> str:
    """/metrics as the daemon's console serves it."""
    registry = CollectorRegistry()
    registry.register(StationCollector(StationAdapter(daemon)))
    return generate_latest(registry).decode()


def capped_station(tmp_path: Path, port: int | None = None, batch_size: int = 5000) -> Path:
    """A totalizer and a pH probe; an InfluxDB nobody listens on (the outbox keeps what it
    gets; `port`: where one will be started) and the smallest outbox cap the config allows
    (64 KiB); `batch_size`: the points a delivery carries."""
    raw: dict[str, Any] = {
        "station": {"id": "ps-meter-cap", "timezone": "UTC"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": METER, "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "shop"},
            {"id": "ph", "kind": "ph"},
        ],
        "influx": {"url": f"http://127.0.0.1:{port or NOBODY}", "api": "v1", "database": "plant",
                   "outbox_max_bytes": 1 << 16, "batch_size": batch_size},
        "billing": {"rate_per_kcf": "4.25", "accounts": [{"id": "shop", "class": "commercial"}]},
        "console": {"enabled": False},
        "store": {"free_space_floor": 0},
    }  # fmt: skip
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def test_the_outbox_cap_drops_other_points_before_meter_points_the_ledger_unmarked(tmp_path: Path) -> None:
    """Ten meter readings go to the outbox and are unmarked in the ledger; then an InfluxDB
    outage long enough for the pH readings to fill the cap twice over. The outbox drops pH
    points (counted, alarmed), and still holds all ten meter points: before, the first of
    them were dropped and neither the outbox nor the ledger had them any more."""
    config = load_config(capped_station(tmp_path))
    wall = ManualClock(T0)
    daemon = Daemon(config, wall)
    try:
        for i in range(10):
            wall.set(T0 + 60 * i)
            daemon.pipeline.process(
                [Sample(METER, T0 + 60 * i, 1000.0 + 10 * i), Sample("ph", T0 + 60 * i, 7.0)]
            )
        outbox = daemon.pipeline.sink.outbox
        assert outbox is not None
        ledger = sqlite3.connect(config.state_dir / "ledger.sqlite")
        assert ledger.execute("SELECT count(*) FROM unsent").fetchone() == (0,)  # the outbox has them
        for b in range(30):  # ~130 KiB of pH points, 50 at a time
            t = T0 + 600 + 50 * b
            wall.set(t + 49)
            daemon.pipeline.process([Sample("ph", t + k, 7.0 + k / 100) for k in range(50)])
        stats = outbox.stats()
        assert stats.dropped > 0 and stats.pending_bytes <= 1 << 16
        held = [line for line in outbox.pending_lines(100_000) if line.startswith("meter,")]
        assert len(held) == 10, held
        assert ledger.execute("SELECT count(*) FROM unsent").fetchone() == (0,)
        ledger.close()
    finally:
        close(daemon)


def test_meter_points_alone_over_the_cap_stay_marked_in_the_ledger_and_reach_influxdb_later(
    tmp_path: Path,
) -> None:
    """InfluxDB is down while the meter is read 1,000 times: its points alone are ~2.5 times the
    64 KiB cap. Before, the cap dropped the oldest meter points (their ledger marks were cleared
    when the outbox took them): InfluxDB, back, got what was left and its quarter billed less
    than the ledger's. Now the outbox takes meter points only as far as they fit, never drops
    one, and the ledger keeps the rest marked; once InfluxDB (a real 1.6) is back and the
    outbox drains, they are offered again: every point arrives, the sums agree."""
    port = free_port()
    config = load_config(capped_station(tmp_path, port))
    wall = ManualClock(T0)
    daemon = Daemon(config, wall)
    influx = InfluxDB1(tmp_path / "influxdb", port=port)
    try:
        for b in range(20):
            wall.set(T0 + 60 * 50 * b)
            daemon.pipeline.process(
                [Sample(METER, T0 + 60 * (50 * b + i), 1000.0 + 7 * (50 * b + i)) for i in range(50)]
            )
        outbox = daemon.pipeline.sink.outbox
        assert outbox is not None
        stats = outbox.stats()
        assert stats.dropped > 0 and stats.pending_bytes <= 1 << 16  # the raw samples' points
        held = [line for line in outbox.pending_lines(100_000) if line.startswith("meter,")]
        marked = daemon.meters.ledger.unsent()[0]
        assert 300 < len(held) < 500 and len(held) + len(marked) == 1000
        assert daemon.meters.at_cap  # logged once, at the first offer refused
        # Said where an operator looks: /api/health's count, the gateway panel, /metrics.
        health = daemon.health().to_json()
        assert health["meters"]["held_back"] == len(marked)  # type: ignore[index]
        said = f"{len(marked):,} meter points held in the ledger at the outbox's size cap (none dropped)"
        assert {"level": "warning", "text": said} in attention(health)
        gauge = f'station_monitor_meter_points_held_back{{station="ps-meter-cap"}} {len(marked)}.0'
        assert gauge in scrape(daemon)
        influx.start()
        influx.query("CREATE DATABASE plant")
        for _ in range(20):  # each round: the outbox drains, the ledger offers what now fits
            assert asyncio.run(daemon.sink.drain(30.0)) == 0
            daemon.pipeline.process_queued()  # the cap alarm's conditions, queued
            daemon.pipeline.send_meter_points()  # the timer's offer
            if not daemon.meters.ledger.unsent()[0] and outbox.stats().pending_bytes == 0:
                break
        assert daemon.meters.ledger.unsent() == ([], []) and not daemon.meters.at_cap
        health = daemon.health().to_json()
        assert health["meters"]["held_back"] == 0
        assert not any("held in the ledger" in a["text"] for a in attention(health))
        assert 'station_monitor_meter_points_held_back{station="ps-meter-cap"} 0.0' in scrape(daemon)
        got = influx.query("SELECT count(reading), sum(consumption_ft3) FROM meter", db="plant")
        _, count, total = got["results"][0]["series"][0]["values"][0]
        (row,) = export_rows(config, daemon.meters.ledger, quarter("2026Q2"))
        assert count == 1000
        assert Decimal(f"{total:.3f}") == Decimal(row["consumption_ft3"]) == Decimal(7 * 999)
    finally:
        close(daemon)
        influx.stop()


def test_at_the_cap_an_offer_reads_only_what_the_outbox_has_room_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outbox at its cap with meter points alone drains slowly: InfluxDB (a real 1.6)
    takes one delivery of 10 points at a time. Each offer the timer makes then hands the
    outbox about what those 10 points made room for, and the outbox takes all of it. Before,
    every offer read 5,000 marked points from the ledger (all ~600 here) and turned them into
    points to take a few (~300 ms an offer, bench/meter_cap.py). Order and totals as before:
    every point arrives once the backlog is gone, the sums agree with the ledger."""
    port = free_port()
    config = load_config(capped_station(tmp_path, port, batch_size=10))
    wall = ManualClock(T0)
    daemon = Daemon(config, wall)
    influx = InfluxDB1(tmp_path / "influxdb", port=port)
    sink = daemon.sink
    offers: list[tuple[int, int]] = []  # (points offered, points the outbox took)
    write = sink.write_meter_records

    def counted(records: Any) -> int:  # the real write, counted (a spy, not a fake)
        taken = write(records)
        offers.append((len(records), taken))
        return taken

    try:
        for b in range(20):
            wall.set(T0 + 60 * 50 * b)
            daemon.pipeline.process(
                [Sample(METER, T0 + 60 * (50 * b + i), 1000.0 + 7 * (50 * b + i)) for i in range(50)]
            )
        daemon.pipeline.process_queued()
        assert daemon.meters.at_cap and len(daemon.meters.ledger.unsent()[0]) > 500
        assert sink.drainer is not None and sink.outbox is not None
        influx.start()
        influx.query("CREATE DATABASE plant")
        monkeypatch.setattr(sink, "write_meter_records", counted)
        for _ in range(30):  # one delivery of 10 points, then the timer's offer
            assert asyncio.run(sink.drainer.send_batches(deadline=wall.now())) == 10
            daemon.pipeline.process_queued()
            daemon.pipeline.send_meter_points()
        assert offers and all(offered <= 20 and taken == offered for offered, taken in offers), offers
        assert sum(taken for _, taken in offers) >= 30 * 10 // 2  # the room was used
        for _ in range(40):  # InfluxDB catches up
            assert asyncio.run(sink.drain(30.0)) == 0
            daemon.pipeline.process_queued()
            daemon.pipeline.send_meter_points()
            if not daemon.meters.ledger.unsent()[0] and sink.outbox.stats().pending_bytes == 0:
                break
        assert daemon.meters.ledger.unsent() == ([], []) and not daemon.meters.at_cap
        got = influx.query("SELECT count(reading), sum(consumption_ft3) FROM meter", db="plant")
        _, count, total = got["results"][0]["series"][0]["values"][0]
        assert count == 1000 and Decimal(f"{total:.3f}") == Decimal(7 * 999)
    finally:
        close(daemon)
        influx.stop()


def test_a_meter_no_longer_configured_keeps_its_marks_said_once_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`old.meter` was read (its points marked for InfluxDB, never sent: InfluxDB was down),
    then removed from the config. Its marks stay in the ledger (no settings to write its
    points with) until it is configured again; before, nothing said so. The start logs it
    once per meter, and /api/health and /metrics count the points (a gauge)."""
    config = load_config(capped_station(tmp_path))
    config.state_dir.mkdir(parents=True)
    old = MeterSpec("old.meter", "ft3", 6, Decimal(1), None, "shop")
    ledger = Ledger(config.state_dir / "ledger.sqlite", {old.meter: old}, now=T0)
    ledger.add_many([(old.meter, T0 + 60 * i, Decimal(100 + i)) for i in range(7)])
    ledger.close()
    with caplog.at_level(logging.WARNING, logger="monitor.meters.book"):
        daemon = Daemon(config, ManualClock(T0 + 3600))
    try:
        said = [r.getMessage() for r in caplog.records if "old.meter" in r.getMessage()]
        assert len(said) == 1 and "7 point(s)" in said[0] and "no longer configured" in said[0], said
        daemon.pipeline.process([Sample(METER, T0 + 3600, 5.0)])
        daemon.pipeline.send_meter_points()
        assert daemon.health().to_json()["meters"]["unsent_unconfigured"] == 7  # type: ignore[index]
        scraped = scrape(daemon)
        assert 'station_monitor_meter_points_unsent_unconfigured{station="ps-meter-cap"} 7.0' in scraped
        assert len([r for r in caplog.records if "old.meter" in r.getMessage()]) == 1
    finally:
        close(daemon)
