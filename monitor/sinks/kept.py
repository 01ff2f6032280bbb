"""Lines the outbox refused that nothing else will send again, kept in memory until it takes them.

Most points are kept by the store they came from (a batch the outbox refused stays held in
the series store, meter points stay marked in the ledger). A few are made once and handed
over once: a closed day's pump and station totals (`DailyFeed`), the alarm manager's
snapshots (`AlarmCopy`). When the outbox refuses them (a full or failing state disk, where
the `disk_full` alarm's own snapshot is the first to meet it) they wait here, said once per
episode without a traceback (an expected fault, alarmed already), and go with the next try
once the disk takes writes. Bounded: past `KEPT_MAX` lines the oldest are dropped, counted
and said once. Only a restart before the disk takes writes loses them (memory only).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from monitor.errors import MonitorError
from monitor.model import Alarm, Condition, Sample
from monitor.sinks.lineproto import alarm_line

log = logging.getLogger(__name__)
KEPT_MAX = 10_000  # lines (~3 MB): days of daily totals, thousands of alarm transitions


class Appends(Protocol):
    """What is kept for: the outbox's `append` (commits, or raises on a refusing disk)."""

    def append(self, lines: Sequence[str], last: bool = False) -> int: ...


class KeptLines:
    """`add` queues lines in the outbox, or keeps them (oldest first) for the next `add`."""

    def __init__(self, outbox: Appends, what: str, limit: int = KEPT_MAX) -> None:
        self.outbox = outbox
        self.what = what  # "daily totals", "alarm snapshots": what the log lines name
        self.limit = limit
        self.waiting: list[str] = []
        self.failures = 0  # appends refused this episode
        self.dropped = 0  # lines dropped at `limit` this episode

    def add(self, lines: Sequence[str]) -> bool:
        """Queue what waits and `lines`; True when the outbox took them all (or nothing waits)."""
        self.waiting += lines
        if not self.waiting:
            return True
        try:
            self.outbox.append(self.waiting)
        except MonitorError as exc:
            self.failures += 1
            if self.failures == 1:
                log.error(
                    "%s not queued for InfluxDB (kept, tried again with the next batch): %s", self.what, exc
                )
            self._bound()
            return False
        if self.failures:
            dropped = f", {self.dropped} dropped as more than {self.limit} waited" if self.dropped else ""
            log.info(
                "%s queued for InfluxDB again (%d point(s) kept meanwhile%s)",
                self.what,
                len(self.waiting),
                dropped,
            )
        self.waiting, self.failures, self.dropped = [], 0, 0
        return True

    def _bound(self) -> None:
        over = len(self.waiting) - self.limit
        if over <= 0:
            return
        if not self.dropped:
            log.warning(
                "%s: more than %d point(s) wait for the state disk; dropping the oldest (not in InfluxDB)",
                self.what,
                self.limit,
            )
        del self.waiting[:over]
        self.dropped += over


class AlarmCopy:
    """The alarm manager's snapshots (state change, ack, shelve) to the outbox for InfluxDB:
    an alarm listener, and a batch listener so that what waits goes with the next stored
    batch or timer work even when no alarm changes."""

    def __init__(self, station: str, outbox: Appends) -> None:
        self.station = station
        self.kept = KeptLines(outbox, "alarm snapshots")

    def __call__(self, _entry: object, alarm: Alarm) -> None:
        self.kept.add([alarm_line(self.station, alarm)])

    def judged(
        self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
    ) -> None:
        if self.kept.waiting:
            self.kept.add(())
