"""Evidence rows in bulk: the evidence CSV (the store's block codec is `blocks.py`).

An incident's evidence is tens of thousands of samples (24 h before the start at 1 Hz
is 86,400), so row-at-a-time SQLite inserts and per-row `datetime.isoformat` cost more
than the engine's whole judgement of the same samples. Here a batch is one block of
three columns (`blocks.py`), and the CSV is formatted column-wise: each line a row of
8-byte words ORed together from tables of texts (`_words`), NUL bytes dropped at the end
(a byte matrix put together from parts took twice as long).

The CSV must be byte for byte what the row-at-a-time formatter wrote (`slow_rows`):
incidents frozen by an earlier version are verified by recomputing it, so the fast
path copies that formatter's rounding (`datetime.fromtimestamp` rounds to the
microsecond, half to even; `iso` prints milliseconds, truncated, whenever the
microsecond is not 0) and prints each distinct value once with `repr`. Times outside
years 1970-9999 take the slow path.

`parse_csv` reads such a file back into columns: the export of a frozen incident whose
store blocks were damaged after the freeze is built from its verified file.
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


def slow_rows(name: str, t: Floats, v: Floats, q: Quality) -> bytes:
    """The reference formatter, one row at a time (and for times the fast path does not take)."""
    return "".join(
        f"{iso(ti)},{name},{repr(vi) if math.isfinite(vi) else ''},{qi}\n"
        for ti, vi, qi in zip(t.tolist(), v.tolist(), q.tolist(), strict=True)
    ).encode("utf-8")


HEADER = b"time,sensor,value,quality"


class EvidenceFileError(ValueError):
    """Bytes that are not an evidence CSV as `csv_rows` writes it."""


# The two shapes `iso` writes, byte by byte (`9`: any digit; NUL: an array's padding).
_SHAPES = np.frombuffer(b"9999-99-99T99:99:99Z\0\0\0\09999-99-99T99:99:99.999Z", np.uint8).reshape(2, 24)


def parse_csv(data: bytes) -> dict[str, tuple[Floats, Floats, Quality]]:
    """The columns of an evidence CSV (`HEADER`, then `csv_rows` of each sensor), by sensor
    in the file's order. Values come back bit for bit (`repr` round-trips; empty: NaN),
    times at the millisecond the file holds (`iso` prints no finer). The fields are split
    all at once (a day of two sensors, 180,000 lines: 0.09-0.18 s, a line at a time
    0.24-0.58 s on a busy machine); a name with a comma (config allows none) is read whole
    all the same, line by line."""
    lines = data.count(b"\n")
    if not data.startswith(HEADER + b"\n") or not data.endswith(b"\n"):
        raise EvidenceFileError("not an evidence CSV: no header line, or no newline at its end")
    flat = data[len(HEADER) + 1 : -1].replace(b"\n", b",").split(b",") if lines > 1 else []
    if len(flat) == 4 * (lines - 1):
        stamps, names, values, quality = flat[::4], flat[1::4], flat[2::4], flat[3::4]
    else:
        stamps, names, values, quality = _fields(data.split(b"\n")[1:-1])
    # Only the shapes `iso` writes, nothing else: numpy warns about a zone (a Z, or an offset
    # such as -0500 left once the Z is dropped) from a worker loop, and numpy 2.4.6 segfaults
    # when it does so for 501 bytes strings (S) or more; 500 pass, str (U) arrays do not crash.
    mat = _stamp_matrix(np.array(stamps, dtype="S"))
    mat[mat == ord("Z")] = 0
    try:
        ms = mat.view(f"S{mat.shape[1]}").ravel().astype("datetime64[ms]").astype(np.int64)
        text = np.array(values, dtype="S")
        v = np.where(text == b"", b"nan", text).astype(np.float64)  # (wide enough for "nan")
        q = np.array(quality, dtype="S").astype(np.int8)
    except (ValueError, OverflowError) as exc:
        raise EvidenceFileError(f"not an evidence CSV: {exc}") from exc
    t = ms / 1000.0
    of = np.array(names, dtype="S")
    out = {}
    for name in dict.fromkeys(names):
        pick = of == name
        out[name.decode("utf-8")] = (t[pick], v[pick], q[pick])
    return out


def _stamp_matrix(stamps: npt.NDArray[np.bytes_]) -> npt.NDArray[np.uint8]:
    """The times as a byte matrix, 24 wide, once each is one of `_SHAPES` (else the error)."""
    width = stamps.itemsize if stamps.size else 24
    if width > 24:
        raise EvidenceFileError("not an evidence CSV: a time not in ISO 8601 UTC ending in Z")
    mat = np.zeros((stamps.size, 24), np.uint8)
    mat[:, :width] = stamps.view(np.uint8).reshape(stamps.size, width)
    digit = (mat >= ord("0")) & (mat <= ord("9"))
    fits = np.zeros(stamps.size, np.bool_)
    for shape in _SHAPES:
        wild = shape == ord("9")
        fits |= ((mat == shape) | (digit & wild)).all(axis=1)
    if not fits.all():
        raise EvidenceFileError("not an evidence CSV: a time not in ISO 8601 UTC ending in Z")
    return mat


def _fields(rows: list[bytes]) -> tuple[list[bytes], list[bytes], list[bytes], list[bytes]]:
    """`parse_csv`'s columns a line at a time: the name between the time's comma and the value's."""
    out: tuple[list[bytes], list[bytes], list[bytes], list[bytes]] = ([], [], [], [])
    for number, row in enumerate(rows, start=2):
        stamp, _, rest = row.partition(b",")
        fields = rest.rsplit(b",", 2)
        if len(fields) != 3:
            raise EvidenceFileError(f"line {number} is not time,sensor,value,quality: {row[:80]!r}")
        for column, field in zip(out, (stamp, *fields), strict=True):
            column.append(field)
    return out


def csv_rows(name: str, t: Floats, v: Floats, q: Quality) -> bytes:
    """`time,sensor,value,quality` lines for one sensor's samples, as `slow_rows` writes them."""
    return b"".join(csv_parts(name, t, v, q))


def csv_parts(name: str, t: Floats, v: Floats, q: Quality) -> list[bytes | bytearray]:
    """`csv_rows` in the parts it is made of (a chunk of rows each), not joined: a file is
    written and hashed part by part, without a copy of the whole."""
    if not t.size:
        return []
    if not (np.isfinite(t).all() and t.min() >= 0.0 and t.max() < _LAST_SECOND):
        return [slow_rows(name, t, v, q)]
    return [
        _fast(name.encode("utf-8"), t[a : a + _CHUNK], v[a : a + _CHUNK], q[a : a + _CHUNK])
        for a in range(0, int(t.size), _CHUNK)
    ]


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
    dropped, one digit kept)."""
    ints = np.array([str(i).rjust(4, "\0").encode() for i in range(10_000)], "S4")
    fracs = np.array([("." + f"{i:04d}".rstrip("0")).ljust(2, "0").encode() for i in range(10_000)], "S5")
    return tuple(x.view(np.uint8).reshape(x.size, x.itemsize) for x in (ints, fracs))


def _value_texts(x: Floats) -> npt.NDArray[np.uint8]:
    """`repr` of each finite value as NUL-padded rows (what is not finite: all NUL).

    A value with at most four decimals (most readings) is printed from integers, row by
    row without a sort: when the decimal m / 10^4, m = rint(|x| 10^4), parses back to x,
    it with its trailing zeros dropped is `repr`'s shortest round trip, because below
    1e11 two numbers of up to four decimals lie further apart than the spacing of
    doubles. The rest (exponent notation, more decimals) goes through `repr`, each
    distinct bit pattern once (-0.0 stays "-0.0")."""
    ints, fracs = _tables()
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


@cache
def _words() -> tuple[npt.NDArray[np.uint64], ...]:
    """`_fast`'s tables: each text at its byte offset in an 8-byte word, NULs around it, so a
    line is put together from a few words ORed (the byte order is the machine's either way).

    A line is 8-byte words: `YYYY-MM-`, `DDTHH:MM`, `:SS.mmmZ` (`:SS\\0\\0\\0\\0Z` without
    milliseconds), `,name,` NUL padded, the value (a sign byte, four integer digits right
    aligned, `.dddd`: 10 bytes over two words), `,quality\\n` (in the value's second word
    when every value of the chunk is printed word-wise: a word less a line to fill and drop
    the NULs of)."""
    ints, fracs = (x.tobytes() for x in _tables())

    def table(texts: list[bytes]) -> npt.NDArray[np.uint64]:
        return np.frombuffer(b"".join(texts), np.uint64).copy()

    hm = table([f"\0\0\0{m // 60:02d}:{m % 60:02d}".encode() for m in range(1440)])
    sec = table([f":{i:02d}\0\0\0\0\0".encode() for i in range(60)])
    ms = table([f"\0\0\0.{i:03d}Z".encode() for i in range(1000)] + [b"\0" * 7 + b"Z"])
    whole = table([b"\0" + ints[4 * i : 4 * i + 4] + b"\0\0\0" for i in range(10_000)])
    frac_a = table([b"\0" * 5 + fracs[5 * i : 5 * i + 3] for i in range(10_000)])
    frac_b = table([fracs[5 * i + 3 : 5 * i + 5] + b"\0" * 6 for i in range(10_000)])
    sign = table([b"\0" * 8, b"-" + b"\0" * 7])
    quality = table([f",{i}\n".encode().ljust(8, b"\0") for i in range(-128, 128)])
    # by the second of the day: `HH:MM` of the second word, `:SS` of the third (no divmod by 60)
    hm_of, sec_of = hm[np.arange(86400) // 60], sec[np.arange(86400) % 60]
    # `,quality\n` after the two digits `frac_b` may hold, for the 6-word lines
    frac_quality = table([f"\0\0,{i}\n".encode().ljust(8, b"\0") for i in range(-128, 128)])
    return hm_of, sec_of, ms, whole, frac_a, frac_b, sign, quality, frac_quality


_SPAN_DAYS = 64  # a chunk within this many days looks its dates up by day (an incident's: 1-3)


def _day_words(days: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Each row's `YYYY-MM-` and `DD` + `T` words (one text a distinct day, or every day of
    a short span: no count of the days present)."""
    lo = int(days.min())
    span = int(days.max()) - lo
    if span < _SPAN_DAYS:
        day_list, day_of = np.arange(lo, lo + span + 1), days - lo
    else:
        day_list, day_of = _dense_unique(days)
    dates = np.datetime_as_string(day_list.astype("datetime64[D]"), unit="D").tolist()
    first = np.frombuffer(b"".join(d[:8].encode() for d in dates), np.uint64)
    second = np.frombuffer(b"".join(d[8:].encode() + b"T\0\0\0\0\0" for d in dates), np.uint64)
    return first[day_of], second[day_of]


def _fast(name: bytes, t: Floats, v: Floats, q: Quality) -> bytearray:
    """One chunk's lines, built word-wise (`_words`) in one matrix, NULs dropped at the end.
    The matrix is a view of a bytearray, whose `translate` drops them: `tobytes` first
    copied the whole matrix (a third more bytes than the file) for `bytes.translate`."""
    hm_of, sec_of, ms, whole_of, frac_a, frac_b, sign, quality, frac_quality = _words()
    n = int(t.size)
    # datetime.fromtimestamp: modf, the fraction times 1e6 rounded half to even, carried
    # (whole seconds, most evidence: no fraction to round).
    whole = np.floor(t)
    if (whole == t).all():
        micro = None
        sec = whole.astype(np.int64)
    else:
        micro = np.round((t - whole) * 1e6)
        carry = micro >= 1e6
        micro[carry] -= 1e6
        sec = whole.astype(np.int64) + carry
    days, sod = np.divmod(sec, 86400)
    # the value: a sign and whole numbers below 10^4 with up to four decimals (most readings)
    # word-wise; the rest as `_value_texts` prints them, each in a field wide enough
    a = np.abs(v)
    with np.errstate(over="ignore", invalid="ignore"):  # huge and not finite: not exact
        m = np.rint(a * 1e4)
        exact = (m / 1e4 == a) & (a < 1e4) & ((a >= 1e-4) | (a == 0.0))
    every = bool(exact.all())  # the common case: slices, not index arrays, and 6-word lines
    rest = np.flatnonzero(~exact & np.isfinite(v)) if not every else np.empty(0, np.intp)
    rest_text = _value_texts(v[rest]) if rest.size else np.zeros((0, 0), np.uint8)
    value_words = max(2, -(-rest_text.shape[1] // 8))
    label = np.frombuffer((b"," + name + b",").ljust(-(-(len(name) + 2) // 8) * 8, b"\0"), np.uint64)
    at = 3 + label.size  # the value's first word
    width = at + value_words + (0 if every else 1)
    buf = bytearray(8 * n * width)  # zeroed, as np.zeros
    lines = np.frombuffer(buf, np.uint64).reshape(n, width)
    lines[:, 0], lines[:, 1] = _day_words(days)
    lines[:, 1] |= hm_of[sod]
    if micro is not None and micro.any():
        lines[:, 2] = sec_of[sod] | ms[np.where(micro == 0, 1000, micro.astype(np.int64) // 1000)]
    else:  # whole seconds: `Z` right after them
        lines[:, 2] = sec_of[sod] | ms[1000]
    lines[:, 3:at] = label
    if every:
        whole_part, frac = np.divmod(m.astype(np.int64), 10_000)
        lines[:, at] = sign[np.signbit(v).view(np.int8)] | whole_of[whole_part] | frac_a[frac]
        lines[:, at + 1] = frac_b[frac] | frac_quality[q.astype(np.intp) + 128]
        return buf.translate(None, b"\0")
    done = np.flatnonzero(exact)
    whole_part, frac = np.divmod(m[done].astype(np.int64), 10_000)
    lines[done, at] = sign[np.signbit(v[done]).view(np.int8)] | whole_of[whole_part] | frac_a[frac]
    lines[done, at + 1] = frac_b[frac]
    if rest.size:
        as_bytes = lines.view(np.uint8)
        as_bytes[rest, 8 * at : 8 * at + rest_text.shape[1]] = rest_text
    lines[:, -1] = quality[q.astype(np.intp) + 128]
    return buf.translate(None, b"\0")  # bytearray.translate: faster than a boolean mask
