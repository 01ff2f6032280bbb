"""What one poll cycle's answers become: samples with a quality, comm-loss conditions.

Free of pymodbus: the hub in `modbus` reads words; this module judges them. A
device's live plan (requests are bisected after exception 2), compiled decoders
and failure episodes live in its `DeviceState`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Protocol

from monitor.config.sources import ModbusDevice
from monitor.errors import DecodeError, MalformedResponseError, ModbusError
from monitor.model import Condition, ConditionState, Quality, Rule, Sample
from monitor.sources.modbus_decode import compile_decoder, is_believable
from monitor.sources.modbus_health import DeviceHealth, Episodes
from monitor.sources.modbus_plan import ReadPlan, Request

log = logging.getLogger("monitor.sources.modbus")

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


class Connection(Protocol):
    """The connection a device's requests go through (`monitor.sources.modbus.Hub`),
    as a protocol so this module does not import the pymodbus adapter."""

    key: str
    lock: asyncio.Lock
    connect_attempts: list[float]

    @property
    def connected(self) -> bool: ...

    def close(self) -> None: ...

    async def read(self, device_id: int, request: Request, timeout: float) -> list[int]: ...


class DeviceState:
    """A device's live plan (requests are split after exception 2) and bookkeeping."""

    def __init__(self, device: ModbusDevice, plan: ReadPlan, hub: Connection) -> None:
        self.device = device
        self.plan = plan
        self.requests = list(plan.requests)
        self.hub = hub
        self.sensors = list(dict.fromkeys(f.sensor for f in device.fields))
        fields = [f for r in plan.requests for f in r.fields]
        self.keys = {f.index: f"field {f.where()}" for f in fields}  # episode keys
        self.decoders = {f.index: compile_decoder(f.type, f.byte_order, f.scale, f.bit) for f in fields}
        # Fields with error values also decode unscaled, to compare what the register holds.
        self.raw_decoders = {
            f.index: compile_decoder(f.type, f.byte_order, None, f.bit) for f in fields if f.bad_values
        }
        self.health = DeviceHealth(device=device.name, endpoint=hub.key, unit=device.device_id)
        self.episodes = Episodes(log, f"modbus device {device.name} ({hub.key} unit {device.device_id})")
        self.comm_loss = False


def samples(st: DeviceState, request: Request, result: list[int] | ModbusError, now: float) -> list[Sample]:
    """Samples for the fields of one request: GOOD with the value, or BAD_DATA with NaN."""
    out = []
    if isinstance(result, ModbusError):
        hint = " (if the map counts from 1, set address_base: 1 or try address - 1)"
        for f in request.fields:
            text = f"{f.where()} -> {f.sensor}: {result}{hint if result.exception_code == 2 else ''}"
            if st.episodes.fail(st.keys[f.index], text):
                st.health.bad_fields += 1
            out.append(Sample(f.sensor, now, math.nan, Quality.BAD_DATA))
        return out
    episodes = st.episodes
    troubled = bool(episodes.ongoing)
    keys, decoders, base = st.keys, st.decoders, request.address
    for f in request.fields:
        at = f.address - base
        words = result[at : at + f.count]
        try:
            if f.kind in ("coil", "discrete"):
                raw: int | float | str = float(words[0]) * (f.scale if f.scale is not None else 1.0)
            else:
                raw = decoders[f.index](words)
            if isinstance(raw, str):
                raise DecodeError(f"{f.type} decodes to text {raw!r}, not a reading")
            value = float(raw) + f.offset
            if not (is_believable(float(raw)) and is_believable(value)):
                raise DecodeError(f"device reports {raw!r} (non-finite or an IEEE extreme)")
            if f.bad_values and f.kind not in ("coil", "discrete"):
                unscaled = st.raw_decoders[f.index](words)
                if unscaled in f.bad_values:
                    raise DecodeError(f"device reports {unscaled!r}, one of its bad_values")
        except DecodeError as exc:
            episodes.fail(keys[f.index], f"{f.where()} -> {f.sensor}: bad data: {exc}")
            out.append(Sample(f.sensor, now, math.nan, Quality.BAD_DATA))
            continue
        if troubled and keys[f.index] in episodes:
            episodes.ok(keys[f.index], f"{f.where()} -> {f.sensor}: reading again")
        out.append(Sample(f.sensor, now, value, Quality.GOOD))
    return out


def comm_state(
    st: DeviceState,
    answered: bool,
    error: ModbusError | None,
    results: list[tuple[Request, list[int] | ModbusError]],
    now: float,
) -> list[Condition]:
    """Count polls without any answer; comm-loss per sensor after `comm_loss_after`, cleared on an answer."""
    dev = st.device
    h = st.health
    if answered or error is None:
        if h.failed_in_row:
            st.episodes.ok("comm", f"answering again after {h.failed_in_row} failed poll(s)")
        h.failed_in_row = 0
        h.last_poll = now
        if st.comm_loss:
            st.comm_loss = False
            return _conditions(st, ConditionState.CLEARED, now, "answering again")
        return []
    h.failed_in_row += 1
    what = ", ".join(sorted({r.describe() for r, x in results if isinstance(x, ModbusError)}))
    st.episodes.fail("comm", f"{error} (reading {what}); sensors {', '.join(st.sensors)} now COMM_FAILURE")
    if not st.comm_loss and h.failed_in_row >= dev.comm_loss_after:
        st.comm_loss = True
        return _conditions(st, ConditionState.ACTIVE, now, f"{h.failed_in_row} failed polls: {error}")
    return []


def malformed_state(st: DeviceState, results: list[tuple[Request, list[int] | ModbusError]]) -> None:
    """Requests whose answer did not fit: logged once per episode, listed in the comm state.
    Only their fields go COMM_FAILURE; the device's other requests are read as usual."""
    invalid = []
    for request, result in results:
        key = f"answer {request.describe()}"
        if isinstance(result, MalformedResponseError):
            invalid.append(request.describe())
            st.episodes.fail(
                key, f"malformed answer to {request.describe()}: {result}; only its fields are lost"
            )
        elif not isinstance(result, ModbusError) and key in st.episodes:
            st.episodes.ok(key, f"{request.describe()} answered properly again")
    st.health.invalid_requests = tuple(invalid)


def _conditions(st: DeviceState, state: ConditionState, now: float, why: str) -> list[Condition]:
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


__all__ = ["COMM_CODES", "EXCEPTION_NAMES", "DeviceState", "comm_state", "malformed_state", "samples"]
