"""One file of the state dir replaced whole, durably: the heartbeat, the engine checkpoint.

A reader after a kill -9 or a power cut at any line finds the old file or the new one, never
part of either: the new bytes go to a `.tmp` beside it, fsynced, renamed over it, and the
directory fsynced so the rename itself survives. The `.tmp` is made anew each time, never
opened as found: a leftover symlink there was followed, its target overwritten, and the link
renamed into place.

`sync_dir=False` leaves the directory fsync to the caller, for a writer of many files whose
rename is made durable by something after it (an incident's evidence: one fsync of the
directory per file cost the replay freezer its speed, issue 20).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def replace_file(path: Path, write: Callable[[BinaryIO], object], *, sync_dir: bool = True) -> None:
    """`write` fills a fresh `<path>.tmp`, which then replaces `path`. OSError from any
    step, with the `.tmp` removed (a full disk gets back what it took). `sync_dir=False`:
    the rename is not fsynced here (the caller owns the directory's durability)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if not sync_dir:
            return
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
