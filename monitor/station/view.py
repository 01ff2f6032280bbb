"""The station at a glance, as the console shows it: level and setpoints, pumps, inflow, overflow.

Built from the tracker's state (event time) and today's runs in the store; "today" is
the station's local day (`station.timezone`).
"""

from __future__ import annotations

import math
from datetime import datetime, time
from typing import cast
from zoneinfo import ZoneInfo

from monitor.config import Config
from monitor.model import iso
from monitor.station.report import pump_figures
from monitor.station.tracker import StationTracker


def local_midnight(t: float, zone: ZoneInfo) -> float:
    day = datetime.fromtimestamp(t, zone).date()
    return datetime.combine(day, time(0), zone).timestamp()


def _local(t: float, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(t, zone).isoformat(timespec="minutes")


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def _failed(tracker: StationTracker) -> set[str]:
    """The pumps that should be running while fail-to-start is up: the lead (with alternation,
    the pump idle longest) between lead_on and lag_on; every idle pump above lag_on."""
    if not tracker.fail_active:
        return set()
    idle = [p for p in tracker.pumps.values() if p.running is False]
    sp = tracker.setpoints
    if not idle or sp is None:
        return set()
    if sp.lag_on is None or tracker.level >= sp.lag_on:
        return {p.sensor for p in idle}
    return {min(idle, key=lambda p: p.last_stop).sensor}


def snapshot(config: Config, tracker: StationTracker, now: float) -> dict[str, object]:
    """JSON-able state of the wet well and its pumps at `now` (the daemon's clock)."""
    zone = config.station.zone
    midnight = local_midnight(now, zone)
    today = (
        {
            p["sensor"]: p
            for p in pump_figures(tracker.store, list(tracker.pumps), midnight, now, open_until=now)
        }
        if tracker.store is not None
        else {}
    )
    level = None
    if tracker.level_id is not None:
        sp = tracker.setpoints
        level = {
            "sensor": tracker.level_id,
            "name": config.sensor(tracker.level_id).name,
            "unit": config.rules[tracker.level_id].unit,
            "value": _finite(tracker.level),
            "time": iso(tracker.level_time) if math.isfinite(tracker.level_time) else None,
            "setpoints": None if sp is None else sp.model_dump(),
            "high": tracker.high_active,
            "fail_to_start": tracker.fail_active,
        }
    pumps = []
    failed = _failed(tracker)
    for pid, p in tracker.pumps.items():
        if p.running is None:
            state = "unknown"
        elif p.running:
            state = "running"
        elif pid in failed:
            state = "failed"  # called (level above lead_on past the delay) and not running
        else:
            state = "stopped"
        figures = today.get(pid, {})
        pumps.append(
            {
                "sensor": pid,
                "name": config.sensor(pid).name,
                "state": state,
                "since": iso(p.run_start) if p.running and p.run_start is not None else None,
                "today_run_hours": figures.get("run_hours", 0.0),
                "today_starts": figures.get("starts", 0),
                "capacity_gpm": p.capacity_gpm,
                "speed": tracker.readings[pid].get("speed"),
                "amps": tracker.readings[pid].get("amps"),
                "alarms": [
                    r for r, on in (("pump_starts", p.starts_alarm), ("long_run", p.long_run_alarm)) if on
                ],
            }
        )
    inflow = None
    if tracker.inflow_id is not None:
        inflow = {"sensor": tracker.inflow_id, "value_gpm": _finite(tracker.inflow_gpm)}
    overflow = None
    rec = tracker.overflow
    if rec is not None:
        volume, note = rec.judged(tracker.level_stale, tracker.last_time)
        # Its end open only because no reading says the well stopped spilling: say so.
        # After a restart the tracker has read no level yet: the record keeps its last.
        read = tracker.level_time if math.isfinite(tracker.level_time) else (rec.level_last or -math.inf)
        stale = math.isfinite(read) and now - read > tracker.level_stale
        overflow = {
            "sensor": rec.sensor,
            "start": iso(rec.start),
            "start_local": _local(rec.start, zone),
            "report_due": iso(rec.due),
            "report_due_local": _local(rec.due, zone),
            "overdue": now > rec.due,
            "peak_level": _finite(rec.peak),
            "volume_gal": None if volume is None else round(volume, 1),
            "volume_note": note or None,  # why unknown (volume_gal null) or partial so far
            "level_not_read_since": iso(read) if stale else None,
            "level_not_read_since_local": _local(read, zone) if stale else None,
            # The spill this record continues (its first record's start) and the gap's start.
            "continues": None if rec.continues is None else iso(rec.continues),
            "continues_local": None if rec.continues is None else _local(rec.continues, zone),
            "continues_gap_from": None if rec.gap_from is None else iso(rec.gap_from),
            # A crest's gap: the level read then (the float off); null: nothing read in it.
            "continues_gap_level": rec.gap_level,
        }
    return {
        "station": config.station.id,
        "time": iso(now),
        "time_local": _local(now, zone),
        "today_local": datetime.fromtimestamp(now, zone).date().isoformat(),
        "timezone": config.station.timezone,
        "level": level,
        "pumps": pumps,
        "totals": {  # the station: every pump together, today
            "today_run_hours": round(sum(cast(float, f["run_hours"]) for f in today.values()), 4),
            "today_starts": sum(cast(int, f["starts"]) for f in today.values()),
        },
        "inflow": inflow,
        "overflow": overflow,
    }


__all__ = ["local_midnight", "snapshot"]
