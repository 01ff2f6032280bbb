"""`monitor replay` killed (SIGKILL) while its incident worker and the worker's freezer
process are busy: neither is left running, and replaying again completes the clean run's
incidents, each frozen with evidence that verifies (issue 20: the replay's incident
recording runs in two processes of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from monitor.incidents import Incident, IncidentStore
from tests.test_incidents_worker import CHATTERING, chattering, station

DEADLINE = 60.0  # seconds: a bound for what must happen, never a wait for it


def _write(tmp_path: Path, state: Path) -> tuple[Path, Path]:
    """Ten days of the chattering station (NaN and 1e30 among them) as CSV, and a config."""
    _, sensor, t, value = chattering(state, days=10)
    names = np.array([s["id"] for s in CHATTERING])
    csv = tmp_path / "samples.csv"
    with csv.open("w", encoding="utf-8") as f:
        f.write("time,sensor,value\n")
        f.writelines(f"{a:.0f},{b},{c!r}\n" for a, b, c in zip(t, names[sensor], value.tolist(), strict=True))
    config = tmp_path / f"{state.name}.yaml"
    config.write_text(yaml.safe_dump(station(state, CHATTERING)))
    return csv, config


def _replay(config: Path, csv: Path, events: Path) -> list[str]:
    return [sys.executable, "-m", "monitor", "replay", "--config", str(config), "--input", str(csv),
            "--events", str(events)]  # fmt: skip


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in os.listdir(f"/proc/{p}/task"):
            kids = [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
            out += kids
            todo += kids
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's parent may be slow to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _incidents(state: Path) -> dict[str, tuple[Incident, bool]]:
    """Each incident on record, and whether its evidence verifies."""
    store = IncidentStore(state)
    try:
        return {i.id: (i, store.verify(i)) for i in store.incidents()}
    finally:
        store.close()


def test_a_replay_killed_mid_run_leaves_no_process_and_a_second_run_completes(tmp_path: Path) -> None:
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    csv, clean_config = _write(tmp_path, clean)
    _, killed_config = _write(tmp_path, killed)
    subprocess.run(_replay(clean_config, csv, tmp_path / "clean.jsonl"), check=True, capture_output=True)
    expected = _incidents(clean)
    assert expected and all(inc.frozen and ok for inc, ok in expected.values())

    proc = subprocess.Popen(
        _replay(killed_config, csv, tmp_path / "killed.jsonl"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        end = time.monotonic() + DEADLINE
        # The first evidence file: the freezer process is at work, the worker has steps left.
        while not any((killed / "incidents").glob("*/evidence.csv")) and proc.poll() is None:
            assert time.monotonic() < end, "no incident was frozen"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGSTOP)  # it cannot finish now; its processes go on
        assert proc.poll() is None, "the replay ended before it could be killed: make the data longer"
        helpers = _descendants(proc.pid)
        assert len(helpers) >= 2  # the incident worker and its freezer process
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    end = time.monotonic() + DEADLINE
    while any(_running(p) for p in helpers):
        assert time.monotonic() < end, f"left running after the replay was killed: {helpers}"
        time.sleep(0.01)
    again = subprocess.run(
        _replay(killed_config, csv, tmp_path / "again.jsonl"), capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    # The clean run's incidents and nothing else, each as the clean run recorded it (figures,
    # activations, evidence hash), frozen and verifying: the kill left nothing half frozen,
    # and what the killed run had recorded is neither recorded twice nor counted twice.
    assert _incidents(killed) == expected
