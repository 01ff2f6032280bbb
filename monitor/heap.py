"""glibc's malloc told to keep what a long replay frees, for the next batch to reuse.

A replay allocates and frees arrays of a few MB every batch (a step's columns, the
engine's 2-D working arrays, the incident worker's buffers). glibc gives memory at the
top of its heap back to the kernel once more than `M_TRIM_THRESHOLD` (128 KiB, rising
with the largest mmapped block freed) is free there, and serves blocks over its mmap
threshold with a fresh mapping each time: either way the next batch faults the pages
in again and the kernel zeroes them, page by page. In a 10 M-row replay that was tens of
thousands of page faults, and an engine made 35 % cheaper gave it back in faults on the
main thread (issue 20). Kept, freed memory is reused at once; the heap stays at the
replay's working set (its peak memory is measured by `bench/replay.py`).
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
KEEP = 512 << 20  # free memory at the heap's top kept, up to this much
LARGE = 64 << 20  # blocks from this size on still get a mapping of their own


def keep_freed_memory() -> bool:
    """Raise glibc's trim and mmap thresholds for this process (and a child forked after);
    False where there is no glibc `mallopt` (musl's ignores these, macOS has none)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_TRIM_THRESHOLD, KEEP) == 1 and mallopt(_M_MMAP_THRESHOLD, LARGE) == 1)
    if not done:
        log.debug("malloc thresholds not changed (not glibc)")
    return done
