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
_INT_DIGITS = 11  # values below 1e11 are printed from integers
_DECIMALS = 4  # with up to four decimals (0.0001 is the smallest `repr` prints without an exponent)
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


def _value_texts(x: Floats) -> npt.NDArray[np.uint8]:
    """`repr` of each finite value as NUL-padded rows (what is not finite: all NUL).

    A value with at most four decimals (most readings) is printed from integers, row by
    row without a sort: the fewest decimals k whose decimal rint(|x| 10^k) / 10^k parses
    back to x give `repr`'s shortest round trip, because below 1e11 two k-decimal
    numbers lie further apart than the spacing of doubles. The rest (exponent notation,
    more decimals) goes through `repr`, each distinct bit pattern once (-0.0 stays "-0.0")."""
    a = np.abs(x)
    k_of = np.zeros(x.size, np.int64)
    m_of = np.zeros(x.size, np.int64)
    todo = np.flatnonzero((a < 1e11) & ((a >= 1e-4) | (a == 0.0)))
    for k in range(1, _DECIMALS + 1):
        if not todo.size:
            break
        scale = 10.0**k
        m = np.rint(a[todo] * scale)
        hit = m / scale == a[todo]
        k_of[todo[hit]] = k
        m_of[todo[hit]] = m[hit].astype(np.int64)
        todo = todo[~hit]
    done = np.flatnonzero(k_of)
    k, m = k_of[done], m_of[done]
    whole, frac = np.divmod(m, 10**k)
    width = len(str(int(whole.max()))) if whole.size else 1
    rest = np.flatnonzero((k_of == 0) & np.isfinite(x))
    bit_list, text_of = np.unique(x[rest].view(np.int64), return_inverse=True)
    texts = [repr(v).encode() for v in bit_list.view(np.float64).tolist()]
    out = np.zeros((x.size, max([width + _DECIMALS + 2, *map(len, texts)])), np.uint8)
    if texts:
        table = _text_matrix(texts, text_of.ravel())
        out[rest, : table.shape[1]] = table
    mat = np.zeros((k.size, width + _DECIMALS + 2), np.uint8)
    mat[:, 0] = np.where(np.signbit(x[done]), ord("-"), 0)
    power = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    shown = (whole[:, None] >= power[None, :]) | (power[None, :] == 1)
    mat[:, 1 : 1 + width] = np.where(shown, _digits(whole, width), 0)
    mat[:, 1 + width] = ord(".")
    decimals = _digits(frac * 10 ** (_DECIMALS - k), _DECIMALS)
    mat[:, 2 + width :] = np.where(np.arange(_DECIMALS)[None, :] < k[:, None], decimals, 0)
    out[done, : mat.shape[1]] = mat
    return out


def _dense_unique(x: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """`np.unique(x, return_inverse=True)` for integers in a narrow range (days of a
    day's evidence): a count instead of a sort."""
    lo = int(x.min())
    span = int(x.max()) - lo
    if span > 4 * x.size + 1024:
        values, inverse = np.unique(x, return_inverse=True)
        return values, inverse.ravel()
    present = np.bincount(x - lo, minlength=span + 1) > 0
    rank = np.cumsum(present) - 1
    return lo + np.flatnonzero(present), rank[x - lo]


def _fast(name: bytes, t: Floats, v: Floats, q: Quality) -> bytes:
    n = int(t.size)
    # datetime.fromtimestamp: modf, the fraction times 1e6 rounded half to even, carried.
    whole = np.floor(t)
    micro = np.round((t - whole) * 1e6)
    carry = micro >= 1e6
    micro[carry] -= 1e6
    sec = whole.astype(np.int64) + carry
    days, sod = np.divmod(sec, 86400)
    day_list, day_of = _dense_unique(days)
    dates = np.datetime_as_string(day_list.astype("datetime64[D]"), unit="D")
    stamp = np.empty((n, 24), np.uint8)
    stamp[:, 0:10] = _text_matrix([d.encode() for d in dates.tolist()], day_of)
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
    values = _value_texts(v)  # no value (not finite): empty
    q_list, q_of = _dense_unique(q.astype(np.int64))
    qualities = _text_matrix([str(x).encode() for x in q_list.tolist()], q_of)
    sep = np.full((n, 1), ord(","), np.uint8)
    label = np.broadcast_to(np.frombuffer(b"," + name + b",", np.uint8), (n, len(name) + 2))
    end = np.full((n, 1), ord("\n"), np.uint8)
    lines = np.hstack((stamp, label, values, sep, qualities, end))
    return lines.tobytes().translate(None, b"\0")  # bytes.translate: faster than a boolean mask
