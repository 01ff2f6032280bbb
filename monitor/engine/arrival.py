"""The stale watch of a device-stamped sensor (an MQTT payload's `time_path`): on the gateway
clock, from each good reading's arrival, never from the difference between two clocks.

A reading is as fresh as the time it was taken, not the time it arrived: a PLC's
store-and-forward buffer sent after an hour's uplink outage arrives now, but its newest
reading may be an hour old, and a level that looked fresh for it told the operator the
wrong thing (stale cleared, raised again a minute later; sent slowly, never raised). So
the watch learns the quickest delivery, the least `arrival - stamp` seen (the two clocks'
offset plus the link's delay), and takes a reading at `stamp + that`: a reading delivered
as fast as the quickest is taken at its arrival, a backlog an hour behind an hour ago.

That least delivery may grow by `DRIFT` per second (a PLC's crystal running slow against
the gateway's), moves with a gateway clock step (`shift`), and is learnt again after a
reading stamped earlier than the last one judged (`stepped_back`: the device's clock
stepped back, NTP on the PLC, and every reading after it arrives that much "later").
A reading stamped the same as the last one (a retained message delivered again, a QoS 1
duplicate, a dead RTC) keeps it. A resent buffer that starts before the last reading
judged looks like a step back, and is taken at its arrival: the readings' stamps cannot
tell the two apart.

The quickest delivery is kept in the engine's checkpoint (`restore`): learnt again after a
restart, the first backlog to arrive was taken at its arrival and cleared a restored stale
alarm (a PLC dead for an hour looked alive for a minute). But the gateway clock may have
been stepped forward while the daemon was down (NTP at boot after a run on a clock behind),
which no watch saw: every live reading would then look a step late against the restored
delivery, for good. So a restored delivery gives way to readings whose stamps advance as
their arrivals do, none delivered more than `JITTER` quicker than the one measured from,
for `PACE_SPAN`: a live device, not a backlog (sent at once, or at a rate faster than it
was taken: each reading quicker than the last). A backlog sent at the pace it was taken
(within 10 %) cannot be told from a live device: it is taken live.
"""

from __future__ import annotations

import math

DRIFT = 1e-3
"""How fast the quickest delivery may grow, in seconds a second: a clock crystal drifts
100 ppm at worst, NTP slews at 500 ppm; ten times the first still keeps an hour-old
backlog an hour old for 1000 hours."""

JITTER = 2.0
"""A restored delivery gives way to readings that come no quicker than one of them, less this
(seconds: the link's delay varying), for `PACE_SPAN`: their stamps advance as their arrivals
do, a live device. A backlog catches up (each reading delivered quicker than the one before:
all at once, or sent at a rate), and is measured again from each reading `JITTER` quicker."""
PACE_SPAN = 20.0
"""...for at least this long of arrivals (seconds). A backlog sent less than `JITTER /
PACE_SPAN` (10 %) faster than it was taken cannot be told from a live device."""


class DeviceWatch:
    """The arrival side of one device-stamped sensor's stale watch (all gateway time)."""

    __slots__ = ("first_late", "lag", "lag_at", "refused_at", "refused_before")

    def __init__(self) -> None:
        self.lag = math.inf  # the quickest delivery seen: arrival - stamp (unknown yet)
        self.lag_at = -math.inf  # when it was seen
        # When the last two readings stamped no later than the one before arrived: two in
        # one stale window are a device clock that stopped or stepped back, one alone a
        # retained message delivered again at a broker's restart.
        self.refused_at = -math.inf
        self.refused_before = -math.inf
        # A restored delivery (`restore`) not confirmed since: the (stamp, arrival) of the
        # first reading late against it, or (nan, nan) before one; None once confirmed.
        self.first_late: tuple[float, float] | None = None

    def restore(self, lag: float, lag_at: float) -> None:
        """The quickest delivery a checkpoint held, learnt before a restart (gateway time)."""
        self.lag, self.lag_at = lag, lag_at
        self.first_late = (math.nan, math.nan) if math.isfinite(lag) else None

    def taken(self, stamp: float, arrived: float) -> float:
        """The gateway clock's time a good reading stamped `stamp` was taken, arriving at
        `arrived`: never after its arrival."""
        seen = arrived - stamp
        quickest = self.lag + DRIFT * (arrived - self.lag_at)
        if seen <= quickest:
            self.lag, self.lag_at = seen, arrived
            self.first_late = None
            return arrived
        if self.first_late is not None and self._live(stamp, arrived):
            self.lag, self.lag_at = seen, arrived  # the gateway clock moved while down
            self.first_late = None
            return arrived
        return stamp + quickest

    def _live(self, stamp: float, arrived: float) -> bool:
        """Whether readings late against a restored delivery come at the clocks' pace: none
        delivered `JITTER` quicker than the one measured from, for `PACE_SPAN`."""
        assert self.first_late is not None
        first, at = self.first_late
        if math.isnan(first) or (stamp - first) - (arrived - at) > JITTER:  # catching up
            self.first_late = (stamp, arrived)
            return False
        return arrived - at >= PACE_SPAN

    def refused(self, stamp: float, last: float, arrived: float) -> None:
        """A reading stamped `stamp`, no later than the last one judged (`last`), arrived."""
        self.refused_before, self.refused_at = self.refused_at, arrived
        if stamp < last:  # the device's clock stepped back: its delivery is learnt again
            self.lag, self.lag_at = math.inf, -math.inf
            self.first_late = None

    def frozen(self, now: float, window: float) -> bool:
        """Readings keep arriving, but none later than the last one judged (two in `window`)."""
        return now - self.refused_before <= window

    def shift(self, delta: float) -> None:
        """The gateway clock stepped by `delta`: every time here is on it; the device's not."""
        self.lag += delta
        self.lag_at += delta
        self.refused_at += delta
        self.refused_before += delta
        if self.first_late is not None:
            self.first_late = (self.first_late[0], self.first_late[1] + delta)
