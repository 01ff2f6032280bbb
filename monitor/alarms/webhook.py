"""Webhook notifier for paging services: HTTP POST of JSON, with a timeout and retries.

The one module that imports httpx; its errors become `WriteError`. Retries on
connection errors, timeouts, 429 and 5xx with doubling back-off; another 4xx
is the receiver refusing the message, so it is not retried.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from monitor.alarms.notify import Flood
from monitor.config import Webhook, redact_url
from monitor.errors import WriteError, WriteTimeoutError
from monitor.model import Alarm

log = logging.getLogger(__name__)

# The error map: every exception httpx defines (a test checks none is missing) -> what
# the last attempt's failure becomes. Timeouts are typed (WriteTimeoutError); an invalid
# URL or a stream misuse is not retried-into-success but still reported as a WriteError.
ERRORS: dict[type[Exception], type[WriteError]] = {
    httpx.TimeoutException: WriteTimeoutError,
    httpx.HTTPError: WriteError,  # transport, protocol, proxy, redirects, status
    httpx.InvalidURL: WriteError,
    httpx.CookieConflict: WriteError,
    httpx.StreamError: WriteError,
}
CAUGHT = tuple(ERRORS)


class WebhookNotifier:
    """POSTs `{"type": "alarm"|"reminder"|"flood", "station": ..., ...}` to `config.url`."""

    name = "webhook"

    def __init__(self, config: Webhook, station: str, backoff: float = 1.0) -> None:
        self.config = config
        self.station = station
        self.backoff = backoff
        headers = {"User-Agent": "station-monitor"}
        if config.token is not None:
            headers["Authorization"] = f"Bearer {config.token.get_secret_value()}"
        self._client = httpx.AsyncClient(timeout=config.timeout, headers=headers)

    async def notify(self, alarm: Alarm, reminder: bool = False) -> None:
        await self.post({"type": "reminder" if reminder else "alarm", "alarm": alarm.to_json()})

    async def flood(self, flood: Flood) -> None:
        await self.post({"type": "flood", "text": flood.text, "flood": flood.to_json()})

    async def post(self, body: dict[str, object]) -> None:
        payload = {**body, "station": self.station}
        attempts = self.config.retries + 1
        delay = self.backoff
        problem = ""
        status: int | None = None
        timed_out = False
        for attempt in range(1, attempts + 1):
            try:
                resp = await self._client.post(self.config.url, json=payload)
            except CAUGHT as exc:
                problem, status = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, None
                timed_out = isinstance(exc, httpx.TimeoutException)
            else:
                timed_out = False
                if resp.status_code < 300:
                    return
                status = resp.status_code
                problem = f"HTTP {status}"
                if status < 500 and status != 429:
                    break
            if attempt < attempts:
                log.debug("webhook %s attempt %d/%d: %s", self._where(), attempt, attempts, problem)
                await asyncio.sleep(delay)
                delay *= 2
        error = WriteTimeoutError if timed_out else WriteError
        raise error(f"webhook {self._where()}: {problem} after {attempts} attempt(s)", status=status)

    def _where(self) -> str:
        """The URL without query string (it may carry a key) or password."""
        return redact_url(self.config.url.split("?", 1)[0])

    async def aclose(self) -> None:
        await self._client.aclose()
