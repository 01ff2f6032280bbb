"""A pumping station as a Modbus TCP server (pymodbus), with faults on demand.

    python -m simulators.modbus_server --port 5020 --speed 60 --scenario slug@10m

serves `simulators.scenarios.Station` at the register map below (unit id 1) until
Ctrl-C; `config/simulator.yaml` polls exactly this map. Addresses are 0-based
protocol addresses; values come from the station model, refreshed every 100 ms like a PLC scan.

    register  address  type     order  scale  value
    holding   0        FLOAT32  ABCD          flow, gpm
    holding   2        FLOAT32  ABCD          pH
    holding   4        FLOAT32  ABCD          temperature (degC, or degF with --temp-unit degF)
    holding   6        FLOAT32  ABCD          oil, mg/L
    holding   8        UINT32   ABCD          station water meter, ft3 (wraps at 10^--meter-digits)
    holding   10       UINT32   ABCD          mill water meter, ft3
    holding   12       UINT16   ABCD   0.01   pH x 100
    holding   13       INT16    ABCD   0.1    temperature x 10
    holding   14       UINT16                 status: bit 0 pump running, bit 1 scenario active
    input     0        FLOAT32  CDAB          oil, mg/L (an analyser that swaps words)
    input     2        FLOAT32  CDAB          temperature
    input     4        UINT32   CDAB          station water meter, ft3
    coil      0        BIT                    pump running (flow > 1 gpm)
    discrete  0        BIT                    a scenario is active

Holding and input registers 0..999 all answer (unmapped ones read 0); anything
else answers exception 2. Writes answer exception 1: the station is read-only.

Faults for tests (`StationServer.faults`): `delay` seconds before each reply (for the
next `delay_count` replies, or all), `busy` next replies answer exception 6, `holes`
(kind, start, count) answer exception 2, `silent` drops every reply (as does a
device_offline scenario). `connections` counts accepted connections and
`function_codes` every function code received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType

from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusSerialServer, ModbusTcpServer
from pymodbus.simulator import DataType, SimData, SimDevice

from simulators.scenarios import Station, add_station_arguments, parse_spec, station_from_args

REGISTERS = 1000


@dataclass(frozen=True, slots=True)
class MapEntry:
    """One value of the simulator's register map."""

    value: str  # key of Station.values(), or "status"
    kind: str  # holding | input | coil | discrete
    address: int
    type: str
    byte_order: str = "ABCD"
    scale: float | None = None
    unit: str = ""


REGISTER_MAP: tuple[MapEntry, ...] = (
    MapEntry("flow", "holding", 0, "FLOAT32", unit="gpm"),
    MapEntry("ph", "holding", 2, "FLOAT32", unit="pH"),
    MapEntry("temperature", "holding", 4, "FLOAT32", unit="degC/degF"),
    MapEntry("oil", "holding", 6, "FLOAT32", unit="mg/L"),
    MapEntry("meter", "holding", 8, "UINT32", unit="ft3"),
    MapEntry("mill_meter", "holding", 10, "UINT32", unit="ft3"),
    MapEntry("ph", "holding", 12, "UINT16", scale=0.01, unit="pH"),
    MapEntry("temperature", "holding", 13, "INT16", scale=0.1, unit="degC/degF"),
    MapEntry("status", "holding", 14, "UINT16"),
    MapEntry("oil", "input", 0, "FLOAT32", "CDAB", unit="mg/L"),
    MapEntry("temperature", "input", 2, "FLOAT32", "CDAB", unit="degC/degF"),
    MapEntry("meter", "input", 4, "UINT32", "CDAB", unit="ft3"),
    MapEntry("pump", "coil", 0, "BIT"),
    MapEntry("scenario", "discrete", 0, "BIT"),
)
_FC_KIND = {1: "coil", 2: "discrete", 3: "holding", 4: "input"}


def encode(value: float, type: str, byte_order: str = "ABCD", scale: float | None = None) -> list[int]:
    """The registers a device would hold for `value` (inverse of decode_value)."""
    raw = value / scale if scale else value
    code = {"FLOAT32": ">f", "UINT32": ">I", "INT32": ">i", "UINT16": ">H", "INT16": ">h"}[type]
    data = struct.pack(code, raw if type.startswith("FLOAT") else round(raw))
    words = [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
    if byte_order == "CDAB":
        words.reverse()
    return words


@dataclass
class Faults:
    delay: float = 0.0
    delay_count: int | None = None  # None: every reply is delayed
    busy: int = 0
    holes: list[tuple[str, int, int]] = field(default_factory=list)
    silent: bool = False


class StationServer:
    """One station per unit id behind one TCP endpoint; start/stop in-process."""

    def __init__(
        self,
        stations: Station | dict[int, Station],
        *,
        host: str = "127.0.0.1",
        port: int = 5020,
        clock: Callable[[], float] = time.time,
        update_interval: float = 0.1,
        serial_port: str | None = None,
        baudrate: int = 19200,
    ) -> None:
        self.stations = stations if isinstance(stations, dict) else {1: stations}
        self.host = host
        self.port = port
        self.clock = clock
        self.faults = Faults()
        self.update_interval = update_interval
        self._cache: dict[int, tuple[float, dict[str, list[tuple[int, list[int]]]]]] = {}
        self.connections = 0
        self.function_codes: list[int] = []
        self.delayed_replies = 0  # replies that waited out `faults.delay` (a test waits on this)
        self.serial_port = serial_port  # serve Modbus RTU on this tty instead of TCP
        self.baudrate = baudrate
        self._server: ModbusTcpServer | ModbusSerialServer | None = None

    def _device(self, unit: int) -> SimDevice:
        blocks = (
            [SimData(0, count=16, values=False, datatype=DataType.BITS)],
            [SimData(0, count=16, values=False, datatype=DataType.BITS)],
            [SimData(0, count=REGISTERS, values=0, datatype=DataType.REGISTERS)],
            [SimData(0, count=REGISTERS, values=0, datatype=DataType.REGISTERS)],
        )
        return SimDevice(id=unit, simdata=blocks, action=partial(self._action, unit))

    async def _action(
        self,
        unit: int,
        function_code: int,
        start_address: int,
        address: int,
        count: int,
        registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> ExcCodes | None:
        self.function_codes.append(function_code)
        if set_values is not None:
            return ExcCodes.ILLEGAL_FUNCTION
        f = self.faults
        if f.busy > 0:
            f.busy -= 1
            return ExcCodes.DEVICE_BUSY
        kind = _FC_KIND.get(function_code)
        for hole_kind, start, n in f.holes:
            if hole_kind == kind and address < start + n and start < address + count:
                return ExcCodes.ILLEGAL_ADDRESS
        if f.delay and (f.delay_count is None or f.delay_count > 0):
            if f.delay_count is not None:
                f.delay_count -= 1
            await asyncio.sleep(f.delay)
            self.delayed_replies += 1
        self._fill(unit, kind or "", start_address, registers)
        return None

    def _fill(self, unit: int, kind: str, start_address: int, registers: list[int]) -> None:
        for address, words in self._image(unit)[kind]:
            at = address - start_address
            registers[at : at + len(words)] = words

    def _image(self, unit: int) -> dict[str, list[tuple[int, list[int]]]]:
        """Register contents per table, recomputed once per `update_interval` (as a PLC scans)."""
        now = self.clock()
        tick = now if self.update_interval <= 0 else now // self.update_interval
        cached = self._cache.get(unit)
        if cached is not None and cached[0] == tick:
            return cached[1]
        station = self.stations[unit]
        values = station.values(now)
        active = bool(station.active(now))
        pump = values["flow"] > 1.0
        values["status"] = float(pump | (active << 1))
        image: dict[str, list[tuple[int, list[int]]]] = {
            "holding": [],
            "input": [],
            "coil": [(0, [int(pump)])],
            "discrete": [(0, [int(active)])],
        }
        for e in REGISTER_MAP:
            if e.kind in ("holding", "input"):
                image[e.kind].append((e.address, encode(values[e.value], e.type, e.byte_order, e.scale)))
        self._cache[unit] = (tick, image)
        return image

    def _trace_packet(self, sending: bool, data: bytes) -> bytes:
        """Drops replies while the device is silent or offline (a dead device, not a refusal)."""
        if not sending:
            return data
        at = 0 if self.serial_port else 6  # RTU frames start with the unit id; TCP after the MBAP
        unit = data[at] if len(data) > at else 1
        station = self.stations.get(unit)
        if self.faults.silent or (station is not None and not station.online(self.clock())):
            return b""
        return data

    def _trace_connect(self, connected: bool) -> None:
        if connected:
            self.connections += 1

    async def start(self) -> None:
        devices = [self._device(unit) for unit in sorted(self.stations)]
        if self.serial_port:
            self._server = ModbusSerialServer(
                devices, port=self.serial_port, baudrate=self.baudrate, trace_packet=self._trace_packet
            )
        else:
            self._server = ModbusTcpServer(
                devices,
                address=(self.host, self.port),
                trace_packet=self._trace_packet,
                trace_connect=self._trace_connect,
            )
        await self._server.serve_forever(background=True)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.shutdown()  # type: ignore[no-untyped-call]
            self._server = None

    async def __aenter__(self) -> StationServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def build_stations(args: argparse.Namespace, start: float, offset: int = 0) -> dict[int, Station]:
    return {unit: station_from_args(args, start, seed=args.seed + offset * 100 + unit) for unit in args.units}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m simulators.modbus_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5020)
    p.add_argument("--count", type=int, default=1, help="serve N stations on ports PORT..PORT+N-1")
    p.add_argument(
        "--units", type=lambda s: [int(x) for x in s.split(",")], default=[1], help="unit ids, e.g. 1,2"
    )
    add_station_arguments(p)
    p.add_argument(
        "--on-sigusr1",
        metavar="NAME+DURATION",
        help="start this scenario at the moment SIGUSR1 arrives, e.g. slug+60s (a test's trigger)",
    )
    return p.parse_args(argv)


def inject_now(stations: Sequence[Station], spec: str) -> None:
    """Start scenario `name+duration[:params]` now, in every station's own time."""
    now = time.time()
    for station in stations:
        name, _, rest = spec.partition("+")
        station.add(parse_spec(f"{name}@{station.elapsed(now):.3f}s+{rest}"))


async def serve(args: argparse.Namespace) -> None:
    start = time.time()
    servers = [
        StationServer(build_stations(args, start, i), host=args.host, port=args.port + i)
        for i in range(args.count)
    ]
    if args.on_sigusr1:  # before the port opens, so a trigger is never the default action (exit)
        parse_spec(args.on_sigusr1.replace("+", "@0s+", 1))  # a bad spec fails now, not at the signal
        stations = [st for srv in servers for st in srv.stations.values()]
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, inject_now, stations, args.on_sigusr1)
    for srv in servers:
        await srv.start()
    units = ",".join(map(str, args.units))
    last = args.port + args.count - 1
    ports = str(args.port) if args.count == 1 else f"{args.port}..{last}"
    print(
        f"pumping-station simulator on {args.host}:{ports} unit(s) {units}, speed {args.speed:g}x", flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for srv in servers:
        await srv.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(serve(args))
    except ValueError as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:  # pymodbus raises RuntimeError when it cannot listen
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
