"""Derived sensors sample by sample: timing, units, windows, and what bad inputs do."""

from __future__ import annotations

import math
from typing import Any

import pytest

from monitor.config import Config, build_config
from monitor.model import Quality, Sample
from monitor.station import Derivation

T0 = 1_780_000_000.0


def station(*derived: dict[str, Any]) -> Config:
    return build_config(
        {
            "station": {"id": "d"},
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": "ft"},
                {"id": "q", "kind": "flow", "unit": "gpm"},
                {"id": "c", "kind": "concentration", "unit": "mg/L"},
                {"id": "p", "kind": "pump"},
                *derived,
            ],
        }
    )


def derived(sid: str, unit: str, expression: str, **more: Any) -> dict[str, Any]:
    return {"id": sid, "kind": "derived", "unit": unit, "expression": expression, **more}


def run(config: Config, samples: list[Sample]) -> tuple[list[Sample], Derivation]:
    d = Derivation(config.derived, config.rules)
    out: list[Sample] = []
    for s in samples:
        out.extend(d.feed(s))
    out.extend(d.flush())
    return out, d


def test_inputs_read_at_one_time_make_one_sample_at_that_time() -> None:
    config = station(derived("sum", "gpm", "q + q2"), {"id": "q2", "kind": "flow", "unit": "L/s"})
    out, _ = run(config, [Sample("q", T0, 100.0), Sample("q2", T0, 1.0), Sample("q", T0 + 10, 50.0)])
    # Made when the later sample arrives (not at q's own sample), then flushed at the end.
    assert [s.time for s in out] == [T0, T0 + 10]
    assert out[0].value == pytest.approx(100.0 + 15.850323141)  # 1 L/s = 15.85 gpm
    assert out[1].value == pytest.approx(50.0 + 15.850323141)


def test_station_inflow_from_the_rate_of_level() -> None:
    config = station(
        derived("inflow", "gpm", "q + area * rate(lvl, 60s)", constants={"area": "80 ft2"}),
    )
    samples = []
    for k in range(10):  # the level rises 0.1 ft per 10 s while 200 gpm are pumped
        samples += [Sample("lvl", T0 + 10 * k, 3.0 + 0.01 * k * 10), Sample("q", T0 + 10 * k, 200.0)]
    out, _ = run(config, samples)
    # 80 ft2 x 0.01 ft/s = 0.8 ft3/s = 359.07 gpm stored, plus 200 pumped
    assert out[-1].value == pytest.approx(200.0 + 0.8 * 448.831169, rel=1e-6)
    assert math.isnan(run(config, samples[:2])[1]._vals[0]) is False  # one level reading: no rate yet
    assert run(config, samples[:2])[0] == []


def test_mass_loading_in_pounds_per_day() -> None:
    config = station(derived("load", "lb/d", "c * q"))
    out, _ = run(config, [Sample("c", T0, 10.0), Sample("q", T0, 694.444444)])  # 1 MGD
    assert out[0].value == pytest.approx(83.45, rel=1e-3)  # 10 mg/L x 1 MGD x 8.345


@pytest.mark.parametrize(
    "bad",
    [
        Sample("q", T0 + 10, math.nan),
        Sample("q", T0 + 10, math.inf),
        Sample("q", T0 + 10, -5.0),  # below the flow kind's physical range
        Sample("q", T0 + 10, 100.0, Quality.COMM_FAILURE),
        Sample("q", T0 + 10, 100.0, Quality.BAD_DATA),
    ],
)
def test_a_bad_input_stops_the_derived_sensor_until_it_is_good_again(bad: Sample) -> None:
    config = station(derived("twice", "gpm", "q * 2"))
    samples = [Sample("q", T0, 10.0), bad, Sample("q", T0 + 20, 30.0)]
    out, d = run(config, samples)
    assert [(s.time, round(s.value, 9)) for s in out] == [(T0, 20.0), (T0 + 20, 60.0)]
    assert d.skipped == 1


def test_an_input_older_than_max_input_age_stops_it() -> None:
    config = station(derived("both", "gpm", "q + q2", max_input_age="1m"), {"id": "q2", "kind": "flow"})
    samples = [
        Sample("q", T0, 1.0),
        Sample("q2", T0, 2.0),
        Sample("q", T0 + 30, 1.0),
        Sample("q", T0 + 90, 1.0),
    ]
    out, d = run(config, samples)
    assert [s.time for s in out] == [T0, T0 + 30]  # q2 is 90 s old at T0 + 90
    assert d.skipped == 1


def test_running_choice_windows_and_division_by_zero() -> None:
    config = station(
        derived("when", "gpm", "q if running(p) else 0"),
        derived("avg", "gpm", "mean(q, 30s)"),
        derived("tot", "gpm", "sum(q, 30s)"),
        derived("ratio", "1", "q / q"),
    )
    samples = []
    for k, (q, p) in enumerate([(10.0, 0.0), (20.0, 1.0), (30.0, 1.0), (0.0, 0.0), (40.0, 1.0)]):
        samples += [Sample("q", T0 + 10 * k, q), Sample("p", T0 + 10 * k, p)]
    out, _ = run(config, samples)
    by = {
        sid: [(s.time - T0, round(s.value, 9)) for s in out if s.sensor == sid]
        for sid in ("when", "avg", "tot", "ratio")
    }
    assert by["when"] == [(0, 0.0), (10, 20.0), (20, 30.0), (30, 0.0), (40, 40.0)]
    assert by["avg"][-1] == (40, round((30.0 + 0.0 + 40.0) / 3, 9))  # (10, 40] holds 3 samples
    assert by["tot"][-1] == (40, 70.0)
    assert [t for t, _ in by["ratio"]] == [0, 10, 20, 40]  # 0 / 0 makes no sample, never a crash


def test_derived_of_derived_and_out_of_order_inputs() -> None:
    config = station(derived("a", "gpm", "q * 2"), derived("b", "gpm", "a + q"))
    out, _ = run(config, [Sample("q", T0 + 10, 1.0), Sample("q", T0, 5.0), Sample("q", T0 + 20, 2.0)])
    # The sample that went back in time is left to the engine (which counts and logs it).
    assert [(s.sensor, s.time - T0, round(s.value, 9)) for s in out] == [
        ("a", 10, 2.0),
        ("b", 10, 3.0),
        ("a", 20, 4.0),
        ("b", 20, 6.0),
    ]


def test_a_step_forward_does_not_silence_a_derived_sensor_of_device_stamped_readings() -> None:
    """`q` carries its device's time (kept by a gateway clock step), `q2` is polled on the
    gateway clock, an hour behind until NTP steps it forward at +65 s. `q.x2` (of `q` only)
    goes on every 10 s across the step; `q2.x2` is made on the new clock. Before: the step
    moved the evaluation time the device's `q` had set an hour ahead, and no derived sample
    was made for an hour (`q.x2` stale, a false stale alarm on a healthy device)."""
    config = station(
        derived("q.x2", "gpm", "q * 2"),
        derived("q2.x2", "gpm", "q2 * 2"),
        {"id": "q2", "kind": "flow", "unit": "gpm"},
    )
    d = Derivation(config.derived, config.rules)
    out: list[Sample] = []
    for k in range(0, 61, 10):
        out += d.feed(Sample("q", T0 + k, 100.0))
        out += d.feed(Sample("q2", T0 + k - 3600, 50.0))
    d.shift(3600.0, keep={"q"})
    for k in range(70, 101, 10):
        out += d.feed(Sample("q", T0 + k, 100.0))
        out += d.feed(Sample("q2", T0 + k, 50.0))
    after = [(s.sensor, s.time - T0) for s in out if s.time >= T0 + 60]
    assert ("q.x2", 70.0) in after and ("q.x2", 90.0) in after
    assert ("q2.x2", 90.0) in after


def test_a_bad_device_reading_as_the_latest_input_does_not_move_the_evaluation_with_a_step() -> None:
    """As above, but the device's last reading before the step is bad (the flow meter sent
    NaN at +60 s: BAD_DATA, which stops `q.x2` without being a value). It still came on the
    device's clock, so the step moves neither it nor the evaluation time it set: `q.x2` goes
    on every 10 s from +70 s. Before: only a good reading set its input's time, the bad one
    was taken for the gateway's, the step moved the evaluation time an hour ahead, and
    `q.x2` made nothing for an hour (a false stale alarm on a healthy device)."""
    config = station(
        derived("q.x2", "gpm", "q * 2"),
        derived("q2.x2", "gpm", "q2 * 2"),
        {"id": "q2", "kind": "flow", "unit": "gpm"},
    )
    d = Derivation(config.derived, config.rules)
    out: list[Sample] = []
    for k in range(0, 61, 10):
        out += d.feed(Sample("q2", T0 + k - 3600, 50.0))
        out += d.feed(
            Sample("q", T0 + k, 100.0) if k < 60 else Sample("q", T0 + k, math.nan, Quality.BAD_DATA)
        )
    d.shift(3600.0, keep={"q"})
    for k in range(70, 121, 10):
        out += d.feed(Sample("q2", T0 + k, 50.0))
        out += d.feed(Sample("q", T0 + k, 100.0))
    mine = [s.time - T0 for s in out if s.sensor == "q.x2"]
    assert mine == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 70.0, 80.0, 90.0, 100.0, 110.0]
    assert all(s.value == pytest.approx(200.0) for s in out if s.sensor == "q.x2")
    assert [s.time - T0 for s in out if s.sensor == "q2.x2" and s.time > T0 + 60] == [
        70.0,
        80.0,
        90.0,
        100.0,
        110.0,
    ]
