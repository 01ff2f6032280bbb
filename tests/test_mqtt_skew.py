"""A gateway whose clock is behind its devices by more than `mqtt.max_skew` (booted on an
unset RTC, NTP not answering yet) refuses every device-stamped reading as "in the future".
The sensor goes stale; its alarm and /api/health must say the readings arrive stamped ahead
of the gateway clock, so the technician checks the gateway's time sync, not the PLC.
A real Mosquitto carries the PLC's messages; the daemon runs on an injected wall clock and
a tick a second (docs/sources-mqtt.md, "Timestamps ahead of the gateway clock")."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from monitor.config import Config, build_config
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


def skew_config(
    tmp_path: Path,
    port: int,
    name: str,
    levels: tuple[str, ...] = ("lvl", "wet"),
    console: dict[str, Any] | None = None,
) -> Config:
    """PLC levels (`plant/<level>/level`, the PLC's own time in `t`, stale after 60 s)."""
    return build_config(
        {
            "station": {"id": "ps-skew"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": f"plant.{level}", "kind": "level", "unit": "ft", "stale_after": "60s"}
                        for level in levels],
            "mqtt": {"host": "127.0.0.1", "port": port, "client_id": name,
                     "subscriptions": [{"topic": "plant/+/level", "sensor": "plant.{1}", "format": "json",
                                        "value_path": "v", "time_path": "t"}]},
            "console": console or {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip


class SkewStation:
    """PLC levels (`plant.<level>`, by default `lvl` and `wet`) over a real Mosquitto
    (`plant/<level>/level`, the PLC's own time in `t`, stale after 60 s) into the daemon on
    injected wall and monotonic clocks, the wall clock reading `start` at its start; the
    console off unless `console` says where it listens."""

    def __init__(
        self,
        tmp_path: Path,
        port: int,
        name: str,
        levels: tuple[str, ...] = ("lvl", "wet"),
        start: float = T0,
        console: dict[str, Any] | None = None,
    ) -> None:
        config = skew_config(tmp_path, port, name, levels, console)
        self.daemon, self.wall, self.mono = watched_daemon(config, start)
        link, source = self.daemon.mqtt_link, self.daemon.mqtt_source
        assert link is not None and source is not None
        self.link, self.source = link, source
        link.start()
        link.wait_connected()
        self.peer = Peer(port, f"{name}-plc")
        self.emit = self.daemon.pipeline.source("mqtt")

    def at(self, k: float, gateway: float | None = None) -> None:
        """Real second `k` on the monotonic clock; the gateway's wall clock at `gateway`
        (default: true time, T0 + k), then the daemon's tick."""
        self.wall.set(T0 + k if gateway is None else gateway)
        self.mono.set(1000.0 + k)
        self.daemon.tick()

    def send(self, sensor: str, stamp: float) -> None:
        """The PLC's reading stamped `stamp`, carried by the broker and judged once it arrived."""
        n = self.source.received + 1
        self.peer.publish(f"plant/{sensor}/level", json.dumps({"v": 4.2, "t": stamp}))
        # Queued (taken or refused) after its refusal is logged, on paho's thread: not `received`.
        queued = lambda: self.source.received >= n and self.source.pending() >= 1  # noqa: E731
        wait_until(queued, timeout=10, what="the PLC's reading")
        self.source.drain(self.emit)
        self.daemon.pipeline.process_queued()

    def health(self) -> MqttHealth:
        return next(s for s in self.daemon.health().sources if isinstance(s, MqttHealth))

    def close(self) -> None:
        self.peer.close()
        self.link.stop()
        close(self.daemon)


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
    console = {"host": "127.0.0.1", "port": port}
    st = SkewStation(tmp_path, mosquitto.port, "t-skew", levels=("lvl",), start=T0 - HOUR, console=console)
    daemon = st.daemon

    def run(seconds: range) -> None:
        """Each real second: the clocks (NTP answers at +100 s), the daemon's tick, and the
        PLC's reading every 10 s, carried by the broker and judged once it arrived."""
        for k in seconds:
            st.at(k, gateway=T0 + k - (HOUR if k < 100 else 0.0))
            if k % 10 == 0:
                st.send("lvl", T0 + k)

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
        mqtt = st.health()
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
        st.close()


def test_a_device_clock_set_right_again_ends_the_consoles_stamped_ahead_line_at_once(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The gateway is right; one PLC stamps an hour ahead for 100 s, then its clock is set
    and its next reading taken. Health and the console stop saying readings are refused at
    once: before, the line stayed ten minutes after the last refusal, saying "readings of a
    sensor refused" (none left in the run) of a station whose every reading was taken."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew2", levels=("lvl",))

    def ahead() -> tuple[float | None, tuple[str, ...], list[str]]:
        mqtt = st.health()
        warned = [a["text"] for a in attention(st.daemon.health().to_json()) if "ahead of" in a["text"]]
        return mqtt.stamped_ahead_by, mqtt.stamped_ahead_sensors, warned

    try:
        for k in range(0, 111, 10):
            st.at(k)
            st.send("lvl", T0 + k + (HOUR if k < 100 else 0.0))
            if k == 90:
                by, sensors, warned = ahead()
                assert (by, sensors, len(warned)) == (HOUR, ("plant.lvl",), 1), (by, sensors, warned)
        assert st.source.ahead.total == 10
        assert ahead() == (None, (), [])
    finally:
        st.close()


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
    ahead.received("lvl", T0 + 100)  # as the source notes it, after the refusals
    engine.process(Sample("lvl", T0 + 100, 4.2))  # judged (the clocks agree again): the run ends
    assert ahead.latest("lvl") is None
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


def said_of(caplog: pytest.LogCaptureFixture, sensor: str) -> list[str]:
    """The MQTT source's log levels that name `sensor`'s refusals or their end."""
    return [
        r.levelname
        for r in caplog.records
        if r.name == "monitor.sources.mqtt_ingest" and repr(sensor) in r.getMessage()
    ]


def test_a_frozen_stamp_the_engine_drops_does_not_end_a_run_of_refusals_ahead(
    tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """The PLC's reading at +0 is taken; its clock then jumps an hour ahead (refused, +10 s to
    +40 s) and between them its RTC, frozen, sends the last stamp again (+50 s): the engine
    drops that one (not later than the last). It is no reading taken: the run of refusals
    goes on (health still names the sensor, no INFO "taken again", the next refusal is the
    run's 5th, not a new run's WARNING). Before: the source ended the run at parse."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-frozen")
    caplog.set_level(logging.DEBUG, logger="monitor.sources.mqtt_ingest")
    try:
        st.at(0)
        st.send("lvl", T0)
        for k in (10, 20, 30):
            st.at(k)
            st.send("lvl", T0 + k + HOUR)
        st.at(50)
        st.send("lvl", T0)  # the frozen RTC's stamp: dropped by the engine
        assert st.daemon.engine.counters.out_of_order == 1
        st.at(60)
        st.send("lvl", T0 + 60 + HOUR)
        assert st.health().stamped_ahead_sensors == ("plant.lvl",)
        assert st.source.ahead.latest("plant.lvl") == (T0 + 60, HOUR, 4)
        assert said_of(caplog, "plant.lvl") == ["WARNING", "DEBUG", "DEBUG", "DEBUG"]
    finally:
        st.close()


def test_a_run_of_refusals_that_resumes_after_a_long_silence_warns_again(
    tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """The PLC stamps an hour ahead for 30 s (one WARNING), goes silent, and comes back two
    days later still an hour ahead with nothing taken between: a new run, a new WARNING.
    Before: it was the old run's 4th refusal, DEBUG, and the log said nothing for two days'
    news. Refusals within the hour are one run (a DEBUG each)."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-resume")
    caplog.set_level(logging.DEBUG, logger="monitor.sources.mqtt_ingest")
    try:
        for k in (0, 10, 20):
            st.at(k)
            st.send("lvl", T0 + k + HOUR)
        for k in (2 * 86400, 2 * 86400 + 10, 2 * 86400 + 3000):
            st.at(k)
            st.send("lvl", T0 + k + HOUR)
        assert said_of(caplog, "plant.lvl") == ["WARNING", "DEBUG", "DEBUG", "WARNING", "DEBUG", "DEBUG"]
        assert st.source.ahead.latest("plant.lvl") == (T0 + 2 * 86400 + 3000, HOUR, 3)
    finally:
        st.close()


def test_health_reports_the_worst_skew_of_the_sensors_refused_not_the_last(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """Two PLCs refused: one a day ahead, then one 10 min ahead. Health's `stamped_ahead_by`
    and the console's line say ~24.0 h (the worst of them), so the operator sees the real
    skew. Before: the last refusal's 10 min."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-worst")
    try:
        st.at(0)
        st.send("lvl", T0 + 86400.0)
        st.at(5)
        st.send("wet", T0 + 5 + 600.0)
        mqtt = st.health()
        assert (mqtt.stamped_ahead_by, mqtt.stamped_ahead_sensors) == (86400.0, ("plant.lvl", "plant.wet"))
        warned = [a["text"] for a in attention(st.daemon.health().to_json()) if "ahead of" in a["text"]]
        assert len(warned) == 1 and "~24.0 h" in warned[0], warned
    finally:
        st.close()


def test_a_gateway_clock_step_back_moves_the_refusal_times_with_it(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The gateway clock an hour ahead of true time; a PLC's readings refused (a day ahead) at
    +0 s to +20 s, then NTP steps the gateway back an hour at +30 s. The refusals happened 10
    to 30 s before, not an hour later: health's line ends 10 min after the last (+620 s),
    and a stale at +61 s says they arrive. Before: their times stayed on the old clock, an
    hour ahead of the new one, and health said "readings arrive" until +1 h 10 min."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-step")
    try:
        for k in (0, 10, 20):
            st.at(k, gateway=T0 + k + HOUR)
            st.send("lvl", T0 + k + 86400.0)
        for k in range(30, 62):
            st.at(k)
        assert st.source.ahead.latest("plant.lvl") == (T0 + 20, 86400.0 - HOUR, 3)
        raised = [e for e in st.daemon.alarms.journal.entries(sensor="plant.lvl") if e.rule is Rule.STALE]
        assert [e.time - T0 for e in raised] == [61.0] and "stamped ahead" in raised[0].message, raised
        st.at(619)
        assert st.health().stamped_ahead_sensors == ("plant.lvl",)
        st.at(621)
        assert (st.health().stamped_ahead_by, st.health().stamped_ahead_sensors) == (None, ())
    finally:
        st.close()


def test_a_refusal_that_arrives_while_an_earlier_reading_waits_to_be_judged_is_not_ended_by_it(
    tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """The PLC's reading at +0 is received and queued; before the loop judges it, the PLC's
    clock jumps an hour ahead and its next reading (+10 s) is refused on paho's thread. The
    reading judged after was received before that refusal: it is no proof the device's clock
    is right again. The run goes on: health names the sensor, no INFO "taken again", the
    stale alarm would say the readings arrive stamped ahead. A reading received after the
    refusal and judged ends it. Before: judging the earlier reading folded the refusal into
    an ended run (health dropped the line until the next refusal)."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-race")
    caplog.set_level(logging.DEBUG, logger="monitor.sources.mqtt_ingest")
    try:
        st.at(0)
        st.peer.publish("plant/lvl/level", json.dumps({"v": 4.2, "t": T0}))
        wait_until(lambda: st.source.pending() == 1, timeout=10, what="the reading queued")
        st.at(10)
        st.peer.publish("plant/lvl/level", json.dumps({"v": 4.2, "t": T0 + 10 + HOUR}))
        wait_until(lambda: st.source.pending() == 2, timeout=10, what="the refusal queued")
        st.source.drain(st.emit)
        st.daemon.pipeline.process_queued()
        assert st.daemon.engine.status("plant.lvl").value == 4.2  # the first reading was judged
        assert st.source.ahead.latest("plant.lvl") == (T0 + 10, HOUR, 1)
        assert st.health().stamped_ahead_sensors == ("plant.lvl",)
        assert said_of(caplog, "plant.lvl") == ["WARNING"]
        st.at(20)
        st.send("lvl", T0 + 20)  # received after the refusal, judged: the run is over
        assert st.source.ahead.latest("plant.lvl") is None
        assert st.health().stamped_ahead_sensors == ()
        assert said_of(caplog, "plant.lvl") == ["WARNING", "INFO"]
    finally:
        st.close()


def test_a_refusal_between_a_clock_step_and_the_watch_noticing_it_is_moved_by_no_step(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The gateway clock an hour ahead; a PLC's readings refused (a day ahead) at +0 s to
    +20 s. NTP steps the gateway back an hour at +30 s, and a refusal arrives before the clock
    watch's next check notices the step (the daemon checks before each batch and each tick:
    under a second, but paho's thread records it at once). It arrived on the new clock: the
    step moves the earlier three, not it. Before: moved by the hour too, it read an hour before
    it came, and health dropped the sensor's line at once (until the next refusal). The step
    itself is injected (the wall and monotonic clocks are the test's): a real clock step cannot
    be made on demand."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-step-race")
    try:
        for k in (0, 10, 20):
            st.at(k, gateway=T0 + k + HOUR)
            st.send("lvl", T0 + k + 86400.0)
        st.wall.set(T0 + 30)  # NTP's step back, not noticed yet: no tick
        st.mono.set(1030.0)
        st.send("lvl", T0 + 30 + 86400.0)  # recorded at receipt; the batch's check then notices
        assert st.daemon.clock_watch is not None and st.daemon.clock_watch.generation == 1  # noticed
        assert st.source.ahead.latest("plant.lvl") == (T0 + 30, 86400.0, 4)
        st.at(40)
        assert st.health().stamped_ahead_sensors == ("plant.lvl",)
        assert st.health().stamped_ahead_by == 86400.0
    finally:
        st.close()


def test_a_refusal_between_two_clock_steps_the_watch_notices_as_one_moves_onto_the_clock_of_now(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """As above, but the gateway clock steps twice before the watch's next check: back an hour
    at +30 s (a refusal arrives on that clock), forward 30 min at +31 s (a second time source,
    or an operator). The watch sees one step back of 30 min. The refusal is on neither the
    clock before nor the clock after: nearer the new one, it was moved by nothing and read 30
    min old (health dropped the sensor's line at once). Its arrival moves onto the clock of now
    by the gateway clock less the monotonic time at arrival and now: +30 min. The refusals
    before the steps move by the net step. The steps are injected, as above."""
    st = SkewStation(tmp_path, mosquitto.port, "t-skew-two-steps")
    try:
        for k in (0, 10, 20):
            st.at(k, gateway=T0 + k + HOUR)
            st.send("lvl", T0 + k + 86400.0)
        n = st.source.received + 1
        st.wall.set(T0 + 30)  # NTP's step back, not noticed yet
        st.mono.set(1030.0)
        st.peer.publish("plant/lvl/level", json.dumps({"v": 4.2, "t": T0 + 30 + 86400.0}))
        wait_until(
            lambda: st.source.received >= n and st.source.pending() >= 1, timeout=10, what="the refusal"
        )
        st.wall.set(T0 + 31 + HOUR / 2)  # and forward half an hour, before the watch's check
        st.mono.set(1031.0)
        st.source.drain(st.emit)
        st.daemon.pipeline.process_queued()  # the batch's check notices one step, back 30 min
        assert st.daemon.clock_watch is not None and st.daemon.clock_watch.generation == 1
        assert st.source.ahead.latest("plant.lvl") == (T0 + 30 + HOUR / 2, 86400.0, 4)
        st.at(40, gateway=T0 + 40 + HOUR / 2)
        assert st.health().stamped_ahead_sensors == ("plant.lvl",)
    finally:
        st.close()


def test_the_daemon_on_the_real_clock_times_refusals_ahead_on_its_clock_watchs_monotonic_clock(
    tmp_path: Path,
) -> None:
    """`monitor run` builds its clock watch (CLOCK_BOOTTIME) before the MQTT source: the
    source's refusals ahead must note their arrival on the watch's monotonic clock, or a
    suspended gateway's offset (boottime less monotonic) tells the two clocks apart wrongly
    at a step."""
    from monitor.daemon import Daemon
    from monitor.model import WallClock

    daemon = Daemon(skew_config(tmp_path, free_port(), "t-skew-wiring"), WallClock())
    try:
        assert daemon.clock_watch is not None and daemon.mqtt_source is not None
        assert daemon.mqtt_source.ahead.monotonic is daemon.clock_watch.monotonic
    finally:
        close(daemon)
