"""Gateway clock steps while the daemon runs, beyond one step (issue 12, item 5 follow-up):
a reading queued across two steps, device-stamped pumps and levels, and a sensor fed on
two clocks. Injected wall and monotonic clocks, event time, no sleeps."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from monitor.config import Config, build_config, load_config
from monitor.engine import ClockWatch, Engine
from monitor.engine.clock_step import SETTLE
from monitor.model import ManualClock, Rule, Sample
from monitor.reconcile import device_named, device_stamped
from monitor.sources.mqtt import MqttLink
from monitor.sources.mqtt_ingest import MqttSource
from tests.cli import run_monitor
from tests.engine_helpers import T0
from tests.mqtt_tools import Peer, collect, mqtt_config
from tests.services import Mosquitto
from tests.test_clock_step import (
    CONFIG,
    PH_FIELD,
    PLANT_TEMP,
    Stepped,
    clocks_at,
    two_clock_station,
    watched_daemon,
)
from tests.test_pipeline import close


def test_a_poll_queued_across_a_step_back_and_a_step_forward_is_moved_by_both(tmp_path: Path) -> None:
    """An NTP sync after a bad RTC: the gateway clock steps back an hour (noticed at +70 s
    by the tick), then forward half an hour (noticed at +85 s), while the pH poll of +60 s
    (the first clock's) still waits in the queue. It is moved by both steps, -30 min, to
    the time it was taken on the clock that is right now, and pH 11 on that clock raises
    the high alarm at once. Before: only the last step was remembered, the poll was not
    taken for the first clock's, it was judged at +60 s, half an hour ahead of the new
    clock, and every pH reading of the next half hour was dropped as out of order (no
    high pH alarm)."""
    gw = Stepped(tmp_path, -3600.0)
    daemon = gw.daemon
    try:
        for k in range(0, 51, 10):
            gw.poll(k, ph=7.0)

        def clock(k: float) -> float:  # -1 h from +65 s, -30 min net from +80 s
            return T0 + k - (3600.0 if k < 80 else 1800.0)

        for k in (70, 85):
            clocks_at(gw.wall, gw.mono, k, clock(k))
            daemon.tick()
        clocks_at(gw.wall, gw.mono, 90, clock(90))
        daemon.pipeline.process([Sample("ph", T0 + 60, 7.0)])
        for k in range(90, 121, 10):
            clocks_at(gw.wall, gw.mono, k, clock(k))
            daemon.pipeline.process([Sample("ph", clock(k), 11.0)])
        assert daemon.engine.counters.out_of_order == 0
        assert daemon.pipeline.stats.restamped == 1
        stored = sorted(s.time - T0 for s in daemon.sink.store.query("ph"))
        assert stored == [-1740.0, -1710.0, -1700.0, -1690.0, -1680.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
        journal = daemon.alarms.journal.entries(sensor="ph")
        assert [(e.event, e.time - T0) for e in journal if e.rule is Rule.HIGH] == [("activated", -1710.0)]
    finally:
        close(daemon)


def test_which_readings_each_of_several_steps_moves() -> None:
    """Forward an hour at +65 s, then back half an hour at +95 s: a reading of the first
    clock (+60 s) is moved by both (+30 min), one of the second (+3690 s on it, +90 s of
    real time) by the second only, one of the clock now by none; a reading ahead of every
    clock the gateway had, or older than a step before the first, is left alone. After a
    step back and then forward, the same (both orders are what an NTP sync after a bad RTC
    can do)."""
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    watch = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=wall.now, monotonic=mono.now)
    assert watch.check() == []
    wall.set(T0 + 70 + 3600)
    mono.set(1070.0)
    assert [c.rule for c in watch.check()] == [Rule.CLOCK]
    wall.set(T0 + 100 + 1800)
    mono.set(1100.0)
    assert [c.rule for c in watch.check()] == [Rule.CLOCK]
    wall.set(T0 + 110 + 1800)
    items = [Sample("ph", t, 7.0) for t in (T0 + 60, T0 + 3690, T0 + 1905, T0 + 9000, T0 - 4000)]
    moved, count = watch.restamp(items)
    assert [s.time - T0 for s in moved] == [1860.0, 1890.0, 1905.0, 9000.0, -4000.0]
    assert count == 2
    # A batch a full disk held, moved onto the second clock already: by the last step only.
    held, count = watch.restamp([Sample("ph", T0 + 3690, 7.0)], since=1)
    assert [s.time - T0 for s in held] == [1890.0] and count == 1

    wall, mono = ManualClock(T0), ManualClock(1000.0)
    watch = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=wall.now, monotonic=mono.now)
    assert watch.check() == []
    wall.set(T0 + 70 - 3600)
    mono.set(1070.0)
    watch.check()
    wall.set(T0 + 100 - 1800)
    mono.set(1100.0)
    watch.check()
    wall.set(T0 + 110 - 1800)
    items = [Sample("ph", t, 7.0) for t in (T0 + 60, T0 - 3510, T0 - 1695)]
    moved, count = watch.restamp(items)
    assert [s.time - T0 for s in moved] == [-1740.0, -1710.0, -1695.0]
    assert count == 2


def test_a_step_is_forgotten_once_nothing_held_was_handed_over_before_it(tmp_path: Path) -> None:
    """Bounded memory: the steps are kept while a reading handed over before them may still
    wait, and forgotten once the oldest the pipeline holds came `SETTLE` after them."""
    gw = Stepped(tmp_path, -3600.0)
    daemon = gw.daemon
    try:
        gw.poll(0, ph=7.0)
        gw.wall.set(gw.at(70))
        gw.mono.set(1070.0)
        daemon.tick()
        assert [s.step for s in daemon.pipeline.clock_watch.steps] == [-3600.0]  # type: ignore[union-attr]
        gw.poll(70 + SETTLE, ph=7.0)  # handed over just SETTLE after the step: kept
        assert len(daemon.pipeline.clock_watch.steps) == 1  # type: ignore[union-attr]
        gw.poll(71 + SETTLE, ph=7.0)
        assert daemon.pipeline.clock_watch.steps == ()  # type: ignore[union-attr]
        assert daemon.pipeline.clock_watch.generation == 1  # type: ignore[union-attr]
    finally:
        close(daemon)


WELL = [
    {"id": "lvl", "kind": "level", "unit": "ft",
     "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
    {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm", "max_starts_per_hour": 3, "max_run": "5m"}},
]  # fmt: skip


def mixed_station(tmp_path: Path) -> Config:
    """A wet well whose level is polled over Modbus (the gateway's clock) and whose pump
    reports its run feedback over MQTT with the controller's own time (`time_path`)."""
    return two_clock_station(
        tmp_path,
        {"id": "ps-mixed-clocks", "timezone": "UTC"},
        WELL,
        polled=[{"sensor": "lvl", "register": "holding", "address": 0, "type": "UINT16", "scale": 0.01}],
        subscriptions=[{"topic": "pumps/p1", "sensor": "p1", "format": "json",
                        "value_path": "on", "time_path": "t"}],
        wet_well={"level": "lvl", "pumps": ["p1"], "fail_to_start_delay": "2m"},
    )  # fmt: skip


def test_a_step_back_leaves_a_device_stamped_pump_where_it_is(tmp_path: Path) -> None:
    """An NTP correction at boot: the gateway's RTC ran an hour ahead; the pump controller
    stamps p1's feedback with its own, correct clock. p1 runs +10..+40 s and from +50 s;
    at +65 s the gateway clock is stepped back to true time (the tick notices at +70 s);
    p1's "on" of +60 s and the level poll of +60 s wait in the queue across it; the level
    reaches the overflow at +100 s; p1 stops at +200 s and starts again at +210 s. Only
    the gateway-stamped state moves: the level poll is moved onto the new clock and the
    well is judged there (high level and overflow at +100 s), while p1's run from +50 s
    lasted the 150 s it ran (no `long_run`, max 5 min), its runs stay where the controller
    stamped them and no start is lost. Before: the step moved p1's run back an hour with
    the level's history, and the next "on" found it 3,620 s long: a false `long_run`."""
    config = mixed_station(tmp_path)
    ahead = 3600.0
    daemon, wall, mono = watched_daemon(config, T0 + ahead)

    def at(k: float, *items: Sample) -> None:
        clocks_at(wall, mono, k, T0 + k + (ahead if k < 65 else 0.0))
        daemon.pipeline.process(list(items))

    def pump(k: float) -> Sample:
        return Sample("p1", T0 + k, 1.0 if 10 <= k < 40 or 50 <= k < 200 or k >= 210 else 0.0)

    try:
        for k in range(0, 51, 10):
            at(k, Sample("lvl", T0 + ahead + k, 4.0), pump(k))
        wall.set(T0 + 70)
        mono.set(1070.0)
        daemon.tick()
        at(70, Sample("lvl", T0 + ahead + 60, 4.0), pump(60))  # queued across the step
        for k in range(70, 221, 10):
            at(k, Sample("lvl", T0 + k, 4.0 if k < 100 else 9.5), pump(k))
        assert [(e.rule, e.event) for e in daemon.alarms.journal.entries(sensor="p1")] == []
        journal = daemon.alarms.journal.entries(sensor="lvl")
        assert sorted((e.rule, e.event, e.time - T0) for e in journal) == [
            (Rule.HIGH_LEVEL, "activated", 100.0),
            (Rule.OVERFLOW, "activated", 100.0),
        ]
        store = daemon.station.store
        assert store is not None
        runs = [(r.start - T0, None if r.end is None else r.end - T0) for r in store.runs(0, 2 * T0)]
        assert runs == [(10.0, 40.0), (50.0, 200.0), (210.0, None)]
        tracker = daemon.station.tracker
        assert tracker is not None  # no start lost: three in the hour, on the controller's clock
        assert [t - T0 for t in tracker.pumps["p1"].recent_starts] == [10.0, 50.0, 210.0]
        assert daemon.engine.counters.out_of_order == 0
    finally:
        close(daemon)


def test_a_step_back_leaves_a_device_stamped_wet_well_where_it_is(tmp_path: Path) -> None:
    """The whole well reports over MQTT with the controller's time: the level above lead_on
    from +30 s with p1 off, the gateway clock stepped back an hour at +65 s. fail_to_start
    is raised after its 2 min on the controller's clock, at +150 s. Before: the step moved
    the well's delay back an hour and the next level reading found it 3,640 s old: a false
    `fail_to_start` at +70 s, 80 s early."""
    config = build_config(
        {
            "station": {"id": "ps-device-well", "timezone": "UTC"},
            "state_dir": str(tmp_path / "state"),
            "sensors": WELL,
            "wet_well": {"level": "lvl", "pumps": ["p1"], "fail_to_start_delay": "2m"},
            "mqtt": {"subscriptions": [{"topic": "well/+", "sensor": "{1}", "format": "json",
                                        "value_path": "v", "time_path": "t"}]},
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )  # fmt: skip
    daemon, wall, mono = watched_daemon(config, T0 + 3600.0)
    try:
        for k in range(0, 201, 10):
            clocks_at(wall, mono, k, T0 + k + (3600.0 if k < 65 else 0.0))
            level = 6.0 if k >= 30 else 4.0
            daemon.pipeline.process([Sample("lvl", T0 + k, level), Sample("p1", T0 + k, 0.0)])
        journal = daemon.alarms.journal.entries(sensor="lvl")
        assert [(e.rule, e.event, e.time - T0) for e in journal] == [(Rule.FAIL_TO_START, "activated", 150.0)]
    finally:
        close(daemon)


def float_switch_station(tmp_path: Path) -> Config:
    """The wet well's level from an ultrasonic transmitter over MQTT with its own time
    (`time_path`); the high-level float switch and p1's run feedback polled from the PLC
    over Modbus, on the gateway's clock."""
    return two_clock_station(
        tmp_path,
        {"id": "ps-float", "timezone": "UTC"},
        [*WELL, {"id": "float", "kind": "status"}],
        polled=[{"sensor": "p1", "register": "coil", "address": 0, "type": "BIT"},
                {"sensor": "float", "register": "coil", "address": 1, "type": "BIT"}],
        subscriptions=[{"topic": "well/lvl", "sensor": "lvl", "format": "json",
                        "value_path": "v", "time_path": "t"}],
        wet_well={"level": "lvl", "pumps": ["p1"], "overflow_switch": "float", "fail_to_start_delay": "2m"},
    )  # fmt: skip


@pytest.mark.parametrize("step", [-3600.0, 3600.0], ids=["back", "forward"])
def test_a_device_stamped_level_beside_a_gateway_float_switch_across_a_step(
    tmp_path: Path, step: float
) -> None:
    """The gateway's clock is wrong by an hour until NTP steps it right at +65 s (the tick
    notices at +70 s); the level transmitter stamps its own, right time. The level rises
    above lead_on at +30 s with p1 off: fail_to_start is due at +150 s on the level's clock,
    and is raised then, once. p1 starts at +200 s (its feedback on the gateway clock) and
    ends it; no long_run (p1 runs 100 s, max 5 min); the float switch stays off: no
    overflow. Before, with the gateway an hour ahead: the float's reading at +30 s, stamped
    an hour after the level's, was judged at its stamp, found the level above lead_on for
    3,600 s and raised a false fail_to_start 120 s early; stamped on the wrong clock and not
    moved by the step (the well's times are the level's), it was not ended by p1's start.
    (The level's `stale` alarm, judged by the engine against the wrong gateway clock before
    the step, is not the tracker's and left out here.)"""
    config = float_switch_station(tmp_path)
    assert {"lvl"} <= device_stamped(config) and "float" not in device_stamped(config)
    wrong = -step  # the gateway clock's error before the step
    daemon, wall, mono = watched_daemon(config, T0 + wrong)
    try:
        for k in range(0, 301, 10):
            clocks_at(wall, mono, k, T0 + k + (wrong if k < 65 else 0.0))
            daemon.tick()
            level = 6.0 if k >= 30 else 4.0
            daemon.pipeline.process(
                [Sample("lvl", T0 + k, level), Sample("p1", wall.now(), 1.0 if k >= 200 else 0.0),
                 Sample("float", wall.now(), 0.0)]
            )  # fmt: skip
        journal = [e for e in daemon.alarms.journal.entries(sensor="lvl") if e.rule is not Rule.STALE]
        assert [(e.rule, e.event, e.time - T0) for e in journal] == [
            (Rule.FAIL_TO_START, "activated", 150.0),
            (Rule.FAIL_TO_START, "cleared", 200.0),
        ]
        assert list(daemon.alarms.journal.entries(sensor="p1")) == []
        assert daemon.engine.counters.out_of_order == 0
    finally:
        close(daemon)


def test_a_float_switch_and_pump_on_the_gateway_clock_measure_fail_to_start_without_the_level(
    tmp_path: Path,
) -> None:
    """The same well, clocks right: the level (6 ft, above lead_on) reports until +50 s and
    then its transmitter goes quiet; p1 stops at +60 s. The pump's and the float's readings,
    on the gateway clock, measure the delay from the stop: fail_to_start at +180 s. (Judged
    at the level's last time instead, they could never measure it: no alarm.)"""
    daemon, wall, mono = watched_daemon(float_switch_station(tmp_path))
    try:
        for k in range(0, 301, 10):
            clocks_at(wall, mono, k, T0 + k)
            daemon.tick()
            level = [Sample("lvl", T0 + k, 6.0)] if k <= 50 else []
            daemon.pipeline.process(
                [*level, Sample("p1", wall.now(), 1.0 if k < 60 else 0.0), Sample("float", wall.now(), 0.0)]
            )
        journal = [e for e in daemon.alarms.journal.entries(sensor="lvl") if e.rule is Rule.FAIL_TO_START]
        assert [(e.event, e.time - T0) for e in journal] == [("activated", 180.0)]
    finally:
        close(daemon)


@pytest.mark.parametrize("step", [-3600.0, 3600.0], ids=["back", "forward"])
def test_an_overflow_the_gateway_float_opened_moves_with_its_clock_across_a_step(
    tmp_path: Path, step: float
) -> None:
    """The same well, the gateway clock wrong by an hour until NTP steps it right at +65 s:
    the float switch (gateway clock) is on from +40 s to +190 s, the level (its own clock)
    stays below overflow. The overflow record the float opened is on the gateway's clock and
    moves with its step: it starts at +40 s, is due 2 h later, ends at +200 s. Before: the
    well's times were taken for the level's, the record stayed where the wrong clock put it
    and ended on the right one: an hour before its start after a step back (its report due
    an hour late), 3,760 s long after a step forward (due an hour early)."""
    config = float_switch_station(tmp_path)
    wrong = -step
    daemon, wall, mono = watched_daemon(config, T0 + wrong)
    try:
        for k in range(0, 301, 10):
            clocks_at(wall, mono, k, T0 + k + (wrong if k < 65 else 0.0))
            daemon.tick()
            daemon.pipeline.process(
                [Sample("lvl", T0 + k, 4.0), Sample("p1", wall.now(), 0.0),
                 Sample("float", wall.now(), 1.0 if 40 <= k < 200 else 0.0)]
            )  # fmt: skip
        store = daemon.station.store
        assert store is not None
        records = [(r.start - T0, r.due - T0, None if r.end is None else r.end - T0)
                   for r in store.overflows(T0 - 2 * 3600, T0 + 2 * 3600)]  # fmt: skip
        assert records == [(40.0, 7240.0, 200.0)]
    finally:
        close(daemon)


TWO_CLOCKS = """\
station: {id: ps-two-clocks}
sensors:
  - {id: ph, kind: ph}
  - {id: temp, kind: temperature, unit: degC}
modbus:
  devices:
    - name: plc
      host: 127.0.0.1
      fields:
        - {sensor: temp, register: holding, address: 0, type: UINT16}
        - {sensor: ph, register: holding, address: 1, type: UINT16, scale: 0.01}
mqtt:
  subscriptions:
    - {topic: lab/temp, sensor: temp}
    - {topic: probe/ph, sensor: ph, format: json, value_path: v, time_path: t}
    - {topic: probe/temp, sensor: temp, format: json, value_path: v, time_path: t}
"""


def test_a_sensor_fed_on_the_gateway_clock_and_with_a_payload_time_is_refused(tmp_path: Path) -> None:
    """One sensor's history cannot be on two clocks across a gateway clock step: moved with
    the step, the device's readings look a step old (a false alarm); left, the poll's are a
    step out of order (dropped). So a sensor polled over Modbus, or named by a subscription
    without a `time_path`, and also named by one with a `time_path` is a config error naming
    both keys, and the daemon does not start (exit 2). Before: the config loaded and the
    sensor was taken for the gateway's, its device-stamped readings moved by a step."""
    path = tmp_path / "station.yaml"
    path.write_text(TWO_CLOCKS, encoding="utf-8")
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    assert (
        "mqtt.subscriptions[1].sensor: sensor 'ph' is polled by modbus.devices[0].fields[1].sensor"
        " (stamped by the gateway clock) and takes its time from the payload here" in err
    )
    assert (
        "mqtt.subscriptions[2].sensor: sensor 'temp' is polled by modbus.devices[0].fields[0].sensor" in err
    )
    assert "and fed by mqtt.subscriptions[0].sensor" in err


TWO_SUBSCRIPTIONS = """\
station: {id: ps-two-subscriptions}
sensors:
  - {id: plant.lvl, kind: level, unit: ft}
  - {id: plant.wet, kind: level, unit: ft}
  - {id: lab.ph, kind: ph}
  - {id: mill.flow, kind: flow, unit: gpm}
mqtt:
  subscriptions:
    - {topic: scada/+/level, sensor: "plant.{1}"}
    - {topic: plc/lvl, sensor: plant.lvl, format: json, value_path: v, time_path: t}
    - {topic: lab/+, sensor: "lab.{1}", format: json, value_path: v, time_path: t}
    - {topic: bench/+, sensor: "lab.{1}"}
    - {topic: mill/flow, sensor: mill.flow}
    - {topic: plc/+/flow, sensor: "{1}.flow", format: json, value_path: v, time_path: t}
"""


def test_a_sensor_two_templates_could_name_on_two_clocks_is_refused(tmp_path: Path) -> None:
    """A sensor no subscription names literally that a template with a `time_path` (the
    device's clock) and one without (the gateway's, at receipt) could both name: nothing
    in the config says which clock is its, and each message would be taken on its own, its
    history on two clocks. A config error naming the key, exit 2. Before: the config loaded,
    the sensor was taken for the gateway's, and its device-stamped readings were taken too
    (moved by every gateway step: a false on-delay or slug). A literal name decides instead:
    `plant.lvl` (a payload time, beside `scada/+/level -> plant.{1}`) is the device's, and
    `mill.flow` (none, beside `plc/+/flow -> {1}.flow` with one) the gateway's; the
    template's messages for them are refused one by one."""
    path = tmp_path / "station.yaml"
    path.write_text(TWO_SUBSCRIPTIONS, encoding="utf-8")
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    problems = [line.strip() for line in result.stderr.splitlines() if "mqtt.subscriptions[" in line]
    assert problems == [
        "mqtt.subscriptions[2].sensor: takes its time from the payload (the device's clock), and"
        " mqtt.subscriptions[3].sensor ('lab.{1}', no time_path: the gateway clock at receipt) could"
        " name the same sensor 'lab.ph': one sensor cannot be judged on two clocks across a gateway"
        " clock step; name it literally in the subscription whose clock is its, or give the"
        " templates sensor ids that cannot meet"
    ], result.stderr


@contextmanager
def subscribed(
    mosquitto: Mosquitto,
    subs: list[dict[str, Any]],
    client_id: str,
    sensors: list[str],
    *,
    device: Sequence[str] = (),
    gateway: Sequence[str] = (),
) -> Iterator[tuple[MqttSource, Peer]]:
    """The MQTT source of station ps-1 on `subs` connected to the real broker, its `sensors`
    on the clocks given (`device`-stamped or `gateway`-stamped), and a peer to publish as
    the devices do; both closed whatever the test asserts."""
    cfg = mqtt_config(mosquitto.port, subscriptions=subs)
    link = MqttLink(cfg, "ps-1", client_id=client_id)
    source = MqttSource(link, cfg, "ps-1", sensors=sensors, device=device, gateway=gateway)
    link.start()
    link.wait_connected()
    peer = Peer(mosquitto.port, f"{client_id}-peer")
    try:
        yield source, peer
    finally:
        peer.close()
        link.stop()


def test_a_template_without_a_payload_time_cannot_bind_a_sensor_named_with_one(
    mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """`plc/lvl -> plant.lvl` takes the PLC's time; `scada/+/level -> plant.{1}` (no
    `time_path`) feeds the other levels at receipt. A SCADA message that binds `plant.lvl` is
    refused as a bad payload, counted and logged with why; the others go on (a real broker).
    Before: it was taken at receipt beside the PLC's stamped readings, one sensor on two
    clocks."""
    subs = [
        {"topic": "scada/+/level", "sensor": "plant.{1}"},
        {"topic": "plc/lvl", "sensor": "plant.lvl", "format": "json", "value_path": "v", "time_path": "t"},
    ]
    config = build_config(
        {
            "station": {"id": "ps-1"},
            "sensors": [{"id": "plant.lvl", "kind": "level", "unit": "ft"},
                        {"id": "plant.wet", "kind": "level", "unit": "ft"}],
            "mqtt": {"subscriptions": subs},
        }
    )  # fmt: skip
    assert device_stamped(config) == device_named(config) == frozenset({"plant.lvl"})
    levels = ["plant.lvl", "plant.wet"]
    with subscribed(mosquitto, subs, "t-two-subs", levels, device=["plant.lvl"]) as (source, peer):
        messages = [
            ("scada/lvl/level", b"4.0"),
            ("scada/wet/level", b"3.0"),
            ("plc/lvl", json.dumps({"v": 4.2, "t": T0}).encode()),
        ]
        with caplog.at_level(logging.WARNING, logger="monitor.sources.mqtt_ingest"):
            peer.publish_many(messages)
            samples = asyncio.run(collect(source, lambda got: len(got) >= 2))
        assert sorted((s.sensor, s.value) for s in samples) == [("plant.lvl", 4.2), ("plant.wet", 3.0)]
        assert source.bad.counts == {"scada/lvl/level": 1}
        assert (
            "topic 'scada/lvl/level': bad payload: sensor 'plant.lvl' takes its time from the payload"
            " (a subscription with a time_path names it); a reading stamped at receipt would judge it"
            " on two clocks" in caplog.text
        ), caplog.text


def test_a_payload_time_for_a_polled_sensor_is_refused_per_message(
    mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    """A templated subscription with a `time_path` (`plant/+/flow` -> `{1}.flow`) can bind a
    sensor only when a message comes: one that binds a sensor the gateway clock stamps
    (polled over Modbus) is refused as a bad payload, counted and logged with why, and the
    others go on (a real broker). Before: it was taken, and the sensor's readings were on
    two clocks."""
    subs = [
        {"topic": "plant/+/flow", "sensor": "{1}.flow", "format": "json", "value_path": "v", "time_path": "t"}
    ]
    flows = ["outfall.flow", "mill.flow"]
    with subscribed(mosquitto, subs, "t-two-clocks", flows, gateway=["mill.flow"]) as (source, peer):
        messages = [
            ("plant/mill/flow", json.dumps({"v": 50.0, "t": T0}).encode()),
            ("plant/outfall/flow", json.dumps({"v": 120.5, "t": T0}).encode()),
        ]
        with caplog.at_level(logging.WARNING, logger="monitor.sources.mqtt_ingest"):
            peer.publish_many(messages)
            samples = asyncio.run(collect(source, lambda got: len(got) >= 1))
        assert [(s.sensor, s.value) for s in samples] == [("outfall.flow", 120.5)]
        assert source.bad.counts == {"plant/mill/flow": 1}
        assert (
            "topic 'plant/mill/flow': bad payload: sensor 'mill.flow' is stamped by the gateway clock"
            " (polled over Modbus, or fed without a time_path); a payload time would judge it on two"
            " clocks" in caplog.text
        )


def test_a_step_back_leaves_a_sensor_derived_from_device_stamped_readings_where_it_is(
    tmp_path: Path,
) -> None:
    """A derived sensor made only of device-stamped readings carries their time: the
    effluent temperature in °F, from the device's °C. Over 150 °F for 90 s (5 min
    on-delay: no alarm due); the gateway's RTC, 3 h ahead, is stepped back at +65 s. Before:
    the step moved the derived sensor's history back 3 h (only fed sensors were known to
    be device-stamped), its next sample found the excursion 3 h old: a false `high`."""
    config = two_clock_station(
        tmp_path,
        {"id": "ps-derived-device"},
        [
            {"id": "ph", "kind": "ph"},
            {"id": "plant.temp", "kind": "temperature", "unit": "degC", "stale_after": "1h",
             "limits": {"on_delay": "5m", "off_delay": "0s"}},
            {"id": "temp.f", "kind": "derived", "unit": "degF", "expression": "plant.temp",
             "limits": {"high": 150, "unit": "degF", "on_delay": "5m", "off_delay": "0s"},
             "stale_after": "1h"},
        ],
        polled=[PH_FIELD],
        subscriptions=[PLANT_TEMP],
    )  # fmt: skip
    assert "temp.f" in device_stamped(config)
    ahead = 3 * 3600.0
    daemon, wall, mono = watched_daemon(config, T0 + ahead)
    try:
        for k in range(0, 401, 10):
            clocks_at(wall, mono, k, T0 + k + (ahead if k < 65 else 0.0))
            temp = 70.0 if 30 <= k <= 110 else 40.0  # 158 °F
            daemon.pipeline.process([Sample("q", wall.now(), 700.0), Sample("plant.temp", T0 + k, temp)])
        assert [(e.rule, e.event) for e in daemon.alarms.journal.entries(sensor="temp.f")] == []
        assert [s.time - T0 for s in daemon.sink.store.query("temp.f")][:3] == [0.0, 10.0, 20.0]
    finally:
        close(daemon)


def test_a_bad_device_reading_before_a_step_forward_does_not_silence_its_derived_sensor(
    tmp_path: Path,
) -> None:
    """A derived sensor of device-stamped readings (°F from the device's °C) beside one of a
    flow polled on the gateway clock (gpm to MGD), an hour behind until NTP steps it forward
    at +65 s. The device's last reading before the step is its error code (-9999: bad, the
    derived sensor makes no sample from it). `temp.f` goes on from +70 s on the device's
    clock: no stale alarm, no gap. Before: the bad reading was taken for the gateway's
    (only a good one set its input's time), the step moved the derived evaluation an hour
    ahead of the device's clock, `temp.f` made nothing for the hour, and its stale alarm
    (2 min) was raised on a healthy device."""
    config = two_clock_station(
        tmp_path,
        {"id": "ps-derived-bad"},
        [
            {"id": "q", "kind": "flow", "unit": "gpm"},
            {"id": "q.mgd", "kind": "derived", "unit": "MGD", "expression": "q"},
            {"id": "plant.temp", "kind": "temperature", "unit": "degC", "bad_values": [-9999]},
            {"id": "temp.f", "kind": "derived", "unit": "degF", "expression": "plant.temp",
             "stale_after": "2m"},
        ],
        polled=[{"sensor": "q", "register": "holding", "address": 0, "type": "UINT16"}],
        subscriptions=[PLANT_TEMP],
    )  # fmt: skip
    behind = 3600.0
    daemon, wall, mono = watched_daemon(config, T0 - behind)
    try:
        for k in range(0, 401, 10):
            clocks_at(wall, mono, k, T0 + k - (behind if k < 65 else 0.0))
            daemon.tick()
            temp = -9999.0 if k == 60 else 40.0
            daemon.pipeline.process([Sample("q", wall.now(), 700.0), Sample("plant.temp", T0 + k, temp)])
        assert [(e.rule, e.event) for e in daemon.alarms.journal.entries(sensor="temp.f")] == []
        made = [s.time - T0 for s in daemon.sink.store.query("temp.f")]
        assert made == [float(k) for k in range(0, 391, 10) if k != 60]  # each made by the next reading
        assert daemon.engine.counters.out_of_order == 0
    finally:
        close(daemon)


def test_a_pump_start_queued_across_a_step_back_and_forward_is_counted_where_it_happened(
    tmp_path: Path,
) -> None:
    """The station's clock steps back an hour (noticed at +70 s) and forward half an hour
    (noticed at +85 s) while p1's "on" of +60 s waits in the queue. The start is moved by
    both steps with the level poll beside it, so p1's run starts at +60 s of real time and
    stops at +120 s: one run of 60 s, the start counted, no alarm. Before: the "on" was
    judged at +60 s on the first clock, half an hour ahead of the station, so p1's "off" at
    +120 s and every reading of the next half hour were older than it and ignored: the run
    was stored half an hour from where it happened and ended only at the first reading
    after that half hour."""
    gw = Stepped(tmp_path, -3600.0)
    daemon = gw.daemon

    def clock(k: float) -> float:
        return T0 + k - (0.0 if k < 65 else 3600.0 if k < 80 else 1800.0)

    try:
        for k in range(0, 51, 10):
            gw.poll(k, p1=0.0, lvl=4.0)
        for k in (70, 85):
            clocks_at(gw.wall, gw.mono, k, clock(k))
            daemon.tick()
        gw.wall.set(clock(90))
        gw.mono.set(1090.0)
        daemon.pipeline.process([Sample("p1", T0 + 60, 1.0), Sample("lvl", T0 + 60, 4.0)])
        for k in [*range(90, 200, 10), 1900, 1910]:
            clocks_at(gw.wall, gw.mono, k, clock(k))
            daemon.pipeline.process(
                [Sample("p1", clock(k), 1.0 if k < 120 else 0.0), Sample("lvl", clock(k), 4.0)]
            )
        assert list(daemon.alarms.journal.entries(sensor="p1")) == []
        store = daemon.station.store
        assert store is not None
        runs = [(r.start - T0, None if r.end is None else r.end - T0) for r in store.runs(0, 2 * T0)]
        assert runs == [(60.0 - 1800.0, 120.0 - 1800.0)]
        assert daemon.engine.counters.out_of_order == 0
    finally:
        close(daemon)


def test_polls_queued_longer_than_a_step_forward_are_moved_not_dropped(tmp_path: Path) -> None:
    """The pipeline stalls (a full disk) after judging the pH poll of +20 s; the polls of
    +25 s and +30 s wait in the queue while the gateway clock steps forward 30 s (noticed
    by the tick at +70 s, 50 s after they were taken: longer than the step). They were
    stamped on the old clock and are moved +30 s onto the new one, in order after the
    readings before them. Before: only a stamp within one step of the step's notice was
    taken for the old clock's; these two were stored and judged at +25/+30 s, on the old
    clock, against limit timers and a stale watch the step had moved 30 s ahead of them."""
    gw = Stepped(tmp_path, 30.0)
    daemon = gw.daemon
    try:
        for k in (0, 10, 20):
            gw.poll(k, ph=7.0)
        for k in (25, 30):  # taken and handed over, not yet judged
            clocks_at(gw.wall, gw.mono, k, gw.at(k))
            daemon.pipeline.emit([Sample("ph", gw.at(k), 7.0)])
        gw.wall.set(gw.at(70))
        gw.mono.set(1070.0)
        daemon.tick()
        assert daemon.pipeline.process_queued()
        assert daemon.engine.counters.out_of_order == 0
        stored = sorted(s.time - T0 for s in daemon.sink.store.query("ph"))
        assert stored == [0.0, 10.0, 20.0, 55.0, 60.0]
        assert daemon.pipeline.stats.restamped == 2
    finally:
        close(daemon)


REPEATED_LEVEL = """\
station: {id: ps-repeated-level}
sensors:
  - {id: north.ph, kind: ph}
  - {id: north.north, kind: ph}
mqtt:
  subscriptions:
    - {topic: site/+/ph, sensor: "{1}.{1}"}
    - {topic: plc/+/+, sensor: "{1}.{2}", format: json, value_path: v, time_path: t}
"""


def test_templates_that_name_a_level_twice_meet_only_where_it_repeats(tmp_path: Path) -> None:
    """`site/+/ph -> "{1}.{1}"` (the gateway's clock) can only name ids whose two halves are
    one topic level twice (`north.north`), never `north.ph`, which `plc/+/+ -> "{1}.{2}"`
    (a payload time) names: check-config names `north.north` alone, and `north.ph` is the
    device's. Before: a placeholder was any level wherever it stood, so `{1}.{1}` could
    name `north.ph` too: the error named it, and a config with `north.north` removed was
    refused (exit 2) though its templates cannot meet."""
    path = tmp_path / "station.yaml"
    path.write_text(REPEATED_LEVEL, encoding="utf-8")
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    problems = [line.strip() for line in result.stderr.splitlines() if "mqtt.subscriptions[" in line]
    assert len(problems) == 1 and "could name the same sensor 'north.north':" in problems[0], problems
    path.write_text(REPEATED_LEVEL.replace("  - {id: north.north, kind: ph}\n", ""), encoding="utf-8")
    result = run_monitor("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_config(path)
    assert device_stamped(config) == frozenset({"north.ph"})
