"""Samples from CSV or Parquet files (`time,sensor,value`) as NumPy batches for the engine.

Files are streamed in chunks (see `stream`), so memory does not grow with the file.
`time` is ISO 8601 with `Z` or an offset, epoch seconds, or epoch milliseconds (a
bare number of 1e11 or more cannot be seconds: it is read as milliseconds, and the
report says so once; a bare number before 2001, an Excel serial date or a YYYYMMDD read
as seconds into 1970, is replayed as read and the report says so once, with the time it
was read as). Bad rows never stop a replay: a row for an unknown sensor,
with an unreadable time, or with a time outside 1970..2100 is skipped; a row whose
value cannot be read becomes a BAD_DATA sample (the reading happened, it is just not
a number); a row not later than the previous row of the same sensor in the same
file is skipped as out of order. Each kind is counted, with the first line it
happened on, for the report at the end; a row that breaks several rules counts once
(its time first, then its sensor, then its value). Every check works on whole chunks.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from monitor.model import Quality, iso
from monitor.sources.columnar import Chunk, open_chunks
from monitor.sources.inputs import pipes_once

T_MIN = 0.0  # 1970-01-01T00:00:00Z
T_MAX = 4102444800.0  # 2100-01-01T00:00:00Z: later (or earlier than T_MIN) is a bad row
MS_FROM = 1e11  # a bare number this large is epoch milliseconds (as seconds it is past year 5000)
# A bare number below this, as epoch seconds, is before 2001-01-01: no logger of this station
# recorded then, but an Excel serial date (45992.5) or a YYYYMMDD (20261201) reads as 1970.
EARLY_NUMBER = 978307200.0
MAX_HELD = 2_000_000  # rows held back for a time not yet complete; past this they go on
MAX_NAMES = 1000  # distinct unknown sensor names reported one by one; more are summed


@dataclass
class BadRows:
    """How often one kind of bad row occurred, and where first."""

    count: int = 0
    first_line: int = 0
    example: str = ""

    def add(self, line: int, example: str, count: int = 1) -> None:
        if self.count == 0 or line < self.first_line:
            self.first_line, self.example = line, shortened(example)
        self.count += count


def shortened(text: str, most: int = 120) -> str:
    """A row or name as the report quotes it: a megabyte-long one (a logger's NUL tail, a
    broken export) cut, saying how long it was."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


@dataclass
class ReadReport:
    """Bad rows of one file, by kind."""

    path: str
    rows: int = 0
    unknown_sensor: dict[str, BadRows] = field(default_factory=dict)
    bad_time: BadRows = field(default_factory=BadRows)
    out_of_range: BadRows = field(default_factory=BadRows)
    bad_value: BadRows = field(default_factory=BadRows)
    out_of_order: BadRows = field(default_factory=BadRows)
    milliseconds: BadRows = field(default_factory=BadRows)  # not a problem: said once so nobody wonders
    early: BadRows = field(default_factory=BadRows)  # bare numbers before 2001: replayed, said once
    extra_cells: BadRows = field(default_factory=BadRows)  # kept, but a cell was left out
    late: BadRows = field(default_factory=BadRows)

    def lines(self) -> list[str]:
        """One line per kind of problem, for stderr."""
        out: list[str] = []
        for sensor, p in sorted(self.unknown_sensor.items()):
            out.append(
                f"{self.path}: {p.count} row(s) for unknown sensor {sensor!r} (first at line {p.first_line})"
            )
        for what, p in (
            ("unreadable time or too few columns", self.bad_time),
            ("a time outside 1970..2100 (skipped)", self.out_of_range),
            ("unreadable value (kept as bad data)", self.bad_value),
            ("out of order or duplicate time (skipped)", self.out_of_order),
        ):
            if p.count:
                out.append(
                    f"{self.path}: {p.count} row(s) with {what}, first at line {p.first_line}: {p.example}"
                )
        if self.extra_cells.count:
            m = self.extra_cells
            out.append(
                f"{self.path}: {m.count} row(s) with more cells than the header (the cells past it"
                f" ignored; a decimal comma?), first at line {m.first_line}: {m.example}"
            )
        if self.milliseconds.count:
            m = self.milliseconds
            out.append(
                f"{self.path}: {m.count} time(s) read as epoch milliseconds (too large for seconds),"
                f" first at line {m.first_line}: {m.example}"
            )
        if self.early.count:
            m = self.early
            out.append(
                f"{self.path}: {m.count} time(s) given as a bare number before 2001 as epoch seconds,"
                f" first at line {m.first_line}: {m.example}; replayed as read. An Excel serial date"
                " or a YYYYMMDD number? Write epoch seconds or ISO 8601 with a zone"
            )
        if self.late.count:
            m = self.late
            out.append(
                f"{self.path}: {m.count} row(s) earlier than rows of other sensors already replayed,"
                f" first at line {m.first_line} ({m.example}): replayed after them; their stale checks"
                " may differ from a sorted file's. Sort the file by time to replay it exactly"
            )
        return out


@dataclass(frozen=True, slots=True)
class Samples:
    """Samples as parallel arrays; `sensor` indexes the sensor list the reader was given."""

    sensor: npt.NDArray[np.int32]
    time: npt.NDArray[np.float64]
    value: npt.NDArray[np.float64]
    quality: npt.NDArray[np.int8]

    def __len__(self) -> int:
        return int(self.time.size)

    @staticmethod
    def concat(parts: Sequence[Samples]) -> Samples:
        """Several inputs merged into one stream in time order (stable: ties keep input order)."""
        if not parts:
            return Samples(np.empty(0, np.int32), np.empty(0), np.empty(0), np.empty(0, np.int8))
        time = np.concatenate([p.time for p in parts])
        order = np.argsort(time, kind="stable")
        return Samples(
            np.concatenate([p.sensor for p in parts])[order],
            time[order],
            np.concatenate([p.value for p in parts])[order],
            np.concatenate([p.quality for p in parts])[order],
        )


def read_csv(path: str | Path, sensors: Sequence[str]) -> tuple[Samples, ReadReport]:
    """One file (CSV or Parquet) whole, in time order: for tests and small tools; the
    replay command streams instead (`stream`)."""
    batches, reports = stream([path], sensors)
    return Samples.concat(list(batches)), reports[0]


def stream(paths: Sequence[str | Path], sensors: Sequence[str]) -> tuple[Iterator[Samples], list[ReadReport]]:
    """All inputs merged into one stream of time-ordered batches, read chunk by chunk.

    Memory holds about one chunk per input. A batch is cut below the earliest
    "latest time read" among the inputs not yet finished, so rows of equal time are
    always in one batch and several time-ordered files merge exactly as if sorted
    together. A row earlier than rows already replayed (a file sorted by sensor, not
    by time) is still replayed, after them, and counted in `late`. The reports fill
    as the batches are consumed. An input may be a pipe (CSV only: see `open_chunks`)."""
    inputs = [Path(p) for p in paths]
    pipes_once(inputs)
    files = [_File(p, sensors) for p in inputs]
    return merge(files), [f.report for f in files]


@dataclass
class Rows:
    """Rows kept from one chunk, in file order, with their lines (for a historian:
    the point's position in the answer, counting from 1).

    `ordered`: the times never fall, as the reader found on its own thread, so the merge
    (on the replay's) need not look again."""

    sensor: npt.NDArray[np.int32]
    time: npt.NDArray[np.float64]
    value: npt.NDArray[np.float64]
    quality: npt.NDArray[np.int8]
    lines: npt.NDArray[np.int64]
    ordered: bool = False

    def take(self, keep: npt.NDArray[np.bool_]) -> Rows:
        return Rows(
            self.sensor[keep], self.time[keep], self.value[keep], self.quality[keep], self.lines[keep],
            self.ordered,
        )  # fmt: skip

    def split(self, at: int) -> tuple[Rows, Rows]:
        """The rows before `at` and from `at` on, as views (no copy)."""
        s, t, v, q, n, o = self.sensor, self.time, self.value, self.quality, self.lines, self.ordered
        head = Rows(s[:at], t[:at], v[:at], q[:at], n[:at], o)
        return head, Rows(s[at:], t[at:], v[at:], q[at:], n[at:], o)

    @staticmethod
    def join(parts: list[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]
        filled = [p for p in parts if p.time.size]
        ordered = all(p.ordered for p in parts) and all(
            float(a.time[-1]) <= float(b.time[0]) for a, b in itertools.pairwise(filled)
        )
        return Rows(
            np.concatenate([p.sensor for p in parts]),
            np.concatenate([p.time for p in parts]),
            np.concatenate([p.value for p in parts]),
            np.concatenate([p.quality for p in parts]),
            np.concatenate([p.lines for p in parts]),
            ordered,
        )


class _File:
    """One input: its chunks checked row by row, vectorised, with the bad rows counted."""

    def __init__(self, path: Path, sensors: Sequence[str]) -> None:
        self.path = path
        self.sensors = list(sensors)
        self.index = {s: i for i, s in enumerate(sensors)}
        self.report = ReadReport(str(path))
        self.last = np.full(len(sensors), -math.inf)  # latest time per sensor read so far
        self.chunks = open_chunks(path)  # opened (header checked) now: a bad file fails early

    def rows(self) -> Iterator[Rows]:
        for chunk in self.chunks:
            yield self._check(chunk)

    def _check(self, c: Chunk) -> Rows:
        r = self.report
        r.rows += int(c.lines.size) + len(c.short)
        for line, text in c.short:
            r.bad_time.add(line, text)
        for line, text in c.longer:
            r.extra_cells.add(line, text)
        known = np.array([self.index.get(n, -1) for n in c.names], dtype=np.int32)
        sensor = known[c.sensor] if c.names else c.sensor
        time = c.time
        rising = bool(np.all(time[1:] >= time[:-1]))  # (False when any time is NaN)
        # NaN when any is NaN (rising times have none, but for a single one): not plain
        lo = math.nan if not time.size else float(time[0]) if rising else float(time.min())
        if time.size and self._plain(c, sensor, rising, lo):  # the usual chunk: nothing to count or drop
            if lo < EARLY_NUMBER:  # rarely: a chunk with no time before 2001 needs no other pass
                self._early(c, time, c.numeric & (time < EARLY_NUMBER))
            quality = np.full(time.size, Quality.GOOD, np.int8)
            return self._order(Rows(sensor, time, c.value, quality, c.lines), rising)
        ms = c.numeric & (time >= MS_FROM) & (time < T_MAX * 1000.0)
        if ms.any():
            time = np.where(ms, time / 1000.0, time)
            _add(r.milliseconds, ms, c)
        unreadable = ~np.isfinite(time)
        _add(r.bad_time, unreadable, c)
        outside = ~unreadable & ((time < T_MIN) | (time >= T_MAX))
        _add(r.out_of_range, outside, c)
        # A row is counted once: under its time if that is wrong, else its sensor; only a
        # row that is kept counts as an unreadable value (a second header line is one bad time).
        timed = ~unreadable & ~outside
        self._early(c, time, c.numeric & timed & ~ms & (time < EARLY_NUMBER))
        unknown = sensor < 0
        _add(r.bad_value, ~c.value_ok & timed & ~unknown, c)
        named = unknown & timed
        if named.any():
            codes, first, counts = np.unique(c.sensor[named], return_index=True, return_counts=True)
            at = np.flatnonzero(named)
            for code, i, k in zip(codes.tolist(), first.tolist(), counts.tolist(), strict=True):
                name = shortened(c.names[code]) if len(r.unknown_sensor) < MAX_NAMES else "(other names)"
                r.unknown_sensor.setdefault(name, BadRows()).add(int(c.lines[at[i]]), c.text(int(at[i])), k)
        keep = ~unknown & timed
        quality = np.where(c.value_ok, np.int8(Quality.GOOD), np.int8(Quality.BAD_DATA)).astype(np.int8)
        rows = Rows(sensor, time, c.value, quality, c.lines)
        return self._order(rows if keep.all() else rows.take(keep))

    def _early(self, c: Chunk, time: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]) -> None:
        """Counts the bare numbers read as seconds before 2001 (`mask`), quoting the first
        row with the time it was read as: the reader of the report sees "1970" and the cause."""
        at = np.flatnonzero(mask)
        if at.size:
            i = int(at[0])
            self.report.early.add(
                int(c.lines[i]), f"{shortened(c.text(i))} (read as {iso(float(time[i]))})", int(at.size)
            )

    @staticmethod
    def _plain(
        c: Chunk, sensor: npt.NDArray[np.int32], rising: bool = False, lo: float | None = None
    ) -> bool:
        """Whether the chunk has no bad row of any kind `_check` counts, in four passes
        rather than a mask per kind (two when the times are known to be `rising`): every
        time finite and inside T_MIN..T_MAX (so none can be milliseconds: T_MAX < MS_FROM),
        every value read, every sensor known. `lo`, the earliest time, when the caller has
        it already (it also tells whether any bare number could be before 2001)."""
        t = c.time
        if lo is None:  # NaN when any is NaN (rising times have none, but for a single one): not plain
            lo = float(t[0]) if rising else float(t.min())
        hi = float(t[-1]) if rising else float(t.max())
        return lo >= T_MIN and hi < T_MAX and bool(c.value_ok.all()) and int(sensor.min()) >= 0

    def _order(self, rows: Rows, rising: bool | None = None) -> Rows:
        """The rows in order (`_in_order`), marked `ordered` when their times never fall
        (`rising`: whether they do is known already)."""
        if rows.time.size and self._all_in_order(rows, rising):  # sorted by time, so `ordered`
            rows.ordered = True
            return rows
        keep = self._in_order(rows, checked=True)
        return rows if keep.all() else rows.take(keep)

    def _in_order(self, rows: Rows, checked: bool = False) -> npt.NDArray[np.bool_]:
        """Rows later than every earlier row of the same sensor in this file (`checked`:
        `_all_in_order` said no already)."""
        keep = np.ones(rows.time.size, dtype=bool)
        if not rows.time.size or (not checked and self._all_in_order(rows)):
            return keep
        n = len(self.sensors)
        key = rows.sensor.astype(np.uint16) if n < 65535 else rows.sensor  # uint16: a radix sort, O(n)
        order = np.argsort(key, kind="stable")
        counts = np.bincount(rows.sensor, minlength=n)
        present = np.flatnonzero(counts)
        bounds = np.concatenate(([0], np.cumsum(counts)))
        for s in present.tolist():
            sel = order[bounds[s] : bounds[s + 1]]
            t = rows.time[sel]
            before = np.maximum.accumulate(np.concatenate(([self.last[s]], t[:-1])))
            ok = t > before
            self.last[s] = max(float(before[-1]), float(t[-1]))
            if not ok.all():
                bad = sel[~ok]
                first = int(bad[np.argmin(rows.lines[bad])])
                example = f"{self.sensors[s]} at {rows.time[first]:.3f} after a later row"
                self.report.out_of_order.add(int(rows.lines[first]), example, int(bad.size))
                keep[bad] = False
        return keep

    def _all_in_order(self, rows: Rows, rising: bool | None = None) -> bool:
        """Whether every row is in order, decided without sorting by sensor, for the usual
        file: sorted by time, each sensor once per time. Then each sensor's own rows are in
        order when the first is later than its last time so far and no time holds the
        sensor twice; the latest times are noted. False sends the rows to the full check
        (which then finds the culprits), so the answer only has to be exact when True.
        `rising`: whether the times never fall, if the caller knows."""
        t, s = rows.time, rows.sensor
        if not (bool(np.all(t[1:] >= t[:-1])) if rising is None else rising):
            return False
        # Sorted, so only the first rows, up to the latest time read so far, can be too early.
        early = int(np.searchsorted(t, self.last.max(), "right"))
        if early and not bool(np.all(t[:early] > self.last[s[:early]])):
            return False
        # Each time's sensors distinct: in a rising order (a file written sensor by sensor in
        # the config's order; the times are sorted, so a later row is a later time or a higher
        # sensor), else as one bit each of a 64-bit mask per time.
        if not bool(np.all((t[1:] > t[:-1]) | (s[1:] > s[:-1]))):
            if len(self.sensors) > 64:
                return False
            tie = t[1:] == t[:-1]
            starts = np.concatenate(([0], np.flatnonzero(~tie) + 1))
            seen = np.bitwise_or.reduceat(_BIT[s], starts)
            if not np.array_equal(_bit_count(seen), np.diff(starts, append=t.size)):
                return False
        np.maximum.at(self.last, s, t)
        return True


_BIT = np.left_shift(np.uint64(1), np.arange(64, dtype=np.uint64))  # sensor i's bit in a mask
_BYTE_BITS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _bit_count(masks: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
    """Bits set in each mask (`np.bitwise_count` from NumPy 2, by bytes before it)."""
    if hasattr(np, "bitwise_count"):
        counts: npt.NDArray[np.uint8] = np.bitwise_count(masks)
        return counts
    by_byte = _BYTE_BITS[masks.view(np.uint8)].reshape(-1, 8)
    summed: npt.NDArray[np.uint8] = by_byte.sum(axis=1, dtype=np.uint8)
    return summed


_DONE = object()


def _ahead(rows: Iterator[Rows], depth: int = 2) -> Iterator[Rows]:
    """Read and check the next chunks on a thread while the engine judges this one:
    pyarrow and NumPy release the GIL, so the two overlap on a second core. At most
    `depth` chunks wait, so memory stays bounded; errors arrive in order."""
    box: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def give(item: object) -> bool:
        """Hand on one item; False once the consumer has gone."""
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in rows:
                if not give(item):
                    return
            give(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            give(exc)

    thread = threading.Thread(target=work, name="replay reader", daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Rows)
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def _add(problem: BadRows, mask: npt.NDArray[np.bool_], c: Chunk) -> None:
    """Count the rows of `mask`, remembering the first with its text: no loop per row."""
    at = np.flatnonzero(mask)
    if at.size:
        problem.add(int(c.lines[at[0]]), c.text(int(at[0])), int(at.size))


class Source(Protocol):
    """Anything that yields rows in its own order: a file, a historian query."""

    sensors: list[str]
    report: ReadReport

    def rows(self) -> Iterator[Rows]: ...


def merge(files: Sequence[Source]) -> Iterator[Samples]:
    """Sources merged into time-ordered batches (see `stream`)."""
    its = [_ahead(f.rows()) for f in files]
    bufs: list[list[Rows]] = [[] for _ in files]
    pos = [-math.inf] * len(files)
    done = [False] * len(files)
    frontier = -math.inf  # the latest time already handed on
    while not all(done):
        k = min((i for i in range(len(files)) if not done[i]), key=lambda i: pos[i])
        rows = next(its[k], None)
        if rows is None:
            done[k] = True
        elif rows.time.size:
            t = rows.time
            if rows.ordered:  # the late rows, if any, are the first (no pass over the chunk)
                at = np.arange(int(np.searchsorted(t, frontier, "left")))
            else:
                at = np.flatnonzero(t < frontier)
            if at.size:
                example = f"{files[k].sensors[int(rows.sensor[at[0]])]} at {t[at[0]]:.3f}"
                files[k].report.late.add(int(rows.lines[at[0]]), example, int(at.size))
            bufs[k].append(rows)
            pos[k] = max(pos[k], float(t[-1] if rows.ordered else t.max()))
        cut = min((pos[i] for i in range(len(files)) if not done[i]), default=math.inf)
        out: list[Rows] = []
        for i, buf in enumerate(bufs):
            if not buf:
                continue
            whole = Rows.join(buf)
            t = whole.time
            if whole.ordered or bool(np.all(t[1:] >= t[:-1])):  # a time-sorted file: cut at a position
                end = int(np.searchsorted(t, cut, "left"))
                if t.size - end > MAX_HELD:  # a file of one time
                    end = int(np.searchsorted(t, cut, "right"))  # rows of that time may span two batches
                if end == t.size:
                    out.append(whole)
                    bufs[i] = []
                elif end:
                    now, rest = whole.split(end)
                    out.append(now)
                    bufs[i] = [rest]
                else:
                    bufs[i] = [whole]
                continue
            now_mask = t < cut
            if t.size - int(np.count_nonzero(now_mask)) > MAX_HELD:  # a file of one time
                now_mask = t <= cut  # memory first: rows of that time may span two batches
            if now_mask.all():
                out.append(whole)
                bufs[i] = []
            elif now_mask.any():
                out.append(whole.take(now_mask))
                bufs[i] = [whole.take(~now_mask)]
            else:
                bufs[i] = [whole]
        if out:
            rows = Rows.join(out)
            t = rows.time
            if not rows.ordered and (len(out) > 1 or bool(np.any(t[1:] < t[:-1]))):  # sorted: no sort
                order = np.argsort(t, kind="stable")
                rows = Rows(rows.sensor[order], t[order], rows.value[order], rows.quality[order], rows.lines)
            frontier = max(frontier, float(rows.time[-1]))
            yield Samples(rows.sensor, rows.time, rows.value, rows.quality)
