"""The kernel's own word on the gateway clock: whether NTP keeps it synchronised, and which
boot this is. Read without privileges; the one place ctypes touches the clock.

Why: at start a heartbeat (`state_dir/clock.json`) more than a day ahead of the clock is either
a clock not set yet (the heartbeat right) or a heartbeat a clock wrong in the future wrote (an
RTC set a month ahead, a bad NTP server; the clock right now). The station's records cannot
tell them apart: every one was stamped by the same clock. The kernel can: an NTP client
(systemd-timesyncd, chrony, ntpd) keeps its error bound small while it disciplines the clock,
and `timedatectl` says "System clock synchronized: yes" exactly when `adjtimex(2)` (modes 0:
read only) reports a maximum error under 16 s (systemd's `ntp_synced`). An unset clock is
never synchronised; a gateway without an NTP client never is either (then nothing is known).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
MAX_ERROR_US = 16_000_000  # the kernel's NTP_PHASE_LIMIT: at or above it, not synchronised


class _Timex(ctypes.Structure):
    """`struct timex` (linux/timex.h) on an LP64 or ILP32 Linux: longs, ints, a timeval."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long),
        ("time_usec", ctypes.c_long),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("reserved", ctypes.c_int * 11),
    ]


class Kernel(Protocol):
    """What the heartbeat asks of the kernel (`KernelClock`, or a test's)."""

    def synchronised(self) -> bool | None: ...
    def boot_id(self) -> str | None: ...
    def since_boot(self) -> float: ...


class KernelClock:
    """The real kernel's answers; a test that needs another answer (a synchronised clock on a
    machine whose NTP client is not running) passes its own object with these three methods."""

    def __init__(self) -> None:
        self._said = False
        self._libc: ctypes.CDLL | None = None

    def synchronised(self) -> bool | None:
        """Whether the kernel says NTP keeps the clock synchronised (as `timedatectl`); None
        when it cannot be asked (not Linux, a seccomp filter): nothing known, said once. Asked
        each tick while the clock is in doubt: libc is looked up once (`find_library` runs
        `ldconfig -p`, a process each time)."""
        try:
            if self._libc is None:
                self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            libc = self._libc
            buf = _Timex()
            if libc.adjtimex(ctypes.byref(buf)) < 0:
                raise OSError(ctypes.get_errno(), "adjtimex")
        except (OSError, AttributeError) as exc:
            if not self._said:
                self._said = True
                log.info("cannot ask the kernel whether the clock is synchronised (%s): not used", exc)
            return None
        maxerror = int(buf.maxerror)
        return 0 <= maxerror < MAX_ERROR_US

    def boot_id(self) -> str | None:
        """This boot's id (a random UUID the kernel makes at each boot); None if unreadable."""
        try:
            return BOOT_ID.read_text(encoding="ascii").strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def since_boot(self) -> float:
        """Seconds since this boot, suspend included (CLOCK_BOOTTIME: never stepped)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)
