"""The one way SQLite files are opened: pragmas, permissions, schema version, integrity, errors.

Four databases live under `state_dir`: the meter ledger and the alarm journal
(records of money and compliance), the outbox and the series store (copies that
can be rebuilt or re-sent). Each is opened with `connect(path, schema, ...)`:

- WAL, `synchronous` as the caller chooses (ledger and journal: FULL, see the README
  "State files" section), `isolation_level=None` (our own BEGIN/COMMIT);
- the file is made 0600 and its directory 0700 (outside systemd nobody else sets it);
- `PRAGMA user_version` is the schema version: `schema.migrations[i]` takes a file
  from version i to i + 1, each in one transaction with its version bump, so a crash
  during an upgrade leaves the file at the old version, never half-migrated. Migration
  0 is each store's original `CREATE TABLE IF NOT EXISTS` script, so a file written
  before versions existed (user_version 0, tables present) upgrades in place. A file
  newer than the code is refused: an older release must not write into it.

`quick_check` is the start-up integrity check. `translate` is the error map: every
`sqlite3` exception becomes one of ours, naming the file, with the cause in words an
operator can act on (disk full, read-only, damaged, locked).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from monitor.errors import MonitorError, StateError

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
    code = getattr(exc, "sqlite_errorname", None)
    cause = CAUSES.get(code or "", "")
    if not cause:
        cause = next((text for cls, text in ERRORS.items() if isinstance(exc, cls)), "sqlite3 error")
    return error(f"{what}: {cause} ({exc})")


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


def quick_check(path: Path) -> str | None:
    """None when `PRAGMA quick_check` finds the file sound (or there is no file yet);
    else what is wrong, in SQLite's words (the first few problems)."""
    if not path.exists():
        return None
    try:
        # as_uri() percent-encodes: a `#`, `?` or `%` in the path must not end or change it
        uri = f"{path.resolve().as_uri()}?mode=rw"
        db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30.0)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        rows = [str(r[0]) for r in db.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        db.close()
    return None if rows == ["ok"] else "; ".join(rows)


__all__ = [
    "CAUSES",
    "ERRORS",
    "Schema",
    "connect",
    "damaged",
    "migrate",
    "quick_check",
    "secure",
    "translate",
]
