"""What the outbox hands out and reports: batches of points, counters, dead letters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Piece:
    """Lines `start`..`end` (exclusive) of one outbox segment, `nbytes` of them (a newline each)."""

    segment: int
    start: int
    end: int
    nbytes: int
    queued: float
    total: int  # lines in the segment: a piece that reaches it empties the segment

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class Batch:
    """The next points to send, as one request body, oldest first."""

    pieces: list[Piece]
    body: bytes
    _lines: list[bytes] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return sum(p.count for p in self.pieces)

    @property
    def lines(self) -> list[bytes]:
        """The body's lines (the slow path: split, bisect, dead letters)."""
        if self._lines is None:
            self._lines = self.body.split(b"\n") if self.body else []
        return self._lines

    @property
    def cursor(self) -> tuple[int, int]:
        """Where the next batch starts: (segment, line)."""
        last = self.pieces[-1]
        return (last.segment, last.end)

    def queued_of(self, index: int) -> float:
        """When the `index`-th line of the body was committed."""
        for p in self.pieces:
            if index < p.count:
                return p.queued
            index -= p.count
        raise IndexError(index)


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """What `monitor outbox status` prints and the metrics endpoint exports."""

    pending: int
    pending_bytes: int
    oldest_queued: float | None  # clock time the oldest pending point was committed
    dead_letters: int
    dropped: int
    written: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    queued: float
    failed: float
    status: int | None
    reason: str
    line: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """Lines of a batch (indexes into `Batch.lines`) the server refused, and why."""

    index: int
    status: int | None
    reason: str
