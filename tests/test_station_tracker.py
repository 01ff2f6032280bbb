"""Pumps and the wet well sample by sample: duty alarms, bad readings, overflows, restarts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from monitor.config import Config, build_config
from monitor.model import Condition, ConditionState, Quality, Rule, Sample
from monitor.station import StationStore, StationTracker
from monitor.station.report import report

T0 = 1_780_000_000.0


def station(tmp: Path, **well: Any) -> Config:
    return build_config(
        {
            "station": {"id": "t", "timezone": "America/New_York"},
            "state_dir": str(tmp / "state"),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft",
                 "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
                {"id": "p1", "kind": "pump",
                 "pump": {"capacity": "500 gpm", "max_starts_per_hour": 3, "max_run": "30m"}},
                {"id": "p2", "kind": "pump", "pump": {"capacity": "0.72 MGD"}},
                {"id": "inflow", "kind": "flow", "unit": "gpm"},
                {"id": "switch", "kind": "status"},
            ],
            "wet_well": {"level": "lvl", "inflow": "inflow", "overflow_switch": "switch",
                         "fail_to_start_delay": "2m", **well},
        }
    )  # fmt: skip


def feed(tracker: StationTracker, samples: list[Sample]) -> list[Condition]:
    out: list[Condition] = []
    for s in samples:
        out.extend(tracker.feed(s))
    return out


def states(conds: list[Condition], rule: Rule) -> list[tuple[float, str]]:
    return [(c.time - T0, str(c.state)) for c in conds if c.rule is rule]


def test_runs_starts_and_a_bad_reading_in_the_middle_of_a_run(tmp_path: Path) -> None:
    tracker = StationTracker(station(tmp_path))
    pump = "p2"
    readings = [0, 1, 1, math.nan, 7.0, 1, 0, 0, 1, 0]  # NaN and 7 are bad data: the run goes on
    samples = [Sample(pump, T0 + 60 * k, float(v)) for k, v in enumerate(readings)]
    samples.insert(4, Sample(pump, T0 + 200, 0.0, Quality.COMM_FAILURE))
    feed(tracker, samples)
    stats = tracker.pumps[pump]
    assert stats.starts == 2
    assert stats.run_seconds == 5 * 60 + 60  # 60..360 and 480..540
    assert stats.longest_run == 300


def test_too_many_starts_per_hour_and_a_run_longer_than_max_run(tmp_path: Path) -> None:
    tracker = StationTracker(station(tmp_path))
    samples = [Sample("p1", T0 - 1, 0.0)]
    for k in range(4):  # four 5-minute runs, ten minutes apart
        samples += [Sample("p1", T0 + 600 * k, 1.0), Sample("p1", T0 + 600 * k + 300, 0.0)]
    samples += [Sample("p1", T0 + 3700, 0.0), Sample("p1", T0 + 4300, 0.0)]
    samples += [Sample("p1", T0 + 5000 + 60 * k, 1.0) for k in range(40)]  # one long run
    samples += [Sample("p1", T0 + 7500, 0.0)]
    conds = feed(tracker, samples)
    assert tracker.pumps["p1"].starts == 5
    # The fourth start is the 4th in an hour (> 3); the alarm clears once the first is an hour old.
    assert states(conds, Rule.PUMP_STARTS) == [(1800.0, "active"), (3700.0, "cleared")]
    assert states(conds, Rule.LONG_RUN) == [(5000.0 + 60 * 31, "active"), (7500.0, "cleared")]


def test_fail_to_start_needs_the_delay_and_clears_when_a_pump_runs(tmp_path: Path) -> None:
    tracker = StationTracker(station(tmp_path))
    samples = [Sample("p1", T0, 0.0), Sample("p2", T0, 0.0)]
    samples += [Sample("lvl", T0 + 10 * k, 4.0 + 0.05 * k) for k in range(40)]  # above 5 ft from k=21
    samples += [Sample("p2", T0 + 400, 1.0), Sample("lvl", T0 + 410, 5.5)]
    conds = feed(tracker, samples)
    assert states(conds, Rule.FAIL_TO_START) == [(330.0, "active"), (400.0, "cleared")]
    assert conds[0].sensor == "lvl" and "no pump running" in conds[0].message


def test_overflow_switch_opens_a_record_and_inflow_gives_its_volume(tmp_path: Path) -> None:
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0, 1.0), Sample("p2", T0, 0.0), Sample("lvl", T0, 8.5)]
    samples += [Sample("switch", T0 + 60, 1.0), Sample("inflow", T0 + 60, 900.0)]
    samples += [Sample("lvl", T0 + 60 + 60 * k, 9.1) for k in range(1, 11)]  # 10 min at the crest
    samples += [Sample("lvl", T0 + 720, 8.9), Sample("switch", T0 + 780, 0.0)]
    conds = feed(tracker, samples)
    assert states(conds, Rule.OVERFLOW) == [(60.0, "active"), (780.0, "cleared")]
    assert next(c for c in conds if c.rule is Rule.OVERFLOW).message.startswith("overflow switch on")
    tracker.save()
    (rec,) = store.overflows(T0, T0 + 3600)
    assert (rec.start, rec.end, rec.peak, rec.method) == (T0 + 60, T0 + 780, 9.1, "inflow")
    # 900 gpm in, pump 1 (500 gpm) running: 400 gpm over the crest from 120 s to 720 s = 10 min
    assert rec.volume_gal == pytest.approx(4000.0)
    assert rec.due == T0 + 60 + 7200
    figures = report(store, ["p1", "p2"], T0, T0 + 3600, config.station.zone)
    assert figures["overflows"][0]["volume_gal"] == 4000.0  # type: ignore[index]
    store.close()


def test_weir_volume_from_the_level_over_the_crest(tmp_path: Path) -> None:
    config = station(tmp_path, weir={"length": "24 in", "coefficient": 3.33})
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, [Sample("lvl", T0 + 60 * k, 9.25) for k in range(11)] + [Sample("lvl", T0 + 660, 8.0)])
    # head 0.25 ft for 10 min: 3.33 x 2 ft x 0.125 = 0.8325 cfs = 373.66 gpm, then half a minute's worth
    # on the way down (trapezoids between level readings)
    (rec,) = store.overflows(T0, T0 + 3600)
    assert rec.method == "weir" and rec.end == T0 + 660
    assert rec.volume_gal == pytest.approx(0.8325 * 448.831169 * 10.5, rel=1e-6)
    store.close()


def test_weir_volume_is_not_stretched_by_a_float_switch_on_another_clock(tmp_path: Path) -> None:
    """As above, the level device-stamped (its own clock) and the float switch polled on a
    gateway clock an hour ahead: the float's readings, an hour after the level's by their
    stamps, add nothing to the volume (it is integrated between the level's readings).
    Before: each float reading added an hour of flow over the weir: 246,610 gal, not 3,923."""
    config = station(tmp_path, weir={"length": "24 in", "coefficient": 3.33})
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, device={"lvl"})
    samples: list[Sample] = []
    for k in range(11):
        samples += [Sample("lvl", T0 + 60 * k, 9.25), Sample("switch", T0 + 3600 + 60 * k, 1.0)]
    feed(tracker, [*samples, Sample("lvl", T0 + 660, 8.0), Sample("switch", T0 + 3600 + 660, 0.0)])
    (rec,) = store.overflows(T0, T0 + 7200)
    assert rec.method == "weir" and rec.start == T0
    assert rec.volume_gal == pytest.approx(0.8325 * 448.831169 * 10.5, rel=1e-6)
    store.close()


def test_replaying_again_does_not_count_twice_and_a_restart_resumes_an_open_run(tmp_path: Path) -> None:
    config = station(tmp_path)
    samples = [Sample("p1", T0 + 60 * k, float(k % 4 == 1 or k % 4 == 2)) for k in range(20)]
    for _ in range(2):  # the same history twice
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store)
        feed(tracker, samples)
        tracker.save()
        store.close()
    store = StationStore.open(config.state_dir)
    pumps = report(store, ["p1"], T0, T0 + 3600, config.station.zone)["pumps"]
    assert pumps == [
        {"sensor": "p1", "run_hours": round(5 * 120 / 3600, 4), "starts": 5, "starts_per_hour": 5.0,
         "longest_run_hours": round(120 / 3600, 4), "unmonitored_hours": 0.0}
    ]  # fmt: skip
    # A run open when the daemon stopped carries on after the restart, not counted again.
    tracker = StationTracker(config, store)
    feed(tracker, [Sample("p1", T0 + 2000, 1.0)])
    tracker.save()
    resumed = StationTracker(config, store, resume=True)
    assert resumed.pumps["p1"].running and resumed.pumps["p1"].run_start == T0 + 2000
    feed(resumed, [Sample("p1", T0 + 2600, 0.0)])
    assert resumed.pumps["p1"].starts == 0 and resumed.pumps["p1"].run_seconds == 600
    store.close()


def test_a_clock_step_backwards_changes_nothing(tmp_path: Path) -> None:
    tracker = StationTracker(station(tmp_path))
    feed(tracker, [Sample("p1", T0, 0.0), Sample("p1", T0 + 60, 1.0), Sample("lvl", T0 + 60, 4.0)])
    assert feed(tracker, [Sample("p1", T0 - 3600, 0.0), Sample("lvl", T0 - 3000, 9.5)]) == []
    assert tracker.pumps["p1"].running and tracker.overflow is None


def test_conditions_carry_what_an_operator_needs(tmp_path: Path) -> None:
    tracker = StationTracker(station(tmp_path))
    conds = feed(tracker, [Sample("lvl", T0, 8.2), Sample("lvl", T0 + 10, 9.3)])
    high, over = conds
    assert (high.rule, high.state, high.limit) == (Rule.HIGH_LEVEL, ConditionState.ACTIVE, 8.0)
    assert (over.rule, over.limit) == (Rule.OVERFLOW, 9.0)
    assert "report within 2 h" in over.message


def test_a_pumps_speed_and_current_are_kept_for_the_console(tmp_path: Path) -> None:
    config = build_config(
        {
            "station": {"id": "t"},
            "sensors": [
                {"id": "p1", "kind": "pump", "pump": {"speed": "p1.hz", "amps": "p1.a"}},
                {"id": "p1.hz", "kind": "speed", "unit": "Hz"},
                {"id": "p1.a", "kind": "current"},
            ],
        }
    )
    tracker = StationTracker(config)
    feed(tracker, [Sample("p1", T0, 1.0), Sample("p1.hz", T0, 58.5), Sample("p1.a", T0, 41.0)])
    feed(tracker, [Sample("p1.a", T0 + 10, 1e9)])  # beyond the current kind's range: kept out
    assert tracker.readings == {"p1": {"speed": 58.5, "amps": 41.0}}


def test_a_station_store_that_refuses_writes_never_stops_the_alarms(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    # As root no permission makes SQLite refuse, and a full disk cannot be had on demand:
    # closing the connection makes every write fail with a real sqlite3 error instead.
    store.db.close()
    conds = feed(tracker, [Sample("p1", T0, 0.0), Sample("p1", T0 + 60, 1.0), Sample("lvl", T0 + 60, 9.5)])
    assert [c.rule for c in conds] == [Rule.HIGH_LEVEL, Rule.OVERFLOW]
    tracker.save()
    assert tracker.store_errors >= 3 and tracker.pumps["p1"].starts == 1
    refused = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert len(refused) == 1 and "station store" in refused[0].getMessage()
