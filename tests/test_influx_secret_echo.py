"""A proxy or server that echoes the credentials back, in any form, never puts them in an
error, a log line or `outbox status`; a URL with credentials in it is refused at start.

The echoing server here is a stand-in (http.server on loopback): no real vmauth or InfluxDB
echoes the Authorization header URL-encoded, JSON-escaped or in a redirect's userinfo on
demand, and proxies in the field do (error pages that quote the request)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import logging
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from monitor.model import Sample
from monitor.sinks.pipeline import open_sink
from tests.cli import run_monitor
from tests.sink_config import write_config

T0 = 1_700_000_000.0
USER = "station"
PASSWORD = 'pw"9f/3k\\2+é'  # changes under URL-encoding and JSON escaping
PAIR = f"{USER}:{PASSWORD}"
FORMS = {
    "plain": PAIR,
    "url-encoded": urllib.parse.quote(PAIR, safe=""),
    "url-encoded-plus": urllib.parse.quote_plus(PASSWORD),
    "json": json.dumps({"error": f"bad credentials {PAIR}"}),
    "json-utf8": json.dumps({"error": f"bad credentials {PAIR}"}, ensure_ascii=False),
    "basic": "Basic " + base64.b64encode(PAIR.encode()).decode(),
}
# what must never be seen, in any of the forms above
LEAKS = ("9f/3k", "9f%2F3k", "9f\\/3k", base64.b64encode(PAIR.encode()).decode()[8:])


class Echo(http.server.BaseHTTPRequestHandler):
    """Answers every POST with `status` and a body quoting the credentials in one `form`;
    a 3xx carries them in the Location's userinfo."""

    status = 400
    form = "plain"

    def do_POST(self) -> None:
        self.seen.append(self.headers.get("Authorization", ""))  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = f"denied: {FORMS[self.form]}".encode()
        self.send_response(self.status)
        if 300 <= self.status < 400:
            userinfo = urllib.parse.quote(USER, safe="") + ":" + urllib.parse.quote(PASSWORD, safe="")
            self.send_header("Location", f"http://{userinfo}@127.0.0.1:1/write")
            body = f'<a href="http://{userinfo}@127.0.0.1:1/write">moved</a>'.encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[type[Echo]]:
    handler = type("EchoHandler", (Echo,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("api", ["v1", "v2"])
@pytest.mark.parametrize("status", [302, 400, 401, 403, 407, 500])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_echoed_credentials_never_reach_error_or_log(
    tmp_path: Path,
    echo: type[Echo],
    api: str,
    status: int,
    form: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    echo.status, echo.form = status, form
    monkeypatch.setenv("INFLUX_PW", PASSWORD)
    keys = {"database": "d"} if api == "v1" else {"org": "o", "bucket": "b"}
    influx = {"url": echo.url, "api": api, **keys, "username": USER, "password": "${INFLUX_PW}"}  # type: ignore[attr-defined]
    caplog.set_level(logging.DEBUG)
    _, config = write_config(tmp_path, influx, station="echo")
    sink = open_sink(config)
    try:
        sink.write_samples([Sample("outfall.ph", T0, 7.25)])
        asyncio.run(sink.drain(0.3))
        assert sink.drainer is not None
        assert sink.outbox is not None
        seen = f"{sink.drainer.stats.last_error} {caplog.text} {sink.outbox.stats()!r}"
        seen += repr(sink.outbox.dead_letters())  # a 400 or 500 may dead-letter the batch
        assert f"HTTP {status}" in seen, seen
        for leak in LEAKS:
            assert leak not in seen, (leak, seen)
    finally:
        sink.close()


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_url_with_credentials_exits_2_without_echoing_them(tmp_path: Path, api: str) -> None:
    """`http://user:pass@host` would be sent by neither writer (the v1 writer took the host
    and dropped the rest) and a URL is printed in many places: refused, naming the keys to use."""
    keys = {"database": "d"} if api == "v1" else {"org": "o", "bucket": "b"}
    path = tmp_path / "station.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "ps-1", "name": "x"},
                "sensors": [{"id": "outfall.ph", "kind": "ph"}],
                "influx": {"url": "http://station:hunter2@127.0.0.1:9", "api": api, **keys},
            }
        )
    )
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "influx.url" in result.stderr and "username" in result.stderr, result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_v1_token_is_sent_as_the_historian_sends_it(
    tmp_path: Path, echo: type[Echo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`api: v1` with `token`: the historian reader sent `Token <token>` while the v1 writer
    dropped it unseen (a write to InfluxDB 2's v1 API, or 1.8 with auth, got 401 forever).
    Both send the same header now. The echo server stands in for InfluxDB 1.8+/2.x's v1
    /write, which takes `Token`: Debian's InfluxDB 1.6 predates that scheme."""
    from monitor.sources.historian import Http

    echo.status = 401
    monkeypatch.setenv("INFLUX_TOKEN", "station:t0ken-pw-77")
    influx = {"url": echo.url, "api": "v1", "database": "d", "token": "${INFLUX_TOKEN}"}  # type: ignore[attr-defined]
    _, config = write_config(tmp_path, influx, station="echo")
    assert config.influx is not None
    sink = open_sink(config)
    try:
        sink.write_samples([Sample("outfall.ph", T0, 7.25)])
        asyncio.run(sink.drain(0.3))
    finally:
        sink.close()
    assert echo.seen == [Http(config.influx).headers["Authorization"]] * len(echo.seen), echo.seen  # type: ignore[attr-defined]
    assert echo.seen and echo.seen[0] == "Token station:t0ken-pw-77"  # type: ignore[attr-defined]
