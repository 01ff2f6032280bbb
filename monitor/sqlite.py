"""The one way SQLite files are opened: pragmas, permissions, schema version, integrity, errors.

Four databases live under `state_dir`: the meter ledger and the alarm journal
(records of money and compliance), the outbox and the series store (copies that
can be rebuilt or re-sent). Each is opened with `connect(path, schema, ...)`:

- WAL, `synchronous` as the caller chooses (ledger and journal: FULL, see docs/operator-guide.md
  "State files" section), `isolation_level=None` (our own BEGIN/COMMIT);
- the file is made 0600 and its directory 0700 (outside systemd nobody else sets it);
- `PRAGMA user_version` is the schema version: `schema.migrations[i]` takes a file
  from version i to i + 1, each in one transaction with its version bump, so a crash
  during an upgrade leaves the file at the old version, never half-migrated. Migration
  0 is each store's original `CREATE TABLE IF NOT EXISTS` script, so a file written
  before versions existed (user_version 0, tables present) upgrades in place. A file
  newer than the code is refused: an older release must not write into it.

`quick_check` is the start-up integrity check. A file another process holds locked
(`monitor outbox drain`, a backup tool) is not damage: after the busy wait it raises
`StateLockedError` naming the holder, so nobody moves a sound file aside. `translate` is the error map: every
`sqlite3` exception becomes one of ours, naming the file, with the cause in words an
operator can act on (disk full, read-only, damaged, locked).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from monitor.errors import MonitorError, StateError
from monitor.statelock import lock_owner, process_name

Synchronous = Literal["FULL", "NORMAL"]

# The error map: every exception class the sqlite3 module defines (a test checks that
# none is missing), to what it means for the file.
ERRORS: dict[type[BaseException], str] = {
    sqlite3.IntegrityError: "a constraint failed",
    sqlite3.ProgrammingError: "misuse of the database connection",
    sqlite3.OperationalError: "the database could not do this",
    sqlite3.NotSupportedError: "not supported by this SQLite",
    sqlite3.DataError: "a value is out of range",
    sqlite3.InternalError: "SQLite internal error",
    sqlite3.InterfaceError: "bad use of the sqlite3 interface",
    sqlite3.DatabaseError: "database error",
    sqlite3.Warning: "sqlite3 warning",
    sqlite3.Error: "sqlite3 error",
}
# The cause an operator can act on, by SQLite result code (sqlite3 exceptions carry it).
CAUSES: dict[str, str] = {
    "SQLITE_FULL": "the disk is full",
    "SQLITE_IOERR": "disk I/O error",
    "SQLITE_READONLY": "the file or its directory is read-only",
    "SQLITE_CORRUPT": "the file is damaged",
    "SQLITE_NOTADB": "the file is damaged (not an SQLite database)",
    "SQLITE_BUSY": "locked by another process",
    "SQLITE_LOCKED": "locked by another connection",
    "SQLITE_CANTOPEN": "cannot open the file",
    "SQLITE_PERM": "permission denied",
}
DAMAGE = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})


class StateLockedError(StateError):
    """Another process holds a state file locked past the busy wait: not damage."""


@dataclass(frozen=True)
class Schema:
    """A store's name (for messages) and its forward migrations, oldest first."""

    name: str
    migrations: tuple[str, ...]

    @property
    def version(self) -> int:
        return len(self.migrations)


def translate(exc: BaseException, what: str, error: type[MonitorError] = StateError) -> MonitorError:
    """One sqlite3 exception -> `error("what: cause (sqlite's text)")`."""
    cause = _cause(getattr(exc, "sqlite_errorname", None))
    if not cause:
        cause = next((text for cls, text in ERRORS.items() if isinstance(exc, cls)), "sqlite3 error")
    return error(f"{what}: {cause} ({exc})")


def _cause(code: str | None) -> str:
    """CAUSES by the extended result code, else by its primary code (SQLITE_IOERR_WRITE ->
    SQLITE_IOERR)."""
    if not code:
        return ""
    return CAUSES.get(code) or CAUSES.get("_".join(code.split("_")[:2]), "")


def cause_of(exc: BaseException) -> str | None:
    """The operator's cause of a (translated) error: the first sqlite3 exception in its
    chain, its result code in words; None when there is none."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.Error):
            return _cause(getattr(seen, "sqlite_errorname", None)) or None
        seen = seen.__cause__
    return None


def real_cause(exc: Exception, directory: Path) -> str:
    """The store's error with the cause an operator can act on in front. SQLite reports a
    file system gone read-only under an open file as "disk I/O error" (it drops the errno,
    EROFS), so the file system is asked first, with a one-byte write beside the stores;
    if that succeeds, SQLite's result code in words."""
    probe = directory / ".write-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as err:
        with contextlib.suppress(OSError):
            probe.unlink()
        name = errno.errorcode.get(err.errno or 0, "")
        return f"{err.strerror or err} ({name}): {exc}" if name else f"{err.strerror or err}: {exc}"
    cause = cause_of(exc)
    return f"{cause}: {exc}" if cause else str(exc)


def damaged(exc: BaseException) -> bool:
    """True when SQLite says the file itself is damaged."""
    return getattr(exc, "sqlite_errorname", None) in DAMAGE or "malformed" in str(exc)


def secure(path: Path) -> None:
    """State is readable by the daemon's user only: directory 0700, files 0600."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # not ours to change (a shared directory): leave it
        if path.parent.stat().st_mode & 0o077:
            os.chmod(path.parent, 0o700)
    for candidate in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            if candidate.stat().st_mode & 0o077:
                os.chmod(candidate, 0o600)


def connect(
    path: Path,
    schema: Schema,
    *,
    synchronous: Synchronous = "NORMAL",
    error: type[MonitorError] = StateError,
    check_same_thread: bool = True,
    timeout: float = 30.0,
) -> sqlite3.Connection:
    """Open (or create) one store, tuned and migrated to `schema.version`."""
    what = f"{schema.name} {path}"
    try:
        secure(path)
        db = sqlite3.connect(
            str(path), isolation_level=None, timeout=timeout, check_same_thread=check_same_thread
        )
    except OSError as exc:
        raise error(f"{what}: cannot open: {exc.strerror or exc}") from exc
    except sqlite3.Error as exc:
        raise translate(exc, what, error) from exc
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        migrate(db, schema, what, error)
        secure(path)  # the -wal and -shm files exist now
    except sqlite3.Error as exc:
        db.close()
        raise translate(exc, what, error) from exc
    except BaseException:
        db.close()
        raise
    return db


def user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migrate(db: sqlite3.Connection, schema: Schema, what: str, error: type[MonitorError] = StateError) -> int:
    """Bring the file forward to `schema.version`; returns the version it had."""
    found = user_version(db)
    if found > schema.version:
        raise error(
            f"{what}: written by a newer station-monitor (schema {found}, this release reads up to "
            f"{schema.version}); run that release or restore a backup"
        )
    for version in range(found, schema.version):
        script = schema.migrations[version]
        try:
            db.executescript(f"BEGIN IMMEDIATE;\n{script}\n;PRAGMA user_version={version + 1};\nCOMMIT;")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    return found


def locked(exc: BaseException) -> bool:
    """True when SQLite gave up waiting for another connection's lock (not damage)."""
    code = str(getattr(exc, "sqlite_errorname", "") or "")
    return code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(exc)


def lock_holder(path: Path) -> str | None:
    """Who holds a POSIX lock on the file or its -shm (SQLite's locks): "pid N (name)"."""
    for candidate in (path, path.with_name(path.name + "-shm")):
        try:
            with candidate.open("rb") as f:
                pid = lock_owner(f.fileno())
        except OSError:
            continue
        if pid:
            return f"pid {pid} ({process_name(pid)})"
    return None


def quick_check(path: Path, timeout: float = 30.0) -> str | None:
    """None when `PRAGMA quick_check` finds the file sound (or there is no file yet);
    else what is wrong, in SQLite's words (the first few problems). A file still
    locked by another process after `timeout` seconds raises `StateLockedError`: locked
    is not damaged, and the caller must not treat it so."""
    if not path.exists():
        return None
    try:
        # as_uri() percent-encodes: a `#`, `?` or `%` in the path must not end or change it
        uri = f"{path.resolve().as_uri()}?mode=rw"
        db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=timeout)
    except sqlite3.Error as exc:
        _raise_if_locked(path, exc, timeout)
        return str(exc)
    try:
        rows = [str(r[0]) for r in db.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.Error as exc:
        _raise_if_locked(path, exc, timeout)
        return str(exc)
    finally:
        db.close()
    return None if rows == ["ok"] else "; ".join(rows)


def _raise_if_locked(path: Path, exc: sqlite3.Error, timeout: float) -> None:
    if locked(exc):
        holder = lock_holder(path) or "another process (its id not visible from here)"
        raise StateLockedError(
            f"{path} is locked by {holder} ({exc}; waited {timeout:g}s): not damaged, left as it is; "
            f"stop that process (e.g. `monitor outbox drain`, a backup) and start again"
        ) from exc


__all__ = [
    "CAUSES",
    "ERRORS",
    "Schema",
    "StateLockedError",
    "cause_of",
    "connect",
    "damaged",
    "lock_holder",
    "locked",
    "migrate",
    "quick_check",
    "real_cause",
    "secure",
    "translate",
]
