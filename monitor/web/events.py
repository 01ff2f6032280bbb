"""Server-sent events: alarm transitions at once, changed sensor readings every few seconds."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from monitor.alarms import Entry
from monitor.model import Alarm

log = logging.getLogger(__name__)

_CLIENT_QUEUE = 256
_CLOSE = ""


def frame(event: str, data: object) -> str:
    """One SSE frame; JSON is one line, so one `data:` line is enough."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), allow_nan=False)}\n\n"


class Hub:
    """Fans alarm transitions out to every open console; a client that cannot keep up is dropped.

    At most `limit` streams are open at once (the route answers 503 past it), and after
    the first full `sensors` snapshot a client gets only `changes`: the sensors whose
    reading changed and the health block when it changed. The snapshot itself is taken
    once per refresh for all clients, not once per client.
    """

    def __init__(self, limit: int = 16) -> None:
        self._clients: set[asyncio.Queue[str]] = set()
        self.closed = False
        self.limit = limit
        self.refused = 0  # streams refused at the limit
        self._snap: tuple[float, dict[str, Any]] | None = None

    @property
    def clients(self) -> int:
        return len(self._clients)

    def on_transition(self, entry: Entry, alarm: Alarm) -> None:
        """`AlarmManager.listen` callback; runs on the event loop."""
        text = frame("alarm", {"event": entry.event, "entry_id": entry.id, "alarm": alarm.to_json()})
        for queue in list(self._clients):
            if queue.full():
                self._clients.discard(queue)
                log.info("console client too slow for live updates; it will reconnect")
                queue.get_nowait()
                queue.put_nowait(_CLOSE)
            else:
                queue.put_nowait(text)

    def close(self) -> None:
        """End every stream (daemon shutdown) so the server does not wait on them."""
        self.closed = True
        for queue in list(self._clients):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(_CLOSE)
        self._clients.clear()

    def open(self) -> asyncio.Queue[str] | None:
        """Take a place for a new stream; None when `limit` streams are open already."""
        if len(self._clients) >= self.limit:
            self.refused += 1
            if self.refused == 1 or self.refused % 100 == 0:
                log.warning(
                    "console: live-update stream refused at the limit of %d (%d so far)",
                    self.limit,
                    self.refused,
                )
            return None
        queue: asyncio.Queue[str] = asyncio.Queue(_CLIENT_QUEUE)
        self._clients.add(queue)
        return queue

    def _shared(self, snapshot: Callable[[], dict[str, Any]], every: float) -> dict[str, Any]:
        """One snapshot per refresh period, shared by every client."""
        now = time.monotonic()
        if self._snap is None or now - self._snap[0] >= every / 2:
            self._snap = (now, snapshot())
        return self._snap[1]

    async def stream(
        self, queue: asyncio.Queue[str], snapshot: Callable[[], dict[str, Any]], every: float
    ) -> AsyncIterator[str]:
        """One client's stream: a snapshot now, changes every `every` seconds, alarms as they happen."""
        if self.closed:
            self._clients.discard(queue)
            return
        try:
            yield "retry: 2000\n\n"
            first = self._shared(snapshot, every)
            yield frame("sensors", first)
            sent = {str(s["id"]): s for s in first.get("sensors", [])}
            health = first.get("health")
            while True:
                try:
                    text = await asyncio.wait_for(queue.get(), timeout=every)
                except TimeoutError:
                    snap = self._shared(snapshot, every)
                    changed = [s for s in snap.get("sensors", []) if sent.get(str(s["id"])) != s]
                    sent.update((str(s["id"]), s) for s in changed)
                    delta: dict[str, Any] = {"time": snap.get("time"), "sensors": changed}
                    if snap.get("health") != health:
                        health = delta["health"] = snap.get("health")
                    yield frame("changes", delta)
                    continue
                if text == _CLOSE:
                    return
                yield text
        finally:
            self._clients.discard(queue)
