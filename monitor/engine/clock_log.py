"""How the gateway clock's steps are told: once an episode, then counted.

A gateway clock that flaps (NTP stepping it back and forth every few seconds, a failing
RTC fighting a time server) used to log a WARNING per step: at 3 a.m. a journal of
thousands of identical lines with the real ones buried among them. Now, as an operator
reads it:

- An episode begins with a step while the clock was steady: that step is logged in full
  (WARNING, what `ClockWatch` did about it).
- A step `LOUDER` times the episode's largest so far (an hour's NTP correction among a
  flap of seconds: it moves every reading and open record by the hour) is logged in full
  too, when noticed, and not counted among the window's.
- Every further step is counted (DEBUG, one line each) and the count said in one WARNING
  line per window of `EPISODE` seconds from the first step: "gateway clock stepped 119 more
  times in the last 10m (59 back, 60 forward, the largest back by 8s), ...". A clock that
  flaps all night gives six lines an hour.
- A window with no step ends the episode (one INFO line); the next step is logged in full.
  Steps counted when the daemon stops are said then (`flush`).
- Every step is still handled, raises (or keeps) the `clock` alarm and is counted: `steps`
  since start and the episode's in /api/health (`clock`), `steps` in /metrics
  (`station_monitor_clock_steps_total`).

Time is the monotonic clock the watch is given (tests pass a `ManualClock`'s)."""

from __future__ import annotations

import logging

from monitor.model import step_text

log = logging.getLogger(__name__)

EPISODE = 600.0  # seconds: the window a flapping clock's steps are summarised in
LOUDER = 10.0  # a step this many times the episode's largest so far is logged in full


class StepLog:
    """The clock steps' log lines and counts (see the module docstring)."""

    def __init__(self) -> None:
        self.steps = 0  # noticed since start, each
        self.episode_steps = 0  # in the episode in progress (0 while steady)
        self.episode_largest = 0.0  # its largest step, seconds (< 0 back)
        self._since: float | None = None  # monotonic start of the window; None: steady
        self._back = 0  # this window's steps after the first logged, back and forward
        self._forward = 0
        self._largest = 0.0

    def stepped(self, mono: float, step: float, text: str) -> bool:
        """A step of `step` seconds noticed at `mono`, told as `text`: logged in full (and
        True) when it begins an episode or dwarfs its steps so far (`LOUDER`), else counted
        for the window's line."""
        self.tick(mono)
        self.steps += 1
        loud = self._since is None or abs(step) >= LOUDER * abs(self.episode_largest)
        if abs(step) > abs(self.episode_largest):
            self.episode_largest = step
        self.episode_steps += 1
        if loud:
            if self._since is None:
                self._since = mono
            log.warning("%s", text)
            return True
        if step < 0:
            self._back += 1
        else:
            self._forward += 1
        if abs(step) > abs(self._largest):
            self._largest = step
        log.debug("%s (counted: %d in this episode)", text, self.episode_steps)
        return False

    def tick(self, mono: float) -> None:
        """At the end of a window (checked on every clock check): its steps in one line, or,
        with none, the episode is over."""
        if self._since is None or mono - self._since < EPISODE:
            return
        if not self._back + self._forward:
            log.info(
                "gateway clock steady for %s: its next step is logged in full", step_text(mono - self._since)
            )
            self._since = None
            self.episode_steps, self.episode_largest = 0, 0.0
            return
        self._summarise(mono, "")

    def flush(self, mono: float) -> None:
        """At shutdown (and before a reload's new daemon): the steps counted in this window
        and not said yet, so none goes unlogged."""
        if self._since is not None and self._back + self._forward:
            self._summarise(mono, " before shutdown")

    def _summarise(self, mono: float, when: str) -> None:
        largest, more = self._largest, self._back + self._forward
        log.warning(
            "gateway clock stepped %d more %s in the last %s%s (%d back, %d forward, the largest %s by %s),"
            " not logged one by one; judging goes on",
            more,
            "time" if more == 1 else "times",
            step_text(mono - (self._since or mono)),
            when,
            self._back,
            self._forward,
            "back" if largest < 0 else "forward",
            step_text(largest),
        )
        self._since = mono
        self._back = self._forward = 0
        self._largest = 0.0


__all__ = ["EPISODE", "LOUDER", "StepLog"]
