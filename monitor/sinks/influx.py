"""InfluxDB 2.x/3.x (and 1.8+ with its v2 compatibility API) through influxdb-client.

The only module that imports influxdb-client. It posts line protocol the
outbox already holds, joined into one body per batch: the client's fastest
path (handing it `Point` objects is about 15x slower). Its exceptions become
`WriteError(status, retry_after)` here.
"""

from __future__ import annotations

import http.client
import logging
import os.path
from typing import Any, cast

import influxdb_client
import urllib3
from influxdb_client.client.exceptions import InfluxDBError
from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.domain.write_precision import WritePrecision
from influxdb_client.rest import ApiException

from monitor.config import Influx, redact_url
from monitor.errors import WriteError, WriteTimeoutError
from monitor.sinks.credentials import ScrubLibraryLog, refusal, scrub, secrets_of
from monitor.sinks.retry_after import parse_retry_after

log = logging.getLogger(__name__)


# The error map: what `write` can meet from influxdb-client and the urllib3 under it, most
# specific first (a test checks every exception class those libraries define is covered).
# ApiException carries the HTTP status and is translated with it, in `translate`.
ERRORS: dict[type[BaseException], type[WriteError]] = {
    urllib3.exceptions.TimeoutError: WriteTimeoutError,  # connect or read timeout
    TimeoutError: WriteTimeoutError,
    ApiException: WriteError,
    InfluxDBError: WriteError,
    urllib3.exceptions.HTTPError: WriteError,  # connection refused, TLS, protocol
    urllib3.exceptions.ProxySchemeUnsupported: WriteError,
    http.client.HTTPException: WriteError,  # IncompleteRead and kin
    OSError: WriteError,
}
_CAUGHT = tuple(ERRORS)


def translate(exc: BaseException, target: str) -> WriteError:
    """One client exception -> `WriteError` (status, Retry-After) or `WriteTimeoutError`."""
    if isinstance(exc, ApiException) and exc.status:
        return WriteError(
            f"{target}: HTTP {exc.status} {_reason(exc)}",
            status=int(exc.status),
            retry_after=parse_retry_after(_header(exc, "Retry-After")),
        )
    kind = next((ours for cls, ours in ERRORS.items() if isinstance(exc, cls)), WriteError)
    # the client wraps TLS and connection failures as ApiException with status 0
    text = _reason(exc) if isinstance(exc, ApiException) else str(exc) or type(exc).__name__
    if kind is WriteTimeoutError:
        return WriteTimeoutError(f"{target}: no answer in time: {text}")
    return kind(f"{target}: cannot reach the server: {text}")


class InfluxV2Writer:
    """`POST /api/v2/write?org=..&bucket=..&precision=ns` with the token or basic auth, TLS
    verified by default."""

    def __init__(self, influx: Influx) -> None:
        assert influx.bucket is not None and influx.org is not None  # checked by config
        self.bucket = influx.bucket
        self.org = influx.org
        self._client = InfluxDBClient(
            url=influx.url,
            token=_credential(influx),
            auth_basic=influx.username is not None,
            org=influx.org,
            timeout=int(influx.timeout * 1000),
            verify_ssl=influx.verify_tls,
            ssl_ca_cert=str(influx.ca_file) if influx.ca_file else None,
            retries=False,  # the drainer retries, with backoff the operator can see
        )
        if not influx.verify_tls:
            # the operator chose this; say it once here rather than urllib3 on every request
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            log.warning("%s: TLS certificate verification is off (verify_tls: false)", redact_url(influx.url))
        self._api = self._client.write_api(write_options=SYNCHRONOUS)
        self._secrets = secrets_of(influx)
        self._scrub_log = ScrubLibraryLog(os.path.dirname(influxdb_client.__file__), self._secrets)
        logging.getLogger().addFilter(self._scrub_log)  # the client logs on the root logger
        self.target = f"{redact_url(influx.url)} org {self.org} bucket {self.bucket}"

    def write(self, body: bytes) -> None:
        try:
            self._api.write(
                bucket=self.bucket,
                org=self.org,
                record=body,
                write_precision=cast(WritePrecision, WritePrecision.NS),
            )
        except _CAUGHT as exc:
            error = translate(exc, self.target)
            text, status = scrub(str(error), self._secrets), error.status  # a proxy may echo them
            if status is not None:
                status, text = refusal(status, text)
            raise type(error)(text, status=status, retry_after=error.retry_after) from exc

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]
        self._client.close()  # type: ignore[no-untyped-call]
        logging.getLogger().removeFilter(self._scrub_log)


def _credential(influx: Influx) -> str:
    """What influxdb-client puts in the Authorization header: with `auth_basic` it sends
    `Basic base64(token)`, so `user:password`; else `Token <token>`; "" sends no header.
    Its own `username=`/`password=` are not used: they sign in to an InfluxDB 2 session
    (`/api/v2/signin`), which InfluxDB 1.8, VictoriaMetrics and a vmauth do not answer."""
    if influx.username is not None:
        password = influx.password.get_secret_value() if influx.password else ""
        return f"{influx.username}:{password}"
    return influx.token.get_secret_value() if influx.token else ""


def _header(exc: ApiException, name: str) -> str | None:
    headers: Any = exc.headers
    if not headers:
        return None
    value = headers.get(name)
    return None if value is None else str(value)


def _reason(exc: ApiException) -> str:
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    text = str(body or exc.reason or "").strip()
    return text[:2000]
