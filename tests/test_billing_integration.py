"""Meters end to end with real parts: the live Modbus path from the simulator over TCP,
the same readings replayed from CSV, and the consumption copied to a real InfluxDB 1.6.

- The ledger built live from the simulator equals the ledger built from the recorded
  readings replayed with `monitor replay`, row for row, and both give the same export.
- The consumption written to InfluxDB through the outbox sums, per meter over the
  quarter, to the export's `consumption_ft3`.
"""

from __future__ import annotations

import asyncio
import csv
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from monitor.config import Config, load_config
from monitor.daemon import Daemon
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook
from monitor.model import Condition, ConditionState, ManualClock, Rule, Sample, parse_time
from monitor.sinks.pipeline import open_sink
from monitor.sources.modbus import ModbusPoller
from simulators.modbus_server import StationServer
from simulators.scenarios import Station
from tests.cli import run_monitor
from tests.services import InfluxDB1, free_port

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "billing" / "quarter"
T0 = parse_time("2026-07-01T00:00:00Z")
HOURS = 72


def write_yaml(path: Path, raw: dict[str, Any]) -> Config:
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return load_config(path)


def station_config(tmp_path: Path, port: int) -> Config:
    """The simulator's two totalizers (UINT32 ft3 at holding 8 and 10, 6 digits) as meters."""
    meters = [
        {"id": "station.meter", "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "village",
         "max_rate": 20_000},
        {"id": "mill.meter", "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "mill",
         "max_rate": 10_000},
    ]  # fmt: skip
    raw = {
        "station": {"id": "ps-1"},
        "state_dir": "state",
        "sensors": meters,
        "modbus": {
            "devices": [
                {
                    "name": "plc",
                    "host": "127.0.0.1",
                    "port": port,
                    "fields": [
                        {"sensor": "station.meter", "address": 8, "type": "UINT32"},
                        {"sensor": "mill.meter", "address": 10, "type": "UINT32"},
                    ],
                }
            ]
        },
        "billing": {
            "rate_per_kcf": "4.25",
            "accounts": [{"id": "village", "class": "residential"}, {"id": "mill", "class": "industrial"}],
        },
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write_yaml(tmp_path / "station.yaml", raw)


def test_live_modbus_and_replayed_readings_give_the_same_ledger(tmp_path: Path) -> None:
    port = free_port()
    config = station_config(tmp_path / "live", port)
    # One real second is one station hour; the server reads its clock from `at`.
    station = Station(seed=8, speed=3600, start=0.0, meter_digits=6)
    station.inject("meter_rollover", "30h", before=3000, meter="meter")
    swap = station.inject("meter_replacement", "50h", reading=0, meter="mill_meter")
    at = [0.0]
    clock = ManualClock(T0)
    live = MeterBook.open(config)
    recorded: list[Sample] = []
    conditions: list[Condition] = []

    async def poll_hourly() -> None:
        assert config.modbus is not None
        poller = ModbusPoller(config.modbus.devices, clock)
        async with StationServer(station, port=port, clock=lambda: at[0]):
            for h in range(HOURS + 1):
                at[0] = float(h)
                clock.set(T0 + h * 3600)
                items = await poller.poll("plc")
                samples = [i for i in items if isinstance(i, Sample)]
                recorded.extend(samples)
                conditions.extend(live.ingest(samples))
        for hub in poller.hubs.values():
            hub.close()

    asyncio.run(poll_hourly())
    assert len(recorded) == 2 * (HOURS + 1)
    # The swap at station hour 50 reads as a meter going backwards until it is recorded.
    assert [(c.sensor, c.state, c.time) for c in conditions] == [
        ("mill.meter", ConditionState.ACTIVE, T0 + 50 * 3600)
    ]
    old_final = int(station.values(swap.start / 3600 - 1e-9)["mill_meter"])  # the old register at the swap
    swap_time = T0 + swap.start
    cleared = live.record_replacement("mill.meter", swap_time, old_final, 0, "integration test")
    assert [(c.state, c.time) for c in cleared] == [(ConditionState.CLEARED, T0 + HOURS * 3600)]
    live_rows = {m: live.ledger.rows(m) for m in live.ledger.specs}
    assert any("rollover" in r.flags for r in live_rows["station.meter"])
    live_export = export_rows(config, live.ledger, quarter("2026Q3"))
    live.close()

    # Truth from the simulator's model: one rollover of the 6-digit station meter.
    first, last = (station.values(float(h))["meter"] for h in (0, HOURS))
    station_ft3 = Decimal(int(last) - int(first) + 10**6)
    assert sum(r.volume for r in live_rows["station.meter"]) == station_ft3
    assert live_export[1]["meter"] == "station.meter"
    assert Decimal(live_export[1]["consumption_ft3"]) == station_ft3

    # The same readings, recorded as CSV and replayed into a fresh ledger.
    replay_dir = tmp_path / "replay"
    replay_dir.mkdir()
    shutil.copy(tmp_path / "live" / "station.yaml", replay_dir / "station.yaml")
    readings = replay_dir / "readings.csv"
    with readings.open("w", encoding="utf-8", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["time", "sensor", "value"])
        out.writerows([s.time, s.sensor, repr(s.value)] for s in recorded)
    args = ["--config", str(replay_dir / "station.yaml")]
    done = run_monitor(
        "replay", *args, "--input", str(readings), "--events", str(replay_dir / "events.jsonl"), cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "(1 meter alarm transition(s)" in done.stderr  # the unrecorded swap, as live
    done = run_monitor(
        "meters", "replace", *args, "--meter", "mill.meter", "--time", repr(swap_time),
        "--old-final", str(old_final), "--new-initial", "0", cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    replay_config = load_config(replay_dir / "station.yaml")
    replayed = MeterBook.open(replay_config)
    assert {m: replayed.ledger.rows(m) for m in replayed.ledger.specs} == live_rows
    assert export_rows(replay_config, replayed.ledger, quarter("2026Q3")) == live_export
    replayed.close()


def test_consumption_in_influxdb_equals_the_export(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    influxdb1.query("CREATE DATABASE billing")
    raw = yaml.safe_load((CASE / "config.yaml").read_text(encoding="utf-8"))
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "billing"}
    config = write_yaml(tmp_path / "config.yaml", raw)
    book = MeterBook.open(config)
    sink = open_sink(config)
    with (CASE / "readings.csv").open(encoding="utf-8") as fh:
        samples = [Sample(r["sensor"], parse_time(r["time"]), float(r["value"])) for r in csv.DictReader(fh)]

    def forward() -> None:
        book.send(sink.write_meter_records, limit=None)

    for i in range(0, len(samples), 1000):  # poll-cycle-sized batches, forwarded as they come
        book.ingest(samples[i : i + 1000])
        forward()
    with (CASE / "replacements.csv").open(encoding="utf-8") as fh:
        for rep in csv.DictReader(fh):  # recorded after the fact: re-judged rows go out again
            book.record_replacement(
                rep["meter"], parse_time(rep["time"]), rep["old_final"], rep["new_initial"]
            )
    forward()
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    assert config.billing is not None
    rows = export_rows(config, book.ledger, quarter("2026Q3", config.billing.year_start_month))
    book.close()

    result = influxdb1.query(
        "SELECT sum(consumption_ft3) FROM meter WHERE time > '2026-07-01T00:00:00Z'"
        " AND time <= '2026-10-01T00:00:00Z' GROUP BY meter",
        db="billing",
    )
    got = {s["tags"]["meter"]: s["values"][0][1] for s in result["results"][0]["series"]}
    rejected = influxdb1.query(
        "SELECT count(reading) FROM meter WHERE accepted = 0 GROUP BY meter", db="billing"
    )
    assert {s["tags"]["meter"]: s["values"][0][1] for s in rejected["results"][0]["series"]} == {
        "village.meter": 1  # the spike, kept and visible, not billed
    }
    want = {r["meter"]: Decimal(r["consumption_ft3"]) for r in rows}
    assert got.keys() == want.keys()
    for meter, total in got.items():
        # Floats in InfluxDB, exact in the ledger: equal at the export's three decimals.
        assert Decimal(f"{total:.3f}") == want[meter], (meter, total, want[meter])
    expected = (CASE / "expected.csv").read_text(encoding="utf-8").splitlines()
    assert rows == list(csv.DictReader(expected))


def test_the_daemon_pipeline_feeds_the_ledger_alarms_and_influxdb(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    influxdb1.query("CREATE DATABASE daemon_meters")
    raw = {
        "station": {"id": "ps-1"},
        "state_dir": "state",
        "sensors": [{"id": "shop.meter", "kind": "meter", "register_digits": 5, "max_rate": 100}],
        "influx": {"url": influxdb1.url, "api": "v1", "database": "daemon_meters"},
        "console": {"enabled": False},
    }
    config = write_yaml(tmp_path / "station.yaml", raw)
    daemon = Daemon(config, ManualClock(T0))
    try:
        daemon.pipeline.process([Sample("shop.meter", T0 + h * 3600, 33_800 + 20 * h) for h in range(5)])
        daemon.pipeline.process([Sample("shop.meter", T0 + 5 * 3600, 15.0)])  # swapped, not yet recorded
        alarm = daemon.alarms.get("shop.meter", Rule.METER)
        assert alarm is not None and alarm.active and "went backwards" in alarm.message
        cleared = daemon.meters.record_replacement("shop.meter", T0 + 4.5 * 3600, 33_890, 5)
        assert [c.state for c in cleared] == [ConditionState.CLEARED]
        daemon.pipeline.submit(cleared)  # as the console route does: the transition goes to the alarms
        assert not daemon.alarms.get("shop.meter", Rule.METER).active  # type: ignore[union-attr]
        daemon.pipeline.process([Sample("shop.meter", T0 + 6 * 3600, 35.0)])  # flushes the re-judged rows too
        assert asyncio.run(daemon.sink.drain(30)) == 0
    finally:
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()
    got = influxdb1.query("SELECT sum(consumption_ft3), min(accepted) FROM meter", db="daemon_meters")
    # 4 x 20 before the swap, (33,890 - 33,880) + (15 - 5) across it, 20 after; all accepted now.
    assert got["results"][0]["series"][0]["values"][0][1:] == [4 * 20 + 20 + 20, 1]
