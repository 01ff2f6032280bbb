"""Regenerate readings.csv for this case: `python tests/cases/billing/quarter/make_readings.py`.

Hourly register readings from 2026-06-30 22:00Z to 2026-10-01 02:00Z (two hours either
side of billing quarter 2026Q3), constant flows so every figure can be checked by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

START = datetime(2026, 6, 30, 22, tzinfo=UTC)
END = datetime(2026, 10, 1, 2, tzinfo=UTC)
SPIKE = datetime(2026, 8, 2, 5, tzinfo=UTC)  # village.meter reports +9,000,000 counts once
GAP = (datetime(2026, 9, 10, 1, tzinfo=UTC), datetime(2026, 9, 12, 23, tzinfo=UTC))  # bakery silent
SWAP = datetime(2026, 8, 15, 12, 30, tzinfo=UTC)  # shop.meter replaced (see replacements.csv)


def rows() -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    t = START
    h = 0
    while t <= END:
        stamp = t.strftime("%Y-%m-%dT%H:%M:%SZ")
        village = 50_000_000 + 4200 * h
        if t == SPIKE:
            village += 9_000_000
        out.append((stamp, "village.meter", str(village)))
        out.append((stamp, "mill.meter", str((400_000 + 500 * h) % 1_000_000)))
        if not GAP[0] <= t <= GAP[1]:
            out.append((stamp, "bakery.meter", str(1_234_000 + 50 * h)))
        # Old meter: 12,000 + 20 ft3/h. New meter from 12:30 (initial 5): 15 at 13:00, +20/h.
        shop = 12_000 + 20 * h
        if t > SWAP:
            shop = 15 + 20 * int((t - SWAP - timedelta(minutes=30)).total_seconds() // 3600)
        out.append((stamp, "shop.meter", str(shop)))
        out.append((stamp, "home.meter", str(123_456 + 10 * h)))
        out.append((stamp, "outfall.flow", f"{300 + (h % 24) * 5:.1f}"))
        t += timedelta(hours=1)
        h += 1
    # A reading delivered twice (replay after live): must not count twice.
    out.append(("2026-07-15T10:00:00Z", "mill.meter", str((400_000 + 500 * (14 * 24 + 12)) % 1_000_000)))
    return out


def main() -> None:
    path = Path(__file__).with_name("readings.csv")
    with path.open("w", encoding="utf-8") as fh:
        fh.write("time,sensor,value\n")
        for stamp, sensor, value in rows():
            fh.write(f"{stamp},{sensor},{value}\n")


if __name__ == "__main__":
    main()
