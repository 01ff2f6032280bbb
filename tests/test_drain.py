"""The drain loop's answers to 413, 429, 5xx, 400 and silence.

These use `tests.fake_influx.FakeInflux`: real servers cannot be made to answer
413/429/5xx on demand. Time is a ManualClock the injected sleep advances, so
backoffs of minutes take no time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from monitor.config import Influx
from monitor.errors import WriteError
from monitor.model import ManualClock
from monitor.sinks.drain import Backoff, Drainer, named_lines
from monitor.sinks.influx import InfluxV2Writer
from monitor.sinks.influx_v1 import InfluxV1Writer
from monitor.sinks.outbox import Outbox
from monitor.sinks.writer import LineWriter, parse_retry_after
from tests.fake_influx import Answer, FakeInflux
from tests.services import free_port

OK: Answer = (204, {}, "")


def _lines(n: int) -> list[str]:
    return [f"sensor,sensor=s{i % 3},station=ps-1 value={i}.0,quality=0i {i}000000000" for i in range(n)]


class Harness:
    def __init__(self, tmp_path: Path, writer: LineWriter, batch_size: int = 100) -> None:
        self.clock = ManualClock(0.0)
        self.delays: list[float] = []
        self.outbox = Outbox(tmp_path / "outbox.sqlite", clock=self.clock)

        async def sleep(seconds: float) -> None:
            self.delays.append(seconds)
            self.clock.advance(seconds)

        self.drainer = Drainer(
            self.outbox, writer, self.clock, batch_size=batch_size, max_backoff=60, sleep=sleep
        )
        self.drainer.backoff.jitter = 0.0

    def drain(self, timeout: float = 3600) -> int:
        return asyncio.run(self.drainer.drain(timeout))


def _v1(url: str) -> InfluxV1Writer:
    return InfluxV1Writer(Influx(url=url, api="v1", database="station"))


def test_429_waits_for_retry_after_then_delivers(tmp_path: Path) -> None:
    answers = iter([(429, {"Retry-After": "7"}, "slow down"), (503, {}, "busy")])

    def script(lines: list[str]) -> Answer:
        return next(answers, OK)

    with FakeInflux(script).running() as server:
        h = Harness(tmp_path, _v1(server.url))
        h.outbox.append(_lines(50))
        assert h.drain() == 0
        assert server.stored == _lines(50)
    assert h.delays == [7.0, 2.0]  # Retry-After, then the exponential backoff's second step
    assert h.outbox.stats().written == 50
    # delivered: not backing off any more (the console's "InfluxDB not taking points" goes),
    # though the failures and the last error stay on record
    assert h.drainer.stats.retry_at is None and h.drainer.stats.failures == 2


def test_unreachable_server_backs_off_exponentially_and_keeps_everything(tmp_path: Path) -> None:
    h = Harness(tmp_path, _v1(f"http://127.0.0.1:{free_port()}"))
    h.outbox.append(_lines(10))
    assert h.drain(timeout=200) == 10
    assert h.delays[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert h.outbox.stats().pending == 10
    assert h.drainer.stats.last_error is not None and "cannot reach" in h.drainer.stats.last_error
    assert h.drainer.stats.retry_at is not None  # backing off: `failing` in /api/health


def test_413_splits_until_batches_fit_and_dead_letters_a_single_oversized_line(tmp_path: Path) -> None:
    huge = "sensor,sensor=big,station=ps-1 value=1.0 " + "9" * 5000
    lines = _lines(54)
    lines[40] = huge

    def script(body: list[str]) -> Answer:
        if len(body) > 8 or sum(map(len, body)) > 4000:
            return (413, {}, '{"error":"Request Entity Too Large"}')
        return OK

    with FakeInflux(script).running() as server:
        h = Harness(tmp_path, _v1(server.url), batch_size=100)
        h.outbox.append(lines)
        assert h.drain() == 0
        assert sorted(server.stored) == sorted(lines[:40] + lines[41:])
        assert len(server.stored) == len(set(server.stored))  # each line once
    (dead,) = h.outbox.dead_letters()
    assert dead.line == huge and dead.status == 413
    assert h.delays == []  # splitting is not a failure


def test_400_bisects_to_the_bad_line_and_delivers_the_rest(tmp_path: Path) -> None:
    lines = _lines(64)
    bad = lines[37] = "sensor,sensor=s1 value=oops 37000000000"

    def script(body: list[str]) -> Answer:
        if bad in body:
            return (400, {}, '{"error":"field type conflict"}')  # names no line: bisect
        return OK

    with FakeInflux(script).running() as server:
        h = Harness(tmp_path, _v1(server.url), batch_size=64)
        h.outbox.append(lines)
        assert h.drain() == 0
        assert sorted(server.stored) == sorted(line for line in lines if line != bad)
        assert server.requests <= 2 * 6 + 2  # log2(64) levels, two requests each
    (dead,) = h.outbox.dead_letters()
    assert dead.line == bad and dead.status == 400 and "field type conflict" in dead.reason
    stats = h.outbox.stats()
    assert (stats.pending, stats.dead_letters, stats.written) == (0, 1, 63)


def test_named_lines_reads_influxdb_1_and_2_errors() -> None:
    lines = [b"a v=1 1", b"b v=x 2", b"c v=3 3"]
    v1 = 'HTTP 400 {"error":"partial write: unable to parse \'b v=x 2\': invalid number dropped=0"}'
    assert named_lines(v1, lines) == [1]
    v2 = 'HTTP 400 {"code":"invalid","message":"failed to parse line protocol: line 3: bad"}'
    assert named_lines(v2, lines) == [2]
    assert named_lines("HTTP 400 something else", lines) == []


def test_v2_writer_maps_status_and_retry_after(tmp_path: Path) -> None:
    def script(lines: list[str]) -> Answer:
        return (429, {"Retry-After": "12"}, '{"code":"too many requests"}')

    with FakeInflux(script).running() as server:
        writer = InfluxV2Writer(Influx(url=server.url, org="barton", bucket="station"))
        with pytest.raises(WriteError) as info:
            writer.write(b"m v=1 1")
        writer.close()
    assert info.value.status == 429
    assert info.value.retry_after == 12.0


def test_v2_writer_reports_connection_errors_without_status() -> None:
    writer = InfluxV2Writer(Influx(url=f"http://127.0.0.1:{free_port()}", org="o", bucket="b", timeout=2))
    with pytest.raises(WriteError) as info:
        writer.write(b"m v=1 1")
    writer.close()
    assert info.value.status is None


def test_backoff_and_retry_after_parsing() -> None:
    b = Backoff(initial=1, maximum=10, jitter=0)
    assert [b.failure() for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    assert b.failure(retry_after=3) == 3
    assert b.failure(retry_after=3600) == 10  # never longer than max_backoff
    b.success()
    assert b.failure() == 1
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0 - 60) == 60.0
    assert parse_retry_after("soon") is None


def test_cancelled_run_never_overlaps_requests_and_resends_the_unacknowledged(tmp_path: Path) -> None:
    """The daemon cancels the drain task at shutdown, then drains once more; the
    request that was on the wire must finish first, and its points are sent again."""
    release = threading.Event()
    on_wire = threading.Event()
    busy = [0, 0]  # now, most at once

    def script(lines: list[str]) -> Answer:
        busy[0] += 1
        busy[1] = max(busy)
        on_wire.set()
        release.wait(10)  # a slow server: held until the test lets go
        busy[0] -= 1
        return OK

    with FakeInflux(script).running() as server:
        h = Harness(tmp_path, _v1(server.url), batch_size=100)
        h.outbox.append(_lines(30))

        async def scenario() -> int:
            task = asyncio.create_task(h.drainer.run())
            await asyncio.to_thread(on_wire.wait, 10)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert h.outbox.pending == 30  # not acknowledged: it stays
            # let go of the first request only after the drain has had time to (wrongly) start
            # a second one beside it; a correct drainer queues it behind the first
            asyncio.get_running_loop().call_later(0.05, release.set)
            return await h.drainer.drain(30)

        assert asyncio.run(scenario()) == 0
        h.drainer.close()
    assert busy[1] == 1
    assert server.stored == _lines(30) * 2  # at least once: the cancelled request counted as unsent
