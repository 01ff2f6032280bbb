"""One writer per state directory: `monitor run`, `monitor demo` and a `monitor replay` that
writes into `state_dir` hold an exclusive lock on `state_dir/monitor.lock` for their life.

Why: two processes writing one state directory (the service running and an engineer's
`monitor run --config /etc/station-monitor/station.yaml` to debug, or a replay into the
daemon's state dir) both write the outbox, the alarm journal, the checkpoint, the meter
ledger and the incident records: duplicated callouts, contradicting journals, a replay that
takes the daemon's open incidents for its own. The second one is refused at once, naming
the holder, with `EXIT_IN_USE`. Commands that only read or append beside the daemon
(`incidents list|note|close`, `alarms ack`, `meters export`, ...) never take it.

How: a POSIX record lock (fcntl F_SETLK, a write lock on the whole file), not flock():

- it belongs to the process and is not inherited by fork, so the replay's incident worker
  and freezer process never hold it, and one orphaned by a `kill -9` of its parent does
  not keep the station from starting again;
- the kernel drops it when the process dies: no stale lock after `kill -9` (a pid file
  would need guessing whether its pid is still ours).

The catch: a process loses its POSIX locks on a file when it closes *any* descriptor of
that file. So the file is opened once, here only, and its descriptor kept for the
process's life; asking again in the same process returns the lock already held instead of
opening the file a second time, and the holder is probed (F_GETLK) only through that one
descriptor. The holder's pid and command are written into the file for people reading
it; the kernel's lock, not the text, decides.

A file system without POSIX locks (ENOLCK, EOPNOTSUPP: some network or FUSE mounts), or a
lock file that cannot be created (a read-only state dir), is warned about once and the
command goes on unguarded: that must not stop a station, and a read-only state dir is
then reported by the stores as before.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
from pathlib import Path
from types import TracebackType

from monitor.errors import StateError

log = logging.getLogger(__name__)

LOCK_FILE = "monitor.lock"
# EX_TEMPFAIL (sysexits.h): "try again later". Neither a crash (1) nor a bad config (2, which
# the unit's RestartPreventExitStatus does not retry): the service refused because a hand-run
# daemon holds its state dir starts by itself (Restart=on-failure) once that one is stopped.
EXIT_IN_USE = 75
UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
BUSY = frozenset({errno.EAGAIN, errno.EACCES})
ATTEMPTS = 3  # the holder may exit between our refused lock and the probe: try again

_held: dict[tuple[int, int], StateLock] = {}  # (device, inode) of each lock file this process holds


class StateDirInUseError(StateError):
    """Another live process holds the state dir's lock."""

    def __init__(self, state_dir: Path, holder: str) -> None:
        self.state_dir = state_dir
        self.holder = holder
        super().__init__(
            f"state dir {state_dir} is in use by {holder}; one daemon (or replay) per state dir: "
            f"stop it, or give this one its own state_dir"
        )


class StateLock:
    """The lock on one state dir, held until `release()` or the process's end. `guarded` is
    False when the file system could not lock (warned once): the command runs anyway."""

    def __init__(self, path: Path, fd: int | None, key: tuple[int, int] | None) -> None:
        self.path = path
        self._fd = fd
        self._key = key
        self._holds = 1  # each hold_state_dir() of this dir in this process; the last release unlocks

    @property
    def guarded(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Close the one descriptor: the kernel drops the lock. The file stays (removing it
        would let a process that opened it before the removal lock an unlinked inode)."""
        self._holds -= 1
        if self._holds > 0:
            return
        if self._key is not None:
            _held.pop(self._key, None)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StateLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def hold_state_dir(state_dir: Path, command: str) -> StateLock:
    """Lock `state_dir` (created if missing) for this process, or raise `StateDirInUseError`
    naming the holder. `command` ("monitor run") is written into the lock file."""
    path = state_dir / LOCK_FILE
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        known = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return _unguarded(path, f"cannot reach the state dir: {exc.strerror or exc}")
    else:
        mine = _held.get((known.st_dev, known.st_ino))
        if mine is not None:  # opening it again, then closing, would drop the lock we hold
            mine._holds += 1
            return mine
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return _unguarded(path, f"cannot open it: {exc.strerror or exc}")
    for _ in range(ATTEMPTS):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in BUSY:
                os.close(fd)
                why = (
                    "the file system does not support locks" if exc.errno in UNSUPPORTED else "cannot lock it"
                )
                return _unguarded(path, f"{why}: {exc.strerror or exc}")
        owner = lock_owner(fd)  # through our own descriptor (we hold no lock on the file yet)
        if owner is not None:
            holder = _describe(fd, owner)
            os.close(fd)
            raise StateDirInUseError(state_dir, holder)
    else:
        os.close(fd)
        raise StateDirInUseError(state_dir, "another process (it kept taking and dropping the lock)")
    _record(fd, command)
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    lock = StateLock(path, fd, key)
    _held[key] = lock
    return lock


def _record(fd: int, command: str) -> None:
    """The holder, for people (`cat monitor.lock`); best effort: the lock is what counts."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    except OSError as exc:
        log.warning("could not write the holder into %s: %s", LOCK_FILE, exc.strerror or exc)


def _describe(fd: int, owner: int) -> str:
    """The holder as `pid 1234 (monitor run)`: the pid from the kernel, the command from the
    file when the file names that pid (else the process's name)."""
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    pid, _, command = text.partition(" ")
    if owner == 0:  # another pid namespace (a container): only the file can say
        return f"a process not visible from here (the lock file says: {text or 'nothing'})"
    if pid == str(owner) and command:
        return f"pid {owner} ({command})"
    return f"pid {owner} ({process_name(owner)})"


# struct flock on Linux (short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid)
_FLOCK = "hhqqi4x"


def lock_owner(fd: int) -> int | None:
    """The pid of a process holding a POSIX lock (fcntl F_GETLK) on any part of the open file
    `fd` that a write lock would conflict with; None when there is none. 0 when the kernel
    cannot name it (a holder in another pid namespace). Probe a file this process locks
    itself only through the descriptor it holds: closing any other one drops its locks."""
    probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    l_type, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    return None if l_type == fcntl.F_UNLCK else max(int(pid), 0)


def process_name(pid: int) -> str:
    """The kernel's short name of a process (`/proc/PID/comm`), "?" when it cannot be read."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


_warned: set[Path] = set()


def _unguarded(path: Path, why: str) -> StateLock:
    if path not in _warned:
        _warned.add(path)
        log.warning(
            "state dir %s not locked (%s: %s): going on without the one-daemon-per-state-dir guard",
            path.parent,
            path.name,
            why,
        )
    return StateLock(path, None, None)


__all__ = [
    "EXIT_IN_USE",
    "LOCK_FILE",
    "StateDirInUseError",
    "StateLock",
    "hold_state_dir",
    "lock_owner",
    "process_name",
]
