"""Freezing final incidents on a worker thread, for `monitor replay`.

Freezing an incident (its final figures, the evidence file written, fsynced and hashed,
the frozen record) took about as long as the engine's judging of a 10 M-row replay, all
of it in the replay loop. Here it runs on one worker thread with a store connection of
its own (WAL: the replay's evidence writes go on beside it), one incident after another
in the order they were handed over, each file durable before its record says frozen.
NumPy, SQLite, file writes and hashlib release the GIL, so most of it runs on the second
core. In the replay's incident worker the same work runs in a process of its own
(`FreezerProcess`), off the tracker's GIL. Live, the daemon freezes in the batch that
ends an incident (`IncidentTracker`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from monitor.errors import MonitorError
from monitor.incidents.model import Figures, Incident, incomplete_since
from monitor.incidents.store import Columns, DamagedEvidenceError, IncidentStore, csv_lines

WRITE_AHEAD = 8  # evidence files written at once in the freezing process (each in memory)
FiguresOf = Callable[[Incident, IncidentStore, dict[str, Columns]], Figures]


class Freezing(Protocol):
    """What the tracker needs of its freezer: `Freezer`, or `FreezerProcess`."""

    def __contains__(self, iid: object) -> bool: ...

    def submit(self, inc: Incident) -> None: ...

    def take(self, wait: bool) -> list[Incident]: ...

    def close(self) -> None: ...


T = TypeVar("T")


class _Handed(Generic[T]):
    """The incidents handed over and not taken back yet, in order, each with what stands
    for it (a future, or nothing); `in` looks in a set, not along the queue, which grows
    when freezing falls behind (a 100 M-row replay asks at every re-activation)."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, T]] = deque()
        self._ids: set[str] = set()

    def __contains__(self, iid: object) -> bool:
        return iid in self._ids

    def __bool__(self) -> bool:
        return bool(self._items)

    def append(self, iid: str, item: T) -> None:
        self._items.append((iid, item))
        self._ids.add(iid)

    def first(self) -> T:
        return self._items[0][1]

    def popleft(self) -> None:
        iid, _ = self._items.popleft()
        self._ids.discard(iid)

    def clear(self) -> None:
        self._items.clear()
        self._ids.clear()


class Freezer:
    """Final incidents in, frozen incidents out (in order); a failure is raised by `take`.

    An incident whose evidence does not read whole (a damaged block, met here only when it
    is read whole for the file) comes out marked "evidence incomplete from T" and saved
    unfrozen, as the live tracker leaves it, and the others go on: a replay failed as a whole
    on it. `evidence_before` (the incidents' config) bounds T as the tracker's `_mark` does."""

    def __init__(self, state_dir: Path, figures: FiguresOf, evidence_before: float) -> None:
        self.state_dir = state_dir
        self.figures = figures
        self.evidence_before = evidence_before
        self._pool: ThreadPoolExecutor | None = None
        self._store: IncidentStore | None = None  # the worker's own connection
        self._queue: _Handed[Future[Incident]] = _Handed()

    def __contains__(self, iid: object) -> bool:
        """Whether the incident is being frozen (on record as frozen, soon)."""
        return iid in self._queue

    def submit(self, inc: Incident) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="freezer")
        self._queue.append(inc.id, self._pool.submit(self._freeze, inc))

    def _freeze(self, inc: Incident) -> Incident:
        try:
            inc, parts, lines = self._prepare(inc)
        except DamagedEvidenceError as exc:
            return self._marked(inc, exc)
        sha, rows = self.store.write_evidence(inc.id, parts, lines)
        return self._frozen(inc, sha, rows)

    @property
    def store(self) -> IncidentStore:
        if self._store is None:
            self._store = IncidentStore(self.state_dir)
        return self._store

    def _prepare(self, inc: Incident) -> tuple[Incident, list[bytes | bytearray], int]:
        """The final figures and the evidence file's parts and rows (the database's half)."""
        store = self.store
        columns = store.columns(inc.id)  # read once, for the figures and the file
        inc = inc.with_(figures=self.figures(inc, store, columns))
        return inc, store.evidence_parts(inc.id, columns), csv_lines(columns)

    def _marked(self, inc: Incident, exc: DamagedEvidenceError) -> Incident:
        """Its record saved marked, not frozen, with the figures it had (never numbers from
        part of its evidence), no file written; the tracker logs and counts it (`take`)."""
        since = incomplete_since(inc, exc.since, self.evidence_before)
        inc = inc.with_(evidence_broken_at=since, evidence_broken=str(exc))
        self.store.save(inc)
        return inc

    def _frozen(self, inc: Incident, sha: str, rows: int) -> Incident:
        """Its record saved as frozen, once its file is durable."""
        inc = inc.with_(frozen=True, evidence_sha256=sha, evidence_rows=rows)
        self.store.save(inc)
        return inc

    def take(self, wait: bool) -> list[Incident]:
        """The incidents frozen so far, in the order handed over (`wait`: all of them)."""
        out: list[Incident] = []
        while self._queue:
            done = self._queue.first()
            if not wait and not done.done():
                break
            out.append(done.result())
            self._queue.popleft()
        return out

    def close(self) -> None:
        """Finish what is being frozen; what was queued behind a failure is dropped."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._queue.clear()
        if self._store is not None:
            self._store.close()
            self._store = None


class FreezerProcess:
    """`Freezer` with its work in a forked process of its own, for the replay's incident
    worker: there the tracker and the freezer shared one GIL, and the replay waited about
    0.5 s at its end for the worker's freezing. The process is forked before the worker
    has threads, a tracker or a database connection (`start`), closes every pipe it
    inherited but its own two (a worker that dies is an end of file to the replay, and
    to it: it finishes the incident in hand and exits), and opens its own store."""

    def __init__(self, pid: int, send: Connection, recv: Connection) -> None:
        self._pid: int | None = pid
        self._send: Connection | None = send
        self._recv = recv
        self._queue: _Handed[None] = _Handed()
        self._failure: BaseException | None = None
        self._exit: int | None = None

    @classmethod
    def start(cls, state_dir: Path, figures: FiguresOf, evidence_before: float) -> FreezerProcess:
        """Fork the process (OSError: no fork, the caller freezes on a thread instead)."""
        work_r, work_w = _pipe()
        done_r, done_w = _pipe()
        try:
            pid = os.fork()
        except OSError:
            for conn in (work_r, work_w, done_r, done_w):
                conn.close()
            raise
        if pid == 0:  # pragma: no cover (runs in the forked process; tests see its effects)
            code = 1
            try:
                work_w.close()
                done_r.close()
                _close_inherited_pipes({0, 1, 2, work_r.fileno(), done_w.fileno()})
                code = _serve(Freezer(state_dir, figures, evidence_before), work_r, done_w)
            finally:
                os._exit(code)
        work_r.close()
        done_w.close()
        return cls(pid, work_w, done_r)

    @property
    def pid(self) -> int | None:
        return self._pid

    def __contains__(self, iid: object) -> bool:
        """Whether the incident is being frozen (on record as frozen, soon)."""
        return iid in self._queue

    def submit(self, inc: Incident) -> None:
        self._queue.append(inc.id, None)
        if self._failure is not None or self._send is None:
            return
        try:
            self._send.send(inc)
        except OSError:  # the process is gone: `take` says so
            self._failure = self._gone()

    def take(self, wait: bool) -> list[Incident]:
        """The incidents frozen so far, in the order handed over (`wait`: all of them)."""
        out: list[Incident] = []
        while self._queue:
            if self._failure is not None:
                raise self._failure
            if not wait and not self._recv.poll():
                break
            try:
                kind, value = self._recv.recv()
            except (EOFError, OSError):  # every writer gone: the process exited
                self._failure = self._gone()
                continue
            if kind == "error":
                self._failure = value
                continue
            self._queue.popleft()
            out.append(value)
        return out

    def close(self) -> None:
        """Finish what is being frozen (the process drops what was queued behind it)."""
        if self._send is not None:
            self._send.close()  # the end of its input
            self._send = None
        self._reap()
        self._recv.close()
        self._queue.clear()

    def _reap(self) -> int | None:
        if self._pid is not None:
            _, status = os.waitpid(self._pid, 0)
            self._exit = os.waitstatus_to_exitcode(status)
            self._pid = None
        return self._exit

    def _gone(self) -> MonitorError:
        return MonitorError(f"the incident freezer process stopped (exit {self._reap()})")


def _pipe() -> tuple[Connection, Connection]:
    r, w = os.pipe()
    return Connection(r, writable=False), Connection(w, readable=False)


def _close_inherited_pipes(keep: set[int]) -> None:
    """Close every pipe and socket this process inherited but `keep`: the replay's pipes
    to the worker (the worker's ends of them, the fork's sentinel), whose end of file
    tells each side the other died, must not be held open by a process of neither. Files
    (a log, the replay's databases) stay: nothing here uses them, and os._exit never
    flushes or closes them behind their owner's back."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own fd, closed by now
            continue
        if target.startswith(("pipe:", "socket:")):
            with contextlib.suppress(OSError):
                os.close(fd)


def _serve(freezer: Freezer, inbox: Connection, outbox: Connection) -> int:
    """The process: incidents in, frozen incidents (or the failure, after which it stops)
    out, in order. A reader thread keeps the input pipe empty, so that the worker never
    waits on it while this waits for the worker to read results; the end of the input
    (the worker closed it, or died) drops what was queued behind the incident in hand."""
    incoming: queue.SimpleQueue[Incident | None] = queue.SimpleQueue()
    ended = threading.Event()

    def read() -> None:
        while True:
            try:
                incoming.put(inbox.recv())
            except (EOFError, OSError):
                ended.set()
                incoming.put(None)
                return

    threading.Thread(target=read, name="freezer input", daemon=True).start()
    # The files' writes overlap in threads (fsync waits on the disk), up to WRITE_AHEAD;
    # each record is saved as frozen, and sent, in order once its own file is durable.
    # An incident marked for a damaged block (`Freezer._marked`, saved at once) has no file:
    # it waits its turn with None, so it is sent in order too.
    writers = ThreadPoolExecutor(WRITE_AHEAD, thread_name_prefix="evidence")
    pending: deque[tuple[Incident, Future[tuple[str, int]] | None]] = deque()
    try:
        while True:
            if pending and (incoming.empty() or len(pending) >= WRITE_AHEAD):
                inc, written = pending.popleft()
                try:
                    frozen = inc if written is None else freezer._frozen(inc, *written.result())
                except Exception as exc:
                    return _failed(outbox, exc)
                outbox.send(("frozen", frozen))
                continue
            if (got := incoming.get()) is None or ended.is_set():
                for inc, written in pending:  # being frozen: finished, as `close` says
                    if written is not None:
                        freezer._frozen(inc, *written.result())
                return 0
            try:
                inc, parts, lines = freezer._prepare(got)
            except DamagedEvidenceError as exc:
                pending.append((freezer._marked(got, exc), None))
                continue
            except Exception as exc:
                return _failed(outbox, exc)
            pending.append((inc, writers.submit(freezer.store.write_evidence, inc.id, parts, lines)))
    except OSError:  # the worker is gone: nothing to tell
        return 0
    finally:
        writers.shutdown(wait=True)
        freezer.close()


def _failed(outbox: Connection, exc: Exception) -> int:
    """The failure to the worker, whose `take` raises it, as on a thread."""
    try:
        outbox.send(("error", exc))
    except Exception:  # not picklable: its text, as the worker would report it
        outbox.send(("error", RuntimeError(traceback.format_exc())))
    return 0
