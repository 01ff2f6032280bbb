"""A state file another process holds locked is not damaged: the start-up check waits,
then refuses to start naming the file and the lock's holder, and moves nothing aside.

The lock is real: another process opens the file with `PRAGMA locking_mode=EXCLUSIVE`
and keeps a write transaction open (as a backup tool or `monitor outbox drain` may
hold it), so SQLite in this process really answers "database is locked".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from monitor.config import build_config
from monitor.errors import StateError
from monitor.sqlite import StateLockedError, quick_check
from monitor.state_check import check_state, require_sound_records
from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "tests" / "cases" / "state-before-versions"
FILES = ["ledger.sqlite", "journal.sqlite", "outbox.sqlite", "series.sqlite"]
NAMES = {
    "ledger.sqlite": "meter ledger",
    "journal.sqlite": "alarm journal",
    "outbox.sqlite": "outbox",
    "series.sqlite": "series store",
}

HOLD = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA locking_mode=EXCLUSIVE")
db.execute("BEGIN EXCLUSIVE")
db.execute("PRAGMA user_version").fetchone()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
db.execute("ROLLBACK")
"""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(RELEASE, state, ignore=shutil.ignore_patterns("*.py"))
    return state


@pytest.fixture
def hold() -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(path: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        assert proc.stdin is not None and proc.stdout is not None
        if not proc.stdin.closed:
            proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


# The start-up check's wait for a lock (`store.lock_wait`, default 30 s), short here so
# the commands below give up after a second instead of SQLite's default half minute.
LOCK_WAIT = 1.0


def config_for(state: Path) -> dict[str, object]:
    return {
        "station": {"id": "ps-locked"},
        "state_dir": str(state),
        "store": {"lock_wait": f"{LOCK_WAIT:g}s"},
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "console": {"host": "127.0.0.1", "port": free_port()},
    }


def write_config(tmp_path: Path, doc: dict[str, object]) -> Path:
    """`doc` as `tmp_path/station.yaml`, for a command's `--config`."""
    config = tmp_path / "station.yaml"
    config.write_text(yaml.safe_dump(doc))
    return config


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m monitor *args` as its own process from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "monitor", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def monitor_after_the_lock_wait(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor`, asserting it waited its whole `store.lock_wait` for the lock before giving up."""
    started = time.monotonic()
    result = monitor(*args)
    assert time.monotonic() - started >= LOCK_WAIT  # it waited for the lock before giving up
    return result


@pytest.mark.parametrize("name", FILES)
def test_a_locked_file_is_its_own_verdict_and_never_moved_aside(
    state: Path, hold: Callable[[Path], subprocess.Popen[str]], name: str
) -> None:
    """Regression: any SQLite error counted as damage, so a locked outbox or series
    store was renamed `.damaged-…` and a fresh, empty one started in its place."""
    holder = hold(state / name)
    before = sorted(p.name for p in state.iterdir())
    started = time.monotonic()
    verdicts = check_state(build_config(config_for(state)), busy_wait=0.5)
    assert time.monotonic() - started >= 0.5  # it waited for the lock before giving up
    (verdict,) = [v for v in verdicts if v.path.name == name]
    assert verdict.problem is None and verdict.moved_to is None
    assert verdict.locked is not None and f"pid {holder.pid} (python" in verdict.locked
    assert all(v.problem is None and v.locked is None for v in verdicts if v.path.name != name)
    assert sorted(p.name for p in state.iterdir()) == before  # nothing set aside
    with pytest.raises(StateError) as refused:
        require_sound_records(verdicts)
    line = str(refused.value)
    assert NAMES[name] in line and str(state / name) in line and f"pid {holder.pid}" in line
    assert "locked" in line and "damaged" not in line.replace("not damaged", "")


def test_once_the_lock_is_gone_the_same_file_checks_sound(
    state: Path, hold: Callable[[Path], subprocess.Popen[str]]
) -> None:
    holder = hold(state / "outbox.sqlite")
    with pytest.raises(StateLockedError):
        quick_check(state / "outbox.sqlite", timeout=0.2)
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait(timeout=10) == 0
    assert quick_check(state / "outbox.sqlite", timeout=0.2) is None


def test_monitor_run_refuses_to_start_on_a_locked_outbox_with_exit_2(
    tmp_path: Path, state: Path, hold: Callable[[Path], subprocess.Popen[str]]
) -> None:
    """Against `monitor run` itself: it waits its whole `store.lock_wait`, then exits 2."""
    holder = hold(state / "outbox.sqlite")
    config = write_config(tmp_path, config_for(state))
    before = (state / "outbox.sqlite").read_bytes()
    result = monitor_after_the_lock_wait("run", "--config", str(config))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "cannot start" in line and str(state / "outbox.sqlite") in line and f"pid {holder.pid}" in line
    assert "locked" in line and f"waited {LOCK_WAIT:g}s" in line
    assert "Traceback" not in result.stderr
    assert not list(state.glob("*.damaged-*"))
    assert (state / "outbox.sqlite").read_bytes() == before


def test_meters_list_says_locked_not_damaged_and_not_ok(
    tmp_path: Path, state: Path, hold: Callable[[Path], subprocess.Popen[str]]
) -> None:
    holder = hold(state / "ledger.sqlite")
    doc = config_for(state)
    doc["sensors"] = [{"id": "shop.meter", "kind": "meter", "unit": "ft3", "register_digits": 6}]
    config = write_config(tmp_path, doc)
    result = monitor_after_the_lock_wait("meters", "list", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert f"pid {holder.pid}" in result.stderr and "locked" in result.stderr
    assert f"waited {LOCK_WAIT:g}s" in result.stderr
    assert "DAMAGED" not in result.stderr and " ok" not in result.stdout


def test_lock_wait_is_shown_by_check_config_and_a_bad_one_exits_2_naming_the_key(
    tmp_path: Path, state: Path
) -> None:
    config = write_config(tmp_path, config_for(state))
    shown = monitor("check-config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert f"waits {LOCK_WAIT:g}s for a locked state file" in shown.stdout
    doc = config_for(state)
    doc["store"] = {"lock_wait": "0s"}
    bad = monitor("check-config", str(write_config(tmp_path, doc)))
    assert bad.returncode == 2 and "store.lock_wait" in bad.stderr, bad.stderr
