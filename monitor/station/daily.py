"""Daily totals per pump and per station, cut at the station's local midnight, for InfluxDB.

Measurement `pump_daily` (tags station, pump, day; fields run_hours, starts,
longest_run_hours) and `station_daily` (tags station, day; fields run_hours, starts,
overflows, overflow_volume_gal, overflows_volume_unknown, overflows_volume_partial,
overflows_continuing, overflows_open, overflow_volume_partial_gal), one
point per local day at its midnight, every day (the days the daemon was down included),
written when event time passes the next midnight: the
same points live and in replay. `overflow_volume_gal` sums the volumes known of what spilled
that day: an overflow open across the midnight gives each day its share (carried to the
midnight; `overflows_open` counts those still open at the day's end), so the days add up to
its volume; `overflow_volume_partial_gal` is the part of it from overflows whose level was
silent past its `stale_after` (carried at the last level: an estimate). An overflow whose
volume is unknown (no level reading during it) is counted,
never added as 0 gal. `overflows` and `overflows_continuing` count the records begun that day.

Both carry `unmonitored_hours`: the hours of the day in silences of the station's sensors
in which every one's last reading went stale (the daemon down, the gateway or its link dead,
before the first reading), measured between the readings either side (at a restart: from the
last event time the store kept, once its quickest sensor would have gone stale). Run hours
count only the monitored hours. A day wholly unmonitored gives `unmonitored_hours` alone:
nothing was measured, so no figure, and no zero read as measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import cast
from zoneinfo import ZoneInfo

from monitor.sinks.lineproto import line
from monitor.station.record import OverflowRecord
from monitor.station.report import overflow_volume, pump_figures
from monitor.station.store import StationStore, merged

# A forward step of the clock within this much of readings after a restart is NTP setting a
# clock the gateway booted on behind (`DailyTotals.stepped`); a later one is a running clock's.
RESTART_STEP = 86_400.0

# The overflow open at a local midnight as it stood then (volume carried to it), its earlier
# days' share in `volume_before_day`; None with none open. Called once per day closed.
Live = Callable[[float], OverflowRecord | None]


def next_midnight(t: float, zone: ZoneInfo) -> float:
    day = datetime.fromtimestamp(t, zone).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


class DailyTotals:
    """Closes local days as event time passes midnight; `take()` hands over their lines."""

    def __init__(
        self,
        station: str,
        zone: ZoneInfo,
        pumps: list[str],
        store: StationStore,
        stale_after: float = math.inf,
        silent_after: float = math.inf,
    ) -> None:
        """`stale_after`: the wet well level's (an open overflow's share is partial as the
        console says); `silent_after`: the shortest `stale_after` of the station's sensors (a
        restart's silence, or the first reading's since the day's start, longer is not monitored)."""
        self.station, self.zone, self.pumps, self.store = station, zone, pumps, store
        self.stale_after, self.silent_after = stale_after, silent_after
        self.day_end = -math.inf  # set by the first reading
        self.last = -math.inf  # the latest reading seen (`seen`)
        # When every station sensor's last reading is stale (the latest of a reading's time
        # plus its sensor's `stale_after`, the tracker keeps it): a reading after is the end
        # of a silence not monitored.
        self.stale_at = -math.inf
        self.unmonitored: list[tuple[float, float]] = []  # silences not monitored (`seen`)
        # After a restart: the store's last event time and the first reading since (the
        # tracker sets it), until the clock's first step says which clock that reading was on.
        self.restart: float | None = None
        self.restart_first: float | None = None
        self._lines: list[str] = []
        self.closed_through = -math.inf  # the end of the last day closed
        self.taken_through = -math.inf  # `closed_through` at the last `take`

    def resumed(self, last_time: float) -> None:
        """Taken up after a restart whose store last judged `last_time`: the days from its own
        on are closed at the first reading after it, the downtime unmonitored. Before, the
        restarted tracker began its days at that reading: the days the daemon was down over
        midnight had no point (a hole in the operator's daily log)."""
        self.last = self.restart = last_time
        # The daemon down: nothing was watched once its quickest sensor would have gone stale.
        self.stale_at = last_time + self.silent_after
        self.day_end = next_midnight(last_time, self.zone)
        self._close_again(next_midnight(self.day_end - 36 * 3600, self.zone))
        self.unmonitored = self.store.unmonitored(self.day_end - 36 * 3600)

    def _close_again(self, until: float) -> None:
        """The days closed before the restart whose lines the outbox never took (kept in
        memory on a full disk, or the daemon killed between the close and the append):
        closed again, to `until`, from what the store holds. An overflow open across one of
        their midnights is taken as the store holds it now, not as it stood at that midnight."""
        queued = self.store.daily_queued()
        if queued is None or queued >= until:
            return
        self.unmonitored = self.store.unmonitored(queued - 36 * 3600)
        end = next_midnight(queued + 1, self.zone)
        while end <= until:
            self._close(next_midnight(end - 36 * 3600, self.zone), end)
            self.closed_through = end
            end = next_midnight(end + 1, self.zone)

    def stepped(self, delta: float, last: float, stale_at: float) -> tuple[float, float] | None:
        """The gateway clock stepped by `delta` (`StationTracker.shift`); `last`: the latest
        reading as it stands now (-inf: none since a restart), `stale_at`: when every sensor's
        goes stale, from their readings as they stand now. Returns a silence to keep.

        Back: the history happened `-delta` earlier (the last reading, the silences of the
        days not closed: the caller moves the store's, `StationStore.shift_unmonitored`), and
        the day ends at the midnight after the last reading on the new clock (before, at the
        wrong clock's: a clock a day ahead stepped back left the day monitored without a
        point). Forward, the first step after a restart, within `RESTART_STEP` of readings:
        the gateway booted on a clock behind (no battery: fake-hwclock's time, or an unset
        clock) and NTP set it; the restart's first reading came at its stamp plus the step,
        and the silence from the last reading before the restart to it was not monitored
        (before, the downtime was taken for the step: days nobody watched had points saying
        they were monitored throughout)."""
        restart, first = self.restart, self.restart_first
        self.restart = self.restart_first = None  # the first step tells how the restart's clock stood
        if stale_at > -math.inf:
            # Not `stale_at + delta`: after a restart it was the store's last time, on the clock
            # before the downtime (a step of 56 years from an unset clock put it as far ahead).
            self.stale_at = stale_at
        elif delta < 0:
            self.stale_at += delta  # no reading since a restart: the store's last time moves back
        if delta < 0:
            self.last = last if last > -math.inf else self.last + delta
            self.unmonitored = [(a + delta, b + delta) for a, b in self.unmonitored]
            if self.last > -math.inf:
                self.day_end = min(self.day_end, next_midnight(self.last, self.zone))
            return None
        if last > -math.inf:
            self.last = last
        if restart is None or first is None or last - delta - first > RESTART_STEP:
            return None
        gap = (restart, first + delta)
        if gap[1] - gap[0] <= self.silent_after:
            return None
        self.unmonitored = merged([*self.unmonitored, gap])
        return gap

    def seen(self, t: float) -> tuple[float, float] | None:
        """A reading at `t` (before `advance`): a silence since the last in which every
        sensor's reading went stale (past `stale_at`; from the day's start, for the first
        reading, longer than `silent_after`) was not monitored.
        Returns the silence added to `unmonitored` (the caller keeps it:
        `StationStore.save_unmonitored`); one overlapping another (a restart killed before it
        saved its progress begins from the same last time) is counted once."""
        if t <= self.last:
            return None
        since, self.last = self.last, t
        if since == -math.inf:
            since = next_midnight(next_midnight(t, self.zone) - 36 * 3600, self.zone)  # the day's start
            if t - since <= self.silent_after:
                return None
        elif t <= self.stale_at:
            return None
        self.unmonitored = merged([*self.unmonitored, (since, t)])
        return since, t

    def advance(self, t: float, live: Live | None = None) -> None:
        """Close the local days event time `t` has passed; `live`: the overflow open then."""
        if self.day_end == -math.inf:
            self.day_end = next_midnight(t, self.zone)
            if self.store.daily_queued() is None:  # the first day: none before it to send
                self.store.save_daily_queued(next_midnight(self.day_end - 36 * 3600, self.zone))
            return
        while t >= self.day_end:
            start = next_midnight(self.day_end - 36 * 3600, self.zone)  # the midnight before
            self._close(start, self.day_end, None if live is None else live(self.day_end))
            self.closed_through = self.day_end
            self.day_end = next_midnight(self.day_end + 1, self.zone)
        # The days closed need theirs no more (the store keeps them all, for reports).
        self.unmonitored = [g for g in self.unmonitored if g[1] > self.day_end - 36 * 3600]

    def _unmonitored(self, start: float, end: float) -> list[tuple[float, float]]:
        """The unmonitored stretches within [start, end)."""
        cut = ((max(a, start), min(b, end)) for a, b in self.unmonitored)
        return [(a, b) for a, b in cut if b > a]

    def _shares(
        self, start: float, end: float, live: OverflowRecord | None
    ) -> tuple[list[tuple[float | None, str]], int]:
        """What each overflow of the day spilled in it, with its note, and how many were still
        open at its end. One open at the midnight is taken as it stood then (`live`): the store
        holds its last write (at its opening, or 30 s old), and the day after had nothing of it."""
        records = self.store.overflows(start, end)
        key = None if live is None else (live.sensor, live.start)
        records = [live if (r.sensor, r.start) == key and live is not None else r for r in records]
        if live is not None and live not in records and live.start < end:
            records.append(live)  # its opening not written (a full disk)
        shares: list[tuple[float | None, str]] = []
        for r in records:
            volume, note = overflow_volume(r, self.stale_after, end)
            if volume is not None and r.start < start:
                volume -= r.volume_before_day or 0.0  # the earlier days' share
            shares.append((volume, note))
        return shares, sum(r.end is None for r in records)

    def _close(self, start: float, end: float, live: OverflowRecord | None = None) -> None:
        day = datetime.fromtimestamp(start, self.zone).date().isoformat()
        gaps = self._unmonitored(start, end)
        unmonitored = sum(b - a for a, b in gaps) / 3600.0
        whole = unmonitored * 3600.0 >= end - start  # nothing measured that day
        # All the silences known (a run's longest stretch seen may reach back before the day).
        figures = pump_figures(
            self.store, self.pumps, start, end, open_until=end, unmonitored=self.unmonitored
        )
        hours = starts = 0.0
        for f in figures:
            run_hours, n = cast(float, f["run_hours"]), cast(int, f["starts"])
            hours += run_hours
            starts += n
            tags = {"station": self.station, "pump": str(f["sensor"]), "day": day}
            fields: dict[str, float | int | bool] = {
                "run_hours": run_hours,
                "starts": n,
                "longest_run_hours": cast(float, f["longest_run_hours"]),
                "unmonitored_hours": unmonitored,
            }
            if whole:
                fields = {"unmonitored_hours": unmonitored}
            self._lines.append(line("pump_daily", tags, fields, start))
        overflows = [r for r in self.store.overflows(start, end) if start <= r.start < end]
        volumes, still_open = self._shares(start, end, live)
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
            # Of the sum, the gallons that rest in part on a level not read (an estimate).
            "overflow_volume_partial_gal": float(
                sum(v for v, n in volumes if v is not None and n.startswith("partial"))
            ),
            # Records that continue an earlier one (one spill): the spills are the difference.
            "overflows_continuing": sum(r.continues is not None for r in overflows),
            # Still spilling at the day's end: its volume here is to the midnight, the rest the next day's.
            "overflows_open": still_open,
            # The hours of the day not monitored (the daemon down): its figures are of the rest.
            "unmonitored_hours": unmonitored,
        }
        if whole:
            fields_s = {"unmonitored_hours": unmonitored}
        self._lines.append(line("station_daily", {"station": self.station, "day": day}, fields_s, start))

    def take(self) -> list[str]:
        out, self._lines = self._lines, []
        self.taken_through = self.closed_through
        return out

    def queued(self) -> None:
        """The outbox took every line taken so far: a restart need not close those days again."""
        if self.taken_through > -math.inf:
            self.store.save_daily_queued(self.taken_through)


__all__ = ["DailyTotals", "next_midnight"]
