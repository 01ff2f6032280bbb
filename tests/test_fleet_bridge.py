"""Utility scale on existing engines: two gateways, each with its own Mosquitto bridged
(the shipped `deploy/mosquitto/bridge.conf`) to a central Mosquitto, and each writing its
series to a central VictoriaMetrics through its outbox. The link of one gateway is cut
(a TCP relay between its bridge and the centre is killed) while the central database is
down too: nothing is lost, and the fleet view on the central broker recovers by itself."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, VictoriaMetrics, free_port, port_open, wait_until

ROOT = Path(__file__).resolve().parent.parent
STATIONS = ("ps-1", "ps-2")
ENV = {**os.environ, "T_TOKEN": "bridge-test-token-0123"}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


class Relay:
    """socat between a gateway's bridge and the central broker: the WAN link, cut at will."""

    def __init__(self, target: int) -> None:
        self.port = free_port()
        self.target = target
        self.proc: subprocess.Popen[bytes] | None = None

    def up(self) -> None:
        self.proc = subprocess.Popen(
            [
                "socat",
                f"TCP-LISTEN:{self.port},fork,reuseaddr,bind=127.0.0.1",
                f"TCP:127.0.0.1:{self.target}",
            ],
            start_new_session=True,
        )
        wait_until(lambda: port_open(self.port), timeout=10, what="relay listening")

    def cut(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the relay and every forked connection
            self.proc.wait(timeout=10)
            self.proc = None


def bridge_conf(sid: str, relay: Relay) -> str:
    """The shipped bridge config, pointed at the relay (no TLS or password in this test)."""
    text = (ROOT / "deploy" / "mosquitto" / "bridge.conf").read_text().replace("ps-1", sid)
    text = text.replace("central.example:8883", f"127.0.0.1:{relay.port}")
    text = re.sub(r"^(bridge_cafile|remote_username|remote_password) .*$", "", text, flags=re.MULTILINE)
    text = re.sub(r"^keepalive_interval .*$", "keepalive_interval 5", text, flags=re.MULTILINE)
    return re.sub(r"^restart_timeout .*$", "restart_timeout 1", text, flags=re.MULTILINE)


@pytest.fixture
def central(tmp_path: Path) -> Iterator[tuple[Mosquitto, VictoriaMetrics]]:
    broker, victoria = Mosquitto(tmp_path / "central"), VictoriaMetrics(tmp_path / "vm")
    broker.start()
    victoria.start()
    try:
        yield broker, victoria
    finally:
        victoria.stop()
        broker.stop()


def station_config(tmp_path: Path, sid: str, mqtt_port: int, vm_url: str) -> tuple[Path, int]:
    console = free_port()
    config = {
        "station": {"id": sid},
        "state_dir": str(tmp_path / sid / "state"),
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "mqtt": {
            "host": "127.0.0.1",
            "port": mqtt_port,
            "client_id": f"station-monitor-{sid}",
            "subscriptions": [
                {"topic": f"plant/{sid}/ph", "sensor": "outfall.ph", "format": "json", "time_path": "ts"}
            ],
        },
        "influx": {
            "url": vm_url,
            "org": "o",
            "bucket": "b",
            "token": "${T_TOKEN}",
            "flush_interval": "200ms",
        },
        "console": {"host": "127.0.0.1", "port": console, "token": "${T_TOKEN}"},
    }
    path = tmp_path / f"{sid}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, console


def test_a_cut_bridge_loses_nothing_and_the_fleet_recovers(
    tmp_path: Path, central: tuple[Mosquitto, VictoriaMetrics]
) -> None:
    broker, victoria = central
    relays = {sid: Relay(broker.port) for sid in STATIONS}
    locals_: dict[str, Mosquitto] = {}
    # undone in reverse: the peers, the fleet view, then each station's daemon, broker and relay
    with ExitStack() as stack:
        consoles: dict[str, int] = {}
        for sid in STATIONS:
            stack.callback(relays[sid].cut)  # also a relay that comes up again mid-test
            relays[sid].up()
            (tmp_path / sid).mkdir()
            local = Mosquitto(tmp_path / sid / "mosquitto", extra=bridge_conf(sid, relays[sid]))
            local.start()
            stack.callback(local.stop)
            locals_[sid] = local
            path, consoles[sid] = station_config(tmp_path, sid, local.port, victoria.url)
            stack.enter_context(running_daemon(path, tmp_path / f"{sid}.log", env=ENV, grace=15))
        fleet_cfg = tmp_path / "fleet.yaml"
        fleet_port = free_port()
        fleet_cfg.write_text(yaml.safe_dump({"mqtt": {"port": broker.port}, "fleet": {"port": fleet_port}}))
        stack.enter_context(
            running_daemon(fleet_cfg, tmp_path / "fleet.log", command=["fleet"], env=ENV, grace=15)
        )
        fleet = f"http://127.0.0.1:{fleet_port}/api/stations"

        def station(sid: str) -> dict[str, Any]:
            for s in get_json(fleet)["stations"]:
                if s["id"] == sid:
                    return dict(s)
            return {"online": False, "alarms": []}

        def both_online() -> bool:
            try:
                return all(station(s)["online"] for s in STATIONS)
            except OSError:
                return False

        wait_until(both_online, timeout=60, what="both stations online on the central broker")
        watcher = stack.enter_context(closing(Peer(broker.port, "t-central-events")))
        watcher.subscribe("station-monitor/+/events")
        fields = {
            sid: stack.enter_context(closing(Peer(locals_[sid].port, f"t-field-{sid}"))) for sid in STATIONS
        }
        sent = {sid: 0 for sid in STATIONS}
        t0 = time.time() - 250

        def publish(sid: str, ph: float) -> None:
            doc = {"value": ph, "ts": t0 + sent[sid]}
            fields[sid].publish(f"plant/{sid}/ph", json.dumps(doc))
            sent[sid] += 1

        for _ in range(20):
            for sid in STATIONS:
                publish(sid, 7.0)
        publish("ps-1", 12.5)  # §139-15 C(3): an alarm at ps-1
        wait_until(lambda: len(station("ps-1")["alarms"]) == 1, timeout=30, what="ps-1 alarm at the centre")

        # The WAN link of ps-1 and the central database go down together.
        relays["ps-1"].cut()
        victoria.stop()
        wait_until(lambda: not station("ps-1")["online"], timeout=30, what="ps-1 offline (bridge down)")
        assert station("ps-1")["alarms"][0]["stale"] is True and station("ps-2")["online"]
        for _ in range(100):  # pH back to normal: the alarm returns, unacknowledged, behind the cut
            publish("ps-1", 7.2)
            publish("ps-2", 7.2)
        wait_until(
            lambda: (
                get_json(f"http://127.0.0.1:{consoles['ps-1']}/api/alarms")[0]["state"]
                == "returned_unacknowledged"
            ),
            timeout=30,
            what="ps-1 alarm returned at the station",
        )

        relays["ps-1"].up()
        victoria.start()
        wait_until(lambda: station("ps-1")["online"], timeout=60, what="ps-1 online again at the centre")
        wait_until(
            lambda: [a["state"] for a in station("ps-1")["alarms"]] == ["returned_unacknowledged"],
            timeout=30,
            what="the centre sees the alarm as the station does",
        )
        assert station("ps-1")["alarms"][0]["stale"] is False
        states = [json.loads(p)["state"] for t, p, _ in watcher.received() if "/ps-1/" in t]
        assert states == ["active_unacknowledged", "returned_unacknowledged"][-len(states) :]
        assert "returned_unacknowledged" in states  # the event made behind the cut arrived

        def stored(sid: str) -> int:
            series = victoria.export(f'{{__name__="sensor_value",station="{sid}",sensor="outfall.ph"}}')
            return sum(len(s["values"]) for s in series)

        def all_stored(sid: str) -> bool:
            return stored(sid) == sent[sid]

        for sid in STATIONS:
            wait_until(functools.partial(all_stored, sid), timeout=60, what=f"every {sid} reading centrally")
        print(f"readings stored centrally: {[stored(s) for s in STATIONS]}, sent {sent}")
