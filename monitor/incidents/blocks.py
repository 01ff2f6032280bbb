"""The evidence block codec: a batch of one sensor's evidence as three blobs and a codec.

Schema 2 stored every block raw: little-endian float64 times, float64 values (NaN for
none) and int8 qualities, 17 bytes a sample, written through the WAL, checkpointed and read
back when the incident is frozen. Most of those bytes say what two numbers say: a device
polled every N seconds gives times `first + i * step`, and its readings are rounded to a
few decimals. Schema 3 adds `evidence_block.codec`, a bit field (0 on every older block,
which is read as before):

- bit 0 (`GRID`): the time blob is 16 bytes, float64 `first` and `step`; the times are
  `first + i * step` for i below the block's count, computed in float64 exactly as
  `_grid` does. A block is stored so only when that reproduces every stored time bit for
  bit (checked on the whole block when it is written); else its times are raw.
- bits 1-3 (`decimals + 1`, 0 for raw): the value blob is int32 `m`, the values
  `m / 10**decimals` (`_NONE` for no value, read as NaN), again only when that division
  gives back every value bit for bit (-0.0, 1e-300, 0.1 + 0.2 stay raw). Lossless: the
  decimals are found, not imposed.
- The qualities are always raw int8: their length is the block's count.

Nothing here is approximate: a block decodes to the bytes `encode` was given (values not
finite as NaN, as schema 2 stored them), and anything the codec does not reproduce exactly
is stored raw.

Nor is damage read as numbers. A codec bit no release writes is refused, not ignored. An
encoded block has no redundancy: a flipped bit of a grid moves every time, of the codec
scales every value by ten. So schema 4 stores each block's `checksum` (CRC-32 of the codec
and the blobs) beside it, and `decode` checks it (blocks written before have none).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Quality = npt.NDArray[np.int8]
Block = tuple[Floats, Floats, Quality]
_T = np.dtype("<f8")
_Q = np.dtype("i1")
_M = np.dtype("<i4")
GRID = 1  # the times are first + i * step
_VALUES = 0b1110  # decimals + 1 of scaled values, 0 for raw
_KNOWN = GRID | _VALUES  # any other bit: a layout this release cannot read (or a damaged row)
_NONE = -(2**31)  # a scaled value's "no value" (NaN)
_BIGGEST = 2**31 - 1
_MAX_DECIMALS = 6
_SCALES = 10.0 ** np.arange(_MAX_DECIMALS + 1)
_HEAD = 16  # samples tried before a whole block is (a block that is not a grid fails here)
_GRID = struct.Struct("<dd")


class BlockError(ValueError):
    """A block whose blobs do not fit together (a damaged or hand-edited store)."""


def encode(t: Floats, v: Floats, q: npt.NDArray[np.integer]) -> tuple[int, bytes, bytes, bytes]:
    """(codec, times, values, qualities) of one block (values not finite stored as NaN)."""
    t = np.ascontiguousarray(t, _T)
    values = np.where(np.isfinite(v), v, np.nan).astype(_T)
    codec, times = 0, t.tobytes()
    grid = _grid_of(t)
    if grid is not None:
        codec, times = GRID, _GRID.pack(*grid)
    scaled = _scaled(values)
    if scaled is not None:
        decimals, m = scaled
        codec |= (decimals + 1) << 1
        return codec, times, m.tobytes(), q.astype(_Q).tobytes()
    return codec, times, values.tobytes(), q.astype(_Q).tobytes()


def checksum(codec: int, t: bytes, v: bytes, q: bytes) -> int:
    """CRC-32 of a block as stored (schema 4's `evidence_block.crc`): the codec as 8 bytes,
    then the three blobs. An encoded block has no redundancy to show damage by: a flipped
    bit of a grid's 16 bytes moves every time, of the codec scales every value by ten."""
    return zlib.crc32(q, zlib.crc32(v, zlib.crc32(t, zlib.crc32(codec.to_bytes(8, "little", signed=True)))))


def decode(codec: int, t: bytes, v: bytes, q: bytes, crc: int | None = None) -> Block:
    """A block's columns; raw ones as read-only views of their blobs (the caller copies
    them into its own arrays next), encoded ones as new arrays. `crc`: `checksum` when the
    block was written (None for blocks written before schema 4: not checked)."""
    _check(codec, t=t, value=v, quality=q)
    quality = np.frombuffer(q, _Q)
    block = times(codec, t, quality.size), _values(codec, v, quality.size), quality
    if crc is not None and (got := checksum(codec, t, v, q)) != crc:  # after the lengths: they say more
        raise BlockError(f"checksum {got:#010x}, written as {crc:#010x}: changed since")
    return block


def _check(codec: object, **blobs: object) -> None:
    """A codec of known bits and blobs that are blobs. Any other bit is refused, not
    ignored: read by the bits it knows, a newer layout or a damaged row gave numbers.
    SQLite keeps a value of any type in any column, so a hand edit can leave TEXT."""
    if type(codec) is not int or codec & ~_KNOWN:
        raise BlockError(f"unknown codec {codec!r}")
    for name, blob in blobs.items():
        if type(blob) is not bytes:
            raise BlockError(f"{name} is {type(blob).__name__}, not a blob")


def times(codec: int, t: bytes, count: int) -> Floats:
    """A block's times, given its count (the length of its quality blob)."""
    _check(codec, t=t)
    if codec & GRID:
        if len(t) != _GRID.size:
            raise BlockError(f"a grid of times is {_GRID.size} bytes, not {len(t)}")
        first, step = _GRID.unpack(t)
        return _grid(first, step, count)
    if len(t) != 8 * count:
        raise BlockError(f"{len(t)} bytes of times for {count} samples")
    return np.frombuffer(t, _T)


def _values(codec: int, v: bytes, count: int) -> Floats:
    decimals = ((codec & _VALUES) >> 1) - 1
    if decimals < 0:
        if len(v) != 8 * count:
            raise BlockError(f"{len(v)} bytes of values for {count} samples")
        return np.frombuffer(v, _T)
    if len(v) != 4 * count:
        raise BlockError(f"{len(v)} bytes of scaled values for {count} samples")
    return _unscale(np.frombuffer(v, _M), decimals)


def _grid(first: float, step: float, count: int) -> Floats:
    """The one formula of a grid's times, for the check when written and the read."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf * 0 and the like: never equal, below
        out: Floats = first + np.arange(count, dtype=np.float64) * step
    return out


def _grid_of(t: Floats) -> tuple[float, float] | None:
    """(first, step) when `_grid` gives back `t` bit for bit, else None. Three steps are
    tried: the first difference, the span over the count, and that rounded to a microsecond
    (times made as first + i * 0.1 have neither 0.1 as their first difference nor as their
    span over the count)."""
    n = int(t.size)
    if n < 3:  # two raw times are as small as a grid
        return None
    bits = t.view(np.int64)
    first = float(t[0])
    span = (float(t[-1]) - first) / (n - 1)
    for step in (float(t[1]) - first, span, round(span, 6)):
        head = min(n, _HEAD)
        if not np.array_equal(_grid(first, step, head).view(np.int64), bits[:head]):
            continue
        if np.array_equal(_grid(first, step, n).view(np.int64), bits):
            return first, step
    return None


def _unscale(m: npt.NDArray[np.int32], decimals: int) -> Floats:
    """The one formula of scaled values, for the check when written and the read."""
    out: Floats = m.astype(np.float64)
    out /= float(10**decimals)
    if m.size and m.min() == _NONE:
        out[m == _NONE] = np.nan
    return out


def _scaled(v: Floats) -> tuple[int, npt.NDArray[np.int32]] | None:
    """(decimals, m) with `_unscale(m, decimals)` bit for bit `v`, the fewest decimals that
    do; None when no number of decimals up to six does, or a value does not fit an int32.
    The decimals are picked on the first samples, then the whole block is checked."""
    if v.size < 2:
        return None
    none = np.isnan(v) if np.isnan(v.min()) else None  # the minimum is NaN when any value is
    # The first samples pick the decimals to try (a NaN says nothing), all at once: a numpy
    # call per number of decimals cost more than the whole block's check.
    head = v[:_HEAD, None]
    with np.errstate(over="ignore", invalid="ignore"):
        fits = (np.rint(head * _SCALES) / _SCALES == head) | np.isnan(head)
    for decimals in np.flatnonzero(fits.all(axis=0)).tolist():
        m = _candidate(v, none, decimals)
        if m is not None and np.array_equal(_unscale(m, decimals).view(np.int64), v.view(np.int64)):
            return decimals, m
    return None


def _candidate(v: Floats, none: npt.NDArray[np.bool_] | None, decimals: int) -> npt.NDArray[np.int32] | None:
    """rint(v * 10**decimals) as int32 (`_NONE` where there is no value), or None when a
    value is out of an int32's range (at these decimals)."""
    with np.errstate(over="ignore", invalid="ignore"):
        m = v * float(10**decimals)
        np.rint(m, out=m)
    if none is not None:
        m[none] = 0.0
    if not (m.min() >= -_BIGGEST and m.max() <= _BIGGEST):  # False for NaN too
        return None
    out = m.astype(np.int32)
    if none is not None:
        out[none] = _NONE
    return out
