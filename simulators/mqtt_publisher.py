"""The pumping station as MQTT field devices: the same station model and scenarios
as the Modbus simulator (`simulators.scenarios`), published to a broker.

    python -m simulators.mqtt_publisher --port 1883 --speed 60 --scenario slug@10m

publishes every `--interval` seconds, one message per instrument:

    topic                      value (see simulators.scenarios.SENSORS for units)
    <prefix>/outfall/flow      flow, gpm
    <prefix>/outfall/ph        pH
    <prefix>/outfall/temp      temperature (degC, or degF with --temp-unit degF)
    <prefix>/outfall/oil       oil, mg/L
    <prefix>/station/meter     station water meter, ft3
    <prefix>/mill/meter        mill water meter, ft3

as JSON `{"value": 7.21, "ts": <epoch ms>}` (default) or a bare number
(`--format number`). `ts` is the wall-clock time of the reading: station time runs
`--speed` times faster, and a monitor refuses timestamps from the future.
`config/simulator-mqtt.yaml` subscribes to exactly these topics with one line
(`plant/+/+` -> `{1}.{2}`). While a `device_offline` scenario is in force nothing
is published, as a dead device would.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from simulators.scenarios import Station, add_station_arguments, station_from_args

TOPICS: dict[str, str] = {
    "flow": "outfall/flow",
    "ph": "outfall/ph",
    "temperature": "outfall/temp",
    "oil": "outfall/oil",
    "meter": "station/meter",
    "mill_meter": "mill/meter",
}


def messages(station: Station, t: float, prefix: str = "plant", fmt: str = "json") -> list[tuple[str, bytes]]:
    """What the station's devices publish at wall time `t`: (topic, payload) pairs."""
    if not station.online(t):
        return []
    out = []
    for name, value in station.values(t).items():
        topic = f"{prefix}/{TOPICS[name]}"
        if fmt == "number":
            payload = repr(round(value, 6)).encode()
        else:
            payload = json.dumps({"value": round(value, 6), "ts": round(t * 1000)}).encode()
        out.append((topic, payload))
    return out


def connect(args: argparse.Namespace) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=args.client_id)
    if args.username:
        password = None
        if args.password_file:
            with open(args.password_file, encoding="utf-8") as f:
                password = f.read().strip()
        client.username_pw_set(args.username, password)
    if args.ca_file:
        client.tls_set(ca_certs=args.ca_file)
    client.reconnect_delay_set(1, 10)
    client.connect_async(args.host, args.port)
    client.loop_start()
    return client


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    start = time.time()
    station = station_from_args(args, start)
    client = connect(args)
    print(
        f"pumping-station MQTT publisher -> {args.host}:{args.port} {args.prefix}/..., "
        f"every {args.interval:g} s, speed {args.speed:g}x",
        flush=True,
    )
    rounds = 0
    last = None
    try:
        while not stop.is_set() and (args.rounds == 0 or rounds < args.rounds):
            now = time.time()
            for topic, payload in messages(station, now, args.prefix, args.format):
                last = client.publish(topic, payload, qos=args.qos)
                if last.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                    print(f"publish to {topic} failed: {paho.error_string(last.rc)}", file=sys.stderr)
            rounds += 1
            stop.wait(max(0.0, start + rounds * args.interval - time.time()))
        if last is not None and args.qos > 0:
            last.wait_for_publish(timeout=10)
    finally:
        client.disconnect()
        client.loop_stop()
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m simulators.mqtt_publisher", description=__doc__.split("\n")[0]
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883)
    p.add_argument("--username")
    p.add_argument("--password-file", help="file holding the password (never on the command line)")
    p.add_argument("--ca-file", help="CA certificate: connect with TLS")
    p.add_argument("--client-id", default="station-simulator")
    p.add_argument("--prefix", default="plant", help="topic prefix (default plant)")
    p.add_argument("--format", choices=("json", "number"), default="json")
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    p.add_argument("--rounds", type=int, default=0, help="stop after N rounds (0: run until Ctrl-C)")
    add_station_arguments(p)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return run(args, stop)
    except (ValueError, OSError) as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
