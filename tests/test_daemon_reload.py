"""`monitor run` as a separate process: SIGHUP reloads a valid config and refuses an
invalid one, `--log-json` writes one JSON object per line, and failures that last
(device, broker and database all down) are logged once, not on every retry."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_process import DaemonProcess, running_daemon
from tests.services import free_port, simulator_process, wait_until

ROOT = Path(__file__).resolve().parent.parent
STATION = "ps-reload"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def try_json(url: str) -> Any:
    """None while the console is down (it restarts on a reload)."""
    try:
        return get_json(url)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.fixture
def simulator() -> Iterator[int]:
    with simulator_process() as sim:
        yield sim.port


def station(
    state: Path, modbus_port: int, console_port: int, ph: dict[str, Any], temp: bool
) -> dict[str, Any]:
    sensors: list[dict[str, Any]] = [{"id": "outfall.ph", "kind": "ph", "limits": ph}]
    fields = [{"sensor": "outfall.ph", "register": "holding", "address": 2, "type": "FLOAT32"}]
    if temp:
        sensors.append({"id": "outfall.temp", "kind": "temperature", "unit": "degC"})
        fields.append({"sensor": "outfall.temp", "register": "holding", "address": 4, "type": "FLOAT32"})
    return {
        "station": {"id": STATION},
        "state_dir": str(state),
        "sensors": sensors,
        "modbus": {
            "devices": [
                {
                    "name": "sim",
                    "host": "127.0.0.1",
                    "port": modbus_port,
                    "poll_interval": "200ms",
                    "fields": fields,
                }
            ]
        },
        "console": {"host": "127.0.0.1", "port": console_port},
    }


def json_daemon(
    config: Path, log: Path, env: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[DaemonProcess]:
    """`monitor --log-json run`: these tests read its log back as JSON lines."""
    return running_daemon(config, log, env=env, options=["--log-json"])


def log_records(log: Path) -> list[dict[str, Any]]:
    """Every line of the log as JSON; fails on any line that is not one JSON object."""
    records = []
    for n, line in enumerate(log.read_text().splitlines(), 1):
        record = json.loads(line)
        assert isinstance(record, dict), f"line {n} is not a JSON object: {line}"
        assert {"time", "level", "logger", "message"} <= record.keys(), line
        records.append(record)
    return records


def test_sighup_takes_a_valid_config_and_refuses_an_invalid_one(tmp_path: Path, simulator: int) -> None:
    console_port = free_port()
    base = f"http://127.0.0.1:{console_port}"
    config = tmp_path / "station.yaml"
    state = tmp_path / "state"
    config.write_text(yaml.safe_dump(station(state, simulator, console_port, {}, temp=False)))
    log = tmp_path / "daemon.log"
    # A real datagram socket where systemd would listen: the reload must say
    # RELOADING=1 then READY=1, never STOPPING=1 (systemd would kill the service).
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.setblocking(False)
    with notify, json_daemon(config, log, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}) as daemon:

        def ph_time() -> str | None:
            sensors = try_json(f"{base}/api/sensors") or []
            return next(
                (s["time"] for s in sensors if s["id"] == "outfall.ph" and s["value"] is not None), None
            )

        wait_until(lambda: ph_time() is not None, timeout=90, what=f"a pH reading; log:\n{log.read_text()}")
        assert not get_json(f"{base}/api/alarms")  # pH ~7.2 is inside 5.0..9.0

        # An invalid config is refused with the problem named; the old one keeps running.
        broken = station(state, simulator, console_port, {"deadband": -1}, temp=True)
        config.write_text(yaml.safe_dump(broken))
        daemon.proc.send_signal(signal.SIGHUP)

        def refused() -> dict[str, Any] | None:
            return next(
                (r for r in log_records(log) if "reload" in r["message"] and "refused" in r["message"]), None
            )

        wait_until(lambda: refused() is not None, timeout=20, what=f"the refusal; log:\n{log.read_text()}")
        record = refused()
        assert record is not None
        assert record["level"] == "ERROR"
        assert "sensors[0].limits.deadband" in record["message"] and str(config) in record["message"]
        assert daemon.proc.poll() is None
        before = ph_time()
        wait_until(lambda: ph_time() != before, timeout=10, what="polling to go on after the refusal")
        assert [s["id"] for s in get_json(f"{base}/api/sensors")] == ["outfall.ph"]
        assert get_json(f"{base}/healthz")["status"] == "ok"

        # A key written twice, or a limit that can never be crossed, is refused the same way
        # (issue 12: YAML would keep the second `sensors:` block silently; NaN never alarms).
        valid = yaml.safe_dump(station(state, simulator, console_port, {}, temp=False))
        config.write_text(valid + "sensors: []\n")
        daemon.proc.send_signal(signal.SIGHUP)

        def refusals() -> list[str]:
            return [
                r["message"]
                for r in log_records(log)
                if "reload" in r["message"] and "refused" in r["message"]
            ]

        wait_until(lambda: len(refusals()) == 2, timeout=20, what=f"the refusal; log:\n{log.read_text()}")
        assert "sensors: duplicate key on line" in refusals()[1]
        config.write_text(
            yaml.safe_dump(station(state, simulator, console_port, {"high": math.nan}, temp=False))
        )
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(refusals()) == 3, timeout=20, what=f"the refusal; log:\n{log.read_text()}")
        assert "sensors[0].limits.high: must be a finite number" in refusals()[2]
        assert daemon.proc.poll() is None

        # A valid changed config is taken: a new sensor, and a pH limit that the
        # simulator's ~7.2 now breaches, judged by the reloaded rules.
        config.write_text(yaml.safe_dump(station(state, simulator, console_port, {"high": 6.5}, temp=True)))
        daemon.proc.send_signal(signal.SIGHUP)

        def ph_high_alarm() -> dict[str, Any] | None:
            alarms = try_json(f"{base}/api/alarms") or []
            return next((a for a in alarms if a["sensor"] == "outfall.ph" and a["rule"] == "high"), None)

        wait_until(
            lambda: ph_high_alarm() is not None, timeout=30, what=f"the new limit; log:\n{log.read_text()}"
        )
        alarm = ph_high_alarm()
        assert alarm is not None and alarm["limit"] == 6.5 and alarm["active"]
        sensors = {s["id"]: s for s in get_json(f"{base}/api/sensors")}
        assert set(sensors) == {"outfall.ph", "outfall.temp"}
        wait_until(
            lambda: any(
                s["id"] == "outfall.temp" and s["value"] is not None for s in try_json(f"{base}/api/sensors")
            ),
            timeout=10,
            what="a reading of the new sensor",
        )
        assert daemon.proc.poll() is None
        daemon.stop(timeout=30)
        told = []
        with contextlib.suppress(BlockingIOError):
            while True:
                told.append(notify.recv(1000).decode().split("\n")[0])
    assert told == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    messages = [r["message"] for r in log_records(log)]
    assert sum("reloading" in m for m in messages) == 1, messages
    assert sum(m.startswith(f"station {STATION} running") for m in messages) == 2, messages


def test_lasting_failures_are_logged_once_not_on_every_retry(tmp_path: Path) -> None:
    """A dead device, an unreachable broker and a database that is down, all at once:
    each says so once (ERROR), however often it is retried."""
    dead = [free_port() for _ in range(3)]  # nothing listens on these
    console_port = free_port()
    base = f"http://127.0.0.1:{console_port}"
    config = tmp_path / "station.yaml"
    doc = station(tmp_path / "state", dead[0], console_port, {}, temp=False)
    # Retried often (a poll each 100 ms, the database again after 200 ms at most), so
    # ten failed polls and three failed writes come within a second or two.
    doc["modbus"]["devices"][0].update(timeout="200ms", comm_loss_after=2, poll_interval="100ms")
    doc["mqtt"] = {"host": "127.0.0.1", "port": dead[1], "topic_prefix": "station-monitor"}
    doc["influx"] = {
        "url": f"http://127.0.0.1:{dead[2]}",
        "org": "o",
        "bucket": "b",
        "token": "${RELOAD_TOKEN}",
        "flush_interval": "100ms",
        "max_backoff": "200ms",
    }
    config.write_text(yaml.safe_dump(doc))
    log = tmp_path / "daemon.log"
    with json_daemon(config, log, env={"RELOAD_TOKEN": "do-not-log-me-0123456"}) as daemon:

        def health() -> dict[str, Any]:
            return try_json(f"{base}/api/health") or {}

        def retried() -> bool:
            h = health()
            sources = {s["source"]: s for s in h.get("sources", [])}
            modbus = sources.get("modbus", {})
            failures = int(h.get("outbox", {}).get("failures", 0))
            return int(modbus.get("failed_in_row", 0)) >= 10 and failures >= 3

        wait_until(retried, timeout=90, what=f"repeated failures; log:\n{log.read_text()}")
        daemon.stop(timeout=30)
    records = log_records(log)
    assert "do-not-log-me" not in log.read_text()
    errors = Counter(r["logger"] for r in records if r["level"] == "ERROR")
    assert errors == {"monitor.sources.modbus": 1, "monitor.sources.mqtt": 1, "monitor.sinks.drain": 1}, (
        records
    )
    # Besides the errors: start-up, the comm-loss alarm, shutdown; not a line per retry.
    assert len(records) < 20, records


def test_a_taken_console_port_is_one_clear_error_in_json(tmp_path: Path) -> None:
    """uvicorn's own log lines go through our JSON handler too, and a console that
    cannot listen ends the daemon with exit 1 and a line that says so (no traceback)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "station.yaml"
        doc = {
            "station": {"id": STATION},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "outfall.ph", "kind": "ph"}],
            "console": {"host": "127.0.0.1", "port": port},
        }
        config.write_text(yaml.safe_dump(doc))
        done = subprocess.run(
            [sys.executable, "-m", "monitor", "--log-json", "run", "--config", str(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    log = tmp_path / "daemon.log"
    log.write_text(done.stderr)
    records = log_records(log)
    assert not any("Traceback" in r["message"] or "exception" in r for r in records), done.stderr
    errors = [r for r in records if r["level"] == "ERROR"]
    assert any(r["logger"] == "uvicorn.error" and "address already in use" in r["message"] for r in errors)
    last = errors[-1]["message"]
    assert last.startswith(f"station {STATION} cannot run: the console cannot listen on 127.0.0.1:{port}")


def test_sigterm_right_after_sighup_stops_cleanly(tmp_path: Path, simulator: int) -> None:
    """A stop that arrives while a reload is under way ends the process cleanly (exit 0)
    instead of counting as a second stop request (an immediate exit 1)."""
    console_port = free_port()
    config = tmp_path / "station.yaml"
    config.write_text(yaml.safe_dump(station(tmp_path / "state", simulator, console_port, {}, temp=False)))
    log = tmp_path / "daemon.log"
    with json_daemon(config, log) as daemon:
        wait_until(lambda: try_json(f"http://127.0.0.1:{console_port}/healthz") is not None, timeout=90)
        config.write_text(yaml.safe_dump(station(tmp_path / "state", simulator, console_port, {}, temp=True)))
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reloading" in log.read_text(), timeout=10, what="the reload to begin")
        daemon.stop(timeout=30)
    messages = [r["message"] for r in log_records(log)]
    assert not any("second stop request" in m for m in messages), messages
    assert messages[-1] == f"station {STATION} stopped", messages
    # SIGTERM reached the old daemon while it stopped for the reload (no new one
    # starts), or the new one (which then stops): either way one clean stop at the end.
    during = any(m.startswith("stop requested during the reload") for m in messages)
    runs = sum(m.startswith(f"station {STATION} running") for m in messages)
    assert runs == (1 if during else 2), messages
