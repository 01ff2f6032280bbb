"""A malformed Modbus answer invalidates only its own request's fields: against the real
pymodbus simulator, through a TCP proxy that corrupts the device's coil replies (a real
server does not send broken frames on demand; the proxy is the fault, not a fake device)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from typing import Any

import pymodbus.exceptions
import pytest

from monitor.errors import MalformedResponseError, ModbusError, ModbusTimeoutError
from monitor.model import Condition, ConditionState, ManualClock, Quality, Rule, Sample
from monitor.sources.modbus import ERRORS, ModbusPoller, translate
from simulators.modbus_server import StationServer
from simulators.scenarios import Station
from tests.modbus_support import device
from tests.services import free_port

T0 = 1_700_000_000.0
FIELDS: list[dict[str, Any]] = [
    {"sensor": "pump", "register": "coil", "address": 0, "type": "BIT"},
    {"sensor": "flow", "address": 0, "type": "FLOAT32"},
    {"sensor": "ph", "address": 2, "type": "FLOAT32"},
]


class CorruptingProxy:
    """Forwards Modbus/TCP both ways; while `mode` is set, rewrites every FC1 reply:
    `short` answers with no coil bytes at all, `kind` answers as if asked for discrete inputs.
    (An answer for another unit id pymodbus drops itself: that one is a timeout.)"""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.mode: str | None = None
        self.corrupted = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> CorruptingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        tasks = [
            asyncio.create_task(self._pipe(reader, up_writer, corrupt=False)),
            asyncio.create_task(self._pipe(up_reader, writer, corrupt=True)),
        ]
        self._tasks.update(tasks)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
            self._tasks.discard(task)
        for w in (up_writer, writer):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, corrupt: bool) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readexactly(6)
                body = await reader.readexactly(int.from_bytes(head[4:6], "big"))
                if corrupt and self.mode is not None and body[1] == 1:
                    self.corrupted += 1
                    # short: byte count 0, no coil at all; kind: a discrete-input answer to a coil read
                    short = self.mode == "short"
                    body = body[:2] + b"\x00" if short else body[:1] + b"\x02" + body[2:]
                    head = head[:4] + len(body).to_bytes(2, "big")
                writer.write(head + body)
                await writer.drain()


def samples(items: list[Sample | Condition]) -> dict[str, Sample]:
    return {i.sensor: i for i in items if isinstance(i, Sample)}


@pytest.mark.parametrize("mode", ["short", "kind"])
def test_a_malformed_answer_loses_only_its_own_fields(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        port = free_port()
        async with (
            StationServer(Station(seed=11, speed=60, start=T0), port=port, clock=lambda: T0 + 600),
            CorruptingProxy(port) as proxy,
        ):
            poller = ModbusPoller(
                [device("plc", proxy.port, FIELDS, timeout="500ms", comm_loss_after=2)], ManualClock(T0)
            )
            good = samples(await poller.poll("plc"))
            assert all(s.quality is Quality.GOOD for s in good.values()), good
            proxy.mode = mode
            items: list[Sample | Condition] = []
            for _ in range(3):  # past comm_loss_after: still no comm-loss, the device answers
                items = await poller.poll("plc")
                got = samples(items)
                assert got["pump"].quality is Quality.COMM_FAILURE and math.isnan(got["pump"].value)
                assert got["flow"].quality is Quality.GOOD and got["ph"].quality is Quality.GOOD
                assert not [c for c in items if isinstance(c, Condition)]
            (health,) = poller.health()
            assert health.malformed == 3 and health.timeouts == 0
            assert health.invalid_requests == ("FC1 coil 0..0 (1 bit, 1 field)",)
            assert health.failed_in_row == 0
            assert proxy.corrupted == 3
            proxy.mode = None
            back = samples(await poller.poll("plc"))
            assert back["pump"].quality is Quality.GOOD and back["pump"].value == 1.0
            assert poller.health()[0].invalid_requests == ()

    with caplog.at_level(logging.INFO, logger="monitor.sources.modbus"):
        asyncio.run(scenario())
    text = [r.getMessage() for r in caplog.records if r.name == "monitor.sources.modbus"]
    assert sum("malformed answer to FC1 coil 0..0" in m for m in text) == 1, text  # once per episode
    assert any("answered properly again" in m for m in text), text


def test_a_device_whose_every_answer_is_malformed_raises_comm_loss() -> None:
    async def scenario() -> list[Condition]:
        port = free_port()
        async with (
            StationServer(Station(seed=11, speed=60, start=T0), port=port, clock=lambda: T0 + 600),
            CorruptingProxy(port) as proxy,
        ):
            poller = ModbusPoller(
                [device("plc", proxy.port, FIELDS[:1], timeout="500ms", comm_loss_after=2)], ManualClock(T0)
            )
            proxy.mode = "short"
            out: list[Condition] = []
            for _ in range(2):
                out += [i for i in await poller.poll("plc") if isinstance(i, Condition)]
            return out

    conditions = asyncio.run(scenario())
    assert [(c.sensor, c.rule, c.state) for c in conditions] == [
        ("pump", Rule.COMM_LOSS, ConditionState.ACTIVE)
    ]


def test_every_pymodbus_exception_is_mapped() -> None:
    """Like httpx's test_httpcore_all_exceptions_mapped: a new pymodbus exception fails here."""
    raised = {
        cls
        for _, cls in inspect.getmembers(pymodbus.exceptions, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ == pymodbus.exceptions.__name__
    }
    assert pymodbus.exceptions.ModbusIOException in raised
    missing = raised - set(ERRORS)
    assert not missing, f"pymodbus exceptions without a mapping: {missing}"
    for cls in raised:
        mapped = translate(cls("boom"), "127.0.0.1:502")
        assert isinstance(mapped, ModbusError) and "127.0.0.1:502" in str(mapped)
    assert isinstance(translate(TimeoutError(), "x"), ModbusTimeoutError)
    assert isinstance(translate(pymodbus.exceptions.ModbusIOException("x"), "x"), MalformedResponseError)
    assert type(translate(ConnectionResetError(), "x")) is ModbusError
