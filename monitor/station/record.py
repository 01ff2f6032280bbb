"""One overflow's record: when, how high, how much, what its volume rests on, and why it is
not the whole overflow's (the level silent or its readings missing, the level and the float
disagreeing). Judged by `StationTracker`, kept by `StationStore`, read by the report and the
console; apart from the store so the record's rules read apart from its SQL.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from monitor.model import iso

NO_LEVEL = "no level reading during the overflow"


@dataclass(slots=True)
class OverflowRecord:
    """One overflow: when, how high, how much, and when it must be reported by."""

    sensor: str
    start: float
    due: float
    end: float | None = None
    peak: float = float("nan")
    volume_gal: float | None = None
    method: str = ""  # weir | inflow | "" (no estimate possible)
    # Why the volume is not the whole overflow's: "" (measured throughout), "no level
    # reading during the overflow" (volume None, never 0), "partial: ..." (`StationTracker`).
    volume_note: str = ""
    # What the volume rests on: the level's last good reading while it was open, and its
    # longest silence then (from the start or a reading to the next reading).
    level_last: float | None = None
    silent_from: float | None = None
    silent_to: float | None = None
    # What a restart needs to go on as without one (schema 3; None/"" in an older file):
    # the sensor whose reading opened it (its start is that clock's), the float's last
    # reading while open (True on), its on-to-off then and the volume carried to it, and
    # the rate the volume is carried at from `rate_at`.
    opened_by: str = ""
    switch_on: bool | None = None
    switch_off_at: float | None = None
    volume_at_off: float | None = None
    rate_gpm: float | None = None
    rate_at: float | None = None
    # The overflow this one continues (the start of the spill's first record: its id) and
    # the end of the record just before it: from then to this start nothing was measured
    # (`StationTracker`, "one spill, one event").
    continues: float | None = None
    gap_from: float | None = None
    # The volume carried to the last local midnight it was open across: the share of its
    # earlier days in their `station_daily` (schema 4; None: it crossed none).
    volume_before_day: float | None = None
    # The longest stretch, however short, in which the level's readings are known to be
    # missing while it was open (schema 5; None: none): its transmitter read bad, or the
    # daemon was down (`StationTracker`). Its volume then is an estimate: partial.
    missing_from: float | None = None
    missing_to: float | None = None
    # Not stored: the level's silence now is one with readings missing since (`level_missed`),
    # and whether only if longer than the longest before it (a restart between two polls
    # missed none: `restarted`).
    # The longest stretch in which the level read under `overflow` while the float switch
    # said on (the instruments disagree; the float keeps the record open), and the level read
    # first then (schema 5). Said in the note when longer than the level's `stale_after`
    # (shorter: a float's hysteresis at the crest).
    disagree_from: float | None = None
    disagree_to: float | None = None
    disagree_level: float | None = None
    # What the level read when this record continued one the float's off ended at the crest
    # (`SpillLink.crest`: the level live just under `overflow`; schema 6): the gap was read,
    # not unmeasured. None: a dead-level gap (nothing read), or no level read yet after a restart.
    gap_level: float | None = None
    # Not stored: the disagreement going on now, since when and the level then.
    _disagree_now: tuple[float, float] | None = dataclasses.field(default=None, repr=False, compare=False)
    _missed_since: float | None = dataclasses.field(default=None, repr=False, compare=False)
    _missed_if_longer: bool = dataclasses.field(default=False, repr=False, compare=False)

    def level_read(self, t: float) -> None:
        """A good level reading at `t` while the overflow is open."""
        prev = self.start if self.level_last is None else self.level_last
        gap = self.silence(prev)  # the silence so far, not counting to `t`
        missed = self._missed(t)
        if missed is not None:
            self._kept_missing(*missed)
        # Only a reading after the silence began ends it: one from before (MQTT's redelivery
        # or retained message at a restart, a device's buffer) hid the downtime's missing polls.
        if self._missed_since is not None and t > self._missed_since:
            self._missed_since = None
        if t - prev > gap[1] - gap[0]:
            self.silent_from, self.silent_to = prev, t
        self.level_last = t if self.level_last is None else max(self.level_last, t)

    def level_missed(self, t: float) -> None:
        """A level reading at `t`, bad (bad data, comm failure, outside its range), while the
        overflow is open: the silence it falls in misses readings, however short."""
        since = self.start if self.level_last is None else self.level_last
        if t >= since and (self._missed_since is None or self._missed_if_longer):
            self._missed_since, self._missed_if_longer = since, False

    def restarted(self) -> None:
        """Taken up again after the daemon was down: the level's silence across the downtime
        misses readings if longer than its longest silence before it (the level's poll,
        while the daemon ran); a restart between two polls missed none."""
        if self._missed_since is None:
            self._missed_since = self.start if self.level_last is None else self.level_last
            self._missed_if_longer = True

    def _missed(self, until: float) -> tuple[float, float] | None:
        """The silence now, to `until`, if readings are missing in it."""
        since = self._missed_since
        if since is None or until <= since:
            return None
        if self._missed_if_longer:
            before = self.silence(since)
            if until - since <= before[1] - before[0]:
                return None
        return since, until

    def _kept_missing(self, start: float, end: float) -> None:
        if (
            self.missing_from is None
            or self.missing_to is None
            or end - start > self.missing_to - self.missing_from
        ):
            self.missing_from, self.missing_to = start, end

    def missing(self, until: float) -> tuple[float, float] | None:
        """The longest stretch with the level's readings known missing, up to `until`."""
        now = self._missed(until)
        kept = (
            None
            if self.missing_from is None or self.missing_to is None
            else (self.missing_from, self.missing_to)
        )
        if now is None or (kept is not None and kept[1] - kept[0] >= now[1] - now[0]):
            return kept
        return now

    def shifted_level(self, delta: float) -> None:
        """The level's clock stepped by `delta` (`OpenOverflow.shifted`): the stretches of missing
        readings and of disagreement, on the level's clock, move with it."""
        if self.missing_from is not None and self.missing_to is not None:
            self.missing_from, self.missing_to = self.missing_from + delta, self.missing_to + delta
        if self._missed_since is not None:
            self._missed_since += delta
        if self.disagree_from is not None and self.disagree_to is not None:
            self.disagree_from, self.disagree_to = self.disagree_from + delta, self.disagree_to + delta
        if self._disagree_now is not None:
            self._disagree_now = (self._disagree_now[0] + delta, self._disagree_now[1])

    def disagreeing(self, t: float, level: float) -> None:
        """A good level reading `level`, under `overflow`, at `t` with the float switch on."""
        if self._disagree_now is None:
            self._disagree_now = (t, level)

    def agreed(self, t: float) -> None:
        """The level and the float agree again at `t` (over, or the float off)."""
        longest = self.disagreement(t)
        if longest is not None:
            self.disagree_from, self.disagree_to, self.disagree_level = longest
        self._disagree_now = None

    def disagreement(self, until: float) -> tuple[float, float, float] | None:
        """The longest disagreement up to `until` (one going on ends there): from, to, level."""
        kept = None
        if (
            self.disagree_from is not None
            and self.disagree_to is not None
            and self.disagree_level is not None
        ):
            kept = (self.disagree_from, self.disagree_to, self.disagree_level)
        now = self._disagree_now
        if now is not None and (kept is None or until - now[0] > kept[1] - kept[0]):
            return now[0], until, now[1]
        return kept

    def _disagreed(self, stale_after: float, until: float) -> str:
        """What the record says of the instruments disagreeing longer than `stale_after`."""
        d = self.disagreement(until)
        if d is None or d[1] - d[0] <= stale_after:
            return ""
        return (
            f"the level read {d[2]:g}, under overflow, while the overflow switch was on"
            f" from {iso(d[0])} to {iso(d[1])}: the instruments disagree; the switch"
            " kept the overflow open, the volume then is the level's"
        )

    def unmeasured(self, stale_after: float, until: float) -> tuple[float, float] | None:
        """Where the volume is not measured, up to `until` (None: nowhere): the level's
        longest silence if longer than `stale_after`, else the longest stretch with its
        readings known missing."""
        silent = self.silence(until)
        if silent[1] - silent[0] > stale_after:
            return silent
        return self.missing(until)

    def silence(self, until: float) -> tuple[float, float]:
        """The level's longest silence while open, up to `until` ((x, x): none)."""
        gap = (until, until)
        if self.silent_from is not None and self.silent_to is not None:
            gap = (self.silent_from, self.silent_to)
        if self.level_last is not None and until - self.level_last > gap[1] - gap[0]:
            gap = (self.level_last, until)
        return gap

    def judged(self, stale_after: float, until: float) -> tuple[float | None, str]:
        """The volume as it may be reported over [start, `until`], and why it is not the
        whole overflow's: unknown (None, never 0) with no level reading while it was open
        (the weir has no head, the inflow method needs the level); partial when the level
        was silent longer than its `stale_after`, or its readings are known missing however
        briefly (`missing`). The note says what the estimate did: the weir's flow between
        the levels read before and after (trapezoids), or carried on at the last level known
        (the inflow method; the weir's with no level read after)."""
        if not self.method:
            return None, "no weir or inflow to estimate it"
        if self.level_last is None:
            return None, NO_LEVEL
        gap = self.unmeasured(stale_after, until)
        disagreed = self._disagreed(stale_after, until)
        parts = [disagreed] if disagreed else []
        if gap is not None:
            silent = self.silence(until)
            long = gap[1] - gap[0] > stale_after and gap == silent
            what = "no level reading" if long else "level readings missing"
            if self.method == "weir" and gap[1] <= self.level_last:
                how = "the flow over the weir then is estimated from the levels read before and after"
            else:
                how = "the volume then rests on the last level known"
            parts.insert(0, f"{what} from {iso(gap[0])} to {iso(gap[1])}; {how}")
        return self.volume_gal, "partial: " + "; ".join(parts) if parts else ""


__all__ = ["NO_LEVEL", "OverflowRecord"]
