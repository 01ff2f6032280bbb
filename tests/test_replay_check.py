"""The bad-row checks' shortcut for a chunk with no bad row: it must see every kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.sources import replay
from monitor.sources.columnar import Chunk
from monitor.sources.replay import _File


def _chunk(time: list[float], sensor: list[int], ok: list[bool], numeric: bool = True) -> Chunk:
    n = len(time)
    return Chunk(
        lines=np.arange(2, 2 + n, dtype=np.int64),
        names=["a", "b", "nobody"],
        sensor=np.array(sensor, dtype=np.int32),
        time=np.array(time),
        numeric=np.full(n, numeric),
        value=np.arange(n, dtype=np.float64),
        value_ok=np.array(ok),
        short=[],
        text=lambda i: f"row {i}",
    )


CLEAN = ([1.78e9, 1.78e9, 1.78e9 + 10], [0, 1, 0], [True, True, True])


@pytest.mark.parametrize(
    ("kind", "time", "sensor", "ok"),
    [
        ("bad_time", [1.78e9, np.nan, 1.78e9 + 10], CLEAN[1], CLEAN[2]),
        ("bad_time", [1.78e9, np.inf, 1.78e9 + 10], CLEAN[1], CLEAN[2]),
        ("out_of_range", [-1.0, 1.78e9, 1.78e9 + 10], CLEAN[1], CLEAN[2]),
        ("out_of_range", [1.78e9, 1.78e9, replay.T_MAX], CLEAN[1], CLEAN[2]),
        ("milliseconds", [1.78e12, 1.78e9, 1.78e9 + 10], CLEAN[1], CLEAN[2]),
        ("bad_value", CLEAN[0], CLEAN[1], [True, False, True]),
        ("unknown_sensor", CLEAN[0], [0, 2, 0], CLEAN[2]),
    ],
)
def test_every_kind_of_bad_row_leaves_the_shortcut(
    tmp_path: Path, kind: str, time: list[float], sensor: list[int], ok: list[bool]
) -> None:
    (tmp_path / "e.csv").write_text("time,sensor,value\n")
    f = _File(tmp_path / "e.csv", ["a", "b"])
    c = _chunk(time, sensor, ok)
    known = np.array([0, 1, -1], dtype=np.int32)[c.sensor]
    assert not f._plain(c, known)
    f._check(c)
    found = getattr(f.report, kind)
    assert (sum(p.count for p in found.values()) if isinstance(found, dict) else found.count) == 1


def test_a_clean_chunk_takes_the_shortcut_and_reads_as_before(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("time,sensor,value\n")
    f = _File(tmp_path / "e.csv", ["a", "b"])
    c = _chunk(*CLEAN)
    assert f._plain(c, c.sensor)
    rows = f._check(c)
    assert rows.sensor.tolist() == [0, 1, 0] and rows.quality.tolist() == [0, 0, 0]
    assert rows.lines.tolist() == [2, 3, 4] and not f.report.lines()


def test_no_time_inside_the_range_can_be_milliseconds() -> None:
    """The shortcut counts no milliseconds for times under T_MAX: true while T_MAX < MS_FROM."""
    assert replay.T_MAX < replay.MS_FROM
