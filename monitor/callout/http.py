"""SMS, voice and push through HTTP providers, and the dead-man heartbeat: the callout's
one module that imports httpx; its errors become `WriteError`.

A provider is described by a request template (see `monitor.config.notify.HttpChannel`),
so Twilio, a voice gateway and ntfy need no code of their own.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import httpx

from monitor.config import redact_url
from monitor.config.notify import PLACEHOLDER, HttpChannel
from monitor.errors import WriteError


def fill(template: str, values: dict[str, str], encode: bool = False) -> str:
    """`{to}` -> the value (URL-encoded in a URL); no other syntax, so a template cannot
    reach into Python objects the way `str.format` can."""

    def one(match: re.Match[str]) -> str:
        value = values.get(match.group(1), "")
        return quote(value, safe="") if encode else value

    return PLACEHOLDER.sub(one, template)


class HttpSender:
    """One provider; a non-2xx answer or no answer is a `WriteError` (the queue retries)."""

    def __init__(self, name: str, config: HttpChannel, station: str) -> None:
        self.name = name
        self.config = config
        self.station = station
        auth = None
        if config.username is not None and config.password is not None:
            auth = httpx.BasicAuth(config.username, config.password.get_secret_value())
        self._client = httpx.AsyncClient(timeout=config.timeout, auth=auth)

    async def send(
        self, address: str, subject: str, text: str, link: str | None = None, priority: str = ""
    ) -> None:
        c = self.config
        values = {
            "to": address,
            "subject": subject,
            "text": text,
            "station": self.station,
            "link": link or "",
            "priority": priority,
        }
        # As UTF-8 bytes: httpx encodes a str header as ASCII and raises on `Bärton`.
        headers: dict[str, str | bytes] = {
            "User-Agent": "station-monitor",
            **{k: fill(v, values).encode("utf-8") for k, v in c.headers.items()},
        }
        if c.token is not None:
            headers["Authorization"] = f"Bearer {c.token.get_secret_value()}"
        url = fill(c.url, values, encode=True)
        kwargs: dict[str, object] = {}
        if c.form is not None:
            kwargs["data"] = {k: fill(v, values) for k, v in c.form.items()}
        elif c.json_body is not None:
            kwargs["json"] = {k: fill(v, values) for k, v in c.json_body.items()}
        elif c.body is not None:
            kwargs["content"] = fill(c.body, values).encode("utf-8")
        where = redact_url(url.split("?", 1)[0])  # logged and shown in the notify alarm
        try:
            resp = await self._client.request(c.method, url, headers=headers, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            raise WriteError(f"channel {self.name} {where}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 300:
            raise WriteError(f"channel {self.name} {where}: HTTP {resp.status_code}", status=resp.status_code)

    async def aclose(self) -> None:
        await self._client.aclose()


class Pinger:
    """GETs the heartbeat URL; a failure is a `WriteError` (logged once per episode by the caller)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._client = httpx.AsyncClient(timeout=timeout, headers={"User-Agent": "station-monitor"})

    async def ping(self) -> None:
        where = redact_url(self.url.split("?", 1)[0])
        try:
            resp = await self._client.get(self.url)
        except httpx.HTTPError as exc:
            raise WriteError(f"heartbeat {where}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 300:
            raise WriteError(f"heartbeat {where}: HTTP {resp.status_code}", status=resp.status_code)

    async def aclose(self) -> None:
        await self._client.aclose()
