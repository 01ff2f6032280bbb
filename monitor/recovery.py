"""Recovery at start: what a crash left between the stores, applied again.

The series store keeps each batch as an intake record until the outbox and the
ledger have it (`monitor.pipeline`); a record still held at start means a crash
fell between the commits. Each is applied again to the outbox and the ledger
(whose points still marked for InfluxDB are then sent, `MeterBook.send`):
every step is idempotent by key (series store and ledger: one row per sensor or
meter and time; InfluxDB: one point per series and timestamp), so applying a
batch twice, or being interrupted while doing it, converges to the same stores.
Meter alarms are then brought in line with the ledger, whose latest row decides.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from monitor.meters.book import TAKE, MeterBook, meter_records
from monitor.meters.ledger import Row, to_ms
from monitor.model import Kind, Rule, Sample
from monitor.pipeline import Pipeline
from monitor.sinks.lineproto import MeterPoint

log = logging.getLogger(__name__)


def recover(pipeline: Pipeline) -> int:
    """Apply every batch the series store still holds to the outbox and the ledger
    again (a crash came between their commits), and bring the meter alarms in line
    with the ledger (a crash between its commit and the journal's); returns how many
    batches."""
    kinds = {s.id: s.kind for s in pipeline.config.sensors}
    count = 0
    for seq, samples in pipeline.sink.store.held():
        meters = [s for s in samples if kinds.get(s.sensor) is Kind.METER]
        pipeline.sink.write_samples_to_outbox(samples)
        conditions = pipeline.meters.ingest(meters) if meters else []
        # The ledger keeps its points marked until the outbox has them (`MeterBook.sent`); the
        # batch's own are sent again too, for a ledger written before it kept marks.
        fresh = pipeline.meters.take_records(TAKE)
        marked = {(r.meter, r.time) for r in fresh}
        old = [r for r in _ledger_points(pipeline.meters, meters) if (r.meter, r.time) not in marked]
        taken = pipeline.sink.write_meter_records([*fresh, *old])
        pipeline.meters.sent(min(taken, len(fresh)))  # the rest of the marked stay marked
        pipeline.sink.store.release(seq)
        pipeline.raise_conditions(conditions)
        count += 1
    journal = {
        meter: alarm is not None and alarm.active
        for meter in pipeline.meters.ledger.specs
        for alarm in [pipeline.alarms.get(meter, Rule.METER)]
    }
    # Points marked in the ledger and not in the outbox: a crash between the ledger's commit
    # and the outbox's, an amendment or settings change recorded while the daemon was down.
    # The first TAKE now, the rest on the timer ticks (`Pipeline.send_meter_points`).
    pipeline.send_meter_points()
    meter_conditions = pipeline.meters.reconcile(journal)
    if meter_conditions:
        log.warning("%d meter alarm(s) brought in line with the ledger", len(meter_conditions))
        pipeline.raise_conditions(meter_conditions)
    if count:
        log.warning("re-applied %d batch(es) a crash left between the stores", count)
    pipeline.stats.recovered += count
    return count


def _ledger_points(book: MeterBook, samples: Sequence[Sample]) -> list[MeterPoint]:
    ledger = book.ledger
    rows: list[Row] = []
    for meter in {s.sensor for s in samples}:
        times = {to_ms(s.time) for s in samples if s.sensor == meter}
        rows.extend(r for r in ledger.rows(meter, min(times) - 1, max(times)) if r.time_ms in times)
    return list(book.stepped(meter_records(rows, ledger.specs, ledger.spec_at)))
