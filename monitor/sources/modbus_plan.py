"""Compile a device's register map once into a read plan: as few requests as allowed.

Per device and register type, fields sorted by address are merged greedily into
one request while the next field starts at most `max_gap` registers after the
current end and the request stays within the protocol's limit (125 registers or
2,000 bits). Greedy from the lowest address is optimal for this covering problem,
so the plan needs the fewest requests the map allows under that gap.

When a device refuses a merged request with exception 2 (illegal address), the
poller bisects it with `split` until each part either reads or is one field, so
only the fields at the illegal addresses go bad.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monitor.config.sources import ModbusDevice
from monitor.sources.modbus_decode import register_count

MAX_REGISTERS = 125
MAX_BITS = 2000
FUNCTION_CODE = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}
KIND_ORDER = ("coil", "discrete", "holding", "input")


@dataclass(frozen=True, slots=True)
class FieldRead:
    """One configured field, resolved to its 0-based protocol address and width."""

    index: int  # position in the device's `fields`
    sensor: str
    kind: str
    address: int
    count: int
    type: str
    byte_order: str
    scale: float | None
    offset: float
    bit: int | None
    config_address: int  # as written in the config, for messages
    bad_values: tuple[float, ...] = ()  # the device's error values, before scale and offset

    @property
    def end(self) -> int:
        return self.address + self.count

    def where(self) -> str:
        return f"{self.kind} {self.config_address}"


@dataclass(frozen=True, slots=True)
class Request:
    """One read: function code 1-4, start address, count, and the fields it feeds."""

    kind: str
    address: int
    count: int
    fields: tuple[FieldRead, ...]

    @property
    def function_code(self) -> int:
        return FUNCTION_CODE[self.kind]

    @property
    def end(self) -> int:
        return self.address + self.count

    def describe(self) -> str:
        unit = "bit" if self.kind in ("coil", "discrete") else "register"
        plural = "" if self.count == 1 else "s"
        return (
            f"FC{self.function_code} {self.kind} {self.address}..{self.end - 1} "
            f"({self.count} {unit}{plural}, {len(self.fields)} field{'s' if len(self.fields) != 1 else ''})"
        )


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """All requests of one device per poll cycle."""

    device: str
    requests: tuple[Request, ...]

    @property
    def touched(self) -> int:
        return sum(r.count for r in self.requests)

    def summary(self) -> str:
        """Telegraf's start-up line: `Got N request(s) touching M registers`."""
        n = len(self.requests)
        return f"device {self.device}: got {n} request(s) touching {self.touched} registers/bits"


def limit(kind: str) -> int:
    return MAX_BITS if kind in ("coil", "discrete") else MAX_REGISTERS


def resolve_fields(device: ModbusDevice) -> list[FieldRead]:
    """Each field with protocol address (address - address_base) and width."""
    out = []
    for i, f in enumerate(device.fields):
        bits = f.register_type in ("coil", "discrete")
        out.append(
            FieldRead(
                index=i,
                sensor=f.sensor,
                kind=f.register_type,
                address=f.address - device.address_base,
                count=1 if bits else register_count(f.type, f.length),
                type="BIT" if bits else f.type,
                byte_order=f.byte_order or device.byte_order,
                scale=f.scale,
                offset=f.offset,
                bad_values=tuple(f.bad_values),
                bit=f.bit,
                config_address=f.address,
            )
        )
    return out


def merge(fields: Sequence[FieldRead], max_gap: int) -> list[Request]:
    """Greedy merge of one register type's fields into the fewest requests."""
    requests: list[Request] = []
    ordered = sorted(fields, key=lambda f: (f.address, f.count))
    group: list[FieldRead] = []
    start = end = 0
    for f in ordered:
        if group and f.address - end <= max_gap and max(end, f.end) - start <= limit(f.kind):
            group.append(f)
            end = max(end, f.end)
            continue
        if group:
            requests.append(Request(group[0].kind, start, end - start, tuple(group)))
        group, start, end = [f], f.address, f.end
    if group:
        requests.append(Request(group[0].kind, start, end - start, tuple(group)))
    return requests


def plan_device(device: ModbusDevice) -> ReadPlan:
    fields = resolve_fields(device)
    requests: list[Request] = []
    for kind in KIND_ORDER:
        requests.extend(merge([f for f in fields if f.kind == kind], device.max_gap))
    return ReadPlan(device.name, tuple(requests))


def span(fields: Sequence[FieldRead]) -> Request:
    """One request covering exactly these fields (same register type)."""
    start = min(f.address for f in fields)
    end = max(f.end for f in fields)
    return Request(fields[0].kind, start, end - start, tuple(sorted(fields, key=lambda f: f.address)))


def split(request: Request) -> tuple[Request, Request]:
    """Bisect a multi-field request by its fields; each half spans only its own fields."""
    if len(request.fields) < 2:
        raise ValueError("a single-field request cannot be split")
    half = len(request.fields) // 2
    return span(request.fields[:half]), span(request.fields[half:])


def slice_for(request: Request, field: FieldRead, values: Sequence[int]) -> Sequence[int]:
    """The words (or bits) of `field` inside a request's answer."""
    at = field.address - request.address
    return values[at : at + field.count]


def describe(plans: Sequence[ReadPlan], devices: Sequence[ModbusDevice]) -> str:
    """What `monitor modbus plan` prints: each device's requests and the fields they feed."""
    lines = []
    total = 0
    for plan, dev in zip(plans, devices, strict=True):
        where = f"{dev.host}:{dev.port}" if dev.transport == "tcp" else str(dev.port)
        lines.append(
            f"{dev.name} ({where} unit {dev.device_id}, max_gap {dev.max_gap}, "
            f"address_base {dev.address_base}): "
            f"{len(plan.requests)} request(s) touching {plan.touched} registers/bits"
        )
        for req in plan.requests:
            lines.append(f"  {req.describe()}")
            for f in req.fields:
                extra = f" bit {f.bit}" if f.bit is not None and f.kind in ("holding", "input") else ""
                scale = f" x{f.scale:g}" if f.scale is not None else ""
                off = f" {f.offset:+g}" if f.offset else ""
                lines.append(
                    f"    {f.address:>5}  {f.type:<7} {f.byte_order}{extra}{scale}{off} -> {f.sensor}"
                    + (f" (config address {f.config_address})" if f.config_address != f.address else "")
                )
        total += len(plan.requests)
    lines.append(f"{len(plans)} device(s), {total} request(s) per cycle")
    return "\n".join(lines)


__all__ = [
    "FUNCTION_CODE",
    "MAX_BITS",
    "MAX_REGISTERS",
    "FieldRead",
    "ReadPlan",
    "Request",
    "describe",
    "merge",
    "plan_device",
    "resolve_fields",
    "slice_for",
    "span",
    "split",
]
