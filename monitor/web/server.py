"""Serving the console with uvicorn (the one module that imports it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.importer import ImportFromStringError

from monitor.config import Console
from monitor.errors import MonitorError
from monitor.web.events import Hub

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)

# The error map: what `uvicorn.Server.serve` can let through (a test checks uvicorn's own
# exception classes are covered). uvicorn logs why it cannot listen, then exits.
ERRORS: dict[type[BaseException], str] = {
    SystemExit: "the console cannot listen on {where} (see the error above)",
    OSError: "the console cannot listen on {where}: {exc}",
    ImportFromStringError: "the console app could not be loaded: {exc}",
}
CAUGHT = tuple(ERRORS)


def translate(exc: BaseException, where: str) -> MonitorError:
    text = next(t for cls, t in ERRORS.items() if isinstance(exc, cls))
    return MonitorError(text.format(where=where, exc=exc))


class _Server(uvicorn.Server):
    """uvicorn without its own SIGINT/SIGTERM handlers: the daemon owns the signals.
    uvicorn's would also stop the console by themselves and re-raise the signal
    after a clean shutdown, which reads as a second stop request."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ConsoleServer:
    """uvicorn on the daemon's event loop; `serve()` runs until `stop()`."""

    def __init__(self, app: FastAPI, console: Console) -> None:
        self.app = app
        self.console = console
        config = uvicorn.Config(
            app,
            host=console.host,
            port=console.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            log_config=None,  # our handlers (plain or --log-json), not uvicorn's own format
        )
        self._server = _Server(config)
        self.failed: MonitorError | None = None

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    @property
    def port(self) -> int:
        """The bound port (useful with `port: 0`)."""
        for server in self._server.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.console.port

    async def serve(self) -> None:
        if self.console.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "console reads are open on %s:%d; writes still need the token",
                self.console.host,
                self.console.port,
            )
        if self.console.token is None:
            log.info("console has no token: acknowledge and shelve are disabled")
        try:
            await self._server.serve()
        except CAUGHT as exc:
            self.failed = translate(exc, f"{self.console.host}:{self.console.port}")
            raise self.failed from None

    def stop(self) -> None:
        """End live streams first so shutdown does not wait for them."""
        hub = getattr(self.app.state, "hub", None)
        if isinstance(hub, Hub):
            hub.close()
        self._server.should_exit = True

    async def wait_started(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not self._server.started:
                if self.failed is not None:
                    raise self.failed
                await asyncio.sleep(0.01)
