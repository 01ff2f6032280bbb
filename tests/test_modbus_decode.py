"""decode_value against hand-computed register images, every type and byte order.

The expected values follow Telegraf's request-style conversions: for a 32-bit value
0x01020304 the wire registers are ABCD [0x0102, 0x0304], DCBA [0x0403, 0x0201],
BADC [0x0201, 0x0403], CDAB [0x0304, 0x0102].
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.errors import DecodeError
from monitor.sources.modbus import decode_value
from monitor.sources.modbus_decode import TYPES, compile_decoder, register_count
from tests.examples import examples

ORDERS = ("ABCD", "DCBA", "BADC", "CDAB")

# 32-bit image of bytes 01 02 03 04 under each byte order
IMG32 = {
    "ABCD": [0x0102, 0x0304],
    "DCBA": [0x0403, 0x0201],
    "BADC": [0x0201, 0x0403],
    "CDAB": [0x0304, 0x0102],
}
# 64-bit image of bytes 01 .. 08
IMG64 = {
    "ABCD": [0x0102, 0x0304, 0x0506, 0x0708],
    "DCBA": [0x0807, 0x0605, 0x0403, 0x0201],
    "BADC": [0x0201, 0x0403, 0x0605, 0x0807],
    "CDAB": [0x0708, 0x0506, 0x0304, 0x0102],
}


def image(words_abcd: list[int], order: str) -> list[int]:
    """Lay out the big-endian words of a value as a device using `order` would."""
    raw = b"".join(w.to_bytes(2, "big") for w in words_abcd)
    if order == "DCBA":
        raw = raw[::-1]
    elif order == "BADC":
        raw = bytes(b for i in range(0, len(raw), 2) for b in (raw[i + 1], raw[i]))
    elif order == "CDAB":
        raw = b"".join(raw[i : i + 2] for i in range(len(raw) - 2, -1, -2))
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def test_the_image_helper_matches_the_hand_written_tables() -> None:
    for order in ORDERS:
        assert image([0x0102, 0x0304], order) == IMG32[order]
        assert image([0x0102, 0x0304, 0x0506, 0x0708], order) == IMG64[order]


@pytest.mark.parametrize("order", ORDERS)
def test_32_bit_integers(order: str) -> None:
    assert decode_value(IMG32[order], "UINT32", order) == 0x01020304  # 16909060
    assert decode_value(IMG32[order], "INT32", order) == 16909060
    neg = image([0xFFFF, 0xFFFE], order)  # -2
    assert decode_value(neg, "INT32", order) == -2
    assert decode_value(neg, "UINT32", order) == 4294967294


@pytest.mark.parametrize("order", ORDERS)
def test_64_bit_integers(order: str) -> None:
    assert decode_value(IMG64[order], "INT64", order) == 0x0102030405060708  # 72623859790382856
    assert decode_value(IMG64[order], "UINT64", order) == 72623859790382856
    neg = image([0xFFFF, 0xFEE0, 0x8E04, 0xFB35], order)  # -1234567890123
    assert decode_value(neg, "INT64", order) == -1234567890123
    assert decode_value(neg, "UINT64", order) == 2**64 - 1234567890123
    top = image([0xFFFF] * 4, order)
    assert decode_value(top, "UINT64", order) == 18446744073709551615
    assert decode_value(top, "INT64", order) == -1


@pytest.mark.parametrize("order", ORDERS)
def test_floats(order: str) -> None:
    assert decode_value(image([0x3FC0, 0x0000], order), "FLOAT32", order) == 1.5
    assert decode_value(image([0xC020, 0x0000], order), "FLOAT32", order) == -2.5
    assert decode_value(image([0xBFF8, 0, 0, 0], order), "FLOAT64", order) == -1.5
    # 0x4049 0x0FDB is float32(pi); the result is that float32 widened, as in Go
    assert decode_value(image([0x4049, 0x0FDB], order), "FLOAT32", order) == 3.1415927410125732
    assert math.isnan(float(decode_value(image([0x7FC0, 0x0000], order), "FLOAT32", order)))


@pytest.mark.parametrize(
    ("order", "swapped"), [("ABCD", False), ("CDAB", False), ("DCBA", True), ("BADC", True)]
)
def test_16_bit_and_8_bit_types(order: str, swapped: bool) -> None:
    def reg(word: int) -> list[int]:
        return [((word & 0xFF) << 8) | (word >> 8)] if swapped else [word]

    assert decode_value(reg(0xFED4), "INT16", order) == -300
    assert decode_value(reg(0xFED4), "UINT16", order) == 65236
    assert decode_value(reg(0x3E00), "FLOAT16", order) == 1.5
    assert decode_value(reg(0xC000), "FLOAT16", order) == -2.0
    # 0x12FE: high byte 0x12 = 18, low byte 0xFE = 254 / -2
    assert decode_value(reg(0x12FE), "INT8L", order) == -2
    assert decode_value(reg(0x12FE), "UINT8L", order) == 254
    assert decode_value(reg(0x12FE), "INT8H", order) == 18
    assert decode_value(reg(0xFE12), "INT8H", order) == -2
    assert decode_value(reg(0xFE12), "UINT8H", order) == 254
    assert decode_value(reg(0x8001), "BIT", order, bit=0) == 1
    assert decode_value(reg(0x8001), "BIT", order, bit=15) == 1
    assert decode_value(reg(0x8001), "BIT", order, bit=1) == 0


def test_raw_16_bit_swap_by_hand() -> None:
    assert decode_value([0xD4FE], "INT16", "DCBA") == -300
    assert decode_value([0xD4FE], "INT16", "BADC") == -300
    assert decode_value([0xD4FE], "INT16", "CDAB") == -11010  # 0xD4FE big-endian
    assert decode_value([0x0180], "BIT", "DCBA", bit=15) == 1


def test_strings() -> None:
    regs = [0x5055, 0x4D50, 0x3100]  # "PU" "MP" "1\0"
    assert decode_value(regs, "STRING") == "PUMP1"
    assert decode_value(regs, "STRING", "CDAB") == "PUMP1"
    assert decode_value([0x5550, 0x504D, 0x0031], "STRING", "DCBA") == "PUMP1"
    assert decode_value([0x5550, 0x504D, 0x0031], "STRING", "BADC") == "PUMP1"
    assert decode_value([0x4142, 0, 0], "STRING") == "AB"  # NUL padding stripped


def test_scale_multiplies_in_float64() -> None:
    assert decode_value([250], "UINT16", scale=0.01) == 2.5
    assert decode_value([0xFED4], "INT16", scale=0.1) == -300 * 0.1
    assert decode_value(IMG32["CDAB"], "UINT32", "CDAB", scale=2.0) == 33818120.0
    assert isinstance(decode_value([7], "UINT16", scale=1.0), float)
    assert isinstance(decode_value([7], "UINT16"), int)


def test_bad_input_raises_decode_error() -> None:
    with pytest.raises(DecodeError, match="needs 2 register"):
        decode_value([1], "FLOAT32")
    with pytest.raises(DecodeError, match="unknown type"):
        decode_value([1], "INT24")
    with pytest.raises(DecodeError, match="byte order"):
        decode_value([1, 2], "INT32", "ADCB")
    with pytest.raises(DecodeError, match="bit number"):
        decode_value([1], "BIT")
    with pytest.raises(DecodeError, match="16-bit"):
        decode_value([70000], "UINT16")
    assert register_count("STRING", 5) == 5 and register_count("FLOAT64") == 4


@settings(max_examples=examples(300), deadline=None)
@given(
    words=st.lists(st.integers(0, 0xFFFF), min_size=4, max_size=4),
    type=st.sampled_from(sorted(TYPES)),
    order=st.sampled_from(ORDERS),
    scale=st.one_of(st.none(), st.floats(0.001, 1000)),
    bit=st.integers(0, 15),
)
def test_the_pollers_compiled_decoder_agrees_with_decode_value(
    words: list[int], type: str, order: str, scale: float | None, bit: int
) -> None:
    regs = words[: register_count(type)]
    b = bit if type == "BIT" else None
    want = decode_value(regs, type, order, scale, b)
    got = compile_decoder(type, order, scale, b)(regs)
    assert isinstance(got, type_of(want))
    assert got == want or (math.isnan(float(got)) and math.isnan(float(want)))


def type_of(x: object) -> type[int] | type[float]:
    return float if isinstance(x, float) else int
