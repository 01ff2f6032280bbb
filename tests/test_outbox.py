"""The SQLite outbox on its own: commit, peek, ack, cap, dead letters, crash safety."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from monitor.model import Condition, ConditionState, ManualClock, Rule
from monitor.sinks.outbox import Outbox


def _lines(n: int, start: int = 0) -> list[str]:
    """Points of equal length, so a byte cap is a count of points."""
    return [
        f"sensor,sensor=s{i % 7},station=ps-1 value={i:06d}.5,quality=0i {i:06d}000000000"
        for i in range(start, start + n)
    ]


def test_points_stay_until_acknowledged(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    with Outbox(tmp_path / "o.sqlite", clock=clock) as ob:
        ob.append(_lines(10))
        clock.advance(5)
        ob.append(_lines(5, start=10))
        first = ob.peek(4)
        assert [b.decode() for b in first.lines] == _lines(4)
        assert ob.peek(4).ids == first.ids  # peeking removes nothing
        assert ob.ack(first) == 4
        stats = ob.stats()
        assert (stats.pending, stats.written, stats.dropped, stats.dead_letters) == (11, 4, 0, 0)
        assert stats.oldest_queued == 1000.0
        assert stats.pending_bytes == sum(len(s) for s in _lines(15)[4:])
    with Outbox(tmp_path / "o.sqlite", clock=clock) as again:  # survives a reopen
        assert [b.decode() for b in again.peek(100).lines] == _lines(15)[4:]


def test_cap_drops_oldest_counts_and_alarms(tmp_path: Path) -> None:
    conditions: list[Condition] = []
    line_size = len(_lines(1)[0])
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
    assert [b.decode() for b in ob.peek(1).lines] == _lines(1, start=35)  # the oldest went first
    assert len(conditions) == 1
    raised = conditions[0]
    assert (raised.rule, raised.state, raised.time, raised.value) == (
        Rule.OUTBOX,
        ConditionState.ACTIVE,
        60.0,
        30.0,
    )
    ob.ack(ob.peek(20))  # the server catches up: below 90 % of the cap clears the alarm
    assert [c.state for c in conditions] == [ConditionState.ACTIVE, ConditionState.CLEARED]
    assert conditions[1].value == 35.0
    ob.close()


def test_ack_of_rows_the_cap_already_dropped_counts_only_what_it_removed(tmp_path: Path) -> None:
    line_size = len(_lines(1)[0])
    ob = Outbox(tmp_path / "o.sqlite", max_bytes=10 * line_size)
    ob.append(_lines(10))
    in_flight = ob.peek(10)
    ob.append(_lines(4, start=10))  # drops 4 of the in-flight rows
    assert ob.ack(in_flight) == 6
    stats = ob.stats()
    assert (stats.pending, stats.written, stats.dropped) == (4, 6, 4)
    assert [b.decode() for b in ob.peek(10).lines] == _lines(4, start=10)
    ob.close()


def test_dead_letters_keep_line_status_and_reason(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.sqlite", clock=ManualClock(7.0)) as ob:
        ob.append(_lines(3))
        batch = ob.peek(3)
        bad = type(batch)([batch.ids[1]], [batch.lines[1]])
        assert ob.dead_letter(bad, 400, "unable to parse") == 1
        assert [b.decode() for b in ob.peek(3).lines] == [_lines(3)[0], _lines(3)[2]]
        (dead,) = ob.dead_letters()
        assert (dead.status, dead.reason, dead.line, dead.failed) == (
            400,
            "unable to parse",
            _lines(3)[1],
            7.0,
        )
        assert ob.stats().dead_letters == 1
        assert ob.stats().pending == 2


def test_kill_9_while_appending_loses_no_committed_point(tmp_path: Path) -> None:
    """A real process appends in a loop and prints each committed batch; SIGKILL it mid-way.

    Every batch it reported as committed must be in the outbox, whole, and the
    counters must match the rows."""
    path = tmp_path / "o.sqlite"
    script = textwrap.dedent(
        f"""
        import sys
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
        rows = ob.peek(10**7)
        batches = {int(b.split(b" ")[1][2:-2]) for b in rows.lines}
        assert set(committed) <= batches
        assert len(rows) == 1000 * len(batches)  # no torn transaction
        assert ob.stats().pending == len(rows)
        assert ob.stats().pending_bytes == sum(len(b) for b in rows.lines)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
