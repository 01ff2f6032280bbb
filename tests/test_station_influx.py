"""Daily pump and station totals reach a real InfluxDB 1.6, cut at the station's local midnight,
and agree with `monitor pumps report` over the same local days."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from simulators.lift_station import LiftStation
from tests.services import InfluxDB1
from tests.test_station_live import DAY, ROOT, START, write_config


def test_daily_totals_in_influxdb(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    influxdb1.query("CREATE DATABASE station_daily")
    sim = LiftStation(START, days=3.0, storm=(1.5 * DAY, 3 * 3600.0, 1150.0), failure=None, slug=None).run()
    csv = tmp_path / "s.csv"
    sim.write_csv(csv, 10.0)
    config = write_config(tmp_path, "daily")
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["influx"] = {"url": influxdb1.url, "api": "v1", "database": "station_daily"}
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "monitor", "replay", "--config", str(config), "--input", str(csv),
         "--events", str(tmp_path / "ev.jsonl"), "--drain-timeout", "60"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "outbox drained" in out.stdout

    got = influxdb1.query(
        "SELECT run_hours, starts, pump, day FROM pump_daily WHERE station = 'ps-2' ORDER BY time",
        db="station_daily",
    )
    rows = got["results"][0]["series"][0]["values"]
    # 2026-01-01 00:00Z is 2025-12-31 19:00 in New York: days close at 05:00Z. Three UTC days
    # hold the local days 12-31 (part), 01-01 and 01-02 complete: three closed, two pumps each.
    days = sorted({r[4] for r in rows})
    assert days == ["2025-12-31", "2026-01-01", "2026-01-02"]
    assert rows[0][0] == 1_767_157_200_000  # 2025-12-31T05:00:00Z, local midnight (ms)
    for day in ("2026-01-01", "2026-01-02"):
        start = f"{day}T00:00:00-05:00"
        end_day = {"2026-01-01": "2026-01-02", "2026-01-02": "2026-01-03"}[day]
        rep = subprocess.run(
            [sys.executable, "-m", "monitor", "pumps", "report", "--config", str(config), "--start", start,
             "--end", f"{end_day}T00:00:00-05:00", "--format", "json"],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert rep.returncode == 0, rep.stderr
        want = {p["sensor"]: (p["run_hours"], p["starts"]) for p in json.loads(rep.stdout)["pumps"]}
        have = {r[3]: (r[1], r[2]) for r in rows if r[4] == day}
        assert have == want
        assert all(starts > 20 for _, starts in have.values())

    station = influxdb1.query(
        "SELECT overflows, overflow_volume_gal, day FROM station_daily WHERE station = 'ps-2'",
        db="station_daily",
    )["results"][0]["series"][0]["values"]
    storm_day = next((r for r in station if r[3] == "2026-01-02"), None)
    assert storm_day is not None, station
    assert storm_day[1] == 1 and storm_day[2] > 1000

    # The first day's readings begin at 19:00 local: its 19 hours before were not monitored.
    unmonitored = influxdb1.query(
        "SELECT unmonitored_hours, day FROM station_daily WHERE station = 'ps-2'", db="station_daily"
    )["results"][0]["series"][0]["values"]
    assert {r[2]: r[1] for r in unmonitored} == {"2025-12-31": 19.0, "2026-01-01": 0.0, "2026-01-02": 0.0}
