"""The replay's in-order check: its fast path for clean chunks keeps exactly what the full
check keeps, counts the same bad rows, and carries the same latest times on."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from monitor.model import Quality
from monitor.sources import replay
from monitor.sources.replay import Rows, _bit_count, _File


def _file(tmp_path: Path, n: int) -> _File:
    path = tmp_path / "empty.csv"
    path.write_text("time,sensor,value\n")
    return _File(path, [f"s{i}" for i in range(n)])


def _rows(sensor: np.ndarray, time: np.ndarray, first_line: int = 2) -> Rows:
    size = time.size
    lines = np.arange(first_line, first_line + size, dtype=np.int64)
    quality = np.full(size, Quality.GOOD, np.int8)
    return Rows(sensor.astype(np.int32), time.astype(np.float64), np.zeros(size), quality, lines)


def _reference(last: dict[int, float], rows: Rows) -> list[bool]:
    """Row by row: later than every earlier row of its sensor."""
    keep = []
    for s, t in zip(rows.sensor.tolist(), rows.time.tolist(), strict=True):
        keep.append(t > last.get(s, -np.inf))
        last[s] = max(last.get(s, -np.inf), t)
    return keep


def _chunks(rng: np.random.Generator, n: int, kind: str) -> list[Rows]:
    """Three chunks of a time-sorted file with each sensor once per time, then spoilt as `kind`."""
    times = 1.78e9 + 10.0 * np.arange(60)
    out = []
    line = 2
    for k in range(3):
        t = np.repeat(times + 600.0 * k, n)
        s = np.tile(rng.permutation(n) if kind == "shuffled" else np.arange(n), times.size)
        if kind == "duplicate":  # one sensor twice at one time
            i = int(rng.integers(1, t.size))
            t[i], s[i] = t[i - 1], s[i - 1]
        elif kind == "swap":  # two times swapped
            i = int(rng.integers(n, t.size))
            t[[i - n, i]] = t[[i, i - n]]
        elif kind == "stale":  # a row of the previous chunk's time
            t[0] -= 600.0
        out.append(_rows(s, t, line))
        line += t.size
    return out


@pytest.mark.parametrize("n", [3, 50, 64, 65, 200])
@pytest.mark.parametrize("kind", ["clean", "shuffled", "duplicate", "swap", "stale"])
def test_fast_and_full_checks_agree(
    tmp_path: Path, n: int, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(n)
    chunks = _chunks(rng, n, kind)
    fast, full = _file(tmp_path, n), _file(tmp_path, n)
    monkeypatch.setattr(full, "_all_in_order", lambda rows: False)
    last: dict[int, float] = {}
    for rows in chunks:
        want = _reference(last, rows)
        assert fast._in_order(rows).tolist() == want
        assert full._in_order(rows).tolist() == want
        assert fast.last.tolist() == full.last.tolist()
    assert fast.report.out_of_order == full.report.out_of_order
    assert (fast.report.out_of_order.count > 0) == (kind in ("duplicate", "swap", "stale"))


def test_the_fast_path_takes_clean_chunks_and_refuses_spoilt_ones(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for n, kind, expected in [
        (50, "clean", True),
        (50, "shuffled", True),  # the bit masks
        (200, "shuffled", False),  # too many sensors for one mask: the full check
        (50, "duplicate", False),
        (50, "swap", False),
    ]:
        f = _file(tmp_path, n)
        assert f._all_in_order(_chunks(rng, n, kind)[0]) is expected, (n, kind)


def test_bit_count_without_numpy_2(monkeypatch: pytest.MonkeyPatch) -> None:
    masks = np.array([0, 1, 3, 2**63, 2**64 - 1, 0b1011 << 40], dtype=np.uint64)
    want = [0, 1, 2, 1, 64, 3]
    assert _bit_count(masks).tolist() == want
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert replay._bit_count(masks).tolist() == want


class _Source:
    """A source that hands over prepared chunks (a file, without the file)."""

    def __init__(self, chunks: list[Rows], n: int) -> None:
        self.chunks = chunks
        self.sensors = [f"s{i}" for i in range(n)]
        self.report = replay.ReadReport("mem")

    def rows(self) -> Iterator[Rows]:
        yield from self.chunks


@pytest.mark.parametrize("kind", ["clean", "swap"])
def test_merge_cuts_sorted_and_unsorted_chunks_alike(kind: str) -> None:
    """Batches in time order, each time whole in one batch, every row once: whether a
    chunk is cut at a position (time-sorted) or by a mask (not sorted)."""
    rng = np.random.default_rng(7)
    a, b = _chunks(rng, 5, kind), _chunks(rng, 3, "clean")
    for rows in b:
        rows.time += 5.0  # between a's times
    batches = list(replay.merge([_Source(a, 5), _Source(b, 3)]))
    assert len(batches) > 2
    times = np.concatenate([x.time for x in batches])
    rows = Rows.join(a + b)
    assert times.size == rows.time.size
    if kind == "clean":
        assert times.tolist() == sorted(times.tolist())
        for x, y in itertools.pairwise(batches):
            assert x.time[-1] < y.time[0]  # no time split over two batches
    else:
        for x in batches:
            assert x.time.tolist() == sorted(x.time.tolist())
    assert sorted(
        zip(times.tolist(), np.concatenate([x.sensor for x in batches]).tolist(), strict=True)
    ) == sorted(zip(rows.time.tolist(), rows.sensor.tolist(), strict=True))


def test_split_gives_both_sides_without_copying() -> None:
    rows = _rows(np.arange(6) % 2, np.arange(6.0))
    head, tail = rows.split(4)
    assert head.time.tolist() == [0, 1, 2, 3] and tail.lines.tolist() == [6, 7]
    assert np.shares_memory(head.value, rows.value) and np.shares_memory(tail.quality, rows.quality)


def _batches(chunks: list[list[Rows]], ordered: bool) -> tuple[list[tuple[list[float], list[int]]], str]:
    """The merge's batches and late report of these sources' chunks, each chunk marked
    `ordered` (when its times never fall) or not marked at all."""
    sources = []
    for n, part in enumerate(chunks, start=3):
        copies = [Rows(c.sensor, c.time, c.value, c.quality, c.lines) for c in part]
        for c in copies:
            c.ordered = ordered and bool(np.all(c.time[1:] >= c.time[:-1]))
        sources.append(_Source(copies, n))
    out = [(b.time.tolist(), b.sensor.tolist()) for b in replay.merge(sources)]
    return out, "\n".join(line for s in sources for line in s.report.lines())


@pytest.mark.parametrize("kind", ["clean", "swap", "stale", "late", "two"])
def test_merge_of_chunks_marked_ordered_is_the_merge_of_unmarked_ones(kind: str) -> None:
    """The reader marks a chunk whose times never fall, and the merge then skips its own
    passes over it (the late rows, the latest time, the sort): the same batches, the same
    late rows reported, whether the chunks are marked or not."""
    rng = np.random.default_rng(11)
    chunks = [_chunks(rng, 5, "clean" if kind in ("late", "two") else kind)]
    if kind == "late":  # a file sorted by sensor: its later chunks start before the frontier
        chunks[0] = [chunks[0][0], chunks[0][2], chunks[0][1]]
    if kind == "two":  # two inputs: their chunks interleave
        other = _chunks(rng, 3, "clean")
        for rows in other:
            rows.time += 5.0
        chunks.append(other)
    marked, marked_report = _batches(chunks, ordered=True)
    plain, plain_report = _batches(chunks, ordered=False)
    assert marked == plain
    assert marked_report == plain_report
    if kind == "late":
        assert "earlier than rows of other sensors already replayed" in marked_report


def test_the_reader_marks_the_chunks_whose_times_never_fall(tmp_path: Path) -> None:
    f = _file(tmp_path, 3)
    sorted_rows = f._order(_rows(np.array([0, 1, 2, 0]), np.array([1.0, 1.0, 1.0, 2.0])))
    assert sorted_rows.ordered
    unsorted = f._order(_rows(np.array([0, 1, 2]), np.array([5.0, 4.0, 6.0])))
    assert not unsorted.ordered and unsorted.time.tolist() == [5.0, 4.0, 6.0]
    head, tail = sorted_rows.split(2)
    assert head.ordered and tail.ordered and sorted_rows.take(np.array([True, False, True, True])).ordered
    assert Rows.join([head, tail]).ordered and not Rows.join([tail, head]).ordered
