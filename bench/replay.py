"""End-to-end `monitor replay` on a generated CSV and the same data as Parquet, beside
the peer a data engineer would write: `pandas.read_csv(engine="pyarrow")` and a
per-sensor `rolling("24h").mean()`. Each runs as its own process, timed from start to
exit; its peak memory, in a run of its own: the kernel's peak RSS (wait4), or for a replay, if larger,
the sampled peak PSS of the replay and its incident worker process together. A second,
smaller file shows whether peak memory depends on the input's size.

    .venv/bin/python -m bench.replay [--rows 10000000] [--sensors 50] [--time epoch|iso] [--repeat 3]

Targets (issue 20): CSV >= 1.0x the pandas peer and >= 5 M samples/s; Parquet >= 10 M
samples/s; peak RSS under 500 MB whatever the size (streamed in chunks). Each replay
records incidents (the default) in a state_dir of its own; one more Parquet run without
them (`--no-incidents`) shows what the incident records cost. The headline data is a busy
station: its temperatures cross the 65 degC limit on warm evenings and chatter (about
53,000 alarm transitions and 250 incidents in 10 M rows); the same rows with temperatures
that stay within the limit (a quiet station, no alarm) are replayed too, for scale.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.sources.columnar import write_parquet

T0 = 1_780_000_000
STEP = 10


def config(n: int) -> dict[str, Any]:
    """Flow meters with the slug rule, pH with limits, temperatures: a station mix."""
    sensors: list[dict[str, Any]] = []
    for i in range(n):
        if i % 5 < 3:
            sensors.append({"id": f"flow{i}", "kind": "flow", "unit": "gpm"})
        elif i % 5 == 3:
            sensors.append({"id": f"ph{i}", "kind": "ph", "limits": {"deadband": 0.1, "on_delay": "30s"}})
        else:
            sensors.append({"id": f"temp{i}", "kind": "temperature", "unit": "degF"})
    return {"station": {"id": "bench"}, "sensors": sensors}


QUIET_TEMPERATURE = 90.0  # degF: a station whose discharges stay within the ordinance
BUSY_TEMPERATURE = 120.0  # degF: crosses 65 degC (149 degF) on every warm evening, with noise


def generate(
    path: Path, rows: int, n_sensors: int, iso: bool, seed: int = 1, temperature: float = BUSY_TEMPERATURE
) -> None:
    """Time-major rows (every sensor each 10 s), written a million at a time."""
    rng = np.random.default_rng(seed)
    names = np.array([s["id"] for s in config(n_sensors)["sensors"]])
    base = np.array(
        [300.0 if n.startswith("flow") else 7.0 if n.startswith("ph") else temperature for n in names]
    )
    with path.open("w", encoding="utf-8") as f:
        f.write("time,sensor,value\n")
        for a in range(0, rows, 1_000_000):
            i = np.arange(a, min(rows, a + 1_000_000))
            t = T0 + (i // n_sensors) * STEP
            s = i % n_sensors
            day = np.sin(2 * np.pi * (t - T0) / 86400.0)
            v = np.round(base[s] * (1 + 0.2 * day) * rng.normal(1.0, 0.03, i.size), 3)
            if iso:
                stamp = np.datetime_as_string(t.astype("datetime64[s]"), unit="s")
                times = np.char.add(stamp.astype(str), "Z")
            else:
                times = t.astype(str)
            lines = np.char.add(
                np.char.add(np.char.add(np.char.add(times, ","), names[s]), ","), v.astype(str)
            )
            f.write("\n".join(lines.tolist()))
            f.write("\n")


def to_parquet(csv: Path, parquet: Path) -> None:
    import pandas as pd  # type: ignore[import-untyped]

    df = pd.read_csv(csv, engine="pyarrow")
    t = df["time"]
    secs = (
        pd.to_datetime(t, utc=True).astype("int64").to_numpy() / 1e9
        if t.dtype == object or str(t.dtype).startswith("str")
        else t.to_numpy(dtype=float)
    )
    write_parquet(parquet, secs, df["sensor"].astype(str).tolist(), df["value"].to_numpy(dtype=float))


PEER = """
import sys, time
t0 = time.perf_counter()
import pandas as pd
df = pd.read_csv(sys.argv[1], engine="pyarrow")
t = df["time"]
df["time"] = pd.to_datetime(t, utc=True) if t.dtype == object or str(t.dtype).startswith("str") \\
    else pd.to_datetime(t, unit="s", utc=True)
n = 0
for name, g in df.groupby("sensor", sort=False):
    m = g.set_index("time")["value"].rolling("24h").mean()
    n += len(m)
print(n, time.perf_counter() - t0)
"""


def run_peer(path: Path) -> tuple[float, float]:
    """pandas in its own process (the wait4 figure is its own peak)."""
    proc = subprocess.Popen([sys.executable, "-c", PEER, str(path)], stdout=subprocess.PIPE, text=True)
    start = time.perf_counter()
    _, _, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    assert proc.stdout is not None
    proc.stdout.read()
    return elapsed, usage.ru_maxrss / 1024


def _tree(pid: int) -> list[int]:
    """A process and its descendants (the replay and its incident worker)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:
            continue
    return out


def _pss_mib(pids: list[int]) -> float:
    """Proportional set size of the processes, summed: shared pages (the forked worker
    shares the replay's imports) counted once in all."""
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class PeakMemory:
    """The peak of the process tree's summed PSS, sampled every 20 ms on a thread (the
    kernel's peak, from wait4, is per process: it would not add the worker's)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _pss_mib(_tree(self.pid)))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_replay(
    cfg: Path, path: Path, events: Path, *extra: str, sample: bool = False
) -> tuple[float, float, str]:
    """One `monitor replay` (incidents recorded, the default) with a state_dir of its own:
    a store that holds the incidents already would skip their evidence and look faster.
    Its memory: the kernel's per-process peak, or with `sample` the larger of that and
    the sampled peak of the replay and its incident worker together (a run of its own:
    reading /proc 50 times a second takes CPU the timed runs should not lose)."""
    state = Path(tempfile.mkdtemp(prefix="state-", dir=cfg.parent))
    own = state / "station.yaml"
    own.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "state_dir": str(state)}))
    cmd = [sys.executable, "-m", "monitor", "replay", "--config", str(own), "--input", str(path), *extra]
    proc = subprocess.Popen(
        [*cmd, "--events", str(events)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    start = time.perf_counter()
    memory = PeakMemory(proc.pid) if sample else None
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    together = memory.stop() if memory is not None else 0.0
    assert proc.stdout is not None
    out = proc.stdout.read().strip().splitlines()
    if status != 0:
        raise SystemExit(f"monitor replay on {path} failed ({status})")
    return elapsed, max(usage.ru_maxrss / 1024, together), out[-1] if out else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--sensors", type=int, default=50)
    parser.add_argument("--time", choices=("epoch", "iso"), default="epoch", help="time column format")
    parser.add_argument("--small", type=int, default=10, help="the RSS check's smaller file is rows / this")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each; the best is reported")
    parser.add_argument("--write", nargs=2, metavar=("CSV", "PARQUET"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:  # in a child process: the parent stays small, so children's peak RSS is their own
        csv, parquet = (Path(p) for p in args.write)
        temperature = QUIET_TEMPERATURE if args.quiet else BUSY_TEMPERATURE
        generate(csv, args.rows, args.sensors, args.time == "iso", args.seed, temperature)
        if args.write[1] != "-":
            to_parquet(csv, parquet)
        return 0
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPU(s)")
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        d = Path(tmp)
        cfg = d / "station.yaml"
        cfg.write_text(yaml.safe_dump(config(args.sensors)))
        rows = args.rows
        csv, small = d / "big.csv", d / "small.csv"
        start = time.perf_counter()
        parquet = d / "big.parquet"
        me = [sys.executable, "-m", "bench.replay", "--sensors", str(args.sensors), "--time", args.time]
        subprocess.run([*me, "--rows", str(rows), "--write", str(csv), str(parquet)], check=True)
        small_rows = str(rows // args.small)
        subprocess.run([*me, "--rows", small_rows, "--seed", "2", "--write", str(small), "-"], check=True)
        calm, calm_pq = d / "quiet.csv", d / "quiet.parquet"
        subprocess.run([*me, "--rows", str(rows), "--quiet", "--write", str(calm), str(calm_pq)], check=True)
        print(
            f"data: {rows:,} rows ({args.sensors} sensors every {STEP} s, {args.time} times),"
            f" CSV {csv.stat().st_size / 2**20:.0f} MiB, Parquet {parquet.stat().st_size / 2**20:.0f} MiB"
            f" (generated in {time.perf_counter() - start:.0f} s)"
        )
        events = d / "events.jsonl"
        _, small_rss, _ = run_replay(cfg, small, events, sample=True)
        _, csv_rss, _ = run_replay(cfg, csv, events, sample=True)
        _, pq_rss, _ = run_replay(cfg, parquet, events, sample=True)
        # Each timed figure is the best of `--repeat` runs, taken in rounds (every run once,
        # then again) so that a burst of load on the shared machine hits them all alike; the
        # spread is printed beside it. pandas gets the same treatment.
        runs: dict[str, list[float]] = {}
        lines: dict[str, str] = {}
        peer_rss = 0.0
        timed = {
            "csv": (csv, ()),
            "parquet": (parquet, ()),
            "off": (parquet, ("--no-incidents",)),
            "calm": (calm, ()),
            "calm_pq": (calm_pq, ()),
        }
        for _ in range(max(1, args.repeat)):
            for key, (path, extra) in timed.items():
                s, _, lines[key] = run_replay(cfg, path, events, *extra)
                runs.setdefault(key, []).append(s)
            s, peer_rss = run_peer(csv)
            runs.setdefault("peer", []).append(s)
        best = {key: min(times) for key, times in runs.items()}
        csv_s, pq_s, off_s, calm_s, calm_pq_s, peer_s = (
            best[k] for k in ("csv", "parquet", "off", "calm", "calm_pq", "peer")
        )
        csv_line, pq_line, off_line, calm_line, calm_pq_line = (
            lines[k] for k in ("csv", "parquet", "off", "calm", "calm_pq")
        )
    spread = "; ".join(
        f"{key} {' '.join(f'{rows / t / 1e6:.2f}' for t in sorted(times))}" for key, times in runs.items()
    )
    print(
        f"end to end, process start to exit, best of {args.repeat}"
        " (the replay's own figure, without start-up, in brackets):"
    )
    for what, s, rss, line in (("CSV", csv_s, csv_rss, csv_line), ("Parquet", pq_s, pq_rss, pq_line)):
        print(f"  monitor replay, {what + ':':9} {rows / s / 1e6:6.2f} M samples/s  peak RSS {rss:6.0f} MiB")
        print(f"      [{line}]")
    print(f"  monitor replay, Parquet, --no-incidents: {rows / off_s / 1e6:6.2f} M samples/s")
    print(f"      [{off_line}]")
    print(f"  Parquet with incidents / without: {pq_s:.2f} s / {off_s:.2f} s ({off_s / pq_s:.2f}x the speed)")
    print(f"  a quiet station (temperatures at {QUIET_TEMPERATURE:.0f} degF: no alarm), incidents on:")
    print(f"    CSV {rows / calm_s / 1e6:6.2f} M samples/s, Parquet {rows / calm_pq_s / 1e6:6.2f} M/s")
    print(f"      [{calm_line}]")
    print(f"      [{calm_pq_line}]")
    print("  pandas read_csv(pyarrow) + rolling('24h').mean() per sensor:")
    print(f"                            {rows / peer_s / 1e6:6.2f} M samples/s  peak RSS {peer_rss:6.0f} MiB")
    print(f"  ratio CSV / pandas:       {peer_s / csv_s:6.2f}x (target >= 1.0; CSV target >= 5 M/s)")
    print(f"  ratio Parquet / pandas:   {peer_s / pq_s:6.2f}x (Parquet target >= 10 M/s)")
    print(
        f"peak RSS by input size: {rows // args.small:,} rows {small_rss:.0f} MiB,"
        f" {rows:,} rows {csv_rss:.0f} MiB (target < 500 MiB at any size;"
        f" pandas holds the whole file: {peer_rss:.0f} MiB)"
    )
    print(f"every timed run, M samples/s, fastest first: {spread}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
