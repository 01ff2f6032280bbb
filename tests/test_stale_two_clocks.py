"""The stale rule of a device-stamped sensor (an MQTT payload's own time, `time_path`) when
the gateway's clock and the device's disagree: judged on the reading's arrival on the
gateway clock, not on the difference between the two clocks. The daemon's own pipeline and
clock watch on injected wall and monotonic clocks, a timer tick every second, event time,
no sleeps (docs/engine.md, "Stale data")."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import Config, build_config
from monitor.model import Rule, Sample
from monitor.reconcile import device_stamped
from tests.engine_helpers import T0
from tests.test_clock_step import watched_daemon
from tests.test_pipeline import close

HOUR = 3600.0


def two_clock_station(tmp_path: Path) -> Config:
    """A wet-well level sent over MQTT with the PLC's own time (`time_path`, every 10 s,
    stale after 60 s) beside a pH probe polled over Modbus (the gateway's clock)."""
    return build_config(
        {
            "station": {"id": "ps-stale-clocks"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                {"id": "ph", "kind": "ph", "stale_after": "1h"},
                {"id": "plant.lvl", "kind": "level", "unit": "ft", "stale_after": "60s"},
            ],
            "modbus": {"devices": [{"name": "plc", "host": "127.0.0.1", "port": 5020,
                                    "fields": [{"sensor": "ph", "register": "holding", "address": 0,
                                                "type": "UINT16", "scale": 0.01}]}]},
            "mqtt": {"subscriptions": [{"topic": "plant/+/level", "sensor": "plant.{1}", "format": "json",
                                        "value_path": "v", "time_path": "t"}]},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip


class TwoClocks:
    """The daemon on a gateway clock `offset` s off the devices' (true time), until a step
    of `step` s at real second `step_at` (NTP); the level's PLC stamps true time."""

    def __init__(self, tmp_path: Path, offset: float, step: float = 0.0, step_at: float = 1e18) -> None:
        config = two_clock_station(tmp_path)
        assert "plant.lvl" in device_stamped(config)
        self.offset, self.step, self.step_at = offset, step, step_at
        self.daemon, self.wall, self.mono = watched_daemon(config, T0 + offset)

    def gateway(self, k: float) -> float:
        return T0 + k + self.offset + (self.step if k >= self.step_at else 0.0)

    def run(self, seconds: range, level_at: dict[int, float]) -> None:
        """Each real second `k`: the clocks, the daemon's tick, then the level's message
        stamped `level_at[k]` (device time) when one comes that second."""
        for k in seconds:
            self.wall.set(self.gateway(k))
            self.mono.set(1000.0 + k)
            self.daemon.tick()
            if k in level_at:
                self.daemon.pipeline.process([Sample("plant.lvl", level_at[k], 4.2)])

    def stale(self) -> list[tuple[str, float]]:
        """The level's stale journal as (event, real seconds after the start)."""
        entries = self.daemon.alarms.journal.entries(sensor="plant.lvl")
        out = []
        for e in entries:
            assert e.rule is Rule.STALE, e
            out.append((e.event, self.real(e.time)))
        return out

    def real(self, t: float) -> float:
        x = t - T0 - self.offset
        return x - self.step if x - self.step >= self.step_at else x


def every_10s(start: int, stop: int) -> dict[int, float]:
    """The PLC reports every 10 s of real time, stamped with its own (true) clock."""
    return {k: T0 + k for k in range(start, stop, 10)}


@pytest.mark.parametrize("offset", [HOUR, 120.0, -HOUR])
def test_a_device_stamped_level_reporting_every_10s_is_never_stale_whatever_the_gateway_clock(
    tmp_path: Path, offset: float
) -> None:
    """The gateway's RTC an hour (or 2 min) ahead of the PLC, or an hour behind, before NTP
    corrects it; the level arrives every 10 s stamped with the PLC's clock. Before: the
    stale rule compared the reading's device stamp with the gateway's tick, so an hour
    ahead the level looked an hour old at every tick: `stale` raised at each tick and
    cleared by each reading, 60 alarms in 10 minutes on a healthy sensor."""
    gw = TwoClocks(tmp_path, offset)
    try:
        gw.run(range(0, 601), every_10s(0, 601))
        assert gw.stale() == []
        assert gw.daemon.engine.counters.out_of_order == 0
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, 0.0, -HOUR])
def test_a_device_stamped_level_that_stops_goes_stale_on_time_whatever_the_gateway_clock(
    tmp_path: Path, offset: float
) -> None:
    """The PLC's last message arrives at +100 s; 60 s of silence later, the first tick past
    it (+161 s) raises `stale`, with the gateway clock right, an hour ahead or an hour
    behind; the next message (+300 s) clears it when it arrives. Before: an hour behind,
    the silence looked an hour shorter, and the level went stale an hour late."""
    gw = TwoClocks(tmp_path, offset)
    try:
        gw.run(range(0, 401), every_10s(0, 101) | every_10s(300, 401))
        assert gw.stale() == [("activated", 161.0), ("cleared", 300.0)]
    finally:
        close(gw.daemon)


def test_a_step_of_the_gateway_clock_moves_the_arrival_watch_of_a_device_stamped_level(
    tmp_path: Path,
) -> None:
    """NTP steps the gateway clock, an hour ahead, back to true time at +65 s while the level
    reports: nothing stale (the watch is on the gateway clock and moves with its step); the
    PLC goes quiet after +200 s and the level goes stale on time, at +261 s."""
    gw = TwoClocks(tmp_path, HOUR, step=-HOUR, step_at=65)
    try:
        gw.run(range(0, 401), every_10s(0, 201))
        assert gw.stale() == [("activated", 261.0)]
    finally:
        close(gw.daemon)


def test_a_plc_with_a_dead_rtc_goes_stale_on_time_and_says_its_clock_stopped(tmp_path: Path) -> None:
    """The PLC's RTC dies at +100 s: its messages go on arriving every 10 s, all stamped
    +100 s. None is later than the one before, so none is judged (each is counted out of
    order): `stale` on time, at +161 s, as for a silence, but its message says the
    readings arrive with a stamp that no longer advances, so the technician checks the
    PLC's clock, not the radio. The RTC is set again at +300 s: the next reading clears it."""
    gw = TwoClocks(tmp_path, HOUR)
    try:
        frozen = every_10s(0, 101) | {k: T0 + 100 for k in range(110, 300, 10)} | every_10s(300, 401)
        gw.run(range(0, 401), frozen)
        assert gw.stale() == [("activated", 161.0), ("cleared", 300.0)]
        raised = next(iter(gw.daemon.alarms.journal.entries(sensor="plant.lvl")))
        assert "stamp" in raised.message and "clock" in raised.message, raised.message
        assert gw.daemon.engine.counters.out_of_order == 19
    finally:
        close(gw.daemon)


def test_a_silent_device_stamped_level_says_no_good_sample(tmp_path: Path) -> None:
    """A PLC that really stops is told apart from one whose clock stopped: its stale alarm
    says no good sample, nothing about a stamp."""
    gw = TwoClocks(tmp_path, HOUR)
    try:
        gw.run(range(0, 201), every_10s(0, 101))
        raised = next(iter(gw.daemon.alarms.journal.entries(sensor="plant.lvl")))
        assert raised.message.startswith("no good sample"), raised.message
    finally:
        close(gw.daemon)
