"""Derived sensors when the gateway's clock and a device's disagree (before NTP corrects the
gateway): one made of a device-stamped reading and a polled one, and ones of a single clock
beside each other. The daemon's own pipeline and station on injected wall and monotonic
clocks, a timer tick every second, event time, no sleeps (docs/station.md, "Derived sensors
on two clocks")."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import Config, build_config
from monitor.model import Sample
from monitor.reconcile import device_stamped
from tests.engine_helpers import T0
from tests.test_clock_step import watched_daemon
from tests.test_pipeline import close

HOUR = 3600.0


def two_clock_station(tmp_path: Path, chained: bool = False) -> Config:
    """The outfall flow `q` polled over Modbus (the gateway's clock), the inflow `plant.qin`
    and the effluent temperature `plant.temp` sent over MQTT with the PLC's time
    (`time_path`); derived: the flow through the well (`net`, both clocks), the outflow in
    MGD (`q.mgd`, the gateway's) and the temperature in °F (`temp.f`, the device's). Every
    one reports every 10 s and is stale after 60 s. `chained`: and one of derived sensors of
    both clocks, `heat = temp.f * q.mgd / q.mgd` (°F again, on the gateway's clock)."""
    chain = [{"id": "heat", "kind": "derived", "unit": "degF", "expression": "temp.f * q.mgd / q.mgd",
              "stale_after": "60s"}] if chained else []  # fmt: skip
    return build_config(
        {
            "station": {"id": "ps-derived-clocks"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                {"id": "q", "kind": "flow", "unit": "gpm", "stale_after": "60s"},
                {"id": "plant.qin", "kind": "flow", "unit": "gpm", "stale_after": "60s"},
                {"id": "plant.temp", "kind": "temperature", "unit": "degC", "stale_after": "60s"},
                {"id": "net", "kind": "derived", "unit": "gpm", "expression": "plant.qin - q",
                 "stale_after": "60s"},
                {"id": "q.mgd", "kind": "derived", "unit": "MGD", "expression": "q", "stale_after": "60s"},
                {"id": "temp.f", "kind": "derived", "unit": "degF", "expression": "plant.temp",
                 "stale_after": "60s"},
                *chain,
            ],
            "modbus": {"devices": [{"name": "plc", "host": "127.0.0.1", "port": 5020,
                                    "fields": [{"sensor": "q", "register": "holding", "address": 0,
                                                "type": "UINT16"}]}]},
            "mqtt": {"subscriptions": [{"topic": "plant/+/v", "sensor": "plant.{1}", "format": "json",
                                        "value_path": "v", "time_path": "t"}]},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip


class Station:
    """The daemon on a gateway clock `offset` s off the PLC's (true time)."""

    def __init__(
        self, tmp_path: Path, offset: float, corrected_at: float = 1e18, chained: bool = False
    ) -> None:
        config = two_clock_station(tmp_path, chained)
        assert device_stamped(config) == {"plant.qin", "plant.temp", "temp.f"}
        self.offset, self.corrected_at = offset, corrected_at
        self.daemon, self.wall, self.mono = watched_daemon(config, T0 + offset)

    def gateway(self, k: float) -> float:
        """The gateway clock at real second `k`: `offset` off until NTP corrects it."""
        return T0 + k + (self.offset if k < self.corrected_at else 0.0)

    def run(self, seconds: range, poll: bool = True, device: bool = True) -> None:
        """Every 10 s of real time: the tick, the flow poll (gateway stamp), then the PLC's
        message (its own stamp)."""
        for k in seconds:
            self.wall.set(self.gateway(k))
            self.mono.set(1000.0 + k)
            self.daemon.tick()
            if k % 10:
                continue
            if poll:
                self.daemon.pipeline.process([Sample("q", self.wall.now(), 700.0)])
            if device:
                self.daemon.pipeline.process(
                    [Sample("plant.qin", T0 + k, 800.0), Sample("plant.temp", T0 + k, 20.0)]
                )

    def stale(self) -> list[tuple[str, str]]:
        return [
            (e.sensor, e.event)
            for e in self.daemon.alarms.journal.entries()
            if e.rule.value == "stale" and e.sensor in ("net", "q.mgd", "temp.f", "heat")
        ]

    def made(self, sensor: str) -> list[tuple[float, float]]:
        """(seconds after the start on the sensor's clock, value) of the samples stored."""
        return [(s.time - T0, round(s.value, 6)) for s in self.daemon.sink.store.query(sensor)]


@pytest.mark.parametrize("offset", [HOUR, -HOUR, 120.0, -120.0, 0.0])
def test_derived_sensors_on_two_clocks_are_made_on_time_with_the_right_value(
    tmp_path: Path, offset: float
) -> None:
    """The gateway an hour (or 2 min) ahead of the PLC or behind it; every input arrives
    every 10 s. `net` (800 - 700 gpm) is made at each poll, stamped on the gateway clock
    (the clock its stale watch ticks on), `q.mgd` stamped as its flow poll, `temp.f` as its
    device reading; no stale alarm. Before: one evaluation time for every derived sensor, the
    later of the two clocks: an hour apart, `net` found one input an hour older than
    `max_input_age` and was never made (its stale alarm on healthy inputs), and `q.mgd` (an
    hour behind) too; 2 min behind, `q.mgd` was stamped on the PLC's clock, 2 min ahead of
    its poll."""
    gw = Station(tmp_path, offset)
    try:
        gw.run(range(0, 301))
        assert gw.stale() == []
        expected_q = [(k + offset, 0.7 * 1.44) for k in range(0, 291, 10)]  # 700 gpm = 1.008 MGD
        assert gw.made("q.mgd") == [(t, round(v, 6)) for t, v in expected_q]
        assert gw.made("temp.f") == [(float(k), 68.0) for k in range(0, 291, 10)]
        net = gw.made("net")
        assert [v for _, v in net] == [100.0] * len(net)
        assert [t - offset for t, _ in net] == [float(k) for k in range(0, 291, 10)]
        assert gw.daemon.engine.counters.out_of_order == 0
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_derived_sensor_of_two_clocks_stops_when_either_input_stops(tmp_path: Path, offset: float) -> None:
    """The PLC stops sending at +100 s (the flow poll goes on): `net` stops within
    `max_input_age` (5 min) of its device input's last arrival and goes stale 60 s after its
    last sample, with the gateway an hour off either way; `q.mgd` goes on (its input is
    polled)."""
    gw = Station(tmp_path, offset)
    try:
        gw.run(range(0, 101))
        gw.run(range(101, 801), device=False)
        net = [t - offset for t, _ in gw.made("net")]
        assert net[-1] <= 100 + 300 and net[-1] >= 100
        assert ("net", "activated") in gw.stale()
        assert ("q.mgd", "activated") not in gw.stale()
        assert ("temp.f", "activated") in gw.stale()
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_derived_sensor_of_two_clocks_goes_on_across_a_step_of_the_gateway_clock(
    tmp_path: Path, offset: float
) -> None:
    """The gateway, an hour ahead (or behind), is stepped to true time at +65 s while every
    input reports: `net` is made at every poll after the step too, on the new clock, with
    its value; nothing stale, nothing out of order."""
    gw = Station(tmp_path, offset, corrected_at=65)
    try:
        gw.run(range(0, 301))
        assert gw.stale() == []
        net = gw.made("net")
        after = [t for t, _ in net if 65 <= t < 1000]  # on the corrected clock
        assert after == [float(k) for k in range(70, 291, 10)]
        assert {v for _, v in net} == {100.0}
        assert gw.daemon.engine.counters.out_of_order == 0
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, 0.0, -HOUR])
def test_a_store_and_forward_burst_an_hour_old_does_not_make_a_derived_sensor_of_two_clocks(
    tmp_path: Path, offset: float
) -> None:
    """The PLC's uplink drops at +100 s (the flow poll goes on): `net` stops and goes stale.
    The uplink is back at +3700 s, but the PLC died at +600 s: its buffer (+110 s to +600 s,
    stamps advancing, the inflow at 900 gpm) arrives at once. The inflow it holds is 51 min
    old: `net` is not made from it and stays stale. Before: the newest reading of the burst
    was taken as the inflow now, and `net` (900 - 700 gpm) was made at every poll for
    `max_input_age` (5 min) from a level of an hour ago, its stale alarm cleared meanwhile."""
    gw = Station(tmp_path, offset)
    try:
        gw.run(range(0, 101))
        gw.run(range(101, 3700), device=False)
        gw.wall.set(gw.gateway(3700))
        gw.mono.set(1000.0 + 3700)
        gw.daemon.pipeline.process([Sample("plant.qin", T0 + k, 900.0) for k in range(110, 601, 10)])
        gw.run(range(3701, 4101), device=False)
        net = gw.made("net")
        assert [t - offset for t, _ in net if t - offset >= 3700] == []
        assert {v for _, v in net} == {100.0}  # never 900 - 700 gpm
        assert gw.stale().count(("net", "activated")) == 1
        assert ("net", "cleared") not in gw.stale()
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_chain_of_derived_sensors_across_clocks_is_made_and_an_old_burst_makes_nothing(
    tmp_path: Path, offset: float
) -> None:
    """`heat = temp.f * q.mgd / q.mgd`: a derived sensor of the gateway's made of one of the
    device's (`temp.f`) and one of its own (`q.mgd`). Made at every poll while all report
    (68 °F), nothing stale. The PLC's uplink drops at +100 s, it dies at +600 s,
    and its buffer arrives at +3700 s: `temp.f` is made from it at the buffer's stamps, but
    neither it (the device's clock) nor `heat` counts as fresh: both stay stale."""
    gw = Station(tmp_path, offset, chained=True)
    try:
        gw.run(range(0, 101))
        heat = gw.made("heat")
        assert [t - offset for t, _ in heat] == [float(k) for k in range(10, 91, 10)]  # temp.f a poll late
        assert {v for _, v in heat} == {68.0}
        assert gw.stale() == []
        gw.run(range(101, 3700), device=False)
        gw.wall.set(gw.gateway(3700))
        gw.mono.set(1000.0 + 3700)
        burst = [
            Sample(s, T0 + k, v)
            for k in range(110, 601, 10)
            for s, v in (("plant.qin", 900.0), ("plant.temp", 25.0))
        ]
        gw.daemon.pipeline.process(burst)
        gw.run(range(3701, 4101), device=False)
        assert [t - offset for t, _ in gw.made("heat") if t - offset >= 3700] == []
        assert max(t for t, _ in gw.made("temp.f")) == 590.0  # its stamps (+600 s waits for a later one)
        stale = gw.stale()
        for sensor in ("heat", "temp.f", "net"):
            assert stale.count((sensor, "activated")) == 1, stale
            assert (sensor, "cleared") not in stale, stale
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_store_and_forward_burst_after_a_restart_does_not_make_a_derived_sensor_of_two_clocks(
    tmp_path: Path, offset: float
) -> None:
    """As above, with the daemon restarted at +400 s (the PLC's uplink down since +100 s): the
    station's watch of the inflow starts from the quickest delivery the engine's checkpoint
    kept, so the burst is 51 min old there too and `net` is not made from it. Before: the
    restarted station knew no delivery, took the burst's newest reading at its arrival and
    made `net` (900 - 700 gpm) from an inflow of an hour ago."""
    gw = Station(tmp_path, offset)
    try:
        gw.run(range(0, 101))
        gw.run(range(101, 400), device=False)
        gw.daemon.checkpoint()
        close(gw.daemon)
        gw = Station(tmp_path, offset)
        gw.run(range(400, 3700), device=False)
        gw.wall.set(gw.gateway(3700))
        gw.mono.set(1000.0 + 3700)
        gw.daemon.pipeline.process([Sample("plant.qin", T0 + k, 900.0) for k in range(110, 601, 10)])
        gw.run(range(3701, 4101), device=False)
        assert {v for _, v in gw.made("net")} == {100.0}  # never 900 - 700 gpm
    finally:
        close(gw.daemon)
