"""Alarm state across a crash, operator commands that must not be applied (retained,
or too old), and the broker's retained view after a broker restart."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.alarms.journal import Journal
from monitor.alarms.manager import AlarmManager
from monitor.alarms.mqtt import MqttCommands
from monitor.config import Alarms, build_config
from monitor.daemon import Daemon
from monitor.engine import CHECKPOINT_FILE
from monitor.model import AlarmState, Condition, ConditionState, ManualClock, Rule, Sample, iso
from monitor.sources.mqtt import MqttLink
from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer, mqtt_config
from tests.services import Mosquitto, free_port, json_or_none, wait_until

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def ph_station(state: Path) -> Any:
    return build_config(
        {
            "station": {"id": "ps-restart"},
            "state_dir": str(state),
            "sensors": [
                {"id": "outfall.ph", "kind": "ph", "limits": {"on_delay": "60s", "off_delay": "30s"}}
            ],
            "console": {"enabled": False},
        }
    )


def events(daemon: Daemon) -> list[str]:
    return [e.event for e in daemon.alarms.journal.entries() if e.sensor == "outfall.ph"]


def test_an_acknowledged_alarm_with_an_on_delay_stays_as_journaled_after_a_crash(tmp_path: Path) -> None:
    """Regression: it was journaled "cleared ... not active after restart" while pH was still
    12, then came back unacknowledged (a second activation in the KPIs)."""
    config = ph_station(tmp_path / "state")
    clock = ManualClock(T0)
    first = Daemon(config, clock)
    first.pipeline.process([Sample("outfall.ph", T0 + 10 * i, 12.0) for i in range(10)])
    first.alarms.acknowledge("outfall.ph", Rule.HIGH, "op", "dosing pump restarted")
    assert events(first) == ["activated", "acknowledged"]
    # A crash: no checkpoint, the stores and journal are what was committed.
    first.sink.close()
    first.meters.close()
    first.alarms.close()
    assert not (config.state_dir / CHECKPOINT_FILE).exists()

    again = Daemon(config, clock)
    again.pipeline.process([Sample("outfall.ph", T0 + 200 + 10 * i, 12.0) for i in range(12)])
    alarm = again.alarms.get("outfall.ph", Rule.HIGH)
    assert alarm is not None and (alarm.state, alarm.acked_by) == (AlarmState.ACKED, "op")
    assert events(again) == ["activated", "acknowledged"]  # no false clear, no second activation
    # Back inside the limit for the off-delay: the engine clears it by its own rule.
    again.pipeline.process([Sample("outfall.ph", T0 + 400 + 10 * i, 7.0) for i in range(5)])
    alarm = again.alarms.get("outfall.ph", Rule.HIGH)
    assert alarm is not None and alarm.state is AlarmState.NORMAL
    assert events(again) == ["activated", "acknowledged", "cleared"]
    again.sink.close()
    again.meters.close()
    again.alarms.close()


def test_a_retained_command_is_ignored_and_an_old_one_refused(
    mosquitto: Mosquitto, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = mqtt_config(mosquitto.port, command_users=["operator"], topic_prefix="t-retcmd")
    clock = ManualClock(T0)
    manager = AlarmManager(Alarms(), Journal(tmp_path / "journal.sqlite"), clock)
    for sensor in ("outfall.ph", "mill.ph"):
        manager.apply(Condition(T0, sensor, Rule.HIGH, ConditionState.ACTIVE, 12.0, 9.0, "§139-15 C(3)"))
    operator = Peer(mosquitto.port, "t-retcmd-op")
    topic = "t-retcmd/ps-1/commands/operator"
    shelve = {"action": "shelve", "sensor": "outfall.ph", "rule": "high", "reason": "calibration"}
    operator.publish(topic, json.dumps(shelve), retain=True)  # before the daemon's session exists
    link = MqttLink(cfg, "ps-1", client_id="t-retcmd-daemon")
    commands = MqttCommands(link, cfg.topic_prefix, "ps-1", ["operator"], manager, clock=clock, max_age=300)
    link.start()
    link.wait_connected()

    async def scenario() -> None:
        task = asyncio.create_task(commands.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while commands.retained < 1:  # the retained one arrives first: our subscription is in place
            assert loop.time() < deadline, "the retained command never arrived"
            await asyncio.sleep(0.02)
        ack = {"action": "ack", "sensor": "mill.ph", "rule": "high"}
        await asyncio.to_thread(operator.publish, topic, json.dumps({**ack, "sent": iso(T0 - 3600)}))
        await asyncio.to_thread(operator.publish, topic, json.dumps({**ack, "sent": iso(T0 - 10)}))
        while commands.accepted + commands.refused < 2 or commands.retained < 1:
            assert loop.time() < deadline, (commands.accepted, commands.refused, commands.retained)
            await asyncio.sleep(0.02)
        task.cancel()

    try:
        asyncio.run(scenario())
        outfall = manager.get("outfall.ph", Rule.HIGH)
        assert outfall is not None and outfall.state is AlarmState.UNACK  # the retained shelve: ignored
        mill = manager.get("mill.ph", Rule.HIGH)
        assert mill is not None and mill.state is AlarmState.ACKED  # the fresh one applied
        assert (commands.retained, commands.refused, commands.accepted) == (1, 1, 1)
        assert "publish commands without retain" in caplog.text
        assert "older than mqtt.command_max_age" in caplog.text
        future = {"action": "ack", "sensor": "outfall.ph", "rule": "high", "sent": iso(T0 + 86400)}
        assert commands.handle(topic, json.dumps(future).encode()) is None  # refused, not applied
        assert "in the future" in caplog.text
    finally:
        operator.publish(topic, b"", retain=True)  # clear the retained command
        operator.close()
        link.stop()
        manager.close()


@pytest.mark.parametrize("forget", [True, False], ids=["broker-loses-its-store", "broker-keeps-its-store"])
def test_after_a_broker_restart_a_late_subscriber_sees_what_the_console_shows(
    tmp_path: Path, broker: Mosquitto, forget: bool
) -> None:
    console = free_port()
    config = tmp_path / "station.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "ps-rb"},
                "state_dir": str(tmp_path / "state"),
                "sensors": [{"id": s, "kind": "ph", "limits": {"off_delay": "0s"}} for s in ("x.ph", "y.ph")],
                "mqtt": {
                    "host": "127.0.0.1",
                    "port": broker.port,
                    "client_id": "rb-station",
                    "subscriptions": [{"topic": "rb/+/ph", "sensor": "{1}.ph"}],
                },
                "console": {"host": "127.0.0.1", "port": console},
            }
        )
    )
    log = tmp_path / "daemon.log"
    base = f"http://127.0.0.1:{console}"

    def states() -> dict[str, str]:
        return {f"{a['sensor']}/{a['rule']}": a["state"] for a in json_or_none(f"{base}/api/alarms") or []}

    with running_daemon(config, log) as daemon:
        wait_until(lambda: "connected as" in log.read_text(), timeout=30, what="the daemon's MQTT session")
        field = Peer(broker.port, "rb-field")

        def both_raised() -> bool:
            """The daemon logs "connected as" before the broker has its subscription, and a
            reading published before that is not for it: pH 3 again until both alarms show
            (the same reading again changes nothing once an alarm is raised)."""
            if len(states()) == 2:
                return True
            field.publish("rb/x/ph", b"3.0")
            field.publish("rb/y/ph", b"3.0")
            return False

        wait_until(both_raised, timeout=30, what="two alarms")
        field.publish("rb/y/ph", b"7.0")  # y returns, unacknowledged
        wait_until(
            lambda: states().get("y.ph/low") == "returned_unacknowledged", timeout=20, what="y returned"
        )
        field.close()
        shown = states()
        assert shown == {"x.ph/low": "active_unacknowledged", "y.ph/low": "returned_unacknowledged"}

        # The broker is killed and restarts, with or without its persistence file.
        broker.stop(signal.SIGKILL)
        if forget:
            (broker.workdir / "mosquitto.db").unlink(missing_ok=True)
        broker.start()
        wait_until(lambda: log.read_text().count("connected again") >= 1, timeout=60, what="reconnect")

        # The daemon re-publishes its alarms after "connected again" is logged, so a subscriber
        # arriving now could get them live. The first late subscriber is the barrier: once it has
        # seen both topics (live or retained), the broker holds both; a second, later one must
        # then receive both from the broker's retained store, with the retain flag.
        topics = {"station-monitor/ps-rb/alarms/x.ph/low", "station-monitor/ps-rb/alarms/y.ph/low"}
        barrier = Peer(broker.port, "rb-barrier")
        barrier.subscribe("station-monitor/ps-rb/alarms/#")
        wait_until(
            lambda: topics <= {topic for topic, payload, _ in barrier.received() if payload},
            timeout=20,
            what=f"both alarms at the broker; got {barrier.received()}",
        )
        barrier.close()
        late = Peer(broker.port, "rb-late")
        late.subscribe("station-monitor/ps-rb/alarms/#")
        wait_until(
            lambda: topics <= {topic for topic, payload, flag in late.received() if flag and payload},
            timeout=20,
            what=f"retained alarms; got {late.received()}",
        )
        retained = {
            topic.split("/alarms/", 1)[1]: json.loads(payload)["state"]
            for topic, payload, flag in late.received()
            if flag and payload
        }
        late.close()
        assert retained == states() == shown
        daemon.stop(timeout=60)
