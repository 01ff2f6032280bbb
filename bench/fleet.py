"""Fleet view at utility scale: how fast `monitor fleet` builds its picture from one broker.

Starts its own Mosquitto (tests.services), publishes the retained state of S stations
with A alarms each (what S gateways leave on a central broker), then times, in the
same run, from the first retained message to the last (connecting is not timed):

- peer: a bare paho subscriber on `station-monitor/+/#` that only counts messages;
- fleet: `FleetService` (MqttLink -> FleetView under its lock), until its snapshot
  lists every station and alarm.

Also times one snapshot (the JSON the page polls every 2 s). Prints messages/s for
both, the ratio, and the snapshot time.
Usage: python -m bench.fleet [--stations S] [--alarms A]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from monitor.config import Mqtt
from monitor.config.fleet import Fleet, FleetConfig
from monitor.fleet.service import FleetService
from tests.services import Mosquitto, wait_until

P = "station-monitor"


def publish_state(port: int, stations: int, alarms: int) -> int:
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id="bench-pub", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = []
    for s in range(stations):
        sid = f"ps-{s:04d}"
        infos.append(client.publish(f"{P}/{sid}/status", b"online", qos=1, retain=True))
        for a in range(alarms):
            doc = {"sensor": f"s{a}", "rule": "high", "state": "active_unacknowledged", "priority": "high",
                   "active": True, "acknowledged": False, "message": "x" * 60}  # fmt: skip
            infos.append(client.publish(f"{P}/{sid}/alarms/s{a}/high", json.dumps(doc), qos=1, retain=True))
    for info in infos:
        info.wait_for_publish(60)
    client.loop_stop()
    client.disconnect()
    return len(infos)


def peer_rate(port: int, total: int) -> float:
    got = [0]
    done = threading.Event()
    first: list[float] = []

    def on_message(_c: object, _u: object, _m: paho.MQTTMessage) -> None:
        if not first:
            first.append(time.perf_counter())
        got[0] += 1
        if got[0] == total:
            done.set()

    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id="bench-peer", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.subscribe(f"{P}/+/#", 1)
    done.wait(120)
    elapsed = time.perf_counter() - first[0]
    client.loop_stop()
    client.disconnect()
    return got[0] / elapsed


def fleet_rate(port: int, stations: int, alarms: int, total: int) -> tuple[float, float]:
    config = FleetConfig(mqtt=Mqtt(port=port), fleet=Fleet(max_stations=stations + 10))
    service = FleetService(config, client_id="bench-fleet")

    def complete() -> bool:
        with service._lock:
            view = service.view
            return len(view.stations) == stations and all(
                len(s.alarms) == alarms for s in view.stations.values()
            )

    first: list[float] = []
    handle = service.view.handle

    def timed(topic: str, payload: bytes, now: float) -> None:
        if not first:
            first.append(time.perf_counter())
        handle(topic, payload, now)

    setattr(service.view, "handle", timed)  # noqa: B010 - time the first message, as for the peer
    service.start()
    wait_until(complete, timeout=120, what="fleet view complete")
    elapsed = time.perf_counter() - first[0]
    t1 = time.perf_counter()
    doc = service.snapshot()
    json.dumps(doc)
    snap = time.perf_counter() - t1
    service.stop()
    return total / elapsed, snap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stations", type=int, default=500)
    parser.add_argument("--alarms", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = Mosquitto(Path(tmp))
        broker.start()
        try:
            total = publish_state(broker.port, args.stations, args.alarms)
            peer = peer_rate(broker.port, total)
            fleet, snap = fleet_rate(broker.port, args.stations, args.alarms, total)
        finally:
            broker.stop()
    print(f"fleet view: {args.stations} stations x {args.alarms} alarms = {total:,} retained messages")
    print(f"  peer (bare paho subscriber): {peer:,.0f} msg/s")
    print(f"  station-monitor fleet view:  {fleet:,.0f} msg/s  ratio {fleet / peer:.2f}")
    print(f"  one snapshot of the whole fleet (what the page polls): {snap * 1000:.1f} ms")


if __name__ == "__main__":
    main()
