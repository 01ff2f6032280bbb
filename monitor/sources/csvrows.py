"""Where a CSV block's rows start, for the block reader in `columnar.py`: a quoted cell may
hold line breaks (an operator's comment column), so rows and lines differ, and a block cut
at a line break may fall inside such a cell; and a row of another encoding must not cost
the block. No pyarrow here: the stdlib's reader splits rows as pyarrow's does (a quote
opens a quoted cell only at a cell's start), and is asked only when the quotes say so.
"""

from __future__ import annotations

import codecs
import csv

import numpy as np
import numpy.typing as npt

MAX_CELL_LINES = 64  # lines a quoted cell may run over at a block's end and still be kept whole


def outside_quotes(buf: bytearray, cut: int) -> int:
    """`cut` (just past a line break), or the start of the block's last row when that row
    is a quoted cell of a few lines cut short (a block cut inside it split it into two bad
    rows, and a cell's tail starting with a quote swallowed the next block); 0 when that
    row is the block's only one. Looked into, as the stdlib's reader splits rows (pyarrow's
    splits them the same), only when the quotes before `cut` are odd in number and some
    cell is opened and not closed (`_open_cells`): a file of literal quotes (`8" main`) is
    not read twice. Such quotes can still hide a cut inside a cell: it is left as before."""
    data = np.frombuffer(buf, np.uint8, cut)
    is_quote = data == 34
    if int(np.count_nonzero(is_quote)) % 2 == 0 or _open_cells(data, np.flatnonzero(is_quote)) <= 0:
        return cut
    parts = bytes(buf[:cut]).decode("utf-8", errors="replace").split("\n")
    parts[-1] = ""  # after the last line break, an empty line: a row of its own unless
    # the last row is still in a quoted cell, which then takes it in
    reader = csv.reader(p + "\n" for p in parts)
    start = done = 0  # the line the last row starts on; lines read
    try:
        for _ in reader:
            start, done = done, reader.line_num
    except csv.Error:  # a cell past the stdlib's size limit: as before
        return cut
    if start == len(parts) - 1 or len(parts) - 1 - start > MAX_CELL_LINES:
        return cut
    if start == 0:  # the block's only row: read on, as for a long line
        return 0
    breaks = np.flatnonzero(data == 10)
    return int(breaks[start - 1]) + 1


def _open_cells(data: npt.NDArray[np.uint8], quotes: npt.NDArray[np.intp]) -> int:
    """Quoted cells opened less those closed, from each run of quotes: an odd run at a
    cell's start (after a comma or a line break) opens one, at its end (before either)
    closes one; an even run is escaped quotes (`""`), a run inside a cell a literal."""
    first = np.concatenate(([True], np.diff(quotes) != 1))
    starts, ends = quotes[first], quotes[np.concatenate((first[1:], [True]))]
    odd = (ends - starts + 1) % 2 == 1
    before = np.where(starts > 0, data[starts - 1], 10)  # the block's start is a line's
    after = data[ends + 1]  # (a block ends with a line break, never a quote)
    at_start = (before == 44) | (before == 10)
    at_end = (after == 44) | (after == 13) | (after == 10)
    return int(np.count_nonzero(odd & at_start)) - int(np.count_nonzero(odd & at_end & ~at_start))


def utf8(block: memoryview) -> memoryview:
    """The block, or a copy with U+FFFD for bytes of another encoding (a row of a
    Windows-1252 export): pyarrow refused the whole block for them (and could not hand a
    malformed row with them to `invalid`), so one such row stopped the replay."""
    try:
        codecs.utf_8_decode(block, "strict", True)
    except UnicodeDecodeError:
        return memoryview(bytes(block).decode("utf-8", errors="replace").encode())
    return block


def row_lines(block: memoryview, line: int, rows: int) -> npt.NDArray[np.int64] | None:
    """The line each of the block's `rows` rows starts on, the first being line `line`,
    as the stdlib's reader splits them (pyarrow's splits the same: a quote opens a quoted
    cell only at its start); None when the two do not agree on the rows (a bare CR, a cell
    past the stdlib's size limit), and the rows are then numbered one a line, as before."""
    text = bytes(block).decode("utf-8", errors="replace")
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    reader = csv.reader(p + "\n" for p in parts)
    starts: list[int] = []
    done = 0  # lines the reader has taken
    try:
        for _ in reader:
            starts.append(line + done)
            done = reader.line_num
    except csv.Error:
        return None
    return np.array(starts, dtype=np.int64) if len(starts) == rows else None
