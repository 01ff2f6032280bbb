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
from functools import cache

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


@cache
def _tables() -> tuple[npt.NDArray[np.uint8], ...]:
    """Texts looked up instead of computed digit by digit: whole numbers 0..9999 (right
    aligned, NUL before), fractions .0000..9999 as `repr` ends them (trailing zeros
    dropped, one digit kept), `HH:MM:SS` of each second of a day, `.mmm` (last row: none)."""
    ints = np.array([str(i).rjust(4, "\0").encode() for i in range(10_000)], "S4")
    fracs = np.array([("." + f"{i:04d}".rstrip("0")).ljust(2, "0").encode() for i in range(10_000)], "S5")
    hms = np.array([f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}".encode() for s in range(86400)], "S8")
    millis = np.array([f".{i:03d}".encode() for i in range(1000)] + [b""], "S4")
    return tuple(x.view(np.uint8).reshape(x.size, x.itemsize) for x in (ints, fracs, hms, millis))


def _value_texts(x: Floats) -> npt.NDArray[np.uint8]:
    """`repr` of each finite value as NUL-padded rows (what is not finite: all NUL).

    A value with at most four decimals (most readings) is printed from integers, row by
    row without a sort: when the decimal m / 10^4, m = rint(|x| 10^4), parses back to x,
    it with its trailing zeros dropped is `repr`'s shortest round trip, because below
    1e11 two numbers of up to four decimals lie further apart than the spacing of
    doubles. The rest (exponent notation, more decimals) goes through `repr`, each
    distinct bit pattern once (-0.0 stays "-0.0")."""
    ints, fracs, _, _ = _tables()
    a = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):  # huge and not finite: not exact, below
        m = np.rint(a * 1e4)
        exact = (m / 1e4 == a) & (a < 1e11) & ((a >= 1e-4) | (a == 0.0))
    done = np.flatnonzero(exact)
    whole, frac = np.divmod(m[done].astype(np.int64), 10_000)
    if whole.size and int(whole.max()) >= 10_000:
        width = len(str(int(whole.max())))
        power = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
        shown = (whole[:, None] >= power[None, :]) | (power[None, :] == 1)
        int_text = np.where(shown, _digits(whole, width), 0).astype(np.uint8)
    else:
        int_text = ints[whole]
    mat = np.hstack(
        (np.where(np.signbit(x[done]), ord("-"), 0).astype(np.uint8)[:, None], int_text, fracs[frac])
    )
    rest = np.flatnonzero(~exact & np.isfinite(x))
    bit_list, text_of = np.unique(x[rest].view(np.int64), return_inverse=True)
    texts = [repr(v).encode() for v in bit_list.view(np.float64).tolist()]
    if not texts:
        if done.size == x.size:
            return mat
        out = np.zeros((x.size, mat.shape[1]), np.uint8)
    else:
        out = np.zeros((x.size, max([mat.shape[1], *map(len, texts)])), np.uint8)
        table = _text_matrix(texts, text_of.ravel())
        out[rest, : table.shape[1]] = table
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
    _, _, hms, millis = _tables()
    stamp = np.empty((n, 24), np.uint8)
    stamp[:, 0:10] = _text_matrix([d.encode() for d in dates.tolist()], day_of)
    stamp[:, 10] = ord("T")
    stamp[:, 11:19] = hms[sod]
    stamp[:, 19:23] = millis[np.where(micro == 0, 1000, micro.astype(np.int64) // 1000)]
    stamp[:, 23] = ord("Z")
    values = _value_texts(v)  # no value (not finite): empty
    q_list, q_of = _dense_unique(q.astype(np.int64))
    qualities = _text_matrix([str(x).encode() for x in q_list.tolist()], q_of)
    sep = np.full((n, 1), ord(","), np.uint8)
    label = np.broadcast_to(np.frombuffer(b"," + name + b",", np.uint8), (n, len(name) + 2))
    end = np.full((n, 1), ord("\n"), np.uint8)
    lines = np.hstack((stamp, label, values, sep, qualities, end))
    return lines.tobytes().translate(None, b"\0")  # bytes.translate: faster than a boolean mask
