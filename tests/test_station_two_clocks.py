"""A wet well whose readings come on two clocks (a device-stamped level transmitter beside
pumps and a float switch polled on the gateway's) while both clocks are right: no step, so
every alarm and overflow record is what a well on one clock gives (the tracker with no
device-stamped sensor, the behaviour before two clocks were told apart)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import build_config
from monitor.model import Quality, Rule, Sample
from monitor.reconcile import device_stamped
from monitor.station import StationStore, StationTracker
from tests.examples import examples
from tests.test_clock_step import watched_daemon
from tests.test_clock_steps import WELL, mixed_station
from tests.test_pipeline import close
from tests.test_station_tracker import T0, feed, states, station

Poll = Callable[[int], list[tuple[str, float]]]


def polled(n: int, every: float, poll: Poll) -> list[Sample]:
    """`n` polls `every` seconds apart, each reading `poll(t)` stamped at its poll time."""
    return [Sample(s, T0 + k * every, float(v)) for k in range(n) for s, v in poll(int(k * every))]


def _gal(volume: float | None) -> float | None:
    """A volume to the thousandth of a gallon: summed in another order, the last bits differ."""
    return None if volume is None else round(volume, 3)


def outcome(tmp: Path, samples: list[Sample], device: Collection[str], **well: Any) -> tuple[object, object]:
    """The conditions and the overflow records (start, due, end, volume) of `samples`."""
    config = station(tmp, **well)
    store = StationStore.open(config.state_dir)
    try:
        tracker = StationTracker(config, store, device=device)
        conds = [(c.time - T0, c.sensor, c.rule, c.state) for c in feed(tracker, samples)]
        tracker.save()
        records = [
            (r.start - T0, r.due - T0, None if r.end is None else r.end - T0, _gal(r.volume_gal))
            for r in store.overflows(T0 - 86400, T0 + 86400)
        ]
        return tuple(conds), tuple(records)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("device", "float_switch"),
    [({"lvl"}, False), ({"p1", "p2"}, True), ({"p1", "p2"}, False)],
    ids=["level-own-clock", "pumps-own-clock-with-float", "pumps-own-clock"],
)
def test_a_pump_that_trips_with_the_level_above_lead_on_raises_fail_to_start_on_two_clocks(
    tmp_path: Path, device: set[str], float_switch: bool
) -> None:
    """p1 runs with the level at 6 ft (above lead_on) and trips at +100 s; nothing starts.
    Fail to start is due 2 min later, at the level's reading at +220 s, as on one clock.
    Before (no step at all): the delay began at p1's reading, on the other clock than the
    level's; the level's readings could not measure it and p1's, unchanged, are not judged:
    no fail_to_start while the well filled."""

    def poll(t: int) -> list[tuple[str, float]]:
        out = [("lvl", 6.0), ("p1", 1.0 if t < 100 else 0.0), ("p2", 0.0)]
        return [*out, ("switch", 0.0)] if float_switch else out

    samples = polled(40, 10.0, poll)
    tracker = StationTracker(station(tmp_path), device=device)
    assert states(feed(tracker, samples), Rule.FAIL_TO_START) == [(220.0, "active")]
    assert outcome(tmp_path / "a", samples, device) == outcome(tmp_path / "b", samples, ())


@pytest.mark.parametrize("weir", [False, True], ids=["inflow", "weir"])
def test_an_overflow_goes_on_counting_and_calling_when_the_level_transmitter_goes_quiet(
    tmp_path: Path, weir: bool
) -> None:
    """The level (its own clock) reads 9.5 ft, over the overflow setpoint, until +30 s and
    then its transmitter goes quiet; the float switch, inflow (800 gpm) and pumps (off) go
    on on the gateway's clock to +390 s. The overflow's volume goes on to +390 s (5,200 gal
    by inflow) and fail_to_start is raised at +120 s, as on one clock. Before: the volume
    stopped at the level's last reading (267 gal by inflow, 528 not 6,870 over a weir: a
    Superintendent's SSO report short by nine tenths) and no fail_to_start at all."""

    def poll(t: int) -> list[tuple[str, float]]:
        level = [("lvl", 9.5)] if t < 40 else []
        return [*level, ("p1", 0.0), ("p2", 0.0), ("switch", 1.0), ("inflow", 800.0)]

    samples = polled(40, 10.0, poll)
    well: dict[str, Any] = {"weir": {"length": "24 in", "coefficient": 3.33}} if weir else {}
    conds, records = outcome(tmp_path / "a", samples, {"lvl"}, **well)
    assert (conds, records) == outcome(tmp_path / "b", samples, (), **well)
    fail = StationTracker(station(tmp_path / "c", **well), device={"lvl"})
    assert states(feed(fail, samples), Rule.FAIL_TO_START) == [(120.0, "active")]
    if not weir:
        assert records == ((0.0, 7200.0, None, pytest.approx(5200.0)),)


SENSORS = ("lvl", "p1", "p2", "switch", "inflow")
DEVICE_SETS = ({"lvl"}, {"p1", "p2"}, {"switch"}, {"lvl", "inflow"}, {"p1", "switch"})


@st.composite
def no_step_streams(draw: st.DrawFn) -> tuple[list[Sample], set[str], bool]:
    """Polls of the whole well, both clocks right: the level wandering across lead_on,
    high and overflow, pumps starting and tripping, the float switch and inflow changing,
    some readings bad or missing (a quiet transmitter), each poll in any order."""
    every = draw(st.sampled_from([5.0, 10.0, 30.0, 60.0]))
    n = draw(st.integers(10, 60))
    level = draw(st.lists(st.sampled_from([3.0, 4.5, 5.5, 6.5, 8.5, 9.5]), min_size=n, max_size=n))
    samples: list[Sample] = []
    for k in range(n):
        values = {
            "lvl": level[k],
            "p1": float(draw(st.booleans())) if draw(st.integers(0, 5)) == 0 else float(k % 7 < 3),
            "p2": float(draw(st.integers(0, 9)) == 0),
            "switch": float(level[k] >= 9.0 and draw(st.booleans())),
            "inflow": draw(st.sampled_from([300.0, 800.0, 1500.0])),
        }
        order = draw(st.permutations(SENSORS))
        for s in order:
            fate = draw(st.integers(0, 9))
            if fate == 0:
                continue  # not read this poll
            quality = Quality.COMM_FAILURE if fate == 1 else Quality.GOOD
            samples.append(Sample(s, T0 + k * every, values[s], quality))
    return samples, set(draw(st.sampled_from(DEVICE_SETS))), draw(st.booleans())


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=no_step_streams())
def test_with_no_step_two_clocks_judge_as_one(tmp_path_factory: pytest.TempPathFactory, stream: Any) -> None:
    """No clock step: whichever sensors carry their device's time, every alarm transition and
    overflow record (start, due, end, volume) is what the well on one clock gives."""
    samples, device, weir = stream
    well: dict[str, Any] = {"weir": {"length": "24 in", "coefficient": 3.33}} if weir else {}
    tmp = tmp_path_factory.mktemp("two")
    assert outcome(tmp / "a", samples, device, **well) == outcome(tmp / "b", samples, (), **well)


def test_the_daemon_raises_fail_to_start_when_a_device_stamped_pump_trips(tmp_path: Path) -> None:
    """Through the daemon, clocks right, no step: the level polled over Modbus (gateway
    clock), p1's run feedback over MQTT with its controller's time (`time_path`). p1 runs with
    the level at 6 ft and trips at +100 s: fail_to_start at +220 s, journaled; p1 starts
    again at +300 s and ends it. Before: nothing journaled while the well filled."""
    config = mixed_station(tmp_path)
    assert "p1" in device_stamped(config) and "lvl" not in device_stamped(config)
    daemon, wall, mono = watched_daemon(config)
    try:
        for k in range(0, 401, 10):
            wall.set(T0 + k)
            mono.set(1000.0 + k)
            daemon.tick()
            running = 1.0 if k < 100 or k >= 300 else 0.0
            daemon.pipeline.process([Sample("lvl", T0 + k, 6.0), Sample("p1", T0 + k, running)])
        journal = daemon.alarms.journal.entries(sensor="lvl")
        assert [(e.rule, e.event, e.time - T0) for e in journal if e.rule is Rule.FAIL_TO_START] == [
            (Rule.FAIL_TO_START, "activated", 220.0),
            (Rule.FAIL_TO_START, "cleared", 300.0),
        ]
    finally:
        close(daemon)


def test_an_overflow_volume_by_a_derived_inflow_is_not_counted_twice(tmp_path: Path) -> None:
    """One clock, no step: the level polled from the wet well's RTU, the inflow derived from
    the flow meter on another PLC (`qin`, gpm). A derived sample is made when its input's
    next reading comes, so the daemon feeds the tracker the level's poll at +k s before the
    inflow of +k-10 s. The level is over overflow to +610 s at 800 gpm in, no pump running:
    7,867 gal (the first 20 s, before the inflow is known at a level reading, count nothing).
    Before: each late inflow set the integration back 10 s and the next level reading counted
    those seconds again: twice the spill on the SSO report."""
    config = build_config(
        {
            "station": {"id": "ps-derived-inflow", "timezone": "UTC"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                *WELL,
                {"id": "qin", "kind": "flow", "unit": "gpm"},
                {"id": "inflow", "kind": "derived", "unit": "gpm", "expression": "qin"},
            ],
            "wet_well": {"level": "lvl", "pumps": ["p1"], "inflow": "inflow", "fail_to_start_delay": "2m"},
            "modbus": {"devices": [
                {"name": "rtu", "host": "127.0.0.1", "port": 5020, "fields": [
                    {"sensor": "lvl", "register": "holding", "address": 0, "type": "UINT16", "scale": 0.01},
                    {"sensor": "p1", "register": "coil", "address": 0, "type": "BIT"}]},
                {"name": "flow", "host": "127.0.0.1", "port": 5021, "fields": [
                    {"sensor": "qin", "register": "holding", "address": 0, "type": "UINT16"}]}]},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip
    daemon, wall, mono = watched_daemon(config)
    try:
        for k in range(0, 611, 10):
            wall.set(T0 + k)
            mono.set(1000.0 + k)
            daemon.tick()
            daemon.pipeline.process([Sample("lvl", T0 + k, 9.5), Sample("p1", T0 + k, 0.0)])
            daemon.pipeline.process([Sample("qin", T0 + k, 800.0)])
        daemon.station.close()
        store = StationStore.open(config.state_dir)
        try:
            (rec,) = store.overflows(T0 - 3600, T0 + 3600)
        finally:
            store.close()
        assert (rec.start - T0, rec.method) == (0.0, "inflow")
        assert rec.volume_gal == pytest.approx(800.0 * 590 / 60)  # +20 s (the inflow known) to +610 s
    finally:
        close(daemon)
