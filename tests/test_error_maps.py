"""One error map per third-party library, each checked for completeness (as httpx's
test_httpcore_all_exceptions_mapped does); typed timeouts against a real silent server;
an alarm listener's failure counted and logged once, never silent.
(sqlite3 and pymodbus have theirs in test_state_files.py and test_modbus_malformed.py.)"""

from __future__ import annotations

import asyncio
import http.client
import importlib
import inspect
import logging
import pkgutil
import socket
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import httpx
import influxdb_client.client.exceptions
import influxdb_client.rest
import paho.mqtt
import pytest
import urllib3.exceptions
import uvicorn.importer
from pydantic import SecretStr

from monitor.alarms import AlarmManager, Entry, Journal
from monitor.alarms import webhook as webhook_map
from monitor.alarms.webhook import WebhookNotifier
from monitor.config import Alarms, Influx, Webhook
from monitor.errors import MonitorError, SourceError, WriteError, WriteTimeoutError
from monitor.model import Alarm, AlarmState, Condition, ConditionState, ManualClock, Rule
from monitor.sinks import influx as influx_map
from monitor.sinks.influx import InfluxV2Writer
from monitor.sinks.influx_v1 import InfluxV1Writer
from monitor.sources import mqtt as mqtt_map
from monitor.web import server as uvicorn_map

T0 = 1_780_000_000.0


def exceptions(*modules: ModuleType) -> set[type[BaseException]]:
    """Every exception class the modules define (warnings are not raised, so not mapped)."""
    found: set[type[BaseException]] = set()
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            ours = cls.__module__.split(".")[0] == module.__name__.split(".")[0]
            if ours and issubclass(cls, BaseException) and not issubclass(cls, Warning):
                found.add(cls)
    return found


def unmapped(classes: Iterable[type[BaseException]], keys: Iterable[type[BaseException]]) -> set[str]:
    mapped = tuple(keys)
    return {c.__qualname__ for c in classes if not issubclass(c, mapped)}


def package(root: ModuleType) -> list[ModuleType]:
    return [root] + [
        importlib.import_module(f"{root.__name__}.{m.name}") for m in pkgutil.iter_modules(root.__path__)
    ]


def test_every_paho_exception_is_mapped() -> None:
    classes = exceptions(*package(paho.mqtt))
    assert any(c.__name__ == "MalformedPacket" for c in classes)
    assert not unmapped(classes, mqtt_map.ERRORS)
    for cls in classes:
        error = mqtt_map.translate(cls("boom"), "broker 127.0.0.1:1883")
        assert isinstance(error, SourceError) and "127.0.0.1:1883" in str(error)


def test_every_influxdb_client_and_urllib3_exception_is_mapped() -> None:
    classes = exceptions(influxdb_client.client.exceptions, influxdb_client.rest, urllib3.exceptions)
    classes |= exceptions(http.client)
    assert urllib3.exceptions.ReadTimeoutError in classes
    assert not unmapped(classes, influx_map.ERRORS)
    timeout = urllib3.exceptions.ReadTimeoutError(None, "/api/v2/write", "read timed out")  # type: ignore[arg-type]
    assert isinstance(influx_map.translate(timeout, "influx"), WriteTimeoutError)
    refused = influxdb_client.rest.ApiException(status=429, reason="Too Many Requests")  # type: ignore[no-untyped-call]
    mapped = influx_map.translate(refused, "influx")
    assert type(mapped) is WriteError and mapped.status == 429


def test_every_httpx_exception_is_mapped() -> None:
    classes = exceptions(httpx)
    assert httpx.ReadTimeout in classes and httpx.InvalidURL in classes
    assert not unmapped(classes, webhook_map.ERRORS)


def test_uvicorn_failures_are_mapped() -> None:
    classes = exceptions(uvicorn.importer) | {SystemExit, OSError}
    assert not unmapped(classes, uvicorn_map.ERRORS)
    error = uvicorn_map.translate(SystemExit(1), "127.0.0.1:8080")
    assert isinstance(error, MonitorError) and "cannot listen on 127.0.0.1:8080" in str(error)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A real TCP server that accepts and never answers: what a hung InfluxDB looks like."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_influx_timeouts_are_typed(silent_server: int) -> None:
    url = f"http://127.0.0.1:{silent_server}"
    v2 = InfluxV2Writer(Influx(url=url, org="o", bucket="b", token=SecretStr("t"), timeout=0.3))
    v1 = InfluxV1Writer(Influx(url=url, api="v1", database="d", timeout=0.3))
    try:
        for writer in (v2, v1):
            with pytest.raises(WriteTimeoutError, match="no answer in time"):
                writer.write(b"m v=1 1")
    finally:
        v2.close()
        v1.close()


def test_webhook_timeouts_are_typed(silent_server: int) -> None:
    hook = WebhookNotifier(
        Webhook(url=f"http://127.0.0.1:{silent_server}/hook", timeout=0.3, retries=1), "ps-1"
    )
    hook.backoff = 0.01
    alarm = Alarm(
        "outfall.ph", Rule.HIGH, AlarmState.UNACK, Alarms().priorities[Rule.HIGH], 9.6, 9.0, "§139-15 C(3)"
    )

    async def go() -> None:
        try:
            await hook.notify(alarm)
        finally:
            await hook.aclose()

    with pytest.raises(WriteTimeoutError, match="after 2 attempt"):
        asyncio.run(go())


def test_a_failing_alarm_listener_is_counted_and_logged_once_per_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = AlarmManager(Alarms(), Journal(tmp_path / "journal.sqlite"), ManualClock(T0))
    broken = True
    seen: list[str] = []

    def mirror(entry: Entry, alarm: Alarm) -> None:
        if broken:
            raise ConnectionError("broker away")
        seen.append(entry.event)

    after: list[str] = []
    manager.listen(mirror)
    manager.listen(lambda entry, alarm: after.append(entry.event))

    def flip(state: ConditionState, t: float) -> None:
        manager.apply(Condition(t, "outfall.ph", Rule.HIGH, state, 9.5, 9.0, "§139-15 C(3)"))

    with caplog.at_level(logging.DEBUG, logger="monitor.alarms.manager"):
        flip(ConditionState.ACTIVE, T0)
        flip(ConditionState.CLEARED, T0 + 60)
        flip(ConditionState.ACTIVE, T0 + 120)
        broken = False
        flip(ConditionState.CLEARED, T0 + 180)
    name = next(iter(manager.listener_failures))
    assert "mirror" in name and manager.listener_failures == {name: 3}
    assert after == ["activated", "cleared", "activated", "cleared"]  # the next listener still ran
    assert seen == ["cleared"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and "counted in health" in errors[0].getMessage()
    assert any("works again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    manager.close()


def test_json_nested_past_the_parsers_depth_is_a_bad_answer_not_a_crash() -> None:
    # A server (or a proxy before it) answering JSON nested 100,000 deep: `json.loads` raises
    # RecursionError, not ValueError; each boundary maps it like any other bad answer.
    from monitor.errors import SourceError
    from monitor.sinks.drain import _error_text
    from monitor.sources.historian import _json
    from monitor.sources.meter_history import _merge, _results

    deep = b"[" * 100_000 + b"]" * 100_000
    assert _error_text("400 Bad Request: " + deep.decode()).startswith("400 Bad Request: [[[")
    with pytest.raises(SourceError, match="not a JSON answer"):
        _json(deep, "influxdb")
    with pytest.raises(SourceError, match="not a JSON answer"):
        _results(deep, "influxdb")
    with pytest.raises(SourceError, match="unexpected export line"):
        _merge([deep], "victoriametrics")
