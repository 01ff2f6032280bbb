"""How this file was made: with the release before schema 5 of `station.sqlite` (main at
1b72cae^1, before the overflow gaps and daily points merged), as
    git archive 1b72cae^1 monitor | tar -x -C /tmp/release
    cd tests/cases/station-schema-4 && PYTHONPATH=/tmp/release python make_station.py .
A weir overflow open at 9.5 ft read every 30 s from T0 to T0 + 600 s, pump p1 running, the
daemon stopped then (its progress saved). tests/test_station_upgrade.py opens it with the
current code."""

import sys

from monitor.config import build_config
from monitor.model import Sample
from monitor.station import StationStore, StationTracker

T0 = 1_780_000_000.0
config = build_config(
    {
        "station": {"id": "t", "timezone": "America/New_York"},
        "state_dir": sys.argv[1],
        "sensors": [
            {"id": "lvl", "kind": "level", "unit": "ft",
             "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
            {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
        ],
        "wet_well": {"level": "lvl", "weir": {"length": "24 in", "coefficient": 3.33}},
    }
)  # fmt: skip
store = StationStore.open(config.state_dir)
tracker = StationTracker(config, store)
for t in range(0, 601, 30):
    for sample in (Sample("lvl", T0 + t, 9.5), Sample("p1", T0 + t, 1.0), Sample("p2", T0 + t, 0.0)):
        tracker.feed(sample)
tracker.save()
store.close()
