"""Bad readings (issue 12 item 4, issue 13 "bad values are not counted in monitor run"):
every one is counted and logged once per episode whichever path marked it bad, kept
with its quality, written to InfluxDB without the absurd number, and raises the
diagnostic bad-value alarm after its delay; it never reaches a baseline or a limit."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.config import build_config
from monitor.daemon import Daemon
from monitor.engine import Engine
from monitor.engine.badvalue import BAD_VALUE_DELAY
from monitor.model import ConditionState, ManualClock, Quality, Rule, Sample
from monitor.sinks.lineproto import SampleSerializer, SeriesInfo, condition_line
from tests.engine_helpers import T0, canon, live, station

SENSORS: list[dict[str, Any]] = [
    {"id": "ph", "kind": "ph", "stale_after": "1h"},
    {"id": "flow", "kind": "flow", "unit": "gpm", "bad_values": [-9999], "stale_after": "1h"},
]


def test_monitor_run_counts_every_bad_reading_whichever_path_marked_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = build_config(
        {
            "station": {"id": "ps-bad"},
            "state_dir": str(tmp_path),
            "console": {"enabled": False},
            "sensors": SENSORS,
        }
    )
    daemon = Daemon(config, ManualClock(T0))
    caplog.set_level(logging.WARNING, logger="monitor.engine")
    daemon.pipeline.process(
        [
            Sample("ph", T0, 15.0),  # out of the plausible range: the daemon's validate marks it
            Sample("ph", T0 + 1, math.nan, Quality.BAD_DATA),  # a source marked it (a device error value)
            Sample("ph", T0 + 2, 3.4028235e38),  # FLOAT32's largest
            Sample("flow", T0, -9999.0),  # the sensor's own error value
            Sample("flow", T0 + 1, 1e30),
            Sample("flow", T0 + 2, math.nan, Quality.COMM_FAILURE),  # not bad data: not counted
        ]
    )
    assert daemon.engine.counters.bad_values == 5
    assert daemon.health().engine.bad_values == 5
    assert daemon.engine.counters.bad_by_sensor == {"ph": 3, "flow": 2}
    warnings = [r.getMessage() for r in caplog.records if "not believable" in r.getMessage()]
    assert len(warnings) == 2  # once per episode and sensor
    stored = daemon.sink.store.query("ph", T0 - 1, T0 + 10)
    assert [s.quality for s in stored] == [Quality.BAD_DATA] * 3
    assert daemon.engine.baseline_mean("ph") is None  # none reached a baseline
    daemon.sink.close()


def test_a_bad_reading_goes_to_influxdb_with_its_quality_but_without_its_value() -> None:
    writer = SampleSerializer("ps-1", {"flow": SeriesInfo("flow", "gpm")})
    good, bad, comm = writer.samples(
        [
            Sample("flow", T0, 100.0),
            Sample("flow", T0 + 1, 1e300, Quality.BAD_DATA),
            Sample("flow", T0 + 2, math.nan, Quality.COMM_FAILURE),
        ]
    )
    assert "value=100.0,quality=0i" in good
    assert "value=" not in bad and "quality=1i" in bad
    assert "value=" not in comm and "quality=2i" in comm
    cols = writer.columns(["flow"], [0], [T0], [1e300], [1])
    assert "value=" not in cols[0] and "quality=1i" in cols[0]


def test_the_bad_value_alarm_comes_after_its_delay_and_clears_on_a_believable_reading() -> None:
    config = station(*SENSORS)
    engine = Engine(config.rules, ManualClock())
    times = T0 + np.arange(0.0, 200.0, 10.0)
    values = np.where((times >= T0 + 50) & (times < T0 + 150), 1e30, 100.0)
    samples = [Sample("flow", float(t), float(v)) for t, v in zip(times, values, strict=True)]
    conds = [c for c in live(engine, samples) if c.rule is Rule.BAD_VALUE]
    active, cleared = conds
    assert active.state is ConditionState.ACTIVE and active.time == T0 + 50 + BAD_VALUE_DELAY
    assert "bad value 1e+30" in active.message and "plausible 0 gpm to 1e+06 gpm" in active.message
    assert cleared.state is ConditionState.CLEARED and cleared.time == T0 + 150
    assert "value=" not in condition_line("ps-1", active)
    # the replay path raises the same
    replayed = Engine(config.rules, ManualClock()).replay(np.ones(times.size, np.int32), times, values)
    assert canon([c for c in replayed.conditions if c.rule is Rule.BAD_VALUE]) == canon(conds)
