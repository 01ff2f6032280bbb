"""`monitor billing export --from-influx`: the utility's quarter from the central historian.

One `--config` per station, not a utility file listing them: each station's config
already holds what its bill needs (accounts, rate, timezone, billing year, meters,
and the `influx` section its outbox writes to), and a second file naming the same
things would drift from it. A shell glob gives many: `$(printf -- '--config %s ' *.yaml)`.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from monitor.commands import load_config_or_exit, read_env_file
from monitor.config import Config, Influx
from monitor.errors import MeterError
from monitor.meters.billing import build_rows
from monitor.meters.dedup import interval_ms
from monitor.meters.historian import station_quarter
from monitor.meters.periods import presentation, quarter
from monitor.model import iso
from monitor.sources.meter_history import UNKNOWN, InfluxQLMeterHistory, VictoriaMeterHistory, open_history


@dataclass(frozen=True, slots=True)
class Sheets:
    """An export's sheets (one per quarter), each quarter's end (epoch s), notes for stderr."""

    sheets: list[tuple[str, list[dict[str, str]]]]
    ends: list[float]
    notes: list[str] = field(default_factory=list)


def _configs(paths: list[str]) -> list[Config]:
    configs = [load_config_or_exit(p) for p in paths]
    seen: dict[str, str] = {}
    for path, config in zip(paths, configs, strict=True):
        if config.billing is None:
            raise MeterError(f"{path} has no billing section")
        if config.influx is None:
            raise MeterError(f"{path} has no influx section: --from-influx reads the server it names")
        if config.station.id in seen:
            other = seen[config.station.id]
            raise MeterError(f"station {config.station.id!r} is in both {other} and {path}")
        seen[config.station.id] = path
    return configs


def _key(influx: Influx) -> tuple[str, ...]:
    """Stations that write to the same place with the same credentials share a reader."""
    return (
        influx.url,
        influx.api,
        influx.database or "",
        influx.retention_policy or "",
        influx.username or "",
    )


def export_from_historian(args: argparse.Namespace) -> Sheets:
    """Every station's rows for each quarter, a `station` column first, stations in
    the order given. Each station's quarter is cut in its own timezone and year."""
    names = [str(quarter(text)) for text in args.quarter]
    if len(set(names)) < len(names):
        raise MeterError("a --quarter is given twice")
    if args.presented and len(names) > 1:
        raise MeterError("--presented dates one bill: give one --quarter with it")
    if args.env_file:
        os.environ.update(read_env_file(args.env_file))
    configs = _configs(args.config)
    readers: dict[tuple[str, ...], InfluxQLMeterHistory | VictoriaMeterHistory] = {}
    sheets: list[tuple[str, list[dict[str, str]]]] = []
    ends: list[float] = []
    notes: list[str] = []
    warned: set[str] = set()  # servers already said to deduplicate
    for text, name in zip(args.quarter, names, strict=True):
        rows: list[dict[str, str]] = []
        end = 0.0
        for config in configs:
            assert config.billing is not None and config.influx is not None  # _configs
            q = quarter(text, config.billing.year_start_month, config.station.zone)
            bill = presentation(args.presented, q) if args.presented else None
            reader = readers.setdefault(_key(config.influx), open_history(config.influx))
            got = station_quarter(config, reader, q)
            station = config.station.id
            if (dedup := reader.deduplication()) and reader.target not in warned:
                warned.add(reader.target)
                if dedup.startswith(UNKNOWN):  # not "runs with": the clerk would go and look for it
                    why = dedup.removeprefix(UNKNOWN).removesuffix(")")
                    key = "metricsAuthKey" if "/metrics: HTTP 401" in why else "flagsAuthKey"
                    hint = f"; one started with -{key} answers 401" if "HTTP 401" in why else ""
                    head = (
                        f"cannot tell whether {reader.target} runs with"
                        f" -dedup.minScrapeInterval ({why}{hint})"
                    )
                else:
                    head = f"{reader.target} runs with -dedup.minScrapeInterval={dedup}"
                which = "every row" if interval_ms(dedup) is None else "the rows it may have changed"
                print(
                    f"warning: {head}: {which} flagged deduplicated. With it on, the server keeps one"
                    " value per field and interval, so a reading can hide the earlier ones of its"
                    " interval and a point written twice (a row re-judged, a clock step's overwrite)"
                    " reads as a mix of both. Bill those rows from each station's own export, or"
                    " from a VictoriaMetrics started without -dedup.minScrapeInterval (docs/billing.md)",
                    file=sys.stderr,
                )
            if not got.complete:
                print(
                    f"warning: station {station}: {reader.target} holds no meter record of it from"
                    f" {iso(q.end.timestamp())} on (outbox not drained?): its {q} rows may be short,"
                    " flagged incomplete",
                    file=sys.stderr,
                )
            if got.unknown_meters:
                print(
                    f"warning: station {station}: {reader.target} holds {q} records of meters its config"
                    f" does not name, not billed: {', '.join(got.unknown_meters)}",
                    file=sys.stderr,
                )
            if got.unusable:
                first = got.unusable[0]
                print(
                    f"warning: station {station}: {len(got.unusable)} accepted meter record(s) in"
                    f" {reader.target} without a number skipped (first: meter {first.meter} at"
                    f" {iso(first.time_ms / 1000)}); rows flagged unreconciled",
                    file=sys.stderr,
                )
            for meter, why in got.doubted if interval_ms(dedup) is not None else ():
                print(
                    f"warning: station {station}: meter {meter}: {q} flagged deduplicated: {why}",
                    file=sys.stderr,
                )
            for meter, why in got.assumed:
                print(
                    f"warning: station {station}: meter {meter}: {q} judged with the config's settings,"
                    f" one settings period assumed ({why}); {reader.target} holds no settings periods:"
                    " check the row against the station's own export",
                    file=sys.stderr,
                )
            rows.extend({"station": station, **row} for row in build_rows(config, got.usages, q, bill))
            end = max(end, q.end.timestamp())
            notes.append(
                f"{q} {station}: {q.first_day} to {q.last_day} ({config.station.timezone}),"
                f" {iso(q.start.timestamp())} to {iso(q.end.timestamp())} from {reader.target}"
            )
        sheets.append((name, rows))
        ends.append(end)
    return Sheets(sheets, ends, notes)
