"""The gateway's dead-man switch: ping a URL (healthchecks.io style) every `interval` while
the daemon is ready, so something off the gateway notices when the gateway, its power or
its network dies. Not ready (a device down past its limit, the outbox full) means no ping:
the far end then raises its own alarm, which is the point."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from monitor.config.notify import Heartbeat as HeartbeatConfig
from monitor.errors import WriteError

if TYPE_CHECKING:
    from monitor.callout.http import Pinger

log = logging.getLogger(__name__)


class HeartbeatPinger:
    """`problems()` is the daemon's readiness (what /readyz reports); empty means ready."""

    def __init__(self, config: HeartbeatConfig, problems: Callable[[], Sequence[str]]) -> None:
        self.config = config
        self.problems = problems
        from monitor.callout.http import Pinger  # httpx, only when a heartbeat is configured

        self.pinger: Pinger = Pinger(config.url, config.timeout)
        self.sent = 0
        self.failed = 0
        self.withheld = 0
        self._state = "starting"

    async def beat(self) -> None:
        """One interval's decision: ping when ready, withhold otherwise."""
        problems = list(self.problems())
        if problems:
            self.withheld += 1
            if self._state != "withheld":
                log.warning("heartbeat withheld (not ready: %s)", "; ".join(problems))
            self._state = "withheld"
            return
        try:
            await self.pinger.ping()
        except WriteError as exc:
            self.failed += 1
            if self._state != "failing":
                log.error("%s", exc)
            self._state = "failing"
            return
        self.sent += 1
        if self._state in ("withheld", "failing"):
            log.info("heartbeat resumed")
        self._state = "ok"

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.config.interval)

    def stats(self) -> dict[str, object]:
        return {"state": self._state, "sent": self.sent, "failed": self.failed, "withheld": self.withheld}

    async def aclose(self) -> None:
        await self.pinger.aclose()
