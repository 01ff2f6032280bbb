"""An incident: one slug or limit violation as the Superintendent records it.

The alarm says "wrong now"; the incident says what happened, how much, and what is
due, and it outlives the series store (the evidence is frozen beside it). Times are
epoch seconds UTC; human-facing dates are cut in the station's zone (see `due`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum

from monitor.model import iso


class Status(StrEnum):
    """`open`: the violation goes on; `ended`: the condition cleared (a re-activation
    within the merge window still extends it); `closed`: closed by a person."""

    OPEN = "open"
    ENDED = "ended"
    CLOSED = "closed"


class NoteKind(StrEnum):
    """A plain note, the §139-15 written statement received, or a notice of violation
    served (§139-21 A) with its time limit for correction."""

    NOTE = "note"
    STATEMENT = "statement"
    NOTICE = "notice"


@dataclass(frozen=True, slots=True)
class Note:
    time: float
    by: str
    text: str
    kind: NoteKind = NoteKind.NOTE
    due: float | None = None  # a notice's time limit for correction

    def to_json(self) -> dict[str, object]:
        return {
            "time": iso(self.time),
            "by": self.by,
            "kind": str(self.kind),
            "text": self.text,
            "due": None if self.due is None else iso(self.due),
        }


@dataclass(frozen=True, slots=True)
class Figures:
    """What the samples say about the violation; every figure derives from the
    evidence and the condition's threshold, never from engine internals."""

    start: float
    baseline: float | None
    peak_value: float | None = None
    peak_time: float | None = None
    peak_multiple: float | None = None
    mean_multiple: float | None = None
    excess_volume_gal: float | None = None
    excess_volume_ft3: float | None = None
    excess_mass_lb: float | None = None
    coverage: float | None = None
    samples: int = 0


@dataclass(frozen=True, slots=True)
class Incident:
    id: str
    station: str
    sensor: str
    rule: str
    method: str
    citation: str
    discharger: str | None
    unit: str
    threshold: float  # in the sensor's unit: factor x baseline (slug) or the limit
    factor: float | None  # slug factor; None for a limit
    alarm_time: float
    end: float | None
    figures: Figures
    statement_due: float
    flow_sensor: str | None = None
    clear_time: float | None = None  # when the alarm cleared (after deadband and off-delay)
    activations: int = 1
    evidence_sha256: str | None = None
    evidence_rows: int = 0
    evidence_until: float = -math.inf  # event time up to which evidence is copied
    # Event time up to which the incident's own sensor was taken in (its transitions
    # applied): ahead of `evidence_until` while a paired flow lags. What a re-replay skips.
    judged_until: float = -math.inf
    # Set when its evidence could not be read or written (a damaged block): from when it is
    # incomplete and why. Its figures are the last computed from whole evidence, never
    # numbers from part of it; it is not frozen (no hash of evidence that is not all there).
    evidence_broken_at: float | None = None
    evidence_broken: str | None = None
    frozen: bool = False
    closed_at: float | None = None
    closed_by: str | None = None
    close_reason: str | None = None
    notes: tuple[Note, ...] = field(default=())

    @property
    def status(self) -> Status:
        if self.closed_at is not None:
            return Status.CLOSED
        return Status.OPEN if self.end is None else Status.ENDED

    @property
    def start(self) -> float:
        return self.figures.start

    @property
    def evidence_note(self) -> str | None:
        """ "evidence incomplete from T: <reason>" for a marked incident (export, show, console)."""
        if self.evidence_broken is None:
            return None
        since = "?" if self.evidence_broken_at is None else iso(self.evidence_broken_at)
        return f"evidence incomplete from {since}: {self.evidence_broken}"

    def duration(self, now: float | None = None) -> float | None:
        until = self.end if self.end is not None else now
        return None if until is None else max(0.0, until - self.start)

    def with_(self, **changes: object) -> Incident:
        """`dataclasses.replace`, without its per-call field introspection (a replay
        extends and ends incidents tens of thousands of times)."""
        if not changes.keys() <= _INCIDENT_FIELDS:
            return replace(self, **changes)  # type: ignore[arg-type]  # raises TypeError
        new = object.__new__(Incident)
        for name in _INCIDENT_FIELD_ORDER:
            _set(new, name, changes[name] if name in changes else getattr(self, name))
        return new


_set = object.__setattr__  # the frozen dataclass's own way in (its __init__ does the same)
_INCIDENT_FIELD_ORDER = tuple(f.name for f in fields(Incident))
_INCIDENT_FIELDS = frozenset(_INCIDENT_FIELD_ORDER)


def incomplete_since(inc: Incident, since: float | None, evidence_before: float) -> float:
    """From when a damaged evidence block leaves the incident's evidence incomplete, as the
    live tracker and the replay's freezer both mark it: the damaged block's first time
    (`since`; None when that column is damaged too) or the first sample not copied,
    whichever is earlier, never before the evidence window."""
    first = inc.evidence_until if math.isfinite(inc.evidence_until) else inc.start
    return first if since is None else max(min(first, since), inc.start - evidence_before)


def finite(x: float | None, digits: int = 6) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x, digits)


def incident_id(start: float, sensor: str, rule: str) -> str:
    """Deterministic from the violation itself, so live and replay name it alike and
    replaying the same history twice does not record it twice."""
    stamp = iso(math.floor(start)).replace("-", "").replace(":", "")
    return f"{stamp}-{sensor}-{rule}"
