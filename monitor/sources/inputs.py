"""`--input` names as `monitor replay` and `monitor meters ingest` take them: `-` is
standard input, and one pipe is not named twice. No NumPy or pyarrow here: `meters`
uses it too and must start without them."""

from __future__ import annotations

import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from monitor.errors import InputUsageError

STDIN = "/dev/stdin"  # what `--input -` reads


def input_path(name: str, pipe_in: str) -> str:
    """`-` is standard input, read as /dev/stdin (a pipe streams, a redirected file is a
    file); a file named `-` is `./-`. A terminal is refused: the command would wait for
    rows typed in. `pipe_in`: the advice that ends the refusal ("the samples in (zcat ...)")."""
    if name != "-":
        return name
    if sys.stdin is not None and sys.stdin.isatty():
        raise InputUsageError(f"-: standard input is a terminal; pipe {pipe_in}")
    return STDIN


def pipes_once(paths: Sequence[Path]) -> None:
    """Refuses one pipe named twice (`--input - --input /dev/stdin`): the first reader
    would take its rows and the second get the rest or nothing. The same regular file
    twice is read twice, from its start each time."""
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue  # the reader says what is wrong with it, in its words
        if stat.S_ISREG(st.st_mode):
            continue
        first = seen.get((st.st_dev, st.st_ino))
        if first is not None:
            raise InputUsageError(f"{path}: the same pipe as {first}, and a pipe can be read only once")
        seen[(st.st_dev, st.st_ino)] = path
