"""The station parts in the live daemon: derived samples into the stream, tracker on each sample.

`expand(items)` yields the source's items with the derived samples they make, each
derived sample before the item that made it due (it carries the earlier time), which
is the order replay gives them; `track(sample)` returns the station's alarm conditions.
After a restart, open runs and overflows come back from the store, and the alarms the
journal holds active are taken as the tracker's state so they clear when they end (a
reading stamped before one's activation does not end it: monitor/station/tracker.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import replace

from monitor.config import Config
from monitor.engine.arrival import DeviceWatch
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
        self.clock = clock or WallClock()
        # Derived sensors on two clocks (docs/station.md): those made only of device-stamped
        # readings carry the device's time (`device_derivation`); the others are made on the
        # gateway clock (`derivation`), a device-stamped input taken there at its arrival,
        # or earlier when it came late (a backlog: monitor/engine/arrival.py).
        # One evaluation time for both compared a device's stamp with a gateway's: an hour
        # apart, a sensor of both clocks found an input an hour old and was never made, and
        # one of either clock was stamped on the other's.
        device = frozenset(device)
        own = {s: p for s, p in config.derived.items() if s in device}
        theirs = {s: p for s, p in config.derived.items() if s not in device}
        self._arrives = frozenset(
            i for p in theirs.values() for i in p.compiled.inputs if i in device
        )  # device-stamped inputs of the gateway's derived sensors: taken at their arrival
        self._stamps: dict[str, float] = {}  # their latest device stamp taken (it must advance)
        self._watches = {i: DeviceWatch() for i in self._arrives}
        self.derivation = Derivation(theirs, config.rules, self._arrives) if theirs else None
        self.device_derivation = Derivation(own, config.rules) if own else None
        self.store = StationStore.open(config.state_dir) if has_station(config) else None
        self.tracker = (
            StationTracker(config, self.store, resume=True, device=device) if self.store is not None else None
        )
        if self.tracker is not None:
            self.tracker.adopt(active, self.clock, skew)
        self._saved = time.monotonic()

    def expand(self, items: Iterable[Sample | Condition]) -> Iterator[Sample | Condition]:
        gateway, own = self.derivation, self.device_derivation
        for item in items:
            if isinstance(item, Sample):
                made = own.feed(item) if own is not None else []
                yield from made
                if gateway is not None:
                    for sample in (*made, item):
                        taken = self._on_gateway_clock(sample)
                        if taken is not None:
                            yield from gateway.feed(taken)
            yield item

    def _on_gateway_clock(self, sample: Sample) -> Sample | None:
        """A device-stamped reading the gateway's derived sensors read, stamped on the
        gateway clock when it was taken (its arrival, less its delay beyond the quickest
        seen: a backlog's reading an hour old is an hour old there, and older than
        `max_input_age` makes nothing); None when its own stamp did not advance (a PLC whose
        RTC died: the engine judges none of them either). Any other sample as it is."""
        watch = self._watches.get(sample.sensor)
        if watch is None:
            return sample
        last, now = self._stamps.get(sample.sensor, -math.inf), self.clock.now()
        if not sample.time > last:
            watch.refused(sample.time, last, now)
            return None
        self._stamps[sample.sensor] = sample.time
        return replace(sample, time=watch.taken(sample.time, now))

    def restore_deliveries(self, watches: Mapping[str, DeviceWatch]) -> None:
        """The quickest deliveries the engine's checkpoint kept for the same readings (its
        own watches, `Engine.stamped_by_device`): a restarted station takes a store-and-forward
        backlog arriving first as old as the engine does, not as an input now."""
        for sensor, watch in self._watches.items():
            kept = watches.get(sensor)
            if kept is not None and math.isfinite(kept.lag):
                watch.restore(kept.lag, kept.lag_at)

    def shift(self, delta: float, keep: Collection[str] = ()) -> None:
        """The gateway clock stepped by `delta` (< 0: back): the tracker and the derived
        sensors move their times with it (`ClockWatch.on_step`), so what they measure across
        the step is the time that passed; but those of the sensors in `keep`, stamped by
        their device's clock (`ClockWatch.device`), which did not step."""
        if self.derivation is not None:  # on the gateway clock, device inputs at their arrival
            self.derivation.shift(delta)
        for watch in self._watches.values():
            watch.shift(delta)
        if self.device_derivation is not None:
            self.device_derivation.shift(delta, keep)
        if self.tracker is not None:
            self.tracker.shift(delta, keep)

    def track(self, sample: Sample) -> list[Condition]:
        return [] if self.tracker is None else self.tracker.feed(sample)

    def take_daily(self) -> list[str]:
        """Daily totals (line protocol) of the local days closed since the last call."""
        return self.tracker.take_daily() if self.tracker is not None else []

    def daily_queued(self) -> None:
        """The outbox took the daily totals taken so far (a restart closes only later days again)."""
        if self.tracker is not None:
            self.tracker.daily_queued()

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
