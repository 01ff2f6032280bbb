"""The replay worker's freezer in a process of its own (`FreezerProcess`,
monitor/incidents/freezer.py): the thread freezer's interface and semantics, no pipe of
anyone else's held open, and no hang or orphan when either process dies."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import select
import signal
from pathlib import Path
from typing import Any

import pytest

from monitor.errors import MonitorError, StateError
from monitor.incidents import IncidentStore
from monitor.incidents.freezer import WRITE_AHEAD, FreezerProcess
from monitor.incidents.model import Figures, Incident
from monitor.incidents.store import Columns

T0 = 1_780_000_000.0


def _incident(iid: str) -> Incident:
    return Incident(
        id=iid, station="ps-1", sensor="outfall.flow", rule="slug", method="sustained", citation="§139-11",
        discharger=None, unit="gpm", threshold=500.0, factor=5.0, alarm_time=T0 + 900, end=T0 + 3600,
        figures=Figures(start=T0, baseline=100.0), statement_due=T0 + 15 * 86400,
    )  # fmt: skip


def _figures(inc: Incident, store: IncidentStore, columns: dict[str, Columns]) -> Figures:
    return Figures(start=inc.start, baseline=inc.figures.baseline, peak_value=42.0)


def _failing(inc: Incident, store: IncidentStore, columns: dict[str, Columns]) -> Figures:
    raise StateError(f"cannot freeze {inc.id}: No space left on device")


def _pipes(pid: int) -> set[str]:
    """The pipes and sockets a process holds ("pipe:[inode]")."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with_target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if with_target.startswith(("pipe:", "socket:")):
            out.add(with_target)
    return out


def _target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def test_incidents_come_back_frozen_in_order_from_the_process(tmp_path: Path) -> None:
    """Frozen with the figures given at the fork, the file durable and hashed, the record
    saved as frozen by the process's own connection, in the order handed over."""
    IncidentStore(tmp_path).close()  # the schema, as the tracker's store makes it
    freezer = FreezerProcess.start(tmp_path, _figures, 86400.0)
    try:
        for iid in ("a", "b", "c"):
            freezer.submit(_incident(iid))
        assert "b" in freezer and "z" not in freezer
        done = freezer.take(wait=True)
    finally:
        freezer.close()
    assert [i.id for i in done] == ["a", "b", "c"] and "b" not in freezer
    assert all(i.frozen and i.figures.peak_value == 42.0 and i.evidence_sha256 for i in done)
    with IncidentStore(tmp_path) as store:
        assert [(i.id, i.frozen) for i in store.incidents()] == [("a", True), ("b", True), ("c", True)]


def test_the_process_holds_no_pipe_but_its_own(tmp_path: Path) -> None:
    """The worker's step and result pipes (here: pipes of this process, and a
    multiprocessing pipe) are closed in the freezer process: the replay learns that the
    worker died from their end of file, which a process holding them would prevent."""
    IncidentStore(tmp_path).close()
    r, w = os.pipe()
    a, b = multiprocessing.Pipe(duplex=False)
    theirs = {_target(fd) for fd in (r, w, a.fileno(), b.fileno())}
    freezer = FreezerProcess.start(tmp_path, _figures, 86400.0)
    try:
        freezer.submit(_incident("a"))
        assert [i.id for i in freezer.take(wait=True)] == ["a"]  # past its start-up for sure
        assert freezer.pid is not None
        held = _pipes(freezer.pid)
        own = {_target(freezer._send.fileno()), _target(freezer._recv.fileno())}  # type: ignore[union-attr]
        assert held & theirs == set()
        # stdin/out/err may be pipes (a test runner's): beside them, its own two only
        assert held - {_target(fd) for fd in (0, 1, 2)} == own
    finally:
        freezer.close()
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_a_failure_is_raised_by_take_with_its_text(tmp_path: Path) -> None:
    """A full disk (a StateError while freezing) comes back as itself, text and type;
    the process stops and what was queued behind it is dropped, as on the thread."""
    IncidentStore(tmp_path).close()
    freezer = FreezerProcess.start(tmp_path, _failing, 86400.0)
    try:
        freezer.submit(_incident("a"))
        freezer.submit(_incident("b"))
        with pytest.raises(StateError, match=r"^cannot freeze a: No space left on device$"):
            freezer.take(wait=True)
        with pytest.raises(StateError):  # again, as a failed future's result
            freezer.take(wait=False)
    finally:
        freezer.close()
    assert "a" not in freezer and freezer.pid is None


def test_a_killed_freezer_process_is_a_monitor_error_not_a_hang(tmp_path: Path) -> None:
    """SIGKILL: the incident being frozen is reported as the worker's death is."""
    IncidentStore(tmp_path).close()
    freezer = FreezerProcess.start(tmp_path, _figures, 86400.0)
    assert freezer.pid is not None
    os.kill(freezer.pid, signal.SIGKILL)
    freezer.submit(_incident("a"))  # into a pipe nobody reads, or a broken one
    with pytest.raises(MonitorError, match=r"the incident freezer process stopped \(exit -9\)"):
        freezer.take(wait=True)
    freezer.close()


def test_the_freezer_process_exits_when_its_worker_dies(tmp_path: Path) -> None:
    """A worker killed with an incident queued: its freezer finishes or drops it and
    exits (the end of its input), left running by no one."""
    IncidentStore(tmp_path).close()
    r, w = os.pipe()
    worker = os.fork()
    if worker == 0:  # pragma: no cover (the stand-in worker)
        try:
            os.close(r)
            freezer = FreezerProcess.start(tmp_path, _figures, 86400.0)
            freezer.submit(_incident("a"))
            os.write(w, str(freezer.pid).encode())
            os.close(w)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(w)
    pid = int(os.read(r, 32))
    os.close(r)
    assert os.waitstatus_to_exitcode(os.waitpid(worker, 0)[1]) == -signal.SIGKILL
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        ready, _, _ = select.select([handle], [], [], 60)  # bounded: should it never exit
        assert ready == [handle], f"the freezer process {pid} outlived its worker"
    finally:
        os.close(handle)


def test_files_written_together_come_back_in_order_each_durable_first(tmp_path: Path) -> None:
    """More incidents than are written at once: every record frozen, in order, with the
    hash of its own file as written."""
    IncidentStore(tmp_path).close()
    ids = [f"i{n:02d}" for n in range(3 * WRITE_AHEAD)]
    freezer = FreezerProcess.start(tmp_path, _figures, 86400.0)
    try:
        for iid in ids:
            freezer.submit(_incident(iid))
        done = freezer.take(wait=True)
    finally:
        freezer.close()
    assert [i.id for i in done] == ids
    with IncidentStore(tmp_path) as store:
        for inc in done:
            data = store.evidence_path(inc.id).read_bytes()
            assert inc.evidence_sha256 == hashlib.sha256(data).hexdigest()
        assert all(i.frozen for i in store.incidents())


def test_a_failed_write_stops_the_freezing_after_the_ones_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk on one file of several written together: those before it are saved as
    frozen, it and those after are not, and `take` raises its error."""
    IncidentStore(tmp_path).close()
    write = IncidentStore.write_evidence

    def full(self: IncidentStore, iid: str, *args: Any, **kwargs: Any) -> tuple[str, int]:
        if iid == "c":
            raise StateError("cannot write the evidence of c: No space left on device")
        return write(self, iid, *args, **kwargs)

    monkeypatch.setattr(IncidentStore, "write_evidence", full)  # copied by the fork
    freezer = FreezerProcess.start(tmp_path, _figures, 86400.0)
    try:
        for iid in "abcde":
            freezer.submit(_incident(iid))
        with pytest.raises(StateError, match="No space left on device"):
            freezer.take(wait=True)
    finally:
        freezer.close()
    with IncidentStore(tmp_path) as store:
        frozen = {i.id for i in store.incidents() if i.frozen}
    assert frozen == {"a", "b"}
