"""Start-up time of the `monitor` command, against the interpreter it runs on.

`monitor --version` is what a shell completion, a health script or an operator
typing the wrong command pays every time; `check-config` is what every command
that reads a station config pays on top (the typed config); `monitor run` is
what a restart costs the station (start-up to READY=1, SIGTERM to exit). The
peers, measured in the same run: a bare `python -c pass` (the floor no Python
command can beat), `import pydantic` (the floor of any command that validates a
config) and the start-up the command had when it imported every subcommand.

    python -m bench.cli [--runs 20]

Each figure is the median over `--runs`: wall time, and the CPU time (user +
system) the child used, which moves far less than wall time on a busy machine.
`monitor run` is timed on a generated config (the minimal station, its Modbus
device on a closed loopback port, the console on a free port, a fresh state
directory per run): READY=1 arrives on a NOTIFY_SOCKET as systemd would see it.

Whether the project's own modules have cached bytecode (`__pycache__`) changes
every figure; the run says which it measured (PYTHONDONTWRITEBYTECODE keeps an
editable install compiling from source at every start).

Target (issue 14): `monitor --version` under 150 ms (median).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MONITOR = [sys.executable, "-m", "monitor"]

CASES = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "python -c 'import pydantic' (peer)": [sys.executable, "-c", "import pydantic"],
    "monitor --version": [*MONITOR, "--version"],
    "monitor billing rate": [*MONITOR, "billing", "rate", "--budget", "1000", "--prior-year-kcf", "100"],
    "monitor check-config minimal.yaml": [*MONITOR, "check-config", "config/minimal.yaml"],
    "monitor check-config station.example.yaml": [
        *MONITOR, "check-config", "--env-file", "config/example.env", "config/station.example.yaml"
    ],
    "every command imported (old start-up)": [
        sys.executable, "-c", "from monitor.cli import build_parser; build_parser()"
    ],
}  # fmt: skip


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run of `command`."""
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def daemon_config(directory: Path) -> Path:
    """The minimal station with nothing listening on its Modbus port, console on a free port."""
    config = yaml.safe_load((ROOT / "config" / "minimal.yaml").read_text(encoding="utf-8"))
    config["modbus"]["devices"][0]["port"] = free_port()  # closed: each poll is refused at once
    config["console"] = {"host": "127.0.0.1", "port": free_port()}
    config["state_dir"] = str(directory / "state")
    path = directory / "station.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def run_once() -> tuple[float, float, float]:
    """`monitor run`: seconds from spawn to READY=1, from SIGTERM to exit, and CPU seconds."""
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        directory = Path(tmp)
        config = daemon_config(directory)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(directory / "notify.sock"))
            notify.settimeout(60)
            env = {**os.environ, "NOTIFY_SOCKET": str(directory / "notify.sock")}
            start = time.perf_counter()
            child = subprocess.Popen(
                [*MONITOR, "run", "--config", str(config)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                while b"READY=1" not in notify.recv(4096).split(b"\n"):
                    pass
            except TimeoutError:
                child.kill()
                child.wait()
                raise SystemExit("monitor run sent no READY=1 within 60 s") from None
            ready = time.perf_counter() - start
            stopping = time.perf_counter()
            child.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(child.pid, 0)
            stopped = time.perf_counter() - stopping
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode != 0:
                raise SystemExit(f"monitor run exited {child.returncode}")
    return ready, stopped, usage.ru_utime + usage.ru_stime


def bytecode_cached() -> bool:
    return (ROOT / "monitor" / "config" / "__pycache__").is_dir()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (the median is shown)")
    parser.add_argument("--daemon-runs", type=int, default=5, help="runs of `monitor run` to ready and stop")
    args = parser.parse_args()
    print(f"load {load()}; monitor bytecode cached: {'yes' if bytecode_cached() else 'no'}")
    figures: dict[str, tuple[float, float]] = {}
    for name, cmd in CASES.items():
        runs = [timed(cmd) for _ in range(args.runs)]
        figures[name] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
    floor_wall, floor_cpu = figures["python -c pass (floor)"]
    print(f"{'median of ' + str(args.runs):44} {'wall':>9} {'':>11} {'cpu':>9}")
    for name, (wall, cpu) in figures.items():
        print(
            f"{name:44} {wall * 1e3:6.1f} ms {wall / floor_wall:5.1f}x floor"
            f" {cpu * 1e3:6.1f} ms {cpu / floor_cpu:5.1f}x floor"
        )
    daemon = [run_once() for _ in range(args.daemon_runs)]
    ready = statistics.median(r for r, _, _ in daemon)
    stop = statistics.median(s for _, s, _ in daemon)
    cpu = statistics.median(c for _, _, c in daemon)
    print(
        f"{'monitor run: start to READY=1':44} {ready * 1e3:6.1f} ms {ready / floor_wall:5.1f}x floor"
        f" (cpu for the whole run {cpu * 1e3:.0f} ms)"
    )
    print(f"{'monitor run: SIGTERM to exit':44} {stop * 1e3:6.1f} ms")
    version = figures["monitor --version"][0] * 1e3
    verdict = "met" if version < 150 else "MISSED"
    print(f"target: monitor --version under 150 ms: {verdict} ({version:.0f} ms); load {load()}")


if __name__ == "__main__":
    main()
