"""Alarm starts the gateway clock stamped while it was not set, kept across restarts.

An alarm that began on an unset clock (no battery-backed clock, NTP not answered yet: a day
of last year) keeps that start in the journal when NTP sets the clock: a step does not
rewrite it. A page sent after that, in this run or after a restart (a stop, kill -9, or NTP
setting the clock while the daemon was down), must not say "since" that day. Each run that
starts an escalation on a clock judged not set keeps the span of such starts (earliest,
latest) in the callout store's `meta` table; a start inside a span, and not judged set,
reads "before the gateway clock was set". A legit start from a set clock is later than any
reading of the unset clock that followed it, so it is not taken in (`Callout._activated`).
"""

from __future__ import annotations

import json
import logging
import math

from monitor.callout.store import CalloutStore
from monitor.errors import StateError

log = logging.getLogger(__name__)

KEY = "unset_clock_starts"
MAX_SPANS = 32  # runs on an unset clock remembered (a reboot loop's); the oldest go first
MAX_HERE = 10_000  # this run's starts remembered (a chattering alarm on a clock NTP never sets)


class UnsetStarts:
    """The spans of alarm starts stamped by a clock judged not set, one per run that had any."""

    def __init__(self, store: CalloutStore) -> None:
        self.store = store
        self.spans: list[tuple[float, float]] = self._load()
        self._open = False  # this run's span is the last one (a start on the unset clock noted)
        # The starts noted in this run on the clock as it reads now (not kept: a reboot resets
        # an unset clock, and its now less an earlier boot's start is no length of the alarm).
        self._here: set[float] = set()
        self._failing = False

    def _load(self) -> list[tuple[float, float]]:
        try:
            text = self.store.note(KEY)
        except StateError as exc:
            log.error("callout: alarm starts on an unset clock not read (pages name their day): %s", exc)
            return []
        if text is None:
            return []
        try:
            raw = json.loads(text)
            spans = [(float(lo), float(hi)) for lo, hi in raw]
            if not all(math.isfinite(lo) and math.isfinite(hi) and lo <= hi for lo, hi in spans):
                raise ValueError("not a span")
        except (ValueError, TypeError, OverflowError, RecursionError):  # damage: pages name the day as before
            log.warning(
                "callout store %s: the note %r of alarm starts on an unset clock is damaged (%.60r);"
                " forgotten, written again at the next such start", self.store.path, KEY, text,
            )  # fmt: skip
            return []
        return spans[-MAX_SPANS:]

    def began(self, t: float) -> None:
        """An alarm began at `t`, stamped by the gateway clock while it was not set (this run)."""
        if len(self._here) >= MAX_HERE:
            self._here.clear()  # their pages say "since when is not known", nothing wrong
        self._here.add(t)
        if not self._open:
            self.spans.append((t, t))
            self._open = True
            del self.spans[:-MAX_SPANS]
        else:
            lo, hi = self.spans[-1]
            if lo <= t <= hi:
                return
            self.spans[-1] = (min(lo, t), max(hi, t))
        self._save()

    def clock_set(self) -> None:
        """NTP set the clock: a start on an unset clock after this (a restart) is a new span."""
        self._open = False
        self._here.clear()
        if self._failing:
            self._save()

    def taken_as_right(self, since: float) -> None:
        """The clock in doubt at start (behind a heartbeat a clock wrong in the future wrote)
        is taken as right, having run without a step since the gateway clock read `since`
        (`ClockFile.settle`): the starts noted since were the right clock's (kept, after a day
        a page of such an alarm said "since before the gateway clock was set"). An earlier
        boot's unset clock read behind the right time, so its spans end before `since`."""
        kept = [(lo, min(hi, since)) for lo, hi in self.spans if lo < since]
        self._open = False
        self._here.clear()
        if kept != self.spans:
            self.spans = kept
            self._save()

    def noted(self, t: float) -> bool:
        """Whether an alarm start `t` was noted in this run on the unset clock as it reads now:
        only then is now less `t` how long the alarm has been on (a page on that clock)."""
        return t in self._here

    def unset(self, t: float) -> bool:
        """Whether an alarm start `t` may be one an unset clock stamped (inside a span)."""
        return any(lo <= t <= hi for lo, hi in self.spans)

    def _save(self) -> None:
        """Written at once (a kill -9 after NTP loses nothing); a store that refuses (a full
        disk) keeps it here for this run, said once, written at the next change."""
        try:
            self.store.keep_note(KEY, json.dumps(self.spans))
        except StateError as exc:
            if not self._failing:
                log.error("callout: alarm starts on an unset clock kept for this run only: %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("callout: alarm starts on an unset clock written again")
            self._failing = False
