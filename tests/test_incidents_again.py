"""History that is on record already is not recorded twice: a chattering station's days
replayed again into the same state dir give exactly the incidents of the first replay (a
re-activation merged into an incident used to open one of its own the second time), and
a longer history replayed after a shorter one adds only what came after it."""

from __future__ import annotations

import itertools
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from monitor.incidents import IncidentStore
from tests.incident_helpers import incidents_json, monitor
from tests.test_incidents_worker import CHATTERING, T0, chattering, station

pytestmark = pytest.mark.integration  # whole `monitor replay` commands: `make test`

HOUR = 3600.0


def _write(
    tmp_path: Path, state: Path, days: int, sensors: list[dict[str, Any]], until: float = math.inf
) -> tuple[Path, Path]:
    """The chattering station's days as CSV (its `sensors` only, rows up to `until`), and a
    config with its state in `state`."""
    _, sensor, t, value = chattering(state, days=days)
    names = np.array([s["id"] for s in CHATTERING])[sensor]
    keep = np.isin(names, [s["id"] for s in sensors]) & (t <= until)
    csv = tmp_path / f"{state.name}-{int(until) if math.isfinite(until) else 'all'}.csv"
    with csv.open("w", encoding="utf-8") as f:
        f.write("time,sensor,value\n")
        f.writelines(
            f"{a:.0f},{b},{c!r}\n" for a, b, c in zip(t[keep], names[keep], value[keep].tolist(), strict=True)
        )
    config = tmp_path / f"{state.name}.yaml"
    config.write_text(yaml.safe_dump(station(state, sensors)), encoding="utf-8")
    return csv, config


def _replay(config: Path, csv: Path, events: Path) -> str:
    """`monitor replay`; its stderr (the log lines)."""
    result = monitor("replay", "--config", str(config), "--input", str(csv), "--events", str(events))
    assert result.returncode == 0, result.stderr
    return result.stderr


def _all_verify(state: Path) -> bool:
    store = IncidentStore(state)
    try:
        return all(i.frozen and store.verify(i) for i in store.incidents())
    finally:
        store.close()


def test_a_chattering_history_replayed_twice_is_recorded_once(tmp_path: Path) -> None:
    """The same records (ids, figures, activations, evidence hashes) after the second
    replay as after the first, no incident opened by it, and one line for each incident
    saying it is on record already -- not one per re-activation."""
    state = tmp_path / "state"
    csv, config = _write(tmp_path, state, days=4, sensors=CHATTERING)
    first = _replay(config, csv, tmp_path / "first.jsonl")
    once = incidents_json(config)
    assert len(once) >= 8 and max(i["activations"] for i in once) > 10  # it chatters, merged
    assert all(f"incident {i['id']} opened" in first for i in once)

    again = _replay(config, csv, tmp_path / "again.jsonl")
    assert incidents_json(config) == once
    assert " opened: " not in again
    said = [line for line in again.splitlines() if "is on record already" in line]
    assert sorted(line.split("incident ", 1)[1].split(" ", 1)[0] for line in said) == sorted(
        i["id"] for i in once
    )
    assert all(line.endswith("(history replayed again); not recorded twice") for line in said)
    assert _all_verify(state)
    # the alarms themselves are judged again: the same events
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "first.jsonl").read_text()


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("cut", ["between incidents", "while one is active"])
def test_a_longer_history_after_a_shorter_one_adds_only_the_later_incidents(cut: str, tmp_path: Path) -> None:
    """The first three days, then all four, into one state dir: the same records as the
    four days replayed once. Cut between incidents, the fourth day's are recorded anew;
    cut while a temperature is in alarm, its incident is left open by the first replay
    and the second continues it (its activations, end and evidence as in one replay)."""
    sensors = [s for s in CHATTERING if s["id"] != "temp2"]  # one alarm to cut across
    clean = tmp_path / "clean"
    csv, config = _write(tmp_path, clean, days=4, sensors=sensors)
    _replay(config, csv, tmp_path / "clean.jsonl")
    want = incidents_json(config)
    spans = [(_ts(i["start"]), _ts(i["end"])) for i in want]
    if cut == "between incidents":
        until = T0 + 3 * 86400 - 8 * HOUR  # an afternoon: temperatures low, no slug
        assert all(until > end + 2 * HOUR or until < start for start, end in spans)
    else:
        events = [json.loads(line) for line in (tmp_path / "clean.jsonl").read_text().splitlines()]
        temp = [e for e in events if e["sensor"] == "temp1" and e["rule"] == "high"]
        alarms = [
            (_ts(a["time"]), _ts(b["time"]))
            for a, b in itertools.pairwise(temp)
            if a["state"] == "active" and b["state"] == "cleared"
        ]
        # an activation on the third night with two samples or more before its clear, not
        # the incident's first (so that it was merged into it)
        starts = {start for start, _ in spans}
        on = next(a for a, b in alarms if a > T0 + 2 * 86400 and b - a >= 20 and a not in starts)
        until = on + 10.0  # the next sample: still in alarm
        assert any(start < until < end for start, end in spans)
    state = tmp_path / "state"
    short_csv, config = _write(tmp_path, state, days=4, sensors=sensors, until=until)
    _replay(config, short_csv, tmp_path / "short.jsonl")
    short = incidents_json(config)
    earlier = [i["id"] for i, (start, _) in zip(want, spans, strict=True) if start <= until]
    assert [i["id"] for i in short] == earlier
    if cut == "while one is active":
        assert short[-1]["status"] == "open" and not short[-1]["evidence"]["frozen"]
    assert len(short) < len(want)

    _replay(config, csv, tmp_path / "long.jsonl")
    assert incidents_json(config) == want
    assert _all_verify(state)
