"""Modbus polling: one hub per endpoint, every device on its own schedule.

The only module that imports pymodbus; its exceptions become `ModbusError` here.

- A `Hub` owns the one connection to an endpoint (a TCP host:port or a serial
  line) and a lock: devices behind the same endpoint take turns, devices behind
  different endpoints never wait for each other.
- After a timeout the hub closes the connection, so a late reply can never be
  taken for the answer to the next request (transaction ids stay in step); the
  next request reconnects. A refused connection backs off exponentially with jitter.
- Only function codes 1-4 are ever sent: the hub has no method that writes.

`ModbusPoller.run(emit)` polls until cancelled and emits `Sample`s (GOOD, BAD_DATA,
COMM_FAILURE with NaN) and comm-loss `Condition`s; planning lives in
`modbus_plan`, decoding in `modbus_decode`, judging answers in `modbus_device`, counters
and episode logging in `modbus_health`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from pymodbus.client import AsyncModbusSerialClient, AsyncModbusTcpClient
from pymodbus.exceptions import (
    ConnectionException,
    MessageRegisterException,
    ModbusException,
    ModbusIOException,
    NoSuchIdException,
    NotImplementedException,
    ParameterException,
)

from monitor.config.sources import ModbusDevice
from monitor.errors import MalformedResponseError, ModbusError, ModbusTimeoutError
from monitor.model import Clock, Condition, Emit, Quality, Sample, WallClock
from monitor.sources.modbus_decode import decode_value
from monitor.sources.modbus_device import (
    COMM_CODES,
    EXCEPTION_NAMES,
    DeviceState,
    comm_state,
    malformed_state,
    samples,
)
from monitor.sources.modbus_health import DeviceHealth
from monitor.sources.modbus_plan import ReadPlan, Request, plan_device, split

log = logging.getLogger(__name__)

# The error map: every pymodbus exception (a test checks none is missing), most specific
# first. pymodbus' own response timeout is set longer than ours (`TIMEOUT_SLACK`), so a
# timeout is always our `asyncio.timeout` firing (ModbusTimeoutError), and what pymodbus
# raises about a response means the answer did not fit the request.
ERRORS: dict[type[Exception], type[ModbusError]] = {
    ConnectionException: ModbusError,  # connection refused or lost: the device is away
    ModbusIOException: MalformedResponseError,  # a reply for another unit or transaction
    NoSuchIdException: MalformedResponseError,
    NotImplementedException: MalformedResponseError,  # a reply pymodbus cannot decode
    ParameterException: MalformedResponseError,  # a decoded value out of range
    MessageRegisterException: ModbusError,  # our misuse of pymodbus, not the device
    ModbusException: MalformedResponseError,  # e.g. "Unknown response": a reply of the wrong kind
}
FUNCTION_CODES = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}  # the only ones ever sent
TIMEOUT_SLACK = 1.0  # seconds pymodbus waits beyond our own cut


def translate(exc: Exception, where: str) -> ModbusError:
    """One pymodbus (or socket) exception -> ours, naming the endpoint."""
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return ModbusTimeoutError(f"{where}: timeout")
    for cls, ours in ERRORS.items():
        if isinstance(exc, cls):
            return ours(f"{where}: {exc}")
    return ModbusError(f"{where}: {type(exc).__name__}: {exc}")  # OSError and kin: the link


def endpoint(device: ModbusDevice) -> str:
    return f"{device.host}:{device.port}" if device.transport == "tcp" else f"{device.port}"


class Hub:
    """The one owner of a connection to an endpoint."""

    def __init__(
        self,
        device: ModbusDevice,
        *,
        rng: random.Random | None = None,
        reconnect_delay: float = 0.5,
        reconnect_delay_max: float = 30.0,
        timeout: float | None = None,
    ) -> None:
        self.key = endpoint(device)
        # pymodbus' own response timeout: longer than the longest of the devices sharing this
        # endpoint, so `read` always cuts first, at the device's own timeout (a typed timeout).
        self._timeout = (timeout or device.timeout) + TIMEOUT_SLACK
        self.lock = asyncio.Lock()
        self._template = device
        self._client: Any = None
        self._rng = rng or random.Random()
        self._base = reconnect_delay
        self._max = reconnect_delay_max
        self.connect_failures = 0  # in a row
        self.retry_at = 0.0  # loop time before which no connect is tried
        self.connects = 0  # successful connects, for health
        self.connect_attempts: list[float] = []  # loop times, last 50
        if logging.getLogger("pymodbus").level == logging.NOTSET:
            # pymodbus logs every failed request itself; we log once per episode.
            logging.getLogger("pymodbus").setLevel(logging.CRITICAL)

    @property
    def connected(self) -> bool:
        return self._client is not None and bool(self._client.connected)

    def _make_client(self) -> Any:
        d = self._template
        if d.transport == "tcp":
            return AsyncModbusTcpClient(
                d.host or "127.0.0.1", port=int(d.port), timeout=self._timeout, retries=0, reconnect_delay=0
            )
        return AsyncModbusSerialClient(
            str(d.port),
            baudrate=d.baudrate,
            parity=d.parity,
            stopbits=d.stopbits,
            bytesize=d.bytesize,
            timeout=self._timeout,
            retries=0,
            reconnect_delay=0,
        )

    def backoff(self) -> float:
        """Exponential backoff with full jitter in [50 %, 100 %] of the step."""
        # Cap the exponent: after weeks offline 2.0 ** failures would overflow a float.
        exponent = min(max(0, self.connect_failures - 1), 60)
        step: float = min(self._max, self._base * 2.0**exponent)
        return step * (0.5 + 0.5 * self._rng.random())

    async def connect(self, timeout: float) -> None:
        if self.connected:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now < self.retry_at:
            raise ModbusError(f"{self.key}: not connected, next attempt in {self.retry_at - now:.1f}s")
        self.close()
        self.connect_attempts = [*self.connect_attempts[-49:], now]
        client = self._make_client()
        error = "connection refused or unreachable"
        try:
            ok = await asyncio.wait_for(client.connect(), timeout)
        except (TimeoutError, OSError, ModbusException) as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if not ok or not client.connected:
            client.close()
            self.connect_failures += 1
            self.retry_at = loop.time() + self.backoff()
            raise ModbusError(f"{self.key}: cannot connect ({error})")
        self._client = client
        self.connect_failures = 0
        self.connects += 1

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def read(self, device_id: int, request: Request, timeout: float) -> list[int]:
        """Read one request; returns register words, or 0/1 per bit for coils and discretes."""
        await self.connect(timeout)
        client = self._client
        call: Callable[..., Any] = {
            "coil": client.read_coils,
            "discrete": client.read_discrete_inputs,
            "holding": client.read_holding_registers,
            "input": client.read_input_registers,
        }[request.kind]
        try:
            async with asyncio.timeout(timeout):  # no extra task per request, unlike wait_for
                response = await call(request.address, count=request.count, device_id=device_id)
        except TimeoutError:
            self.close()
            raise ModbusTimeoutError(f"{self.key}: timeout after {timeout:g}s") from None
        except (ModbusException, OSError) as exc:
            self.close()  # a broken or mismatched frame, a lost link: start clean
            raise translate(exc, self.key) from exc
        if response.isError():
            code = int(getattr(response, "exception_code", 0) or 0)
            name = EXCEPTION_NAMES.get(code, "unknown")
            raise ModbusError(f"{self.key}: exception {code} ({name})", exception_code=code)
        answered = getattr(response, "function_code", None)
        if answered != FUNCTION_CODES[request.kind]:
            raise MalformedResponseError(
                f"{self.key}: asked with FC{FUNCTION_CODES[request.kind]}, answered FC{answered}"
            )
        if request.kind in ("coil", "discrete"):
            bits = getattr(response, "bits", None)
            if not isinstance(bits, list) or len(bits) < request.count:
                got = len(bits) if isinstance(bits, list) else type(response).__name__
                raise MalformedResponseError(f"{self.key}: asked for {request.count} bit(s), got {got}")
            return [int(bool(b)) for b in bits[: request.count]]
        registers = getattr(response, "registers", None)
        if not isinstance(registers, list) or len(registers) != request.count:
            got = len(registers) if isinstance(registers, list) else type(response).__name__
            raise MalformedResponseError(f"{self.key}: asked for {request.count} register(s), got {got}")
        return [int(w) for w in registers]


class ModbusPoller:
    """Polls every configured device concurrently until cancelled."""

    def __init__(
        self,
        devices: Sequence[ModbusDevice],
        clock: Clock | None = None,
        *,
        rng: random.Random | None = None,
        reconnect_delay: float = 0.5,
        reconnect_delay_max: float = 30.0,
    ) -> None:
        self.clock = clock or WallClock()
        hubs: dict[str, Hub] = {}
        self.devices: dict[str, DeviceState] = {}
        for dev in devices:
            key = endpoint(dev)
            if key not in hubs:
                longest = max(d.timeout for d in devices if endpoint(d) == key)
                hubs[key] = Hub(
                    dev,
                    rng=rng,
                    reconnect_delay=reconnect_delay,
                    reconnect_delay_max=reconnect_delay_max,
                    timeout=longest,
                )
            self.devices[dev.name] = DeviceState(dev, plan_device(dev), hubs[key])
        self.hubs = hubs

    @property
    def plans(self) -> list[ReadPlan]:
        return [st.plan for st in self.devices.values()]

    def health(self) -> list[DeviceHealth]:
        """A snapshot per device for the daemon's metrics and status page."""
        out = []
        for st in self.devices.values():
            st.health.connected = st.hub.connected
            st.health.requests_per_cycle = len(st.requests)
            out.append(st.health.snapshot())
        return out

    async def run(self, emit: Emit) -> None:
        for st in self.devices.values():
            log.info("modbus %s", st.plan.summary())
        tasks = [
            asyncio.create_task(self._poll_forever(st, emit), name=f"modbus {n}")
            for n, st in self.devices.items()
        ]
        try:
            await asyncio.gather(*tasks) if tasks else await asyncio.Event().wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for hub in self.hubs.values():
                hub.close()

    async def _poll_forever(self, st: DeviceState, emit: Emit) -> None:
        loop = asyncio.get_running_loop()
        interval = st.device.poll_interval
        start = loop.time()
        tick = 0
        task = asyncio.current_task()
        while True:
            try:
                emit(await self.poll(st.device.name))
            except Exception:  # a bug must not stop the other devices or this one's schedule
                if st.episodes.fail("internal", "poll cycle failed unexpectedly", exc_info=True):
                    st.health.errors += 1
            # pymodbus can swallow a cancellation that lands inside a request and turn it
            # into an I/O error; honour it here, or the daemon's shutdown waits on us.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            # Next tick on the grid; a long cycle skips ticks instead of bursting.
            tick = max(tick + 1, math.floor((loop.time() - start) / interval) + 1)
            await asyncio.sleep(max(0.0, start + tick * interval - loop.time()))

    async def poll(self, name: str) -> list[Sample | Condition]:
        """One poll cycle of one device: every planned request, then samples and conditions."""
        st = self.devices[name]
        dev = st.device
        loop = asyncio.get_running_loop()
        began = loop.time()
        results: list[tuple[Request, list[int] | ModbusError]] = []
        silent: ModbusError | None = None
        async with st.hub.lock:
            for i, request in enumerate(st.requests):
                if silent is not None:
                    # The device did not answer: one timeout per cycle, not one per request,
                    # so a dead unit does not hold a shared line for N x timeout.
                    results.append((request, silent))
                    continue
                if i and dev.pause:
                    await asyncio.sleep(dev.pause)
                got = await self._read(st, request)
                results.extend(got)
                silent = next((x for _, x in got if isinstance(x, ModbusError) and _silent(x)), None)
            if dev.close_after_cycle:
                st.hub.close()
        st.requests = [r for r, _ in results]
        now = self.clock.now()
        st.health.last_cycle = loop.time() - began
        st.health.cycles += 1
        items: list[Sample | Condition] = []
        answered = False
        comm_error: ModbusError | None = None
        malformed_state(st, results)
        for request, result in results:
            if isinstance(result, ModbusError) and (
                result.exception_code is None or result.exception_code in COMM_CODES
            ):
                comm_error = result
                items.extend(Sample(f.sensor, now, math.nan, Quality.COMM_FAILURE) for f in request.fields)
                continue
            answered = True
            items.extend(samples(st, request, result, now))
        items.extend(comm_state(st, answered, comm_error, results, now))
        return items

    async def _read(self, st: DeviceState, request: Request) -> list[tuple[Request, list[int] | ModbusError]]:
        """Read with busy retries; bisect a merged request refused with exception 2."""
        dev = st.device
        loop = asyncio.get_running_loop()
        for attempt in range(dev.busy_retries + 1):
            st.health.requests += 1
            t0 = loop.time()
            try:
                words = await st.hub.read(dev.device_id, request, dev.timeout)
            except ModbusError as exc:
                st.health.errors += 1
                if isinstance(exc, ModbusTimeoutError):
                    st.health.timeouts += 1
                elif isinstance(exc, MalformedResponseError):
                    st.health.malformed += 1
                if exc.exception_code == 6 and attempt < dev.busy_retries:
                    await asyncio.sleep(dev.busy_pause)
                    continue
                if exc.exception_code == 2 and len(request.fields) > 1:
                    left, right = split(request)
                    log.info(
                        "modbus device %s: exception 2 on %s; splitting into %s and %s",
                        dev.name, request.describe(), left.describe(), right.describe(),
                    )  # fmt: skip
                    return [*(await self._read(st, left)), *(await self._read(st, right))]
                return [(request, exc)]
            st.health.last_latency = loop.time() - t0
            return [(request, words)]
        raise AssertionError("unreachable")  # pragma: no cover


def _silent(error: ModbusError) -> bool:
    """No answer at all (timeout, link down): the rest of the cycle would not be answered either.
    A malformed answer is an answer: the device's other requests go on."""
    return error.exception_code is None and not isinstance(error, MalformedResponseError)


__all__ = [
    "ERRORS",
    "DeviceHealth",
    "DeviceState",
    "Hub",
    "ModbusPoller",
    "decode_value",
    "endpoint",
    "translate",
]
