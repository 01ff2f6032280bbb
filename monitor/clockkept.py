"""What the heartbeat file keeps of a clock in doubt for a restart (`monitor.clockfile`).

Why apart: the rules of the doubt are the heartbeat's; this is only the record and its parsing,
small enough to read on its own, with the number parsing both share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
    def from_json(cls, doc: object) -> Kept | None:
        """None for anything but what `to_json` writes (an older or damaged file: no doubt kept)."""
        if not isinstance(doc, dict) or not isinstance(boot := doc.get("boot_id"), str):
            return None
        since, wall = seconds(doc.get("since_boot")), seconds(doc.get("wall"))
        steady, settled = doc.get("steady_since"), doc.get("settled")
        if since is None or wall is None or (settled is not None and not isinstance(settled, str)):
            return None
        steady_since = seconds(steady)
        if steady is not None and steady_since is None:
            return None
        return cls(boot, since, wall, steady_since, settled)


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
