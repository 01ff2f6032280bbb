"""`monitor modbus plan/read` and the simulator started as one command, in a subprocess."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests import cli
from tests.services import free_port, port_open, wait_until

ROOT = Path(__file__).resolve().parent.parent


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


def test_simulator_config_passes_check_config_and_plans_two_requests() -> None:
    assert monitor("check-config", "config/simulator.yaml").returncode == 0
    result = monitor("modbus", "plan", "config/simulator.yaml")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("2 request(s) touching 14 registers/bits")
    assert "  FC3 holding 0..11 (12 registers, 5 fields)" in lines
    assert "  FC4 input 0..1 (2 registers, 1 field)" in lines
    assert lines[-1] == "1 device(s), 2 request(s) per cycle"


def test_plan_shows_address_base_1_maps_as_protocol_addresses(tmp_path: Path) -> None:
    cfg = yaml.safe_load((ROOT / "config" / "minimal.yaml").read_text())
    dev = cfg["modbus"]["devices"][0]
    dev["address_base"] = 1
    dev["fields"] = [
        {"sensor": "outfall.flow", "address": 1, "type": "FLOAT32"},
        {"sensor": "outfall.ph", "address": 200, "type": "UINT16", "scale": 0.01},
    ]
    path = tmp_path / "base1.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = monitor("modbus", "plan", str(path)).stdout
    assert "FC3 holding 0..1 (2 registers, 1 field)" in out
    assert "FC3 holding 199..199" in out and "(config address 200)" in out
    dev["fields"][0]["address"] = 0
    path.write_text(yaml.safe_dump(cfg))
    bad = monitor("modbus", "plan", str(path))
    assert bad.returncode == 2
    assert "modbus.devices[0].fields[0].address: must be >= 1 with address_base: 1" in bad.stderr


def test_simulator_subprocess_and_monitor_modbus_read(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulators.modbus_server", "--port", str(port), "--speed", "60",
         "--scenario", "slug@0s+1h"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: port_open(port), timeout=20, what="simulator")
        cfg = yaml.safe_load((ROOT / "config" / "simulator.yaml").read_text())
        cfg["modbus"]["devices"][0]["port"] = port
        path = tmp_path / "sim.yaml"
        path.write_text(yaml.safe_dump(cfg))
        result = monitor("modbus", "read", str(path))
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert result.returncode == 0, result.stdout + result.stderr
    readings = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert set(readings) == {
        "outfall.flow",
        "outfall.ph",
        "outfall.temp",
        "outfall.oil",
        "station.meter",
        "mill.meter",
    }
    assert all(r[2] == "GOOD" for r in readings.values())
    assert float(readings["outfall.flow"][1]) > 5 * 100  # the slug (x8) is on
    assert 5.0 < float(readings["outfall.ph"][1]) < 9.0
    assert proc.returncode == 0 and f"127.0.0.1:{port}" in out, err
