"""The one module that imports pyarrow: CSV and Parquet files as column chunks.

Why pyarrow and not polars: Parquet needs an Arrow reader anyway, pandas (the
benchmark's peer) already brings pyarrow, and its streaming CSV reader reports
the physical line of each malformed row, which the bad-row report must quote.
The reader runs on one thread so those line numbers are known; its C++ parser
and the vectorised casts below still turn 8 M rows/s into arrays here.

Each chunk comes out as NumPy arrays: the line each row was on, the sensor as an
index into the chunk's own name table, the time in epoch seconds (NaN when the
text is not a time) with a flag saying which came from a bare number, and the
value with a flag saying whether it could be read at all. The checks that need
no library (ranges, order, unknown sensors) live in `replay.py`.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pa_csv

if TYPE_CHECKING:
    import pyarrow.parquet as pq

from monitor.errors import InputUsageError, PayloadError, SourceError
from monitor.model import parse_time
from monitor.sources.csvrows import outside_quotes, row_lines, utf8

COLUMNS = ("time", "sensor", "value")
BLOCK_BYTES = 8 << 20  # ~200k rows of `time,sensor,value` per chunk: memory stays flat
PARQUET_ROWS = 256_000
HEADER_BYTES = 64 << 10  # a first line longer than this is not a header: refused, not buffered
MAX_LINE_BYTES = 64 << 20  # a "line" longer than this is not a CSV row: refused, not buffered
_NUMBER = r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^[-+]?(nan|inf|infinity)$"
_ISO = r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?([Zz]|[-+]\d\d(:?\d\d)?)$"
_UTC_NS = pa.timestamp("ns", tz="UTC")
_PACKED = (  # gzip is told apart on its own (`zcat` into `--input -`)
    (b"PK\x03\x04", "zip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zX", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

# pyarrow.compute (~70 ms to import) and pyarrow.parquet (~30 ms) are imported where they
# are needed: a clean file of numbers or timestamps is read without either (`Array.cast`
# and `fill_null` import pyarrow.compute too, so the clean paths avoid them).


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of rows in file order; `names[sensor[i]]` is row i's sensor text."""

    lines: npt.NDArray[np.int64]
    names: list[str]
    sensor: npt.NDArray[np.int32]
    time: npt.NDArray[np.float64]
    numeric: npt.NDArray[np.bool_]
    value: npt.NDArray[np.float64]
    value_ok: npt.NDArray[np.bool_]
    short: list[tuple[int, str]]  # rows with too few cells: (line, text)
    text: Callable[[int], str]  # row i as written, for the report: until the next chunk is read
    longer: list[tuple[int, str]] = field(default_factory=list)  # rows with cells past the header's, kept


def open_chunks(path: Path) -> Iterator[Chunk]:
    """CSV or Parquet (by magic bytes, not by name); raises SourceError/PayloadError
    only when the input itself is unusable.

    The input is opened once and read once, front to back: its first line gives the
    magic bytes and the header, and the blocks follow from where it ended. So a pipe or
    /dev/stdin (`zcat day.csv.gz | monitor replay --input -`), which cannot be read
    twice, reads as a file does. Parquet cannot come from a pipe (its index is at its
    end): InputUsageError."""
    try:
        f = path.open("rb")  # a named pipe: waits here for its writer, as `cat` would
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        try:
            regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
            first = f.readline(HEADER_BYTES)
        except OSError as exc:
            raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        if first.startswith(b"PAR1"):
            f.close()
            if not regular:
                raise InputUsageError(
                    f"{path}: Parquet cannot be read from a pipe (its index is at the end);"
                    " save it to a file and give that file"
                )
            return _parquet_chunks(path, _parquet_file(path))
        if first.startswith(b"\x1f\x8b"):
            raise PayloadError(
                f"{path}: gzip-compressed; decompress it on the way in:"
                f" zcat {path if regular else 'FILE.gz'} | monitor replay ... --input -"
            )
        packed = next((kind for start, kind in _PACKED if first.startswith(start)), None)
        if packed is not None:  # `history.zip` as it came: its bytes read as a broken CSV
            raise PayloadError(f"{path}: a {packed}-compressed file; decompress it first")
        if first[:2] in (b"\xff\xfe", b"\xfe\xff"):  # a UTF-16 byte order mark (Excel's "Unicode Text")
            raise PayloadError(f"{path}: UTF-16 text; save it as UTF-8 (CSV UTF-8)")
        header = _header(path, first)  # checked now, so a bad file is refused before any output
        chunks = _csv_chunks(path, f, header, _pick(path, header))
    except BaseException:
        f.close()
        raise
    next(chunks)  # started, so the file is closed however the reading ends, or if it never begins
    return (c for c in chunks if c is not None)


def _header(path: Path, first: bytes) -> list[str]:
    """The header's cells, from the input's first line as read (at most HEADER_BYTES).
    A file whose lines end in a carriage return alone (a "CSV (Macintosh)" export) is
    refused: the blocks are cut at LF, so it read as one header line and no rows, without
    a word."""
    if not first:
        raise PayloadError(f"{path}: empty, expected a header {','.join(COLUMNS)}")
    if b"\r" in first.rstrip(b"\r\n"):
        raise PayloadError(
            f"{path}: a line ends with a carriage return alone (a Macintosh CSV export);"
            " save it with LF or CRLF line endings"
        )
    if len(first) == HEADER_BYTES and not first.endswith(b"\n"):
        raise PayloadError(
            f"{path}: the first line is longer than {HEADER_BYTES >> 10} KiB, expected a header"
            f" {','.join(COLUMNS)}"
        )
    try:  # -sig: spreadsheet exports start with a BOM
        return next(csv.reader([first.decode("utf-8-sig")]), [])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PayloadError(f"{path}: not a readable CSV file ({exc})") from exc


def _pick(path: Path, header: list[str]) -> list[str]:
    """The file's own spelling of time, sensor, value (matched without case or blanks)."""
    names = [h.strip().lower() for h in header]
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise PayloadError(f"{path}: header {','.join(header)!r} lacks column(s) {', '.join(missing)}")
    return [header[names.index(c)] for c in COLUMNS]


def _csv_chunks(
    path: Path, f: io.BufferedReader, header: list[str], cols: list[str]
) -> Iterator[Chunk | None]:
    """The rows after the header line (read from `f` already), in blocks of whole lines
    read here and parsed by pyarrow, one at a time, on one thread (its pool took more CPU
    than it saved wall time with the engine and the incident worker on the other core):
    pyarrow's own streaming reader reads ahead without bound. Yields None first, before
    reading anything, so the caller can start it and `f` is closed however it ends.

    The blocks are read into one reused buffer (a fresh 8 MiB `bytes` per block, joined
    to the last block's unfinished line and sliced again, cost three copies and the page
    faults of new memory): a chunk's `text` is valid until the next chunk is read. Each
    read takes BLOCK_BYTES more (a pipe's reads wait until that much came or it closed),
    so the blocks end where they always did."""
    width = max(header.index(c) for c in cols) + 1
    positions = [header.index(c) for c in cols]
    kinds = [0, 0]  # the typed parse tried first, and how many blocks in a row needed text
    buf = bytearray(BLOCK_BYTES + (64 << 10))
    try:
        with f:
            yield None
            line, held = 2, 0  # held: bytes of an unfinished line at the front of buf
            while True:
                if held + BLOCK_BYTES > len(buf):  # a long line: a larger buffer (the old may be in use)
                    buf = _grown(buf, held, held + BLOCK_BYTES)
                with memoryview(buf) as into:
                    got = f.readinto(into[held : held + BLOCK_BYTES])
                end = held + got
                if not end:
                    break
                if got:
                    cut = buf.rfind(b"\n", 0, end) + 1
                    quote = buf.find(b'"', 0, cut) if cut else -1  # memchr: the first quote, if any
                    if quote >= 0:  # a cell may hold a line break
                        cut = outside_quotes(buf, cut)
                    if cut == 0:  # one line longer than a block: read on, up to a point
                        if end > MAX_LINE_BYTES:
                            raise PayloadError(
                                f"{path}: line {line} is longer than {MAX_LINE_BYTES >> 20} MiB"
                            )
                        held = end
                        continue
                else:
                    cut = end
                    quote = buf.find(b'"', 0, cut)
                quoted = 0 <= quote < cut  # the block's first quote is the buffer's first
                block = memoryview(buf)[:cut]
                if not buf.isascii():  # (the whole buffer: a quick test, the block's text alone is not)
                    block = utf8(block)
                chunk, lines = _csv_block(block, line, header, cols, width, positions, kinds, quoted)
                yield chunk
                line += lines
                held = end - cut
                if held:  # the unfinished line to the front, for the next read to complete
                    buf[:held] = buf[cut:end]
    except pa.ArrowInvalid as exc:
        raise PayloadError(f"{path}: not a readable CSV file ({exc})") from exc
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _grown(buf: bytearray, held: int, size: int) -> bytearray:
    """A new buffer of at least `size` bytes starting with `buf`'s first `held`; a new one,
    not `buf` resized, since the last chunk may still hold a view of it."""
    out = bytearray(max(size, 2 * len(buf)))
    out[:held] = buf[:held]
    return out


# Column types tried in turn: epoch numbers, ISO 8601 times, then text (the vectorised
# fallback below, which also finds the bad cells). A conversion error costs one re-parse.
_KINDS = (
    (pa.float64(), pa.float64()),
    (_UTC_NS, pa.float64()),
    (pa.string(), pa.string()),
)


def _csv_block(
    block: memoryview,
    line: int,
    header: list[str],
    cols: list[str],
    width: int,
    positions: list[int],
    kinds: list[int],
    quoted: bool,
) -> tuple[Chunk, int]:
    """One block of lines, the first being line `line` of the file; returns the chunk
    and how many lines the block held. Malformed rows are numbered only by a
    single-threaded parse (the one here); a block that has some is parsed again as text."""
    odd: list[tuple[int, str, int]] = []

    def invalid(row: Any) -> str:
        at = -1 if row.number is None or row.number < 0 else int(row.number) + line - 1
        odd.append((at, str(row.text), int(row.actual_columns)))
        return "skip"

    def parse(kind: int) -> pa.Table:
        odd.clear()
        t_type, v_type = _KINDS[kind]
        types = dict.fromkeys(header, pa.string())
        types[cols[0]], types[cols[2]] = t_type, v_type
        types[cols[1]] = pa.string()  # names to indices in `_sensors`: cheaper than a dictionary here
        return pa_csv.read_csv(
            pa.py_buffer(block),
            read_options=pa_csv.ReadOptions(use_threads=False, column_names=header, block_size=1 << 20),
            parse_options=pa_csv.ParseOptions(invalid_row_handler=invalid, ignore_empty_lines=False),
            convert_options=pa_csv.ConvertOptions(
                column_types=types, include_columns=cols, null_values=[""], strings_can_be_null=False
            ),
        )

    ends: list[npt.NDArray[np.intp]] = []

    def text(at: int) -> str:
        """Line `at` of the file as written (for the report's examples: a few per block)."""
        if not ends:
            ends.append(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10))
        k = at - line
        a = 0 if k == 0 else int(ends[0][k - 1]) + 1
        b = int(ends[0][k]) if k < ends[0].size else len(block)
        return bytes(block[a:b]).decode("utf-8", errors="replace").rstrip("\r")

    table = None
    for kind in (kinds[0], *range(kinds[0] + 1, len(_KINDS))):
        try:
            table = parse(kind)
        except pa.ArrowInvalid:
            if kind == len(_KINDS) - 1:
                raise
            continue
        if kind < len(_KINDS) - 1:
            kinds[0], kinds[1] = kind, 0
        else:  # a block with a bad cell needs text; a file of them keeps to text after two
            kinds[1] += 1
            if kinds[1] >= 2:
                kinds[0] = kind
        break
    assert table is not None
    if any(o[0] < 0 for o in odd) or (odd and kind != len(_KINDS) - 1):
        table = parse(len(_KINDS) - 1)  # text, so long rows can join
    n = table.num_rows
    batch = table.unify_dictionaries().combine_chunks().to_batches()
    rows = batch[0] if batch else None
    span, held = None, n  # the line each row starts on, if not one row a line; lines held
    if odd or quoted:
        # A quoted cell with a line break (a comment column), or an unterminated quote that
        # swallows the lines after it, makes a row of several lines: count the lines, and
        # where they outnumber the rows, find the line each row starts on.
        newlines = np.frombuffer(block, dtype=np.uint8) == 10
        held = int(np.count_nonzero(newlines)) + (0 if newlines[-1] else 1)
        if held != n + len(odd):
            span = row_lines(block, line, n + len(odd))
            if span is not None and all(o[0] >= line for o in odd):
                odd = [(int(span[at - line]), row, cells) for at, row, cells in odd]
            else:
                span = None
    if not odd:
        lines = np.arange(line, line + n, dtype=np.int64) if span is None else span
        return _chunk(rows, lines, [], source=text), held
    odd.sort()
    lines, short, extra, longer = _place(
        span if span is not None else np.arange(line, line + n + len(odd), dtype=np.int64),
        odd,
        len(header),
        width,
        positions,
    )
    if extra:
        return _chunk(_with_extra(rows, extra), lines, short, True, text, longer), held
    return _chunk(rows, lines, short, source=text, longer=longer), held


def _place(
    span: npt.NDArray[np.int64],
    odd: list[tuple[int, str, int]],
    columns: int,
    width: int,
    positions: list[int],
) -> tuple[npt.NDArray[np.int64], list[tuple[int, str]], list[tuple[int, list[str]]], list[tuple[int, str]]]:
    """Line numbers of a batch's good rows, given the line each of its rows starts on
    (`span`) and the malformed rows among them.

    A row with fewer cells than the header is reported; one with more keeps its
    first cells (the stdlib reader did the same), appended after the good rows, and is
    reported when a cell past the header's `columns` holds anything (a decimal comma)."""
    bad = {o[0] for o in odd}
    good = span[~np.isin(span, np.fromiter(bad, np.int64, len(bad)))] if bad else span
    short: list[tuple[int, str]] = []
    extra: list[tuple[int, list[str]]] = []
    longer: list[tuple[int, str]] = []
    for at, text, cells in odd:
        try:
            row = next(csv.reader([text]), [])
        except csv.Error:  # a cell past the stdlib's limit (128 KiB; a logger's NUL tail): not kept
            row = []
        if cells >= width and len(row) >= width:
            extra.append((at, [row[p] for p in positions]))
            if any(c.strip() for c in row[columns:]):
                longer.append((at, text))
        elif text.strip(" \t\r\n,"):
            short.append((at, text))
    if extra:
        good = np.concatenate([good, np.array([e[0] for e in extra], dtype=np.int64)])
    return good, short, extra, longer


def _with_extra(batch: pa.RecordBatch | None, extra: list[tuple[int, list[str]]]) -> pa.RecordBatch:
    cells = [pa.array([e[1][i] for e in extra], pa.string()) for i in range(3)]
    more = pa.RecordBatch.from_arrays(cells, names=list(COLUMNS))
    if batch is None:
        return more
    return pa.RecordBatch.from_arrays(
        [pa.concat_arrays([_text(batch.column(i)), more.column(i)]) for i in range(3)],
        names=list(COLUMNS),
    )


def _text(col: pa.Array) -> pa.Array:
    return col.dictionary_decode() if pa.types.is_dictionary(col.type) else col.cast(pa.string())


def _chunk(
    batch: pa.RecordBatch | None,
    lines: npt.NDArray[np.int64],
    short: list[tuple[int, str]],
    reorder: bool = False,
    source: Callable[[int], str] | None = None,
    longer: list[tuple[int, str]] | None = None,
) -> Chunk:
    if batch is None:
        none = np.empty(0, bool)
        nothing = np.empty(0)
        return Chunk(
            lines[:0], [], np.empty(0, np.int32), nothing, none, nothing, none, short, str, longer or []
        )
    t_col, s_col, v_col = (batch.column(i) for i in range(3))
    names, sensor, empty = _sensors(s_col)
    time, numeric = _times(t_col)
    value, ok = _values(v_col)
    index: npt.NDArray[np.intp] | None = None  # the batch's row of each chunk row, if not the same
    blank = _blank(t_col, s_col, v_col) if empty else None
    if blank is not None:  # a blank line is not a row: dropped, its line still counted
        index = np.flatnonzero(~blank)
    if reorder:  # long rows were appended: back to file order
        rows = np.arange(batch.num_rows) if index is None else index
        index = rows[np.argsort(lines[rows], kind="stable")]
    if index is not None:
        lines, sensor, time, value = lines[index], sensor[index], time[index], value[index]
        numeric, ok = numeric[index], ok[index]

    def text(i: int) -> str:
        if source is not None:
            return source(int(lines[i]))
        j = i if index is None else int(index[i])
        return ",".join(_cell(c, j) for c in (t_col, s_col, v_col))

    return Chunk(lines, names, sensor, time, numeric, value, ok, short, text, longer or [])


def _cell(col: pa.Array, i: int) -> str:
    """Row i's cell as text for the report; a timestamp past Python's year 9999 as its number."""
    try:
        v = col[i].as_py()
    except (OverflowError, ValueError):  # a garbage timestamp: the number, and what it counts
        return f"{col[i].value} {col.type.unit} since 1970"
    return "" if v is None else str(v)


def _blank(t: pa.Array, s: pa.Array, v: pa.Array) -> npt.NDArray[np.bool_] | None:
    """Rows from blank lines (every cell empty), or None when there are none; asked only
    when some sensor cell is empty."""
    import pyarrow.compute as pc

    def empty(c: pa.Array) -> pa.Array:
        if pa.types.is_dictionary(c.type):
            c = c.dictionary_decode()
        if pa.types.is_string(c.type):
            return pc.equal(pc.utf8_length(c), 0)
        return c.is_null()

    mask = pc.and_(pc.and_(empty(t), empty(s)), empty(v))
    if not pc.any(mask).as_py():
        return None
    return _bools(mask)


def _sensors(col: pa.Array) -> tuple[list[str], npt.NDArray[np.int32], bool]:
    """Sensor names as a small table and an index per row (no Python string per row), and
    whether any cell is empty (so the chunk may hold blank lines)."""
    if pa.types.is_string(col.type) and not col.null_count:
        found = _cycle(col)
        if found is not None:
            return found
    if not pa.types.is_dictionary(col.type):
        import pyarrow.compute as pc

        col = pc.dictionary_encode(col.cast(pa.string()) if not pa.types.is_string(col.type) else col)
    raw = col.dictionary.to_pylist()
    names = [("" if n is None else str(n)).strip() for n in raw]
    indices = col.indices
    empty = "" in raw
    if indices.null_count:
        indices = indices.fill_null(len(names))
        names.append("")
        empty = True
    idx = _numbers(indices).astype(np.int32, copy=False)
    return names, idx, empty


MAX_CYCLE = 1024  # sensors a time in a file written time by time that `_cycle` recognises


def _cycle(col: pa.StringArray) -> tuple[list[str], npt.NDArray[np.int32], bool] | None:
    """The usual file (every sensor each time, always in the same order) names its
    sensors in a cycle of p rows: then row i's name is row i mod p's, shown for the whole
    chunk by two vectorised comparisons of Arrow's buffers (each cell as long as the one
    p rows on, and the text one cycle's bytes on the same), rather than a hash of every
    cell. The names come in order of first appearance, one code a distinct text, as a
    dictionary would have them; None (any other file) leaves it to the dictionary. A chunk
    of at most 2 * MAX_CYCLE rows is read as text whole (a small file, a last chunk: no
    pyarrow.compute to import for them)."""
    n = len(col)
    head: list[str] = col.slice(0, min(n, 2 * MAX_CYCLE)).to_pylist()
    if len(head) == n:
        p = n
    else:
        # The first few rows naming the first row's sensor again: each a possible cycle length,
        # checked on the head (a few, so a head that breaks late is not compared row by row often).
        again = islice((i for i in range(1, len(head) // 2 + 1) if head[i] == head[0]), 8)
        p = next((i for i in again if head[i:] == head[:-i]), 0)
    if not p:
        return None
    if p == n:
        codes: dict[str, int] = {}
        idx = np.array([codes.setdefault(s, len(codes)) for s in head], dtype=np.int32)
        return [s.strip() for s in codes], idx, "" in codes
    bufs = col.buffers()
    offs = np.frombuffer(bufs[1], np.int32, n + 1, col.offset * 4)
    a, e = int(offs[0]), int(offs[-1])
    period = int(offs[p]) - a
    if not bool(np.all(offs[p:] - offs[:-p] == period)):
        return None
    size = e - a - period
    if size and not bufs[2].slice(a + period, size).equals(bufs[2].slice(a, size)):  # a memcmp
        return None
    codes = {}
    first = np.array([codes.setdefault(s, len(codes)) for s in head[:p]], dtype=np.int32)
    reps = -(-n // p)
    idx = np.tile(first, reps)[:n] if reps > 1 else first[:n]
    return [s.strip() for s in codes], idx, "" in codes


def _times(col: pa.Array) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Epoch seconds (NaN: not a time) and whether each was a bare number (its unit is
    decided by the caller, which knows the valid range)."""
    n = len(col)
    if pa.types.is_timestamp(col.type):
        if col.type.unit == "ns" and not col.null_count:  # its int64 buffer, read as such
            return _nan_nulls(col, 1e-9), np.zeros(n, bool)
        try:
            ns = col.cast(pa.timestamp("ns", tz=col.type.tz)).cast(pa.int64())
        except pa.ArrowInvalid:  # a time past 2262 has no nanoseconds: its own unit, a bad row
            return _nan_nulls(col.cast(pa.int64()), _UNIT_SECONDS[col.type.unit]), np.zeros(n, bool)
        return _nan_nulls(ns, 1e-9), np.zeros(n, bool)
    if pa.types.is_float64(col.type) or pa.types.is_integer(col.type):
        # integers straight from their buffer: Arrow's cast refuses any past 2**53 (epoch ns)
        return _nan_nulls(col, 1.0), np.ones(n, bool)
    if pa.types.is_floating(col.type):
        return _nan_nulls(col.cast(pa.float64()), 1.0), np.ones(n, bool)
    import pyarrow.compute as pc

    col = col.cast(pa.string())
    try:
        return _nan_nulls(col.cast(pa.float64()), 1.0), np.ones(n, bool)
    except pa.ArrowInvalid:
        pass
    try:
        return _nan_nulls(col.cast(_UTC_NS).cast(pa.int64()), 1e-9), np.zeros(n, bool)
    except pa.ArrowInvalid:
        pass
    col = pc.utf8_trim_whitespace(col)
    num = pc.fill_null(pc.match_substring_regex(col, _NUMBER, ignore_case=True), False)
    iso = pc.fill_null(pc.match_substring_regex(col, _ISO), False)
    out = np.full(n, math.nan)
    numeric = _bools(num)
    out[numeric] = _numbers(pc.filter(col, num).cast(pa.float64()))
    iso_mask = _bools(iso)
    rest = ~numeric
    try:
        out[iso_mask] = _numbers(pc.filter(col, iso).cast(_UTC_NS).cast(pa.int64())) * 1e-9
        rest &= ~iso_mask
    except pa.ArrowInvalid:  # e.g. month 13 or a year past 2262: the slow path says which
        pass
    if rest.any():  # forms the vectorised parsers do not take: once per distinct text
        cache: dict[str, float] = {}
        texts = pc.filter(col, pa.array(rest)).to_pylist()
        vals = np.empty(len(texts))
        for i, s in enumerate(texts):
            t = cache.get(s or "")
            if t is None:
                try:
                    t = parse_time(s or "")
                except ValueError:
                    t = math.nan
                cache[s or ""] = t
            vals[i] = t
        out[rest] = vals
    return out, numeric


def _values(col: pa.Array) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Values and whether each could be read at all (NaN/inf read fine: the engine judges them)."""
    n = len(col)
    if pa.types.is_boolean(col.type):  # a pump's run feedback as pandas writes it: 1 and 0
        col = col.cast(pa.int8())
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_decimal(col.type):
        # integers straight from their buffer: Arrow's cast refuses any past 2**53
        v = col if pa.types.is_float64(col.type) or pa.types.is_integer(col.type) else col.cast(pa.float64())
        ok = np.ones(n, bool) if not v.null_count else ~_bools(v.is_null())
        return _nan_nulls(v, 1.0), ok
    import pyarrow.compute as pc

    col = col.cast(pa.string())
    try:
        v = col.cast(pa.float64())
    except pa.ArrowInvalid:
        pass
    else:  # a null (Parquet's None, Arrow's null type) is an unreadable value, as an empty cell
        return _nan_nulls(v, 1.0), np.ones(n, bool) if not v.null_count else ~_bools(v.is_null())
    col = pc.utf8_trim_whitespace(col)
    num = pc.fill_null(pc.match_substring_regex(col, _NUMBER, ignore_case=True), False)
    ok = _bools(num)
    out = np.full(n, math.nan)
    out[ok] = _numbers(pc.filter(col, num).cast(pa.float64()))
    for i in np.flatnonzero(~ok).tolist():  # the odd spellings float() takes ("1_000"): rare
        try:
            out[i] = float(col[i].as_py() or "")
            ok[i] = True
        except ValueError:
            pass
    return out, ok


def _numbers(arr: pa.Array) -> npt.NDArray[Any]:
    """A fixed-width array without nulls as NumPy, straight from its buffer.
    (`Array.to_numpy` imports pandas on first use: a third of a second per replay.)"""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    assert not arr.null_count
    dtype = np.dtype(np.int64 if pa.types.is_timestamp(arr.type) else arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _bools(arr: pa.Array) -> npt.NDArray[np.bool_]:
    """A boolean array (bit-packed in Arrow) as NumPy; nulls read as False."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        arr = arr.fill_null(False)
    bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + len(arr)].astype(bool)


def _nan_nulls(arr: pa.Array, scale: float) -> npt.NDArray[np.float64]:
    raw = _numbers(arr.fill_null(0) if arr.null_count else arr)
    # int64 nanoseconds to seconds in one pass (the same float64 conversion, then the product)
    out = np.multiply(raw, scale) if scale != 1.0 else raw.astype(np.float64, copy=False)
    if arr.null_count:
        out[_bools(arr.is_null())] = math.nan
    return out


def _parquet_file(path: Path) -> pq.ParquetFile:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path, pre_buffer=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise PayloadError(f"{path}: not a readable Parquet file ({exc})") from exc
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    names = {n.strip().lower(): n for n in pf.schema_arrow.names}
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise PayloadError(f"{path}: columns {', '.join(pf.schema_arrow.names)} lack {', '.join(missing)}")
    time = pf.schema_arrow.field(names["time"])
    if pa.types.is_timestamp(time.type) and time.type.tz is None and _int96(pf, time.name):
        raise PayloadError(
            f"{path}: column {time.name!r} is an INT96 timestamp (Spark's, Hive's and Impala's"
            " legacy type): Spark and Hive write it as UTC, Impala as local time, and the file"
            " does not say which; write it as timestamps with a zone (Spark:"
            " spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS) or as ISO 8601 text with an offset"
        )
    if pa.types.is_timestamp(time.type) and time.type.tz is None:  # pandas' naive datetime64
        raise PayloadError(
            f"{path}: column {time.name!r} is timestamp[{time.type.unit}] without a time zone;"
            " guessing one would shift every alarm by hours: write it with a zone (UTC) or as"
            " ISO 8601 text with an offset"
        )
    if pa.types.is_floating(time.type) and time.type.bit_width < 64:
        raise PayloadError(
            f"{path}: column {time.name!r} is a float ({time.type.bit_width} bits): too coarse for"
            " epoch seconds (a float32 steps by 128 s); write it as float64, integers or timestamps"
        )
    return pf


def _int96(pf: pq.ParquetFile, name: str) -> bool:
    """Whether the file stores column `name` as INT96, which Arrow reads as a naive
    timestamp like pandas' datetime64, though its writers meant different zones by it."""
    schema = pf.schema
    return any(
        schema.column(i).name == name and schema.column(i).physical_type == "INT96"
        for i in range(len(schema))
    )


def _parquet_chunks(path: Path, pf: pq.ParquetFile) -> Iterator[Chunk]:
    names = {n.strip().lower(): n for n in pf.schema_arrow.names}
    try:
        row = 1  # "line" of a Parquet row: its position, counting from 1
        # One thread: the engine and the incident worker have the other core already; pyarrow's
        # decoding threads cost more CPU than they gained in wall time on two cores.
        columns = [names[c] for c in COLUMNS]
        for batch in pf.iter_batches(batch_size=PARQUET_ROWS, columns=columns, use_threads=False):
            n = batch.num_rows
            yield _chunk(batch, np.arange(row, row + n, dtype=np.int64), [])
            row += n
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise PayloadError(f"{path}: not a readable Parquet file ({exc})") from exc
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def write_table(path: Path, columns: dict[str, list[Any]], row_group_size: int = PARQUET_ROWS) -> None:
    """Columns as given (text or numbers) into a Parquet file: for tests and tools."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)


def write_parquet(
    path: Path, time: npt.NDArray[np.float64], sensor: list[str], value: npt.NDArray[np.float64]
) -> None:
    """A `time,sensor,value` Parquet file (time as UTC timestamps): for tests and the benchmark."""
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "time": pa.array((time * 1e9).astype(np.int64)).cast(_UTC_NS),
            "sensor": pa.array(sensor).dictionary_encode(),
            "value": pa.array(value),
        }
    )
    pq.write_table(table, path, row_group_size=PARQUET_ROWS)
