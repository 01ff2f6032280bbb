"""A replay's incident tracker in a process of its own, on the second core.

Recording incidents (evidence copied into the store, figures, evidence files hashed and
frozen) cost `monitor replay` about as much CPU as judging the samples, all of it under
the replay's GIL (issue 20). `IncidentWorker` has the tracker's replay interface
(`add_admitted`, `add_columns`, `apply`, `advance`, `close`) and runs a real
`IncidentTracker` in a forked child: each step's kept samples and conditions go down a
pipe (the child reads at most `AHEAD` steps ahead of its tracker; past that the send
blocks, so memory stays bounded), and what the tracker changed and logged comes back
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
import dataclasses
import gc
import logging
import logging.handlers
import multiprocessing
import os
import queue
import signal
import threading
import traceback
import warnings
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.errors import MonitorError
from monitor.incidents.model import Incident
from monitor.incidents.store import FILE
from monitor.incidents.tracker import IncidentTracker, Part, Series_, kept_sensors, kept_series
from monitor.model import Condition, new_condition

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from monitor.engine import ReplayStep

log = logging.getLogger(__name__)

CLOSE_WAIT = 60.0  # seconds the child gets to finish freezing once the replay is done
AHEAD = 4  # replay steps the child takes in ahead of its tracker (a step: ~17 MB at 1 M samples)

# Down the step pipe: ("step", [(name, samples)], conditions as columns, columns | None), then the
# series' raw bytes (`_payload`); ("final",).
# Back on the result pipe: ("ready",), ("log", record), ("changed", [Incident]),
# ("error", text), ("crash", traceback text), ("done",).
Message = tuple[Any, ...]
_CONDITION_FIELDS = tuple(f.name for f in dataclasses.fields(Condition))  # its __init__'s order


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

    def apply(self, conditions: Sequence[Condition]) -> None: ...

    def advance(self, final: bool = False) -> list[Incident]: ...

    def close(self) -> None: ...


def hand_over(tracker: ReplayTracker, names: tuple[str, ...], step: ReplayStep) -> None:
    """One replay step into a tracker: its samples (the engine's split by sensor when it
    made one), then its conditions; the caller then asks it to `advance`."""
    if step.by_sensor is not None and step.time.size:
        tracker.add_admitted(names, step.by_sensor, step.quality)
    else:
        tracker.add_columns(names, step.sensor, step.time, step.value, step.quality, step.accepted)
    tracker.apply(step.conditions)


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
        self._kept = kept_sensors(config)
        # fork: the child starts at once with the config already in memory, and the replay
        # has not opened its input yet (no reader threads to copy mid-work).
        ctx = multiprocessing.get_context("fork")
        try:
            steps_in, steps_out = ctx.Pipe(duplex=False)
            results_in, results_out = ctx.Pipe(duplex=False)
        except OSError as exc:  # out of file descriptors
            raise WorkerUnavailableError(f"cannot start the incident worker: {exc.strerror or exc}") from exc
        self._send: Connection | None = steps_out
        self._recv = results_in
        self._proc: BaseProcess | None = ctx.Process(
            target=_serve,
            args=(config, steps_in, results_out, (steps_out, results_in)),
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
        self._series: list[Series_] = []
        self._columns: Message | None = None
        self._conditions: list[Condition] = []
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
        self._series.extend(kept_series(self._kept, names, by_sensor, quality))

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

    def apply(self, conditions: Sequence[Condition]) -> None:
        self._conditions.extend(conditions)

    def advance(self, final: bool = False) -> list[Incident]:
        """Hand the step over; returns what the child has changed since the last call
        (at `final`, everything: it waits for the child to finish)."""
        if self._done:
            return []
        step = ("step", self._series, self._conditions, self._columns)
        self._series, self._conditions, self._columns = [], [], None
        self._drain()  # a failure reported meanwhile stops here, before the send
        try:
            if step[1] or step[2] or step[3] is not None:
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

    # --- plumbing -------------------------------------------------------------------------

    def _post(self, message: Message) -> None:
        if self._send is None:
            raise BrokenPipeError
        if message[0] != "step":
            self._send.send(message)
            return
        _, series, conditions, columns = message
        sizes = [(name, int(t.size)) for name, t, _, _ in series]
        self._send.send(("step", sizes, _condition_columns(conditions), columns))
        fd = self._send.fileno()
        for part in _payload(series):
            _write_all(fd, part)

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
            elif kind == "error":
                self._done = True
                raise MonitorError(message[1])
            elif kind == "crash":
                self._done = True
                raise RuntimeError(f"the incident worker failed:\n{message[1]}")
            if kind in until:
                return


def _condition_columns(conditions: Sequence[Condition]) -> tuple[list[Any], ...]:
    """A step's conditions as one list a field (in `Condition`'s order), which pickle in
    C: each pickled on its own went through `Condition.__reduce__`, 0.17 s of the
    replay's CPU for the 53,409 transitions of a 10 M-row replay."""
    return tuple([getattr(c, name) for c in conditions] for name in _CONDITION_FIELDS)


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
    floats = buf[: total - total // 17].view(np.float64)
    out: list[Series_] = []
    at, q_at = 0, total - total // 17
    for name, n in sizes:
        t, v = floats[at : at + n], floats[at + n : at + 2 * n]
        out.append((name, t, v, buf[q_at : q_at + n].view(np.int8)))
        at, q_at = at + 2 * n, q_at + n
    return out


def _read_ahead(inbox: Connection, ahead: queue.Queue[Message | None]) -> None:
    """Take steps off the pipe while the tracker works (a burst of incidents freezing does
    not hold the replay), at most `AHEAD` of them; None at the end of the pipe."""
    while True:
        try:
            message: Message = inbox.recv()
            if message[0] == "step":
                kind, sizes, conditions, columns = message
                series = _read_series(inbox.fileno(), sizes)
                message = (kind, series, [new_condition(*c) for c in zip(*conditions, strict=True)], columns)
        except (EOFError, OSError):
            ahead.put(None)
            return
        ahead.put(message)
        if message[0] == "final":
            return


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


def _serve(config: Config, inbox: Connection, outbox: Connection, theirs: tuple[Connection, ...]) -> None:
    """The child: a tracker fed from the step pipe until "final" or the end of the pipe.

    Ctrl-C reaches this process too (the terminal signals the whole group): it stops the
    work, but never the setup or the cleanup below, which must end the result writer for
    the process to exit (a second Ctrl-C used to leave it waiting for that thread)."""
    # A Ctrl-C in the setup is the replay's alone: it closes the pipe, which ends this too.
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for conn in theirs:  # the replay's ends, copied by the fork
        conn.close()
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
            tracker = IncidentTracker(config, background=True)
        except (MonitorError, OSError) as exc:
            back.put(("error", str(exc)))
            return
        back.put(("ready",))
        ahead: queue.Queue[Message | None] = queue.Queue(AHEAD)
        threading.Thread(target=_read_ahead, args=(inbox, ahead), name="incident steps", daemon=True).start()
        while (message := ahead.get()) is not None:
            try:
                if message[0] == "final":
                    back.put(("changed", tracker.advance(final=True)))
                    back.put(("done",))
                    return
                _, series, conditions, columns = message
                if columns is not None:
                    tracker.add_columns(*columns)
                if series:
                    tracker.add_series(series)
                tracker.apply(conditions)
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
