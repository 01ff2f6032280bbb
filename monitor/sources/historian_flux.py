"""InfluxDB 2.x history through influxdb-client's query API (Flux), a window at a time.

The write side's adapter is `sinks/influx.py`; this is the query side's, kept apart
so sources never import sinks. Each window is one Flux query that pivots `value`
and `quality` into one record per sample; records are streamed
(`query_stream`), so a window is never held as a table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.rest import ApiException
from urllib3.exceptions import HTTPError

from monitor.config import Config
from monitor.errors import SourceError
from monitor.model import Quality
from monitor.sources.historian_rows import WINDOW_S, _History
from monitor.sources.replay import Rows

FLUX = """from(bucket: {bucket})
  |> range(start: {start}, stop: {stop})
  |> filter(fn: (r) => r._measurement == "sensor" and r.station == {station})
  |> filter(fn: (r) => r._field == "value" or r._field == "quality")
  |> pivot(rowKey: ["_time", "sensor"], columnKey: ["_field"], valueColumn: "_value")
  |> group()
  |> sort(columns: ["_time"])
  |> keep(columns: ["_time", "sensor", "unit", "value", "quality"])"""


def _string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _refused(exc: ApiException) -> str:
    """The server's answer in one line: status, reason, its `message`; not influxdb-client's
    multi-line text with every response header."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    try:
        message = str(json.loads(body).get("message", body))
    except (ValueError, AttributeError):
        message = body
    text = f"HTTP {exc.status} {exc.reason}: {' '.join(message.split())[:300]}"
    if exc.status in (401, 403):
        text += " (check the influx section's token)"
    return text


class FluxHistory(_History):
    def __init__(self, config: Config, start: float, end: float) -> None:
        influx = config.influx
        assert influx is not None and influx.bucket is not None and influx.org is not None
        self.bucket, self.org = influx.bucket, influx.org
        self.client = InfluxDBClient(
            url=influx.url,
            token=influx.token.get_secret_value() if influx.token else "",
            org=influx.org,
            timeout=int(influx.timeout * 1000),
            verify_ssl=influx.verify_tls,
            ssl_ca_cert=str(influx.ca_file) if influx.ca_file else None,
        )
        super().__init__(config, start, end, f"{influx.url} bucket {influx.bucket} (Flux)")

    def query(self, a: float, b: float) -> str:
        return FLUX.format(
            bucket=_string(self.bucket), start=_when(a), stop=_when(b), station=_string(self.station)
        )

    def rows(self) -> Iterator[Rows]:
        api = self.client.query_api()
        a = self.start
        try:
            while a < self.end:
                b = min(self.end, a + WINDOW_S)
                names: list[str] = []
                times: list[float] = []
                values: list[float] = []
                quals: list[int] = []
                units: list[str | None] = []
                for rec in api.query_stream(self.query(a, b), org=self.org):
                    v = rec.values
                    names.append(str(v.get("sensor", "")))
                    times.append(v["_time"].timestamp())
                    values.append(float("nan") if v.get("value") is None else float(v["value"]))
                    quals.append(int(Quality.GOOD) if v.get("quality") is None else int(v["quality"]))
                    units.append(v.get("unit"))
                if times:
                    yield self._rows(names, times, values, quals, units)
                a = b
        except ApiException as exc:
            raise SourceError(f"{self.report.path}: {_refused(exc)}") from exc
        except (HTTPError, OSError) as exc:
            raise SourceError(f"{self.report.path}: cannot read the history ({exc})") from exc
        finally:
            self.client.close()  # type: ignore[no-untyped-call]
