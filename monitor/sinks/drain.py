"""The drain loop: outbox -> server in batches, with backoff, splitting and dead letters.

What each answer from the server does to a batch:

- 2xx: the batch is acknowledged and removed from the outbox.
- 413: the batch is split in half and each half sent; a single line too large
  is dead-lettered.
- 400, 422: lines the server names are dead-lettered, else the batch is bisected
  down to the bad lines; the rest are sent.
- 429, 5xx, 401/403/404, no answer: nothing is removed; retry after an
  exponential backoff, or after the server's Retry-After.

Bisecting re-sends lines InfluxDB may already have stored from a partial write;
that is harmless because a point with the same series and timestamp overwrites itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from monitor.errors import WriteError
from monitor.model import Clock, WallClock
from monitor.sinks.outbox import Batch, Outbox
from monitor.sinks.writer import LineWriter

log = logging.getLogger(__name__)

REJECTED = (400, 422)
TOO_LARGE = 413
_LINE_NUMBER = re.compile(r"\bline (\d+)\b", re.IGNORECASE)


class Backoff:
    """Exponential backoff between failed attempts, overridden by the server's Retry-After."""

    def __init__(
        self, initial: float = 1.0, maximum: float = 300.0, factor: float = 2.0, jitter: float = 0.1
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.failures = 0
        self._random = random.Random()

    def failure(self, retry_after: float | None = None) -> float:
        """Seconds to wait before the next attempt."""
        self.failures += 1
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.maximum)
        delay = min(self.initial * self.factor ** (self.failures - 1), self.maximum)
        if self.jitter:
            delay *= 1.0 + self.jitter * (2.0 * self._random.random() - 1.0)
        return min(delay, self.maximum)

    def success(self) -> None:
        self.failures = 0


@dataclass(slots=True)
class DrainStats:
    """This process's drain counters, for the metrics endpoint and logs."""

    written: int = 0
    batches: int = 0
    failures: int = 0
    splits: int = 0
    dead_letters: int = 0
    last_error: str | None = None
    last_success: float | None = None
    retry_at: float | None = None


class Drainer:
    """Moves points from the outbox to the server; one per outbox.

    The HTTP request runs in a worker thread (writers are blocking); every
    outbox operation stays on the event loop's thread.
    """

    def __init__(
        self,
        outbox: Outbox,
        writer: LineWriter,
        clock: Clock | None = None,
        batch_size: int = 5000,
        flush_interval: float = 1.0,
        max_backoff: float = 300.0,
        initial_backoff: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.outbox = outbox
        self.writer = writer
        self.clock: Clock = clock or WallClock()
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.backoff = Backoff(initial=initial_backoff, maximum=max_backoff)
        self.stats = DrainStats()
        self._sleep = sleep
        self._failing = False
        self._stopping = False

    async def run(self) -> None:
        """Drain until `stop()`: full batches back to back, otherwise every `flush_interval`.

        Stop it with `stop()` rather than cancelling the task: a cancelled task
        leaves its request running in the worker thread, unacknowledged.
        """
        self._stopping = False
        while not self._stopping:
            try:
                sent = await self.send_batch()
            except WriteError as exc:
                await self._sleep(self._failed(exc))
                continue
            if sent < self.batch_size:
                await self._sleep(self.flush_interval)

    def stop(self) -> None:
        """Make `run()` return after the request under way (and any wait) is over."""
        self._stopping = True

    async def drain(self, timeout: float) -> int:
        """Deliver what is pending, for at most about `timeout` seconds; returns the points left.

        A request already under way is not cut short, so this can overrun by up to
        the writer's own timeout.
        """
        deadline = self.clock.now() + timeout
        while True:
            try:
                if await self.send_batch() == 0:
                    return self.outbox.pending
            except WriteError as exc:
                delay = self._failed(exc)
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    return self.outbox.pending
                await self._sleep(min(delay, remaining))
            if self.clock.now() >= deadline:
                return self.outbox.pending

    async def send_batch(self) -> int:
        """Send the oldest batch; returns how many points it held (0: the outbox is empty).

        Raises WriteError when the server should be tried again later; whatever was
        acknowledged or dead-lettered before that stays done.
        """
        batch = self.outbox.peek(self.batch_size)
        if not batch.ids:
            return 0
        work = [batch]
        while work:
            part = work.pop()
            try:
                await asyncio.to_thread(self.writer.write, part.body())
            except WriteError as exc:
                if exc.status == TOO_LARGE:
                    self._split_or_reject(part, exc, work)
                elif exc.status in REJECTED:
                    self._isolate(part, exc, work)
                else:
                    raise
                continue
            written = self.outbox.ack(part)
            self.stats.written += written
            self.stats.batches += 1
        self._recovered()
        return len(batch)

    def _split_or_reject(self, part: Batch, exc: WriteError, work: list[Batch]) -> None:
        if len(part) == 1:
            self._reject(part, exc)
            return
        self.stats.splits += 1
        first, second = part.split()
        log.warning("%s: batch of %d points too large (413), splitting it", self.writer.target, len(part))
        work.extend((second, first))

    def _isolate(self, part: Batch, exc: WriteError, work: list[Batch]) -> None:
        """Dead-letter the lines the server named, or bisect until the bad ones are alone."""
        if len(part) == 1:
            self._reject(part, exc)
            return
        named = named_lines(str(exc), part.lines)
        if named:
            bad = Batch([part.ids[i] for i in named], [part.lines[i] for i in named])
            self._reject(bad, exc)
            skip = set(named)
            keep = [i for i in range(len(part)) if i not in skip]
            if keep:
                work.append(Batch([part.ids[i] for i in keep], [part.lines[i] for i in keep]))
            return
        self.stats.splits += 1
        first, second = part.split()
        work.extend((second, first))

    def _reject(self, part: Batch, exc: WriteError) -> None:
        moved = self.outbox.dead_letter(part, exc.status, str(exc))
        self.stats.dead_letters += moved
        sample = part.lines[0].decode(errors="replace")[:200]
        log.error(
            "%s rejected %d point(s) (HTTP %s), moved to dead letters: %s; first: %s",
            self.writer.target,
            moved,
            exc.status,
            str(exc)[:300],
            sample,
        )

    def _failed(self, exc: WriteError) -> float:
        delay = self.backoff.failure(exc.retry_after)
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        self.stats.retry_at = self.clock.now() + delay
        if not self._failing:
            self._failing = True
            log.error(
                "%s; %d point(s) wait in the outbox, retrying in %.1fs", exc, self.outbox.pending, delay
            )
        else:
            log.debug("%s; retrying in %.1fs", exc, delay)
        return delay

    def _recovered(self) -> None:
        self.stats.last_success = self.clock.now()
        self.stats.retry_at = None
        self.backoff.success()
        if self._failing:
            self._failing = False
            log.info("%s reachable again; draining the outbox", self.writer.target)


def named_lines(message: str, lines: list[bytes]) -> list[int]:
    """Indexes of the lines a 400 answer names.

    InfluxDB 1.x says `unable to parse '<line>': ...`; 2.x says `line 3: ...`
    (1-based, in the body it was sent). Anything else: [] and the caller bisects.
    """
    text = _error_text(message)
    found: set[int] = set()
    if "unable to parse '" in text:
        for i, raw in enumerate(lines):
            if f"unable to parse '{raw.decode(errors='replace')}'" in text:
                found.add(i)
    if not found:
        for match in _LINE_NUMBER.finditer(text):
            n = int(match.group(1))
            if 1 <= n <= len(lines):
                found.add(n - 1)
    return sorted(found)


def _error_text(message: str) -> str:
    """The server's error text, with a JSON body (`{"error": ...}`) decoded."""
    start = message.find("{")
    if start < 0:
        return message
    try:
        body = json.loads(message[start:])
    except ValueError:
        return message
    if isinstance(body, dict):
        parts = [str(body.get(k)) for k in ("error", "message") if body.get(k)]
        if parts:
            return message[:start] + " ".join(parts)
    return message
