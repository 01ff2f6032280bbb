"""Register words -> values, with Telegraf's type names, byte orders and results.

One dtype table and one byte shuffle, not a decoder per width. The registers of a
value are laid out as bytes `A B C D ...` (each register big-endian on the wire);
the byte order says how to turn them into a big-endian number:

    ABCD  as is (big-endian)                 DCBA  all bytes reversed (little-endian)
    BADC  bytes swapped inside each register CDAB  register order reversed

For single-register types (8/16-bit, BIT, and each register of a STRING) ABCD and
CDAB read big-endian, DCBA and BADC byte-swapped, as in Telegraf. INT8L/UINT8L take
the low byte of that 16-bit value, INT8H/UINT8H the high byte; BIT takes bit `bit`
(0 = least significant). Without a scale, integer types stay integers (Telegraf's
"native" output); with a scale the result is `float(raw) * scale` in float64.

One deliberate difference: Telegraf strips one trailing NUL from a STRING; we strip
all trailing NUL padding, so a 10-register name does not end in NUL characters.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import partial

from monitor.errors import DecodeError

# type -> (registers, struct code of the big-endian number)
TYPES: dict[str, tuple[int, str]] = {
    "INT8L": (1, "H"),
    "INT8H": (1, "H"),
    "UINT8L": (1, "H"),
    "UINT8H": (1, "H"),
    "INT16": (1, "h"),
    "UINT16": (1, "H"),
    "INT32": (2, "i"),
    "UINT32": (2, "I"),
    "INT64": (4, "q"),
    "UINT64": (4, "Q"),
    "FLOAT16": (1, "e"),
    "FLOAT32": (2, "f"),
    "FLOAT64": (4, "d"),
    "BIT": (1, "H"),
}
BYTE_ORDERS = ("ABCD", "DCBA", "BADC", "CDAB")


def register_count(type: str, length: int | None = None) -> int:
    """How many registers a value of `type` spans (`length` for STRING)."""
    if type == "STRING":
        if not length or length < 1:
            raise DecodeError("STRING needs a length in registers")
        return length
    try:
        return TYPES[type][0]
    except KeyError:
        raise DecodeError(f"unknown type {type!r}") from None


def to_bytes(registers: Sequence[int], byte_order: str) -> bytes:
    """The registers' bytes rearranged into big-endian order."""
    if byte_order not in BYTE_ORDERS:
        raise DecodeError(f"unknown byte order {byte_order!r}; one of {', '.join(BYTE_ORDERS)}")
    try:
        raw = b"".join(r.to_bytes(2, "big") for r in registers)
    except (OverflowError, AttributeError) as exc:
        raise DecodeError(f"registers {list(registers)!r} are not 16-bit words") from exc
    if byte_order == "ABCD":
        return raw
    if byte_order == "DCBA":
        return raw[::-1]
    swapped = bytes(b for i in range(0, len(raw), 2) for b in (raw[i + 1], raw[i]))
    if byte_order == "BADC":
        return swapped
    return swapped[::-1]  # CDAB: register order reversed, bytes kept


def decode_value(
    registers: Sequence[int],
    type: str,
    byte_order: str = "ABCD",
    scale: float | None = None,
    bit: int | None = None,
) -> int | float | str:
    """Decode one value from its registers as Telegraf does; raises DecodeError."""
    if type == "STRING":
        if scale is not None:
            raise DecodeError("a STRING cannot be scaled")
        data = b"".join(to_bytes([r], byte_order) for r in registers)
        return data.rstrip(b"\x00").decode("utf-8", errors="replace")
    count = register_count(type)
    if len(registers) != count:
        raise DecodeError(f"{type} needs {count} register(s), got {len(registers)}")
    (number,) = struct.unpack(">" + TYPES[type][1], to_bytes(registers, byte_order))
    value: int | float
    if type == "BIT":
        if bit is None or not 0 <= bit <= 15:
            raise DecodeError("BIT needs a bit number 0..15 (0 is the least significant)")
        value = (number >> bit) & 1
    elif type in ("UINT8L", "INT8L"):
        value = number & 0xFF
    elif type in ("UINT8H", "INT8H"):
        value = number >> 8
    else:
        value = number
    if type in ("INT8L", "INT8H") and value >= 0x80:
        value -= 0x100
    if scale is not None:
        return float(value) * scale
    return value


Decoder = Callable[[Sequence[int]], int | float | str]


def compile_decoder(
    type: str, byte_order: str = "ABCD", scale: float | None = None, bit: int | None = None
) -> Decoder:
    """A decoder giving exactly `decode_value`'s results, with the table work done once.

    The poller's hot path: the byte shuffle becomes a choice of struct formats
    (DCBA = words reversed, each little-endian; BADC = each word little-endian;
    CDAB = words reversed), so a value costs two struct calls.
    """
    if (
        type not in TYPES
        or byte_order not in BYTE_ORDERS
        or (type == "BIT" and (bit is None or not 0 <= bit <= 15))
    ):
        return partial(_decode_checked, type=type, byte_order=byte_order, scale=scale, bit=bit)
    count, code = TYPES[type]
    swap = byte_order in ("DCBA", "BADC")
    reverse = byte_order in ("DCBA", "CDAB") and count > 1
    pack = struct.Struct(("<" if swap else ">") + "H" * count).pack
    unpack = struct.Struct(">" + code).unpack
    signed8 = type in ("INT8L", "INT8H")
    shift = 8 if type in ("INT8H", "UINT8H") else 0
    byte = type in ("INT8L", "INT8H", "UINT8L", "UINT8H")
    bit_no = bit if type == "BIT" else None

    def decode(words: Sequence[int]) -> int | float | str:
        if len(words) != count:
            raise DecodeError(f"{type} needs {count} register(s), got {len(words)}")
        try:
            (value,) = unpack(pack(*(words[::-1] if reverse else words)))
        except struct.error as exc:
            raise DecodeError(f"registers {list(words)!r} are not 16-bit words") from exc
        if bit_no is not None:
            value = (value >> bit_no) & 1
        elif byte:
            value = (value >> shift) & 0xFF
            if signed8 and value >= 0x80:
                value -= 0x100
        if scale is not None:
            return float(value) * scale
        return value  # type: ignore[no-any-return]

    return decode


def _decode_checked(
    words: Sequence[int], *, type: str, byte_order: str, scale: float | None, bit: int | None
) -> int | float | str:
    return decode_value(words, type, byte_order, scale, bit)


# The largest FLOAT32 (3.4028235e38): many PLCs send it (or FLOAT64's largest) as an
# error code. It, anything beyond it, NaN and the infinities are never a reading.
FLOAT32_MAX = 3.4028234663852886e38


def is_believable(value: int | float | str) -> bool:
    """NaN, infinities and the IEEE extremes are bad data, not readings."""
    return not isinstance(value, float) or -FLOAT32_MAX < value < FLOAT32_MAX


__all__ = [
    "BYTE_ORDERS",
    "FLOAT32_MAX",
    "TYPES",
    "Decoder",
    "compile_decoder",
    "decode_value",
    "is_believable",
    "register_count",
    "to_bytes",
]
