"""End to end: a PLC that keeps serving its last pH register after the probe's loop broke
("hold last value"), polled over real Modbus/TCP from the project's simulator, raises the
frozen alarm in the daemon, and the change when the loop is repaired clears it; the alarm
reaches a real broker on its MQTT alarm topic as stale's does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from monitor.alarms.journal import Journal
from monitor.alarms.manager import AlarmManager
from monitor.alarms.mqtt import AlarmPublisher
from monitor.alarms.notify import Dispatcher
from monitor.config import build_config
from monitor.daemon import Daemon
from monitor.engine import Engine
from monitor.model import Alarm, AlarmState, ManualClock, Priority, Rule, Sample
from monitor.sources.modbus import ModbusPoller
from monitor.sources.mqtt import MqttLink
from simulators.modbus_server import StationServer
from simulators.scenarios import Station
from tests.mqtt_tools import Peer, mqtt_config
from tests.services import Mosquitto, free_port, wait_until
from tests.test_pipeline import close
from tests.waiting import until

T0 = 1_767_225_600.0
MINUTE = 60.0


def test_a_plc_holding_the_ph_register_raises_frozen_and_a_change_clears_it(tmp_path: Path) -> None:
    port = free_port()
    station = Station(seed=11, speed=1.0, start=0.0)
    # At station hour 1 the pH loop breaks and the PLC holds the register for 7 h.
    held = station.inject("frozen_sensor", "1h", "7h", sensor="ph")
    config = build_config(
        {
            "station": {"id": "ps-frozen"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [
                {"id": "ph", "kind": "ph", "frozen_after": "6h", "stale_after": "5m"},
                {"id": "temp", "kind": "temperature", "unit": "degC", "frozen_after": "12h"},
            ],
            "modbus": {
                "devices": [
                    {
                        "name": "plc",
                        "host": "127.0.0.1",
                        "port": port,
                        "fields": [
                            {"sensor": "ph", "address": 2, "type": "FLOAT32"},
                            {"sensor": "temp", "address": 4, "type": "FLOAT32"},
                        ],
                    }
                ]
            },
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )
    clock = ManualClock(T0)
    daemon = Daemon(config, clock)
    seen: list[Alarm] = []
    daemon.alarms.listen(lambda _entry, alarm: seen.append(alarm))  # what MQTT, the console, callout get
    at = [0.0]
    readings: list[Sample] = []

    async def poll_every_minute() -> None:
        assert config.modbus is not None
        poller = ModbusPoller(config.modbus.devices, clock)
        async with StationServer(station, port=port, clock=lambda: at[0]):
            for minute in range(9 * 60 + 1):
                at[0] = minute * MINUTE
                clock.set(T0 + at[0])
                daemon.tick()
                items = await poller.poll("plc")
                readings.extend(i for i in items if isinstance(i, Sample))
                daemon.pipeline.process(items)
        for hub in poller.hubs.values():
            hub.close()

    try:
        asyncio.run(poll_every_minute())
        ph = [s.value for s in readings if s.sensor == "ph"]
        assert len(ph) == 9 * 60 + 1 and len(set(ph[60:480])) == 1  # held, good quality
        alarm = daemon.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and alarm.priority is Priority.MEDIUM
        # Held from station hour 1: frozen at the first poll more than 6 h after it.
        assert alarm.activated_at == T0 + held.start + 6 * 3600 + MINUTE
        assert alarm.cleared_at == T0 + held.start + held.duration  # the first new reading
        assert alarm.state is AlarmState.RTN_UNACK and not alarm.active
        raised = [a for a in seen if a.rule is Rule.FROZEN and a.active]
        assert raised and raised[0].message.endswith("unchanged for 6 h 1 min: probe fouled or signal held?")
        assert daemon.alarms.get("temp", Rule.FROZEN) is None  # a live temperature is not frozen
        assert daemon.alarms.get("ph", Rule.STALE) is None  # polled every minute: never stale
    finally:
        close(daemon)


def test_a_frozen_alarm_is_published_on_its_mqtt_alarm_topic(mosquitto: Mosquitto, tmp_path: Path) -> None:
    """Visible as stale is: the engine's condition through the alarm manager and the MQTT
    mirror to a real Mosquitto, retained on `<prefix>/<station>/alarms/<sensor>/frozen`."""
    config = build_config(
        {"station": {"id": "ps-3"}, "sensors": [{"id": "ph", "kind": "ph", "frozen_after": "1h"}]}
    )
    engine = Engine(config.rules, ManualClock(T0))
    (raised,) = [c for i in range(62) for c in engine.process(Sample("ph", T0 + 60.0 * i, 7.0))]
    link = MqttLink(mqtt_config(mosquitto.port), "ps-3", client_id="t-frozen-pub")
    link.start()
    link.wait_connected()
    clock = ManualClock(raised.time)
    manager = AlarmManager(config.alarms, Journal(tmp_path / "journal.sqlite"), clock)
    dispatcher = Dispatcher(config.alarms, clock, mirrors=[AlarmPublisher(link, "station-monitor", "ps-3")])
    dispatcher.attach(manager)
    watcher = Peer(mosquitto.port, "t-frozen-watch")
    watcher.subscribe("station-monitor/ps-3/alarms/#")

    async def scenario() -> None:
        task = asyncio.create_task(dispatcher.run())
        manager.apply(raised)
        await until(lambda: len(watcher.received()) >= 1, what="the frozen alarm's state")
        task.cancel()

    late = Peer(mosquitto.port, "t-frozen-late")
    try:
        asyncio.run(scenario())
        late.subscribe("station-monitor/ps-3/alarms/#")  # a console that connects later
        wait_until(lambda: len(late.received()) >= 1, what="the retained frozen alarm")
        topic, payload, retained = late.received()[0]
        assert topic == "station-monitor/ps-3/alarms/ph/frozen" and retained
        doc = json.loads(payload)
        assert doc["state"] == "active_unacknowledged" and doc["priority"] == "medium"
        assert doc["citation"] == "station config: frozen_after" and doc["value"] == 7.0
    finally:
        watcher.close()
        late.close()
        link.stop()
        manager.close()
