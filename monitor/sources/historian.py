"""Replay from the historian: the station's `sensor` series read back, in chunks.

What the daemon (or `monitor replay` with an `influx` section) wrote comes back as
rows for `replay.merge`, so a stored quarter replays like a file:

- InfluxDB 1.x: one InfluxQL query with `chunked=true`; the server streams the
  answer in pieces of `CHUNK_POINTS`, each parsed and handed on before the next is
  read, so memory does not grow with the range.
- VictoriaMetrics: its export API (`/api/v1/export`, one JSON line per series), one
  time window of `WINDOW_S` at a time; `sensor_quality` holds every sample,
  `sensor_value` only the finite ones (line protocol cannot carry NaN).
- InfluxDB 2.x: Flux through influxdb-client (`historian_flux.py`).

Stored rows carry the quality the engine gave them, so a value judged not
believable then is not judged now either. Everything here is the standard
library (http.client, as the 1.x writer): no client library for two GET requests.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import ssl
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from monitor.config import Config, Influx
from monitor.errors import SourceError
from monitor.model import Quality, iso
from monitor.sources.historian_rows import WINDOW_S, Floats, Ints, StoredSeries, _History
from monitor.sources.replay import Rows

CHUNK_POINTS = 50_000
_Tags = tuple[tuple[str, str], ...]  # a VictoriaMetrics series' labels but its name
KINDS = ("influxql", "flux", "victoriametrics")


class Http:
    """GET/POST with the config's TLS and credentials; errors become SourceError."""

    def __init__(self, influx: Influx) -> None:
        url = urllib.parse.urlsplit(influx.url)
        self.base = url.path.rstrip("/")
        self.https = url.scheme == "https"
        self.host = url.hostname or "localhost"
        self.port = url.port or (443 if self.https else 80)
        self.timeout = influx.timeout
        self.target = f"{url.scheme}://{self.host}:{self.port}{self.base}"  # never the credentials
        self.headers: dict[str, str] = {}
        self.token = influx.username is None and influx.token is not None
        if influx.username is not None:
            password = influx.password.get_secret_value() if influx.password else ""
            token = base64.b64encode(f"{influx.username}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"
        elif influx.token is not None:
            self.headers["Authorization"] = f"Token {influx.token.get_secret_value()}"
        self.context: ssl.SSLContext | None = None
        if self.https:
            self.context = ssl.create_default_context(cafile=str(influx.ca_file) if influx.ca_file else None)
            if not influx.verify_tls:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def lines(
        self, path: str, params: Sequence[tuple[str, str]], what: str = "the history"
    ) -> Iterator[bytes]:
        """The answer's lines, read as they arrive; an answer that ends before its declared
        end (Content-Length, the last chunk) is an error, never a shorter answer. `what`
        names what is read in the error (the window, for VictoriaMetrics)."""
        if self.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request("GET", f"{self.base}{path}?{urllib.parse.urlencode(params)}", headers=self.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read(2000).decode(errors="replace").strip()
                if resp.status in (401, 403):
                    which = "token" if self.token else "username and password"
                    text += f" (check the influx section's {which})"
                raise SourceError(f"{self.target}{path}: HTTP {resp.status} {text}")
            if resp.length is None and not resp.chunked:
                # Ended only by the connection closing, a cut could not be told from the end.
                # InfluxDB and VictoriaMetrics always send one or the other; the headers cut
                # before them (the connection dropped) read as an empty answer.
                raise SourceError(
                    f"{self.target}: cannot read {what} (the answer has neither Content-Length"
                    " nor chunks, so where it ends is unknown: was it cut inside its headers?)"
                )
            while line := resp.readline():
                if not line.endswith(b"\n"):  # the last line, or one cut in two
                    _check_end(resp)
                if line.strip():
                    yield line
            _check_end(resp)  # http.client ends a short Content-Length body quietly
        except http.client.IncompleteRead as exc:
            short = "" if exc.expected is None else f" {exc.expected} bytes"
            raise SourceError(
                f"{self.target}: cannot read {what} (the connection dropped{short} before the end"
                " of the answer)"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise SourceError(f"{self.target}: cannot read {what} ({exc})") from exc
        finally:
            if resp is not None:  # an answer to be read until close owns the socket, not conn
                resp.close()
            conn.close()

    def health(self) -> str:
        """The body of `/health` (InfluxDB 2 answers JSON naming itself; VictoriaMetrics "OK")."""
        return b"".join(self.lines("/health", [])).decode(errors="replace")


class InfluxQLHistory(_History):
    """InfluxDB 1.x: `SELECT value, quality, sensor FROM sensor WHERE station = ...`."""

    def __init__(self, config: Config, start: float, end: float) -> None:
        assert config.influx is not None and config.influx.database is not None
        self.http = Http(config.influx)
        self.influx = config.influx
        super().__init__(config, start, end, f"{self.http.target} database {config.influx.database}")

    def query(self) -> str:
        station = self.station.replace("\\", "\\\\").replace("'", "\\'")
        policy = (self.influx.retention_policy or "").replace("\\", "\\\\").replace('"', '\\"')
        rp = f'"{policy}".' if policy else ""  # a quoted identifier, whatever the name holds
        return (
            f'SELECT "value", "quality", "sensor", "unit" FROM {rp}"sensor" WHERE "station" = \'{station}\''
            f" AND time >= {_ns(self.start)} AND time < {_ns(self.end)}"
        )

    def rows(self) -> Iterator[Rows]:
        assert self.influx.database is not None
        params = [
            ("db", self.influx.database),
            ("q", self.query()),
            ("epoch", "ns"),
            ("chunked", "true"),
            ("chunk_size", str(CHUNK_POINTS)),
        ]
        answered = False  # InfluxDB always answers at least `{"results":[...]}`
        for line in self.http.lines("/query", params):
            answered = True
            doc = _json(line, self.http.target)
            if "error" in doc:
                raise SourceError(f"{self.report.path}: {doc['error']}")
            for result in doc.get("results", []):
                if "error" in result:
                    raise SourceError(f"{self.report.path}: {result['error']}")
                for series in result.get("series", []):
                    yield self._series(series)
        if not answered:  # the connection dropped before the body: not an empty range
            raise SourceError(
                f"{self.http.target}: cannot read the history (the answer ended before any result)"
            )

    def _series(self, series: dict[str, Any]) -> Rows:
        cols = {c: i for i, c in enumerate(series["columns"])}
        ti, vi, qi, si = (cols[c] for c in ("time", "value", "quality", "sensor"))
        values = series.get("values", [])
        ui = cols.get("unit")
        return self._rows(
            [str(v[si]) for v in values],
            [v[ti] / 1_000_000_000 for v in values],  # int / int: exactly rounded
            [math.nan if v[vi] is None else float(v[vi]) for v in values],
            [int(Quality.GOOD) if v[qi] is None else int(v[qi]) for v in values],
            None if ui is None else [v[ui] for v in values],
        )


class VictoriaHistory(_History):
    """VictoriaMetrics: `sensor_quality` and `sensor_value` exported a window at a time."""

    def __init__(self, config: Config, start: float, end: float) -> None:
        assert config.influx is not None
        self.http = Http(config.influx)
        super().__init__(config, start, end, f"{self.http.target} (VictoriaMetrics)")

    def rows(self) -> Iterator[Rows]:
        station = self.station.replace("\\", "\\\\").replace('"', '\\"')
        match = f'{{__name__=~"sensor_(value|quality)",station="{station}"}}'
        a = self.start
        while a < self.end:
            b = min(self.end, a + WINDOW_S)
            params = [("match[]", match), ("start", f"{a:.3f}"), ("end", f"{b - 0.001:.3f}")]
            # A sensor can have several series (its kind or unit tags changed, a tag added):
            # each quality series is paired with the value series of the same tags. Arrays,
            # not lists: a 6 h window of 100 sensors at 1 s is 2 M points.
            quality: dict[_Tags, tuple[Ints, Floats]] = {}
            value: dict[_Tags, tuple[Ints, Floats]] = {}
            window = f"the history from {iso(a)} to {iso(b)}"
            for line in self.http.lines("/api/v1/export", params, window):
                metric, got = _export_line(line, f"{self.http.target}: {window}")
                tags = tuple(sorted((str(k), str(v)) for k, v in metric.items() if k != "__name__"))
                if metric.get("__name__") == "sensor_quality":
                    quality[tags] = got
                else:
                    value[tags] = got
            parts: list[StoredSeries] = []
            for tags, (ts, qs) in quality.items():
                labels = dict(tags)
                vs = np.full(ts.size, math.nan)
                if tags in value:  # each quality time's value, the last written if repeated
                    vt, vv = value[tags]
                    order = np.argsort(vt, kind="stable")
                    vt, vv = vt[order], vv[order]
                    at = np.searchsorted(vt, ts, "right") - 1
                    hit = at >= 0
                    hit[hit] = vt[at[hit]] == ts[hit]
                    vs[hit] = vv[at[hit]]
                parts.append(
                    StoredSeries(
                        labels.get("sensor", ""), ts / 1000.0, vs, qs.astype(np.int8), labels.get("unit")
                    )
                )
            if parts:
                yield self._series_rows(parts)
            a = b


def _check_end(resp: http.client.HTTPResponse) -> None:
    """Raises IncompleteRead if the body stopped before its Content-Length (a chunked one
    that stops before its last chunk raises it in http.client already)."""
    if resp.length:
        raise http.client.IncompleteRead(b"", resp.length)


def _export_line(line: bytes, where: str) -> tuple[dict[str, Any], tuple[Ints, Floats]]:
    """One `/api/v1/export` line: the series' labels, its times (ms) and values; anything
    else is an error naming `where`, not a crash or a series quietly left out."""
    doc = _json(line, where)
    metric, times, values = doc.get("metric"), doc.get("timestamps"), doc.get("values")
    if (
        isinstance(metric, dict)
        and isinstance(times, list)
        and isinstance(values, list)
        and len(times) == len(values)
    ):
        try:
            return metric, (np.asarray(times, np.int64), np.asarray(values, np.float64))
        except (TypeError, ValueError, OverflowError):
            pass
    raise SourceError(f"{where}: not an export line (metric, timestamps and values): {line[:200]!r}")


def _ns(t: float) -> int:
    return round(t * 1_000_000) * 1000


def _json(line: bytes, target: str) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError) as exc:  # nested past the parser's depth: not an answer
        raise SourceError(f"{target}: not a JSON answer ({line[:200]!r})") from exc
    if not isinstance(doc, dict):
        raise SourceError(f"{target}: unexpected answer ({line[:200]!r})")
    return doc


def open_history(
    config: Config, start: float, end: float, kind: str = "auto", sensors: Sequence[str] | None = None
) -> _History:
    """The historian the config's `influx` section names: InfluxQL for `api: v1`; for
    `api: v2`, Flux on InfluxDB 2 or the export API on VictoriaMetrics (asked via /health)."""
    if config.influx is None:
        raise SourceError("--from-influx needs an `influx` section in the config")
    if kind == "auto":
        if config.influx.api == "v1":
            kind = "influxql"
        else:
            health = Http(config.influx).health()
            kind = "flux" if '"influxdb"' in health else "victoriametrics"
    history: _History
    if kind == "influxql":
        if config.influx.database is None:
            raise SourceError("influx.database: required to read InfluxDB 1.x (InfluxQL)")
        history = InfluxQLHistory(config, start, end)
    elif kind == "victoriametrics":
        history = VictoriaHistory(config, start, end)
    else:
        from monitor.sources.historian_flux import FluxHistory

        history = FluxHistory(config, start, end)
    if sensors is not None:  # what-if: the candidate's sensors too
        history.sensors = list(sensors)
        history.index = {s: i for i, s in enumerate(sensors)}
    return history
