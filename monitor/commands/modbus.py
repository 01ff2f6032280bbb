"""`monitor modbus plan|read --config FILE`: see what the poller will do.

`plan` needs no network; `read` polls every device once. The config may also be
given positionally (`monitor modbus plan FILE`), as it was before `--config`.
"""

from __future__ import annotations

import argparse
import asyncio
import math

from monitor.commands import add_config_argument, config_path, load_config_or_exit
from monitor.config import ModbusDevice
from monitor.model import Condition, Sample, WallClock, iso
from monitor.sources.modbus import ModbusPoller
from monitor.sources.modbus_plan import describe, plan_device

HELP = "Modbus tools: `plan` prints each device's merged read requests, `read` polls once"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="modbus_command", metavar="ACTION", required=True)
    plan = sub.add_parser("plan", help="print the planned requests per device (no network)")
    add_config_argument(plan, positional=True)
    read = sub.add_parser("read", help="poll every device once and print the readings")
    add_config_argument(read, positional=True)
    read.add_argument("--device", action="append", help="only this device (repeatable)")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(config_path(args), args.env_file)
    devices = list(config.modbus.devices) if config.modbus else []
    if args.modbus_command == "read" and args.device:
        devices = [d for d in devices if d.name in args.device]
    if not devices:
        print("no modbus devices configured")
        return 0
    if args.modbus_command == "plan":
        print(describe([plan_device(d) for d in devices], devices))
        return 0
    return asyncio.run(_read_once(devices))


async def _read_once(devices: list[ModbusDevice]) -> int:
    poller = ModbusPoller(devices, WallClock())
    results = await asyncio.gather(*(poller.poll(d.name) for d in devices))
    failed = False
    for dev, items in zip(devices, results, strict=True):
        print(f"{dev.name}:")
        for item in items:
            if isinstance(item, Sample):
                value = "NaN" if math.isnan(item.value) else f"{item.value:g}"
                print(f"  {item.sensor:<24} {value:>14}  {item.quality.name}  {iso(item.time)}")
                failed |= item.quality != 0
            elif isinstance(item, Condition):
                print(f"  {item.sensor:<24} {item.rule} {item.state}: {item.message}")
    for hub in poller.hubs.values():
        hub.close()
    return 1 if failed else 0
