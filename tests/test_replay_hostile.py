"""A utility's exported history, as it really comes: the replay reader against the
Parquet column types other tools write, rows that break several rules at once, multi-line
quoted cells and a stray non-UTF-8 byte. Each bad row costs that row, counted once with
its line; the file itself is never refused for one of them."""

from __future__ import annotations

import decimal
import math
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from monitor.model import Quality
from monitor.sources import columnar
from monitor.sources.replay import read_csv
from tests import cli
from tests.test_replay_columnar import summary

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "replay" / "station-day"
T = 1780444800  # 2026-06-03T00:00:00Z


def replay(path: Path, events: Path) -> subprocess.CompletedProcess[str]:
    """`monitor replay` of `path` on the station-day case, events to `events`, no incidents."""
    return cli.run_monitor(
        "replay", "--config", str(CASE / "config.yaml"), "--input", str(path), "--events", str(events),
        "--no-incidents", cwd=ROOT,
    )  # fmt: skip


def parquet(path: Path, **columns: pa.Array) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.parametrize(
    "value",
    [
        pa.array(["7", None, "7.5"]),  # a text column with a null, as pandas writes None
        pa.array(["7", None, "7.5"]).dictionary_encode(),
        pa.array([None, None, None]),  # a column of nothing at all: Arrow's null type
    ],
    ids=["text", "dictionary", "null-type"],
)
def test_a_parquet_value_column_with_nulls_reads_them_as_bad_data(tmp_path: Path, value: pa.Array) -> None:
    """A null among text values died with an AssertionError (a traceback from `monitor
    replay`); it is an unreadable value, kept as bad data, like an empty CSV cell."""
    path = parquet(
        tmp_path / "v.parquet", time=pa.array([T, T + 1, T + 2]), sensor=pa.array(["a"] * 3), value=value
    )
    samples, report = read_csv(path, ["a"])
    assert samples.time.tolist() == [T, T + 1, T + 2]
    nulls = [i for i, v in enumerate(value.to_pylist()) if v is None]
    assert [i for i, q in enumerate(samples.quality.tolist()) if q == Quality.BAD_DATA] == nulls
    assert summary(report) == {"bad_value": (len(nulls), nulls[0] + 1)}


def test_a_parquet_null_value_replays_without_a_traceback(tmp_path: Path) -> None:
    path = parquet(
        tmp_path / "v.parquet",
        time=pa.array(["2026-06-03T00:00:00Z", "2026-06-03T00:00:10Z"]),
        sensor=pa.array(["outfall.ph"] * 2),
        value=pa.array(["7", None]),
    )
    out = tmp_path / "events.jsonl"
    result = replay(path, out)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "1 row(s) with unreadable value (kept as bad data), first at line 2" in result.stderr


@pytest.mark.parametrize(
    ("time", "good"),
    [
        # epoch nanoseconds as int64 (past 2**53: not exactly a double), one of them garbage
        (pa.array([T * 10**9, 2**63 - 1, (T + 2) * 10**9]), []),
        (pa.array([T, 2**64 - 1, T + 2], pa.uint64()), [T, T + 2]),
        # timestamps in ms / us / s of a year past 2262 (outside nanoseconds' range)
        (pa.array([T * 10**3, 10**15, (T + 2) * 10**3], pa.timestamp("ms", tz="UTC")), [T, T + 2]),
        (pa.array([T * 10**6, 10**17, (T + 2) * 10**6], pa.timestamp("us", tz="UTC")), [T, T + 2]),
        (pa.array([T, 10**13, T + 2], pa.timestamp("s", tz="UTC")), [T, T + 2]),
    ],
    ids=["int64-ns", "uint64", "ms", "us", "s"],
)
def test_a_parquet_time_past_what_a_cast_allows_costs_its_row_not_the_file(
    tmp_path: Path, time: pa.Array, good: list[int]
) -> None:
    """Casting these to float64 or to timestamp[ns] raised, and the whole file was refused
    as "not a readable Parquet file"; as a CSV cell the same time is one row outside
    1970..2100 (epoch nanoseconds, as the docs say, are all outside)."""
    path = parquet(
        tmp_path / "t.parquet", time=time, sensor=pa.array(["a"] * 3), value=pa.array([1.0, 2.0, 3.0])
    )
    samples, report = read_csv(path, ["a"])
    assert samples.time.tolist() == good
    outside = [i + 1 for i in range(3) if not good or i == 1]
    assert summary(report) == {"out_of_range": (len(outside), outside[0])}


@pytest.mark.parametrize(
    "value",
    [pa.array([2**62, 7]), pa.array([2**64 - 1, 7], pa.uint64())],
    ids=["int64", "uint64"],
)
def test_a_parquet_value_of_a_huge_integer_is_read_not_refused(tmp_path: Path, value: pa.Array) -> None:
    """An integer column with a value past 2**53 (a counter, a PLC's garbage) refused the
    file; it is read as the nearest double, for the engine to judge."""
    path = parquet(
        tmp_path / "v.parquet", time=pa.array([T, T + 1]), sensor=pa.array(["a", "a"]), value=value
    )
    samples, report = read_csv(path, ["a"])
    assert samples.value.tolist() == [float(value[0].as_py()), 7.0]
    assert summary(report) == {}


def test_parquet_decimal_and_integer_columns_read_as_their_numbers(tmp_path: Path) -> None:
    path = parquet(
        tmp_path / "d.parquet",
        time=pa.array([decimal.Decimal(T), decimal.Decimal(T + 1)], pa.decimal128(12, 0)),
        sensor=pa.array(["a", "a"], pa.large_string()),
        value=pa.array([decimal.Decimal("1.25"), None], pa.decimal128(10, 2)),
    )
    samples, report = read_csv(path, ["a"])
    assert samples.time.tolist() == [T, T + 1]
    assert samples.value[0] == 1.25 and math.isnan(samples.value[1])
    assert summary(report) == {"bad_value": (1, 2)}


def test_a_repeated_header_is_one_bad_row_not_three(tmp_path: Path) -> None:
    """Two exports joined with `cat`: the second header is a row whose time, sensor and
    value are all wrong. It was counted three times, as an unknown sensor 'sensor', an
    unreadable time and an unreadable value "kept as bad data" (it was not kept). A
    skipped row is counted once, under its time if that is wrong, else its sensor; only a
    row that is kept counts as an unreadable value."""
    path = tmp_path / "joined.csv"
    path.write_text(
        "time,sensor,value\n"
        f"{T},a,1\n"
        "time,sensor,value\n"  # 3: the second file's header
        f"{T + 1},zz,n/a\n"  # 4: unknown sensor (its value does not matter)
        f"1e308,a,n/a\n"  # 5: outside 1970..2100 (nor does this one's)
        f"{T + 2},a,n/a\n"  # 6: kept, as bad data
    )
    samples, report = read_csv(path, ["a"])
    assert samples.time.tolist() == [T, T + 2]
    assert summary(report) == {
        "bad_time": (1, 3),
        "unknown zz": (1, 4),
        "out_of_range": (1, 5),
        "bad_value": (1, 6),
    }
    assert report.bad_time.example == "time,sensor,value"


def test_a_parquet_row_of_nulls_is_one_bad_row(tmp_path: Path) -> None:
    path = parquet(
        tmp_path / "n.parquet",
        time=pa.array([T, None, T + 2], pa.timestamp("s", tz="UTC")),
        sensor=pa.array(["a", None, "a"]),
        value=pa.array([1.0, None, 3.0]),
    )
    samples, report = read_csv(path, ["a"])
    assert samples.time.tolist() == [T, T + 2]
    assert summary(report) == {"bad_time": (1, 2)}


def _commented(path: Path) -> None:
    """An export with an operator's comment column; some comments run over several lines."""
    rows = []
    for i in range(60):
        comment = '"pump 2 reset\nby operator, ""JB"""' if i % 7 == 3 else ""
        if i % 11 == 5:
            comment = '"wet well checked\n"'  # a line break last: a cut there left a lone quote
        sensor = "zz" if i == 40 else "a"
        value = "n/a" if i == 50 else str(i)
        rows.append(f"{T + i},{sensor},{value},{comment}")
    path.write_text("time,sensor,value,comment\n" + "\n".join(rows) + "\n")


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, text in enumerate(path.read_text().split("\n"), 1) if text.startswith(needle))


@pytest.mark.parametrize("block", [1 << 20, 64, 100, 333])
def test_lines_after_a_comment_of_several_lines_are_the_lines_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """A quoted cell with a line break is one row over two lines: the rows after it were
    numbered one a line, so every line number after the first such comment was short by
    one more (the report named the wrong line, and quoted another row as its example); the
    block edges, which fall at a line break, may fall inside such a cell."""
    path = tmp_path / "commented.csv"
    _commented(path)
    monkeypatch.setattr(columnar, "BLOCK_BYTES", block)
    samples, report = read_csv(path, ["a"])
    assert len(samples) == 59
    assert summary(report) == {
        "unknown zz": (1, _line_of(path, f"{T + 40},zz")),
        "bad_value": (1, _line_of(path, f"{T + 50},a")),
    }
    assert report.bad_value.example == f"{T + 50},a,n/a,"


@pytest.mark.parametrize("at", [3, 2500])
def test_a_latin1_byte_costs_its_row_not_the_replay(tmp_path: Path, at: int) -> None:
    """One row of a Windows-1252 export ("débit") in a UTF-8 file: near the top it refused
    the file, further down it stopped the replay half-way (exit 1) with pyarrow's "invalid
    UTF8 data" and a row number of its block. Now the bad bytes read as U+FFFD and the row
    is one bad row (here an unknown sensor) with its line."""
    rows = [f"{T + i},a,{i}" for i in range(3000)]
    rows[at - 2] = f"{T + at - 2},d\xe9bit,1"
    path = tmp_path / "mixed.csv"
    path.write_bytes(("time,sensor,value\n" + "\n".join(rows) + "\n").encode("latin-1"))
    samples, report = read_csv(path, ["a"])
    assert len(samples) == 2999
    assert summary(report) == {"unknown d\ufffdbit": (1, at)}
    assert report.unknown_sensor["d\ufffdbit"].example == f"{T + at - 2},d\ufffdbit,1"


@pytest.mark.parametrize(
    ("time", "says"),
    [
        (pa.array([T * 10**9], pa.timestamp("ns")), "timestamp[ns] without a time zone"),
        (pa.array([T * 10**3], pa.timestamp("ms")), "timestamp[ms] without a time zone"),
        (pa.array([float(T)]).cast(pa.float32(), safe=False), "a float (32 bits): too coarse"),
    ],
    ids=["naive-ns", "naive-ms", "float32"],
)
def test_a_parquet_time_column_that_cannot_say_when_is_refused_naming_it(
    tmp_path: Path, time: pa.Array, says: str
) -> None:
    """A timestamp without a zone (pandas' naive datetime64) was read as UTC, where the same
    text in a CSV is refused: local times replayed hours off, without a word. A float32
    time steps by 128 s at today's epoch seconds, shifting readings silently. Both are
    properties of the column, so the file is refused before any output, naming it."""
    path = parquet(tmp_path / "t.parquet", Time=time, sensor=pa.array(["outfall.ph"]), value=pa.array([7.0]))
    out = tmp_path / "events.jsonl"
    result = replay(path, out)
    assert result.returncode == 1, result.stderr
    assert f"t.parquet: column 'Time' is {says}" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_a_spark_int96_time_column_is_refused_saying_why(tmp_path: Path) -> None:
    """Spark (by default) and Hive write timestamps as INT96 in UTC, Impala as local time;
    Arrow reads either as a naive timestamp. The refusal names the type and what to write
    instead, rather than pandas' "without a time zone" advice that does not apply."""
    path = tmp_path / "spark.parquet"
    table = pa.table(
        {
            "time": pa.array([T * 10**9], pa.timestamp("ns", tz="UTC")),
            "sensor": ["outfall.ph"],
            "value": [7.0],
        }
    )
    pq.write_table(table, path, use_deprecated_int96_timestamps=True)
    out = tmp_path / "events.jsonl"
    result = replay(path, out)
    assert result.returncode == 1, result.stderr
    assert "spark.parquet: column 'time' is an INT96 timestamp" in result.stderr
    assert "outputTimestampType=TIMESTAMP_MICROS" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_a_parquet_time_with_any_zone_reads_as_the_instant_it_names(tmp_path: Path) -> None:
    path = parquet(
        tmp_path / "z.parquet",
        time=pa.array([T * 10**9, (T + 1) * 10**9], pa.timestamp("ns", tz="Asia/Kolkata")),
        sensor=pa.array(["a", "a"]),
        value=pa.array([True, False]),  # a pump's run feedback as pandas writes a bool column
    )
    samples, report = read_csv(path, ["a"])
    assert samples.time.tolist() == [T, T + 1]
    assert samples.value.tolist() == [1.0, 0.0]
    assert summary(report) == {}


def test_a_row_with_more_cells_than_the_header_is_kept_and_said(tmp_path: Path) -> None:
    """A decimal comma in an unquoted value (`7,25` from a European export) makes one cell
    too many: the row keeps its first cells, as documented, so pH 7.25 reads as 7. That was
    silent; it is now counted with its first line. A trailing empty cell (`...,7.25,`) is not
    counted: nothing was left out."""
    path = tmp_path / "comma.csv"
    path.write_text(f"time,sensor,value\n{T},a,7.1\n{T + 1},a,7.2,\n{T + 2},a,7,25\n{T + 3},a,7,30\n")
    samples, report = read_csv(path, ["a"])
    assert samples.value.tolist() == [7.1, 7.2, 7.0, 7.0]  # kept, as the docs say
    assert (report.extra_cells.count, report.extra_cells.first_line) == (2, 4)
    assert (
        f"{path}: 2 row(s) with more cells than the header (the cells past it ignored; a decimal"
        f" comma?), first at line 4: {T + 2},a,7,25"
    ) in report.lines()


@pytest.mark.parametrize(
    ("magic", "kind"),
    [(b"PK\x03\x04", "zip"), (b"BZh9", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd")],
)
def test_a_compressed_export_is_refused_as_one(tmp_path: Path, magic: bytes, kind: str) -> None:
    """`history.zip` given as it came: it was "a line ends with a carriage return alone (a
    Macintosh CSV export)" or a UTF-8 decoding error, neither of which says what to do
    (gzip has its own message, with `zcat`: tests/test_replay_pipes.py)."""
    path = tmp_path / "history.csv.zip"
    path.write_bytes(magic + bytes(range(256)) * 4)
    result = replay(path, tmp_path / "e.jsonl")
    assert result.returncode == 1
    assert f"history.csv.zip: a {kind}-compressed file; decompress it first" in result.stderr


def test_a_huge_bad_row_is_quoted_short(tmp_path: Path) -> None:
    """A logger that lost power leaves a run of NULs, a broken export a megabyte-long cell:
    the report quoted the row (or the sensor name) whole, a megabyte on one stderr line."""
    path = tmp_path / "tail.csv"
    path.write_bytes(
        f"time,sensor,value\n{T},a,1\n{T + 1},{'x' * (1 << 20)},2\n{T + 2},a,3\n".encode()
        + b"\x00" * (1 << 20)
    )
    samples, report = read_csv(path, ["a"])
    assert len(samples) == 2
    assert (report.bad_time.count, report.bad_time.first_line) == (1, 5)
    lines = report.lines()
    assert len(lines) == 2 and all(len(line) < 400 for line in lines), [len(line) for line in lines]
    assert any("row(s) for unknown sensor 'xxxx" in line and "(first at line 3)" in line for line in lines)
    assert any("first at line 5: \x00\x00" in line and "(1048576 characters)" in line for line in lines)


def test_a_latin1_byte_in_a_short_row_costs_that_row(tmp_path: Path) -> None:
    """A row that is malformed too (a cell short): pyarrow could not hand it to the bad-row
    handler ("Exception ignored ... UnicodeDecodeError" on stderr, once per try) and refused
    the block, so the replay stopped at it."""
    path = tmp_path / "short.csv"
    path.write_bytes(f"time,sensor,value\n{T},a,1\n{T + 1},d\xe9bit\n{T + 2},a,3\n".encode("latin-1"))
    out = tmp_path / "events.jsonl"
    result = replay(path, out)
    assert result.returncode == 0, result.stderr
    assert (
        f"1 row(s) with unreadable time or too few columns, first at line 3: {T + 1},d\ufffdbit"
        in result.stderr
    )
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr


def test_a_utf16_export_is_refused_saying_so(tmp_path: Path) -> None:
    """Excel's "Unicode Text" and some historians write UTF-16: it was "not a readable CSV
    file ('utf-8' codec can't decode byte 0xff in position 0 ...)"."""
    path = tmp_path / "history.csv"
    path.write_bytes(f"time,sensor,value\n{T},a,1\n".encode("utf-16"))
    result = replay(path, tmp_path / "e.jsonl")
    assert result.returncode == 1
    assert "history.csv: UTF-16 text; save it as UTF-8 (CSV UTF-8)" in result.stderr


@pytest.mark.parametrize(
    ("text", "left_open"),
    [
        (b'1,a,"pump 2 reset\n', True),  # cut inside a comment
        (b'1,a,"said ""stop""\n', True),  # escaped quotes just before the break
        (b'1,a,"x"\n2,"",3\n4,"a,""b""",5\n6,8" main,7\n', False),  # closed, empty, escapes, a literal
        (b'1,8" main,2\n3,8" main,4\n5,8" main,6\n', False),  # literal quotes inside cells
    ],
)
def test_a_block_cut_is_read_again_only_when_a_quoted_cell_is_left_open(
    monkeypatch: pytest.MonkeyPatch, text: bytes, left_open: bool
) -> None:
    """Whether a cut falls inside a quoted cell is asked of the stdlib's reader, over the
    whole block; a file of literal quotes (`8" main`, an odd count before half its cuts)
    sent every such block through it. The reader is counted here, not replaced."""
    import csv
    from collections.abc import Iterable, Iterator

    from monitor.sources import csvrows

    calls: list[int] = []
    real = csv.reader

    def counted(lines: Iterable[str]) -> Iterator[list[str]]:
        calls.append(1)
        return real(lines)

    monkeypatch.setattr(csv, "reader", counted)
    buf = bytearray(b"0,a,1\n" + text)
    cut = csvrows.outside_quotes(buf, len(buf))
    assert bool(calls) is left_open
    assert cut == (6 if left_open and text.count(b"\n") == 1 else len(buf))
