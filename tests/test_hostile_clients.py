"""Hostile and careless clients against a running `monitor run`: huge bodies, bad tokens,
foreign Host headers, too many live-update streams, a 200 MB MQTT payload. The daemon's
peak memory is read from outside (/proc/PID/status VmHWM) and must stay far below the
systemd unit's MemoryMax."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon_process import running_daemon
from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port, wait_until
from tests.services import http as request

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hostile-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UNIT = ROOT / "deploy" / "systemd" / "station-monitor.service"


def memory_max() -> int:
    match = re.search(r"^MemoryMax=(\d+)M$", UNIT.read_text(), re.M)
    assert match, "the systemd unit sets MemoryMax in MB"
    return int(match.group(1)) << 20


def peak_rss(pid: int) -> int:
    """Bytes: the process's high-water resident set, as the kernel counted it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def daemon(tmp_path: Path, mosquitto: Mosquitto) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port = free_port()
    config = tmp_path / "station.yaml"
    doc: dict[str, Any] = {
        "station": {"id": "ps-hostile"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "mqtt": {
            "host": "127.0.0.1",
            "port": mosquitto.port,
            "protocol": "3.1.1",  # no Maximum Packet Size to lean on: the client-side guard works alone
            "client_id": f"hostile-{port}",
            "subscriptions": [{"topic": "hostile/ph", "sensor": "outfall.ph"}],
        },
        "console": {"host": "127.0.0.1", "port": port, "token": "${HOSTILE_TOKEN}", "max_live_clients": 3},
    }
    config.write_text(yaml.safe_dump(doc))
    log = tmp_path / "daemon.log"
    with running_daemon(config, log, env={"HOSTILE_TOKEN": TOKEN}, grace=20) as run:
        wait_until(lambda: _status(port, "GET", "/healthz") == 200, timeout=90, what="the console")
        yield run.proc, port, log


def _status(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> int:
    try:
        status, _ = request(method, f"http://127.0.0.1:{port}{path}", headers=headers)
    except OSError:
        return 0
    return status


def send_huge(port: int, headers: dict[str, str], total: int, chunked: bool) -> tuple[int, bytes]:
    """Stream `total` bytes of body and read the answer; the server may answer and close
    long before the body is sent (that is the point), so a broken pipe ends the sending."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = ["POST /api/alarms/outfall.ph/high/ack HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head += [f"{k}: {v}" for k, v in headers.items()] + ["Content-Type: application/json"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    block = b"[" * (1 << 20)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        while sent < total:
            if chunked:
                sock.sendall(b"%x\r\n%s\r\n" % (len(block), block))
            else:
                sock.sendall(block)
            sent += len(block)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read()
    sock.close()
    return response.status, body


def test_hostile_http_clients_are_refused_before_the_body_is_read(
    daemon: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    proc, port, _log = daemon
    base = f"http://127.0.0.1:{port}"
    # anti-framing, no-sniff on every answer, the page included
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/")
    page = conn.getresponse()
    page.read()
    conn.close()
    assert page.status == 200
    assert page.getheader("X-Frame-Options") == "DENY"
    assert "frame-ancestors 'none'" in (page.getheader("Content-Security-Policy") or "")
    assert page.getheader("X-Content-Type-Options") == "nosniff"
    # a DNS-rebinding page names its own host
    assert _status(port, "GET", "/api/alarms", {"Host": "evil.example:8080"}) == 421
    assert _status(port, "GET", "/api/alarms", {"Host": f"localhost:{port}"}) == 200
    before = peak_rss(proc.pid)
    huge = 300 << 20
    # no token: 401 from the headers alone, the 300 MB are never read
    status, body = send_huge(port, {}, huge, chunked=False)
    assert status == 401 and b"bearer token" in body
    wrong = {"Authorization": "Bearer not-the-token-at-all"}
    assert send_huge(port, wrong, huge, chunked=True)[0] == 401
    # with the token: 413 from Content-Length, and a chunked body is cut at the limit
    assert send_huge(port, AUTH, huge, chunked=False)[0] == 413
    assert send_huge(port, AUTH, huge, chunked=True)[0] == 413
    # a normal write still works (the alarm does not exist: 404, after auth and parsing)
    status, _ = request("POST", f"{base}/api/alarms/outfall.ph/high/ack", b'{"by": "dana"}',
                     {**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert status == 404
    after = peak_rss(proc.pid)
    print(f"daemon peak RSS before {before >> 20} MB, after 4 x 300 MB bodies {after >> 20} MB")
    assert after - before < 32 << 20
    assert after < memory_max() // 2


def test_live_update_clients_are_limited_and_health_still_answers(
    daemon: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    _proc, port, _log = daemon
    streams = []
    try:
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/api/events")
            resp = conn.getresponse()
            assert resp.status == 200
            assert resp.readline() == b"retry: 2000\n"
            streams.append(conn)
        assert _status(port, "GET", "/api/events") == 503
        assert _status(port, "GET", "/healthz") == 200
        streams.pop().close()
        wait_until(lambda: _status_stream(port) == 200, timeout=10, what="a free live-update place")
    finally:
        for conn in streams:
            conn.close()


def _status_stream(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/api/events")
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_200_mb_mqtt_payload_costs_no_memory_and_ingest_goes_on(
    daemon: tuple[subprocess.Popen[bytes], int, Path], mosquitto: Mosquitto
) -> None:
    proc, port, _log = daemon
    wait_until(lambda: _connected(port), timeout=60, what="the daemon's MQTT link")
    before = peak_rss(proc.pid)
    peer = Peer(mosquitto.port, f"hostile-peer-{port}")
    try:
        peer.publish("hostile/ph", b"7" * (200 << 20), qos=1)
        peer.publish("hostile/ph", b"7.25", qos=1)
        wait_until(lambda: _ph(port) == 7.25, timeout=60, what="the reading after the 200 MB payload")
    finally:
        peer.close()
    _, body = request("GET", f"http://127.0.0.1:{port}/api/health")
    (mqtt,) = [s for s in json.loads(body)["sources"] if s["source"] == "mqtt"]
    assert mqtt["oversized"] == 1  # counted (and logged once), not silently lost
    after = peak_rss(proc.pid)
    print(f"daemon peak RSS before {before >> 20} MB, after a 200 MB MQTT payload {after >> 20} MB")
    assert after - before < 32 << 20
    assert after < memory_max() // 2


def _connected(port: int) -> bool:
    try:
        _, body = request("GET", f"http://127.0.0.1:{port}/api/health")
        return all(s.get("connected") for s in json.loads(body).get("sources", [])) and bool(
            json.loads(body).get("sources")
        )
    except (OSError, ValueError):
        return False


def _ph(port: int) -> float | None:
    _, body = request("GET", f"http://127.0.0.1:{port}/api/sensors")
    value = {s["id"]: s["value"] for s in json.loads(body)}["outfall.ph"]
    return None if value is None else float(value)
