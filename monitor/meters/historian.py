"""A station's billing quarter from the meter records in the central historian.

The ledger path (`billing.usage`) and this one read usages differently and hand them
to the same `billing.build_rows`, so charges, classes and rounding are one computation.

Exact back from floats: the ledger keeps volumes and readings as exact Decimals and
writes them as floats. `Decimal(repr(x))` (`totalizer.dec`) gives back the decimal a
float was written from whenever that decimal has at most 15 significant digits: a
double holds 15 significant digits exactly (DBL_DIG), so no other decimal of 15 digits
or fewer reads back to the same double, and `repr` is the shortest one that does.
InfluxDB keeps the double. VictoriaMetrics stores a block of a series as decimals at
one scale with a bounded mantissa: 12 significant digits at the series' scale come
back exact (tested against the real servers); a ledger series has one scale (the
meter's multiplier fixes the places). Volumes are summed as Decimals, never floats.

What the historian does not hold, and how the export says so (never a guess):
- rollover and replacement are not written as flags; they are recognised from the
  records the way the ledger accepted them: an accepted reading below the previous
  one is a `rollover` when its consumption is exactly the register's wrap
  (reading - previous + 10^digits x multiplier), else a recorded `replacement` (the
  ledger rejects a register going backwards unless a replacement was recorded).
- `anomaly`: a rejected record in the quarter. The ledger's `conflicts` (a reading
  offered twice with two values) are not written out, so they cannot show.
- `corrected` / `voided replacement`: amendments are not written out; their effect
  is (the re-judged rows are sent again). InfluxDB overwrites the point, so the
  figures follow the ledger; VictoriaMetrics keeps both values, flagged `rewritten`.
  A reading a clock step moved away is not: its overwrite says `restamped` and is read
  as itself (`sources.meter_history`), as InfluxDB leaves it.
- `unreconciled`: an accepted reading's consumption is not its rise over the previous
  accepted reading held there, as the ledger wrote it (checked up to the first
  accepted reading past the quarter): a record is missing between them (a dead-letter
  or dropped batch) or a value lost digits (in VictoriaMetrics 0.000123456789012345
  stored beside 999999999999999 reads back as 0). The figures are then not the
  ledger's, and the row says so.
- an accepted record without a finite reading or consumption (written by hand, or by
  another program) is skipped and its meter flagged `unreconciled`.
- `incomplete`: the historian holds no record of the station from the quarter's end
  on, so its outbox may not have drained: figures may be short.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Protocol

from monitor.config import Config
from monitor.errors import MeterError
from monitor.meters.billing import Usage, coverage
from monitor.meters.book import meter_specs
from monitor.meters.dedup import KeptPoint, doubt, interval_ms, straddle_end
from monitor.meters.periods import Quarter
from monitor.meters.rows import to_ms
from monitor.meters.totalizer import MeterSpec, dec, to_ft3
from monitor.model import iso


class StoredMeterPoint(KeptPoint, Protocol):
    """One stored `meter` point (`monitor.sources.meter_history.MeterSample` fits; meters may
    not import sources, so this is structural): what the dedup doubt reads, and more."""

    @property
    def meter(self) -> str: ...
    @property
    def unit(self) -> str: ...
    @property
    def rewritten(self) -> bool: ...


class History(Protocol):
    """What billing asks of a historian (`monitor.sources.meter_history.open_history`)."""

    def records(self, station: str, after_ms: int, until_ms: int) -> Sequence[StoredMeterPoint]: ...
    def last_accepted(self, station: str, meter: str, at_ms: int) -> StoredMeterPoint | None: ...
    def next_accepted(self, station: str, meter: str, after_ms: int) -> StoredMeterPoint | None: ...
    def has_records_from(self, station: str, from_ms: int) -> bool: ...
    def deduplication(self) -> str: ...


@dataclass(frozen=True, slots=True)
class StationQuarter:
    """What the historian gave for one station: usages per configured meter, whether
    it has heard from the station since the quarter ended, meters it holds that the
    config does not name."""

    station: str
    usages: dict[str, Usage]
    complete: bool
    unknown_meters: tuple[str, ...]
    unusable: tuple[StoredMeterPoint, ...] = ()  # accepted records without a number: skipped, flagged
    assumed: tuple[tuple[str, str], ...] = ()  # (meter, why): one settings period assumed, flagged
    doubted: tuple[tuple[str, str], ...] = ()  # (meter, why): what dedup may have changed, flagged


def exact(x: float | None, what: str) -> Decimal:
    """The decimal a stored float was written from (see the module docstring)."""
    if x is None:
        raise MeterError(f"{what} is missing")
    return dec(x)


def sample_usage(
    meter: str,
    spec: MeterSpec,
    before: StoredMeterPoint | None,
    samples: Sequence[StoredMeterPoint],
    q: Quarter,
    max_reading_gap: float,
    after: StoredMeterPoint | None = None,
) -> Usage:
    """One meter's quarter from its stored records with q.start < time <= q.end;
    `after`, the first accepted record past the quarter, shows whether its tail is there."""
    where = f"meter {meter}"
    accepted = [s for s in samples if s.accepted]
    flags: set[str] = {ONE_PERIOD} if settings_doubt(spec, before, samples) else set()
    if any(not s.accepted for s in samples):
        flags.add("anomaly")
    if any(s.rewritten for s in samples):
        flags.add("rewritten")
    by_unit: dict[str, Decimal] = {}  # each record's consumption is in the unit of its own time
    prev = None if before is None else exact(before.reading, f"{where}: reading")
    for s in accepted:
        reading = exact(s.reading, f"{where}: reading at {s.time_ms} ms")
        consumption = exact(s.consumption, f"{where}: consumption at {s.time_ms} ms")
        unit = s.unit or spec.unit
        by_unit[unit] = by_unit.get(unit, Decimal(0)) + consumption
        if prev is not None and ONE_PERIOD in flags and consumption == 0 and reading != prev:
            pass  # a new baseline after a settings change, as `settings_doubt` says: no swap, no gap
        elif prev is not None and reading < prev:
            wrap = None if spec.modulus is None else spec.modulus * spec.multiplier
            rolled = wrap is not None and consumption == reading - prev + wrap
            flags.add("rollover" if rolled else "replacement")
        elif prev is not None and consumption != reading - prev:
            flags.add("unreconciled")  # a record is missing between them, or lost digits
        prev = reading
    if after is not None and usable(after) and prev is not None:
        reading, consumption = exact(after.reading, where), exact(after.consumption, where)
        if reading >= prev and consumption != reading - prev:
            flags.add("unreconciled")  # the quarter's last records did not reach the historian
    before_ms = None if before is None else before.time_ms
    flags |= coverage(q, before_ms, [s.time_ms for s in accepted], max_reading_gap)
    first = before if before is not None else (accepted[0] if accepted else None)
    last = accepted[-1] if accepted else before
    return Usage(
        account=spec.account or "",
        meter=meter,
        unit=(last.unit if last is not None and last.unit else spec.unit),  # last_read's, as the ledger's
        first=None if first is None else exact(first.reading, f"{where}: reading"),
        last=None if last is None else exact(last.reading, f"{where}: reading"),
        ft3=sum((to_ft3(v, u) for u, v in sorted(by_unit.items())), Fraction(0)),
        flags=frozenset(flags),
    )


ONE_PERIOD = "one settings period assumed"
DEDUPLICATED = "deduplicated"  # dedup on the server may have changed the row: monitor.meters.dedup


def settings_doubt(
    spec: MeterSpec, before: StoredMeterPoint | None, samples: Sequence[StoredMeterPoint]
) -> str:
    """Why the quarter's records may span a change of the meter's settings, which the
    historian does not hold ('' when nothing says so): the path judges them all with the
    config's settings (its rollover and replacement flags), one period assumed. Volumes are
    still each record's consumption in the unit the record carries."""
    held = [*([before] if before else []), *samples]
    units = sorted({s.unit for s in held if s.unit and s.unit != spec.unit})
    if units:
        return f"records in {', '.join(units)}, the config says {spec.unit}"
    if spec.since is not None and held and held[0].time_ms < to_ms(spec.since):
        return f"records from before its settings_since {iso(spec.since)}"
    prev = before.reading if before is not None and usable(before) else None
    for s in samples:
        if not (s.accepted and usable(s)):
            continue
        if prev is not None and s.consumption == 0 and s.reading != prev:
            return f"the reading moved without consumption at {iso(s.time_ms / 1000)} (a new baseline?)"
        prev = s.reading
    return ""


def station_quarter(config: Config, history: History, q: Quarter) -> StationQuarter:
    """Every configured meter's quarter (the system meter's too) for one station."""
    billing = config.billing
    if billing is None:
        raise MeterError("the config has no billing section (rate_per_kcf, accounts)")
    station = config.station.id
    specs = meter_specs(config)
    by_meter: dict[str, list[StoredMeterPoint]] = {m: [] for m in specs}
    unknown: set[str] = set()
    bad: list[StoredMeterPoint] = []
    for s in history.records(station, q.start_ms, q.end_ms):
        if s.meter not in by_meter:
            unknown.add(s.meter)
        elif s.accepted and not usable(s):
            bad.append(s)
        else:
            by_meter[s.meter].append(s)
    usages: dict[str, Usage] = {}
    assumed: list[tuple[str, str]] = []
    doubted: list[tuple[str, str]] = []
    dedup = history.deduplication()
    interval = interval_ms(dedup) if dedup else None
    tail: list[StoredMeterPoint] = []  # the kept points of the server's interval that straddles the end
    if interval is not None and q.end_ms % interval:
        tail = list(history.records(station, q.end_ms, straddle_end(q.end_ms, interval)))
    for m, spec in specs.items():
        before = history.last_accepted(station, m, q.start_ms)
        if before is not None and not usable(before):
            bad.append(before)
            before = None
        after = history.next_accepted(station, m, q.end_ms)
        usages[m] = sample_usage(m, spec, before, by_meter[m], q, billing.max_reading_gap, after)
        why = settings_doubt(spec, before, by_meter[m])
        if why:
            assumed.append((m, why))
        if dedup:  # one value per series and interval: what could it have hidden from this row?
            if interval is None:
                doubted.append((m, "whether the server deduplicates, and how, is unknown"))
                continue
            head = [] if before is None else history.records(station, before.time_ms, q.start_ms)
            span = [s for s in [*head, *by_meter[m], *tail] if s.meter == m]
            if why := doubt(spec, before, span, after):
                doubted.append((m, why))
    for m in {s.meter for s in bad}:
        usages[m] = _with(usages[m], "unreconciled")
    complete = history.has_records_from(station, q.end_ms)
    if not complete:
        usages = {m: _with(u, "incomplete") for m, u in usages.items()}
    for m, _ in doubted:  # monitor.meters.dedup says which rows, and why
        usages[m] = _with(usages[m], DEDUPLICATED)
    return StationQuarter(
        station, usages, complete, tuple(sorted(unknown)), tuple(bad), tuple(assumed), tuple(doubted)
    )


def usable(s: StoredMeterPoint) -> bool:
    """An accepted record billing can use: a finite reading and consumption."""
    return all(x is not None and math.isfinite(x) for x in (s.reading, s.consumption))


def _with(u: Usage, flag: str) -> Usage:
    return Usage(u.account, u.meter, u.unit, u.first, u.last, u.ft3, u.flags | {flag})
