"""Bare-number times before 2001: an Excel serial date (45992.5) or a YYYYMMDD (20261201)
is a valid epoch second in 1970. The replay goes on (a synthetic file counting from 0 is
fine), but says once, with the first line and the time it was read as."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from monitor.sources import columnar
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "cases" / "replay" / "station-day" / "config.yaml"
NOTICE = "given as a bare number before 2001 as epoch seconds"


def replay(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """From `tmp_path`: the case's config sets no state_dir, so its incidents go to ./state,
    which must be this test's own (the state dir lock refuses a replay beside another)."""
    out = tmp_path / "events.jsonl"
    return cli.run_monitor(
        "replay", "--config", str(CONFIG), "--input", str(path), "--events", str(out), cwd=tmp_path
    )


def excel_rows(n: int) -> list[str]:
    """An export whose time column is Excel's serial date: a day is 1.0, a minute 1/1440."""
    return [f"{45992.5 + i / 1440:.6f},outfall.flow,{100 + i % 7}" for i in range(n)]


@pytest.mark.parametrize("bad_value", [False, True], ids=["clean chunks", "a chunk with a bad row"])
def test_excel_serial_times_replay_with_one_notice_naming_the_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_value: bool
) -> None:
    rows = excel_rows(400)
    if bad_value:  # the chunk with it takes the slow path: the notice must come from there too
        rows[200] = rows[200].rsplit(",", 1)[0] + ",n/a"
    path = tmp_path / "export.csv"
    path.write_text("time,sensor,value\n" + "\n".join(rows) + "\n")
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 1024)  # many chunks: still one notice
    result = replay(path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "replay: 400 samples, 1 sensors" in result.stdout  # replayed, as read
    notices = [line for line in result.stderr.splitlines() if NOTICE in line]
    assert notices == [
        f"replay: {path}: 400 time(s) {NOTICE}, first at line 2: 45992.500000,outfall.flow,100"
        " (read as 1970-01-01T12:46:32.500Z); replayed as read. An Excel serial date or a"
        " YYYYMMDD number? Write epoch seconds or ISO 8601 with a zone"
    ]


def test_yyyymmdd_times_in_parquet_are_said_with_the_row_and_the_time_read(tmp_path: Path) -> None:
    path = tmp_path / "export.parquet"
    times = [20261201 + i for i in range(3)]
    table = pa.table(
        {
            "time": pa.array(times, pa.int64()),
            "sensor": pa.array(["outfall.flow"] * 3),
            "value": pa.array([100.0, 101.0, 102.0]),
        }
    )
    pq.write_table(table, path)
    result = replay(path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "replay: 3 samples" in result.stdout
    notices = [line for line in result.stderr.splitlines() if NOTICE in line]
    assert len(notices) == 1, result.stderr
    assert f"{path}: 3 time(s) {NOTICE}, first at line 1: " in notices[0]
    assert "(read as 1970-08-23T12:06:41Z)" in notices[0]


def test_the_first_early_number_after_good_rows_is_the_one_quoted(tmp_path: Path) -> None:
    good = [f"{1780444800 + 60 * i},outfall.flow,100" for i in range(5)]
    path = tmp_path / "mixed.csv"
    path.write_text("time,sensor,value\n" + "\n".join([*good, "20261201,outfall.flow,100"]) + "\n")
    result = replay(path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{path}: 1 time(s) {NOTICE}, first at line 7: 20261201,outfall.flow,100" in result.stderr


@pytest.mark.parametrize(
    "times",
    [
        ["1780444800", "1780444860"],  # 2026 as epoch seconds
        ["1780444800000", "1780444860000"],  # 2026 as epoch milliseconds
        ["1999-12-31T23:59:00Z", "2000-01-01T00:00:00Z"],  # before 2001, but it says so itself
    ],
    ids=["seconds", "milliseconds", "iso"],
)
def test_times_that_say_when_they_are_get_no_notice(tmp_path: Path, times: list[str]) -> None:
    path = tmp_path / "fine.csv"
    path.write_text("time,sensor,value\n" + "".join(f"{t},outfall.flow,100\n" for t in times))
    result = replay(path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "replay: 2 samples" in result.stdout
    assert NOTICE not in result.stderr
