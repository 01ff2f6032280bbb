"""What the drain loop needs from a time-series server: post one body of line protocol.

Writers are blocking (one HTTP request each) and raise `WriteError(status,
retry_after)`; the drainer runs them in a worker thread and decides from the
status whether to retry, split or dead-letter. `make_writer` picks the writer
for the config's `influx.api`.
"""

from __future__ import annotations

from typing import Protocol

from monitor.config import Influx
from monitor.sinks.retry_after import parse_retry_after


class LineWriter(Protocol):
    """Posts pre-serialised line protocol (ns precision); returns when the server acknowledged it."""

    @property
    def target(self) -> str:
        """Where points go, for logs and the CLI (never contains a secret)."""
        ...

    def write(self, body: bytes) -> None: ...

    def close(self) -> None: ...


def make_writer(influx: Influx) -> LineWriter:
    """The writer for `influx.api`: v2 through influxdb-client, v1 through `/write`."""
    if influx.api == "v2":
        from monitor.sinks.influx import InfluxV2Writer

        return InfluxV2Writer(influx)
    from monitor.sinks.influx_v1 import InfluxV1Writer

    return InfluxV1Writer(influx)


__all__ = ["LineWriter", "make_writer", "parse_retry_after"]
