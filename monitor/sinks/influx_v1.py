"""InfluxDB 1.x through its `/write` API, over the standard library's http.client.

InfluxDB 1.x has no org/bucket; it takes `db`, `rp` and basic auth, or (1.8+,
and 2.x/3.x's v1 API) `Authorization: Token`. The credentials travel in the
Authorization header (never in the URL, which proxies log). One keep-alive
connection, reopened after any failure.
"""

from __future__ import annotations

import base64
import http.client
import logging
import ssl
import urllib.parse

from monitor.config import Influx, redact_url
from monitor.errors import WriteError, WriteTimeoutError
from monitor.sinks.credentials import refusal, scrub, secrets_of
from monitor.sinks.retry_after import parse_retry_after

log = logging.getLogger(__name__)


class InfluxV1Writer:
    """`POST /write?db=..&rp=..&precision=ns`; 204 means stored."""

    def __init__(self, influx: Influx) -> None:
        assert influx.database is not None  # checked by config
        url = urllib.parse.urlsplit(influx.url)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._timeout = influx.timeout
        params = {"db": influx.database, "precision": "ns"}
        if influx.retention_policy:
            params["rp"] = influx.retention_policy
        self._path = url.path.rstrip("/") + "/write?" + urllib.parse.urlencode(params)
        self._headers = {"Content-Type": "text/plain; charset=utf-8"}
        if influx.username is not None:
            password = influx.password.get_secret_value() if influx.password else ""
            token = base64.b64encode(f"{influx.username}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        elif influx.token is not None:
            # InfluxDB 1.8+ (`user:password` as the token) and 2.x/3.x's v1 API take this; the
            # historian reader sends the same header, so a token that reads also writes
            self._headers["Authorization"] = f"Token {influx.token.get_secret_value()}"
        self._secrets = secrets_of(influx)
        self._context: ssl.SSLContext | None = None
        if self._https:
            self._context = ssl.create_default_context(cafile=str(influx.ca_file) if influx.ca_file else None)
            if not influx.verify_tls:
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE
                log.warning(
                    "%s: TLS certificate verification is off (verify_tls: false)", redact_url(influx.url)
                )
        self._conn: http.client.HTTPConnection | None = None
        self.target = f"{redact_url(influx.url)} database {influx.database}" + (
            f" rp {influx.retention_policy}" if influx.retention_policy else ""
        )

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout, context=self._context
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn

    def write(self, body: bytes) -> None:
        conn = self._connection()
        try:
            conn.request("POST", self._path, body=body, headers=self._headers)
            resp = conn.getresponse()
            text = resp.read()
        except TimeoutError as exc:  # socket.timeout: no answer within influx.timeout
            self.close()
            raise WriteTimeoutError(f"{self.target}: no answer in time: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise WriteError(f"{self.target}: cannot reach the server: {exc}") from exc
        if resp.status in (200, 204):
            return
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        reason = scrub(text.decode(errors="replace").strip()[:2000], self._secrets)  # a proxy may echo them
        status, reason = refusal(resp.status, reason)
        raise WriteError(
            f"{self.target}: HTTP {resp.status} {reason}",
            status=status,
            retry_after=parse_retry_after(resp.getheader("Retry-After")),
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
