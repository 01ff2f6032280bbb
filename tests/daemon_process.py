"""`monitor run` (or another long-running `monitor` command) as its own process, for the
tests that start it: output appended to a log file, stopped with SIGTERM and a checked exit
code, and never outliving the test, whatever fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL = 3000  # characters of the log a failure report quotes


@dataclass
class DaemonProcess:
    """A started daemon; `proc` is there for signals of a test's own (SIGKILL, SIGHUP, SIGSTOP)."""

    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, timeout: float = 60) -> str:
        """SIGTERM, as systemd stops it; asserts a clean exit within `timeout` and returns the log."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        assert code == 0, f"exit {code}; log:\n{self.text()[-TAIL:]}"
        return self.text()


def spawn_daemon(
    config: Path,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    command: Sequence[str] = ("run",),
    options: Sequence[str] = (),
) -> DaemonProcess:
    """`python -m monitor [options] command --config CONFIG [extra_args]`, its stdout and
    stderr appended to `log`, `env` on top of this process's environment. The caller reaps
    it: `running_daemon` does, a test that kills and restarts in a loop does its own."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", *options, *command, "--config", str(config), *extra_args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip
    return DaemonProcess(proc, log)


@contextmanager
def running_daemon(
    config: Path,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    command: Sequence[str] = ("run",),
    options: Sequence[str] = (),
    grace: float = 30,
) -> Iterator[DaemonProcess]:
    """`spawn_daemon`, and on the way out a daemon still running gets SIGTERM and `grace`
    seconds before SIGKILL (no exit code checked: that is `stop()`'s). A failure inside
    carries the log's tail and the exit code, so a timed-out wait says what the daemon did."""
    daemon = spawn_daemon(config, log, env=env, extra_args=extra_args, command=command, options=options)
    proc = daemon.proc
    try:
        yield daemon
    except Exception as exc:
        code = proc.poll()
        state = "still running" if code is None else f"exit {code}"
        tail = log.read_text(errors="replace")[-TAIL:]
        exc.add_note(f"monitor {' '.join(command)} --config {config} ({state}) logged:\n{tail}")
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
