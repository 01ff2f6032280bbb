"""Start-up of `monitor replay`, against the libraries no columnar replay can start without.

    python -m bench.startup [--runs 16]

`monitor replay` on a 100-row CSV is nearly all start-up: the interpreter, the imports
(NumPy, pyarrow, pydantic, the config's models, the engine), the config validated, the
state dir locked; with incidents (the default) the worker process is forked as well. The
peer, measured in the same run: `python -c "import pyarrow, numpy"` with one OpenBLAS
thread, as the monitor imports NumPy (a plain `import numpy` starts a spinning thread per
core), the floor any replay of Parquet or CSV through them starts from. Also shown: a bare
`python -c pass`.

Each case runs once to warm up (the project's bytecode cached, as `make test` and users
have it: PYTHONDONTWRITEBYTECODE is dropped for the children), then `--runs` times, the
cases taken in turn each round so a busy spell hits all of them. Figures: CPU (user +
system of the child, `os.wait4`; moves far less than wall time on a shared machine) and
wall, median and min; the ratio is the replay's median CPU over the peer's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PEER = "python -c 'import pyarrow, numpy' (peer)"
ROWS = 100


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one run of `command`."""
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None
    errors = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{errors.decode(errors='replace')}")
    return usage.ru_utime + usage.ru_stime, wall


def station(directory: Path) -> tuple[Path, Path]:
    """The minimal station with a state dir of its own, and a 100-row CSV of its two sensors."""
    config = yaml.safe_load((ROOT / "config" / "minimal.yaml").read_text(encoding="utf-8"))
    config["state_dir"] = str(directory / "state")
    path = directory / "station.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    sensors = [s["id"] for s in config["sensors"]]
    rows = [
        f"{1_780_000_000 + 10 * (i // len(sensors))},{sensors[i % len(sensors)]},{7 + i % 3}"
        for i in range(ROWS)
    ]
    samples = directory / "samples.csv"
    samples.write_text("time,sensor,value\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16, help="runs of each case (median and min shown)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        config, samples = station(Path(tmp))
        replay = [sys.executable, "-m", "monitor", "replay", "--config", str(config), "--input", str(samples)]
        events = ["--events", str(Path(tmp) / "events.jsonl")]
        cases = {
            "python -c pass (interpreter)": ([sys.executable, "-c", "pass"], env),
            PEER: ([sys.executable, "-c", "import pyarrow, numpy"], {**env, "OPENBLAS_NUM_THREADS": "1"}),
            f"monitor replay --no-incidents, {ROWS} rows": ([*replay, *events, "--no-incidents"], env),
            f"monitor replay, {ROWS} rows (incident worker)": ([*replay, *events], env),
        }
        for command, case_env in cases.values():
            timed(command, case_env)  # warm-up: bytecode written, files cached
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, (command, case_env) in cases.items():
                runs[name].append(timed(command, case_env))
    peer = statistics.median(cpu for cpu, _ in runs[PEER])
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.runs} runs each, alternated")
    print(f"{'':48} {'cpu median':>10} {'min':>7} {'wall median':>11} {'min':>7}  cpu / peer")
    for name, figures in runs.items():
        cpu = [c for c, _ in figures]
        wall = [w for _, w in figures]
        print(
            f"{name:48} {statistics.median(cpu) * 1e3:7.0f} ms {min(cpu) * 1e3:4.0f} ms"
            f" {statistics.median(wall) * 1e3:8.0f} ms {min(wall) * 1e3:4.0f} ms"
            f"  {statistics.median(cpu) / peer:5.2f}x"
        )


if __name__ == "__main__":
    main()
