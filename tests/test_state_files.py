"""State files: the one SQLite helper (schema versions, forward migrations, permissions,
error map) and the start-up verdict on damaged files, against `monitor run` itself."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.alarms.journal import Journal
from monitor.errors import MonitorError, OutboxError, SinkError, StateError
from monitor.meters.ledger import Ledger
from monitor.meters.totalizer import MeterSpec
from monitor.sinks.outbox import Outbox
from monitor.sinks.store import SeriesStore
from monitor.sqlite import ERRORS, Schema, connect, quick_check, translate, user_version
from tests.daemon_process import running_daemon
from tests.services import free_port, http, wait_until

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "tests" / "cases" / "state-before-versions"
FILES = ["ledger.sqlite", "journal.sqlite", "outbox.sqlite", "series.sqlite"]
SPEC = {"shop.meter": MeterSpec("shop.meter", "ft3", 6, Decimal(1), None)}


@pytest.fixture
def released(tmp_path: Path) -> Path:
    """A state directory as the release before schema versions left it."""
    state = tmp_path / "state"
    shutil.copytree(RELEASE, state, ignore=shutil.ignore_patterns("*.py"))
    return state


def version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return user_version(db)
    finally:
        db.close()


def test_a_state_directory_from_the_last_release_upgrades_in_place(released: Path) -> None:
    assert [version(released / f) for f in FILES] == [0, 0, 0, 0]
    with Outbox(released / "outbox.sqlite") as box:
        assert box.pending == 3 and "outfall.ph" in box.pending_lines()[0]
    with SeriesStore(released / "series.sqlite") as store:
        assert store.latest()["outfall.ph"].value == pytest.approx(7.2)
    ledger = Ledger(released / "ledger.sqlite", SPEC)
    assert ledger.count("shop.meter") == 3
    ledger.close()
    journal = Journal(released / "journal.sqlite")
    assert [e.event for e in journal.entries()] == ["activated"]
    journal.close()
    # the ledger at version 7: settings periods, the points InfluxDB lacks, the gateway clock's
    # steps back, which of them were found at start, an index of them by their last old
    # stamp, and the console's request ids (monitor/meters/rows.py); the outbox at
    # 2: segments the cap drops last (the ledger's meter points); the series store at 2: the
    # pipeline's intake records (monitor/pipeline.py)
    assert [version(released / f) for f in FILES] == [7, 2, 2, 2]  # journal 2: console request ids
    # the files are the daemon's user's alone now
    for f in FILES:
        assert stat.S_IMODE((released / f).stat().st_mode) == 0o600, f
    assert stat.S_IMODE(released.stat().st_mode) == 0o700


def test_a_migration_runs_once_in_one_transaction_and_a_newer_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    v1 = Schema("test store", ("CREATE TABLE t (a INTEGER);",))
    connect(path, v1).close()
    broken = Schema(
        "test store", (*v1.migrations, "ALTER TABLE t ADD COLUMN b TEXT; INSERT INTO nope VALUES (1);")
    )
    with pytest.raises(StateError, match="test store"):
        connect(path, broken)
    assert version(path) == 1  # the failed step left neither its column nor its version
    db = sqlite3.connect(path)
    assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["a"]
    db.close()
    v2 = Schema("test store", (*v1.migrations, "ALTER TABLE t ADD COLUMN b TEXT DEFAULT 'x';"))
    connect(path, v2).close()
    connect(path, v2).close()  # nothing left to do the second time
    assert version(path) == 2
    with pytest.raises(StateError, match="newer station-monitor"):
        connect(path, v1)


def test_every_sqlite3_exception_is_mapped() -> None:
    """Like httpx's test_httpcore_all_exceptions_mapped: a new sqlite3 exception fails here."""
    raised = {
        obj
        for _, obj in inspect.getmembers(sqlite3, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == "sqlite3"
    }
    assert raised, "found no sqlite3 exceptions"
    missing = raised - set(ERRORS)
    assert not missing, f"sqlite3 exceptions without a mapping: {missing}"
    for cls in raised:
        mapped = translate(cls("boom"), "ledger /x", StateError)
        assert isinstance(mapped, StateError) and str(mapped).startswith("ledger /x: ")


def test_reads_never_leak_sqlite3_errors(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.sqlite")
    store = SeriesStore(tmp_path / "series.sqlite")
    store.append([])
    box.close()
    store.close()
    # A closed connection is what a read after a failed shutdown meets.
    with pytest.raises(OutboxError, match="outbox"):
        box.pending  # noqa: B018 - the property reads the database
    with pytest.raises(OutboxError, match="outbox"):
        box.dead_letters()
    store._ids["x"] = 1  # one sensor known, so latest() has to ask the database
    with pytest.raises(SinkError, match="series store"):
        store.latest()


def corrupt(path: Path) -> None:
    """Overwrite the second page with garbage: a b-tree page the checks must walk."""
    with path.open("r+b") as f:
        f.seek(4096)
        f.write(b"\x55" * 4096)


@pytest.mark.parametrize("name", FILES)
def test_quick_check_finds_each_damaged_file(released: Path, name: str) -> None:
    assert quick_check(released / name) is None
    corrupt(released / name)
    assert quick_check(released / name) is not None


def write_config(tmp_path: Path, state: Path, console_port: int) -> Path:
    config = tmp_path / "station.yaml"
    doc: dict[str, Any] = {
        "station": {"id": "ps-state"},
        "state_dir": str(state),
        "sensors": [{"id": "outfall.ph", "kind": "ph"}],
        "console": {"host": "127.0.0.1", "port": console_port},
    }
    config.write_text(yaml.safe_dump(doc))
    return config


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


@pytest.mark.parametrize("name", ["ledger.sqlite", "journal.sqlite"])
def test_a_damaged_record_stops_the_daemon_with_exit_2_naming_the_file(
    tmp_path: Path, released: Path, name: str
) -> None:
    state = tmp_path / "only"
    state.mkdir()
    shutil.copy(released / name, state / name)
    corrupt(state / name)
    before = (state / name).read_bytes()
    result = monitor("run", "--config", str(write_config(tmp_path, state, free_port())))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert str(state / name) in line and "damaged" in line and "restore it from the backup" in line
    assert "Traceback" not in result.stderr
    assert (state / name).read_bytes() == before  # nothing written into it


def test_meters_list_reports_a_damaged_ledger(tmp_path: Path, released: Path) -> None:
    config = tmp_path / "station.yaml"
    doc = {
        "station": {"id": "ps-state"},
        "state_dir": str(released),
        "sensors": [{"id": "shop.meter", "kind": "meter", "unit": "ft3", "register_digits": 6}],
    }
    config.write_text(yaml.safe_dump(doc))
    assert monitor("meters", "list", "--config", str(config)).returncode == 0
    corrupt(released / "ledger.sqlite")
    result = monitor("meters", "list", "--config", str(config))
    assert result.returncode == 1
    assert "meter ledger" in result.stderr and "DAMAGED" in result.stderr and " ok" not in result.stdout


@pytest.fixture
def daemon_on(tmp_path: Path) -> Iterator[Any]:
    with ExitStack() as daemons:

        def start(state: Path) -> tuple[subprocess.Popen[bytes], int]:
            port = free_port()
            config = write_config(tmp_path, state, port)
            daemon = daemons.enter_context(running_daemon(config, tmp_path / "daemon.log", grace=20))
            return daemon.proc, port

        yield start


@pytest.mark.parametrize(
    ("name", "sensor"), [("outbox.sqlite", "state.outbox"), ("series.sqlite", "state.series")]
)
def test_a_damaged_copy_is_set_aside_with_an_alarm_and_a_fresh_one_started(
    tmp_path: Path, released: Path, daemon_on: Any, name: str, sensor: str
) -> None:
    state = tmp_path / "copies"
    state.mkdir(mode=0o755)
    shutil.copy(released / name, state / name)
    os.chmod(state / name, 0o644)
    corrupt(state / name)
    proc, port = daemon_on(state)

    def alarms() -> list[dict[str, Any]]:
        try:
            status, body = http("GET", f"http://127.0.0.1:{port}/api/alarms")
        except OSError:
            return []
        return list(json.loads(body)) if status == 200 else []

    wait_until(lambda: any(a["sensor"] == sensor for a in alarms()), timeout=90, what=f"the {sensor} alarm")
    (alarm,) = [a for a in alarms() if a["sensor"] == sensor]
    assert alarm["rule"] == "state" and alarm["state"] == "returned_unacknowledged", alarm
    assert "damaged" in alarm["message"] and name in alarm["message"]
    aside = [p.name for p in state.iterdir() if p.name.startswith(name + ".damaged-")]
    assert aside, list(state.iterdir())
    if name == "series.sqlite":  # the daemon opened a fresh store, sound and ours alone
        assert quick_check(state / name) is None
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert proc.poll() is None


def test_damage_found_after_start_is_a_monitor_error_not_a_crash(released: Path) -> None:
    corrupt(released / "series.sqlite")
    with pytest.raises(MonitorError, match="series store"), SeriesStore(released / "series.sqlite") as store:
        store.latest()


@pytest.mark.parametrize("odd", ["ps#1", "ps?1", "ps%41 1"])
def test_a_sound_file_in_a_directory_with_uri_characters_is_not_called_damaged(
    tmp_path: Path, odd: str
) -> None:
    """quick_check opened `file:{path}?mode=rw`: SQLite reads `#` and `?` in a URI as its
    end and `%41` as `A`, so a sound ledger under such a directory was 'damaged' (the
    daemon refused to start) and a sound outbox was set aside at every start."""
    state = tmp_path / odd
    shutil.copytree(RELEASE, state, ignore=shutil.ignore_patterns("*.py"))
    for name in FILES:
        assert quick_check(state / name) is None, name
    corrupt(state / "outbox.sqlite")
    assert quick_check(state / "outbox.sqlite") is not None
