"""The wet well's overflow record between readings: how fast the well spills, the spill a
record continues (one spill, one event) and its share at a local midnight.

Owned by `StationTracker`, which judges when an overflow opens and ends; kept here so the
rate, the link and the day split read apart from fail to start and the pumps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable

from monitor.config import Config
from monitor.config.station_models import Setpoints
from monitor.model import iso
from monitor.station.pumps import PumpStats
from monitor.station.record import OverflowRecord
from monitor.units import GALLONS_PER_FT3, conversion

# A chain of float-ended records continues its first for a day from that start at most: a
# transmitter dead for days must not make one "spill" of every overflow (each day's a report).
SPILL_SPAN = 86_400.0


# The share of the well's working span (`off` to `overflow`) the level must read under
# `overflow` to say the well fell away from the crest: 2 % (0.14 ft on a 7 ft span, ~1.7 in)
# is more than a float's hysteresis (~1 in) and a transmitter's error (0.1-0.25 % of its span)
# together, so a level a hair under the setpoint while the float bounces does not part the
# spill; a well that really fell after the spill drops past it within a poll or two (the
# setpoints are the only elevations every well has: no deadband of its own to take).
CREST_SHARE = 0.02


def crest_margin(sp: Setpoints) -> float:
    """How far under `overflow` the level must read to part a float's bounces at the crest."""
    return CREST_SHARE * (sp.overflow - sp.off)


def switch_alone(rec: OverflowRecord, overflow: float) -> str:
    """`rec`'s volume note, saying what a volume rests on when only the float said the well
    spilled: the level read under `overflow` all the while it was open, so the weir's head
    or the inflow method's spill was 0 (an undercount if the switch is right). Partial: it is
    not a measurement of the spill, and the report must not read it as "0 gal spilled"."""
    note = rec.volume_note
    if rec.level_last is None or rec.volume_gal is None or rec.peak >= overflow:
        return note
    alone = (
        f"the overflow switch alone said the well spilled: the level read under overflow"
        f" throughout (at most {rec.peak:g}); the volume, {rec.volume_gal:g} gal, is the level's"
    )
    if note.startswith("partial: "):
        return f"{note}; {alone}"
    return f"partial: {alone}" + (f"; {note}" if note else "")


def first(record: OverflowRecord) -> float:
    """The start of the spill `record` belongs to: its own, or the one it continues."""
    return record.start if record.continues is None else record.continues


class OverflowRate:
    """The overflow rate: with a weir, Francis' Q = C L H^1.5 on the level above the crest;
    without one, the station inflow above the capacity of the pumps running while the level
    is at or above `overflow`; with neither, none ("" method: the volume is not estimated)."""

    def __init__(self, config: Config) -> None:
        well = config.wet_well
        sp = config.sensor(well.level).setpoints if well else None
        self._overflow_at = sp.overflow if sp is not None else None
        self._inflow = well is not None and well.inflow is not None
        self._to_ft = 1.0
        self._weir: tuple[float, float, float] | None = None  # C, L (ft), crest (level unit)
        if well is not None:
            self._to_ft = conversion(config.rules[well.level].unit, "ft")[0]
            if well.weir is not None and sp is not None:
                crest = well.weir.crest if well.weir.crest is not None else sp.overflow
                self._weir = (well.weir.coefficient, well.weir.length.to("ft"), crest)

    def gpm(self, level: float, inflow_gpm: float, pumps: Iterable[PumpStats]) -> tuple[float, str]:
        """Overflow rate now (gpm) and how it is estimated."""
        if self._weir is not None:
            c, length, crest = self._weir
            head = max(0.0, (level - crest) * self._to_ft) if math.isfinite(level) else 0.0
            return c * length * head**1.5 * GALLONS_PER_FT3 * 60.0, "weir"
        if self._inflow and self._overflow_at is not None:
            if not (level >= self._overflow_at) or math.isnan(inflow_gpm):
                return 0.0, "inflow"
            capacity = sum(p.capacity_gpm or 0.0 for p in pumps if p.running)
            return max(0.0, inflow_gpm - capacity), "inflow"
        return 0.0, ""


class SpillLink:
    """The last overflow the float ended with the level dead (`StationTracker._float_ended`),
    until a level reading says the well is below `overflow`: the next overflow opened within
    `report_within` of its end continues it (one spill, one event). Or the last the float's
    off ended with the level live just under `overflow` (`crest`), until a level reading
    says the well is clearly below it: the next opened within `crest_within` continues it
    (a float bouncing at the crest: one spill, not a report per bounce). `end` is its end, the
    float's off, on the float's clock as it stands now (a step moves it, the stored record
    keeps it). Kept over a restart (`StationStore.save_spill`, `saved`)."""

    def __init__(self, report_within: float, crest_within: float) -> None:
        self.report_within = report_within
        # A record the float's off ended with the level live just under `overflow` (a float
        # bouncing at the crest): the next continues it only if the float is back on within
        # this (the level's `stale_after`, the stretch the record calls a float's hysteresis).
        self.crest_within = crest_within
        self.record: OverflowRecord | None = None
        self.end = -math.inf
        self.crest = False

    def kept(self, rec: OverflowRecord, end: float, crest: bool = False) -> None:
        """`rec`, ended at `end`, is the candidate (`crest`: the float's off with the level
        live just under `overflow`, not dead)."""
        self.record, self.end, self.crest = rec, end, crest

    def continued(self, rec: OverflowRecord, t: float, agree: bool, level: float = math.nan) -> str:
        """Whether `rec`, opened at `t`, continues the candidate (then its `continues` and
        `gap_from` are set and the reason is returned, else ""); a crest's keeps the `level`
        last read (`gap_level`: the gap was read, not unmeasured). The gap is measured only
        across clocks that `agree` (one an hour off: not linked). The candidate is taken
        either way: a record opened after it, linked or not, is the next one's."""
        spill = self.record
        if spill is None:
            return ""
        self.record = None
        near = agree and t - self.end <= (self.crest_within if self.crest else self.report_within)
        # The chain's day from its first start on this clock: moved by the steps since, as
        # `end` was (the stored records keep the old clock's stamps).
        if spill.end is None or not near or t - (first(spill) + self.end - spill.end) > SPILL_SPAN:
            return ""
        rec.continues = first(spill)
        # The gap on this record's clock: the end as a step since moved it (the stored end
        # keeps the old clock's: stepped back, the gap ran backwards).
        rec.gap_from = min(self.end, t)
        # One spill, one SSO report, due when the spill's is (`report_within` from its first
        # start, carried down the chain; moved by the steps since as `end` was). Its own start's
        # due put the last bounce's report 28 min late and never overdue on the console.
        rec.due = min(rec.due, spill.due + self.end - spill.end)
        if self.crest:
            rec.gap_level = level if math.isfinite(level) else None
            return (
                f"; continues the overflow from {iso(rec.continues)} (the overflow switch off from"
                f" {iso(rec.gap_from)} for {t - rec.gap_from:.0f} s, the level not clearly below overflow)"
            )
        return (
            f"; continues the overflow from {iso(rec.continues)}"
            f" (not measured from {iso(rec.gap_from)}: the float ended it, the level not read)"
        )

    def saved(self, level_time: float) -> tuple[float, float, float] | None:
        """What `StationStore.save_spill` keeps: the candidate's start, its end, the level's
        last reading (None: no candidate)."""
        return None if self.record is None else (self.record.start, self.end, level_time)


class OpenOverflow:
    """The overflow record open now and what carries it from one reading to the next: the
    sensor whose reading opened it (its start is that clock's), the rate its volume is
    carried at from the last integration time and the sensor whose clock that is (`shift`),
    the float's last on-to-off while it is open and the volume then (with the level stale,
    the overflow ended there: `StationTracker._float_ended`). A restart goes on as without
    one: `kept` writes this into the record, `resumed` takes it back."""

    def __init__(self) -> None:
        self.record: OverflowRecord | None = None
        self.opened_by = ""
        self.q_prev = 0.0  # overflow rate (gpm) at the last integration time
        self.t_prev = -math.inf
        self.prev_by = ""
        self.float_off_at: float | None = None
        self.volume_at_off: float | None = None

    def opened(self, rec: OverflowRecord, sid: str) -> None:
        """`rec` opened by a reading of `sid`."""
        self.record, self.opened_by, self.float_off_at = rec, sid, None

    def resumed(self, rec: OverflowRecord, opener: str) -> None:
        """`rec`, held open by the store at a restart. The clock of the reading that opened
        it (a record of an older release does not say: `opener`, the well's, its level's).
        Taken as the level's, a record a gateway float opened an hour ahead of a
        device-stamped level did not move with the step back found at the restart and ended
        at its own start. The float's off and the carried rate as before the restart."""
        self.record, self.opened_by = rec, rec.opened_by or opener
        if rec.switch_on is not None:
            self.float_off_at, self.volume_at_off = rec.switch_off_at, rec.volume_at_off
        if rec.rate_gpm is not None and rec.rate_at is not None:
            self.q_prev, self.t_prev = rec.rate_gpm, rec.rate_at

    def shifted(self, delta: float, keep: Collection[str], well: str, switch: str, level: bool) -> bool:
        """The gateway clock stepped by `delta` (`StationTracker.shift`): what it stamped
        moves, what a sensor in `keep` stamped stays (its device's clock). The record's start
        and due time are its opener's clock's, the level's times in it the level's (`level`:
        that clock moved), the carried rate's the clock's of the reading that set it (none
        yet: the `well`'s), the float's off the float's (`switch`). True: the record moved
        (its row, keyed by start, moves too)."""
        rec = self.record
        if level and rec is not None and rec.level_last is not None:
            rec.level_last += delta
            if rec.silent_from is not None and rec.silent_to is not None:
                rec.silent_from, rec.silent_to = rec.silent_from + delta, rec.silent_to + delta
        if level and rec is not None:
            rec.shifted_level(delta)
        if (self.prev_by or well) not in keep:
            self.t_prev += delta
        if self.float_off_at is not None and switch not in keep:
            self.float_off_at += delta
        moved = rec is not None and self.opened_by not in keep
        if rec is not None and moved:
            rec.start += delta
            rec.due += delta
        return moved

    def carried(self, sid: str, q: float, t: float) -> None:
        """The rate `q` from reading `t` of `sid` on. Never back: readings of two clocks a
        few seconds apart, interleaved, would count the same seconds again at every poll."""
        if t >= self.t_prev:
            self.q_prev, self.t_prev, self.prev_by = q, t, sid

    def kept(self, rec: OverflowRecord, switch_on: bool | None) -> None:
        """What a restart needs in `rec` to go on as without one: the float's last reading
        (`switch_on`; None, unread since the restart: the record's stays), its off, the
        carried rate."""
        if switch_on is not None:
            rec.switch_on = switch_on
            rec.switch_off_at, rec.volume_at_off = self.float_off_at, self.volume_at_off
        if self.t_prev > -math.inf:
            rec.rate_gpm, rec.rate_at = self.q_prev, self.t_prev

    def at_midnight(self, midnight: float) -> OverflowRecord | None:
        """The open record as it stood at the local `midnight` (`at_midnight`)."""
        if self.record is None:
            return None
        rate = (self.q_prev, self.t_prev)
        return at_midnight(self.record, midnight, self.float_off_at, self.volume_at_off, rate)


def at_midnight(
    rec: OverflowRecord,
    midnight: float,
    float_off: float | None,
    volume_at_off: float | None,
    rate: tuple[float, float],
) -> OverflowRecord:
    """The open overflow `rec` as it stood at the local `midnight` (`DailyTotals.advance`, once
    per day closed): its volume carried to it at the last `rate` (gpm, since when), or to the
    float's off if the float's end is pending (the volume goes back to it at the close), its
    earlier days' share as before; the record's share moves on to the midnight."""
    volume = rec.volume_gal
    if volume is not None:
        q_prev, t_prev = rate
        if float_off is not None and float_off <= midnight and volume_at_off is not None:
            volume = volume_at_off
        elif midnight > t_prev > -math.inf:
            volume += q_prev * (midnight - t_prev) / 60.0
    then = dataclasses.replace(rec, volume_gal=volume)
    rec.volume_before_day = volume
    return then


__all__ = [
    "CREST_SHARE",
    "SPILL_SPAN",
    "OpenOverflow",
    "OverflowRate",
    "SpillLink",
    "at_midnight",
    "crest_margin",
    "first",
    "switch_alone",
]
