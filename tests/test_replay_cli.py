"""`monitor replay` as other tools drive it: golden cases under tests/cases/replay/<name>/."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from monitor.errors import PayloadError
from monitor.model import Quality
from monitor.sources.replay import read_csv
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "tests" / "cases" / "replay").iterdir())


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor replay *args` in this process (tests/cli.py), from a directory of its own: the
    case configs set no state_dir, so the incidents it records go to ./state, which must be
    no other test's (nor the repository's): a replay holds its state dir's lock."""
    with tempfile.TemporaryDirectory(prefix="replay-cwd-") as cwd:
        return cli.run_monitor("replay", *args, cwd=cwd)


def events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_case(case: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    result = replay(
        "--config", str(case / "config.yaml"), "--input", str(case / "input.csv"), "--events", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert events(out) == events(case / "events.jsonl")
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"replay: \d+ samples, \d+ sensors, \d+ events, \d+ samples/s", summary), summary


def test_station_day_reports_bad_rows(tmp_path: Path) -> None:
    case = ROOT / "tests" / "cases" / "replay" / "station-day"
    out = tmp_path / "events.jsonl"
    result = replay(
        "--config", str(case / "config.yaml"), "--input", str(case / "input.csv"), "--events", str(out)
    )
    assert result.returncode == 0
    assert "replay: 592 samples, 3 sensors, 8 events" in result.stdout
    assert "unknown sensor 'outfall.level' (first at line 53)" in result.stderr
    assert "unreadable value (kept as bad data), first at line 84" in result.stderr
    assert "out of order or duplicate time (skipped), first at line 124" in result.stderr
    # The unreadable value (line 84) is bad data too: every bad reading counts, whichever
    # path marked it (issue 13: bad values were not counted when a source flagged them).
    assert "2 value(s) not believable" in result.stderr
    assert "(outfall.ph 1, outfall.temp 1)" in result.stderr
    rules = {e["rule"] for e in events(out)}
    assert rules == {"slug", "high", "stale"}
    times = [str(e["time"]) for e in events(out)]
    assert times == sorted(times)


def test_several_inputs_merge_in_time_order(tmp_path: Path) -> None:
    case = ROOT / "tests" / "cases" / "replay" / "station-day"
    lines = (case / "input.csv").read_text().splitlines()
    header, rows = lines[0], lines[1:]
    flow = tmp_path / "flow.csv"
    rest = tmp_path / "rest.csv"
    flow.write_text("\n".join([header, *[r for r in rows if ",outfall.flow," in r]]) + "\n")
    rest.write_text("\n".join([header, *[r for r in rows if ",outfall.flow," not in r]]) + "\n")
    out = tmp_path / "events.jsonl"
    result = replay(
        "--config",
        str(case / "config.yaml"),
        "--input",
        str(rest),
        "--input",
        str(flow),
        "--events",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert events(out) == events(case / "events.jsonl")


def test_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("station: {id: ps-1}\nsensors:\n  - {id: f, kind: flow, limts: {high: 3}}\n")
    (tmp_path / "in.csv").write_text("time,sensor,value\n")
    result = replay(
        "--config", str(config), "--input", str(tmp_path / "in.csv"), "--events", str(tmp_path / "e")
    )
    assert result.returncode == 2
    assert "sensors[0].limts: unknown key" in result.stderr


def test_missing_input_exits_1_with_a_message(tmp_path: Path) -> None:
    case = ROOT / "tests" / "cases" / "replay" / "station-day"
    result = replay(
        "--config", str(case / "config.yaml"), "--input", str(tmp_path / "nope.csv"), "--events", "-"
    )
    assert result.returncode == 1
    assert "nope.csv: cannot read" in result.stderr


def test_reader_accepts_iso_offsets_and_epoch_seconds(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text(
        "sensor,value,time\n"  # columns by name, in any order
        "a,1.5,2026-06-03T09:16:00Z\n"
        "a,2.5,2026-06-03T11:16:30+02:00\n"
        "b,abc,1780478250\n"
        "a,3,2026-06-03T09:16:20\n"  # no zone: unreadable time
        "b,4,1780478200.5\n"  # earlier than b's previous row: out of order
        "a,5,1780478195.25\n"
    )
    samples, report = read_csv(path, ["a", "b"])
    assert samples.time.tolist() == [1780478160.0, 1780478190.0, 1780478195.25, 1780478250.0]
    assert samples.sensor.tolist() == [0, 0, 0, 1]
    assert samples.quality.tolist() == [Quality.GOOD, Quality.GOOD, Quality.GOOD, Quality.BAD_DATA]
    assert np.isnan(samples.value[-1])
    assert (report.out_of_order.count, report.out_of_order.first_line) == (1, 6)
    assert (report.bad_time.count, report.bad_time.first_line) == (1, 5)
    assert (report.bad_value.count, report.bad_value.first_line) == (1, 4)


def test_reader_refuses_a_file_without_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("when,what\n1,2\n")
    with pytest.raises(PayloadError, match="lacks column"):
        read_csv(path, ["a"])


def test_reader_takes_spreadsheet_exports(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xef\xbb\xbfTime,Sensor,Value\r\n2026-06-03T00:00:00Z,a,1\r\n\r\n1780444801,a\r\n")
    samples, report = read_csv(path, ["a"])  # BOM, CRLF, a blank line, a short row
    assert samples.time.tolist() == [1780444800.0] and samples.value.tolist() == [1.0]
    assert (report.bad_time.count, report.bad_time.first_line) == (1, 4)
