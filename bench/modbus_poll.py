"""Poll 20 simulated devices x 60 registers and compare with the loopback floor.

    python bench/modbus_poll.py [--cycles 200] [--devices 20]

Starts `simulators.modbus_server` in a subprocess (20 endpoints on consecutive
ports, so the server's CPU is not the poller's), then prints:

- requests per cycle against the minimum the map allows (computed here
  independently of the planner: each cluster of fields closer than max_register_gap,
  in 125-register pieces);
- poll-cycle time (all devices concurrently, `asyncio.gather` of
  `ModbusPoller.poll`), median and p99;
- the floor measured in the same run: the round trip of one 125-register read by
  a plain pymodbus client on one connection, sequentially; and the ratio
  cycle / (requests x floor). Target: below 1, never above 1.5;
- the same number of reads as a cycle done one after another (timed as a whole),
  so the p99s compare like with like: the p99 of a 60-read cycle catches the
  machine's hiccups far more often than the p99 of one 250 us read does.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pymodbus.client import AsyncModbusTcpClient  # noqa: E402

from monitor.config.sources import ModbusDevice  # noqa: E402
from monitor.model import ManualClock  # noqa: E402
from monitor.sources.modbus import ModbusPoller  # noqa: E402

MAX_GAP = 10


def device_fields() -> list[dict[str, Any]]:
    """60 registers in three blocks: 10 FLOAT32, 20 UINT16 (far away), 10 UINT32 inputs."""
    fields: list[dict[str, Any]] = []
    fields += [{"sensor": f"f{i}", "address": 2 * i, "type": "FLOAT32"} for i in range(10)]
    fields += [{"sensor": f"u{i}", "address": 300 + i, "type": "UINT16"} for i in range(20)]
    fields += [
        {"sensor": f"m{i}", "register": "input", "address": 600 + 2 * i, "type": "UINT32"} for i in range(10)
    ]
    return fields


def minimum_requests(fields: list[dict[str, Any]]) -> int:
    """Fewest reads for one device: clusters (gap <= MAX_GAP) per table, 125 registers each."""
    width = {"FLOAT32": 2, "UINT32": 2, "UINT16": 1}
    total = 0
    for table in ("holding", "input"):
        spans = sorted(
            (f["address"], f["address"] + width[f["type"]])
            for f in fields
            if f.get("register", "holding") == table
        )
        clusters: list[list[int]] = []
        for a, b in spans:
            if clusters and a - clusters[-1][1] <= MAX_GAP:
                clusters[-1][1] = max(clusters[-1][1], b)
            else:
                clusters.append([a, b])
        total += sum(math.ceil((b - a) / 125) for a, b in clusters)
    return total


def free_block(n: int) -> int:
    """A base port with n free consecutive ports above it."""
    for base in range(21000, 60000, 97):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def wait_ports(base: int, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    for p in range(base, base + n):
        while True:
            try:
                socket.create_connection(("127.0.0.1", p), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


async def floor_rtt(client: AsyncModbusTcpClient, reads: int) -> list[float]:
    out = []
    for _ in range(reads):
        t0 = time.perf_counter()
        rr = await client.read_holding_registers(0, count=125, device_id=1)
        out.append(time.perf_counter() - t0)
        assert not rr.isError() and len(rr.registers) == 125
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(base: int, n: int, cycles: int, server_pid: int) -> dict[str, Any]:
    """Floor reads and poll cycles interleaved in rounds, so both see the same machine load."""
    fields = device_fields()
    devices = [
        ModbusDevice.model_validate(
            {
                "name": f"dev{i}",
                "host": "127.0.0.1",
                "port": base + i,
                "max_register_gap": MAX_GAP,
                "fields": fields,
            }
        )
        for i in range(n)
    ]
    poller = ModbusPoller(devices, ManualClock(0.0))
    client = AsyncModbusTcpClient("127.0.0.1", port=base, timeout=2, retries=0, reconnect_delay=0)
    await client.connect()
    for _ in range(10):  # warm up: connect every hub
        await asyncio.gather(*(poller.poll(d.name) for d in devices))
    times: list[float] = []
    floor: list[float] = []
    cpu: list[float] = []
    bad = 0
    server_cpu = 0.0
    batches: list[float] = []  # the same number of reads as a cycle, one after another
    per_cycle = sum(len(st.requests) for st in poller.devices.values())
    for _ in range(max(1, cycles // 10)):
        for _ in range(2):
            reads = await floor_rtt(client, per_cycle)
            floor += reads
            batches.append(sum(reads))
        s0 = cpu_seconds(server_pid)
        for _ in range(10):
            t0, c0 = time.perf_counter(), time.process_time()
            results = await asyncio.gather(*(poller.poll(d.name) for d in devices))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            bad += sum(1 for items in results for s in items if getattr(s, "quality", 0) != 0)
        server_cpu += cpu_seconds(server_pid) - s0
    client.close()
    for hub in poller.hubs.values():
        hub.close()
    return {
        "requests": sum(len(st.requests) for st in poller.devices.values()),
        "minimum": n * minimum_requests(fields),
        "registers": n * 60,
        "cycles": times,
        "cpu": cpu,
        "server_cpu": server_cpu / len(times),
        "floor": floor,
        "batches": batches,
        "bad": bad,
    }


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--cycles", type=int, default=200)
    args = ap.parse_args()
    base = free_block(args.devices)
    cmd = [
        sys.executable,
        "-m",
        "simulators.modbus_server",
        "--port",
        str(base),
        "--count",
        str(args.devices),
    ]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_ports(base, args.devices)
        r = asyncio.run(measure(base, args.devices, args.cycles, server.pid))
    finally:
        server.terminate()
        server.wait(timeout=20)
    floor = statistics.median(r["floor"])
    med, tail = statistics.median(r["cycles"]), p99(r["cycles"])
    sequential = r["requests"] * floor
    load = os.getloadavg()[0]
    print(f"modbus_poll: {args.devices} devices x 60 registers in 3 blocks, {args.cycles} cycles")
    print(f"  machine                 {os.cpu_count()} CPUs, load average {load:.1f} during the run")
    print(f"  requests per cycle      {r['requests']}  (minimum for this map: {r['minimum']})")
    print(f"  registers per cycle     {r['registers']} values, bad samples: {r['bad']}")
    print(
        f"  floor: 125-reg read RTT median {floor * 1e6:.0f} us"
        f" (p99 {p99(r['floor']) * 1e6:.0f} us), same run"
    )
    print(f"  poll cycle              median {med * 1e3:.2f} ms, p99 {tail * 1e3:.2f} ms")
    cpu = statistics.median(r["cpu"]) / r["requests"]
    print(f"  poller CPU per request  {cpu * 1e6:.0f} us (decode and samples included)")
    print(
        f"  simulator CPU/request   {r['server_cpu'] / r['requests'] * 1e6:.0f} us"
        " (the pymodbus server, in its own process)"
    )
    print(f"  requests x floor        {sequential * 1e3:.2f} ms (one connection, one request at a time)")
    print(
        f"  ratio cycle/(req x RTT) median {med / sequential:.2f}, p99 {tail / sequential:.2f}"
        "  (target < 1, <= 1.5)"
    )
    b_med, b_tail = statistics.median(r["batches"]), p99(r["batches"])
    print(
        f"  same reads in sequence  median {b_med * 1e3:.2f} ms, p99 {b_tail * 1e3:.2f} ms"
        f" -> cycle/sequence median {med / b_med:.2f}, p99 {tail / b_tail:.2f}"
    )
    return 0 if r["requests"] == r["minimum"] else 1


if __name__ == "__main__":
    sys.exit(main())
