"""The drainer on a full state disk with InfluxDB up: the server took a batch, and the
outbox cannot record that (removing the delivered points writes the file, and the disk has
no byte left). The drainer keeps running and tries again; the points stay in the outbox
until the disk has room, then leave; what the server took is not sent again meanwhile
(only a restart before the record would send it again: at least once). Before, its `OutboxError`
ended the drainer's task, and with it the daemon, with a traceback from the outbox (seen
once in tests/test_disk_full.py under load, when a server of another test took the port its
"unreachable" InfluxDB was given and answered).

A real VictoriaMetrics and a real tmpfs filled to its last byte (needs root).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from monitor.config import Influx
from monitor.sinks.drain import Drainer
from monitor.sinks.outbox import Outbox
from monitor.sinks.writer import make_writer
from tests.conftest import fill_disk
from tests.services import VictoriaMetrics

LINES = [
    f"diskfull,sensor=s{i % 3},station=ps-full value={i}.0 {1_700_000_000 + i}000000000" for i in range(3000)
]


async def until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait, bounded, for `check()` (a condition, not a time) while the drainer runs."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_a_delivery_the_full_disk_cannot_record_is_retried_not_fatal(
    tiny_disk: Path, victoria: VictoriaMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tiny_disk / "outbox.sqlite")
    outbox.append(LINES)
    ballast = fill_disk(tiny_disk)
    influx = Influx.model_validate({"url": victoria.url, "org": "o", "bucket": "disk-full"})
    drainer = Drainer(outbox, make_writer(influx), batch_size=1000, flush_interval=0.05, max_backoff=0.2)
    before = victoria.lines_taken()

    async def scenario() -> None:
        task = asyncio.ensure_future(drainer.run())
        try:
            await until("the server to take the first batch", lambda: victoria.lines_taken() >= before + 1000)
            await until("the batch pipelined behind it", lambda: victoria.lines_taken() >= before + 2000)
            tries = drainer.stats.unrecorded
            await until("two more tries at recording them", lambda: drainer.stats.unrecorded >= tries + 2)
            assert not task.done(), task.exception() if task.done() else None
            assert outbox.pending == len(LINES)  # nothing removed: the disk refused the record of it
            # Each try records the delivery again, it does not send it again: before, every
            # backoff re-sent the batch (and the one pipelined behind it), and a
            # VictoriaMetrics without dedup kept one more copy of each point per try.
            assert victoria.lines_taken() == before + 2000  # the batch and the one pipelined behind it
            ballast.unlink()  # an operator frees space: the drainer finishes by itself
            await until("the outbox to empty", lambda: outbox.pending == 0)
            assert not task.done()
        finally:
            drainer.stop()
            await asyncio.wait_for(task, 30)

    with caplog.at_level(logging.INFO, logger="monitor.sinks.drain"):
        asyncio.run(scenario())
    drainer.close()
    outbox.close()
    victoria.wait_for_lines(before + len(LINES))
    assert victoria.lines_taken() == before + len(LINES)  # every point once: no copy
    said = [r.getMessage() for r in caplog.records if "cannot record" in r.getMessage()]
    assert len(said) == 1 and "database or disk is full" in said[0], said  # once per episode
