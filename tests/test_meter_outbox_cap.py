"""Meter points and the outbox's size cap.

The ledger unmarks a point once the outbox holds it (`MeterBook.send`): from then on the
outbox is the only thing that knows InfluxDB lacks it. At its cap the outbox drops its
oldest points to take new ones (counted, an OUTBOX alarm); a meter point among them was
gone for good, and the historian's quarter billed less than the ledger with nothing in the
ledger left to send it again. The cap drops every other point before a meter point.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import yaml

from monitor.config import load_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Sample
from tests.engine_helpers import T0
from tests.services import free_port
from tests.test_pipeline import close

METER = "shop.meter"


def capped_station(tmp_path: Path) -> Path:
    """A totalizer and a pH probe; an InfluxDB nobody listens on (the outbox keeps what it
    gets) and the smallest outbox cap the config allows (64 KiB)."""
    raw: dict[str, Any] = {
        "station": {"id": "ps-meter-cap", "timezone": "UTC"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": METER, "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "shop"},
            {"id": "ph", "kind": "ph"},
        ],
        "influx": {"url": f"http://127.0.0.1:{free_port()}", "api": "v1", "database": "plant",
                   "outbox_max_bytes": 1 << 16},
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
