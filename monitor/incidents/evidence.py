"""Evidence rows in bulk: the NumPy block codec for the store, and the evidence CSV.

An incident's evidence is tens of thousands of samples (24 h before the start at 1 Hz
is 86,400), so row-at-a-time SQLite inserts and per-row `datetime.isoformat` cost more
than the engine's whole judgement of the same samples. Here a batch is one block of
three little-endian arrays, and the CSV is formatted column-wise into a byte matrix.

The CSV must be byte for byte what the row-at-a-time formatter wrote (`slow_rows`):
incidents frozen by an earlier version are verified by recomputing it, so the fast
path copies that formatter's rounding (`datetime.fromtimestamp` rounds to the
microsecond, half to even; `iso` prints milliseconds, truncated, whenever the
microsecond is not 0) and prints each distinct value once with `repr`. Times outside
years 1970-9999 take the slow path.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from monitor.model import iso

Floats = npt.NDArray[np.float64]
Quality = npt.NDArray[np.int8]
_T = np.dtype("<f8")
_Q = np.dtype("i1")
_LAST_SECOND = 253_402_300_799.0  # 9999-12-31T23:59:59Z
_CHUNK = 1 << 18  # rows formatted at a time, so a months-long incident stays in bounded memory


def encode(t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> tuple[bytes, bytes, bytes]:
    """A block's three columns as bytes (values not finite are stored as NaN: no value)."""
    values = np.where(np.isfinite(v), v, np.nan)
    return t.astype(_T).tobytes(), values.astype(_T).tobytes(), q.astype(_Q).tobytes()


def decode(t: bytes, v: bytes, q: bytes) -> tuple[Floats, Floats, Quality]:
    return (
        np.frombuffer(t, _T).astype(np.float64),
        np.frombuffer(v, _T).astype(np.float64),
        np.frombuffer(q, _Q).astype(np.int8),
    )


def slow_rows(name: str, t: Floats, v: Floats, q: Quality) -> bytes:
    """The reference formatter, one row at a time (and for times the fast path does not take)."""
    return "".join(
        f"{iso(ti)},{name},{repr(vi) if math.isfinite(vi) else ''},{qi}\n"
        for ti, vi, qi in zip(t.tolist(), v.tolist(), q.tolist(), strict=True)
    ).encode("utf-8")


def csv_rows(name: str, t: Floats, v: Floats, q: Quality) -> bytes:
    """`time,sensor,value,quality` lines for one sensor's samples, as `slow_rows` writes them."""
    if not t.size:
        return b""
    if not (np.isfinite(t).all() and t.min() >= 0.0 and t.max() < _LAST_SECOND):
        return slow_rows(name, t, v, q)
    return b"".join(
        _fast(name.encode("utf-8"), t[a : a + _CHUNK], v[a : a + _CHUNK], q[a : a + _CHUNK])
        for a in range(0, int(t.size), _CHUNK)
    )


def _text_matrix(texts: list[bytes], inverse: npt.NDArray[np.intp]) -> npt.NDArray[np.uint8]:
    """Row i: texts[inverse[i]], NUL padded (NUL bytes are dropped when the lines are joined)."""
    table = np.array(texts, dtype="S")
    return table.view(np.uint8).reshape(len(texts), table.itemsize)[inverse]


def _digits(x: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
    out = np.empty((x.size, width), np.uint8)
    for k in range(width - 1, -1, -1):
        out[:, k] = 48 + x % 10
        x = x // 10
    return out


def _fast(name: bytes, t: Floats, v: Floats, q: Quality) -> bytes:
    n = int(t.size)
    # datetime.fromtimestamp: modf, the fraction times 1e6 rounded half to even, carried.
    whole = np.floor(t)
    micro = np.round((t - whole) * 1e6)
    carry = micro >= 1e6
    micro[carry] -= 1e6
    sec = whole.astype(np.int64) + carry
    days, sod = np.divmod(sec, 86400)
    day_list, day_of = np.unique(days, return_inverse=True)
    dates = np.datetime_as_string(day_list.astype("datetime64[D]"), unit="D")
    stamp = np.empty((n, 24), np.uint8)
    stamp[:, 0:10] = _text_matrix([d.encode() for d in dates.tolist()], day_of.ravel())
    stamp[:, 10] = ord("T")
    stamp[:, 11:13] = _digits(sod // 3600, 2)
    stamp[:, 13] = ord(":")
    stamp[:, 14:16] = _digits(sod // 60 % 60, 2)
    stamp[:, 16] = ord(":")
    stamp[:, 17:19] = _digits(sod % 60, 2)
    stamp[:, 19] = ord(".")
    stamp[:, 20:23] = _digits(micro.astype(np.int64) // 1000, 3)
    stamp[micro == 0, 19:23] = 0
    stamp[:, 23] = ord("Z")
    # Values: each distinct bit pattern printed once (so -0.0 stays "-0.0"); no value: empty.
    finite = np.isfinite(v)
    bits = np.where(finite, v, 0.0).view(np.int64)
    bit_list, value_of = np.unique(bits, return_inverse=True)
    texts = [repr(x).encode() for x in bit_list.view(np.float64).tolist()]
    values = _text_matrix(texts, value_of.ravel())
    values[~finite] = 0
    q_list, q_of = np.unique(q, return_inverse=True)
    qualities = _text_matrix([str(x).encode() for x in q_list.tolist()], q_of.ravel())
    sep = np.full((n, 1), ord(","), np.uint8)
    label = np.broadcast_to(np.frombuffer(b"," + name + b",", np.uint8), (n, len(name) + 2))
    end = np.full((n, 1), ord("\n"), np.uint8)
    lines = np.hstack((stamp, label, values, sep, qualities, end))
    return lines.tobytes().translate(None, b"\0")  # bytes.translate: faster than a boolean mask
