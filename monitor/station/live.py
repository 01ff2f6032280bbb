"""The station parts in the live daemon: derived samples into the stream, tracker on each sample.

`expand(items)` yields the source's items with the derived samples they make, each
derived sample before the item that made it due (it carries the earlier time), which
is the order replay gives them; `track(sample)` returns the station's alarm conditions.
After a restart, open runs and overflows come back from the store, and the alarms the
journal holds active are taken as the tracker's state so they clear when they end (a
reading stamped before one's activation does not end it: monitor/station/tracker.py).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator

from monitor.config import Config
from monitor.model import Alarm, Clock, Condition, Sample, WallClock
from monitor.station.derive import Derivation
from monitor.station.replay import has_station
from monitor.station.store import StationStore
from monitor.station.tracker import StationTracker

SAVE_INTERVAL = 30.0  # wall seconds between saves of what is in progress


class LiveStation:
    def __init__(
        self,
        config: Config,
        active: Iterable[Alarm] = (),
        clock: Clock | None = None,
        skew: float = 0.0,
        device: Collection[str] = (),
    ) -> None:
        """`active`: the alarms the journal holds active (their condition), adopted by the
        tracker with their activation; `clock` and `skew` judge which readings may end them;
        `device`: the sensors stamped by their device's clock (`reconcile.device_stamped`)."""
        self.config = config
        self.derivation = Derivation(config.derived, config.rules) if config.derived else None
        self.store = StationStore.open(config.state_dir) if has_station(config) else None
        self.tracker = (
            StationTracker(config, self.store, resume=True, device=device) if self.store is not None else None
        )
        if self.tracker is not None:
            self.tracker.adopt(active, clock or WallClock(), skew)
        self._saved = time.monotonic()

    def expand(self, items: Iterable[Sample | Condition]) -> Iterator[Sample | Condition]:
        derivation = self.derivation
        for item in items:
            if derivation is not None and isinstance(item, Sample):
                yield from derivation.feed(item)
            yield item

    def shift(self, delta: float, keep: Collection[str] = ()) -> None:
        """The gateway clock stepped by `delta` (< 0: back): the tracker and the derived
        sensors move their times with it (`ClockWatch.on_step`), so what they measure across
        the step is the time that passed; but those of the sensors in `keep`, stamped by
        their device's clock (`ClockWatch.device`), which did not step."""
        if self.derivation is not None:
            self.derivation.shift(delta, keep)
        if self.tracker is not None:
            self.tracker.shift(delta, keep)

    def track(self, sample: Sample) -> list[Condition]:
        return [] if self.tracker is None else self.tracker.feed(sample)

    def take_daily(self) -> list[str]:
        """Daily totals (line protocol) of the local days closed since the last call."""
        return self.tracker.take_daily() if self.tracker is not None else []

    def save_if_due(self, now: float) -> None:
        if self.tracker is not None and now - self._saved >= SAVE_INTERVAL:
            self._saved = now
            self.tracker.save()

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.save()
        if self.store is not None:
            self.store.close()


__all__ = ["LiveStation"]
