"""Billing quarters cut at the Town's midnight, and the §139-4 dates of a presented bill.

A quarter runs from local midnight on the 1st of its first month to local midnight on
the 1st of the month after its last, in `station.timezone` (so a New York quarter
starts at 04:00Z in summer and 05:00Z in winter, and a quarter that spans a DST change
is an hour longer or shorter than its calendar days). Its `days` are calendar days:
the ordinance's "gallons per day" counts the Town's days, not 24-hour spans.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from monitor.errors import MeterError

PAID_BY_30 = 30  # §139-4: "not paid on or before 30 days from the date of presentation"
PAID_BY_60 = 60  # §139-4: "... on or before 60 days from the date of presentation"


@dataclass(frozen=True, slots=True)
class Quarter:
    """Billing quarter `n` (1-4) of billing year `year`, which starts on the 1st of
    `year_start_month` of calendar year `year`, local midnight in `start.tzinfo`."""

    year: int
    n: int
    start: datetime
    end: datetime

    @property
    def start_ms(self) -> int:
        return int(self.start.timestamp()) * 1000

    @property
    def end_ms(self) -> int:
        return int(self.end.timestamp()) * 1000

    @property
    def days(self) -> int:
        """Calendar days in the Town's zone (92 for July-September, DST or not)."""
        return (self.end.date() - self.start.date()).days

    @property
    def first_day(self) -> date:
        return self.start.date()

    @property
    def last_day(self) -> date:
        return self.end.date() - timedelta(days=1)

    def __str__(self) -> str:
        return f"{self.year}Q{self.n}"


def quarter(text: str, year_start_month: int = 1, zone: ZoneInfo | None = None) -> Quarter:
    """`2026Q3` -> the period; with year_start_month 7, 2026Q3 is January-March 2027.
    Boundaries are local midnight in `zone` (UTC when not given)."""
    m = re.fullmatch(r"\s*(\d{4})\s*-?\s*[Qq]([1-4])\s*", text)
    if not m:
        raise MeterError(f"quarter {text!r} must look like 2026Q3")
    year, n = int(m.group(1)), int(m.group(2))
    tz = zone if zone is not None else UTC
    first = (year_start_month - 1) + 3 * (n - 1)  # months after January of `year`
    start = datetime(year + first // 12, first % 12 + 1, 1, tzinfo=tz)
    last = first + 3
    end = datetime(year + last // 12, last % 12 + 1, 1, tzinfo=tz)
    return Quarter(year, n, start, end)


@dataclass(frozen=True, slots=True)
class Presentation:
    """§139-4 dates of a bill presented on `presented` (a local date).

    "Not paid on or before 30 days from the date of presentation" is read as: the 30th
    day after presentation is the last day to pay without penalty, so the 2 % penalty
    applies from the 31st day (`penalty_from_30`), the further 10 % from the 61st."""

    presented: date

    @property
    def penalty_from_30(self) -> date:
        return self.presented + timedelta(days=PAID_BY_30 + 1)

    @property
    def penalty_from_60(self) -> date:
        return self.presented + timedelta(days=PAID_BY_60 + 1)


def presentation(text: str, q: Quarter) -> Presentation:
    """`YYYY-MM-DD`; a bill cannot be presented before its quarter has ended."""
    try:
        day = date.fromisoformat(text.strip())
    except ValueError:
        raise MeterError(f"presented {text!r} must be a date like 2026-10-05") from None
    if len(text.strip()) != 10:
        raise MeterError(f"presented {text!r} must be a date like 2026-10-05")
    if day <= q.last_day:
        raise MeterError(f"presented {day} is before {q} has ended (last day {q.last_day})")
    return Presentation(day)
