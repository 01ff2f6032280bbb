"""Freezing final incidents on a worker thread, for `monitor replay`.

Freezing an incident (its final figures, the evidence file written, fsynced and hashed,
the frozen record) took about as long as the engine's judging of a 10 M-row replay, all
of it in the replay loop. Here it runs on one worker thread with a store connection of
its own (WAL: the replay's evidence writes go on beside it), one incident after another
in the order they were handed over, each file durable before its record says frozen.
NumPy, SQLite, file writes and hashlib release the GIL, so most of it runs on the second
core. Live, the daemon freezes in the batch that ends an incident (`IncidentTracker`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from monitor.incidents.model import Figures, Incident
from monitor.incidents.store import Columns, IncidentStore

FiguresOf = Callable[[Incident, IncidentStore, dict[str, Columns]], Figures]


class Freezer:
    """Final incidents in, frozen incidents out (in order); a failure is raised by `take`."""

    def __init__(self, state_dir: Path, figures: FiguresOf) -> None:
        self.state_dir = state_dir
        self.figures = figures
        self._pool: ThreadPoolExecutor | None = None
        self._store: IncidentStore | None = None  # the worker's own connection
        self._queue: deque[tuple[str, Future[Incident]]] = deque()
        self._ids: set[str] = set()  # the queue's incidents: asked at every transition

    def __contains__(self, iid: object) -> bool:
        """Whether the incident is being frozen (on record as frozen, soon): a set, not a
        walk of the queue, which grows when freezing falls behind (a 100 M-row replay)."""
        return iid in self._ids

    def submit(self, inc: Incident) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="freezer")
        self._queue.append((inc.id, self._pool.submit(self._freeze, inc)))
        self._ids.add(inc.id)

    def _freeze(self, inc: Incident) -> Incident:
        if self._store is None:
            self._store = IncidentStore(self.state_dir)
        store = self._store
        columns = store.columns(inc.id)  # read once, for the figures and the file
        inc = inc.with_(figures=self.figures(inc, store, columns))
        sha, rows = store.freeze_evidence(inc.id, columns)
        inc = inc.with_(frozen=True, evidence_sha256=sha, evidence_rows=rows)
        store.save(inc)
        return inc

    def take(self, wait: bool) -> list[Incident]:
        """The incidents frozen so far, in the order handed over (`wait`: all of them)."""
        out: list[Incident] = []
        while self._queue:
            _, done = self._queue[0]
            if not wait and not done.done():
                break
            out.append(done.result())
            iid, _ = self._queue.popleft()
            self._ids.discard(iid)
        return out

    def close(self) -> None:
        """Finish what is being frozen; what was queued behind a failure is dropped."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._queue.clear()
        self._ids.clear()
        if self._store is not None:
            self._store.close()
            self._store = None
