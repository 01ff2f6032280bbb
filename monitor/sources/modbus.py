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
`modbus_plan`, decoding in `modbus_decode`, per-device bookkeeping in `modbus_health`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from pymodbus.client import AsyncModbusSerialClient, AsyncModbusTcpClient
from pymodbus.exceptions import ModbusException

from monitor.config.sources import ModbusDevice
from monitor.errors import DecodeError, ModbusError
from monitor.model import Clock, Condition, ConditionState, Emit, Quality, Rule, Sample, WallClock
from monitor.sources.modbus_decode import decode_value, is_believable
from monitor.sources.modbus_health import DeviceHealth, Episodes
from monitor.sources.modbus_plan import ReadPlan, Request, plan_device, slice_for, split

log = logging.getLogger(__name__)

EXCEPTION_NAMES = {
    1: "illegal function",
    2: "illegal data address",
    3: "illegal data value",
    4: "device failure",
    5: "acknowledge",
    6: "device busy",
    10: "gateway path unavailable",
    11: "gateway target failed to respond",
}
# Exception codes that mean "no reading this time", not "this field is wrong".
COMM_CODES = frozenset({5, 6, 10, 11})


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
    ) -> None:
        self.key = endpoint(device)
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
                d.host or "127.0.0.1", port=int(d.port), timeout=d.timeout, retries=0, reconnect_delay=0
            )
        return AsyncModbusSerialClient(
            str(d.port),
            baudrate=d.baudrate,
            parity=d.parity,
            stopbits=d.stopbits,
            bytesize=d.bytesize,
            timeout=d.timeout,
            retries=0,
            reconnect_delay=0,
        )

    def backoff(self) -> float:
        """Exponential backoff with full jitter in [50 %, 100 %] of the step."""
        step: float = min(self._max, self._base * 2.0 ** max(0, self.connect_failures - 1))
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
            response = await asyncio.wait_for(
                call(request.address, count=request.count, device_id=device_id), timeout
            )
        except TimeoutError:
            self.close()
            raise ModbusError(f"{self.key}: timeout after {timeout:g}s") from None
        except ModbusException as exc:
            self.close()  # pymodbus' own timeout or a broken frame: start clean
            text = "timeout" if "No response" in str(exc) else str(exc)
            raise ModbusError(f"{self.key}: {text}") from exc
        if response.isError():
            code = int(getattr(response, "exception_code", 0) or 0)
            name = EXCEPTION_NAMES.get(code, "unknown")
            raise ModbusError(f"{self.key}: exception {code} ({name})", exception_code=code)
        if request.kind in ("coil", "discrete"):
            return [int(bool(b)) for b in response.bits[: request.count]]
        words = [int(w) for w in response.registers]
        if len(words) != request.count:
            self.close()
            raise ModbusError(f"{self.key}: asked for {request.count} registers, got {len(words)}")
        return words


class DeviceState:
    """A device's live plan (requests are split after exception 2) and bookkeeping."""

    def __init__(self, device: ModbusDevice, plan: ReadPlan, hub: Hub) -> None:
        self.device = device
        self.plan = plan
        self.requests = list(plan.requests)
        self.hub = hub
        self.sensors = list(dict.fromkeys(f.sensor for f in device.fields))
        self.health = DeviceHealth(device=device.name, endpoint=hub.key, unit=device.device_id)
        self.episodes = Episodes(log, f"modbus device {device.name} ({hub.key} unit {device.device_id})")
        self.comm_loss = False


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
                hubs[key] = Hub(
                    dev, rng=rng, reconnect_delay=reconnect_delay, reconnect_delay_max=reconnect_delay_max
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
            await asyncio.gather(*tasks)
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
        while True:
            try:
                emit(await self.poll(st.device.name))
            except Exception:  # a bug must not stop the other devices or this one's schedule
                if st.episodes.fail("internal", "poll cycle failed unexpectedly", exc_info=True):
                    st.health.errors += 1
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
        async with st.hub.lock:
            for i, request in enumerate(st.requests):
                if i and dev.pause:
                    await asyncio.sleep(dev.pause)
                results.extend(await self._read(st, request))
            if dev.close_after_cycle:
                st.hub.close()
        st.requests = [r for r, _ in results]
        now = self.clock.now()
        st.health.last_cycle = loop.time() - began
        st.health.cycles += 1
        items: list[Sample | Condition] = []
        answered = False
        comm_error: ModbusError | None = None
        for request, result in results:
            if isinstance(result, ModbusError) and (
                result.exception_code is None or result.exception_code in COMM_CODES
            ):
                comm_error = result
                items.extend(Sample(f.sensor, now, math.nan, Quality.COMM_FAILURE) for f in request.fields)
                continue
            answered = True
            items.extend(self._samples(st, request, result, now))
        items.extend(self._comm_state(st, answered, comm_error, results, now))
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
                if "timeout" in str(exc):
                    st.health.timeouts += 1
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

    def _samples(
        self, st: DeviceState, request: Request, result: list[int] | ModbusError, now: float
    ) -> list[Sample]:
        out = []
        for f in request.fields:
            key = f"field {f.where()}"
            if isinstance(result, ModbusError):
                hint = " (if the map counts from 1, set address_base: 1 or try address - 1)"
                if st.episodes.fail(
                    key, f"{f.where()} -> {f.sensor}: {result}{hint if result.exception_code == 2 else ''}"
                ):
                    st.health.bad_fields += 1
                out.append(Sample(f.sensor, now, math.nan, Quality.BAD_DATA))
                continue
            try:
                words = slice_for(request, f, result)
                if f.kind in ("coil", "discrete"):
                    raw: int | float | str = float(words[0]) * (f.scale if f.scale is not None else 1.0)
                else:
                    raw = decode_value(words, f.type, f.byte_order, f.scale, f.bit)
                if isinstance(raw, str):
                    raise DecodeError(f"{f.type} decodes to text {raw!r}, not a reading")
                if not is_believable(raw):
                    raise DecodeError(f"device reports {raw}")
                value = float(raw) + f.offset
            except DecodeError as exc:
                st.episodes.fail(key, f"{f.where()} -> {f.sensor}: bad data: {exc}")
                out.append(Sample(f.sensor, now, math.nan, Quality.BAD_DATA))
                continue
            st.episodes.ok(key, f"{f.where()} -> {f.sensor}: reading again")
            out.append(Sample(f.sensor, now, value, Quality.GOOD))
        return out

    def _comm_state(
        self,
        st: DeviceState,
        answered: bool,
        error: ModbusError | None,
        results: list[tuple[Request, list[int] | ModbusError]],
        now: float,
    ) -> list[Condition]:
        dev = st.device
        h = st.health
        if answered or error is None:
            if h.failed_in_row:
                st.episodes.ok("comm", f"answering again after {h.failed_in_row} failed poll(s)")
            h.failed_in_row = 0
            h.last_poll = now
            if st.comm_loss:
                st.comm_loss = False
                return self._conditions(st, ConditionState.CLEARED, now, "answering again")
            return []
        h.failed_in_row += 1
        what = ", ".join(sorted({r.describe() for r, x in results if isinstance(x, ModbusError)}))
        st.episodes.fail(
            "comm", f"{error} (reading {what}); sensors {', '.join(st.sensors)} now COMM_FAILURE"
        )
        if not st.comm_loss and h.failed_in_row >= dev.comm_loss_after:
            st.comm_loss = True
            return self._conditions(
                st, ConditionState.ACTIVE, now, f"{h.failed_in_row} failed polls: {error}"
            )
        return []

    def _conditions(self, st: DeviceState, state: ConditionState, now: float, why: str) -> list[Condition]:
        """One comm-loss condition per sensor the device feeds."""
        message = f"modbus device {st.device.name} ({st.hub.key} unit {st.device.device_id}): {why}"
        return [
            Condition(
                time=now,
                sensor=sensor,
                rule=Rule.COMM_LOSS,
                state=state,
                value=float(st.health.failed_in_row),
                limit=float(st.device.comm_loss_after),
                citation="",
                message=message,
                extra={"device": st.device.name, "endpoint": st.hub.key},
            )
            for sensor in st.sensors
        ]


__all__ = ["DeviceHealth", "Hub", "ModbusPoller", "decode_value", "endpoint"]
