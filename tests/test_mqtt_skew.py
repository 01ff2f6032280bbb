"""A gateway whose clock is behind its devices by more than `mqtt.max_skew` (booted on an
unset RTC, NTP not answering yet) refuses every device-stamped reading as "in the future".
The sensor goes stale; its alarm and /api/health must say the readings arrive stamped ahead
of the gateway clock, so the technician checks the gateway's time sync, not the PLC.
A real Mosquitto carries the PLC's messages; the daemon runs on an injected wall clock and
a tick a second (docs/sources-mqtt.md, "Timestamps ahead of the gateway clock")."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from monitor.config import build_config
from monitor.engine.engine import Engine
from monitor.health import MqttHealth, attention
from monitor.model import ManualClock, Rule, Sample
from monitor.sources.payload import StampsAhead
from tests.engine_helpers import T0, station
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port
from tests.test_clock_step import watched_daemon
from tests.test_pipeline import close, get, served
from tests.waiting import wait_until

HOUR = 3600.0


def test_readings_stamped_an_hour_ahead_of_a_gateway_clock_say_so_in_the_stale_alarm_and_health(
    tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway boots an hour behind true time; the PLC stamps true time every 10 s. Every
    reading is refused as in the future (max_skew 300 s) and the level goes stale at +61 s.
    Before: the alarm said only "no good sample" and health counted "bad payloads", sending
    the technician to a PLC that was fine. Now it says the readings arrive stamped ~1.0 h
    ahead of the gateway clock, with how many, and health says the same. NTP steps the
    gateway clock to true time at +100 s: the next reading is judged and clears the alarm.
    /metrics, served on a real port, counts the refusals (station_monitor_mqtt_stamped_ahead_total).
    The log says it once per run (a WARNING at the first refusal, DEBUG while it lasts, INFO
    when a reading is taken again), not once a minute per topic for as long as NTP is out."""
    port = free_port()
    config = build_config(
        {
            "station": {"id": "ps-skew"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "plant.lvl", "kind": "level", "unit": "ft", "stale_after": "60s"}],
            "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "client_id": "t-skew",
                     "subscriptions": [{"topic": "plant/+/level", "sensor": "plant.{1}", "format": "json",
                                        "value_path": "v", "time_path": "t"}]},
            "console": {"host": "127.0.0.1", "port": port},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip
    daemon, wall, mono = watched_daemon(config, T0 - HOUR)
    link, source = daemon.mqtt_link, daemon.mqtt_source
    assert link is not None and source is not None
    link.start()
    link.wait_connected()
    peer = Peer(mosquitto.port, "t-skew-plc")
    emit = daemon.pipeline.source("mqtt")

    def run(seconds: range) -> None:
        """Each real second: the clocks (NTP answers at +100 s), the daemon's tick, and the
        PLC's reading every 10 s, carried by the broker and judged once it arrived."""
        for k in seconds:
            wall.set(T0 + k - (HOUR if k < 100 else 0.0))
            mono.set(1000.0 + k)
            daemon.tick()
            if k % 10 == 0:
                peer.publish("plant/lvl/level", json.dumps({"v": 4.2, "t": T0 + k}))
                wait_until(arrived(k // 10 + 1), timeout=10, what="the PLC's reading")
                source.drain(emit)
                daemon.pipeline.process_queued()

    def arrived(n: int) -> Callable[[], bool]:
        return lambda: source.received >= n

    def ahead_warnings() -> list[str]:
        return [a["text"] for a in attention(daemon.health().to_json()) if "ahead of" in a["text"]]

    caplog.set_level(logging.DEBUG, logger="monitor.sources.mqtt_ingest")
    try:
        run(range(0, 100))
        entries = list(daemon.alarms.journal.entries(sensor="plant.lvl"))
        assert [(e.rule, e.event, e.time - T0) for e in entries] == [(Rule.STALE, "activated", 61.0 - HOUR)]
        said = entries[0].message
        assert "stamped ahead of the gateway clock by ~1.0 h" in said, said
        assert "7 readings refused" in said and "NTP" in said and "device's clock is ahead" in said, said
        mqtt = next(s for s in daemon.health().sources if isinstance(s, MqttHealth))
        assert (mqtt.stamped_ahead, mqtt.stamped_ahead_by) == (10, HOUR), mqtt
        warned = ahead_warnings()
        assert len(warned) == 1 and "~1.0 h" in warned[0] and "NTP" in warned[0], warned
        with served(daemon):
            metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert 'station_monitor_mqtt_stamped_ahead_total{station="ps-skew"} 10.0' in metrics, metrics

        run(range(100, 231))
        entries = list(daemon.alarms.journal.entries(sensor="plant.lvl"))
        assert [(e.event, e.time - T0) for e in entries] == [("activated", 61.0 - HOUR), ("cleared", 100.0)]
        assert ahead_warnings() == []  # nothing refused for two minutes: the warning is history
        said_at = [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if r.name == "monitor.sources.mqtt_ingest" and "plant.lvl" in r.getMessage()
        ]
        assert [level for level, _ in said_at] == ["WARNING"] + ["DEBUG"] * 9 + ["INFO"], said_at
        assert "in the future" in said_at[0][1] and "gateway clock is behind" in said_at[0][1], said_at
        assert "taken again after 10 refused" in said_at[-1][1], said_at
    finally:
        peer.close()
        link.stop()
        close(daemon)


def test_a_device_clock_set_right_again_ends_the_consoles_stamped_ahead_line_at_once(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The gateway is right; one PLC stamps an hour ahead for 100 s, then its clock is set
    and its next reading taken. Health and the console stop saying readings are refused at
    once: before, the line stayed ten minutes after the last refusal, saying "readings of a
    sensor refused" (none left in the run) of a station whose every reading was taken."""
    config = build_config(
        {
            "station": {"id": "ps-skew"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "plant.lvl", "kind": "level", "unit": "ft", "stale_after": "60s"}],
            "mqtt": {"host": "127.0.0.1", "port": mosquitto.port, "client_id": "t-skew2",
                     "subscriptions": [{"topic": "plant/+/level", "sensor": "plant.{1}", "format": "json",
                                        "value_path": "v", "time_path": "t"}]},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip
    daemon, wall, mono = watched_daemon(config, T0)
    link, source = daemon.mqtt_link, daemon.mqtt_source
    assert link is not None and source is not None
    link.start()
    link.wait_connected()
    peer = Peer(mosquitto.port, "t-skew2-plc")
    emit = daemon.pipeline.source("mqtt")

    def arrived(n: int) -> Callable[[], bool]:
        return lambda: source.received >= n

    def ahead() -> tuple[float | None, tuple[str, ...], list[str]]:
        mqtt = next(s for s in daemon.health().sources if isinstance(s, MqttHealth))
        warned = [a["text"] for a in attention(daemon.health().to_json()) if "ahead of" in a["text"]]
        return mqtt.stamped_ahead_by, mqtt.stamped_ahead_sensors, warned

    try:
        for k in range(0, 111, 10):
            wall.set(T0 + k)
            mono.set(1000.0 + k)
            daemon.tick()
            peer.publish("plant/lvl/level", json.dumps({"v": 4.2, "t": T0 + k + (HOUR if k < 100 else 0.0)}))
            wait_until(arrived(k // 10 + 1), timeout=10, what="the PLC's reading")
            source.drain(emit)
            daemon.pipeline.process_queued()
            if k == 90:
                by, sensors, warned = ahead()
                assert (by, sensors, len(warned)) == (HOUR, ("plant.lvl",), 1), (by, sensors, warned)
        assert source.ahead.total == 10
        assert ahead() == (None, (), [])
    finally:
        peer.close()
        link.stop()
        close(daemon)


def test_the_stale_message_names_refusals_ahead_only_while_they_arrive_and_none_taken_since() -> None:
    """The engine's side alone (`StampsAhead` as the MQTT source fills it, stale after 60 s):
    refusals that stopped more than `stale_after` before the stale tick are history (the PLC
    then really went silent: "no good sample"), and a reading taken ends a run of them (a
    later silence is a silence)."""
    ahead, clock = StampsAhead(), ManualClock(T0)
    engine = Engine(station({"id": "lvl", "kind": "level", "unit": "ft", "stale_after": "60s"}).rules, clock)
    engine.stamped_by_device({"lvl"})
    engine.refused_ahead(ahead)

    def stale_message(first_tick: float, refused_at: list[float], until: float) -> str:
        for t in refused_at:
            ahead.record("lvl", 400.0, t)
        out = [c for t in range(int(first_tick), int(until) + 1) for c in engine.tick(float(t))]
        assert [c.rule for c in out] == [Rule.STALE], out
        return out[0].message

    said = stale_message(T0, [T0 + 5, T0 + 55], T0 + 61)
    assert said.startswith(
        "no good sample: readings arrive but are stamped ahead of the gateway clock by ~400 s"
    )
    assert "2 readings refused" in said, said

    clock.set(T0 + 100)
    engine.process(Sample("lvl", T0 + 100, 4.2))  # taken (the clocks agree again) ...
    ahead.taken("lvl")  # ... which the source tells the watch
    assert stale_message(T0 + 101, [], T0 + 161) == "no good sample"

    clock.set(T0 + 200)
    engine.process(Sample("lvl", T0 + 200, 4.2))
    assert stale_message(T0 + 201, [T0 + 200], T0 + 262) == "no good sample"  # refused 61 s before


def test_a_publisher_inventing_sensors_cannot_grow_the_table_of_refusals_ahead() -> None:
    """Past `max_sensors` only the totals count (a subscription without a `sensors` list
    binds whatever a `+` matches: a hostile or broken publisher could invent ids forever)."""
    ahead = StampsAhead(max_sensors=3)
    for i in range(10):
        ahead.record(f"x{i}", 400.0 + i, T0 + i)
    assert (ahead.total, ahead.last) == (10, (T0 + 9, 409.0))
    assert ahead.sensors(since=T0) == ["x0", "x1", "x2"]
    ahead.record("x1", 500.0, T0 + 20)
    assert ahead.latest("x1") == (T0 + 20, 500.0, 2) and ahead.sensors(since=T0 + 10) == ["x1"]
