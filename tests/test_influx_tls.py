"""TLS with real servers: VictoriaMetrics (v2 API) and InfluxDB 1.6 (v1) on HTTPS with a private CA."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from monitor.model import Sample
from monitor.sinks.pipeline import open_sink
from tests.mqtt_tools import make_ca
from tests.services import InfluxDB1, VictoriaMetrics
from tests.sink_config import write_config

T0 = 1_700_000_000.0


def _get(url: str, ca: Path) -> Any:
    with urllib.request.urlopen(url, timeout=10, context=ssl.create_default_context(cafile=str(ca))) as resp:
        return resp.read()


class TlsVictoriaMetrics(VictoriaMetrics):
    def __init__(self, workdir: Path, certs: dict[str, Path]) -> None:
        super().__init__(workdir)
        self.certs = certs

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            *super().command(),
            "-tls",
            f"-tlsCertFile={self.certs['cert']}",
            f"-tlsKeyFile={self.certs['key']}",
        ]

    def ready(self) -> bool:
        try:
            return _get(f"{self.url}/health", self.certs["ca"]) is not None
        except OSError:
            return False

    def get(self, path: str) -> bytes:
        """Over HTTPS, trusting the test CA: `counter`, `wait_for_lines` and `export` use it."""
        return bytes(_get(f"{self.url}{path}", self.certs["ca"]))


class TlsInfluxDB1(InfluxDB1):
    def __init__(self, workdir: Path, certs: dict[str, Path]) -> None:
        super().__init__(workdir)
        self.certs = certs
        text = self.conf.read_text().replace(
            "  log-enabled = false\n",
            "  log-enabled = false\n  https-enabled = true\n"
            f'  https-certificate = "{certs["cert"]}"\n  https-private-key = "{certs["key"]}"\n',
        )
        self.conf.write_text(text)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        try:
            _get(f"{self.url}/ping", self.certs["ca"])
        except OSError:
            return False
        return True

    def query(self, q: str, db: str | None = None, auth: tuple[str, str] | None = None) -> Any:
        params = {"q": q, "epoch": "ms", **({"db": db} if db else {})}
        req = urllib.request.Request(f"{self.url}/query?{urllib.parse.urlencode(params)}", method="POST")
        ctx = ssl.create_default_context(cafile=str(self.certs["ca"]))
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return json.loads(resp.read())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_ca(tmp_path_factory.mktemp("ca"))


def _write(tmp_path: Path, influx: dict[str, Any], value: float, timeout: float = 10) -> int:
    _, config = write_config(tmp_path, influx)
    sink = open_sink(config)
    sink.write_samples([Sample("outfall.ph", T0 + value, value)])
    left = asyncio.run(sink.drain(timeout))
    sink.close()
    return left


def test_v2_over_https_verifies_the_server(tmp_path: Path, certs: dict[str, Path]) -> None:
    vm = TlsVictoriaMetrics(tmp_path / "vm", certs)
    vm.start()
    try:
        base = {"url": vm.url, "org": "o", "bucket": "b"}
        assert _write(tmp_path / "a", {**base, "ca_file": str(certs["ca"])}, 7.0) == 0
        assert _write(tmp_path / "b", base, 7.5, timeout=0.5) == 1  # unknown CA: kept, retried
        assert _write(tmp_path / "c", {**base, "ca_file": str(certs["other_ca"])}, 7.75, timeout=0.5) == 1
        assert _write(tmp_path / "d", {**base, "verify_tls": False}, 8.0) == 0
        vm.wait_for_lines(2)  # the two delivered; the others were never sent
        (series,) = vm.export('{__name__="sensor_value"}')
        assert series["values"] == [7.0, 8.0]
    finally:
        vm.stop()


def test_v1_over_https_verifies_the_server(tmp_path: Path, certs: dict[str, Path]) -> None:
    server = TlsInfluxDB1(tmp_path / "influx", certs)
    server.start()
    try:
        server.query("CREATE DATABASE tls")
        base = {"url": server.url, "api": "v1", "database": "tls"}
        assert _write(tmp_path / "a", {**base, "ca_file": str(certs["ca"])}, 6.5) == 0
        assert _write(tmp_path / "b", base, 6.75, timeout=0.5) == 1  # unknown CA: kept, retried
        assert _write(tmp_path / "c", {**base, "verify_tls": False}, 7.25) == 0
        got = server.query('SELECT "value" FROM "sensor"', db="tls")
        assert [v for _, v in got["results"][0]["series"][0]["values"]] == [6.5, 7.25]
    finally:
        server.stop()
