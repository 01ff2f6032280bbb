"""The low-space warning for the state disk, before a full disk stops intake.

Checked from the daemon's timer (every `EVERY` seconds of its clock): below
`store.free_space_floor` free bytes a `disk_low` alarm warns; it clears once
the free space is back above the floor plus 10 % (a margin against chatter).
A full disk itself is noticed where it hurts, by the pipeline's failed write
(`disk_full`, critical); this is the warning that comes before it.

**The reserve.** On a full disk the alarm journal could not record the very alarm
that says so. So the daemon keeps `RESERVE` bytes in a file of its own in the
state directory (`.disk-reserve`); when a write fails, the pipeline deletes it,
which leaves room to journal the `disk_full` alarm and its clearing, and does
not try the stores again until the free space is above twice the reserve (so the
stores do not eat the room the journal needs). Once writes succeed, the reserve
is made again.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from monitor.model import Clock, Condition, ConditionState, Rule

log = logging.getLogger(__name__)

EVERY = 10.0  # seconds between looks at the file system
RESERVE = 1 << 20  # bytes kept back for the alarm journal on a full disk
RESERVE_FILE = ".disk-reserve"
SENSOR = "state_disk"
CITATION = "station-monitor state disk"


class DiskWatch:
    """Free space under the state directory against a floor."""

    def __init__(self, path: Path, floor: int, clock: Clock, reserve: int = RESERVE) -> None:
        self.path = path
        self.floor = floor
        self.clock = clock
        self.reserve = reserve
        self.low = False
        self.free: int | None = None
        self._next = -math.inf
        self._failed = False
        self.keep_reserve()

    # --- the reserve -------------------------------------------------------------------

    @property
    def reserve_path(self) -> Path:
        return self.path / RESERVE_FILE

    def keep_reserve(self) -> bool:
        """Make the reserve file (again); False when there is no room for it yet."""
        path = self.reserve_path
        try:
            if path.exists() and path.stat().st_size >= self.reserve:
                return True
            with path.open("wb") as f:
                f.write(b"\0" * self.reserve)  # written, not sparse: the blocks are really taken
                f.flush()
                os.fsync(f.fileno())
            return True
        except OSError:
            path.unlink(missing_ok=True)
            return False

    def release_reserve(self) -> None:
        """Give the reserve back to the file system (a write failed: room for the journal)."""
        try:
            self.reserve_path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the disk reserve %s: %s", self.reserve_path, exc)

    def room(self) -> bool:
        """Worth trying the stores again: free space above twice the reserve."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return True  # cannot tell: let the write say
        return st.f_bavail * st.f_frsize >= 2 * self.reserve

    def check(self, now: float) -> list[Condition]:
        """The `disk_low` transition due at `now`, if any."""
        if self.floor <= 0 or now < self._next:
            return []
        self._next = now + EVERY
        try:
            st = os.statvfs(self.path)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot read the free space of %s: %s", self.path, exc)
            self._failed = True
            return []
        self._failed = False
        free = st.f_bavail * st.f_frsize
        self.free = free
        if not self.low and free < self.floor:
            self.low = True
            log.warning("state disk %s: %d MiB free, below the floor of %d MiB",
                        self.path, free >> 20, self.floor >> 20)  # fmt: skip
            return [self._condition(now, ConditionState.ACTIVE, free, "free space below the floor")]
        if self.low and free > self.floor * 1.1:
            self.low = False
            log.info("state disk %s: %d MiB free again", self.path, free >> 20)
            return [self._condition(now, ConditionState.CLEARED, free, "free space above the floor again")]
        return []

    def _condition(self, now: float, state: ConditionState, free: int, why: str) -> Condition:
        return Condition(
            time=now,
            sensor=SENSOR,
            rule=Rule.DISK_LOW,
            state=state,
            value=float(free),
            limit=float(self.floor),
            citation=CITATION,
            message=f"state disk {self.path}: {free >> 20} MiB free; {why} ({self.floor >> 20} MiB)",
        )
