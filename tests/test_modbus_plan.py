"""Request planning: fewest reads under the protocol limits and max_register_gap; bisecting."""

from __future__ import annotations

from typing import Any

from monitor.sources.modbus_plan import plan_device, split
from tests.modbus_support import device


def spans(fields: list[dict[str, Any]], **kw: Any) -> list[tuple[str, int, int]]:
    plan = plan_device(device("d", 502, fields, **kw))
    return [(r.kind, r.address, r.count) for r in plan.requests]


def u16(address: int, register: str = "holding") -> dict[str, Any]:
    return {"sensor": f"s{address}", "register": register, "address": address, "type": "UINT16"}


def test_gap_up_to_max_register_gap_is_read_through_and_one_more_splits() -> None:
    assert spans([u16(0), u16(11)], max_register_gap=10) == [("holding", 0, 12)]  # 10 unused between
    assert spans([u16(0), u16(12)], max_register_gap=10) == [("holding", 0, 1), ("holding", 12, 1)]
    assert spans([u16(0), u16(1)], max_register_gap=0) == [("holding", 0, 2)]


def test_a_request_never_exceeds_125_registers_or_2000_bits() -> None:
    regs = [u16(a) for a in range(0, 300)]
    expected = [("holding", 0, 125), ("holding", 125, 125), ("holding", 250, 50)]
    assert spans(regs, max_register_gap=0) == expected
    wide = [
        {"sensor": f"f{a}", "address": a, "type": "FLOAT64"} for a in range(0, 128, 4)
    ]  # 32 x 4 registers
    assert spans(wide) == [("holding", 0, 124), ("holding", 124, 4)]  # a value is never cut in two
    bits = [{"sensor": f"c{a}", "register": "coil", "address": a, "type": "BIT"} for a in range(2100)]
    assert spans(bits) == [("coil", 0, 2000), ("coil", 2000, 100)]


def test_register_types_never_mix_and_order_is_fc1_to_fc4() -> None:
    fields = [
        u16(0, "input"),
        u16(0, "holding"),
        {"sensor": "c", "register": "discrete", "address": 3, "type": "BIT"},
    ]
    assert spans(fields) == [("discrete", 3, 1), ("holding", 0, 1), ("input", 0, 1)]


def test_overlapping_fields_share_a_read_and_address_base_1_shifts() -> None:
    fields = [
        {"sensor": "a", "address": 1, "type": "FLOAT32"},
        {"sensor": "b", "address": 2, "type": "UINT16"},  # low word of a, read again as a field
        {"sensor": "c", "address": 10, "type": "STRING", "length": 3},
    ]
    assert spans(fields, address_base=1) == [("holding", 0, 12)]


def test_split_bisects_by_fields_and_each_half_spans_only_its_fields() -> None:
    (req,) = plan_device(device("d", 502, [u16(0), u16(5), u16(9), u16(14)])).requests
    left, right = split(req)
    assert (left.address, left.count, len(left.fields)) == (0, 6, 2)
    assert (right.address, right.count, len(right.fields)) == (9, 6, 2)


def test_pymodbus_is_imported_in_the_adapter_only() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "monitor"
    importers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if any(
            line.lstrip().startswith(("import pymodbus", "from pymodbus"))
            for line in p.read_text().splitlines()
        )
    )
    assert importers == ["sources/modbus.py"]
