"""One entry point for everything that writes series: `open_sink(config)`.

The sink always keeps the local series store (the console reads it) and, when
the config has an `influx` section, commits every point to the outbox that a
`Drainer` empties into InfluxDB. The daemon and `monitor replay` call
`write_samples` / `write_conditions` / `write_meter`, run
`drainer.run()` (daemon) or `await drain(timeout)` (replay, before exit). The alarm
manager's snapshots go through `monitor.sinks.kept.AlarmCopy`, which keeps what a full
disk refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from monitor.config import Config
from monitor.model import Clock, Condition, Sample, WallClock
from monitor.sinks.drain import Drainer
from monitor.sinks.lineproto import (
    MeterPoint,
    SampleSerializer,
    SeriesInfo,
    condition_line,
    meter_line,
    meter_point_line,
)
from monitor.sinks.outbox import Outbox
from monitor.sinks.store import SeriesStore
from monitor.sinks.writer import LineWriter, make_writer

OUTBOX_FILE = "outbox.sqlite"
STORE_FILE = "series.sqlite"
# Bytes under the cap free of meter points before held-back ones are offered again (a few
# points' worth): below it an offer would read ledger rows to take none or one.
METER_ROOM = 1024
METER_POINT_BYTES = 200  # a meter point's line until one was written (`meter_room`)


def outbox_path(config: Config) -> Path:
    return config.state_dir / OUTBOX_FILE


def store_path(config: Config) -> Path:
    return config.state_dir / STORE_FILE


def serializer_for(config: Config) -> SampleSerializer:
    return SampleSerializer(
        config.station.id,
        {s.id: SeriesInfo(str(s.kind), s.effective_unit) for s in config.sensors},
    )


class SampleSink:
    """Local store always; outbox (+ drainer) when InfluxDB is configured."""

    def __init__(
        self,
        config: Config,
        store: SeriesStore,
        outbox: Outbox | None = None,
        drainer: Drainer | None = None,
    ) -> None:
        self.config = config
        self.station = config.station.id
        self.store = store
        self.outbox = outbox
        self.drainer = drainer
        self.serializer = serializer_for(config)
        self._meter_bytes = METER_POINT_BYTES  # the shortest meter line of the last write, newline too

    def write_samples(self, samples: Sequence[Sample]) -> None:
        """Store and queue samples; when this returns they are committed to disk."""
        if not samples:
            return
        self.store.append(samples)
        if self.outbox is not None:
            self.outbox.append(self.serializer.samples(samples))

    def write_samples_to_outbox(self, samples: Sequence[Sample]) -> None:
        """Queue samples for InfluxDB only (the series store has them already); committed on return."""
        if self.outbox is not None and samples:
            self.outbox.append(self.serializer.samples(samples))

    def write_columns(
        self,
        names: Sequence[str],
        sensor: Sequence[int],
        time: Sequence[float],
        value: Sequence[float],
        quality: Sequence[int],
    ) -> None:
        """A replay batch as columns (`sensor` indexes `names`): queued for InfluxDB only,
        so replaying history does not fill the console's store. Committed on return."""
        if self.outbox is not None and len(time):
            self.outbox.append(self.serializer.columns(names, sensor, time, value, quality))

    def write_conditions(self, conditions: Sequence[Condition]) -> None:
        """Alarm transitions as the engine reported them (measurement `alarm`)."""
        if self.outbox is not None and conditions:
            self.outbox.append(
                [
                    condition_line(self.station, c, str(self.config.alarms.priority_of(c.sensor, c.rule)))
                    for c in conditions
                ]
            )

    def write_meter(
        self, meter: str, time: float, reading: float, consumption_ft3: float | None = None
    ) -> None:
        """A meter read and the consumption since the previous read (measurement `meter`)."""
        if self.outbox is None:
            return
        try:
            sensor = self.config.sensor(meter)
            account, unit = sensor.account or "", sensor.effective_unit
        except KeyError:
            account, unit = "", ""
        self.outbox.append(
            [meter_line(self.station, meter, time, reading, consumption_ft3, account=account, unit=unit)]
        )

    def write_meter_records(self, records: Sequence[MeterPoint]) -> int:
        """Meter ledger rows (`monitor.meters.book.meter_records`) as `meter` points; returns
        how many of the first the outbox took (the ledger unmarks those, so the cap never
        drops them, and keeps the rest marked until there is room: `Outbox.append_last`)."""
        if self.outbox is None or not records:
            return len(records)
        lines = [meter_point_line(self.station, r) for r in records]
        self._meter_bytes = min(len(line.encode()) for line in lines) + 1
        return self.outbox.append_last(lines)

    def meter_room(self) -> int:
        """How many meter points the outbox has room for beside those it holds `last` (what
        `append_last` would take), by the shortest line of the last write: at least as many as
        fit, so an offer of that many fills the room. 0 below `METER_ROOM` bytes (an offer a
        point at a time); unbounded without an outbox."""
        if self.outbox is None:
            return sys.maxsize
        room = self.outbox.room_last()
        return 0 if room < METER_ROOM else room // self._meter_bytes

    async def drain(self, timeout: float) -> int:
        """Deliver what the outbox holds within `timeout`; returns the points left (0 without InfluxDB)."""
        if self.drainer is None:
            return 0
        return await self.drainer.drain(timeout)

    def health(self) -> dict[str, object]:
        """Outbox and writer counters for the health endpoint and metrics (JSON-able)."""
        if self.outbox is None or self.drainer is None:
            return {"influx": None}
        s = self.outbox.stats()
        d = self.drainer.stats
        return {
            "influx": self.drainer.writer.target,
            "pending": s.pending,
            "pending_bytes": s.pending_bytes,
            "max_bytes": s.max_bytes,
            "oldest_pending": s.oldest_queued,
            "dead_letters": s.dead_letters,
            "dropped": s.dropped,
            "written": s.written,
            "failures": d.failures,
            "last_error": d.last_error,
            "last_success": d.last_success,
            "retry_at": d.retry_at,
        }

    @property
    def pending(self) -> int:
        return 0 if self.outbox is None else self.outbox.pending

    def close(self) -> None:
        self.store.close()
        if self.outbox is not None:
            self.outbox.close()
        if self.drainer is not None:
            self.drainer.close()


def open_outbox(
    config: Config, clock: Clock | None = None, on_condition: Callable[[Condition], None] | None = None
) -> Outbox:
    max_bytes = config.influx.outbox_max_bytes if config.influx else 1 << 30
    return Outbox(outbox_path(config), max_bytes=max_bytes, clock=clock, on_condition=on_condition)


def open_drainer(
    config: Config, outbox: Outbox, clock: Clock | None = None, writer: LineWriter | None = None
) -> Drainer:
    influx = config.influx
    assert influx is not None
    return Drainer(
        outbox,
        writer or make_writer(influx),
        clock=clock,
        batch_size=influx.batch_size,
        flush_interval=influx.flush_interval,
        max_backoff=influx.max_backoff,
    )


def open_sink(
    config: Config,
    clock: Clock | None = None,
    on_condition: Callable[[Condition], None] | None = None,
) -> SampleSink:
    """The sink for `config`: outbox + writer when `influx` is set, the local store always.

    Outbox-cap conditions go to `on_condition` (the alarm manager) and are
    also written to the `alarm` measurement.
    """
    clock = clock or WallClock()
    store = SeriesStore(store_path(config), retention=config.store.retention)
    if config.influx is None:
        return SampleSink(config, store)
    sink: SampleSink | None = None

    def cap_condition(cond: Condition) -> None:
        if sink is not None:
            sink.write_conditions([cond])
        if on_condition is not None:
            on_condition(cond)

    outbox = open_outbox(config, clock, cap_condition)
    sink = SampleSink(config, store, outbox, open_drainer(config, outbox, clock))
    return sink
