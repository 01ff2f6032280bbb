"""Per-device counters for metrics, and logging a failure once per episode.

An episode is one stretch of the same trouble (a device not answering, a field at
an illegal address): ERROR when it starts, DEBUG while it lasts, INFO when it ends,
as Home Assistant's ModbusHub does, so a dead device does not flood the journal.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass


@dataclass(slots=True)
class DeviceHealth:
    """What the daemon exports per Modbus device (Prometheus counters and gauges)."""

    device: str
    endpoint: str
    unit: int
    requests: int = 0  # requests sent, retries included
    errors: int = 0  # requests that failed (timeout, exception, connection)
    timeouts: int = 0
    cycles: int = 0
    failed_in_row: int = 0  # poll cycles without any answer, in a row
    bad_fields: int = 0  # episodes of a field at an address the device refuses
    malformed: int = 0  # answers that did not fit their request (short, mismatched, undecodable)
    invalid_requests: tuple[str, ...] = ()  # requests whose last answer was unusable: the comm state
    last_poll: float | None = None  # event time of the last cycle the device answered
    last_latency: float | None = None  # seconds, last successful request
    last_cycle: float | None = None  # seconds, last whole poll cycle
    requests_per_cycle: int = 0
    connected: bool = False

    def snapshot(self) -> DeviceHealth:
        return dataclasses.replace(self)


class Episodes:
    """Remembers which troubles are ongoing, to log each once per episode."""

    def __init__(self, logger: logging.Logger, subject: str) -> None:
        self._log = logger
        self._subject = subject
        self._open: dict[str, str] = {}

    def fail(self, key: str, message: str, exc_info: bool = False) -> bool:
        """Log a failure; True when this starts a new episode (logged at ERROR)."""
        if key in self._open:
            self._log.debug("%s: %s (continuing)", self._subject, message)
            return False
        self._open[key] = message
        self._log.error("%s: %s", self._subject, message, exc_info=exc_info)
        return True

    def ok(self, key: str, message: str) -> bool:
        """End an episode; True (and an INFO line) if one was open."""
        if self._open.pop(key, None) is None:
            return False
        self._log.info("%s: %s", self._subject, message)
        return True

    def __contains__(self, key: str) -> bool:
        return key in self._open

    @property
    def ongoing(self) -> list[str]:
        return list(self._open)
