"""Real Mosquitto, InfluxDB 1.x and VictoriaMetrics for tests, on free loopback ports.

Each server runs from the Debian binary with a temporary data directory, is
waited for until it answers, and is stopped by its own PID. Restartable, so
tests can take a server away mid-stream and bring it back on the same port.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.waiting import wait_until as wait_until  # noqa: PLC0414 (re-exported: tests import it from here)

# VictoriaMetrics' own counters: InfluxDB lines it parsed from write requests, and lines it
# skipped as unparseable while still answering 204 (docs/outputs.md).
LINES_PARSED = 'vm_protoparser_rows_read_total{type="influx"}'
LINES_INVALID = 'vm_rows_invalid_total{type="influx"}'


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs: bound and not
    listening, so no other server can take it. A bare `free_port()` for a server meant to be
    unreachable can be bound by another test's server a moment later, which then answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        yield port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def json_or_none(url: str) -> Any:
    """The JSON a GET of `url` answers, or None while nothing answers there (a daemon
    starting, stopping or killed): for waits that poll a console until it says something."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


@dataclass(frozen=True)
class SimulatorProcess:
    port: int
    proc: subprocess.Popen[bytes]

    def trigger(self) -> None:
        """Start the scenario given with `--on-sigusr1` now."""
        self.proc.send_signal(signal.SIGUSR1)


@contextlib.contextmanager
def simulator_process(*args: str, port: int | None = None) -> Iterator[SimulatorProcess]:
    """The station simulator as a process of its own (what a field device would be),
    on a free Modbus TCP port, or on `port` (a device back at its address after an
    outage). Extra `args` go to `python -m simulators.modbus_server`."""
    port = free_port() if port is None else port
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulators.modbus_server", "--port", str(port), *args],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: port_open(port), timeout=20, what="simulator")
        yield SimulatorProcess(port, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Server:
    """A child process with a data directory; subclasses say how to start and probe it."""

    name = "server"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        return port_open(self.port)

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
        )
        log.close()
        try:
            wait_until(self._alive_and_ready, timeout=30, what=f"{self.name} on port {self.port}")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"{self.name} did not start; log:\n{self.log()}") from None
        except RuntimeError:
            self._abandon()
            raise

    def _alive_and_ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.log()}")
        return self.ready()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        wait_until(lambda: not port_open(self.port), timeout=10, what=f"{self.name} port to close")

    def _abandon(self) -> None:
        """Kill our process without waiting for the port: something else may hold it."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Mosquitto(Server):
    """Mosquitto with optional password file, ACL and TLS listener."""

    name = "mosquitto"

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        users: dict[str, str] | None = None,
        acl: str | None = None,
        tls: dict[str, Path] | None = None,
        extra: str = "",
    ) -> None:
        super().__init__(workdir, port)
        self.users = users
        self.acl = acl
        self.tls = tls
        self.extra = extra
        self.conf = workdir / "mosquitto.conf"
        self._write_conf()

    def _write_conf(self) -> None:
        lines = [
            f"user {getpass.getuser()}",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "log_dest stdout",
            "log_type error",
            "log_type warning",
            "max_queued_messages 0",
            "max_inflight_messages 0",
            "per_listener_settings false",
            f"listener {self.port} 127.0.0.1",
        ]
        if self.tls:
            lines += [
                f"cafile {self.tls['ca']}",
                f"certfile {self.tls['cert']}",
                f"keyfile {self.tls['key']}",
            ]
        if self.users is not None:
            pw = self.workdir / "passwd"
            pw.write_text("")
            for user, password in self.users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(pw), user, password], check=True)
            os.chmod(pw, 0o600)
            lines += ["allow_anonymous false", f"password_file {pw}"]
        else:
            lines += ["allow_anonymous true"]
        if self.acl is not None:
            acl_path = self.workdir / "acl"
            acl_path.write_text(self.acl)
            os.chmod(acl_path, 0o600)
            lines += [f"acl_file {acl_path}"]
        self.conf.write_text("\n".join(lines) + "\n" + self.extra)

    def command(self) -> list[str]:
        return [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(self.conf)]


class VictoriaMetrics(Server):
    """VictoriaMetrics: accepts the InfluxDB v2 write API; read back with /api/v1/export."""

    name = "victoria-metrics"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics",
            f"-storageDataPath={self.workdir / 'data'}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-retentionPeriod=100y",
            "-loggerLevel=ERROR",
        ]

    def ready(self) -> bool:
        """Healthy, and ours: a server another test started on the same port (between our
        `free_port()` and our bind, or on a restart) would otherwise pass for this one."""
        try:
            status, _ = http("GET", f"{self.url}/health")
            if status != 200:
                return False
            status, flags = http("GET", f"{self.url}/flags")
        except OSError:
            return False
        if status == 200 and f'-storageDataPath="{self.workdir / "data"}"' not in flags.decode():
            raise RuntimeError(f"another server answers on port {self.port}, not ours ({self.workdir})")
        return status == 200

    def get(self, path: str) -> bytes:
        """GET `path` (e.g. "/metrics") from this server; anything but 200 fails the test."""
        status, body = http("GET", f"{self.url}{path}")
        assert status == 200, body
        return body

    def counter(self, name: str) -> float:
        """One of the server's own counters from /metrics (e.g. the lines it parsed), 0 if absent."""
        for line in self.get("/metrics").decode().splitlines():
            key, _, value = line.rpartition(" ")
            if key == name:
                return float(value)
        return 0.0

    def lines_taken(self) -> int:
        """InfluxDB lines this server has parsed or skipped as unparseable since it started."""
        return int(self.counter(LINES_PARSED) + self.counter(LINES_INVALID))

    def wait_for_lines(self, total: int, timeout: float = 60.0) -> None:
        """Wait, bounded, until the server has taken `total` lines since it started (a
        `lines_taken()` from before the writes plus the lines they delivered).

        VictoriaMetrics 1.79 answers 204 to a write before it parses the lines, so a read
        right after the answer can miss points it acknowledged (docs/outputs.md, "Checking
        a drain against VictoriaMetrics"). A line never sent never counts: a lost point
        fails here, naming the count, or in the test's own read after."""
        start = self.lines_taken()
        wait_until(
            lambda: self.lines_taken() >= total,
            timeout=timeout,
            what=f"{self.name} on port {self.port} to take {total} InfluxDB line(s) (it had {start})",
        )

    def write(self, lines: Sequence[str], org: str = "o", bucket: str = "b") -> None:
        """Write `lines` (line protocol, ns) with the v2 API, as a station would, and wait
        until the server has parsed them: the next `export()` can read them."""
        before = self.lines_taken()
        query = urllib.parse.urlencode({"org": org, "bucket": bucket, "precision": "ns"})
        status, body = http("POST", f"{self.url}/api/v2/write?{query}", "\n".join(lines).encode())
        assert status == 204, body
        self.wait_for_lines(before + len(lines))

    def flush(self) -> None:
        """Make the rows still buffered searchable (`/internal/force_flush`); `export` does."""
        self.get("/internal/force_flush")

    def settle(self, total: int) -> None:
        """Wait until the server has taken `total` lines, then restart it, so every point it
        acknowledged is searchable. A flush does not wait for a conversion the server's own
        flusher has begun: a read right after it missed a station's first points (a test
        that compares a whole export failed 2 times in ~20 under load, `first_read`
        500042000 against 500084000)."""
        self.wait_for_lines(total)
        self.restart()

    def export(self, match: str = '{__name__!=""}', end: float | None = None) -> list[dict[str, Any]]:
        """Every series matching `match`, after a flush so fresh points are readable;
        `end` (epoch seconds, default now) for points an accelerated clock put ahead.
        Points written by another client are readable only once the server has parsed
        them: `wait_for_lines` first (`write` does).

        /internal/force_flush converts the rows still buffered before it returns, and the
        export API has no latency offset or cache; but a conversion the server's own flusher
        has begun is not waited for, so a read that must hold every acknowledged point comes
        after `restart()` (docs/outputs.md, "Checking a drain against VictoriaMetrics")."""
        self.flush()
        window = {"start": "0"} if end is None else {"start": "0", "end": f"{end:.3f}"}
        query = urllib.parse.urlencode({"match[]": match, **window})
        body = self.get(f"/api/v1/export?{query}")
        return [json.loads(line) for line in body.decode().splitlines() if line.strip()]


class VMAuth(Server):
    """VictoriaMetrics' own auth proxy (`vmauth`, Debian's victoria-metrics package) in front
    of `backend`, the way a utility gives clerks credentials without `-httpAuth.*` on the
    server. Every VictoriaMetrics binary answers `/flags` and `/metrics` itself, vmauth too.
    Without the user's basic auth it answers 401."""

    name = "vmauth"

    def __init__(
        self, workdir: Path, backend: str, username: str = "clerk", password: str = "s3cret-pw"
    ) -> None:
        super().__init__(workdir)
        (workdir / "auth.yml").write_text(
            f'users:\n- username: {username}\n  password: {password}\n  url_prefix: "{backend}"\n',
            encoding="utf-8",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            shutil.which("vmauth") or "/usr/bin/vmauth",
            f"-auth.config={self.workdir / 'auth.yml'}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-loggerLevel=ERROR",
        ]


class DedupVictoriaMetrics(VictoriaMetrics):
    """VictoriaMetrics started as our docs once advised, `-dedup.minScrapeInterval=1ms`: one
    sample per series and millisecond. The 1.79 we run applies it at query time too (the
    export of two parts not yet merged already holds one sample), and which value stays at
    one millisecond is neither the largest nor the last written (measured: tests in
    test_billing_historian_dedup.py)."""

    def command(self) -> list[str]:
        return [*super().command(), "-dedup.minScrapeInterval=1ms"]


class InfluxDB1(Server):
    """InfluxDB 1.x (Debian `influxdb`): the v1 /write API, read back with InfluxQL."""

    name = "influxd"

    def __init__(self, workdir: Path, port: int | None = None, auth: bool = False) -> None:
        super().__init__(workdir, port)
        self.rpc_port = free_port()
        self.auth = auth
        self.conf = workdir / "influxdb.conf"
        d = workdir
        self.conf.write_text(
            f"""reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"
[meta]
  dir = "{d}/meta"
[data]
  dir = "{d}/data"
  wal-dir = "{d}/wal"
  query-log-enabled = false
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{self.port}"
  auth-enabled = {"true" if auth else "false"}
  log-enabled = false
[continuous_queries]
  enabled = false
"""
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [shutil.which("influxd") or "/usr/bin/influxd", "-config", str(self.conf)]

    def ready(self) -> bool:
        try:
            status, _ = http("GET", f"{self.url}/ping")
        except OSError:
            return False
        return status == 204

    def query(self, q: str, db: str | None = None, auth: tuple[str, str] | None = None) -> Any:
        params = {"q": q, "epoch": "ms"}
        if db:
            params["db"] = db
        if auth:
            params["u"], params["p"] = auth
        status, body = http("POST", f"{self.url}/query?{urllib.parse.urlencode(params)}")
        assert status == 200, body
        return json.loads(body)
