"""What the heartbeat file keeps of a clock in doubt for a restart (`monitor.clockfile`).

Why apart: the rules of the doubt are the heartbeat's; this is only the record and its parsing,
small enough to read on its own, with the number parsing both share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_WHY = 200  # characters of `settled`: this release writes under 60
# Seconds the wall clock may drift from CLOCK_BOOTTIME between a `Kept` and a restart before
# it is a step (as the clock watch's TOLERANCE: slewing moves both clocks alike).
CONSISTENT = 2.0


@dataclass(frozen=True, slots=True)
class Kept:
    """The doubt of the heartbeat's `time`, kept in the file for a restart: measured in boot
    `boot_id` when the wall clock read `wall` at `since_boot` (CLOCK_BOOTTIME); the steady run
    since `steady_since` on the awake clock (CLOCK_MONOTONIC: one count in a boot), or the
    clock taken as right (`settled`: why)."""

    boot_id: str
    since_boot: float
    wall: float
    steady_since: float | None = None
    settled: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "boot_id": self.boot_id,
            "since_boot": self.since_boot,
            "wall": self.wall,
            "steady_since": self.steady_since,
            "settled": self.settled,
        }

    @classmethod
    def from_json(cls, doc: object) -> Kept:
        """What `to_json` wrote; ValueError naming what is not (a hand edit, a bit flip)."""
        if not isinstance(doc, dict) or not isinstance(boot := doc.get("boot_id"), str):
            raise ValueError("no boot id")
        since, wall = seconds(doc.get("since_boot")), seconds(doc.get("wall"))
        steady, settled = doc.get("steady_since"), doc.get("settled")
        if since is None or wall is None:
            raise ValueError("no number for since_boot or wall")
        if settled is not None and not (isinstance(settled, str) and settled.isprintable()):
            raise ValueError("settled is not one printable line")  # a forged line in the log
        if settled is not None and len(settled) > MAX_WHY:
            raise ValueError(f"settled is longer than {MAX_WHY} characters")
        steady_since = seconds(steady)
        if steady is not None and steady_since is None:
            raise ValueError("steady_since is not a number")
        return cls(boot, since, wall, steady_since, settled)

    def impossible(self, since_boot: float) -> str | None:
        """Why no daemon of this boot, now `since_boot` seconds old, wrote this record (None:
        one could have): kept later in the boot than now or before it began, a steady run
        (CLOCK_MONOTONIC, which runs no faster than CLOCK_BOOTTIME from the same 0) begun
        before the boot or after the record. Trusted, a run of -6 days settled the clock a day
        after the start, a record from later in the boot settled it at once (its wall clock
        moved alike), and one of 1e300 s failed every start writing its date."""
        if not 0.0 <= self.since_boot <= since_boot:
            return f"kept {self.since_boot:.6g} s into this boot, which is {since_boot:.6g} s old"
        if self.steady_since is not None and not 0.0 <= self.steady_since <= self.since_boot:
            run, kept = self.steady_since, self.since_boot
            return f"a steady run since {run:.6g} s, kept at {kept:.6g} s into the boot"
        return None

    def here(self, boot_id: str | None, since_boot: float, now: float) -> tuple[bool, str | None]:
        """Whether this record holds for a clock reading `now`, `since_boot` into boot
        `boot_id`: kept in this boot on a clock that has not stepped since (the wall clock and
        CLOCK_BOOTTIME moved alike: a suspend moves both); and why it is damage, if it is (a
        record of another boot is not: no doubt is kept across a reboot)."""
        if self.boot_id != boot_id:
            return False, None
        if (damage := self.impossible(since_boot)) is not None:
            return False, damage
        return abs((now - self.wall) - (since_boot - self.since_boot)) <= CONSISTENT, None


def seconds(value: object) -> float | None:
    """A number the file holds as a finite float, or None: not a bool or a string, and not an
    integer too large for a float (valid JSON; `math.isfinite` of it raised OverflowError in
    the daemon's constructor, and every start died)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None
