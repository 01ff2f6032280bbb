"""Shared fixtures: real services started per session on free loopback ports."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.services import InfluxDB1, Mosquitto, VictoriaMetrics

# In CI the property tests run the same examples every time (derandomize), so a red
# build always means the change, never the dice; on a developer's machine they keep
# exploring new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


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
def influxdb1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB1]:
    server = InfluxDB1(tmp_path_factory.mktemp("influxdb1"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
