"""`monitor <command>` run inside the test's own process, as `python -m monitor` would run it.

A new interpreter costs 0.6-1.1 s of start-up and imports (pydantic, numpy, pyarrow) for
a command whose own work is usually under 0.1 s; ~260 such calls were half the suite's
CPU. `run_monitor` calls `monitor.cli.main(argv)` here instead and gives back what the
process would have: the exit code (argparse's and our `SystemExit(2)` included, an
uncaught exception as a traceback on stderr and exit 1), stdout and stderr as text with
the newlines a text-mode pipe gives, the log lines in stderr.

Whatever a command changes in the process is put back afterwards, so tests stay
independent under xdist: environment, working directory, sys.argv and the three
standard streams, the root logger's handlers and level and every existing logger's,
signal handlers, the asyncio loop policy and the umask. A command that leaves a file
or a thread behind fails the test: a process's exit would hide that, a test process
(or the daemon, which runs these parts for months) would not.

The entry point itself (`monitor --version`, `--help`, the installed script) is still
tested in real processes: tests/test_cli.py and tests/test_docs.py say which.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGPIPE")
)
THREAD_GRACE = 10.0  # seconds a command's own thread may take to finish after it returned


def run_monitor(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`monitor *args` in this process; `env` is laid over os.environ (None unsets a name).

    Like `subprocess.run([..., "-m", "monitor", *args], capture_output=True, text=True,
    cwd=cwd, input=input)`, without the new interpreter. A hung command is stopped by
    pytest-timeout, as a hung subprocess would be by its timeout."""
    stdout, stderr = _stream("strict"), _stream("backslashreplace")  # as Python sets its own
    stdin = io.TextIOWrapper(io.BytesIO((input or "").encode("utf-8")), encoding="utf-8")
    with _restored(env, cwd) as leftovers:
        sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        sys.argv = ["monitor", *args]
        code = _call(list(args))
        sys.stdout.flush()
        sys.stderr.flush()
    out, err = _text(stdout), _text(stderr)
    leftovers.check(args, err)
    return subprocess.CompletedProcess(["monitor", *args], code, out, err)


def _call(argv: list[str]) -> int:
    """main(argv) with the exit code the interpreter would give its process."""
    from monitor.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except Exception as exc:  # the interpreter prints an uncaught exception and exits 1
        traceback.print_exception(exc, file=sys.stderr)
        return 1


def _stream(errors: str) -> io.TextIOWrapper:
    """A text stream over bytes, like a pipe's: `.buffer` works, `isatty()` is False."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    """What `subprocess.run(text=True)` reads: universal newlines (csv's \\r\\n becomes \\n)."""
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@dataclass
class _Leftovers:
    """Files and threads a command opened and did not close or end."""

    fds: set[str]
    threads: list[threading.Thread]

    def check(self, args: tuple[str, ...], stderr: str) -> None:
        alive = [t for t in self.threads if t.is_alive()]
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not any(t.is_alive() for t in alive), THREAD_GRACE, "the command's threads")
        still = sorted(t.name for t in alive if t.is_alive())
        where = f"monitor {' '.join(args)}"
        assert not self.fds, f"{where} left open: {sorted(self.fds)}\n{stderr}"
        assert not still, f"{where} left running: {still}\n{stderr}"


@contextlib.contextmanager
def _restored(env: Mapping[str, str | None] | None, cwd: str | Path | None) -> Iterator[_Leftovers]:
    """Every piece of process state a command may change, put back afterwards."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr, sys.argv)
    loggers = _logger_state()
    disabled = logging.root.manager.disable
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    policy = asyncio.get_event_loop_policy()
    umask = os.umask(0o022)
    os.umask(umask)
    files = _open_files()
    threads = set(threading.enumerate())
    leftovers = _Leftovers(set(), [])
    try:
        for name, value in (env or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if cwd is not None:
            os.chdir(cwd)
        yield leftovers
    finally:
        sys.stdin, sys.stdout, sys.stderr, sys.argv = saved_streams
        os.chdir(saved_cwd)
        for name in set(os.environ) - set(saved_env):
            del os.environ[name]
        for name, value in saved_env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        for handler in logging.root.handlers:
            if handler not in loggers[""][0]:
                handler.close()
        _restore_loggers(loggers)
        logging.disable(disabled)
        for sig, previous in handlers.items():
            if signal.getsignal(sig) is not previous and previous is not None:
                signal.signal(sig, previous)
        asyncio.set_event_loop_policy(policy)
        os.umask(umask)
        gc.collect()  # what only a reference cycle still held is closed here, as at exit
        leftovers.fds = _open_files() - files
        leftovers.threads = [t for t in threading.enumerate() if t not in threads]


_LoggerState = tuple[list[logging.Handler], int, bool, bool]


def _logger_state() -> dict[str, _LoggerState]:
    """Handlers, level, propagate and disabled of the root logger ("") and every named one."""
    loggers = {"": logging.root, **logging.root.manager.loggerDict}
    return {
        name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled)
        for name, lg in loggers.items()
        if isinstance(lg, logging.Logger)
    }


def _restore_loggers(state: dict[str, _LoggerState]) -> None:
    for name, (handlers, level, propagate, disabled) in state.items():
        lg = logging.getLogger(name or None)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


def _open_files() -> set[str]:
    """Regular files this process holds open (sockets and pipes belong to servers and pytest)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/") and not target.startswith(("/dev/", "/proc/")):
                out.add(f"{fd} -> {target}")
    return out
