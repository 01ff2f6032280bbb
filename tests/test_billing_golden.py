"""Golden billing exports: tests/cases/billing/<name>/{config.yaml, readings.csv,
replacements.csv or amendments.csv, case.json, expected.csv}. The figures are checked by
hand in each case's README.md. `case.json` (optional) gives the quarter, the bill's
presentation date and how many meter alarm transitions the replay reports.

The export must be byte-identical whatever path and order the readings took into the
ledger: the CLI, the MeterBook API, readings shuffled, delivered twice, or the
replacement recorded before the readings arrived."""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from monitor.config import load_config
from monitor.meters.billing import columns, export_rows, quarter, write_csv
from monitor.meters.book import MeterBook
from monitor.meters.periods import presentation
from monitor.model import Sample, parse_time
from tests import cli

pytestmark = pytest.mark.integration  # whole commands over golden cases: `make test`, not `make check`

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases" / "billing"
DEFAULTS: dict[str, Any] = {"quarter": "2026Q3", "presented": None, "replay_transitions": 3}


def monitor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


def case_dir(name: str, tmp_path: Path) -> Path:
    """The case's config in a temp dir, so its `state_dir: state` lands there."""
    shutil.copy(CASES / name / "config.yaml", tmp_path / "config.yaml")
    return tmp_path / "config.yaml"


def replacements(name: str) -> list[dict[str, str]]:
    path = CASES / name / "replacements.csv"
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def readings(name: str) -> list[Sample]:
    with (CASES / name / "readings.csv").open(encoding="utf-8") as fh:
        return [Sample(r["sensor"], parse_time(r["time"]), float(r["value"])) for r in csv.DictReader(fh)]


def record(book: MeterBook, rep: dict[str, str]) -> None:
    book.record_replacement(rep["meter"], parse_time(rep["time"]), rep["old_final"], rep["new_initial"])


def settings(name: str) -> dict[str, Any]:
    path = CASES / name / "case.json"
    return {**DEFAULTS, **(json.loads(path.read_text(encoding="utf-8")) if path.exists() else {})}


def amendments(name: str) -> list[list[str]]:
    """`monitor meters ...` argument lists for the case's amendments.csv, in order."""
    path = CASES / name / "amendments.csv"
    if not path.exists():
        return []
    out = []
    with path.open(encoding="utf-8") as fh:
        for a in csv.DictReader(fh):
            args = [a["action"], "--meter", a["meter"], "--time", a["time"], "--by", "golden test"]
            if a["action"] == "replace":
                args += ["--old-final", a["old_final"], "--new-initial", a["new_initial"], "--note", a["why"]]
            elif a["action"] == "correct":
                args += ["--reading", a["reading"], "--why", a["why"]]
            else:
                args += ["--why", a["why"]]
            out.append(args)
    return out


def export_text(config_path: Path, name: str) -> str:
    config = load_config(config_path)
    book = MeterBook.open(config)
    try:
        assert config.billing is not None
        q = quarter(settings(name)["quarter"], config.billing.year_start_month, config.station.zone)
        rows = export_rows(config, book.ledger, q)
    finally:
        book.close()
    out = io.StringIO()
    write_csv(rows, out)
    return out.getvalue()


@pytest.mark.parametrize("path", ["replay", "meters-ingest"])
@pytest.mark.parametrize("name", sorted(p.name for p in CASES.iterdir() if (p / "expected.csv").exists()))
def test_cli_export_matches_golden(name: str, path: str, tmp_path: Path) -> None:
    config = case_dir(name, tmp_path)
    case = settings(name)
    readings_csv = str(CASES / name / "readings.csv")
    if path == "replay":  # meter readings are samples: the engine's replay feeds the ledger
        got = monitor_cli(
            "replay",
            "--config",
            str(config),
            "--input",
            readings_csv,
            "--events",
            str(tmp_path / "events.jsonl"),
        )
        assert got.returncode == 0, got.stderr
        # quarter: village spike on+off, shop swap; new-york: shop swap, apartments misread
        transitions = case["replay_transitions"]
        assert (
            "meter readings added to" in got.stderr
            and f"({transitions} meter alarm transition(s)" in got.stderr
        )
    else:
        got = monitor_cli("meters", "ingest", "--config", str(config), "--input", readings_csv)
        assert got.returncode == 0, got.stderr
    for rep in replacements(name):
        got = monitor_cli(
            "meters", "replace", "--config", str(config), "--meter", rep["meter"], "--time", rep["time"],
            "--old-final", rep["old_final"], "--new-initial", rep["new_initial"], "--by", "golden test",
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
    for args in amendments(name):
        got = monitor_cli("meters", *args, "--config", str(config))
        assert got.returncode == 0, got.stderr
    out = tmp_path / "export.csv"
    dates = ["--presented", case["presented"]] if case["presented"] else []
    export = ["billing", "export", "--config", str(config), "--quarter", case["quarter"], *dates]
    got = monitor_cli(*export, "--out", str(out))
    assert got.returncode == 0, got.stderr
    assert out.read_text(encoding="utf-8") == (CASES / name / "expected.csv").read_text(encoding="utf-8")

    out_json = tmp_path / "export.json"
    got = monitor_cli(*export, "--out", str(out_json), "--format", "json")
    assert got.returncode == 0, got.stderr
    items = json.loads(out_json.read_text(encoding="utf-8"))
    with (CASES / name / "expected.csv").open(encoding="utf-8") as fh:
        expected = list(csv.DictReader(fh))
    assert [list(i) for i in items] == [list(columns(bool(case["presented"])))] * len(expected)
    for item, row in zip(items, expected, strict=True):
        assert item["minimum_applied"] is (row["minimum_applied"] == "true")
        assert item["flags"] == [f for f in row["flags"].split(";") if f]
        assert {k: v for k, v in item.items() if k not in ("minimum_applied", "flags")} == {
            k: v for k, v in row.items() if k not in ("minimum_applied", "flags")
        }


@pytest.mark.parametrize("order", ["replacement-first", "shuffled-twice", "reversed"])
def test_same_export_whatever_the_order(order: str, tmp_path: Path) -> None:
    name = "quarter"
    config_path = case_dir(name, tmp_path)
    samples = readings(name)
    book = MeterBook.open(load_config(config_path))
    try:
        reps = replacements(name)
        if order == "replacement-first":
            for rep in reps:
                record(book, rep)
            book.ingest(samples)
        elif order == "shuffled-twice":
            rng = random.Random(139)
            shuffled = samples[:]
            rng.shuffle(shuffled)
            # Chunks of a poll cycle's size, out of order across chunks; then everything again.
            for i in range(0, len(shuffled), 500):
                book.ingest(shuffled[i : i + 500])
            for rep in reps:
                record(book, rep)
            book.ingest(samples)
        else:
            book.ingest(reversed(samples))
            for rep in reps:
                record(book, rep)
    finally:
        book.close()
    assert export_text(config_path, name) == (CASES / name / "expected.csv").read_text(encoding="utf-8")


@pytest.mark.parametrize("order", ["amendments-between-halves", "shuffled-then-replayed"])
def test_amendments_give_the_same_export_whatever_the_order(order: str, tmp_path: Path) -> None:
    """new-york through the MeterBook API: the replacement, its void and re-record, and the
    correction made while readings still arrive (or all at once, shuffled); then the
    readings replayed, misread included."""
    name = "new-york"
    config = load_config(case_dir(name, tmp_path))
    samples = readings(name)
    if order == "shuffled-then-replayed":
        random.Random(17).shuffle(samples)
    half = len(samples) // 2
    between = order == "amendments-between-halves"
    book = MeterBook.open(config)
    try:
        book.ingest(samples[:half] if between else samples)
        late: list[dict[str, str]] = []  # the misread is in the second half: corrected once it is there
        with (CASES / name / "amendments.csv").open(encoding="utf-8") as fh:
            for a in csv.DictReader(fh):
                t = parse_time(a["time"])
                if a["action"] == "replace":
                    book.record_replacement(a["meter"], t, a["old_final"], a["new_initial"], "api", a["why"])
                elif a["action"] == "void-replacement":
                    book.void_replacement(a["meter"], t, "api", a["why"])
                elif between:
                    late.append(a)
                else:
                    book.correct(a["meter"], t, a["reading"], "api", a["why"])
        book.ingest(samples[half:] if between else samples)  # with the misread again
        for a in late:
            book.correct(a["meter"], parse_time(a["time"]), a["reading"], "api", a["why"])
        assert config.billing is not None
        q = quarter(settings(name)["quarter"], config.billing.year_start_month, config.station.zone)
        out = io.StringIO()
        write_csv(export_rows(config, book.ledger, q, presentation(settings(name)["presented"], q)), out)
    finally:
        book.close()
    assert out.getvalue() == (CASES / name / "expected.csv").read_text(encoding="utf-8")
