"""The `meter` measurement read back from the central historian, for utility-wide billing.

Each station's ledger writes its rows through the outbox (`lineproto.meter_point_line`):
measurement `meter`, tags station/meter/account/unit, fields reading, consumption,
consumption_ft3, accepted. This module reads them back, as they are stored:

- InfluxDB 1.x (`influx.api: v1`) through InfluxQL on `/query`. A point is one per
  series and timestamp, so a re-sent or re-judged ledger row overwrites the old one.
- VictoriaMetrics (`influx.api: v2`: it takes the v2 write API) through
  `/api/v1/export`, which returns raw samples. It keeps *every* value written at one
  timestamp (checked against the real server in the tests), so a row the ledger
  re-judged or an operator amended shows up twice; such a time is marked `rewritten`
  and the largest value of each field is taken. Billing flags it. An identical re-send
  (delivery is at least once) is one value, read once. Started with
  `-dedup.minScrapeInterval` the server keeps one value per field and millisecond (the
  1.79 tested: neither the largest nor the last written, at query time too), so nothing
  here can tell a point written twice: `deduplication()` says so and billing flags the rows
  it may have changed `deduplicated` (`meters.dedup` says which). One such
  case is known for sure: a point a clock step moved its reading away from is written
  again rejected, billing nothing, with `restamped` set (`MeterBook.take_records`); its
  values are those (the smallest), not the accepted ones it had, as InfluxDB's overwrite
  leaves them, and it is not `rewritten`. `restamped` is the step's id N on the overwrite,
  -N on a reading written at a time step N (the latest) moved readings from: a reading
  written there after the overwrite makes the time `rewritten`. `corrected` 1 marks a point a
  correction sent again (`MeterBook.corrected`): read as the sample's `corrected`, for the
  dedup doubt, never as a value.

An InfluxDB 2.x is not read through Flux: its `/api/v1/export` answers 404 and the
error says so (its InfluxQL compatibility endpoint can be named with `api: v1`).
HTTP, credentials and TLS are `historian.Http`'s, which replay's reader uses too.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from monitor.config import Influx
from monitor.errors import SourceError
from monitor.sources.historian import Http

FIELDS = ("reading", "consumption", "consumption_ft3", "accepted")
RESTAMPED = "restamped"  # 1 on a point a clock step moved away (`lineproto.meter_point_line`)
CORRECTED = "corrected"  # 1 on a point a correction sent again (`MeterBook.corrected`)
DAY_MS = 86_400_000
UNKNOWN = "unknown ("  # how `deduplication()` starts when the flags cannot be read
# How far back `last_accepted` (ahead: `next_accepted`) looks for the reading that
# opens (follows) a quarter, widening only when nothing is found: most meters read
# daily, few stay silent for a year.
LOOKBACK_MS = (2 * DAY_MS, 40 * DAY_MS, 400 * DAY_MS, None)


@dataclass(frozen=True, slots=True)
class MeterSample:
    """One stored `meter` point; a field is None when the point does not carry it."""

    meter: str
    account: str
    unit: str
    time_ms: int
    reading: float | None
    consumption: float | None
    consumption_ft3: float | None
    accepted: float | None
    rewritten: bool = False  # more than one value was stored at this time (VictoriaMetrics)
    restamped: bool = False  # a clock step's mark is stored at this time (VictoriaMetrics)
    corrected: bool = False  # a correction sent this point again (VictoriaMetrics)


def open_history(influx: Influx) -> InfluxQLMeterHistory | VictoriaMeterHistory:
    """The reader for the configured server (api v1: InfluxQL; v2: VictoriaMetrics export)."""
    return InfluxQLMeterHistory(influx) if influx.api == "v1" else VictoriaMeterHistory(influx)


def _quote(text: str) -> str:
    """A string literal for InfluxQL ('...') or MetricsQL ("..."): both escape \\ and quotes."""
    return text.replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"')


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class InfluxQLMeterHistory:
    """InfluxDB 1.x: `SELECT ... FROM meter` with `epoch=ms`, chunked."""

    def __init__(self, influx: Influx) -> None:
        assert influx.database is not None  # checked by config
        self._http = Http(influx)
        self._db = influx.database
        rp = influx.retention_policy
        self._from = f'"{_quote(rp)}"."meter"' if rp else '"meter"'
        self.target = f"{self._http.target} database {influx.database}"  # never the credentials

    def _select(self, where: str, tail: str = "") -> list[MeterSample]:
        q = f"SELECT {', '.join(FIELDS)} FROM {self._from} WHERE {where} GROUP BY *{tail}"
        params = [("db", self._db), ("q", q), ("epoch", "ms"), ("chunked", "true"), ("chunk_size", "10000")]
        out: list[MeterSample] = []
        for chunk in self._http.lines("/query", params):  # one JSON document per chunk
            for result in _results(chunk, self.target):
                for series in result.get("series", []):
                    out.extend(_influx_series(series))
        return sorted(out, key=lambda s: (s.time_ms, s.meter))

    def records(self, station: str, after_ms: int, until_ms: int) -> list[MeterSample]:
        return self._select(f"station = '{_quote(station)}' AND time > {after_ms}ms AND time <= {until_ms}ms")

    def last_accepted(self, station: str, meter: str, at_ms: int) -> MeterSample | None:
        where = (
            f"station = '{_quote(station)}' AND meter = '{_quote(meter)}'"
            f" AND accepted = 1 AND time <= {at_ms}ms"
        )
        found = self._select(where, " ORDER BY time DESC LIMIT 1")  # the last per series (account, unit)
        return found[-1] if found else None

    def next_accepted(self, station: str, meter: str, after_ms: int) -> MeterSample | None:
        """The first accepted point of `meter` after `after_ms`."""
        where = (
            f"station = '{_quote(station)}' AND meter = '{_quote(meter)}'"
            f" AND accepted = 1 AND time > {after_ms}ms"
        )
        found = self._select(where, " ORDER BY time ASC LIMIT 1")  # the first per series
        return found[0] if found else None

    def has_records_from(self, station: str, from_ms: int) -> bool:
        q = (
            f"SELECT accepted FROM {self._from} WHERE station = '{_quote(station)}'"
            f" AND time >= {from_ms}ms LIMIT 1"
        )
        lines = self._http.lines("/query", [("db", self._db), ("q", q), ("epoch", "ms")])
        return any(r.get("series") for line in lines for r in _results(line, self.target))

    def deduplication(self) -> str:
        """'' : InfluxDB keeps one point per series and time, the last written (an overwrite)."""
        return ""


def _results(line: bytes, target: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):  # nested past the parser's depth: not an answer
        raise SourceError(f"{target}: not a JSON answer ({line[:200]!r})") from None
    if not isinstance(doc, dict):
        raise SourceError(f"{target}: unexpected answer to a query")
    if "error" in doc:
        raise SourceError(f"{target}: {doc['error']}")
    results = doc.get("results", [])
    for r in results:
        if "error" in r:
            raise SourceError(f"{target}: {r['error']}")
    return list(results)


def _influx_series(series: dict[str, Any]) -> Iterator[MeterSample]:
    tags = series.get("tags") or {}
    cols = series["columns"]
    for values in series.get("values", []):
        row = dict(zip(cols, values, strict=True))
        yield MeterSample(
            meter=str(tags.get("meter", "")),
            account=str(tags.get("account", "")),
            unit=str(tags.get("unit", "")),
            time_ms=int(row["time"]),
            reading=_number(row.get("reading")),
            consumption=_number(row.get("consumption")),
            consumption_ft3=_number(row.get("consumption_ft3")),
            accepted=_number(row.get("accepted")),
        )


class VictoriaMeterHistory:
    """VictoriaMetrics: `/api/v1/export` of `meter_<field>{station=...}` (JSON lines)."""

    def __init__(self, influx: Influx) -> None:
        self._http = Http(influx)
        self.target = self._http.target  # never the credentials
        self._dedup: str | None = None
        self._stored: str | None = None  # why /flags may not be the storage's ('' when it is)

    def deduplication(self) -> str:
        """The server's `-dedup.minScrapeInterval` ('' when off), from its `/flags`, read once.

        With it on, one sample per field and interval is left (at query time too), at one
        millisecond neither the largest nor the last written in the 1.79 tested: a point
        written twice with different values reads as a mix nobody can tell, so billing flags
        the rows that may hold one (`meters.dedup`). A server that does not show its flags (a
        proxy in front) is taken as on, and so is a cluster's vmselect
        (`/select/<account>/prometheus`): its vmstorage nodes dedup when they merge, by flags
        vmselect cannot show. So is a server whose `/metrics` shows no storage of its own: a
        vmauth in front answers `/flags` with its own flags, without the storage's dedup."""
        if self._dedup is None and _CLUSTER_SELECT.fullmatch(self._http.base):
            self._dedup = (
                f"{UNKNOWN}a VictoriaMetrics cluster's vmselect: the vmstorage nodes'"
                " -dedup.minScrapeInterval cannot be read through it)"
            )
        if self._dedup is None:
            try:
                text = b"".join(self._http.lines("/flags", [], "its flags")).decode(errors="replace")
            except SourceError as exc:
                self._dedup = f"{UNKNOWN}{exc})"
            else:
                self._dedup = _dedup_flag(text)
        if self._dedup is not None and not self._dedup.startswith(UNKNOWN) and self._stored is None:
            self._stored = self._stores_itself()
            if self._stored:
                self._dedup = f"{UNKNOWN}{self._stored})"
        return self._dedup

    def _stores_itself(self) -> str:
        """Why the server that answered `/flags` may not be the one that stores the samples
        ('' when it is). Every VictoriaMetrics binary answers `/flags` and `/metrics` itself, so
        a vmauth in front shows its own flags (`-auth.config=...`, no dedup) and the storage's
        `-dedup.minScrapeInterval` would read as off. A node that stores and merges shows
        `vm_deduplicated_samples_total{type="merge"}` in its `/metrics`; vmauth and vmselect do not."""
        try:
            metrics = self._http.lines("/metrics", [], "its metrics")
            if any(line.startswith(_STORAGE_METRIC) for line in metrics):
                return ""
        except SourceError as exc:
            return f"its /metrics cannot be read to tell whether /flags came from the storage: {exc}"
        return (
            "the server answering /flags stores no samples of its own (its /metrics has no"
            ' vm_deduplicated_samples_total{type="merge"}): a proxy such as vmauth in front'
            " answers /flags with its own flags, not the storage's"
        )

    def _export(self, match: str, start_ms: int | None, end_ms: int, limit: int | None = None) -> list[bytes]:
        params = [("match[]", match), ("end", f"{end_ms / 1000:.3f}")]
        params.append(("start", "0" if start_ms is None else f"{start_ms / 1000:.3f}"))
        if limit is not None:
            params.append(("max_rows_per_line", str(limit)))
        try:
            return list(self._http.lines("/api/v1/export", params))
        except SourceError as exc:
            if " HTTP 404 " in str(exc):
                raise SourceError(
                    f"{self.target} has no /api/v1/export: not VictoriaMetrics (an InfluxDB 2.x"
                    " cannot be read by --from-influx; give its v1 compatibility as api: v1)"
                ) from None
            raise

    def _match(self, station: str, meter: str | None = None) -> str:
        names = "|".join((*FIELDS, RESTAMPED, CORRECTED))
        extra = "" if meter is None else f',meter="{_quote(meter)}"'
        return f'{{__name__=~"meter_({names})",station="{_quote(station)}"{extra}}}'

    def records(self, station: str, after_ms: int, until_ms: int) -> list[MeterSample]:
        lines = self._export(self._match(station), after_ms + 1, until_ms)
        return [s for s in _merge(lines, self.target) if after_ms < s.time_ms <= until_ms]

    def last_accepted(self, station: str, meter: str, at_ms: int) -> MeterSample | None:
        for back in LOOKBACK_MS:
            start = None if back is None else at_ms - back
            found = [
                s
                for s in _merge(self._export(self._match(station, meter), start, at_ms), self.target)
                if s.meter == meter and s.time_ms <= at_ms and s.accepted
            ]
            if found:
                return found[-1]
        return None

    def next_accepted(self, station: str, meter: str, after_ms: int) -> MeterSample | None:
        """The first accepted point of `meter` after `after_ms`."""
        for ahead in LOOKBACK_MS:
            end = 2**53 if ahead is None else after_ms + ahead
            found = [
                s
                for s in _merge(self._export(self._match(station, meter), after_ms + 1, end), self.target)
                if s.meter == meter and s.time_ms > after_ms and s.accepted
            ]
            if found:
                return found[0]
        return None

    def has_records_from(self, station: str, from_ms: int) -> bool:
        match = f'meter_accepted{{station="{_quote(station)}"}}'
        return bool(self._export(match, from_ms, 2**53, limit=1))


def _dedup_flag(flags: str) -> str:
    """The value of `-dedup.minScrapeInterval` in a `/flags` answer, '' when off (a zero
    duration: "0", "0s", "0ms") or absent: VictoriaMetrics lists only the flags it was started
    with, one `-name="value"` a line. An answer of another shape (a proxy's login page) says
    nothing, so it is `unknown (...)`, flagged like a deduplicating server, never read as off."""
    for raw in flags.splitlines():
        if not (line := raw.strip()):
            continue
        if _FLAG_LINE.fullmatch(line) is None:
            return f"{UNKNOWN}its /flags is not VictoriaMetrics' flag list: {line[:80]!r})"
        name, _, value = line.partition("=")
        if name == "-dedup.minScrapeInterval":
            value = value.strip('"')
            return "" if value.rstrip("mshd") in ("", "0") else value
    return ""


_STORAGE_METRIC = b'vm_deduplicated_samples_total{type="merge"}'  # a storage node's own counter
_FLAG_LINE = re.compile(r'-[\w.-]+=".*"')
_CLUSTER_SELECT = re.compile(r"/select/\d+(:\d+)?/prometheus")  # vmselect's tenant path


def _merge(lines: list[bytes], target: str) -> list[MeterSample]:
    """One sample per meter point from the per-field series; several different values
    at one time make the point `rewritten`, and the largest of each is taken. A point
    marked `restamped` N by a later step than any reading written there (-M, M < N) is the
    overwrite of a reading step N moved away: rejected, billing nothing (the smallest of
    each), whatever it held before."""
    points: dict[tuple[str, str, str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        try:
            doc = json.loads(line)
            labels = doc["metric"]
            field = str(labels["__name__"]).removeprefix("meter_")
            pairs = zip(doc["timestamps"], doc["values"], strict=True)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise SourceError(f"{target}: unexpected export line: {exc}") from None
        key = (str(labels.get("meter", "")), str(labels.get("account", "")), str(labels.get("unit", "")))
        for t, v in pairs:
            value = _number(v)
            if (field in FIELDS or field in (RESTAMPED, CORRECTED)) and value is not None:
                points[(*key, int(t))][field].append(value)
    out = []
    for (meter, account, unit, time_ms), fields in points.items():
        # `restamped` N (step N's overwrite) is the last word there unless a reading was written
        # there after step N (-N or later): then which value is the last is not guessed at,
        # rewritten. The overwritten reading's value may differ (a spread step's holds the
        # register before the old time).
        marks = fields.pop(RESTAMPED, ())
        corrected = bool(fields.pop(CORRECTED, ()))
        moved = max((m for m in marks if m > 0), default=0.0) > max((-m for m in marks if m < 0), default=0.0)
        got = {f: min(vs) if moved else max(vs) for f, vs in fields.items()}
        out.append(
            MeterSample(
                meter,
                account,
                unit,
                time_ms,
                got.get("reading"),
                got.get("consumption"),
                got.get("consumption_ft3"),
                got.get("accepted"),
                rewritten=not moved and any(len(set(vs)) > 1 for vs in fields.values()),
                restamped=bool(marks),
                corrected=corrected,
            )
        )
    return sorted(out, key=lambda s: (s.time_ms, s.meter))
