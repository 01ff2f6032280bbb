"""The local series store and `monitor series`: works with no InfluxDB configured."""

from __future__ import annotations

import math
from pathlib import Path

from monitor.model import Quality, Sample
from monitor.sinks.pipeline import open_sink, store_path
from monitor.sinks.store import SeriesStore
from tests.cli import run_monitor
from tests.sink_config import write_config

T0 = 1_700_000_000.0
DAY = 86400.0


def test_query_range_downsample_and_latest(tmp_path: Path) -> None:
    with SeriesStore(tmp_path / "s.sqlite") as store:
        store.append(Sample("outfall.ph", T0 + i * 60, 7.0 + (i % 10) / 10) for i in range(1440))
        store.append([Sample("outfall.ph", T0 + 10 * 60, 9.9, Quality.BAD_DATA)])  # replaces the earlier
        store.append([Sample("outfall.flow", T0, math.nan, Quality.COMM_FAILURE)])
        hour = store.query("outfall.ph", T0, T0 + 3600)
        assert len(hour) == 60
        assert hour[10].value == 9.9 and hour[10].quality is Quality.BAD_DATA
        assert [s.time for s in hour] == [T0 + i * 60 for i in range(60)]
        day = store.query("outfall.ph", max_points=24)
        assert len(day) == 24
        assert day[0].time == T0
        assert day[0].quality is Quality.BAD_DATA  # a bucket shows its worst quality
        assert math.isclose(day[1].value, sum(7.0 + (i % 10) / 10 for i in range(60, 120)) / 60)
        latest = store.latest()
        assert latest["outfall.ph"].time == T0 + 1439 * 60
        assert math.isnan(latest["outfall.flow"].value)
        assert store.query("unknown") == []


def test_retention_keeps_only_the_configured_period(tmp_path: Path) -> None:
    with SeriesStore(tmp_path / "s.sqlite", retention=2 * DAY) as store:
        for day in range(5):
            store.append([Sample("outfall.flow", T0 + day * DAY + h * 3600, float(day)) for h in range(24)])
        kept = store.query("outfall.flow")
        newest = T0 + 4 * DAY + 23 * 3600
        assert kept[0].time >= newest - 2 * DAY - 3600  # swept hourly
        assert kept[-1].time == newest


def test_no_influx_samples_go_to_the_store_and_monitor_series_prints_them(
    tmp_path: Path, repo_root: Path
) -> None:
    config_path, config = write_config(tmp_path, None)
    sink = open_sink(config)
    assert sink.outbox is None and sink.drainer is None
    sink.write_samples([Sample("outfall.flow", T0 + i * 3600, 100.0 + i) for i in range(48)])
    sink.close()
    assert store_path(config).exists()
    assert not (config.state_dir / "outbox.sqlite").exists()
    cmd = ["series", "--config", str(config_path)]
    out = run_monitor(*cmd, "--sensor", "outfall.flow", cwd=repo_root)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert len(rows) == 25  # --since 24h back from the newest sample, both ends included
    assert rows[-1] == "2023-11-16T21:13:20Z\t147\tgood"
    capped = run_monitor(
        *cmd,
        "--sensor",
        "outfall.flow",
        "--since",
        "2023-11-14T00:00:00Z",
        "--max-points",
        "4",
        cwd=repo_root,
    )
    assert len(capped.stdout.splitlines()) == 4
    listing = run_monitor(*cmd, cwd=repo_root)
    assert listing.stdout.startswith("outfall.flow\t2023-11-16T21:13:20Z\t147\tgood")
    missing = run_monitor(*cmd, "--sensor", "nope", cwd=repo_root)
    assert missing.returncode == 1 and "no samples for sensor 'nope'" in missing.stderr
