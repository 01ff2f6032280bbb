"""Peak memory of `monitor run` under an oversized request body and MQTT payload, against peers.

    python -m bench.hostile [--body-mb 100] [--payload-mb 100]

Measured from outside (VmHWM in /proc/<pid>/status) on three processes of this run:

- `monitor run` (console with token, MQTT 3.1.1 subscription): an unauthenticated POST and
  an authenticated chunked POST of `--body-mb`, then a `--payload-mb` MQTT message;
- peer 1: the same FastAPI + uvicorn stack with the token checked the usual FastAPI way
  (a dependency, after the JSON body is read), sent the same unauthenticated POST;
- peer 2: a bare paho subscriber (3.1.1) sent the same MQTT message.

The daemon refuses both before reading them; the peers read them whole. The systemd unit's
MemoryMax (512 MB) is the bound that matters on a gateway.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml

from tests.mqtt_tools import Peer
from tests.services import Mosquitto, free_port, http, wait_until

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-hostile-token-0123456789"

PEER_HTTP = textwrap.dedent(
    """
    import sys, uvicorn
    from typing import Annotated
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    app = FastAPI()
    bearer = HTTPBearer(auto_error=False)
    def auth(c: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if c is None or c.credentials != "secret":
            raise HTTPException(401)
    @app.post("/ack")
    async def ack(body: dict, _: None = Depends(auth)) -> dict:
        return {}
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
    """
)
PEER_MQTT = textwrap.dedent(
    """
    import sys, time
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
    v311 = MQTTProtocolVersion.MQTTv311
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-peer", protocol=v311)
    c.on_connect = lambda c, u, f, r, p: c.subscribe("bench/ph", 1)
    c.on_subscribe = lambda c, u, mid, rc, p: print("ready", flush=True)
    c.on_message = lambda c, u, m: print(len(m.payload), flush=True)
    c.connect("127.0.0.1", int(sys.argv[1]))
    c.loop_forever()
    """
)


def peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) >> 10
    raise RuntimeError("no VmHWM")


def post(port: int, path: str, size: int, headers: dict[str, str], chunked: bool) -> int:
    """Stream `size` bytes of body; the answer may come (and the socket close) long before."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
            *(f"{k}: {v}" for k, v in headers.items()),
            "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"]  # fmt: skip
    block = b"[" * (1 << 20)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        for _ in range(size >> 20):
            sock.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    status = 0
    with contextlib.suppress(OSError):
        status = int(sock.recv(64).split()[1])
    sock.close()
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-mb", type=int, default=100)
    parser.add_argument("--payload-mb", type=int, default=100)
    args = parser.parse_args()
    body, payload = args.body_mb << 20, args.payload_mb << 20
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        broker = Mosquitto(Path(tmp) / "broker")
        broker.start()
        port, peer_port = free_port(), free_port()
        config = Path(tmp) / "station.yaml"
        config.write_text(yaml.safe_dump({
            "station": {"id": "bench"}, "state_dir": str(Path(tmp) / "state"),
            "sensors": [{"id": "outfall.ph", "kind": "ph"}],
            "mqtt": {"host": "127.0.0.1", "port": broker.port, "protocol": "3.1.1",
                     "subscriptions": [{"topic": "bench/ph", "sensor": "outfall.ph"}]},
            "console": {"host": "127.0.0.1", "port": port, "token": "${BENCH_TOKEN}"},
        }))  # fmt: skip
        env = {**os.environ, "BENCH_TOKEN": TOKEN}
        daemon = subprocess.Popen([sys.executable, "-m", "monitor", "run", "--config", str(config)], cwd=ROOT,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        peer_http = subprocess.Popen(
            [sys.executable, "-c", PEER_HTTP, str(peer_port)], stderr=subprocess.DEVNULL
        )
        peer_mqtt = subprocess.Popen(
            [sys.executable, "-c", PEER_MQTT, str(broker.port)], stdout=subprocess.PIPE, text=True
        )
        try:
            wait_until(lambda: _up(port, "/healthz"), timeout=60, what="the daemon")
            wait_until(lambda: _up(peer_port, "/docs"), timeout=60, what="the peer console")
            assert peer_mqtt.stdout is not None
            while peer_mqtt.stdout.readline().strip() != "ready":  # its SUBACK
                pass
            start = peak(daemon.pid), peak(peer_http.pid), peak(peer_mqtt.pid)
            ack = "/api/alarms/outfall.ph/high/ack"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            refused = post(port, ack, body, {}, chunked=False), post(port, ack, body, auth, chunked=True)
            peer_status = post(peer_port, "/ack", body, {}, chunked=False)
            after_http = peak(daemon.pid), peak(peer_http.pid)
            sender = Peer(broker.port, "bench-sender")
            sender.publish("bench/ph", b"7" * payload, qos=1)
            sender.publish("bench/ph", b"7.25", qos=1)
            sender.close()
            while int(peer_mqtt.stdout.readline() or 0) != 4:
                pass
            wait_until(lambda: _ph(port) == 7.25, timeout=120, what="the daemon's reading after the payload")
            after_mqtt = peak(daemon.pid), peak(peer_mqtt.pid)
        finally:
            for proc in (daemon, peer_http, peer_mqtt):
                proc.terminate()
                proc.wait(timeout=30)
            broker.stop()
    print(
        f"HTTP {args.body_mb} MB body: daemon answers {refused} (no token, token+chunked), peak RSS "
        f"{start[0]} -> {after_http[0]} MB; peer FastAPI answers {peer_status}, peak RSS {start[1]} -> "
        f"{after_http[1]} MB; growth ratio daemon/peer "
        f"{(after_http[0] - start[0]) / max(1, after_http[1] - start[1]):.3f}"
    )
    print(
        f"MQTT {args.payload_mb} MB payload: daemon peak RSS {start[0]} -> {after_mqtt[0]} MB; bare paho "
        f"subscriber {start[2]} -> {after_mqtt[1]} MB; growth ratio daemon/peer "
        f"{(after_mqtt[0] - after_http[0]) / max(1, after_mqtt[1] - start[2]):.3f}"
    )
    print("systemd MemoryMax: 512 MB")  # fmt: skip


def _up(port: int, path: str) -> bool:
    try:
        return http("GET", f"http://127.0.0.1:{port}{path}")[0] == 200
    except OSError:
        return False


def _ph(port: int) -> float | None:
    import json

    sensors = json.loads(http("GET", f"http://127.0.0.1:{port}/api/sensors")[1])
    value = {s["id"]: s["value"] for s in sensors}["outfall.ph"]
    return None if value is None else float(value)


if __name__ == "__main__":
    main()
