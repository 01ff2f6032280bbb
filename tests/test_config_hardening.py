"""Config hardening: a non-UTF-8 file, a short console token, credentials in URLs,
the console's Host names, and the compose file's Mosquitto binding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config import Console, redact_url
from monitor.web.guard import allowed_hosts, host_name
from tests.test_config import run_monitor

MINIMAL = "station: {id: ps-1}\nsensors: [{id: f, kind: flow, unit: gpm}]\n"


def test_a_config_that_is_not_utf8_exits_2_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_bytes(MINIMAL.replace("ps-1", "ps-\xe91").encode("latin-1"))
    result = run_monitor("check-config", str(config))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert str(config) in result.stderr and "not UTF-8" in result.stderr


def test_a_short_console_token_is_refused_by_check_config(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(MINIMAL + "console: {token: '${SHORT_TOKEN}'}\n")
    short = run_monitor("check-config", str(config), env={"SHORT_TOKEN": "x" * 15})
    assert short.returncode == 2
    assert "console.token: must be at least 16 characters" in short.stderr
    assert "x" * 15 not in short.stderr + short.stdout
    ok = run_monitor("check-config", str(config), env={"SHORT_TOKEN": "x" * 16})
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://admin:hunter2@influx.example:8086/", "https://admin:***@influx.example:8086/"),
        ("https://tok3n@influx.example/", "https://***@influx.example/"),
        ("http://h/write?db=x&u=me&p=pw&token=abc", "http://h/write?db=x&u=me&p=pw&token=***"),
        ("http://h/api?password=pw&apikey=k", "http://h/api?password=***&apikey=***"),
        ("http://influx:8086", "http://influx:8086"),
    ],
)
def test_credentials_in_urls_are_redacted(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_check_config_never_prints_credentials_in_the_influx_url(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    influx = "influx: {url: 'https://admin:hunter2@influx.example:8086', org: o, bucket: b}\n"
    config.write_text(MINIMAL + influx)
    result = run_monitor("check-config", str(config))
    # neither writer sends credentials from the URL: refused (exit 2), still never printed
    assert result.returncode == 2, result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert "influx.url: credentials in the URL are never sent" in result.stderr


def test_console_host_names() -> None:
    assert host_name("127.0.0.1:8080") == "127.0.0.1"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("Gateway.Example.") == "gateway.example"
    names = allowed_hosts(Console(host="0.0.0.0", allowed_hosts=["gw-7.plant.lan"]))
    assert names == {"localhost", "127.0.0.1", "::1", "gw-7.plant.lan"}
    assert "10.0.0.5" in allowed_hosts(Console(host="10.0.0.5"))


def test_compose_publishes_plain_mqtt_on_loopback_only(repo_root: Path) -> None:
    compose = yaml.safe_load((repo_root / "deploy" / "container" / "compose.yaml").read_text())
    ports = [str(p) for p in compose["services"]["mosquitto"].get("ports", [])]
    for port in ports:
        parts = port.split(":")
        if parts[-1] == "1883":
            assert len(parts) == 3 and parts[0] == "127.0.0.1", f"plain MQTT beyond loopback: {port}"
    unit = (repo_root / "deploy" / "systemd" / "station-monitor.service").read_text()
    assert "StateDirectoryMode=0700" in unit and "UMask=0077" in unit


def test_the_service_starts_after_the_clock_is_synchronised(repo_root: Path) -> None:
    """A gateway without a battery-backed clock boots in 1970 (or its image's build date):
    started before NTP, the daemon would take every record it holds for a clock step back
    (the meter ledger moves rows ahead of the clock at start). The unit waits for
    time-sync.target, which systemd-time-wait-sync.service holds until NTP answers."""
    unit = (repo_root / "deploy" / "systemd" / "station-monitor.service").read_text()
    lines = {
        line.split("=", 1)[0]: line.split("=", 1)[1].split() for line in unit.splitlines() if "=" in line
    }
    assert "time-sync.target" in lines["After"] and "time-sync.target" in lines["Wants"]


def test_the_callout_link_host_and_path_pass_the_guard() -> None:
    """The acknowledge link is its own credential and comes with the host of notify.link_base."""
    import asyncio

    import httpx
    from pydantic import SecretStr

    from monitor.web.guard import Guard

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    console = Console(token=SecretStr("t" * 16))
    guard = Guard(ok, console, extra_hosts=("gw-7.example:8443",), open_writes=("/callout/ack/",))

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="https://gw-7.example:8443") as client:
            return [
                (await client.post("/callout/ack/nonce.sig")).status_code,
                (await client.post("/api/alarms/a/high/ack", json={})).status_code,
                (await client.get("/api/alarms", headers={"Host": "other.example"})).status_code,
            ]

    assert asyncio.run(go()) == [200, 401, 421]


def test_check_config_says_a_wildcard_console_needs_allowed_hosts(tmp_path: Path) -> None:
    config = tmp_path / "station.yaml"
    config.write_text(MINIMAL + "console: {host: 0.0.0.0}\n")
    result = run_monitor("check-config", str(config))
    assert result.returncode == 0 and "console.allowed_hosts" in result.stdout
    config.write_text(MINIMAL + "console: {host: 0.0.0.0, allowed_hosts: [gw-7.plant.lan]}\n")
    assert "console.allowed_hosts" not in run_monitor("check-config", str(config)).stdout
