"""Start-up time of the `monitor` command, against the interpreter it runs on.

`monitor --version` is what a shell completion, a health script or an operator
typing the wrong command pays every time. The peers, measured in the same run:
a bare `python -c pass` (the floor no Python command can beat) and the start-up
the command had when it imported every subcommand to build its parser.

    python -m bench.cli [--runs 20]

Target (issue 14): `monitor --version` under 150 ms (median).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "monitor --version": [sys.executable, "-m", "monitor", "--version"],
    "monitor billing rate": [
        sys.executable, "-m", "monitor", "billing", "rate", "--budget", "1000", "--prior-year-kcf", "100"
    ],
    "every command imported (old start-up)": [
        sys.executable, "-c", "from monitor.cli import build_parser; build_parser()"
    ],
}  # fmt: skip


def median_ms(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (the median is shown)")
    args = parser.parse_args()
    figures = {name: median_ms(cmd, args.runs) for name, cmd in CASES.items()}
    floor = figures["python -c pass (floor)"]
    for name, ms in figures.items():
        print(f"{name:40} {ms:7.1f} ms   {ms / floor:5.1f}x the floor")
    version = figures["monitor --version"]
    verdict = "met" if version < 150 else "MISSED"
    print(f"target: monitor --version under 150 ms: {verdict} ({version:.0f} ms)")


if __name__ == "__main__":
    main()
