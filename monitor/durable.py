"""One file of the state dir replaced whole, durably: the heartbeat, the engine checkpoint.

A reader after a kill -9 or a power cut at any line finds the old file or the new one, never
part of either: the new bytes go to a `.tmp` beside it, fsynced, renamed over it, and the
directory fsynced so the rename itself survives. The `.tmp` is made anew each time, never
opened as found: a leftover symlink there was followed, its target overwritten, and the link
renamed into place.

`make_dirs` makes a file's missing directories the same way: each new directory's entry is
fsynced in its parent, so a power cut cannot keep a file whose directory it lost.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def replace_file(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write` fills a fresh `<path>.tmp`, which then replaces `path`. OSError from any
    step, with the `.tmp` removed (a full disk gets back what it took)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        sync_dir(path.parent)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def make_dirs(path: Path) -> None:
    """`path` and its missing parents made, each new one's entry fsynced in its parent
    (mkdir alone: after a power cut the directory, and every file in it, may be gone)."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another writer
            new.mkdir()
        sync_dir(new.parent)


def sync_dir(path: Path) -> None:
    """fsync a directory: the names made, renamed or removed in it survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
