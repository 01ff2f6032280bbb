"""Helpers for Modbus tests: device configs, a collecting Emit, a recording TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from monitor.config.sources import ModbusDevice
from monitor.model import Condition, Quality, Sample


def device(name: str, port: int, fields: list[dict[str, Any]], **kw: Any) -> ModbusDevice:
    return ModbusDevice.model_validate(
        {"name": name, "host": "127.0.0.1", "port": port, "fields": fields, **kw}
    )


STATION_FIELDS: list[dict[str, Any]] = [
    {"sensor": "flow", "address": 0, "type": "FLOAT32"},
    {"sensor": "ph", "address": 2, "type": "FLOAT32"},
    {"sensor": "temp", "address": 4, "type": "FLOAT32"},
    {"sensor": "oil", "address": 6, "type": "FLOAT32"},
    {"sensor": "meter", "address": 8, "type": "UINT32"},
]


class Collector:
    """An Emit that keeps everything with the monotonic time it arrived."""

    def __init__(self) -> None:
        self.items: list[tuple[float, Sample | Condition]] = []

    def __call__(self, items: Sequence[Sample | Condition], /) -> None:
        now = time.monotonic()
        self.items.extend((now, item) for item in items)

    def samples(self, sensor: str) -> list[Sample]:
        return [i for _, i in self.items if isinstance(i, Sample) and i.sensor == sensor]

    def times(self, sensor: str) -> list[float]:
        return [t for t, i in self.items if isinstance(i, Sample) and i.sensor == sensor]

    def conditions(self, sensor: str | None = None) -> list[Condition]:
        return [i for _, i in self.items if isinstance(i, Condition) and sensor in (None, i.sensor)]

    def count(self, sensor: str, quality: Quality) -> int:
        return sum(1 for s in self.samples(sensor) if s.quality is quality)


@contextlib.asynccontextmanager
async def running(run: Callable[[], Coroutine[Any, Any, None]]) -> Any:
    """Run a coroutine (the poller) as a task for the duration of the block."""
    task = asyncio.create_task(run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class RecordingProxy:
    """A TCP proxy that records the function code of every Modbus/TCP frame the client sends.

    It parses the MBAP header itself (length at bytes 4-5, function code at byte 7), so
    it sees whatever arrives, including codes pymodbus' server would not understand.
    """

    def __init__(self, target_port: int, port: int) -> None:
        self.target_port = target_port
        self.port = port
        self.function_codes: list[int] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._tasks.add(me)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        down = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            buffer = b""
            while data := await reader.read(4096):
                buffer += data
                while len(buffer) >= 8:
                    length = int.from_bytes(buffer[4:6], "big")
                    if len(buffer) < 6 + length:
                        break
                    self.function_codes.append(buffer[7])
                    buffer = buffer[6 + length :]
                up_writer.write(data)
                await up_writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            down.cancel()
            await asyncio.gather(down, return_exceptions=True)
            self._tasks.discard(me)
            for w in (up_writer, writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
