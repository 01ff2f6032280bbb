"""The SQLite outbox on its own: commit, peek, ack, cap, dead letters, crash safety."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections import deque
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.model import Condition, ConditionState, ManualClock, Rule
from monitor.sinks.batch import Batch, Rejected
from monitor.sinks.outbox import SEGMENT_LINES, Outbox
from tests.examples import examples


def _lines(n: int, start: int = 0) -> list[str]:
    """Points of equal length, so a byte cap is a count of points."""
    return [
        f"sensor,sensor=s{i % 7},station=ps-1 value={i:06d}.5,quality=0i {i:06d}000000000"
        for i in range(start, start + n)
    ]


def _peek(ob: Outbox, limit: int) -> Batch:
    batch = ob.peek(limit)
    assert batch is not None
    return batch


def test_points_stay_until_acknowledged(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    with Outbox(tmp_path / "o.sqlite", clock=clock) as ob:
        ob.append(_lines(10))
        clock.advance(5)
        ob.append(_lines(5, start=10))
        first = _peek(ob, 4)
        assert first.lines == [x.encode() for x in _lines(4)]
        assert ob.pending_lines(4) == _lines(4)  # peeking removes nothing
        assert ob.ack(first) == 4
        stats = ob.stats()
        assert (stats.pending, stats.written, stats.dropped, stats.dead_letters) == (11, 4, 0, 0)
        assert stats.oldest_queued == 1000.0
        assert stats.pending_bytes == sum(len(s) + 1 for s in _lines(15)[4:])  # a newline each
    with Outbox(tmp_path / "o.sqlite", clock=clock) as again:  # survives a reopen
        assert again.pending_lines(100) == _lines(15)[4:]


def test_cap_drops_oldest_counts_and_alarms(tmp_path: Path) -> None:
    conditions: list[Condition] = []
    line_size = len(_lines(1)[0]) + 1
    cap = 100 * line_size
    clock = ManualClock(0.0)
    ob = Outbox(tmp_path / "o.sqlite", max_bytes=cap, clock=clock, on_condition=conditions.append)
    ob.append(_lines(100))
    assert conditions == []
    clock.set(60.0)
    assert ob.append(_lines(30, start=100)) == 30
    ob.append(_lines(5, start=130))  # still full: counted, no second alarm
    stats = ob.stats()
    assert stats.dropped == 35
    assert stats.pending == 100
    assert stats.pending_bytes <= cap
    assert ob.pending_lines(1) == _lines(1, start=35)  # the oldest went first
    assert len(conditions) == 1
    raised = conditions[0]
    assert (raised.rule, raised.state, raised.time, raised.value) == (
        Rule.OUTBOX,
        ConditionState.ACTIVE,
        60.0,
        30.0,
    )
    ob.ack(_peek(ob, 20))  # the server catches up: below 90 % of the cap clears the alarm
    assert [c.state for c in conditions] == [ConditionState.ACTIVE, ConditionState.CLEARED]
    assert conditions[1].value == 35.0
    ob.close()


def test_ack_of_rows_the_cap_already_dropped_counts_only_what_it_removed(tmp_path: Path) -> None:
    line_size = len(_lines(1)[0]) + 1
    ob = Outbox(tmp_path / "o.sqlite", max_bytes=10 * line_size)
    ob.append(_lines(10))
    in_flight = _peek(ob, 10)
    ob.append(_lines(4, start=10))  # drops 4 of the in-flight rows
    assert ob.ack(in_flight) == 6
    stats = ob.stats()
    assert (stats.pending, stats.written, stats.dropped) == (4, 6, 4)
    assert ob.pending_lines(10) == _lines(4, start=10)
    ob.close()


def test_dead_letters_keep_line_status_and_reason(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.sqlite", clock=ManualClock(7.0)) as ob:
        ob.append(_lines(3))
        ob.append(_lines(2, start=3))
        batch = _peek(ob, 4)  # two segments, the second cut after its first line
        assert ob.settle(batch, [Rejected(1, 400, "unable to parse")]) == 3
        assert ob.pending_lines() == _lines(1, start=4)
        (dead,) = ob.dead_letters()
        assert (dead.status, dead.reason, dead.line, dead.failed) == (
            400,
            "unable to parse",
            _lines(3)[1],
            7.0,
        )
        stats = ob.stats()
        assert (stats.dead_letters, stats.pending, stats.written) == (1, 1, 3)
        assert stats.pending_bytes == len(_lines(1)[0]) + 1


def test_kill_9_while_appending_loses_no_committed_point(tmp_path: Path) -> None:
    """A real process appends in a loop and prints each committed batch; SIGKILL it mid-way.

    Every batch it reported as committed must be in the outbox, whole, and the
    counters must match the rows."""
    path = tmp_path / "o.sqlite"
    script = textwrap.dedent(
        f"""
        import sys
        from monitor.sinks.batch import Batch, Rejected
from monitor.sinks.outbox import Outbox
        ob = Outbox({str(path)!r})
        i = 0
        while True:
            ob.append([f"m v={{i}}.0 {{i * 1000 + k}}" for k in range(1000)])
            print(i, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
    assert proc.stdout is not None
    committed = []
    for text in proc.stdout:
        committed.append(int(text))
        if len(committed) >= 20:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    with Outbox(path) as ob:
        rows = ob.pending_lines(10**7)
        batches = {int(b.split(" ")[1][2:-2]) for b in rows}
        assert set(committed) <= batches
        assert len(rows) == 1000 * len(batches)  # no torn transaction
        assert ob.stats().pending == len(rows)
        assert ob.stats().pending_bytes == sum(len(b) + 1 for b in rows)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


Op = tuple[str, int, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40), st.just(0)),
        # a batch, settled
        st.tuples(st.just("drain"), st.integers(1, 30), st.just(0)),
        # a batch, the next read, then an append, then both settled
        st.tuples(st.just("overlap"), st.integers(1, 30), st.just(0)),
        # a batch, an append (it may drop past the batch), then the next read, both settled
        st.tuples(st.just("late"), st.integers(1, 30), st.integers(1, 120)),
    ),
    max_size=25,
)


@settings(max_examples=examples(150), deadline=None)
@given(ops=ops, cap_lines=st.integers(5, 80))
def test_outbox_matches_a_plain_queue_model(ops: list[Op], cap_lines: int) -> None:
    """Appends of any size, batches of any size cut across segments, reads ahead of a
    settle, the cap dropping underneath: the outbox stays what a simple queue would be."""
    size = len(_lines(1)[0]) + 1
    model: deque[str] = deque()
    dropped = written = serial = 0

    def add(n: int) -> None:
        nonlocal dropped, serial
        new = _lines(n, start=serial)
        serial += n
        ob.append(new)
        model.extend(new)
        while len(model) * size > cap_lines * size:
            model.popleft()
            dropped += 1

    def peek(n: int, after: Batch | None = None) -> Batch | None:
        """A batch holds pending points only, in order (nothing dropped is sent)."""
        batch = ob.peek(n, after=after.cursor) if after is not None else ob.peek(n)
        if batch is not None:
            got = [x.decode() for x in batch.lines]
            pending = list(model)
            start = pending.index(got[0])
            assert got == pending[start : start + len(got)]
        return batch

    def settle(batch: Batch | None) -> None:
        nonlocal written
        if batch is None:
            return
        sent = {x.decode() for x in batch.lines}
        gone = [x for x in model if x in sent]
        assert ob.settle(batch) == len(gone)
        written += len(gone)
        for x in gone:
            model.remove(x)

    with (
        tempfile.TemporaryDirectory() as tmp,
        Outbox(Path(tmp) / "o.sqlite", max_bytes=cap_lines * size) as ob,
    ):
        for op, n, m in ops:
            if op == "append":
                add(n)
            elif op == "drain":
                settle(peek(n))
            elif op == "overlap":
                first = peek(n)
                second = peek(n, after=first) if first is not None else None
                add(n)
                settle(first)
                settle(second)
            else:
                first = peek(n)
                add(m)  # may drop past the end of `first`
                second = peek(n, after=first) if first is not None else None
                settle(first)
                settle(second)
            stats = ob.stats()
            assert ob.pending_lines(10**6) == list(model)
            assert (stats.pending, stats.dropped, stats.written) == (len(model), dropped, written)
            assert stats.pending_bytes == len(model) * size


def test_a_large_append_is_stored_in_bounded_segments_and_drains_in_order(tmp_path: Path) -> None:
    """A replay appends millions of points at once; held in one row, every 5,000-point batch
    would re-read and rewrite the whole row (quadratic). One transaction, rows of at most
    SEGMENT_LINES, and batches that cut a segment still deliver every line once, in order."""
    lines = _lines(12_345)
    with Outbox(tmp_path / "o.sqlite", clock=ManualClock(1000.0)) as ob:
        assert ob.append(lines) == 0
        rows = list(ob._db.execute("SELECT id, count FROM segment ORDER BY id"))
        assert [n for _, n in rows] == [SEGMENT_LINES] * 12 + [345]
        last = rows[-1][0]
        assert ob.pending == 12_345
        got: list[bytes] = []
        while (batch := ob.peek(1_500)) is not None:  # 1,500 cuts every other segment
            got.extend(batch.body.split(b"\n"))
            ob.ack(batch)
        assert got == [line.encode() for line in lines]
        assert ob.stats().pending == 0
    with Outbox(tmp_path / "o.sqlite", clock=ManualClock(2000.0)) as ob:  # ids never repeat
        ob.append(_lines(3))
        assert [i for (i,) in ob._db.execute("SELECT id FROM segment")] == [last + 1]


def test_an_append_larger_than_the_cap_keeps_its_newest_lines_across_segments(tmp_path: Path) -> None:
    """The cap may cut into the segments of the very append that overflowed it: the oldest
    lines go, counted, and what stays is the newest, in order, with consistent counters."""
    line_size = len(_lines(1)[0]) + 1
    clock = ManualClock(1000.0)
    with Outbox(tmp_path / "o.sqlite", max_bytes=1_500 * line_size, clock=clock) as ob:
        ob.append(_lines(200))
        assert ob.append(_lines(2_500, start=200)) == 1_200  # 200 older + 1,000 of its own
        stats = ob.stats()
        assert (stats.pending, stats.dropped) == (1_500, 1_200)
        assert ob.pending_lines(1) == _lines(1, start=1_200)
        got: list[bytes] = []
        while (batch := ob.peek(700)) is not None:
            got.extend(batch.body.split(b"\n"))
            ob.ack(batch)
        assert got == [line.encode() for line in _lines(1_500, start=1_200)]
        stats = ob.stats()
        assert (stats.pending, stats.written, stats.dropped) == (0, 1_500, 1_200)
