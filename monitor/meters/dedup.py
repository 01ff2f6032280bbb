"""Which billing rows a deduplicating VictoriaMetrics can have changed (`-dedup.minScrapeInterval`).

What the server does (its docs, and measured on the 1.79 we run): every field of a `meter`
point is a series of its own, and of each series it keeps one sample per interval of D ms,
the intervals ((k-1)·D, k·D] counted from the epoch, the one with the biggest timestamp;
of samples at one millisecond it keeps one value (1.79: any; later releases: the largest).
So a kept point at t can hide, in its series, points at times in (its interval's start, t]:
earlier readings of a meter that reports more often than D, the reading just before a
period boundary the same interval straddles, and at t itself a point the ledger wrote twice
with different values (a re-judged row, an amendment, a clock step's overwrite).

What a hidden point can change, and how the kept points show it (never a guess):
- volume and readings. The ledger writes every accepted reading with its consumption, its
  rise over the accepted reading before it (or the register's wrap on a rollover). A hidden
  accepted reading with a rise of its own leaves the next kept accepted reading linked to a
  reading that is not there: its consumption is not its rise over the kept one before it
  (`broken_link`). So a row whose chain of accepted readings holds, from the reading that
  opens the quarter to the first one after it, lost no volume and shows the ledger's first
  and last reading. A hidden reading with no rise changes no figure.
- a point written twice reads as a mix of its writes, field by field. The ledger rewrites a
  point when it judges it again: a rejected reading accepted once a swap is recorded, an
  accepted one rejected when a replacement is voided or a clock step moved it away
  (`restamped`), a corrected reading and the rise of the next. Each such point shows as a
  rejected reading, a register going back (a replacement: a broken link here), a broken
  link, or a `restamped` mark, in the kept values of either write. A correction's can keep
  every earlier value in every field, a chain that holds (measured: 5 points of 40 when both
  writes reached the server together), so the ledger marks the points it sends again
  `corrected` (`MeterBook.corrected`): kept from either write, the mark is there.
- a rejected reading hiding an accepted one before it in its interval: the accepted one's
  rise shows as a broken link at the next accepted reading; with none after it, only the
  rejected reading shows. So every rejected reading in the row's span is a doubt too.
So a row is in doubt when its span (the reading that opens the quarter to the first accepted
one after it, and, when the server's interval straddles the quarter's end, that interval)
holds a broken link, a rejected reading, a `restamped` or a `corrected` point; else dedup
changed none of its figures. Not seen: a rejected reading hidden behind a later reading of its
interval (the `anomaly` flag it would add; no figure depends on it), and a correction an older
release sent (without the mark) whose re-sent points kept every earlier value in every field
(read as the ledger stood before the correction; docs/billing.md says so).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Protocol

from monitor.meters.totalizer import MeterSpec, dec
from monitor.model import iso


class KeptPoint(Protocol):
    """What the doubt is judged from (`historian.StoredMeterPoint` fits)."""

    @property
    def time_ms(self) -> int: ...
    @property
    def reading(self) -> float | None: ...
    @property
    def consumption(self) -> float | None: ...
    @property
    def accepted(self) -> float | None: ...
    @property
    def restamped(self) -> bool: ...
    @property
    def corrected(self) -> bool: ...


_GO_UNITS = {"ns": Decimal("1e-6"), "us": Decimal("1e-3"), "µs": Decimal("1e-3"), "ms": Decimal(1),
             "s": Decimal(1000), "m": Decimal(60_000), "h": Decimal(3_600_000)}  # fmt: skip
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def interval_ms(flag: str) -> int | None:
    """`-dedup.minScrapeInterval` as shown in /flags (a Go duration: "1ms", "30s", "1m0s",
    "1h30m") in whole milliseconds, as the server counts it, at least 1; None when it is not
    a duration (an `unknown (...)` from a server that hides its flags): no row can be cleared."""
    text = flag.strip()
    pos, total = 0, Decimal(0)
    for part in _GO_PART.finditer(text):
        if part.start() != pos:
            return None
        total += Decimal(part.group(1)) * _GO_UNITS[part.group(2)]
        pos = part.end()
    if pos == 0 or pos != len(text):
        return None
    return max(1, int(total))


def broken_link(spec: MeterSpec, prev: KeptPoint | None, point: KeptPoint) -> bool:
    """The accepted `point`'s consumption is not its rise over `prev`, the kept accepted
    reading before it (None: no accepted reading before it is stored, so its consumption must
    be 0, a first reading), nor the register's wrap on a rollover."""
    if point.reading is None or point.consumption is None:
        return True
    consumption = dec(point.consumption)
    if prev is None or prev.reading is None:
        return consumption != 0 if prev is None else True
    rise = dec(point.reading) - dec(prev.reading)
    if consumption == rise:
        return False
    wrap = None if spec.modulus is None else spec.modulus * spec.multiplier
    return not (rise < 0 and wrap is not None and consumption == rise + wrap)


def doubt(
    spec: MeterSpec,
    before: KeptPoint | None,
    span: Sequence[KeptPoint],
    after: KeptPoint | None,
) -> str:
    """Why dedup may have changed this meter's row ('' when it changed none of its figures):
    `before` the accepted reading that opens the quarter, `span` every kept point of the meter
    after it up to the quarter's end (and through the interval that straddles the end, if
    any), time-ordered; `after` the first accepted reading past the quarter."""
    if before is not None and before.restamped:
        return f"the reading that opens the quarter ({_at(before)}) was written again by a clock step"
    if before is not None and before.corrected:
        return f"the reading that opens the quarter ({_at(before)}) was written again by a correction"
    for p in span:
        if p.restamped:
            return f"the point at {_at(p)} was written again by a clock step"
        if p.corrected:
            return f"the point at {_at(p)} was written again by a correction (either write may be kept)"
        if not p.accepted:
            return f"a rejected reading at {_at(p)} (a reading re-judged, or one it hides)"
    prev = before
    last = span[-1].time_ms if span else None
    tail = [after] if after is not None and (last is None or after.time_ms > last) else []
    for p in [*span, *tail]:
        if p.accepted:
            if broken_link(spec, prev, p):
                return f"the reading at {_at(p)} does not follow from the one before (hidden, or re-judged)"
            prev = p
    return ""


def _at(p: KeptPoint) -> str:
    return iso(p.time_ms / 1000)


def straddle_end(end_ms: int, interval: int) -> int:
    """The end of the server's interval holding `end_ms` (itself when an interval ends there):
    a point kept up to it can hide the quarter's last readings."""
    return -(-end_ms // interval) * interval
