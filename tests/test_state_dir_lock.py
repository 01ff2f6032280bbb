"""One daemon (or replay) per state dir: a second `monitor run`, or a `monitor replay` into a
running daemon's state dir, is refused at once with exit 75 and one line naming the state dir
and the holder, and writes nothing; readers (`monitor incidents list`) work beside the
daemon; the lock is the kernel's, so a SIGKILLed holder leaves no stale lock and a replay's
forked helpers, orphaned by a SIGKILL, do not keep it.

Real processes throughout. The one fake: a file system without POSIX locks (ENOLCK), which
no file system here gives on demand, is `fcntl.lockf` raising it (the last test).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from monitor import statelock
from monitor.commands.replay import state_writes
from monitor.config import build_config
from monitor.incidents import IncidentStore
from monitor.statelock import EXIT_IN_USE, LOCK_FILE, StateDirInUseError, hold_state_dir
from tests.daemon_process import running_daemon, spawn_daemon
from tests.services import wait_until
from tests.test_replay_killed import _descendants, _running
from tests.test_replay_killed import _write as write_chattering

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 60.0  # seconds: a bound for what must happen, never a wait for it
T0 = 1_780_000_000


def station(state: Path) -> dict[str, object]:
    return {
        "station": {"id": "ps-lock"},
        "state_dir": str(state),
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "console": {"enabled": False},
    }


def write_config(path: Path, state: Path) -> Path:
    path.write_text(yaml.safe_dump(station(state)))
    return path


def ph_excursion(path: Path) -> Path:
    """Half an hour of pH readings with twelve minutes at 12: one incident when replayed."""
    lines = ["time,sensor,value"]
    lines += [f"{T0 + i * 10},outfall.ph,{12.0 if 50 < i < 120 else 7.0}" for i in range(200)]
    path.write_text("\n".join(lines) + "\n")
    return path


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def replay(config: Path, csv: Path, events: Path) -> list[str]:
    return [sys.executable, "-m", "monitor", "replay", "--config", str(config), "--input", str(csv),
            "--events", str(events)]  # fmt: skip


def holder_named(state: Path, pid: int, command: str) -> bool:
    """The lock file names `pid`: written once the lock is taken."""
    try:
        return (state / LOCK_FILE).read_text() == f"{pid} {command}\n"
    except FileNotFoundError:
        return False


def refusal(result: subprocess.CompletedProcess[str], state: Path, pid: int, command: str) -> str:
    """The one line a refused command ends with; asserts the exit code and what it names."""
    assert result.returncode == EXIT_IN_USE, result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"state dir {state} is in use by pid {pid} ({command})" in line, line
    assert "one daemon (or replay) per state dir" in line
    return line


def files(state: Path) -> dict[str, bytes]:
    """The state dir's files, but the running daemon's own heartbeat (`clock.json`, rewritten
    by the daemon on its own schedule while the test looks: not the refused command's)."""
    return {p.name: p.read_bytes() for p in sorted(state.iterdir()) if p.is_file() and p.name != "clock.json"}


@pytest.fixture
def daemon_state(tmp_path: Path) -> Iterator[tuple[Path, Path, int]]:
    """A `monitor run` up on its own state dir: (config, state dir, pid); stopped cleanly."""
    state = tmp_path / "state"
    config = write_config(tmp_path / "station.yaml", state)
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: "running: 1 sensor(s)" in daemon.text(), timeout=DEADLINE, what="daemon up")
        assert holder_named(state, daemon.proc.pid, "monitor run")
        yield config, state, daemon.proc.pid
        assert daemon.proc.poll() is None, "the daemon did not survive"
        log = daemon.stop()
        assert " ERROR " not in log, log


def test_a_second_monitor_run_is_refused_and_the_first_runs_on_with_readers_beside_it(
    daemon_state: tuple[Path, Path, int], tmp_path: Path
) -> None:
    config, state, pid = daemon_state
    second = monitor("run", "--config", str(config))
    line = refusal(second, state, pid, "monitor run")
    assert "cannot start" in line
    # The same state dir through another config file: the lock is on the directory.
    other = write_config(tmp_path / "copy.yaml", state)
    refusal(monitor("run", "--config", str(other)), state, pid, "monitor run")
    # Readers and appenders are made to work beside the daemon: they take no lock.
    listed = monitor("incidents", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert holder_named(state, pid, "monitor run")  # the refused ones rewrote nothing


def test_a_reload_onto_another_state_dir_is_refused_and_the_running_config_stays(
    tmp_path: Path,
) -> None:
    state, moved = tmp_path / "state", tmp_path / "moved"
    config = write_config(tmp_path / "station.yaml", state)
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: "running: 1 sensor(s)" in daemon.text(), timeout=DEADLINE, what="daemon up")
        write_config(config, moved)
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload of" in daemon.text(), timeout=DEADLINE, what="the reload's answer")
        assert f"state_dir changed ({state} -> {moved})" in daemon.text()
        assert not moved.exists()
        # Still the one daemon on `state`: a second one there is refused.
        write_config(config, state)
        refusal(monitor("run", "--config", str(config)), state, daemon.proc.pid, "monitor run")
        log = daemon.stop()
    assert log.count("running: 1 sensor(s)") == 1  # no second daemon was started by the reload


def test_after_the_holder_is_sigkilled_the_next_daemon_starts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "station.yaml", state)
    first = spawn_daemon(config, tmp_path / "first.log")
    try:
        wait_until(lambda: "running: 1 sensor(s)" in first.text(), timeout=DEADLINE, what="first up")
        first.proc.kill()
        assert first.proc.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
            first.proc.wait()
    assert (state / LOCK_FILE).read_text() == f"{first.proc.pid} monitor run\n"  # left behind: not the truth
    with running_daemon(config, tmp_path / "second.log") as second:
        wait_until(lambda: "running: 1 sensor(s)" in second.text(), timeout=DEADLINE, what="second up")
        assert holder_named(state, second.proc.pid, "monitor run")
        second.stop()


def test_a_replay_into_a_running_daemons_state_dir_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "station.yaml", state)
    csv, events = ph_excursion(tmp_path / "ph.csv"), tmp_path / "events.jsonl"
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        wait_until(lambda: "running: 1 sensor(s)" in daemon.text(), timeout=DEADLINE, what="daemon up")
        before = files(state)
        assert "incidents.sqlite" in before
        refused = subprocess.run(replay(config, csv, events), capture_output=True, text=True, cwd=ROOT)
        line = refusal(refused, state, daemon.proc.pid, "monitor run")
        assert line.startswith("replay: ")
        assert files(state) == before  # incidents.sqlite and its WAL, the journal, the ledger: as they were
        assert not events.exists()
        # What does not write into state_dir is not refused: --what-if, and --from-influx (not here).
        what_if = monitor("replay", "--config", str(config), "--input", str(csv), "--what-if", str(config))
        assert what_if.returncode == 0, what_if.stderr
        daemon.stop()
    store = IncidentStore(state)
    try:
        assert store.incidents() == []
    finally:
        store.close()
    # With the daemon stopped the same replay runs, and records the incident it was refused.
    done = subprocess.run(replay(config, csv, events), capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    store = IncidentStore(state)
    try:
        assert len(store.incidents()) == 1
    finally:
        store.close()


def _stopped_replay_holding(config: Path, csv: Path, events: Path, state: Path) -> subprocess.Popen[bytes]:
    """A replay started, seen holding the lock with its incident worker forked, then SIGSTOPped
    so that it cannot finish while the test works with it."""
    proc = subprocess.Popen(replay(config, csv, events), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(
        lambda: (
            (holder_named(state, proc.pid, "monitor replay") and bool(_descendants(proc.pid)))
            or proc.poll() is not None
        ),
        timeout=DEADLINE,
        what="the replay holding the lock with its worker",
    )
    os.kill(proc.pid, signal.SIGSTOP)
    assert proc.poll() is None, "the replay ended before the test could stop it: make the data longer"
    return proc


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def test_two_replays_at_once_into_one_state_dir_the_second_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    csv, config = write_chattering(tmp_path, state)
    first = _stopped_replay_holding(config, csv, tmp_path / "first.jsonl", state)
    try:
        second = subprocess.run(
            replay(config, csv, tmp_path / "second.jsonl"), capture_output=True, text=True, cwd=ROOT
        )
        refusal(second, state, first.pid, "monitor replay")
        assert not (tmp_path / "second.jsonl").exists()
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=DEADLINE * 4)
        assert first.returncode == 0, err.decode()
    finally:
        _reap(first)
    # Released at the end of the replay: the next one runs.
    again = subprocess.run(replay(config, csv, tmp_path / "again.jsonl"), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


def test_a_sigkilled_replays_orphaned_helpers_do_not_keep_the_lock(tmp_path: Path) -> None:
    """The incident worker and its freezer process, forked by the replay, stopped (SIGSTOP) so
    that they outlive it for certain: an flock() they inherited would still be held; the
    replay's POSIX lock went with the replay."""
    state = tmp_path / "state"
    csv, config = write_chattering(tmp_path, state)
    proc = _stopped_replay_holding(config, csv, tmp_path / "killed.jsonl", state)
    helpers: list[int] = []
    try:
        helpers = _descendants(proc.pid)
        assert helpers
        for pid in helpers:
            os.kill(pid, signal.SIGSTOP)
        proc.kill()
        assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL
        assert all(_running(pid) for pid in helpers)  # orphans, alive, the lock file open in each
        lock = hold_state_dir(state, "the test")
        try:
            assert lock.guarded
        finally:
            lock.release()
    finally:
        _reap(proc)
        for pid in helpers:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(_running(p) for p in helpers), timeout=DEADLINE, what="the helpers gone")


HOLD = (
    "import sys\nfrom pathlib import Path\nfrom monitor.statelock import StateDirInUseError, hold_state_dir\n"
    "try:\n    hold_state_dir(Path(sys.argv[1]), 'probe')\nexcept StateDirInUseError as exc:\n"
    "    print(exc)\n    sys.exit(75)\n"
)


def test_holding_again_in_the_same_process_keeps_the_one_lock_until_the_last_release(tmp_path: Path) -> None:
    """Opening the lock file a second time, then closing it, would drop this process's POSIX
    lock: a second hold in the process shares the first's descriptor instead."""
    state = tmp_path / "new" / "state"  # not there yet: created

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", HOLD, str(state)], capture_output=True, text=True, cwd=ROOT
        )

    lock = hold_state_dir(state, "monitor run")
    assert state.is_dir() and lock.guarded
    again = hold_state_dir(state, "monitor run")
    assert again is lock
    again.release()
    held = probe()
    assert held.returncode == 75 and f"pid {os.getpid()} (monitor run)" in held.stdout, held
    lock.release()
    assert probe().returncode == 0


def test_a_file_system_without_locks_is_warned_about_once_and_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fake: `fcntl.lockf` raising ENOLCK, as some NFS and FUSE mounts answer."""

    def no_locks(fd: int, cmd: int, *args: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    monkeypatch.setattr(statelock, "_warned", set())
    state = tmp_path / "state"
    with caplog.at_level(logging.WARNING, logger="monitor.statelock"):
        for _ in range(2):
            lock = hold_state_dir(state, "monitor run")
            assert not lock.guarded
            lock.release()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert str(state) in warned[0] and "without the one-daemon-per-state-dir guard" in warned[0]
    assert os.strerror(errno.ENOLCK) in warned[0]


def test_the_refusal_names_the_holder_from_the_kernel_not_from_the_file(tmp_path: Path) -> None:
    """A lock file left by a dead holder names it; the refusal names the live one (from
    F_GETLK), with its process name since the file does not name it."""
    state = tmp_path / "state"
    state.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD + "print('held', flush=True)\nsys.stdin.read()\n", str(state)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        (state / LOCK_FILE).write_text("1 monitor run\n")  # stale text; the lock stays (another process)
        with pytest.raises(StateDirInUseError) as refused:
            hold_state_dir(state, "monitor run")
        assert f"pid {holder.pid} (python" in str(refused.value)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=DEADLINE)
        if holder.stdout is not None:
            holder.stdout.close()
    assert holder.returncode == 0


def test_a_demo_on_a_state_dir_in_use_is_refused_before_it_starts_anything(tmp_path: Path) -> None:
    state = tmp_path / "state"
    lock = hold_state_dir(state, "monitor run")
    try:
        demo = monitor(
            "demo", "--state-dir", str(state), "--modbus-port", "0", "--port", "0", "--duration", "1"
        )
    finally:
        lock.release()
    line = refusal(demo, state, os.getpid(), "monitor run")
    assert line.startswith("demo: ") and "console" not in demo.stdout
    assert sorted(p.name for p in state.iterdir()) == [LOCK_FILE]  # nothing of its own written


def test_only_a_replay_that_writes_into_state_dir_takes_the_lock(tmp_path: Path) -> None:
    """What the replay would write decides; from the historian nothing (the live run did)."""
    influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"}
    config = build_config({**station(tmp_path / "state"), "influx": influx})

    def writes(from_influx: bool = False, no_incidents: bool = False, no_ledger: bool = False) -> set[str]:
        args = argparse.Namespace(from_influx=from_influx, no_incidents=no_incidents, no_ledger=no_ledger)
        return set(state_writes(args, config))

    assert writes() == {"incidents", "outbox"}  # no meter, no wet well in this station
    assert writes(no_incidents=True, no_ledger=True) == {"outbox"}
    assert writes(from_influx=True) == set()


@pytest.fixture
def read_only_state(tmp_path: Path) -> Iterator[Path]:
    """A state dir on a read-only bind mount (needs root, as tests/test_readonly_disk.py)."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(state)], check=True)
        yield state
    finally:
        subprocess.run(["umount", str(state)], check=True)


def test_a_read_only_state_dir_is_reported_by_the_stores_as_before_not_as_in_use(
    tmp_path: Path, read_only_state: Path
) -> None:
    config = write_config(tmp_path / "station.yaml", read_only_state)
    result = monitor("run", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "not locked (monitor.lock: cannot open it: Read-only file system)" in result.stderr
    assert f"cannot run: alarm journal {read_only_state / 'journal.sqlite'}" in result.stderr.splitlines()[-1]
