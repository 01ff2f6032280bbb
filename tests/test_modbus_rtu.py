"""Modbus RTU: the poller on one end of a socat pty pair, the pymodbus serial server on the other."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from monitor.config.sources import ModbusDevice
from monitor.model import Condition, ManualClock, Quality, Sample
from monitor.sources.modbus import ModbusPoller
from simulators.modbus_server import StationServer
from simulators.scenarios import Station
from tests.services import wait_until

T0 = 1_700_000_000.0


def test_rtu_device_over_a_serial_line(tmp_path: Path) -> None:
    socat = shutil.which("socat")
    assert socat, "socat is needed (scripts/bootstrap.sh installs it)"
    a, b = tmp_path / "ttyA", tmp_path / "ttyB"
    proc = subprocess.Popen(
        [socat, "-d", "-d", f"pty,raw,echo=0,link={a}", f"pty,raw,echo=0,link={b}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: a.exists() and b.exists(), timeout=10, what="socat ptys")
        station = Station(seed=3, start=T0)
        stations = {1: station, 2: Station(seed=4, start=T0)}
        fields = [
            {"sensor": "flow", "address": 0, "type": "FLOAT32"},
            {"sensor": "meter", "address": 8, "type": "UINT32"},
            {"sensor": "oil", "register": "input", "address": 0, "type": "FLOAT32", "byte_order": "CDAB"},
        ]
        devices = [
            ModbusDevice.model_validate(
                {
                    "name": f"rtu{u}",
                    "transport": "rtu",
                    "port": str(b),
                    "baudrate": 19200,
                    "device_id": u,
                    "timeout": 0.5,
                    "fields": [{**f, "sensor": f"{f['sensor']}{u}"} for f in fields],
                }
            )
            for u in (1, 2)
        ]

        async def scenario() -> list[list[Sample | Condition]]:
            async with StationServer(stations, serial_port=str(a), clock=lambda: T0 + 30):
                poller = ModbusPoller(devices, ManualClock(T0))
                assert len(poller.hubs) == 1  # one serial line, one owner
                # both units at once: the hub makes them take turns on the line
                return list(await asyncio.gather(poller.poll("rtu1"), poller.poll("rtu2")))

        first, second = asyncio.run(scenario())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    got = {s.sensor: s for s in [*first, *second] if isinstance(s, Sample)}
    assert {s.quality for s in got.values()} == {Quality.GOOD}
    want = station.values(T0 + 30)
    assert got["flow1"].value == pytest.approx(want["flow"], rel=1e-6)
    assert got["meter1"].value == want["meter"]
    assert got["oil1"].value == pytest.approx(want["oil"], rel=1e-6)
    assert got["flow2"].value == pytest.approx(stations[2].values(T0 + 30)["flow"], rel=1e-6)
