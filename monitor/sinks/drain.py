"""The drain loop: outbox -> server in batches, with backoff, splitting and dead letters.

What each answer from the server does to a batch:

- 2xx: the batch is acknowledged and removed from the outbox.
- 413: the batch is split in half and each half sent; a single line too large
  is dead-lettered.
- 400, 422: lines the server names are dead-lettered, else the batch is bisected
  down to the bad lines; the rest are sent.
- 429, 5xx, 401/403/404, no answer: nothing is removed; retry after an
  exponential backoff, or after the server's Retry-After.

An outbox that cannot record a delivery (a full or failing state disk: removing the
points writes the file) leaves them in it: logged once per episode, the record (not the
send) tried again after the same kind of backoff, never the end of the drain loop. The
server holds them once; only a restart before the record sends them again (at least once).

Bisecting re-sends lines InfluxDB may already have stored from a partial write;
that is harmless because a point with the same series and timestamp overwrites itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from monitor.errors import OutboxError, WriteError
from monitor.model import Clock, WallClock
from monitor.sinks.batch import Batch, Rejected
from monitor.sinks.outbox import Outbox
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
    unrecorded: int = 0  # tries at recording a delivery the outbox refused (a full state disk)
    last_error: str | None = None
    last_success: float | None = None
    retry_at: float | None = None


class Drainer:
    """Moves points from the outbox to the server; one per outbox.

    The HTTP request runs in the writer's own thread (writers are blocking), one
    at a time; every outbox operation stays on the event loop's thread.
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
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="influx-writer")
        self._failing = False
        self._unrecorded = Backoff(initial=min(initial_backoff, max_backoff), maximum=max_backoff)
        self._stopping = False
        self._waiting: asyncio.Future[None] | None = None
        self._rejected = 0  # dead letters in the current episode
        # Batches the server took that the outbox could not remove yet (a full state disk):
        # recorded first at the next round, not sent again.
        self._unsettled: list[tuple[Batch, Sequence[Rejected]]] = []

    async def run(self) -> None:
        """Drain until `stop()`: full batches back to back, otherwise every `flush_interval`.

        `stop()` ends it cleanly: the request on the wire is settled, a wait is cut
        short. Cancelling the task is safe but wasteful: the request on the wire
        finishes in the writer's thread unacknowledged, so its points are sent again.
        """
        self._stopping = False
        while not self._stopping:
            try:
                await self.send_batches()
            except WriteError as exc:
                await self._pause(self._failed(exc))
                continue
            except OutboxError as exc:  # a full state disk: the points stay, sent again later
                await self._pause(self._not_recorded(exc))
                continue
            self._recorded()
            await self._pause(self.flush_interval)

    async def _pause(self, seconds: float) -> None:
        """Wait between rounds; `stop()` cuts the wait short."""
        self._waiting = asyncio.ensure_future(self._sleep(seconds))
        try:
            await self._waiting
        except asyncio.CancelledError:
            if not self._stopping or not self._waiting.cancelled():
                raise
        finally:
            self._waiting = None

    @property
    def failing(self) -> bool:
        """The last attempt failed: the server is down or refusing, until one succeeds."""
        return self._failing

    def stop(self) -> None:
        """Make `run()` return once the request under way is settled (waits are cut short)."""
        self._stopping = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def drain(self, timeout: float) -> int:
        """Deliver what is pending, for at most about `timeout` seconds; returns the points left.

        A request already under way is not cut short, so this can overrun by up to
        the writer's own timeout.
        """
        deadline = self.clock.now() + timeout
        while True:
            try:
                if await self.send_batches(deadline) == 0:
                    return self.outbox.pending
            except (WriteError, OutboxError) as exc:
                delay = self._failed(exc) if isinstance(exc, WriteError) else self._not_recorded(exc)
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    return self.outbox.pending
                await self._sleep(min(delay, remaining))
            if self.clock.now() >= deadline:
                return self.outbox.pending

    async def send_batches(self, deadline: float | None = None) -> int:
        """Send full batches back to back until a short one (or `deadline`, or `stop()`);
        returns how many points left the outbox (0: it was empty).

        Pipelined: while one batch is on the wire, the next is read and the previous
        acknowledged, so SQLite work overlaps the server's. Raises WriteError when
        the server should be tried again later; whatever was acknowledged or
        dead-lettered before that stays done.
        """
        total = 0
        while self._unsettled:  # taken by the server already: recorded, not sent again
            done, rejected = self._unsettled[0]
            self._settled(done, rejected, retry=False)
            self._unsettled.pop(0)
            total += len(done)
        batch = self.outbox.peek(self.batch_size)
        if batch is None:
            return total
        inflight = self._post(batch.body)
        while True:
            more = (
                len(batch) == self.batch_size
                and not self._stopping
                and (deadline is None or self.clock.now() < deadline)
            )
            following = self.outbox.peek(self.batch_size, after=batch.cursor) if more else None
            try:
                await inflight
            except WriteError as exc:
                if not _refusal(exc):
                    raise
                await self._deliver(batch, exc)
                accepted = False
            else:
                accepted = True
            if following is not None:
                inflight = self._post(following.body)
            if accepted:
                try:
                    self._settled(batch)
                except BaseException:
                    if following is not None:
                        await asyncio.wait([inflight])
                        if self._unsettled and not inflight.cancelled() and inflight.exception() is None:
                            self._unsettled.append((following, ()))  # taken too: recorded with it
                    raise
            total += len(batch)
            self._recovered()
            if following is None:
                if self._rejected:
                    log.info(
                        "%d point(s) moved to dead letters in all (monitor outbox status)", self._rejected
                    )
                    self._rejected = 0
                return total
            batch = following

    def _post(self, body: bytes) -> asyncio.Future[None]:
        return asyncio.ensure_future(self._write(body))

    def _write(self, body: bytes) -> asyncio.Future[None]:
        """The request, in the writer's own thread: one at a time, even across a cancel."""
        return asyncio.get_running_loop().run_in_executor(self._thread, self.writer.write, body)

    def close(self) -> None:
        """Close the writer once its last request is over."""
        self._thread.shutdown(wait=True)
        self.writer.close()

    def _settled(self, batch: Batch, rejected: Sequence[Rejected] = (), retry: bool = True) -> None:
        """Remove what the server took; an outbox that cannot (`OutboxError`) keeps the batch
        for the next round's record (`retry`: the first try, so it is noted once)."""
        try:
            self.stats.written += self.outbox.settle(batch, rejected)
        except OutboxError:
            if retry:
                self._unsettled.append((batch, rejected))
            raise
        self.stats.dead_letters += len(rejected)
        self.stats.batches += 1

    async def _deliver(self, batch: Batch, first: WriteError) -> None:
        """The slow path for a batch the server refused as too large or malformed:
        split or bisect it, set aside what is bad, send the rest a part at a time.

        The batch leaves the outbox only when all of it is sorted out; if the server
        becomes unreachable midway, all of it is sent again later (at least once).
        """
        lines = batch.lines
        rejected: list[Rejected] = []
        work: list[list[int]] = []
        self._refused(lines, list(range(len(lines))), first, work, rejected)
        while work:
            part = work.pop()
            try:
                await self._write(b"\n".join(lines[i] for i in part))
            except WriteError as exc:
                if not _refusal(exc):
                    raise
                self._refused(lines, part, exc, work, rejected)
        self._settled(batch, rejected)

    def _refused(
        self,
        lines: list[bytes],
        part: list[int],
        exc: WriteError,
        work: list[list[int]],
        rejected: list[Rejected],
    ) -> None:
        """One refused part: reject it if it is a single line, else split it (413),
        or reject the lines the server named and retry the rest, else bisect (400/422)."""
        if len(part) == 1:
            self._reject(lines, part, exc, rejected)
            return
        if exc.status in REJECTED:
            named = [part[i] for i in named_lines(str(exc), [lines[i] for i in part])]
            if named:
                self._reject(lines, named, exc, rejected)
                skip = set(named)
                keep = [i for i in part if i not in skip]
                if keep:
                    work.append(keep)
                return
        else:
            log.warning("%s: batch of %d points too large (413), splitting it", self.writer.target, len(part))
        self.stats.splits += 1
        mid = len(part) // 2
        work.extend((part[mid:], part[:mid]))

    def _reject(self, lines: list[bytes], part: list[int], exc: WriteError, rejected: list[Rejected]) -> None:
        reason = str(exc)
        rejected.extend(Rejected(i, exc.status, reason) for i in part)
        # once per episode at ERROR (a bad producer can send thousands), then DEBUG
        level = logging.DEBUG if self._rejected else logging.ERROR
        self._rejected += len(part)
        log.log(
            level,
            "%s rejected %d point(s) (HTTP %s), moved to dead letters: %s; first: %s",
            self.writer.target,
            len(part),
            exc.status,
            reason[:300],
            lines[part[0]].decode(errors="replace")[:200],
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

    def _not_recorded(self, exc: OutboxError) -> float:
        """The server may hold a batch the outbox could not remove: it stays and goes again."""
        delay = self._unrecorded.failure()
        self.stats.unrecorded += 1
        if self._unrecorded.failures == 1:
            log.error(
                "%s; the outbox cannot record a delivery: the points stay in it (the server has"
                " them; a restart before the record sends them again); retrying in %.1fs",
                exc,
                delay,
            )
        else:
            log.debug("%s; retrying in %.1fs", exc, delay)
        return delay

    def _recorded(self) -> None:
        if self._unrecorded.failures:
            self._unrecorded.success()
            log.info("the outbox records deliveries again")

    def _recovered(self) -> None:
        self.stats.last_success = self.clock.now()
        self.stats.retry_at = None
        self.backoff.success()
        if self._failing:
            self._failing = False
            log.info("%s reachable again; draining the outbox", self.writer.target)


def _refusal(exc: WriteError) -> bool:
    """The server read the batch and refused (part of) it: retrying as is cannot help."""
    return exc.status == TOO_LARGE or exc.status in REJECTED


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
    except (ValueError, RecursionError):  # a body nested past the parser's depth: shown as sent
        return message
    if isinstance(body, dict):
        parts = [str(body.get(k)) for k in ("error", "message") if body.get(k)]
        if parts:
            return message[:start] + " ".join(parts)
    return message
