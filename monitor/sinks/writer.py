"""What the drain loop needs from a time-series server: post one body of line protocol.

Writers are blocking (one HTTP request each) and raise `WriteError(status,
retry_after)`; the drainer runs them in a worker thread and decides from the
status whether to retry, split or dead-letter. `make_writer` picks the writer
for the config's `influx.api`.
"""

from __future__ import annotations

import email.utils
import time
from typing import Protocol

from monitor.config import Influx


class LineWriter(Protocol):
    """Posts pre-serialised line protocol (ns precision); returns when the server acknowledged it."""

    @property
    def target(self) -> str:
        """Where points go, for logs and the CLI (never contains a secret)."""
        ...

    def write(self, body: bytes) -> None: ...

    def close(self) -> None: ...


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def make_writer(influx: Influx) -> LineWriter:
    """The writer for `influx.api`: v2 through influxdb-client, v1 through `/write`."""
    if influx.api == "v2":
        from monitor.sinks.influx import InfluxV2Writer

        return InfluxV2Writer(influx)
    from monitor.sinks.influx_v1 import InfluxV1Writer

    return InfluxV1Writer(influx)
