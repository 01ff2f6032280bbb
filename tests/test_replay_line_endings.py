"""Line endings a CSV export can have: LF and CRLF are read; CR alone (a "CSV (Macintosh)"
export) is refused with a line that says so, not read as a file of no rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.errors import PayloadError
from monitor.sources.replay import read_csv

ROWS = ["1780000000,a,1.5", "1780000010,a,2.5", "1780000020,a,3.5"]


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_lf_and_crlf_files_read_every_row(tmp_path: Path, end: str) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(("time,sensor,value" + end + end.join(ROWS) + end).encode())
    samples, report = read_csv(path, ["a"])
    assert samples.value.tolist() == [1.5, 2.5, 3.5] and report.rows == 3


def test_a_file_of_cr_line_endings_is_refused_not_read_as_empty(tmp_path: Path) -> None:
    """The header reader takes a lone CR as a line end, the block reader does not: the
    whole file was one header line, and the replay ended with 0 samples and no complaint."""
    path = tmp_path / "mac.csv"
    path.write_bytes(("time,sensor,value\r" + "\r".join(ROWS) + "\r").encode())
    with pytest.raises(PayloadError, match="line ends with a carriage return alone"):
        read_csv(path, ["a"])
