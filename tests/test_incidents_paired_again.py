"""A concentration incident with a paired flow, left open by a replay that stopped while the
flow's readings lagged the concentration's, then the whole history replayed into the same
state dir: each activation is recorded once, as one clean replay records it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.incident_helpers import incidents_json, monitor

pytestmark = pytest.mark.integration  # whole `monitor replay` commands: `make test`

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
HOUR = 3600.0
CHATTER = (HOUR, 1.5 * HOUR)  # oil crosses its limit every 30 s in here
# The first replay stops here, the oil in alarm: its incident stays open. (Stopped while
# the oil is back within, the end of that replay is the end of the data, so the ended
# incident is frozen there, as tests/test_incidents_again.py cuts "while one is active".)
CUT = 1.25 * HOUR
LAG = 300.0  # the flow's readings reach only CUT - LAG by then


def _config(tmp_path: Path, name: str) -> Path:
    raw: dict[str, Any] = {
        "station": {"id": "ps-pair"},
        "state_dir": str(tmp_path / name),
        "console": {"enabled": False},
        "sensors": [
            {"id": "outfall.flow", "kind": "flow", "unit": "gpm", "slug": False, "stale_after": "10m"},
            {"id": "outfall.oil", "kind": "concentration", "substance": "oil", "unit": "mg/L",
             "slug": False, "stale_after": "10m", "limits": {"high": 100},
             "flow_sensor": "outfall.flow"},
        ],
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _oil(at: float) -> float:
    lo, hi = CHATTER
    return 150.0 if lo <= at < hi and int(at // 30) % 2 == 0 else 50.0


def _csv(path: Path, oil_until: float, flow_until: float) -> Path:
    """Every 10 s for 3 h: the flow steady, the oil chattering across 100 mg/L in CHATTER."""
    with path.open("w", encoding="utf-8") as f:
        f.write("time,sensor,value\n")
        for k in range(3 * 360):
            at = 10.0 * k
            if at <= flow_until:
                f.write(f"{T0 + at:.0f},outfall.flow,{300.0 + k % 7}\n")
            if at <= oil_until:
                f.write(f"{T0 + at:.0f},outfall.oil,{_oil(at)}\n")
    return path


def _replay(config: Path, csv: Path, events: Path) -> None:
    result = monitor("replay", "--config", str(config), "--input", str(csv), "--events", str(events))
    assert result.returncode == 0, result.stderr


def test_an_open_paired_incident_replayed_again_after_a_lagging_flow_counts_each_activation_once(
    tmp_path: Path,
) -> None:
    """The first replay stops mid-incident (at +1 h 15 min: the oil incident open) with the
    flow's last reading 5 min older than the oil's, so the incident's evidence (both
    sensors') reaches only the flow's. The oil's re-activations in those 5 minutes were
    counted already. The whole history replayed again into the same state dir must not
    count them twice: the same incidents, activations and figures as one clean replay.
    (Before the fix: 35 activations, not 30: the restored incident held history only up
    to its evidence, the lagging flow's.)"""
    full = _csv(tmp_path / "full.csv", 3 * HOUR, 3 * HOUR)
    clean = _config(tmp_path, "clean")
    _replay(clean, full, tmp_path / "clean.jsonl")
    want = incidents_json(clean)
    assert len(want) == 1 and want[0]["activations"] == 30

    config = _config(tmp_path, "state")
    part = _csv(tmp_path / "part.csv", CUT, CUT - LAG)
    _replay(config, part, tmp_path / "part.jsonl")
    short = incidents_json(config)
    assert [(i["status"], i["activations"]) for i in short] == [("open", 16)]
    _replay(config, full, tmp_path / "again.jsonl")
    got = incidents_json(config)
    assert [(i["id"], i["activations"]) for i in got] == [(i["id"], i["activations"]) for i in want]
    assert got == want
