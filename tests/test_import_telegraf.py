"""`monitor import-telegraf`: a realistic Telegraf request-style map converts, validates, and polls."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
import yaml

from monitor.commands.import_telegraf import convert
from monitor.config import build_config
from monitor.errors import ConfigError
from monitor.model import ManualClock, Quality, Sample
from monitor.sources.modbus import ModbusPoller
from simulators.modbus_server import StationServer
from simulators.scenarios import Station
from tests import cli
from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "telegraf_request"


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


def test_golden_case_converts_and_passes_check_config(tmp_path: Path) -> None:
    out = tmp_path / "station.yaml"
    result = monitor("import-telegraf", str(CASE / "telegraf.conf"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == (CASE / "expected.yaml").read_text()
    assert "tags are not carried over" in result.stderr and "STRING fields are text" in result.stderr
    check = monitor("check-config", str(out))
    assert check.returncode == 0, check.stderr
    cfg = yaml.safe_load(out.read_text())
    devices = {d["name"]: d for d in cfg["modbus"]["devices"]}
    assert set(devices) == {"Outfall_PLC-1", "Outfall_PLC-2", "Mill_meter"}
    plc = devices["Outfall_PLC-1"]
    assert (plc["host"], plc["port"], plc["device_id"], plc["poll_interval"]) == (
        "192.168.10.20",
        502,
        1,
        "2s",
    )
    assert plc["close_after_cycle"] is True and plc["busy_retries"] == 3
    oil = next(f for f in plc["fields"] if f["sensor"].endswith("oil_mgl"))
    assert (oil["register"], oil["byte_order"]) == ("input", "CDAB")
    assert all(not f["sensor"].endswith("spare") for f in plc["fields"])  # omit = true
    mill = devices["Mill_meter"]
    assert (mill["transport"], mill["port"], mill["baudrate"], mill["parity"]) == (
        "rtu",
        "/dev/ttyUSB0",
        19200,
        "E",
    )
    assert mill["poll_interval"] == "10s"  # the [agent] interval


def test_what_cannot_convert_exits_2_naming_the_section(tmp_path: Path) -> None:
    path = tmp_path / "register.conf"
    path.write_text(
        '[[inputs.modbus]]\n  name = "x"\n  controller = "tcp://h:502"\n  holding_registers = []\n'
    )
    result = monitor("import-telegraf", str(path))
    assert result.returncode == 2
    assert "inputs.modbus[0].configuration_type: only request-style maps convert" in result.stderr
    with pytest.raises(ConfigError, match="not valid TOML"):
        convert("[[inputs.modbus]\n")
    with pytest.raises(ConfigError, match="controller"):
        convert('[[inputs.modbus]]\nconfiguration_type = "request"\ncontroller = "udp://h:1"\n')


def test_a_converted_map_reads_the_same_values_from_the_simulator() -> None:
    port = free_port()
    toml = f"""
[[inputs.modbus]]
  name = "sim"
  controller = "tcp://127.0.0.1:{port}"
  configuration_type = "request"
  [[inputs.modbus.request]]
    slave_id = 1
    register = "holding"
    fields = [
      {{ address = 0, name = "flow", type = "FLOAT32" }},
      {{ address = 8, name = "meter", type = "UINT32" }},
      {{ address = 12, name = "ph", type = "UINT16", scale = 0.01 }},
    ]
  [[inputs.modbus.request]]
    slave_id = 1
    register = "input"
    byte_order = "CDAB"
    fields = [ {{ address = 0, name = "oil", type = "FLOAT32" }} ]
"""
    text, _ = convert(toml)
    config = build_config(yaml.safe_load(text))
    assert config.modbus is not None
    station = Station(seed=5, start=1e9)

    async def scenario() -> list[Sample]:
        async with StationServer(station, port=port, clock=lambda: 1e9 + 60):
            poller = ModbusPoller(config.modbus.devices, ManualClock(1e9))  # type: ignore[union-attr]
            return [s for s in await poller.poll("sim") if isinstance(s, Sample)]

    got = {s.sensor: s for s in asyncio.run(scenario())}
    want = station.values(1e9 + 60)
    assert {s.quality for s in got.values()} == {Quality.GOOD}
    assert got["sim.flow"].value == pytest.approx(want["flow"], rel=1e-6)
    assert got["sim.oil"].value == pytest.approx(want["oil"], rel=1e-6)
    assert got["sim.meter"].value == want["meter"]
    assert got["sim.ph"].value == pytest.approx(want["ph"], abs=0.006)
