"""`station.sqlite` as the release before schema 5 wrote it (tests/cases/station-schema-4,
made by its own code, not by a `Schema` cut short here), opened by this one: the overflow open
in it goes on, the restart's missing polls said, and the older release refuses the file after."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from monitor.config import Config, build_config
from monitor.model import Sample
from monitor.sqlite import Schema, connect
from monitor.station import StationStore, StationTracker
from monitor.station.report import report
from monitor.station.store import SCHEMA

RELEASE = Path(__file__).parent / "cases" / "station-schema-4"
T0 = 1_780_000_000.0


def _config(state: Path) -> Config:
    """The config `make_station.py` wrote the file with."""
    return build_config(
        {
            "station": {"id": "t", "timezone": "America/New_York"},
            "state_dir": str(state),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft",
                 "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            ],
            "wet_well": {"level": "lvl", "weir": {"length": "24 in", "coefficient": 3.33}},
        }
    )  # fmt: skip


def test_a_station_store_the_last_release_wrote_upgrades_and_its_overflow_goes_on(tmp_path: Path) -> None:
    """The daemon of the last release stopped at +600 s with a weir overflow open (read every
    30 s) and p1 running; this release starts at +780 s (three polls not taken) and the level
    falls under the crest at +1230 s. The record ends there, its volume partial for the polls
    the restart missed, the weir's estimate between the levels either side; the pump's run goes
    on, the three minutes monitored (shorter than the sensors' `stale_after`)."""
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(RELEASE / "station.sqlite", state / "station.sqlite")
    config = _config(state)
    store = StationStore.open(state)
    assert store.db.execute("PRAGMA user_version").fetchone() == (SCHEMA.version,)
    tracker = StationTracker(config, store, resume=True)
    for t in range(780, 1201, 30):
        for s in (Sample("lvl", T0 + t, 9.5), Sample("p1", T0 + t, 1.0), Sample("p2", T0 + t, 0.0)):
            tracker.feed(s)
    tracker.feed(Sample("lvl", T0 + 1230, 8.0))
    tracker.save()
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end, rec.method) == (T0, T0 + 1230, "weir")
    assert rec.volume_note == (
        "partial: level readings missing from 2026-05-28T20:36:40Z to 2026-05-28T20:39:40Z;"
        " the flow over the weir then is estimated from the levels read before and after"
    )
    pumps = report(store, ["p1"], T0, T0 + 3600, config.station.zone)["pumps"]
    assert isinstance(pumps, list)
    assert (pumps[0]["run_hours"], pumps[0]["unmonitored_hours"]) == (round(1230 / 3600, 4), 0.0)
    store.close()
    with pytest.raises(
        Exception, match=rf"newer station-monitor \(schema {SCHEMA.version}, this release reads up to 4\)"
    ):
        connect(state / "station.sqlite", Schema("station store", SCHEMA.migrations[:4]))
