"""Daily totals per pump and per station, cut at the station's local midnight, for InfluxDB.

Measurement `pump_daily` (tags station, pump, day; fields run_hours, starts,
longest_run_hours) and `station_daily` (tags station, day; fields run_hours, starts,
overflows, overflow_volume_gal, overflows_volume_unknown, overflows_volume_partial,
overflows_continuing), one
point per local day at its midnight, written when event time passes the next midnight: the
same points live and in replay. `overflow_volume_gal` sums the volumes known; an overflow
whose volume is unknown (no level reading during it) is counted, never added as 0 gal.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import cast
from zoneinfo import ZoneInfo

from monitor.sinks.lineproto import line
from monitor.station.report import overflow_volume, pump_figures
from monitor.station.store import StationStore


def next_midnight(t: float, zone: ZoneInfo) -> float:
    day = datetime.fromtimestamp(t, zone).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


class DailyTotals:
    """Closes local days as event time passes midnight; `take()` hands over their lines."""

    def __init__(self, station: str, zone: ZoneInfo, pumps: list[str], store: StationStore) -> None:
        self.station, self.zone, self.pumps, self.store = station, zone, pumps, store
        self.day_end = -math.inf  # set by the first reading
        self._lines: list[str] = []

    def advance(self, t: float) -> None:
        if self.day_end == -math.inf:
            self.day_end = next_midnight(t, self.zone)
            return
        while t >= self.day_end:
            start = next_midnight(self.day_end - 36 * 3600, self.zone)  # the midnight before
            self._close(start, self.day_end)
            self.day_end = next_midnight(self.day_end + 1, self.zone)

    def _close(self, start: float, end: float) -> None:
        day = datetime.fromtimestamp(start, self.zone).date().isoformat()
        figures = pump_figures(self.store, self.pumps, start, end, open_until=end)
        hours = starts = 0.0
        for f in figures:
            run_hours, n = cast(float, f["run_hours"]), cast(int, f["starts"])
            hours += run_hours
            starts += n
            tags = {"station": self.station, "pump": str(f["sensor"]), "day": day}
            fields = {
                "run_hours": run_hours,
                "starts": n,
                "longest_run_hours": cast(float, f["longest_run_hours"]),
            }
            self._lines.append(line("pump_daily", tags, fields, start))
        overflows = [r for r in self.store.overflows(start, end) if start <= r.start < end]
        volumes = [overflow_volume(r) for r in overflows]
        # Of the overflows whose volume is known; a float even when 0: one field type. Those
        # not known are counted, not added as 0 gal (NaN is no field value InfluxDB takes).
        volume = float(sum(v for v, _ in volumes if v is not None))
        fields_s: dict[str, float | int | bool] = {
            "run_hours": hours,
            "starts": int(starts),
            "overflows": len(overflows),
            "overflow_volume_gal": volume,
            "overflows_volume_unknown": sum(v is None for v, _ in volumes),
            "overflows_volume_partial": sum(n.startswith("partial") for _, n in volumes),
            # Records that continue an earlier one (one spill): the spills are the difference.
            "overflows_continuing": sum(r.continues is not None for r in overflows),
        }
        self._lines.append(line("station_daily", {"station": self.station, "day": day}, fields_s, start))

    def take(self) -> list[str]:
        out, self._lines = self._lines, []
        return out


__all__ = ["DailyTotals", "next_midnight"]
