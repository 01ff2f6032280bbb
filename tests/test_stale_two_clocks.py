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


class Field(TwoClocks):
    """`TwoClocks` with what a field device sends besides its report every 10 s: a batch
    of messages arriving at one real second (a store-and-forward buffer, a retained message
    the broker delivers again at its restart)."""

    def send(self, seconds: range, level_at: dict[int, list[float]]) -> None:
        """Each real second `k`: the clocks, the tick, then the level's messages stamped
        `level_at[k]` (device time), in the order they arrive, as one batch."""
        for k in seconds:
            self.wall.set(self.gateway(k))
            self.mono.set(1000.0 + k)
            self.daemon.tick()
            if k in level_at:
                self.daemon.pipeline.process([Sample("plant.lvl", t, 4.2) for t in level_at[k]])


def reports(level_at: dict[int, float]) -> dict[int, list[float]]:
    return {k: [t] for k, t in level_at.items()}


@pytest.mark.parametrize("offset", [HOUR, 0.0, -HOUR])
def test_a_store_and_forward_burst_whose_newest_reading_is_old_does_not_clear_stale(
    tmp_path: Path, offset: float
) -> None:
    """The PLC's uplink drops at +100 s: stale on time, at +161 s. The uplink is back an hour
    later, but the PLC itself died at +600 s: its buffer (+110 s to +600 s, stamps advancing)
    arrives at +3700 s at once, the newest reading 51 min old. The level is no fresher for
    it: stale stays raised. Before: each reading counted at its arrival, the alarm cleared at
    +3700 s and came back at +3761 s (an operator told the level was back for a minute)."""
    gw = Field(tmp_path, offset)
    try:
        backlog = [T0 + k for k in range(110, 601, 10)]
        gw.send(range(0, 3801), reports(every_10s(0, 101)) | {3700: backlog})
        assert gw.stale() == [("activated", 161.0)]
        assert gw.daemon.engine.counters.out_of_order == 0  # every reading judged (its limits)
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_store_and_forward_backlog_sent_slowly_does_not_refresh_the_level(
    tmp_path: Path, offset: float
) -> None:
    """The same PLC dead at +600 s, its buffer sent one reading a second from +3700 s (an hour
    behind): readings arrive every second, every one of them an hour old. Stale stays."""
    gw = Field(tmp_path, offset)
    try:
        slow = {3700 + i: [T0 + 110 + 10 * i] for i in range(50)}
        gw.send(range(0, 3801), reports(every_10s(0, 101)) | slow)
        assert gw.stale() == [("activated", 161.0)]
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_burst_that_catches_up_to_now_clears_stale_at_its_arrival(tmp_path: Path, offset: float) -> None:
    """The uplink back at +3700 s with the PLC alive: its buffer up to the reading it just took
    arrives at once, then the reports every 10 s. Stale clears at +3700 s and stays clear."""
    gw = Field(tmp_path, offset)
    try:
        backlog = [T0 + k for k in range(110, 3701, 10)]
        gw.send(range(0, 4001), reports(every_10s(0, 101)) | {3700: backlog} | reports(every_10s(3710, 4001)))
        assert gw.stale() == [("activated", 161.0), ("cleared", 3700.0)]
    finally:
        close(gw.daemon)


def test_a_plc_clock_stepped_back_an_hour_goes_stale_then_reports_again_when_its_stamps_pass(
    tmp_path: Path,
) -> None:
    """NTP on the PLC steps its clock back an hour at +200 s; it reports every 10 s on. Its
    stamps are behind the last one judged until +3800 s: stale at +251 s (saying its clock
    stepped back), cleared when a stamp passes the last one, and never raised again after,
    though every reading now carries a stamp an hour behind the ones before the step."""
    gw = Field(tmp_path, 0.0)
    try:
        stepped = {k: T0 + k - HOUR for k in range(200, 4101, 10)}
        gw.send(range(0, 4101), reports(every_10s(0, 191) | stepped))
        assert gw.stale() == [("activated", 251.0), ("cleared", 3800.0)]
        raised = next(iter(gw.daemon.alarms.journal.entries(sensor="plant.lvl")))
        assert "stepped back" in raised.message, raised.message
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_stamps_with_a_second_of_jitter_and_swapped_pairs_never_go_stale(
    tmp_path: Path, offset: float
) -> None:
    """A PLC whose messages leave with up to a second of jitter, and now and then two in one
    second in swapped order (the older one refused, counted out of order): never stale."""
    gw = Field(tmp_path, offset)
    try:
        jitter = {k: [T0 + k + (0.9 if k % 20 else -0.9)] for k in range(0, 601, 10)}
        for k in range(50, 601, 100):
            jitter[k] = [T0 + k + 1.0, T0 + k - 4.0]
        gw.send(range(0, 601), jitter)
        assert gw.stale() == []
        assert gw.daemon.engine.counters.out_of_order == 6
    finally:
        close(gw.daemon)


def test_a_retained_message_delivered_again_does_not_refresh_nor_say_the_clock_stopped(
    tmp_path: Path,
) -> None:
    """The PLC goes silent after +100 s; the broker restarts at +130 s and delivers the level's
    retained message again (the last one, stamped +100 s). It refreshes nothing: stale on
    time at +161 s, and its message says no good sample, not that the PLC's clock stopped (one
    message delivered again is the broker's, not a dead RTC: the technician checks the link).
    Before: the alarm sent the technician to the PLC's clock."""
    gw = Field(tmp_path, HOUR)
    try:
        gw.send(range(0, 201), reports(every_10s(0, 101)) | {130: [T0 + 100]})
        assert gw.stale() == [("activated", 161.0)]
        raised = next(iter(gw.daemon.alarms.journal.entries(sensor="plant.lvl")))
        assert raised.message.startswith("no good sample") and "clock" not in raised.message, raised.message
    finally:
        close(gw.daemon)


def restarted(gw: Field, tmp_path: Path) -> Field:
    """The daemon saved its checkpoint and stopped; a new one starts on the same state."""
    gw.daemon.checkpoint()
    close(gw.daemon)
    return Field(tmp_path, gw.offset)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_retained_message_after_a_restart_does_not_clear_a_stale_level(
    tmp_path: Path, offset: float
) -> None:
    """The level stale since +161 s (the PLC silent after +100 s); the daemon restarts at
    +400 s and the broker delivers the retained message
    (stamp +100 s) at once: the alarm stays raised, and is not raised twice; the PLC back at
    +600 s clears it at its arrival."""
    gw = Field(tmp_path, offset)
    try:
        gw.send(range(0, 301), reports(every_10s(0, 101)))
        gw = restarted(gw, tmp_path)
        gw.send(range(400, 701), {400: [T0 + 100]} | reports(every_10s(600, 701)))
        assert gw.stale() == [("activated", 161.0), ("cleared", 600.0)]
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_plc_that_dies_across_a_restart_goes_stale_after_the_restart_saying_no_good_sample(
    tmp_path: Path, offset: float
) -> None:
    """The PLC reports every 10 s to +300 s and dies while the daemon restarts (+400 s); the
    broker delivers its retained message (stamp +300 s) at the start. The watch starts at
    the first tick (+400 s): stale at +461 s, "no good sample" (one retained message is not a
    stopped clock); a PLC still reporting across the restart is never stale."""
    gw = Field(tmp_path, offset)
    try:
        gw.send(range(0, 301), reports(every_10s(0, 301)))
        gw = restarted(gw, tmp_path)
        gw.send(range(400, 601), {400: [T0 + 300]})
        assert gw.stale() == [("activated", 461.0)]
        raised = next(iter(gw.daemon.alarms.journal.entries(sensor="plant.lvl")))
        assert raised.message == "no good sample", raised.message
        gw.send(range(601, 1001), reports(every_10s(610, 1001)))
        gw = restarted(gw, tmp_path)
        gw.send(range(1100, 1501), {1100: [T0 + 1000]} | reports(every_10s(1110, 1501)))
        assert gw.stale() == [("activated", 461.0), ("cleared", 610.0)]
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_store_and_forward_backlog_after_a_restart_does_not_clear_a_restored_stale_level(
    tmp_path: Path, offset: float
) -> None:
    """The level stale since +161 s (the PLC's uplink down after +100 s); the daemon restarts
    at +400 s; the uplink is back at +3700 s, but the PLC died at +600 s: its buffer (+110 s to
    +600 s) arrives at once, the newest reading 51 min old. The quickest delivery learnt before
    the restart is kept in the checkpoint, so the backlog is taken as old as it is: stale stays
    raised. Before: the restarted watch knew no delivery, took the first backlog at its
    arrival, cleared the alarm at +3700 s and raised it again at +3761 s (a PLC dead for an
    hour looked alive for a minute)."""
    gw = Field(tmp_path, offset)
    try:
        gw.send(range(0, 301), reports(every_10s(0, 101)))
        gw = restarted(gw, tmp_path)
        backlog = [T0 + k for k in range(110, 601, 10)]
        gw.send(range(400, 3801), {3700: backlog})
        assert gw.stale() == [("activated", 161.0)]
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("queued", [False, True], ids=["live", "queued"])
@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_gateway_clock_stepped_forward_while_the_daemon_was_down_raises_no_stale_on_a_live_level(
    tmp_path: Path, offset: float, queued: bool
) -> None:
    """The level reports every 10 s throughout; the daemon stops at +200 s and starts again at
    +300 s on a gateway clock NTP stepped an hour forward meanwhile (no watch saw it). Every
    reading then looks an hour late against the restored quickest delivery until their pace
    shows a live PLC: no stale alarm (the PLC never stopped). `queued`: the broker delivers
    the readings it kept for the daemon's session (+210 s to +290 s) at once, before the first
    tick. Before: the first reading put the restarted stale watch back an hour: `stale`
    raised at the next tick and cleared 10 s later (a false page at every such restart)."""
    gw = Field(tmp_path, offset)
    try:
        gw.send(range(0, 201), reports(every_10s(0, 201)))
        gw.daemon.checkpoint()
        close(gw.daemon)
        gw = Field(tmp_path, offset + HOUR)
        if queued:
            gw.wall.set(gw.gateway(300))
            gw.mono.set(1000.0 + 300)
            gw.daemon.pipeline.process([Sample("plant.lvl", T0 + k, 4.2) for k in range(210, 300, 10)])
        gw.send(range(300, 601), reports(every_10s(300, 601)))
        assert gw.stale() == []
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("offset", [HOUR, -HOUR])
def test_a_backlog_drained_faster_than_it_was_taken_after_a_restart_does_not_clear_a_restored_stale_level(
    tmp_path: Path, offset: float
) -> None:
    """The level stale since +161 s (the PLC's uplink down after +100 s); the daemon restarts
    at +400 s; the uplink is back at +3700 s and the PLC drains its buffer (+110 s on, a
    reading every 10 s of its clock) one reading every 6 s: 1.7 times the pace it was taken,
    its readings still most of an hour old. Stale stays raised. Before: stamps advancing less
    than twice as fast as their arrivals passed for a live PLC after 10 s: the alarm cleared
    at +3712 s on readings 59 min old."""
    gw = Field(tmp_path, offset)
    try:
        gw.send(range(0, 301), reports(every_10s(0, 101)))
        gw = restarted(gw, tmp_path)
        drained = {3700 + 6 * i: [T0 + 110 + 10 * i] for i in range(100)}
        gw.send(range(400, 4301), drained)
        assert gw.stale() == [("activated", 161.0)]
    finally:
        close(gw.daemon)
