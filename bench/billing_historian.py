"""Utility-wide billing from the historian against the stations' own ledgers.

N copies of the golden quarter (`tests/cases/billing/quarter`: 5 meters, hourly, ~13,000
readings) under different station ids are written through the outbox to a real InfluxDB
1.6 and a real VictoriaMetrics, started here. Then, in the same run, the quarter is built
for every station three ways: from each station's ledger (the peer: what each gateway
does on its own), from InfluxDB and from VictoriaMetrics.

    python -m bench.billing_historian [--stations 10]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import tempfile
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import yaml

from monitor.commands.billing_historian import export_from_historian
from monitor.config import Config, load_config
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook
from monitor.model import Sample, parse_time
from monitor.sinks.pipeline import open_sink
from tests.services import InfluxDB1, VictoriaMetrics, http

CASE = Path(__file__).resolve().parent.parent / "tests" / "cases" / "billing" / "quarter"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stations", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        influx, vm = InfluxDB1(root / "influx"), VictoriaMetrics(root / "vm")
        influx.start()
        vm.start()
        try:
            run(root, args.stations, influx, vm)
        finally:
            influx.stop()
            vm.stop()


def run(root: Path, n: int, influx: InfluxDB1, vm: VictoriaMetrics) -> None:
    influx.query("CREATE DATABASE bench")
    with (CASE / "readings.csv").open(encoding="utf-8") as fh:
        samples = [Sample(r["sensor"], parse_time(r["time"]), float(r["value"])) for r in csv.DictReader(fh)]
    base: dict[str, Any] = yaml.safe_load((CASE / "config.yaml").read_text(encoding="utf-8"))
    sections = {
        "influx": {"url": influx.url, "api": "v1", "database": "bench"},
        "vm": {"url": vm.url, "org": "o", "bucket": "b"},
    }
    ledgers: list[Config] = []
    paths: dict[str, list[str]] = {name: [] for name in sections}
    for i in range(n):
        raw = {**base, "station": {"id": f"ps-{i:03d}"}, "state_dir": str(root / f"s{i}")}
        ledger_path = root / f"s{i}.yaml"
        ledger_path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        ledgers.append(load_config(ledger_path))
        book = MeterBook.open(ledgers[-1])
        book.ingest(samples)
        records = book.take_records()
        book.sent()
        book.close()
        for name, section in sections.items():
            path = root / f"s{i}-{name}.yaml"
            out = {**raw, "state_dir": str(root / f"o{i}-{name}"), "influx": section}
            path.write_text(yaml.safe_dump(out), encoding="utf-8")
            paths[name].append(str(path))
            sink = open_sink(load_config(path))
            sink.write_meter_records(records)
            assert asyncio.run(sink.drain(120)) == 0
            sink.close()
    http("GET", f"{vm.url}/internal/force_flush")

    start = time.perf_counter()
    own = []
    for config in ledgers:
        book = MeterBook.open(config, records=False)
        own.extend(export_rows(config, book.ledger, quarter("2026Q3")))
        book.close()
    peer = time.perf_counter() - start
    print(f"{n} station(s), {len(own)} rows; the stations' own ledgers: {peer:.3f} s")
    for name, configs in paths.items():
        start = time.perf_counter()
        got = export_from_historian(Namespace(config=configs, quarter=["2026Q3"], presented=None))
        took = time.perf_counter() - start
        rows = [{k: v for k, v in r.items() if k != "station"} for _, sheet in got.sheets for r in sheet]
        assert rows == own, f"{name}: rows differ from the ledgers'"
        print(f"  from {name}: {took:.3f} s ({took / peer:.2f}x the ledgers), rows equal")


if __name__ == "__main__":
    main()
