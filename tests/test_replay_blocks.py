"""CSV blocks read into one reused buffer: whatever the block size, the same samples and
the same bad-row report (counts, first lines, the rows quoted as written)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.errors import PayloadError
from monitor.sources import columnar
from monitor.sources.replay import read_csv


def _write(path: Path) -> None:
    rows = []
    for i in range(400):
        t = 1780000000 + 10 * i
        rows += [f"{t},a,{i}", f"{t},b,{i / 2}"]
        if i == 37:
            rows.append(f"{t},nobody,1")  # unknown sensor
        if i == 90:
            rows.append(f"not-a-time,a,{i}")  # bad time
        if i == 150:
            rows.append(f"{t + 5},b,{'x' * 3000}")  # bad value, a line longer than the small blocks
        if i == 220:
            rows.append(f"{t - 100},a,1")  # out of order
        if i == 300:
            rows.append(f"{t + 1}")  # too few cells
    path.write_text("time,sensor,value\n" + "\n".join(rows))  # no newline at the end


@pytest.mark.parametrize("block", [64, 500, 4096])
def test_small_blocks_read_as_one_block(tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.csv"
    _write(path)
    whole, whole_report = read_csv(path, ["a", "b"])
    monkeypatch.setattr(columnar, "BLOCK_BYTES", block)
    parts, report = read_csv(path, ["a", "b"])
    assert report.lines() == whole_report.lines() and report.rows == whole_report.rows == 805
    assert report.unknown_sensor["nobody"].example == "1780000370,nobody,1"
    # quoted cut to 120 characters, with the row's length as written
    assert report.bad_value.example == "1780001505,b," + "x" * 107 + "... (3013 characters)"
    assert (report.bad_time.count, report.out_of_order.count, report.bad_value.count) == (2, 1, 1)
    for name in ("sensor", "time", "value", "quality"):
        assert np.array_equal(getattr(parts, name), getattr(whole, name), equal_nan=name == "value"), name


def test_a_line_longer_than_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "long.csv"
    path.write_text("time,sensor,value\n1780000000,a,1\n1780000010,a," + "9" * 5000 + "\n")
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 256)
    monkeypatch.setattr(columnar, "MAX_LINE_BYTES", 2048)
    with pytest.raises(PayloadError, match="line 3 is longer than"):
        read_csv(path, ["a"])
