"""`monitor run` with a callout, as a separate process: SIGKILL between escalation steps
and each step still sent exactly once after the restart; the dead-man heartbeat pinging a
local HTTP server while the daemon is ready and stopping once a device is down."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess, running_daemon
from tests.mqtt_tools import make_ca
from tests.services import free_port, http, port_open, wait_until
from tests.simulator_device import simulator_device, write_station_yaml
from tests.smtp import MailServer

ROOT = Path(__file__).resolve().parent.parent
PEOPLE = {"alice": "alice@example.org", "bob": "bob@example.org", "carol": "carol@example.org"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def smtp(certs: dict[str, Path]) -> Iterator[MailServer]:
    with MailServer(users={"monitor": "mail-pw"}, certs=certs) as server:
        yield server


class Simulator:
    """The station's Modbus simulator as its own process, stoppable mid-test (a device dying)."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simulators.modbus_server", "--port", str(self.port), *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: port_open(self.port), timeout=20, what="simulator")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def ph_excursion() -> Iterator[Simulator]:
    sim = Simulator("--scenario", "ph_excursion@0s+2h:value=3,ramp=1")
    yield sim
    sim.stop()


def write_config(tmp_path: Path, modbus_port: int, console_port: int, notify: dict[str, Any]) -> Path:
    config = {
        "station": {"id": "ps-callout", "name": "Callout PS", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "modbus": {"devices": [simulator_device(modbus_port, ("outfall.ph",), timeout="500ms")]},
        "console": {"host": "127.0.0.1", "port": console_port},
        "notify": notify,
    }
    return write_station_yaml(tmp_path, config)


def daemon_with_secrets(config: Path, log: Path, ca: Path) -> AbstractContextManager[DaemonProcess]:
    env = {"SMTP_PASSWORD": "mail-pw", "LINK_SECRET": "s3cret-link-key", "SMTP_CA": str(ca)}
    return running_daemon(config, log, env=env)


def callout_state(console_port: int) -> dict[str, Any]:
    status, body = http("GET", f"http://127.0.0.1:{console_port}/api/callout")
    assert status == 200, body
    state: dict[str, Any] = json.loads(body)
    return state


def test_sigkill_between_escalation_steps_then_each_step_is_sent_exactly_once(
    tmp_path: Path, smtp: MailServer, ph_excursion: Simulator, certs: dict[str, Path]
) -> None:
    notify = {
        "channels": {
            "mail": {
                "type": "email",
                "host": "127.0.0.1",
                "port": smtp.port,
                "username": "monitor",
                "password": "${SMTP_PASSWORD}",
                "ca_file": str(certs["ca"]),
                "sender": "monitor@ps-callout.example",
            }
        },
        "people": {p: {"name": p.title(), "contacts": {"mail": a}} for p, a in PEOPLE.items()},
        "rosters": {"night": list(PEOPLE)},
        "pipelines": [{"name": "ph", "roster": "night", "delay": "2s", "match": {"sensors": ["outfall.*"]}}],
        "link_base": "https://gateway.example",
        "link_secret": "${LINK_SECRET}",
    }
    console_port = free_port()
    config = write_config(tmp_path, ph_excursion.port, console_port, notify)
    log = tmp_path / "daemon.log"
    with daemon_with_secrets(config, log, certs["ca"]) as daemon:
        smtp.wait_for(PEOPLE["alice"], timeout=60)
        # Between the steps means after the daemon has recorded alice's as sent: the server
        # has her mail before the client's QUIT and the commit, and a kill in that window
        # rightly sends it again (at least once). The log line follows the commit.
        wait_until(
            lambda: "step 0: alice told by mail" in log.read_text(),
            timeout=30,
            what=f"the daemon to record alice's step; log:\n{log.read_text()}",
        )
        daemon.proc.send_signal(signal.SIGKILL)  # bob's step is 2 s away
        daemon.proc.wait(timeout=10)
        assert smtp.to(PEOPLE["bob"]) == [], "the kill came too late to fall between the steps"
    with daemon_with_secrets(config, log, certs["ca"]):
        smtp.wait_for(PEOPLE["carol"], timeout=60)
        wait_until(lambda: port_open(console_port), timeout=30, what="console")

        def finished() -> bool:
            escs = callout_state(console_port)["escalations"]
            return len(escs) == 1 and escs[0]["status"] == "done"

        wait_until(finished, timeout=20, what=f"the escalation to finish; log:\n{log.read_text()}")
        [esc] = callout_state(console_port)["escalations"]
        assert [(t["step"], t["person"], t["state"]) for t in esc["told"]] == [
            (0, "alice", "sent"),
            (1, "bob", "sent"),
            (2, "carol", "sent"),
        ]
        for address in PEOPLE.values():
            assert len(smtp.to(address)) == 1, (address, log.read_text())
        assert "low" in smtp.to(PEOPLE["carol"])[0].subject


class Pings:
    """A healthchecks.io stand-in: counts GETs on a free loopback port."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer.lock:
                    outer.count += 1
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ping/0e5e-station"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def received(self) -> int:
        with self.lock:
            return self.count

    def __enter__(self) -> Pings:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_heartbeat_pings_while_ready_and_stops_when_a_device_is_down(
    tmp_path: Path, certs: dict[str, Path]
) -> None:
    console_port = free_port()
    with Simulator() as sim, Pings() as pings:
        notify = {"heartbeat": {"url": pings.url, "interval": "200ms", "timeout": "2s"}}
        config = write_config(tmp_path, sim.port, console_port, notify)
        log = tmp_path / "daemon.log"
        with daemon_with_secrets(config, log, certs["ca"]):
            wait_until(lambda: pings.received() >= 3, timeout=60, what=f"3 pings; log:\n{log.read_text()}")
            sim.stop()  # the only device dies
            base = f"http://127.0.0.1:{console_port}"
            wait_until(lambda: http("GET", f"{base}/readyz")[0] == 503, timeout=60, what="not ready")

            def withheld(n: int) -> bool:
                return int(callout_state(console_port)["heartbeat"]["withheld"]) >= n

            wait_until(lambda: withheld(3), timeout=30, what="the heartbeat withheld 3 times")
            beat = callout_state(console_port)["heartbeat"]
            assert beat["state"] == "withheld"
            assert pings.received() == beat["sent"]  # every ping sent arrived, and none since
            seen = pings.received()
            wait_until(lambda: withheld(int(beat["withheld"]) + 3), timeout=30, what="3 more intervals")
            assert pings.received() == seen
