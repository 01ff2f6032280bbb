"""`monitor fleet` against three real `monitor run` daemons on one real Mosquitto with
the shipped per-station ACL: every station and its alarms, a gateway killed with
SIGKILL going offline from its last will, and acknowledgements the ACL decides."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_process import DaemonProcess, running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
STATIONS = ("ps-1", "ps-2", "ps-3")
KEEPALIVE = 2.0
USERS = {"station-monitor": "daemon-pw", "field": "field-pw", "op-north": "north-pw", "op-south": "south-pw"}
ENV = {**os.environ, "T_MQTT_PW": "daemon-pw", "T_TOKEN": "console-token-0123456789"}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def post_json(url: str, doc: object) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, json.dumps(doc).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """Not conftest's `broker`: this one has the per-station users and the ACL of
    deploy/mosquitto, which the test proves a station cannot cross."""
    acl = (ROOT / "deploy" / "mosquitto" / "acl.per-station").read_text()
    server = Mosquitto(tmp_path / "mosquitto", users=USERS, acl=acl)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def station_config(tmp_path: Path, sid: str, port: int) -> tuple[Path, int]:
    console = free_port()
    config = {
        "station": {"id": sid},
        "state_dir": str(tmp_path / sid),
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "mqtt": {
            "host": "127.0.0.1",
            "port": port,
            "username": "station-monitor",
            "password": "${T_MQTT_PW}",
            "client_id": f"station-monitor-{sid}",
            "keepalive": f"{KEEPALIVE:g}s",
            "subscriptions": [{"topic": f"plant/{sid}/ph", "sensor": "outfall.ph"}],
            "command_users": ["op-north", "op-south"],
        },
        "console": {"host": "127.0.0.1", "port": console, "token": "${T_TOKEN}"},
    }
    path = tmp_path / f"{sid}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, console


def fleet_config(tmp_path: Path, port: int, consoles: dict[str, int]) -> Path:
    config = {
        "mqtt": {"host": "127.0.0.1", "port": port, "username": "op-south", "password": "${T_FLEET_PW}"},
        "fleet": {
            "port": free_port(),
            "command_timeout": "3s",
            "consoles": {sid: f"http://127.0.0.1:{p}/" for sid, p in consoles.items()},
        },
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_three_stations_kill_and_acknowledge_through_the_acl(tmp_path: Path, broker: Mosquitto) -> None:
    procs: dict[str, DaemonProcess] = {}
    consoles: dict[str, int] = {}
    env = {**ENV, "T_FLEET_PW": "south-pw"}
    with closing(Peer(broker.port, "t-field", "field", "field-pw")) as field, ExitStack() as stack:
        for sid in STATIONS:
            path, consoles[sid] = station_config(tmp_path, sid, broker.port)
            procs[sid] = stack.enter_context(running_daemon(path, tmp_path / f"{sid}.log", env=env, grace=15))
        cfg = fleet_config(tmp_path, broker.port, consoles)
        # the fleet page starts with the stations (its start-up overlaps theirs); it is first
        # asked for anything once the stations are up and `fleet status` has run
        stack.enter_context(
            running_daemon(cfg, tmp_path / "fleet.log", command=["fleet", "serve"], env=env, grace=15)
        )
        for sid in STATIONS:
            wait_until(functools.partial(_ready, consoles[sid]), timeout=60, what=f"{sid} console")
        # pH 12.5 at ps-2 and pH 3 at ps-3 (both out of §139-15 C(3)); ps-1 is fine
        for sid, ph in (("ps-1", "7.1"), ("ps-2", "12.5"), ("ps-3", "3.0")):
            field.publish(f"plant/{sid}/ph", ph)
        for sid in ("ps-2", "ps-3"):
            wait_until(functools.partial(_has_alarm, consoles[sid]), timeout=30, what=f"{sid} pH alarm")

        # `monitor fleet status` (the contract): all three with their alarms after listening 2 s
        out = subprocess.run(
            [sys.executable, "-m", "monitor", "fleet", "status", "--config", str(cfg), "--format", "json"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        by_id = {s["id"]: s for s in doc["stations"]}
        assert sorted(by_id) == list(STATIONS) and all(s["online"] for s in by_id.values())
        assert by_id["ps-1"]["alarms"] == []
        ((a2,),) = [by_id["ps-2"]["alarms"]]
        assert (a2["sensor"], a2["rule"], a2["state"], a2["priority"]) == (
            "outfall.ph", "high", "active_unacknowledged", "high",
        )  # fmt: skip
        assert [a["rule"] for a in by_id["ps-3"]["alarms"]] == ["low"]
        assert by_id["ps-2"]["console"] == f"http://127.0.0.1:{consoles['ps-2']}/"
        assert all(s["last_seen"].endswith("Z") for s in doc["stations"])

        base = f"http://127.0.0.1:{yaml.safe_load(cfg.read_text())['fleet']['port']}/"
        wait_until(lambda: _ready_fleet(base), timeout=30, what="fleet page")
        with urllib.request.urlopen(base, timeout=5) as page:
            assert page.headers["X-Frame-Options"] == "DENY" and b"Pumping stations" in page.read()

        # a page reached under a name it is not served as (DNS rebinding) gets nothing
        req = urllib.request.Request(base + "api/stations", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        refused.value.close()
        assert refused.value.code == 421
        # a form post (no CORS preflight from a browser) is not an acknowledgement
        req = urllib.request.Request(base + "api/ack", b"{}", {"Content-Type": "text/plain"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        refused.value.close()
        assert refused.value.code == 415
        status, reply = post_json(base + "api/ack", {"station": "ps-2", "x": "y" * 5000})
        assert status == 413

        # acknowledgements: op-south may not command ps-2 (the broker's ACL says so) ...
        ack = {"station": "ps-2", "sensor": "outfall.ph", "rule": "high", "note": "on my way"}
        status, reply = post_json(base + "api/ack", {**ack, "user": "op-south", "password": "south-pw"})
        assert status in (403, 504) and not reply["ok"], reply
        print(f"op-south acknowledging ps-2: {status} {reply['detail']}")
        assert _alarm_now(consoles["ps-2"])["state"] == "active_unacknowledged"
        # ... a wrong password is refused by the broker ...
        status, reply = post_json(base + "api/ack", {**ack, "user": "op-north", "password": "guess"})
        assert status == 403 and reply["status"] == "not_authorized", reply
        # ... op-north may, and ps-2 journals op-north's name
        status, reply = post_json(base + "api/ack", {**ack, "user": "op-north", "password": "north-pw"})
        assert status == 200 and reply["ok"], reply
        acked = _alarm_now(consoles["ps-2"])
        assert (acked["state"], acked["acked_by"], acked["ack_note"]) == (
            "active_acknowledged", "op-north", "on my way",
        )  # fmt: skip
        wait_until(
            lambda: _fleet_alarm(base, "ps-2")["state"] == "active_acknowledged", timeout=10, what="fleet ack"
        )
        assert "north-pw" not in (tmp_path / "fleet.log").read_text()

        # a gateway dies: the broker publishes its last will within 1.5 x keepalive
        procs["ps-3"].proc.send_signal(signal.SIGKILL)
        procs["ps-3"].proc.wait(timeout=10)
        killed = time.monotonic()
        wait_until(
            lambda: not _station(base, "ps-3")["online"], timeout=1.5 * KEEPALIVE + 30, what="ps-3 offline"
        )
        print(
            f"ps-3 shown offline {time.monotonic() - killed:.1f} s after SIGKILL (keepalive {KEEPALIVE:g} s)"
        )
        ps3 = _station(base, "ps-3")
        assert [(a["rule"], a["stale"]) for a in ps3["alarms"]] == [("low", True)]  # stale, not cleared
        assert _station(base, "ps-1")["online"] and _station(base, "ps-2")["online"]

        # a gateway that hangs (socket open, nothing sent: a dead network looks the same) goes
        # offline when the broker's keepalive check gives up, and comes back by itself
        procs["ps-1"].proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_until(
                lambda: not _station(base, "ps-1")["online"],
                timeout=1.5 * KEEPALIVE + 30,
                what="ps-1 offline",
            )
            print(f"ps-1 shown offline {time.monotonic() - stopped:.1f} s after it hung")
            assert time.monotonic() - stopped >= 0.5 * KEEPALIVE  # the will, not a clean disconnect
        finally:
            procs["ps-1"].proc.send_signal(signal.SIGCONT)
        wait_until(lambda: _station(base, "ps-1")["online"], timeout=30, what="ps-1 online again")


def _ready(port: int) -> bool:
    try:
        return get_json(f"http://127.0.0.1:{port}/healthz") is not None
    except (OSError, ValueError):
        return False


def _ready_fleet(base: str) -> bool:
    try:
        return len(get_json(base + "api/stations")["stations"]) == 3
    except (OSError, ValueError):
        return False


def _alarm(port: int) -> dict[str, Any] | None:
    alarms = get_json(f"http://127.0.0.1:{port}/api/alarms")
    active = [a for a in alarms if a["sensor"] == "outfall.ph" and a["state"] != "normal"]
    return active[0] if active else None


def _has_alarm(port: int) -> bool:
    return _alarm(port) is not None


def _alarm_now(port: int) -> dict[str, Any]:
    alarm = _alarm(port)
    assert alarm is not None
    return alarm


def _station(base: str, sid: str) -> dict[str, Any]:
    (station,) = [s for s in get_json(base + "api/stations")["stations"] if s["id"] == sid]
    assert isinstance(station, dict)
    return station


def _fleet_alarm(base: str, sid: str) -> dict[str, Any]:
    alarm: dict[str, Any] = _station(base, sid)["alarms"][0]
    return alarm
