"""The one way tests wait: for a condition, with a deadline, never for a fixed time.

`wait_until` polls from plain code (a process, a server, a thread); `until` is the
same for coroutines, yielding to the event loop between checks so the code under
test keeps running. Both raise TimeoutError naming what they waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL = 0.02  # seconds between checks


def _expired(timeout: float, what: str) -> TimeoutError:
    return TimeoutError(f"timed out after {timeout}s waiting for {what}")


def wait_until(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll `check` until it is true, or raise TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise _expired(timeout, what)
        time.sleep(POLL)


async def until(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """`wait_until` for coroutines: the loop keeps running the code under test meanwhile."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise _expired(timeout, what)
        await asyncio.sleep(POLL)
