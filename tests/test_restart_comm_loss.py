"""A comm-loss alarm across a restart of `monitor run`, with the station simulator as the
Modbus TCP device (a process of its own) and a real Mosquitto.

The device stops answering, the daemon raises comm-loss on the sensors it feeds, and the
daemon is stopped (SIGTERM, as systemd stops it, or kill -9). The device is back when
the daemon restarts: the restarted daemon's device state starts clean, so nothing in the
Modbus source says "answering again"; the alarm the journal holds ends when the first
good reading is judged (`monitor.reconcile`), once, at that reading's time, and the
journal, the console and the MQTT events say the same.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from monitor.alarms.journal import Journal
from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port, json_or_none, port_open, simulator_process, wait_until
from tests.simulator_device import simulator_device, write_station_yaml

STATION = "ps-commrst"
PREFIX = "t-commrst"
SENSORS = ("outfall.flow", "outfall.ph")
GOOD = 0  # Quality.GOOD as the series store keeps it


def write_config(tmp_path: Path, modbus_port: int, mqtt_port: int, console_port: int) -> Path:
    config = {
        "station": {"id": STATION},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "outfall.flow", "kind": "flow", "unit": "gpm"},
            {"id": "outfall.ph", "kind": "ph"},
        ],
        "modbus": {"devices": [simulator_device(modbus_port, SENSORS, timeout="250ms", comm_loss_after=3)]},
        "mqtt": {"host": "127.0.0.1", "port": mqtt_port, "topic_prefix": PREFIX},
        "console": {"host": "127.0.0.1", "port": console_port},
    }
    return write_station_yaml(tmp_path, config)


def comm_alarms(console: int) -> dict[str, dict[str, Any]]:
    """The console's comm-loss alarms by sensor."""
    shown = json_or_none(f"http://127.0.0.1:{console}/api/alarms") or []
    return {a["sensor"]: a for a in shown if a["rule"] == "comm_loss"}


def comm_events(watcher: Peer) -> list[dict[str, Any]]:
    """Every comm-loss transition on the MQTT events topic, in order."""
    docs = [json.loads(p) for t, p, _ in watcher.received() if t == f"{PREFIX}/{STATION}/events"]
    return [d for d in docs if d["rule"] == "comm_loss"]


def journal(state: Path) -> list[tuple[str, str, float, float | None]]:
    with closing(Journal(state / "journal.sqlite")) as j:
        return [(e.sensor, e.event, e.time, e.value) for e in j.entries() if e.rule == "comm_loss"]


def first_good(state: Path, sensor: str, since: float) -> tuple[float, float]:
    """(time, value) of the first good reading of `sensor` stored at or after `since`."""
    with closing(sqlite3.connect(state / "series.sqlite")) as db:
        row = db.execute(
            "SELECT s.t, s.value FROM sample s JOIN sensor n ON n.id = s.sensor"
            " WHERE n.name = ? AND s.t >= ? AND s.quality = ? ORDER BY s.t LIMIT 1",
            (sensor, since, GOOD),
        ).fetchone()
    assert row is not None, f"no good reading of {sensor} since {since}"
    return float(row[0]), float(row[1])


@pytest.mark.parametrize("stop", ["sigterm", "kill-9"])
def test_a_comm_loss_alarm_restored_after_a_restart_clears_once_when_the_device_answers(
    tmp_path: Path, mosquitto: Mosquitto, stop: str
) -> None:
    console = free_port()
    state = tmp_path / "state"
    log = tmp_path / "daemon.log"
    watcher = Peer(mosquitto.port, f"{PREFIX}-watch-{stop}")
    watcher.subscribe(f"{PREFIX}/{STATION}/#")
    with closing(watcher):
        with simulator_process() as sim:
            port = sim.port
            config = write_config(tmp_path, port, mosquitto.port, console)
            with running_daemon(config, log) as daemon:
                wait_until(lambda: port_open(console), timeout=60, what="console")
                sim.proc.terminate()  # the device stops answering (its port closed)
                sim.proc.wait(timeout=10)
                wait_until(lambda: set(comm_alarms(console)) == set(SENSORS), timeout=30, what="comm-loss")
                wait_until(lambda: len(comm_events(watcher)) == 2, timeout=30, what="comm-loss on MQTT")
                if stop == "sigterm":
                    daemon.stop(timeout=30)
                else:
                    daemon.proc.send_signal(signal.SIGKILL)
                    daemon.proc.wait(timeout=10)
        raised = journal(state)
        assert [(s, e) for s, e, _, _ in raised] == [(s, "activated") for s in SENSORS]
        activated = {s: t for s, _, t, _ in raised}

        back = time.time()
        with simulator_process(port=port), running_daemon(config, log):  # the device is back at its address
            wait_until(lambda: len(comm_events(watcher)) == 4, timeout=60, what="the clears on MQTT")
            shown = comm_alarms(console)
            seen = time.time()
        retained = {t: p for t, p, _ in watcher.received() if "/alarms/" in t}  # the last of each
    events = journal(state)
    # Once: one activation and one clear per sensor, no second activation after the restart.
    assert sorted((s, e) for s, e, _, _ in events) == sorted(
        [(s, "activated") for s in SENSORS] + [(s, "cleared") for s in SENSORS]
    )
    on_mqtt = comm_events(watcher)
    assert [(d["sensor"], d["active"]) for d in on_mqtt[:2]] == [(s, True) for s in SENSORS]
    for sensor in SENSORS:
        [(_, _, cleared, value)] = [e for e in events if e[0] == sensor and e[1] == "cleared"]
        # At the right time: when the restarted daemon judged the device's first good
        # reading (the later of its stamp and the daemon's clock), after the restart and
        # the raise, never at a time from before either.
        reading, reading_value = first_good(state, sensor, back)
        assert activated[sensor] < back <= reading <= cleared < seen
        assert cleared - reading < 5.0, (cleared, reading)
        assert value == reading_value  # the reading that ended it
        # The console and MQTT (events and the retained state) say what the journal says.
        alarm = shown[sensor]
        assert alarm["state"] == "returned_unacknowledged" and not alarm["active"]
        assert to_epoch(alarm["activated_at"]) == pytest.approx(activated[sensor], abs=1e-3)
        assert to_epoch(alarm["cleared_at"]) == pytest.approx(cleared, abs=1e-3)
        [raise_doc] = [d for d in on_mqtt if d["sensor"] == sensor and d["active"]]
        [clear_doc] = [d for d in on_mqtt if d["sensor"] == sensor and not d["active"]]
        # (MQTT writes milliseconds, `...578Z`; the console's API `...578000Z`: compared as times.)
        assert to_epoch(raise_doc["activated_at"]) == to_epoch(clear_doc["activated_at"])
        assert to_epoch(clear_doc["activated_at"]) == pytest.approx(activated[sensor], abs=1e-3)
        assert to_epoch(clear_doc["cleared_at"]) == pytest.approx(cleared, abs=1e-3)
        last = json.loads(retained[f"{PREFIX}/{STATION}/alarms/{sensor}/comm_loss"])
        assert last["state"] == alarm["state"] and last["cleared_at"] == clear_doc["cleared_at"]


def to_epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()
