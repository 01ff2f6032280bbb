"""What evidence an incident's package holds (`export.py` writes it), and what it says of it.

- An incident marked "evidence incomplete from T" (a damaged block met while it was being
  recorded, never frozen): its readings before T, of every sensor (`Incomplete`).
- A frozen incident: its evidence file when that still hashes to the SHA-256 recorded at the
  freeze. It IS the frozen evidence, whatever became of the store's blocks since: read back
  to columns for the plot; a store whose blocks are damaged now is said (`StoreDamaged`), the
  package is whole. When the file does not verify (altered, missing), the store's evidence,
  and with a damaged block there, only what is intact before it (`Incomplete`, saying the
  frozen file does not verify either): nothing vouches for the rest. With no damaged block,
  the store's evidence only when it hashes to the recorded SHA-256 (`FileNotVerified` says
  the file on disk is not what was frozen), else no package: nothing on disk is the frozen
  evidence, and a package must never hold a number that is not.
- An incident not final yet: the store's evidence (a damaged block: its error, no package;
  the tracker marks the incident when it meets it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from monitor.errors import StateError
from monitor.incidents.evidence import EvidenceFileError, parse_csv
from monitor.incidents.figures import Series
from monitor.incidents.model import Incident
from monitor.incidents.store import Columns, Damage, IncidentStore, NotRegularFileError
from monitor.model import iso

_NONE: Columns = (np.empty(0, np.float64), np.empty(0, np.float64), np.empty(0, np.int8))


def _blocks(damaged: tuple[Damage, ...]) -> str:
    return "; ".join(f"block {d.error.rowid} of sensor {d.error.sensor} damaged" for d in damaged)


def _blocks_json(damaged: tuple[Damage, ...]) -> list[dict[str, object]]:
    return [{"sensor": d.error.sensor, "block": d.error.rowid, "error": str(d.error)} for d in damaged]


@dataclass(frozen=True, slots=True)
class Incomplete:
    """What a package lacks: the readings from `since` on (a marked incident's, or a frozen
    one's whose store is damaged and whose frozen file does not verify)."""

    since: float
    damaged: tuple[Damage, ...]
    reason: str  # the record's, said when no block reads damaged now (a store restored since)
    frozen_file: str | None = None  # a frozen incident's: why its file is not the package

    @property
    def statement(self) -> str:
        what = _blocks(self.damaged) or self.reason
        if self.frozen_file is not None:
            what += f", and the frozen evidence file {self.frozen_file}"
        since = iso(self.since)
        return (
            f"evidence incomplete from {since}: {what}; samples at or after {since} are not in this package"
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "from": iso(self.since),
            "statement": self.statement,
            "damaged_blocks": _blocks_json(self.damaged),
        }
        if self.frozen_file is not None:
            out["frozen_file"] = self.frozen_file
        return out


@dataclass(frozen=True, slots=True)
class StoreDamaged:
    """A frozen incident's package built from its frozen evidence file, which verifies, while
    the store's copy of the evidence does not read whole: the package is whole, the store
    is owed a restore. `unreadable`: the store's error when its evidence did not read at all
    (a damaged page), no block to name."""

    damaged: tuple[Damage, ...]
    unreadable: str | None = None

    @property
    def statement(self) -> str:
        what = _blocks(self.damaged) or f"its evidence cannot be read: {self.unreadable}"
        return (
            f"the incident store's copy of the evidence is damaged ({what}); this package is built"
            " from the frozen evidence file, which verifies: its SHA-256 is the one recorded when"
            " the incident was frozen"
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "statement": self.statement,
            "built_from": "frozen evidence file",
            "damaged_blocks": _blocks_json(self.damaged),
        }
        if self.unreadable is not None:
            out["error"] = self.unreadable
        return out


@dataclass(frozen=True, slots=True)
class FileNotVerified:
    """A frozen incident's package built from the store's evidence, which hashes to the
    SHA-256 recorded at the freeze, while the frozen file on disk does not (altered,
    swapped, missing): the package is whole, the file's tampering or loss is said.
    `file_sha256`: the file's own hash, when it could be read."""

    path: str
    why: str
    file_sha256: str | None

    @property
    def statement(self) -> str:
        return (
            f"the frozen evidence file {self.path} {self.why}: the copy on disk is not what was"
            " frozen; this package is built from the incident store's evidence, which hashes to"
            " the SHA-256 recorded when the incident was frozen"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "statement": self.statement,
            "built_from": "incident store",
            "file": self.path,
            "file_sha256": self.file_sha256,
        }


@dataclass(frozen=True, slots=True)
class Contents:
    """A package's evidence: the CSV's bytes, the incident's own sensor's readings for the
    plot, and what the package lacks or what became of the store or of the frozen file (each
    None when nothing)."""

    csv: bytes
    series: Series
    incomplete: Incomplete | None = None
    store_damaged: StoreDamaged | None = None
    file_not_verified: FileNotVerified | None = None


def intact_evidence(
    store: IncidentStore,
    inc: Incident,
    read: tuple[dict[str, Columns], list[Damage]] | None = None,
    frozen_file: str | None = None,
) -> tuple[dict[str, Columns], Incomplete]:
    """A marked incident's evidence up to the damage: every sensor's readings before the
    earliest of its mark's T and the damaged blocks' first times. A damaged block that
    cannot be placed in time is the error it was (no package: nothing says where to cut).
    `read`: `store.intact_columns(inc.id)`, when the caller has read it; `frozen_file`: a
    frozen incident's, why its file is not the package."""
    columns, damaged = store.intact_columns(inc.id) if read is None else read
    for d in damaged:
        if d.since is None:
            raise d.error
    bounds = [d.since for d in damaged if d.since is not None]
    if inc.evidence_broken_at is not None:
        bounds.append(inc.evidence_broken_at)
    if not bounds:
        raise StateError(f"incident {inc.id}: {inc.evidence_note}; from when is not known: no package")
    since = min(bounds)
    cut = {}
    for name, (t, v, q) in columns.items():
        keep = t < since
        cut[name] = (t[keep], v[keep], q[keep])
    return cut, Incomplete(since, tuple(damaged), inc.evidence_broken or "", frozen_file)


def verified_file(store: IncidentStore, inc: Incident) -> tuple[bytes | None, str, str | None]:
    """A frozen incident's evidence file when it hashes to the SHA-256 recorded at the freeze
    (else None), what is wrong with it ("" when nothing), and its SHA-256 (None: unread)."""
    if inc.evidence_sha256 is None:
        return None, "has no SHA-256 on record", None
    try:
        sha, data = store.frozen_file(inc.id, inc.evidence_sha256)
    except FileNotFoundError:
        return None, "is missing", None
    except NotRegularFileError:
        return None, "is not a regular file", None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})", None
    if data is None:
        return None, "does not verify", sha
    return data, "", sha


def frozen_evidence(store: IncidentStore, inc: Incident) -> Contents:
    """A frozen incident's: its file when it verifies (the store's damage, if any, said),
    else the store's evidence, up to its first damaged block, or whole when it hashes to the
    recorded SHA-256 (the file's state said; else the error: no package)."""
    data, why, file_sha = verified_file(store, inc)
    unreadable = None
    try:
        read = store.intact_columns(inc.id)
    except StateError as exc:  # a damaged page: the store's evidence does not read at all
        if data is None:
            raise
        read, unreadable = ({}, []), str(exc)
    columns, damaged = read
    if data is not None:
        try:
            series = Series.of(*parse_csv(data).get(inc.sensor, _NONE))
        except EvidenceFileError as exc:  # its hash is the one recorded: it was written so
            raise StateError(f"incident {inc.id}: frozen evidence file: {exc}") from exc
        said = StoreDamaged(tuple(damaged), unreadable) if damaged or unreadable is not None else None
        return Contents(data, series, store_damaged=said)
    if damaged:
        columns, incomplete = intact_evidence(store, inc, read, why)
        return Contents(store.evidence_csv(inc.id, columns), _series(columns, inc), incomplete)
    csv = store.evidence_csv(inc.id, columns)
    path = store.evidence_path(inc.id)
    if hashlib.sha256(csv).hexdigest() != inc.evidence_sha256:
        raise StateError(
            f"incident {inc.id}: the frozen evidence file {path} {why}, and the incident store's"
            " evidence does not hash to the SHA-256 recorded when the incident was frozen either:"
            " nothing on disk is the frozen evidence, no package (restore the file or the store"
            " from a backup)"
        )
    notice = FileNotVerified(str(path), why, file_sha)
    return Contents(csv, _series(columns, inc), file_not_verified=notice)


def contents(store: IncidentStore, inc: Incident) -> Contents:
    """The evidence of `inc`'s package (see the module's docstring)."""
    if inc.evidence_broken is not None:  # never frozen: its evidence is in the store alone
        columns, incomplete = intact_evidence(store, inc)
        return Contents(store.evidence_csv(inc.id, columns), _series(columns, inc), incomplete)
    if inc.frozen:
        return frozen_evidence(store, inc)
    columns = store.columns(inc.id)
    return Contents(store.evidence_csv(inc.id, columns), _series(columns, inc))


def _series(columns: dict[str, Columns], inc: Incident) -> Series:
    return Series.of(*columns.get(inc.sensor, _NONE))
