"""tests/cli.py's `run_monitor`: what `python -m monitor` gives, and the process left as it was.

Most tests here run real commands. Where a test needs a command that does something
no real command does on demand (raise, read stdin, leave a file open, change signal
handlers), it swaps `monitor profile`'s `run` for a small function, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import monitor.commands.profile
from tests.cli import ROOT, run_monitor

RATE = ("billing", "rate", "--budget", "1000", "--prior-year-kcf", "100")


def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text("station: {id: ps-1, name: X}\nsensors:\n  - {id: a.flow, kind: flow, unit: furlongs}\n")
    return path


def test_the_same_code_and_streams_as_the_real_process(tmp_path: Path) -> None:
    """The entry point in a real interpreter (`python -m monitor`): the version, a
    command's output, and a config error that exits 2, each equal in process."""
    for argv in (["--version"], list(RATE), ["check-config", str(bad_config(tmp_path))]):
        real = subprocess.run(
            [sys.executable, "-m", "monitor", *argv], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        here = run_monitor(*argv, cwd=ROOT)
        assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)
    assert real.returncode == 2 and "sensors[0].unit" in real.stderr


def test_exit_codes_of_argparse_and_of_the_commands(tmp_path: Path) -> None:
    assert run_monitor("--version").returncode == 0
    typo = run_monitor("chek-config")
    assert typo.returncode == 2 and "invalid choice: 'chek-config'" in typo.stderr and typo.stdout == ""
    missing = run_monitor("billing", "rate")
    assert missing.returncode == 2 and "--budget" in missing.stderr
    rate = run_monitor(*RATE)
    assert rate.returncode == 0 and "rate_per_kcf: 10.00" in rate.stdout and rate.stderr == ""
    bad = run_monitor("check-config", str(bad_config(tmp_path)))
    assert bad.returncode == 2 and "sensors[0].unit" in bad.stderr


def test_env_overlay_and_unset_are_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "s.yaml"
    config.write_text(
        "station: {id: ps-1, name: X}\nsensors: [{id: a.ph, kind: ph}]\n"
        "mqtt: {host: 127.0.0.1, username: u, password: '${HELPER_PW}'}\n"
    )
    monkeypatch.delenv("HELPER_PW", raising=False)
    assert run_monitor("check-config", str(config)).returncode == 2
    assert run_monitor("check-config", str(config), env={"HELPER_PW": "pw"}).returncode == 0
    assert "HELPER_PW" not in os.environ
    monkeypatch.setenv("HELPER_PW", "pw")
    unset = run_monitor("check-config", str(config), env={"HELPER_PW": None})
    assert unset.returncode == 2 and "HELPER_PW" in unset.stderr
    assert os.environ["HELPER_PW"] == "pw"
    # --env-file writes into os.environ, as it does in the real process; undone afterwards.
    monkeypatch.delenv("HELPER_PW")
    (tmp_path / "secrets.env").write_text("HELPER_PW=pw\n")
    assert (
        run_monitor("check-config", "--env-file", str(tmp_path / "secrets.env"), str(config)).returncode == 0
    )
    assert "HELPER_PW" not in os.environ


def test_cwd_is_the_commands_and_is_put_back(tmp_path: Path) -> None:
    before = os.getcwd()
    assert run_monitor("check-config", "config/minimal.yaml", cwd=ROOT).returncode == 0
    away = run_monitor("check-config", "config/minimal.yaml", cwd=tmp_path)
    assert away.returncode == 2 and "config/minimal.yaml" in away.stderr
    assert os.getcwd() == before


def test_logging_lands_in_stderr_and_the_root_logger_is_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in command that logs (no one-shot command logs on demand)."""

    def run(args: argparse.Namespace) -> int:
        logging.getLogger("monitor.helper").warning("pump %d stalled", 2)
        logging.getLogger("monitor.helper").debug("not shown at INFO")
        return 0

    monkeypatch.setattr(monitor.commands.profile, "run", run)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    plain = run_monitor("profile")
    assert "WARNING monitor.helper: pump 2 stalled" in plain.stderr and "not shown" not in plain.stderr
    assert plain.stdout == ""
    as_json = run_monitor("--log-json", "--log-level", "debug", "profile")
    lines = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert [(r["level"], r["message"]) for r in lines] == [
        ("WARNING", "pump 2 stalled"),
        ("DEBUG", "not shown at INFO"),
    ]
    assert (root.handlers, root.level) == (handlers, level)


def test_an_exception_in_a_command_is_a_traceback_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in command that raises: the interpreter's report, as the real process prints it."""

    def run(args: argparse.Namespace) -> int:
        raise RuntimeError("the ledger is on fire")

    monkeypatch.setattr(monitor.commands.profile, "run", run)
    result = run_monitor("profile")
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert result.stderr.endswith("RuntimeError: the ledger is on fire\n")


def test_a_system_exit_with_a_message_is_exit_1_and_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in command that exits as `sys.exit("...")` does."""

    def run(args: argparse.Namespace) -> int:
        print("half", end="")
        sys.exit("cannot go on")

    monkeypatch.setattr(monitor.commands.profile, "run", run)
    result = run_monitor("profile")
    assert (result.returncode, result.stdout, result.stderr) == (1, "half", "cannot go on\n")


def test_stdin_and_newlines_as_a_text_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in command that echoes stdin (no command reads it today) and writes
    CSV's \\r\\n, which a text-mode pipe reads as \\n."""

    def run(args: argparse.Namespace) -> int:
        data = sys.stdin.read()
        sys.stdout.write(data.upper() + "a,b\r\n")
        sys.stdout.buffer.write(b"raw\n")
        return 3

    monkeypatch.setattr(monitor.commands.profile, "run", run)
    result = run_monitor("profile", input="ph 7\n")
    assert (result.returncode, result.stdout) == (3, "PH 7\na,b\nraw\n")
    assert run_monitor("profile").stdout == "a,b\nraw\n"  # no input: an empty stdin, not the test's


def test_process_state_a_command_changes_is_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in command that changes what `monitor run` changes, and more."""

    def run(args: argparse.Namespace) -> int:
        os.umask(0o077)
        signal.signal(signal.SIGHUP, lambda *_: None)
        asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
        logging.getLogger("pymodbus").setLevel(logging.CRITICAL)
        logging.disable(logging.ERROR)
        return 0

    monkeypatch.setattr(monitor.commands.profile, "run", run)
    # A known level that is not the stand-in's (an earlier test in this worker may have left
    # pymodbus at CRITICAL: the daemon's own modbus source sets it).
    pymodbus = logging.getLogger("pymodbus")
    monkeypatch.setattr(pymodbus, "level", logging.WARNING)
    umask = os.umask(0o022)
    os.umask(umask)
    hup, policy = signal.getsignal(signal.SIGHUP), asyncio.get_event_loop_policy()
    assert run_monitor("profile").returncode == 0
    now = os.umask(0o022)
    os.umask(now)
    assert (now, signal.getsignal(signal.SIGHUP), asyncio.get_event_loop_policy()) == (umask, hup, policy)
    assert logging.getLogger("pymodbus").level == logging.WARNING
    assert logging.root.manager.disable == logging.NOTSET


def test_a_file_or_thread_left_behind_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in commands that leak: a real process's exit would hide it, the test does not."""
    kept: list[object] = []
    stop = threading.Event()

    def leaks_a_file(args: argparse.Namespace) -> int:
        kept.append((tmp_path / "ledger.sqlite").open("w"))
        return 0

    monkeypatch.setattr(monitor.commands.profile, "run", leaks_a_file)
    with pytest.raises(AssertionError, match=r"monitor profile left open: .*ledger\.sqlite"):
        run_monitor("profile")
    kept.pop().close()  # type: ignore[attr-defined]

    def leaks_a_thread(args: argparse.Namespace) -> int:
        threading.Thread(target=stop.wait, name="drainer", daemon=True).start()
        return 0

    monkeypatch.setattr(monitor.commands.profile, "run", leaks_a_thread)
    monkeypatch.setattr("tests.cli.THREAD_GRACE", 0.1)
    try:
        with pytest.raises(AssertionError, match=r"left running: \['drainer'\]"):
            run_monitor("profile")
    finally:
        stop.set()
