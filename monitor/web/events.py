"""Server-sent events: alarm transitions at once, sensor readings every few seconds."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

from monitor.alarms import Entry
from monitor.model import Alarm

log = logging.getLogger(__name__)

_CLIENT_QUEUE = 256
_CLOSE = ""


def frame(event: str, data: object) -> str:
    """One SSE frame; JSON is one line, so one `data:` line is enough."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), allow_nan=False)}\n\n"


class ConsoleFeed:
    """Fans alarm transitions out to every open console; a client that cannot keep up is dropped."""

    def __init__(self) -> None:
        self._clients: set[asyncio.Queue[str]] = set()
        self.closed = False

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

    async def stream(self, snapshot: Callable[[], object], every: float) -> AsyncIterator[str]:
        """One client's stream: a snapshot now and every `every` seconds, alarms as they happen."""
        queue: asyncio.Queue[str] = asyncio.Queue(_CLIENT_QUEUE)
        if self.closed:
            return
        self._clients.add(queue)
        try:
            yield "retry: 2000\n\n"
            yield frame("sensors", snapshot())
            while True:
                try:
                    text = await asyncio.wait_for(queue.get(), timeout=every)
                except TimeoutError:
                    yield frame("sensors", snapshot())
                    continue
                if text == _CLOSE:
                    return
                yield text
        finally:
            self._clients.discard(queue)
