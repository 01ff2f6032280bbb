"""The README's "first real device in ten minutes", step by step as written, against the
simulator in place of a PLC (its own process on a free port, as the README's step 2)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.cli import run_monitor
from tests.services import free_port, port_open, simulator_process, wait_until
from tests.test_docs import fenced

ROOT = Path(__file__).resolve().parent.parent


def steps() -> list[str]:
    """The sh blocks of the README's first-device section, in order."""
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("## A first real device")
    end = text.index("\n## ", start + 1)
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1
    return [body for line, info, body in fenced(readme) if info == "sh" and first < line < last]


def test_the_first_device_steps_work_as_written(tmp_path: Path) -> None:
    install, simulator, copy, check, run = steps()
    assert install.strip() == "scripts/bootstrap.sh python"  # the venv these tests run in
    assert re.fullmatch(r"\.venv/bin/python -m simulators\.modbus_server --port 5020", simulator.strip())
    monitor = f"{sys.executable} -m monitor"
    with simulator_process() as sim:
        # Step 3 as written, then the edit the reader makes: this device's port (and a free
        # console port, since 8080 may be taken on a shared machine).
        subprocess.run(copy.replace("config/", f"{ROOT}/config/"), shell=True, cwd=tmp_path, check=True)
        config = tmp_path / "station.yaml"
        console = free_port()
        text = config.read_text().replace("port: 5020", f"port: {sim.port}")
        config.write_text(text + f"console: {{port: {console}}}\n")
        for line in check.strip().splitlines():
            program, *argv = shlex.split(line)
            assert program == ".venv/bin/monitor", line
            result = run_monitor(*argv, cwd=tmp_path)
            assert result.returncode == 0, (line, result.stdout, result.stderr)
            if "modbus read" in line:
                assert "outfall.ph" in result.stdout and "GOOD" in result.stdout, result.stdout
        # Its log to a file, not a pipe: a pipe read only after the exit would stop a daemon
        # that logs more than the pipe holds (64 KiB) while the test waits on it.
        log_file = tmp_path / "daemon.log"
        with log_file.open("w", encoding="utf-8") as err:
            daemon = subprocess.Popen(
                run.strip().replace(".venv/bin/monitor", monitor).split(), cwd=tmp_path,
                stdout=subprocess.DEVNULL, stderr=err, text=True, env=dict(os.environ),
            )  # fmt: skip
        try:
            wait_until(lambda: port_open(console), timeout=60, what="the console")

            def ph_read() -> bool:
                with urllib.request.urlopen(f"http://127.0.0.1:{console}/api/sensors", timeout=5) as r:
                    return any(
                        s["id"] == "outfall.ph" and s["value"] is not None for s in json.loads(r.read())
                    )

            wait_until(ph_read, timeout=30, what="a pH reading on the console")
            daemon.send_signal(signal.SIGINT)  # "Ctrl-C stops it cleanly"
            assert daemon.wait(timeout=30) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(timeout=30)
        log = log_file.read_text(encoding="utf-8")
        assert "Traceback" not in log
        assert (tmp_path / "state").is_dir()  # "the state ... is in state/ beside the config"
