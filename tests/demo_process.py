"""`monitor demo` as a newcomer runs it, for the demo tests: started with its output
collected line by line, stopped with Ctrl-C, and killed and reaped whatever happens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class DemoRun:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.lines)

    def stop(self) -> str:
        """Ctrl-C, as the demo's banner says; asserts a clean exit and returns all it printed."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=60) == 0
        self._reader.join(timeout=5)
        return self.text()

    _reader: threading.Thread = field(init=False)


@contextmanager
def running_demo(speed: str, state_dir: Path) -> Iterator[DemoRun]:
    """A demo on free ports at `speed`; a wait that times out inside says what the demo
    printed, and the process never outlives the test."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "demo", "--speed", speed, "--duration", "300",
         "--port", str(free_port()), "--modbus-port", "0", "--state-dir", str(state_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    run = DemoRun(proc)

    def read() -> None:
        assert proc.stdout is not None
        run.lines.extend(proc.stdout)

    run._reader = threading.Thread(target=read, daemon=True)
    run._reader.start()
    try:
        yield run
    except TimeoutError as exc:  # say what the demo said
        raise AssertionError(f"{exc}; the demo (exit {proc.poll()}) printed:\n{run.text()[-3000:]}") from exc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        run._reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
