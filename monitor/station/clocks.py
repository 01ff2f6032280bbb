"""Whether a wet well's readings on two clocks agree: a device-stamped level beside pumps and a
float switch polled on the gateway's clock (or the reverse).

A reading of one clock within `AGREE` seconds of the other's newest says the two agree; one
stamped more than `AGREE` before it says they do not (one an hour off until NTP steps it); a
reading later than that says nothing (the other's sensors may just be quiet: a transmitter
down, a pump reported on change). A step of the gateway clock sets it to be found again.
While they agree the well is judged as on one clock (`StationTracker`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

AGREE = 120.0


class WellClocks:
    """The two clocks of one well's readings and whether they were last found to agree."""

    def __init__(self, device: Collection[str], watched: Collection[str]) -> None:
        """`device`: the sensors stamped by their device's clock (`reconcile.device_stamped`);
        `watched`: the well's sensors (on two clocks only if some are and some are not)."""
        self.device = frozenset(device)
        # Whether the two clocks were found to agree when a reading of one was last compared
        # with the other's newest (`compare`); None: not compared yet.
        self.agree: bool | None = None
        self.newest = {False: -math.inf, True: -math.inf}  # each clock's newest reading (True: devices')
        watched = frozenset(watched)
        self.mixed = bool(watched & self.device) and bool(watched - self.device)

    def same(self, a: str, b: str) -> bool:
        """Whether readings of sensors `a` and `b` are stamped by one clock (both by the
        gateway, or both by devices); True when either is not known ("")."""
        return not a or not b or (a in self.device) == (b in self.device)

    def compare(self, sid: str, t: float) -> None:
        """A reading of `sid` at `t` against the other clock's newest: stamped more than
        `AGREE` before it, the clocks disagree (one an hour off until NTP steps it); within
        `AGREE` of it, they agree. Later than that says nothing: the other clock's sensors may
        just be quiet (a transmitter down, a pump reported on change)."""
        dev = sid in self.device
        other = self.newest[not dev]
        if other > -math.inf:
            if t < other - AGREE:
                self.agree = False
            elif t <= other + AGREE:
                self.agree = True
        self.newest[dev] = max(self.newest[dev], t)

    def comparable(self, a: str, b: str) -> bool:
        """Whether a reading of `a` may be measured against a time one of `b` set: one clock,
        or two found to agree. With both clocks right (no step), a well on two clocks is
        judged as on one: a delay begun by a pump's trip on the gateway's clock is measured by
        the level's readings on its own."""
        return self.agree is True or self.same(a, b)

    def stepped(self, last: Mapping[str, float]) -> None:
        """The gateway clock stepped: its newest is the latest of `last` (each sensor's last
        reading, as the step moved it) and whether the clocks agree is found again."""
        if self.mixed:
            gateway = [t for sid, t in last.items() if sid not in self.device]
            self.newest[False] = max(gateway, default=-math.inf)
            self.agree = None


__all__ = ["AGREE", "WellClocks"]
