"""The station model: deterministic, diurnal, and each scenario does what its name says."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from simulators.scenarios import SENSORS, Station, load_scenarios, parse_spec, seconds

HOUR = 3600.0


def test_same_seed_same_values_in_any_order() -> None:
    a, b = Station(seed=7, speed=60), Station(seed=7, speed=60)
    times = [0.0, 12.5, 3.0, 600.0, 12.5]
    assert [a.values(t) for t in times] == [b.values(t) for t in reversed(times)][::-1]
    assert Station(seed=8).values(100.0) != Station(seed=7).values(100.0)
    assert set(a.values(0.0)) == set(SENSORS)


def test_accelerated_clock_and_diurnal_flow() -> None:
    st = Station(seed=1, speed=60)  # one real minute = one station hour
    assert st.elapsed(60.0) == HOUR
    night = statistics.mean(st.values(3 * 60 + i)["flow"] for i in range(0, 60, 5))
    morning = statistics.mean(st.values(9 * 60 + i)["flow"] for i in range(0, 60, 5))
    assert morning > 2.0 * night > 0
    flows = [st.values(float(m))["flow"] for m in range(24 * 60)]
    assert 300 < statistics.mean(flows) < 400  # around mean_flow = 350 gpm
    assert len(set(flows)) > 1000  # noisy, not a lookup table


def test_meter_integrates_flow_and_wraps_at_its_digits() -> None:
    st = Station(seed=1, speed=3600, meter_digits=4)  # one real second = one station hour
    day = [st.values(float(h))["meter"] for h in range(25)]
    # 350 gpm for 24 h ~ 67,380 ft3: wraps 6 times at 10**4
    wraps = sum(1 for x, y in itertools.pairwise(day) if y < x)
    assert wraps == 6
    assert all(0 <= x < 10**4 and x == int(x) for x in day)
    plain = Station(seed=1, speed=3600, meter_digits=9)
    assert 60_000 < plain.values(24.0)["meter"] < 75_000
    assert plain.values(24.0)["mill_meter"] == pytest.approx(plain.values(24.0)["meter"] * 0.25, abs=2)


def test_slug_multiplies_flow_and_adds_volume() -> None:
    st = Station(seed=3, speed=60)
    st.inject("slug", "1h", "30m", factor=8)
    before, during = st.values(59.0)["flow"], st.values(75.0)["flow"]
    assert during > 5 * before
    assert st.active(75.0) == ["slug"] and st.active(95.0) == []
    calm = Station(seed=3, speed=60)
    assert st.values(200.0)["meter"] - calm.values(200.0)["meter"] > 3 * (
        calm.values(90.0)["meter"] - calm.values(60.0)["meter"]
    )


def test_ph_and_temperature_excursions_and_units() -> None:
    st = Station(seed=2, speed=60, temp_unit="degF")
    st.inject("ph_excursion", "10m", "20m", value=3.2)
    st.inject("temperature_excursion", "10m", "20m", value=70)
    v = st.values(25.0)  # 25 station minutes
    assert v["ph"] == pytest.approx(3.2, abs=0.1)
    assert v["temperature"] == pytest.approx(158.0, abs=0.5)  # 70 degC in degF
    assert 6.5 < st.values(5.0)["ph"] < 8.0
    assert 55 < st.values(5.0)["temperature"] < 75  # ~18 degC in degF


def test_frozen_sensor_holds_and_device_offline() -> None:
    st = Station(seed=4, speed=60)
    st.inject("frozen_sensor", "10m", "30m", sensor="ph")
    st.inject("device_offline", "1h", "5m")
    held = {st.values(t)["ph"] for t in (10.0, 15.0, 20.0, 39.9)}
    assert len(held) == 1
    assert st.values(41.0)["ph"] not in held
    assert st.online(59.0) and not st.online(61.0) and st.online(65.1)


def test_meter_rollover_and_replacement() -> None:
    st = Station(seed=5, speed=60, meter_digits=6)
    st.inject("meter_rollover", "30m", before=200)
    at = st.values(30.0)["meter"]
    assert 10**6 - 201 <= at <= 10**6 - 199
    assert st.values(40.0)["meter"] < 1000  # wrapped a few minutes later, no jump before
    assert st.values(29.0)["meter"] < at
    rep = Station(seed=5, speed=60)
    rep.inject("meter_replacement", "1h", reading=0, meter="mill_meter")
    assert rep.values(59.9)["mill_meter"] > 100
    assert rep.values(60.0)["mill_meter"] < 5
    assert rep.values(90.0)["mill_meter"] > rep.values(60.0)["mill_meter"]
    assert rep.values(90.0)["meter"] == Station(seed=5, speed=60).values(90.0)["meter"]


def test_specs_and_files(tmp_path: Path) -> None:
    s = parse_spec("ph_excursion@1h+20m:value=3.2,ramp=30s")
    assert (s.name, s.start, s.duration, s.params) == (
        "ph_excursion",
        3600.0,
        1200.0,
        {"value": 3.2, "ramp": "30s"},
    )
    assert parse_spec("slug@10m").duration == 1800.0
    with pytest.raises(ValueError, match="unknown scenario"):
        parse_spec("flood@1m")
    path = tmp_path / "day.json"
    path.write_text(json.dumps([{"name": "slug", "start": "2h", "duration": "1h", "factor": 6}]))
    (loaded,) = load_scenarios(path)
    assert (loaded.start, loaded.duration, loaded.params) == (7200.0, 3600.0, {"factor": 6})
    yaml_path = tmp_path / "day.yaml"
    yaml_path.write_text("scenarios:\n  - {name: device_offline, start: 90, duration: 1m}\n")
    assert load_scenarios(yaml_path)[0].duration == 60.0
    assert seconds("1h30m") == 5400.0
