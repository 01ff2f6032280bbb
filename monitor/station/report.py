"""Pump and overflow figures over a period, from what `monitor run` or `monitor replay` stored.

The JSON form is a contract (acceptance checks read it):
`{"pumps": [{"sensor", "run_hours", "starts", ...}], "overflows": [{"sensor", "start", "end",
"volume_gal", "volume_note", "volume_partial", "continues", ...}]}`, times ISO 8601 UTC with Z. A
volume not measured is `null` with `volume_note` saying why, never 0; one the level measured
over part of the overflow has `volume_partial` true and the level's silence (or its readings
known missing: bad data, the daemon down) that made it so.
An overflow that continues one the float switch ended with the level dead (or with the level
live just under the setpoint: a float bouncing at the crest) names it
(`continues`: that spill's first record's start) and the gap not measured (`continues_gap_from`
to its own start).
Runs are clipped to the period; a run or overflow still open counts up to the last event
time judged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

from monitor.model import iso
from monitor.station.record import OverflowRecord
from monitor.station.store import StationStore


def pump_figures(
    store: StationStore,
    pumps: Sequence[str],
    start: float,
    end: float,
    open_until: float | None = None,
    unmonitored: Sequence[tuple[float, float]] | None = None,
) -> list[dict[str, object]]:
    """Run hours (clipped to [start, end)), starts, starts per hour, longest run per pump,
    and the hours of the period not monitored.

    A run still going counts up to `open_until` (live: now), else to the last event time stored.
    Run hours leave out the `unmonitored` stretches (not overlapping; None: those the store
    kept, as the day's `pump_daily` point does): a run open across the daemon's downtime was
    not seen running then; its longest run is its longest stretch seen, not one through it."""
    last = open_until if open_until is not None else store.last_time()
    if unmonitored is None:
        unmonitored = store.unmonitored()
    not_seen = sum(max(0.0, min(end, y) - max(start, x)) for x, y in unmonitored)
    runs = store.runs(start, end)
    out: list[dict[str, object]] = []
    hours = max((end - start) / 3600.0, 1e-9)
    for pump in pumps:
        seconds = 0.0
        starts = 0
        longest = 0.0
        for run in runs:
            if run.pump != pump:
                continue
            stop = run.end if run.end is not None else (last if last is not None else run.start)
            a, b = max(run.start, start), min(stop, end)
            seconds += max(0.0, b - a) - sum(max(0.0, min(b, y) - max(a, x)) for x, y in unmonitored)
            longest = max(longest, _longest_seen(run.start, stop, unmonitored))
            if run.started and start <= run.start < end:
                starts += 1
        out.append(
            {
                "sensor": pump,
                "run_hours": round(seconds / 3600.0, 4),
                "starts": starts,
                "starts_per_hour": round(starts / hours, 3),
                "longest_run_hours": round(longest / 3600.0, 4),
                "unmonitored_hours": round(not_seen / 3600.0, 4),
            }
        )
    return out


def _longest_seen(start: float, stop: float, unmonitored: Sequence[tuple[float, float]]) -> float:
    """The longest stretch of [start, stop] outside the `unmonitored` ones (sorted, not overlapping)."""
    longest, at = 0.0, start
    for a, b in unmonitored:
        if b <= at or a >= stop:
            continue
        longest, at = max(longest, a - at), max(at, b)
    return max(longest, stop - at)


def overflow_volume(
    rec: OverflowRecord, stale_after: float = math.inf, until: float | None = None
) -> tuple[float | None, str]:
    """A record's volume and why it is not the whole overflow's ("": it is). A closed one's
    was judged when it closed (`OverflowRecord.judged`); one still open is unknown until
    the level has been read during it, and partial so far when the level has been silent
    longer than `stale_after` up to `until` (the last event time: as the console says)."""
    if rec.end is not None:
        return rec.volume_gal, rec.volume_note
    return rec.judged(stale_after, rec.start if until is None else until)


def overflow_figures(
    store: StationStore, start: float, end: float, zone: ZoneInfo, stale_after: float = math.inf
) -> list[dict[str, object]]:
    """`stale_after`: the level's; an overflow still open whose level was last read longer
    than that before the last event time stored says since when (`level_not_read_since`):
    its end is open because nothing said the well stopped spilling, not because it spills."""
    out: list[dict[str, object]] = []
    last = store.last_time()
    for rec in store.overflows(start, end):
        # Open: judged up to the last event time stored (a dead level's carried volume is partial).
        until = rec.end if rec.end is not None else max(rec.start, last if last is not None else rec.start)
        volume, note = overflow_volume(rec, stale_after, until)
        partial = note.startswith("partial")
        # Where the volume was not measured: the silence or the readings known missing.
        silent = rec.unmeasured(stale_after, until) or rec.silence(until)
        read = rec.level_last
        stale = rec.end is None and read is not None and last is not None and last - read > stale_after
        out.append(
            {
                "sensor": rec.sensor,
                "start": iso(rec.start),
                "end": None if rec.end is None else iso(rec.end),
                "duration_s": None if rec.end is None else round(rec.end - rec.start, 1),
                "peak_level": None if rec.peak != rec.peak else round(rec.peak, 3),
                "volume_gal": None if volume is None else round(volume, 1),
                "volume_method": rec.method or None,
                "volume_note": note or None,  # why unknown (volume_gal null) or partial
                "volume_partial": partial,
                # the level's silence or missing readings that made it partial: an estimate then
                "volume_unmeasured_from": iso(silent[0]) if partial else None,
                "volume_unmeasured_to": iso(silent[1]) if partial else None,
                "level_not_read_since": iso(read) if stale and read is not None else None,
                # One spill, one event: the overflow this one continues (its first record's
                # start, the spill's id) and from when the time between was not measured.
                "continues": None if rec.continues is None else iso(rec.continues),
                "continues_gap_from": None if rec.gap_from is None else iso(rec.gap_from),
                # A crest's gap (the float off, the level live just under overflow): what the
                # level read then; null for a gap nothing was read in.
                "continues_gap_level": rec.gap_level,
                "report_due": iso(rec.due),
                "report_due_local": datetime.fromtimestamp(rec.due, zone).isoformat(timespec="minutes"),
            }
        )
    return out


def report(
    store: StationStore,
    pumps: Sequence[str],
    start: float,
    end: float,
    zone: ZoneInfo,
    stale_after: float = math.inf,
) -> dict[str, object]:
    """`stale_after`: the wet well level's (`overflow_figures`)."""
    return {
        "pumps": pump_figures(store, pumps, start, end),
        "overflows": overflow_figures(store, start, end, zone, stale_after),
    }


__all__ = ["overflow_figures", "overflow_volume", "pump_figures", "report"]
