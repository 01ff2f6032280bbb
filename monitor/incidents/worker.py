"""A replay's incident tracker in a process of its own, on the second core.

Recording incidents (evidence copied into the store, figures, evidence files hashed and
frozen) cost `monitor replay` about as much CPU as judging the samples, all of it under
the replay's GIL (issue 20). `IncidentWorker` has the tracker's replay interface
(`add_admitted`, `add_columns`, `apply`, `advance`, `close`) and runs a real
`IncidentTracker` in a forked child: each step's kept samples are copied into a ring of
shared memory (`RING`; a step larger than the ring goes down the pipe) and its conditions
go down a pipe (the child reads at most `AHEAD` steps ahead of its tracker, and gives a
step's space in the ring back once its tracker has copied the samples; past either the
replay waits, so memory stays bounded), and what the tracker changed and logged comes back
on a second pipe, written by a thread of the child's so that it never holds the
tracker. The child's log records are handled by the replay's own loggers, so
its output reads as before. Live, the daemon keeps its tracker in process.

The tracker is the same code in the same order on the same steps, so the incidents are
the ones the in-process tracker records (tests/test_incidents_worker.py). A failure in
the child (a full disk, a store that cannot be opened) comes back as the `MonitorError`
the in-process tracker would have raised, with its text; a child that dies comes back
as one too, and the replay goes on without incidents, as it does after a failure. A bug
(any other exception in the tracker) ends the replay with the child's traceback and exit
1, as it did in process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import logging
import logging.handlers
import mmap
import multiprocessing
import os
import queue
import signal
import threading
import traceback
import warnings
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.engine.columns import ConditionColumns
from monitor.errors import MonitorError
from monitor.incidents.freezer import FreezerProcess
from monitor.incidents.model import Incident
from monitor.incidents.store import FILE
from monitor.incidents.tracker import IncidentTracker, Part, Series_, figures_of, kept_sensors, watches
from monitor.incidents.transitions import Transitions, transitions
from monitor.model import Condition

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from monitor.engine import ReplayStep

log = logging.getLogger(__name__)

CLOSE_WAIT = 60.0  # seconds the child gets to finish freezing once the replay is done
AHEAD = 4  # replay steps the child takes in ahead of its tracker (a step: ~17 MB at 1 M samples)
# Bytes of shared memory for the samples of the steps in flight (17 a sample: a 10 M-row
# replay's 256 k-row Parquet steps are 4.4 MB, so about 15 of them). Only what is used is
# touched (and counted in the processes' memory): the ring starts over at 0 whenever the
# child has caught up.
RING = 64 << 20
PIPE = 1 << 20  # the step pipe's capacity (Linux's default /proc/sys/fs/pipe-max-size)

# Down the step pipe: ("step", [(name, samples)], Transitions, columns | None, offset | None):
# the series' raw bytes are in the ring at that offset, or (None) follow on the pipe
# (`_payload`); ("final",).
# Back on the result pipe: ("ready",), ("log", record), ("changed", [Incident]),
# ("free",) (the oldest step in the ring is taken in: its space may be reused),
# ("error", text), ("crash", traceback text), ("done",).
Message = tuple[Any, ...]


class ReplayTracker(Protocol):
    """What a replay needs of its incident tracker: `IncidentWorker`, or `IncidentTracker`
    when no worker process can be started."""

    @property
    def path(self) -> Path: ...

    def add_admitted(
        self, names: tuple[str, ...], by_sensor: Sequence[Part | None], quality: npt.NDArray[np.integer]
    ) -> None: ...

    def add_columns(
        self,
        names: tuple[str, ...],
        sensor: npt.NDArray[np.integer],
        time: npt.NDArray[np.float64],
        value: npt.NDArray[np.float64],
        quality: npt.NDArray[np.integer],
        accepted: npt.NDArray[np.bool_],
    ) -> None: ...

    def apply(self, conditions: Sequence[Condition] | ConditionColumns) -> None: ...

    def advance(self, final: bool = False) -> list[Incident]: ...

    def close(self) -> None: ...


def hand_over(tracker: ReplayTracker, names: tuple[str, ...], step: ReplayStep) -> None:
    """One replay step into a tracker: its samples (the engine's split by sensor when it
    made one), then its conditions; the caller then asks it to `advance`."""
    if step.by_sensor is not None and step.time.size:
        tracker.add_admitted(names, step.by_sensor, step.quality)
    else:
        tracker.add_columns(names, step.sensor, step.time, step.value, step.quality, step.accepted)
    tracker.apply(step.columns)


class WorkerUnavailableError(MonitorError):
    """No worker process could be started (fork refused: a process or memory limit)."""


def replay_tracker(config: Config) -> ReplayTracker:
    """The replay's incident tracker: in a worker process, or, when none can be started,
    in this one (slower, the same incidents) rather than none at all."""
    try:
        return IncidentWorker(config)
    except WorkerUnavailableError as exc:
        log.warning("%s; incidents are recorded in this process instead (slower)", exc)
        return IncidentTracker(config, background=True)


class IncidentWorker:
    """`IncidentTracker(config, background=True)` for `monitor replay`, in a child process."""

    def __init__(self, config: Config) -> None:
        self.path = Path(config.state_dir) / FILE
        watch = watches(config)
        self._kept = kept_sensors(config, watch)
        self._watched = frozenset(watch)  # the sensors whose transitions the tracker applies
        # fork: the child starts at once with the config already in memory, and the replay
        # has not opened its input yet (no reader threads to copy mid-work).
        ctx = multiprocessing.get_context("fork")
        try:
            # Shared with the child (made before the fork): a step's samples are copied in
            # once and read there in place, instead of written down the pipe 64 KiB at a
            # time and read out again (the replay's largest cost of handing steps over).
            self._ring = mmap.mmap(-1, RING)
        except OSError as exc:  # out of memory or address space
            raise WorkerUnavailableError(f"cannot start the incident worker: {exc.strerror or exc}") from exc
        self._bytes: npt.NDArray[np.uint8] = np.frombuffer(self._ring, np.uint8)
        self._spans = _Spans(RING)
        try:
            steps_in, steps_out = ctx.Pipe(duplex=False)
            results_in, results_out = ctx.Pipe(duplex=False)
        except OSError as exc:  # out of file descriptors
            self._unmap()
            raise WorkerUnavailableError(f"cannot start the incident worker: {exc.strerror or exc}") from exc
        # A step's header (its conditions: ~110 KB for a 256 k-row step of the busy data)
        # no longer waits twice on a full 64 KiB pipe for the child's reader, which needs
        # the child's GIL to take it (up to a switch interval while its tracker works).
        # Refused (a user at their pipe memory limit): the default capacity, as before.
        with contextlib.suppress(OSError):
            fcntl.fcntl(steps_out.fileno(), fcntl.F_SETPIPE_SZ, PIPE)
        self._send: Connection | None = steps_out
        self._recv = results_in
        self._proc: BaseProcess | None = ctx.Process(
            target=_serve,
            args=(config, steps_in, results_out, (steps_out, results_in), self._ring),
            name="incidents",
            daemon=True,
        )
        with warnings.catch_warnings():
            # Python 3.12 warns on a fork beside other threads (a test runner's, pyarrow's
            # pool when the interpreter has read files before): the child takes no lock of
            # theirs; logging re-creates its own at the fork.
            warnings.simplefilter("ignore", DeprecationWarning)
            # Frozen at the fork, what the child inherits (config, modules: hundreds of
            # thousands of objects) is never walked by its garbage collections, nor its
            # pages copied for it; this process unfreezes at once and collects as before.
            frozen_before = gc.get_freeze_count()  # a caller that froze: left as it chose
            gc.freeze()
            try:
                self._proc.start()
            except OSError as exc:  # no fork: a process or memory limit
                for conn in (steps_in, steps_out, results_in, results_out):
                    conn.close()
                self._proc = None
                self._unmap()
                raise WorkerUnavailableError(
                    f"cannot start the incident worker process: {exc.strerror or exc}"
                ) from exc
            finally:
                if not frozen_before:
                    gc.unfreeze()
        # Each end is held by one process only: a child that dies is an end of file here
        # (even mid-message), and a closed step pipe is the end of the input there.
        steps_in.close()
        results_out.close()
        self._admitted: list[tuple[tuple[str, ...], Sequence[Part | None], npt.NDArray[np.integer]]] = []
        self._columns: Message | None = None
        self._conditions: list[Transitions] = []
        self._changed: list[Incident] = []
        self._done = False
        try:
            self._drain(until=("ready",))
        except BaseException:
            self.close()
            raise

    # --- the tracker's replay interface ------------------------------------------------

    def add_admitted(
        self, names: tuple[str, ...], by_sensor: Sequence[Part | None], quality: npt.NDArray[np.integer]
    ) -> None:
        self._admitted.append((names, by_sensor, quality))  # the kept parts are copied by `_post`

    def add_columns(
        self,
        names: tuple[str, ...],
        sensor: npt.NDArray[np.integer],
        time: npt.NDArray[np.float64],
        value: npt.NDArray[np.float64],
        quality: npt.NDArray[np.integer],
        accepted: npt.NDArray[np.bool_],
    ) -> None:
        self._columns = (names, sensor, time, value, quality, accepted)

    def apply(self, conditions: Sequence[Condition] | ConditionColumns) -> None:
        self._conditions.append(transitions(conditions, self._watched))

    def advance(self, final: bool = False) -> list[Incident]:
        """Hand the step over; returns what the child has changed since the last call
        (at `final`, everything: it waits for the child to finish)."""
        if self._done:
            return []
        step = ("step", self._admitted, self._conditions, self._columns)
        self._admitted, self._conditions, self._columns = [], [], None
        self._drain()  # a failure reported meanwhile stops here, before the send
        try:
            if step[1] or any(t.time for t in step[2]) or step[3] is not None:
                self._post(step)
            if final:
                self._post(("final",))
                self._drain(until=("done",))
                self._done = True
        except OSError:  # the child is gone (a broken pipe)
            pass
        else:
            out, self._changed = self._changed, []
            return out
        self._drain()  # what did it say before? (outside the handler: not "during handling of")
        raise self._gone()

    def close(self) -> None:
        """Let the child finish what it was given (after a failure it has stopped already)."""
        if self._send is not None:
            self._send.close()  # the end of its input: the child closes the tracker and exits
            self._send = None
        if self._proc is not None:
            with contextlib.suppress(MonitorError, RuntimeError):  # raised by `advance` already
                self._drain(until=("gone",), wait=CLOSE_WAIT)  # its last log lines, up to its exit
            self._proc.join(timeout=CLOSE_WAIT)
            if self._proc.is_alive():  # a child stuck on a dead disk: the replay still ends
                log.error("the incident worker did not stop within %.0f s; killed", CLOSE_WAIT)
                self._proc.kill()
                self._proc.join()
            self._proc.close()
            self._proc = None
            self._recv.close()
            self._unmap()

    # --- plumbing -------------------------------------------------------------------------

    def _post(self, message: Message) -> None:
        if self._send is None:
            raise BrokenPipeError
        if message[0] != "step":
            self._send.send(message)
            return
        _, admitted, conditions, columns = message
        parts = [
            (name, part, quality)
            for names, by_sensor, quality in admitted
            for name, part in zip(names, by_sensor, strict=True)
            if part is not None and name in self._kept
        ]
        sizes = [(name, int(part[1].size)) for name, part, _ in parts]
        total = 17 * sum(n for _, n in sizes)
        at = self._reserve(total) if total else None
        if at is not None:  # filled before the child hears of it
            _fill(self._bytes[at : at + total], parts)
        mine = conditions[0] if len(conditions) == 1 else Transitions.join(conditions)
        self._send.send(("step", sizes, mine, columns, at))
        if at is not None:
            return
        fd = self._send.fileno()
        series = [
            (name, t, v, quality[sel].astype(np.int8, copy=False)) for name, (sel, t, v), quality in parts
        ]
        for data in _payload(series):
            _write_all(fd, data)

    def _reserve(self, size: int) -> int | None:
        """Where in the ring a step of `size` bytes goes, once the child has given back
        enough of it (waiting for it bounds memory as `AHEAD` does); None: larger than the
        ring, it goes down the pipe."""
        if size > self._spans.size:
            return None
        while (at := self._spans.take(size)) is None:
            self._drain(until=("free",))  # a child that died meanwhile: MonitorError here
        return at

    def _unmap(self) -> None:
        del self._bytes  # the ring's last view in this process: it can be closed
        # unless a step was being copied in when an exception (a Ctrl-C) stopped it: its
        # traceback still holds views, and close() would raise BufferError over it (exit 1
        # and a traceback instead of 130). The last of those views unmaps the ring instead.
        with contextlib.suppress(BufferError):
            self._ring.close()

    def _gone(self) -> MonitorError:
        code = self._proc.exitcode if self._proc is not None else None
        if code is None and self._proc is not None:
            self._proc.join(timeout=5)
            code = self._proc.exitcode
        return MonitorError(f"the incident worker process stopped (exit {code})")

    def _drain(self, until: tuple[str, ...] = (), wait: float | None = None) -> None:
        """Handle what came back: without `until`, what is there now; with it, up to the
        first message of one of those kinds ("gone": up to the child's exit), waiting
        `wait` seconds at most for each message (None: as long as the child lives)."""
        while self._recv.poll(wait if until else 0):
            try:
                message: Message = self._recv.recv()
            except (EOFError, OSError):  # every writer gone: the child exited
                if "gone" in until:
                    return
                raise self._gone() from None
            kind = message[0]
            if kind == "log":
                record: logging.LogRecord = message[1]
                logging.getLogger(record.name).handle(record)
            elif kind == "changed":
                self._changed.extend(message[1])
            elif kind == "free":
                self._spans.give_back()
            elif kind == "error":
                self._done = True
                raise MonitorError(message[1])
            elif kind == "crash":
                self._done = True
                raise RuntimeError(f"the incident worker failed:\n{message[1]}")
            if kind in until:
                return


class _Spans:
    """The ring's bytes in use, as the steps' spans in the order they were taken (the
    child gives them back in that order); a span never wraps around the end."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._used: deque[tuple[int, int]] = deque()

    def take(self, size: int) -> int | None:
        """The offset of `size` free bytes (8-byte aligned, for the floats), or None
        until older spans are given back."""
        size = -(-size // 8) * 8
        used = self._used
        if not used:
            at: int | None = 0  # caught up: from the start again (the pages already touched)
        else:
            first, end = used[0][0], used[-1][1]
            if used[-1][0] < first:  # wrapped: free from `end` up to the oldest span
                at = end if end + size <= first else None
            elif end + size <= self.size:
                at = end
            else:
                at = 0 if size <= first else None
        if at is not None:
            used.append((at, at + size))
        return at

    def give_back(self) -> None:
        """The oldest span is free again."""
        self._used.popleft()


def _fill(buf: npt.NDArray[np.uint8], parts: Sequence[tuple[str, Part, npt.NDArray[np.integer]]]) -> None:
    """A step's kept parts into `buf` as `_payload` lays them out (every time and value
    column, then every quality column), one copy each: the qualities are taken straight
    from the step's column by the part's indices."""
    total = buf.size
    floats = buf[: total - total // 17].view(np.float64)
    qualities = buf[total - total // 17 :].view(np.int8)
    at = q_at = 0
    for _, (sel, t, v), quality in parts:
        n = int(t.size)
        floats[at : at + n] = t
        floats[at + n : at + 2 * n] = v
        if quality.dtype == np.int8:
            # mode="clip": the indices are the engine's own, and the default ("raise")
            # would take them into a buffer first
            np.take(quality, sel, out=qualities[q_at : q_at + n], mode="clip")
        else:
            qualities[q_at : q_at + n] = quality[sel]
        at, q_at = at + 2 * n, q_at + n


def _payload(series: Sequence[Series_]) -> list[memoryview]:
    """A step's samples as raw bytes, not pickled (pickling copied 170 MB of a 10 M-row
    replay three times over): every time and value column (float64, so each stays
    8-byte aligned on the other side), then every quality column (int8)."""
    floats = [np.ascontiguousarray(col, np.float64).data.cast("B") for _, t, v, _ in series for col in (t, v)]
    return floats + [np.ascontiguousarray(q, np.int8).data.cast("B") for _, _, _, q in series]


def _write_all(fd: int, data: memoryview) -> None:
    """The bytes onto the pipe, straight from the array (no copy in between)."""
    while data:
        data = data[os.write(fd, data) :]


def _read_series(fd: int, sizes: Sequence[tuple[str, int]]) -> list[Series_]:
    """`_payload`'s bytes off the pipe into one buffer, viewed as the step's series."""
    total = sum(n for _, n in sizes) * 17
    buf = np.empty(total, np.uint8)
    view = buf.data
    done = 0
    while done < total:
        got = os.readv(fd, [view[done:]])
        if not got:
            raise EOFError("the replay closed the step pipe mid-step")
        done += got
    return _series(buf, sizes)


def _series(buf: npt.NDArray[np.uint8], sizes: Sequence[tuple[str, int]]) -> list[Series_]:
    """Views of `_payload`'s bytes (in `buf`, 8-byte aligned) as the step's series."""
    total = buf.size
    floats = buf[: total - total // 17].view(np.float64)
    out: list[Series_] = []
    at, q_at = 0, total - total // 17
    for name, n in sizes:
        t, v = floats[at : at + n], floats[at + n : at + 2 * n]
        out.append((name, t, v, buf[q_at : q_at + n].view(np.int8)))
        at, q_at = at + 2 * n, q_at + n
    return out


def _read_ahead(inbox: Connection, ahead: queue.Queue[Message | None], ring: mmap.mmap) -> None:
    """Take steps off the pipe (their samples in place in the ring, or off the pipe) while
    the tracker works (a burst of incidents freezing does not hold the replay), at most
    `AHEAD` of them; None at the end of the pipe."""
    shared = np.frombuffer(ring, np.uint8)
    while True:
        try:
            message: Message = inbox.recv()
            if message[0] == "step":
                kind, sizes, conditions, columns, at = message
                if at is None:
                    series = _read_series(inbox.fileno(), sizes)
                else:
                    series = _series(shared[at : at + 17 * sum(n for _, n in sizes)], sizes)
                message = (kind, series, conditions, columns, at is not None)
        except (EOFError, OSError):
            ahead.put(None)
            return
        ahead.put(message)
        if message[0] == "final":
            return


def _heap_for_large_blocks() -> None:
    """Let glibc's malloc serve the tracker's blocks of up to a few MB from its heap (no
    page faults when they are reused) instead of a fresh mmap each (faulted in and zeroed
    page by page). Its threshold for mmap rises to the size of the largest mmapped block
    freed so far: the step buffers read off the pipe raised it at the first step; taken in
    place from the ring, the worker took 60,000-90,000 more page faults and 0.1 s more
    system time in a 10 M-row replay. One such block, freed at once and never touched,
    raises it the same way (with another malloc: an allocation freed at once)."""
    np.empty(8 << 20, np.uint8)


def _write_back(outbox: Connection, back: queue.SimpleQueue[Message | None]) -> None:
    """Results to the replay in order, off the tracker's thread; None ends it."""
    while (message := back.get()) is not None:
        try:
            outbox.send(message)
        except OSError:  # the replay is gone: nothing to tell
            return


class _Forward(logging.handlers.QueueHandler):
    """The child's log records, formatted, back to the replay's loggers."""

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put_nowait(("log", record))


def _serve(
    config: Config, inbox: Connection, outbox: Connection, theirs: tuple[Connection, ...], ring: mmap.mmap
) -> None:
    """The child: a tracker fed from the step pipe until "final" or the end of the pipe.

    Ctrl-C reaches this process too (the terminal signals the whole group): it stops the
    work, but never the setup or the cleanup below, which must end the result writer for
    the process to exit (a second Ctrl-C used to leave it waiting for that thread)."""
    # A Ctrl-C in the setup is the replay's alone: it closes the pipe, which ends this too.
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for conn in theirs:  # the replay's ends, copied by the fork
        conn.close()
    # Freezing in a process of its own, forked here, before this one has threads, a tracker
    # or a database connection: the tracker and the freezer shared this process's GIL, and
    # the replay waited ~0.5 s for them at its end. No fork: a thread, as before.
    freezer: FreezerProcess | None = None
    with contextlib.suppress(OSError):
        freezer = FreezerProcess.start(
            Path(config.state_dir),
            functools.partial(figures_of, watches(config)),
            config.incidents.evidence_before,
        )
    back: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
    writer = threading.Thread(target=_write_back, args=(outbox, back), name="incident results")
    writer.start()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_Forward(back))
    tracker: IncidentTracker | None = None
    try:
        if interrupt is not None:
            signal.signal(signal.SIGINT, interrupt)  # as the replay has it (ignored in a `&` job)
        try:
            tracker = IncidentTracker(config, background=True, freezer=freezer)
        except (MonitorError, OSError) as exc:
            if freezer is not None:
                freezer.close()
            back.put(("error", str(exc)))
            return
        back.put(("ready",))
        _heap_for_large_blocks()
        ahead: queue.Queue[Message | None] = queue.Queue(AHEAD)
        threading.Thread(
            target=_read_ahead, args=(inbox, ahead, ring), name="incident steps", daemon=True
        ).start()
        while (message := ahead.get()) is not None:
            try:
                if message[0] == "final":
                    back.put(("changed", tracker.advance(final=True)))
                    back.put(("done",))
                    return
                _, series, conditions, columns, in_ring = message
                if columns is not None:
                    tracker.add_columns(*columns)
                if series:
                    tracker.add_series(series)  # copied into its buffers (`Recent.extend`)
                if in_ring:  # nothing reads those bytes any more: the replay may reuse them
                    back.put(("free",))
                tracker.apply_transitions(conditions)
                changed = tracker.advance()
                if changed:
                    back.put(("changed", changed))
            except (MonitorError, OSError) as exc:
                back.put(("error", str(exc)))
                return
    except KeyboardInterrupt:
        return
    except BaseException:
        back.put(("crash", traceback.format_exc()))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if tracker is not None:
            tracker.close()
        back.put(None)
        writer.join()
        outbox.close()
        inbox.close()
