"""Shared fixtures: real services started per session on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from tests.services import DedupVictoriaMetrics, InfluxDB1, Mosquitto, VictoriaMetrics

if TYPE_CHECKING:
    from playwright.sync_api import Browser

# The `services` marker: a test that needs something outside the test's own process
# and memory (Mosquitto, InfluxDB, VictoriaMetrics, Chromium, a Modbus server on a
# socket, a `monitor` or simulator process). `make check` runs the rest in seconds;
# `make test` runs everything. Applied here, from what a test uses, so nobody has to
# remember to mark a test: a fixture below, or a module that imports a helper below.
SERVICE_FIXTURES = {"mosquitto", "broker", "victoria", "victoria_dedup", "influxdb1", "browser"}
SERVICE_HELPERS = {
    "Mosquitto", "VictoriaMetrics", "InfluxDB1", "simulator_process", "StationServer",
    "MqttPublisher", "sync_playwright", "lift_server", "LiftServer", "running_demo",
    "running_daemon", "spawn_daemon",
}  # fmt: skip


# The longest tests (each 10-60 s of mostly waiting on a daemon, a broker or a kill),
# longest first. They start first, spread over the xdist workers, so their waits overlap
# the hundreds of short tests instead of trailing after them.
LONG_FIRST = (
    "tests/test_station_demo.py", "tests/test_durability.py", "tests/test_disk_full.py",
    "tests/test_station_modbus.py", "tests/test_fleet.py", "tests/test_demo.py",
    "tests/test_fleet_bridge.py", "tests/test_daemon_e2e.py", "tests/test_callout_daemon.py",
    "tests/test_hostile_clients.py", "tests/test_mqtt_payload.py", "tests/test_outbox_faults.py",
    "tests/test_restart_comm_loss.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable
    for item in items:
        module = getattr(item, "module", None)
        helpers = SERVICE_HELPERS & set(vars(module)) if module is not None else set()
        helpers |= _simulator_servers(module)
        uses_subprocess_popen = module is not None and "subprocess" in vars(module) and _popen(module)
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())) or helpers or uses_subprocess_popen:
            item.add_marker(pytest.mark.services)


def _simulator_servers(module: object) -> set[str]:
    """Any server a simulator module offers (a socket of its own), whatever its name."""
    found = set()
    for name, obj in (vars(module) if module is not None else {}).items():
        if str(getattr(obj, "__module__", "")).startswith("simulators.") and "server" in name.lower():
            found.add(name)
    return found


def _popen(module: object) -> bool:
    """A module that starts long-lived processes of its own (`subprocess.Popen`)."""
    source = getattr(module, "__file__", None)
    return bool(source) and "Popen(" in Path(str(source)).read_text(encoding="utf-8")


# In CI the property tests run the same examples every time (derandomize), so a red
# build always means the change, never the dice; on a developer's machine they keep
# exploring new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
# `make check` (the edit-test loop) draws fewer examples: tests/examples.py scales the
# explicit counts, this profile the default of the tests that set none.
settings.register_profile("check", max_examples=20)
if os.environ.get("CI"):
    settings.load_profile("ci")
elif os.environ.get("MONITOR_TEST_TIER") == "check":
    settings.load_profile("check")


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    server = Mosquitto(tmp_path_factory.mktemp("mosquitto"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    server = VictoriaMetrics(tmp_path_factory.mktemp("victoria"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def victoria_dedup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """A VictoriaMetrics with `-dedup.minScrapeInterval=1ms`, beside the plain `victoria`."""
    server = DedupVictoriaMetrics(tmp_path_factory.mktemp("victoria-dedup"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def influxdb1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB1]:
    server = InfluxDB1(tmp_path_factory.mktemp("influxdb1"))
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def tmpfs_disk(tmp_path: Path, options: str) -> Iterator[Path]:
    """A real tmpfs at tmp_path/disk (needs root), unmounted after: a state disk a test
    can fill, with `mount -o` options such as "size=3m"."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill_disk(disk: Path) -> Path:
    """Fill a test's tmpfs to its last byte (ENOSPC), so SQLite's next page is refused;
    the ballast file, to unlink when the operator frees space."""
    ballast = disk / "ballast"
    with ballast.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return ballast


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MB tmpfs (a state disk a test can fill: tests/test_pipeline.py,
    test_clock_step.py)."""
    with tmpfs_disk(tmp_path, "size=3m") as mount:
        yield mount


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A Mosquitto of the test's own, which it may stop and start (the session's
    `mosquitto` is shared)."""
    server = Mosquitto(tmp_path / "broker")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


_SHARED_STATE = Path(__file__).resolve().parent.parent / "state"


@pytest.fixture(autouse=True)
def _no_shared_state_dir() -> Iterator[None]:
    """A test must not write into the checkout's ./state (a case config without state_dir,
    run from the repository root): the xdist workers would share it, and the state dir lock
    refuses the second replay (exit 75) only when two happen to overlap -- a flaky test."""
    existed = _SHARED_STATE.exists()
    yield
    if not existed and _SHARED_STATE.exists():
        pytest.fail(f"{_SHARED_STATE} appeared during this test: run replays from a directory of their own")


CHROMIUM = "/usr/bin/chromium"  # Debian's (scripts/bootstrap.sh installs it)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Real headless Chromium, driven by Playwright, one per test module (the console's,
    the incident report's and the wet-well page's tests)."""
    from playwright.sync_api import sync_playwright  # not imported by the tests without it

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
