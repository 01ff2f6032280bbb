"""Regenerate readings.csv for this case: `python tests/cases/billing/new-york/make_readings.py`.

Hourly register readings from 2025-09-30T20:00Z to 2026-01-01T08:00Z: billing quarter
2025Q4 in America/New_York runs from 2025-10-01T04:00Z (midnight EDT) to
2026-01-01T05:00Z (midnight EST), 2,209 hours because DST ended on 2 November. Constant
flows, so every figure can be checked by hand (README.md).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

START = datetime(2025, 9, 30, 20, tzinfo=UTC)
END = datetime(2026, 1, 1, 8, tzinfo=UTC)
SWAP = datetime(2025, 11, 10, 12, 30, tzinfo=UTC)  # shop.meter replaced (amendments.csv)
MISREAD = datetime(2026, 1, 1, 5, tzinfo=UTC)  # apartments.meter's closing reading misread +1,200


def rows() -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    t, h = START, 0
    while t <= END:
        stamp = t.strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append((stamp, "plant.meter", str(100_000 + 200 * h)))
        out.append((stamp, "school.meter", str(2_000_000 + 1_700 * h)))
        shop = 12_000 + 20 * h  # old meter; new meter from 12:30 (initial 5): 15 at 13:00, +20/h
        if t > SWAP:
            shop = 15 + 20 * int((t - SWAP - timedelta(minutes=30)).total_seconds() // 3600)
        out.append((stamp, "shop.meter", str(shop)))
        apartments = 300_000 + 600 * h
        if t == MISREAD:
            apartments += 1_200
        out.append((stamp, "apartments.meter", str(apartments)))
        t += timedelta(hours=1)
        h += 1
    return out


def main() -> None:
    path = Path(__file__).with_name("readings.csv")
    with path.open("w", encoding="utf-8") as fh:
        fh.write("time,sensor,value\n")
        for stamp, sensor, value in rows():
            fh.write(f"{stamp},{sensor},{value}\n")


if __name__ == "__main__":
    main()
