"""The console's front door: checks that run before any route reads a byte of the body.

A pure ASGI middleware (not FastAPI dependencies) because dependencies run after
FastAPI has read and parsed the JSON body: an unauthenticated 300 MB POST was read
whole before the token check. Here, in order, before the app sees the request:

1. Host allow-list: `localhost`, the loopback addresses, `console.host` and
   `console.allowed_hosts`; anything else is 421 (a DNS-rebinding page in the
   operator's browser names its own host).
2. Writes (any method but GET/HEAD/OPTIONS) need the bearer token, checked from
   the headers alone: 403 when no token is configured, 401 when it is wrong. Paths in
   `open_writes` carry their own credential (the callout's signed acknowledge link).
3. The body is limited to `console.max_body`: a Content-Length above it is 413
   at once; a chunked body is read here, counted as it arrives, cut at the limit.

Every response also carries anti-framing and no-sniff headers.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from monitor.config import Console

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The 403's words, shown as they are by the console beside any write (alarm, incident, meter).
WRITES_DISABLED = "writes are disabled on this gateway (no console.token in the station config)"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-frame-options", b"DENY"),
    # Scripts only from the console itself; inline style attributes allowed (server-made pages use them).
    (
        b"content-security-policy",
        b"frame-ancestors 'none'; default-src 'self'; style-src 'self' 'unsafe-inline'; object-src 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def host_name(header: str) -> str:
    """`Host` header -> lower-case name without port: `[::1]:8080` -> `::1`."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def allowed_hosts(console: Console) -> frozenset[str]:
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in console.allowed_hosts}
    if console.host not in WILDCARD_BINDS:
        names.add(host_name(console.host))
    return frozenset(names)


class Guard:
    """ASGI middleware: Host allow-list, token before body, body size limit, security headers."""

    def __init__(
        self,
        app: ASGIApp,
        console: Console,
        extra_hosts: tuple[str, ...] = (),
        open_writes: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.hosts = allowed_hosts(console) | {host_name(h) for h in extra_hosts}
        self.open_writes = open_writes  # path prefixes whose writes carry their own credential
        self.any_host = "*" in console.allowed_hosts
        self.token = None if console.token is None else console.token.get_secret_value().encode()
        self.max_body = console.max_body
        self.refused: dict[str, int] = {"host": 0, "token": 0, "too_large": 0}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if not self.any_host and host not in self.hosts:
            self.refused["host"] += 1
            log.debug("console: refused Host %r", host)
            await _problem(send_secured, 421, f"this console does not answer for host {host!r}")
            return
        path = str(scope.get("path", ""))
        if scope.get("method", "GET") not in SAFE_METHODS and not path.startswith(
            self.open_writes or ("\0",)
        ):
            refusal = self._authorise(headers.get(b"authorization"))
            if refusal is not None:
                self.refused["token"] += 1
                await _problem(send_secured, *refusal)
                return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                await _problem(send_secured, 400, "Content-Length is not a number")
                return
            if size > self.max_body:
                self.refused["too_large"] += 1
                await _problem(send_secured, 413, f"request body over {self.max_body} bytes")
                return
        if scope.get("method", "GET") in SAFE_METHODS:
            await self.app(scope, receive, send_secured)
            return
        # Read the (small) body here, counting as it arrives: FastAPI would turn an
        # exception raised from inside its own body read into a 400.
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.max_body:
                self.refused["too_large"] += 1
                await _problem(send_secured, 413, f"request body over {self.max_body} bytes")
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send_secured)

    def _authorise(self, header: bytes | None) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """None when the bearer token matches; else (status, why, extra headers)."""
        if self.token is None:
            return 403, WRITES_DISABLED, []
        given = bearer(header)
        if given is None or not hmac.compare_digest(given, self.token):
            return 401, "a valid bearer token is required for this action", [(b"www-authenticate", b"Bearer")]
        return None


def bearer(header: bytes | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header as the guard reads it (scheme
    in any case, blanks around the token), None for any other header. The console's request
    ids belong to this token (`monitor/web/once.py`), not to how the header was spelt."""
    scheme, _, given = (header or b"").partition(b" ")
    return given.strip() if scheme.lower() == b"bearer" else None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read by the guard, then the client's own messages (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _problem(
    send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
