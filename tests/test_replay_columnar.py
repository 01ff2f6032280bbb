"""The columnar replay reader: CSV and Parquet in chunks, every bad-row kind counted
with its first line, epoch milliseconds and out-of-range times (issue 13 item 9)."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from monitor.errors import PayloadError
from monitor.model import Quality, parse_time
from monitor.sources import columnar
from monitor.sources import replay as replay_module
from monitor.sources.replay import ReadReport, Samples, read_csv, stream
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "replay" / "station-day"
SENSORS = ("outfall.flow", "outfall.ph", "outfall.temp")


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor replay *args` in this process (tests/cli.py), from a directory of its own: the
    case configs set no state_dir, so the incidents it records go to ./state, which must be
    no other test's (nor the repository's): a replay holds its state dir's lock."""
    with tempfile.TemporaryDirectory(prefix="replay-cwd-") as cwd:
        return cli.run_monitor("replay", *args, cwd=cwd)


def events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def summary(r: ReadReport) -> dict[str, tuple[int, int]]:
    kinds = {
        "bad_time": r.bad_time,
        "out_of_range": r.out_of_range,
        "bad_value": r.bad_value,
        "out_of_order": r.out_of_order,
        "milliseconds": r.milliseconds,
        "late": r.late,
    }
    out = {k: (p.count, p.first_line) for k, p in kinds.items() if p.count}
    out.update({f"unknown {k}": (p.count, p.first_line) for k, p in r.unknown_sensor.items()})
    return out


def same(a: Samples, b: Samples) -> None:
    assert a.sensor.tolist() == b.sensor.tolist()
    assert a.time.tolist() == b.time.tolist()
    np.testing.assert_array_equal(a.value, b.value)  # NaN == NaN here
    assert a.quality.tolist() == b.quality.tolist()


MESSY = (
    "time,sensor,value\n"
    "1780444800,a,1\n"  # 2: epoch seconds
    "1780444810000,a,2\n"  # 3: epoch milliseconds
    "2026-06-03T00:00:20Z,a,3\n"  # 4: ISO with Z
    "2026-06-03T02:00:30+02:00,b,abc\n"  # 5: ISO with an offset; a bad value
    "1e308,a,5\n"  # 6: far outside 1970..2100
    "-5,b,6\n"  # 7: before 1970
    "2026-06-03T00:00:40,a,7\n"  # 8: no zone
    "\n"  # 9: blank
    "1780444850,zz,8\n"  # 10: unknown sensor
    "1780444860,a\n"  # 11: too few cells
    "1780444870,a,9,extra\n"  # 12: one cell too many: kept, as the stdlib reader did
    "1780444865,a,10\n"  # 13: earlier than line 12: out of order
    "1780444880,b, 11 \n"  # 14: blanks around a number are fine
    "1780444890,b,nan\n"  # 15: NaN reads (the engine judges it), not a bad row
    "junk,b,12\n"  # 16: unreadable time
    "4102444800,b,13\n"  # 17: 2100-01-01 exactly: outside
)
MESSY_REPORT = {
    "bad_time": (3, 8),
    "out_of_range": (3, 6),
    "bad_value": (1, 5),
    "out_of_order": (1, 13),
    "milliseconds": (1, 3),
    "unknown zz": (1, 10),
}


def test_every_time_form_and_bad_row_kind_is_classified(tmp_path: Path) -> None:
    path = tmp_path / "messy.csv"
    path.write_text(MESSY)
    samples, report = read_csv(path, ["a", "b"])
    assert samples.time.tolist() == [
        1780444800.0, 1780444810.0, 1780444820.0, 1780444830.0, 1780444870.0, 1780444880.0, 1780444890.0
    ]  # fmt: skip
    assert samples.sensor.tolist() == [0, 0, 0, 1, 0, 1, 1]
    assert samples.value[[0, 1, 2, 4, 5]].tolist() == [1, 2, 3, 9, 11]
    assert math.isnan(samples.value[3]) and math.isnan(samples.value[6])
    assert samples.quality.tolist()[3] == Quality.BAD_DATA
    assert samples.quality.tolist()[6] == Quality.GOOD
    assert summary(report) == MESSY_REPORT
    assert report.out_of_range.example == "1e308,a,5"
    lines = "\n".join(report.lines())
    assert "1 time(s) read as epoch milliseconds (too large for seconds), first at line 3" in lines
    assert "3 row(s) with a time outside 1970..2100 (skipped), first at line 6: 1e308,a,5" in lines


@pytest.mark.parametrize("block", [16, 40, 200])
def test_small_blocks_give_the_same_rows_and_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """Chunk edges fall everywhere (mid-file, on malformed rows): nothing changes."""
    path = tmp_path / "messy.csv"
    path.write_text(MESSY)
    whole, report = read_csv(path, ["a", "b"])
    monkeypatch.setattr(columnar, "BLOCK_BYTES", block)
    chunked, chunked_report = read_csv(path, ["a", "b"])
    same(chunked, whole)
    assert summary(chunked_report) == summary(report) == MESSY_REPORT


def test_golden_case_streamed_in_small_blocks_gives_the_same_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples, report = read_csv(CASE / "input.csv", SENSORS)
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 300)
    batches, reports = stream([CASE / "input.csv"], SENSORS)
    parts = list(batches)
    assert len(parts) > 20
    same(Samples.concat(parts), samples)
    assert summary(reports[0]) == summary(report)


def test_parquet_of_the_same_cells_reads_the_same(tmp_path: Path) -> None:
    """Text columns (as a CSV converted by a tool) and typed columns both work; a
    Parquet row's "line" is its position counting from 1, so CSV line - 1."""
    lines = (CASE / "input.csv").read_text(encoding="utf-8").splitlines()[1:]
    cells = [[*line.split(","), "", "", ""][:3] for line in lines]
    text = tmp_path / "text.parquet"
    columnar.write_table(
        text, {k: [c[i] for c in cells] for i, k in enumerate(("time", "sensor", "value"))}, row_group_size=50
    )
    csv_samples, csv_report = read_csv(CASE / "input.csv", SENSORS)
    pq_samples, pq_report = read_csv(text, SENSORS)
    same(pq_samples, csv_samples)
    want = {k: (n, line - 1) for k, (n, line) in summary(csv_report).items() if k != "bad_time"}
    got = {k: v for k, v in summary(pq_report).items() if k != "bad_time"}
    assert got == want

    typed = tmp_path / "typed.parquet"
    good = csv_samples.quality == Quality.GOOD
    columnar.write_parquet(
        typed, csv_samples.time[good], [SENSORS[i] for i in csv_samples.sensor[good]], csv_samples.value[good]
    )
    typed_samples, typed_report = read_csv(typed, SENSORS)
    assert typed_samples.time.tolist() == csv_samples.time[good].tolist()
    assert typed_samples.value.tolist() == csv_samples.value[good].tolist()
    assert summary(typed_report) == {}


def test_epoch_milliseconds_and_1e308_replay_without_a_traceback(tmp_path: Path) -> None:
    """Issue 13 item 9: both died with a traceback before."""
    rows = (CASE / "input.csv").read_text(encoding="utf-8").splitlines()
    body = []
    for row in rows[1:]:
        cells = row.split(",")
        with contextlib.suppress(ValueError):  # the case's unreadable times stay unreadable
            cells[0] = str(round(parse_time(cells[0]) * 1000))
        body.append(",".join(cells))
    ms = tmp_path / "ms.csv"
    ms.write_text("\n".join([rows[0], *body, f"1e308,{SENSORS[0]},1"]) + "\n")
    out = tmp_path / "events.jsonl"
    result = replay("--config", str(CASE / "config.yaml"), "--input", str(ms), "--events", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "time(s) read as epoch milliseconds (too large for seconds), first at line 2" in result.stderr
    assert "1 row(s) with a time outside 1970..2100 (skipped)" in result.stderr
    assert events(out) == events(CASE / "events.jsonl")


def test_parquet_input_replays_the_golden_case(tmp_path: Path) -> None:
    lines = (CASE / "input.csv").read_text(encoding="utf-8").splitlines()[1:]
    cells = [[*line.split(","), "", "", ""][:3] for line in lines]
    path = tmp_path / "input.parquet"
    columnar.write_table(path, {k: [c[i] for c in cells] for i, k in enumerate(("time", "sensor", "value"))})
    out = tmp_path / "events.jsonl"
    result = replay("--config", str(CASE / "config.yaml"), "--input", str(path), "--events", str(out))
    assert result.returncode == 0, result.stderr
    assert events(out) == events(CASE / "events.jsonl")
    assert "replay: 592 samples, 3 sensors, 8 events" in result.stdout


def test_a_file_sorted_by_sensor_is_replayed_and_said_to_be_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "by-sensor.csv"
    rows = [f"{1780444800 + 10 * i},{s},{i}" for s in ("a", "b") for i in range(50)]
    path.write_text("time,sensor,value\n" + "\n".join(rows) + "\n")
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 256)
    samples, report = read_csv(path, ["a", "b"])
    assert len(samples) == 100  # nothing lost
    assert report.late.count > 0 and report.late.first_line > 51
    assert any("Sort the file by time" in line for line in report.lines())


def test_a_parquet_file_without_the_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    columnar.write_table(path, {"when": [1], "what": [2.0]})
    result = replay(
        "--config", str(CASE / "config.yaml"), "--input", str(path), "--events", str(tmp_path / "e")
    )
    assert result.returncode == 1
    assert "lack time, sensor, value" in result.stderr and "Traceback" not in result.stderr


def test_a_line_without_end_is_refused_not_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "endless.csv"
    path.write_text("time,sensor,value\n1780444800,a,1\n" + "9" * 5000)
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 256)
    monkeypatch.setattr(columnar, "MAX_LINE_BYTES", 1024)
    with pytest.raises(PayloadError, match="line 3 is longer than"):
        read_csv(path, ["a"])


def test_binary_garbage_exits_1_with_a_line(tmp_path: Path) -> None:
    path = tmp_path / "garbage.csv"
    path.write_bytes(bytes(range(256)) * 64)
    result = replay(
        "--config", str(CASE / "config.yaml"), "--input", str(path), "--events", str(tmp_path / "e")
    )
    assert result.returncode == 1, result.stderr
    assert "garbage.csv" in result.stderr and "Traceback" not in result.stderr


def test_a_bad_input_is_refused_before_the_events_file_is_touched(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("time,sensor,value\n1780444800,outfall.ph,7\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("when,what\n1,2\n")
    events_file = tmp_path / "events.jsonl"
    args = ["--config", str(CASE / "config.yaml"), "--input", str(good), "--input", str(bad)]
    result = replay(*args, "--events", str(events_file))
    assert result.returncode == 1
    assert "bad.csv: header 'when,what' lacks column(s) time, sensor, value" in result.stderr
    assert not events_file.exists()


def test_a_full_disk_under_the_events_file_exits_1_with_a_line() -> None:
    """/dev/full: every write fails with ENOSPC, as a full disk does."""
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv")]
    result = replay(*args, "--events", "/dev/full")
    assert result.returncode == 1
    assert "cannot write events to /dev/full: No space left on device" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_of_one_time_is_not_held_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of the latest time wait for the rest of that time; a hostile file of one time
    must not make them wait for the whole file."""
    path = tmp_path / "one-time.csv"
    names = [f"s{i}" for i in range(300)]
    path.write_text("time,sensor,value\n" + "".join(f"1780444800,{n},1\n" for n in names))
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 256)
    monkeypatch.setattr(replay_module, "MAX_HELD", 40)
    batches, reports = stream([path], names)
    sizes = [len(b) for b in batches]
    assert len(sizes) > 1 and max(sizes) <= 60
    assert sum(sizes) == 300 and not reports[0].lines()


def test_an_unterminated_quote_costs_its_block_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stdlib reader let one stray quote swallow the rest of the file; here it takes the
    rest of its block at most, and the lines of later blocks stay right."""
    path = tmp_path / "quote.csv"
    rows = [f"{1780444800 + i},a,{i}" for i in range(100)]
    rows += ['1780445800,"a,1']
    rows += [f"{1780446800 + i},a,{i}" for i in range(300)]
    rows += ["1780447800,zz,1"]  # line 403
    path.write_text("time,sensor,value\n" + "\n".join(rows) + "\n")
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 512)
    samples, report = read_csv(path, ["a"])
    assert (report.bad_time.count, report.bad_time.first_line) == (1, 102)
    assert 300 < len(samples) < 400
    assert report.unknown_sensor["zz"].first_line == 403
    assert report.unknown_sensor["zz"].example == "1780447800,zz,1"  # the row as written


def _parquet_rows(path: Path, n: int) -> None:
    """`n` rows of 50 sensors every 10 s in row groups of `columnar.PARQUET_ROWS`."""
    import pyarrow as pa

    names = pa.array([f"s{i}" for i in range(50)])
    codes = pa.array(np.tile(np.arange(50, dtype=np.int32), n // 50 + 1)[:n])
    columnar.write_table(
        path,
        {
            "time": pa.array(1_780_000_000 + np.arange(n) // 50 * 10.0),
            "sensor": pa.DictionaryArray.from_arrays(codes, names),
            "value": pa.array(np.round(np.random.default_rng(1).normal(300, 10, n), 3)),
        },
    )


def test_reading_parquet_holds_the_same_memory_whatever_the_files_size(tmp_path: Path) -> None:
    """pyarrow's own allocations while a Parquet file is read chunk by chunk do not grow
    with the file: its pre-buffering (the default) kept every column chunk read until the
    end (10, 19 and 30 MiB for 1, 4 and 8 M rows; now 8 MiB each). Measured with pyarrow's
    allocation counter, not a clock."""
    import pyarrow as pa

    peaks = []
    for n in (1_000_000, 4_000_000):
        path = tmp_path / f"{n}.parquet"
        _parquet_rows(path, n)
        peak = rows = 0
        for chunk in columnar.open_chunks(path):
            rows += len(chunk.lines)
            peak = max(peak, pa.total_allocated_bytes())
        del chunk
        assert rows == n
        peaks.append(peak)
    assert peaks[1] <= peaks[0] + (2 << 20), [p >> 20 for p in peaks]


@pytest.mark.parametrize("max_cycle", [2, 1024])
@pytest.mark.parametrize(
    "texts",
    [
        ["a", "b", " c", "a", "b", " c", "a"],  # every sensor each time, the order kept
        ["a", "b", "a", "c"] * 3,  # a name twice in a cycle: one code, as a dictionary
        ["a"] * 5,
        ["a", "b", "a", "b", "b", "a"],  # the order changes
        ["a", "b", "a", "bb", "a", "b"],  # the same lengths cycle but not the text
        ["ab", "c", "a", "bc", "ab", "c"],  # the same text cycles but not the cells
        ["a", "b", "", "a", "b", ""],  # an empty cell: the chunk may hold a blank line
        ["a"],
    ],
)
def test_sensor_names_read_as_the_dictionary_reads_them(
    monkeypatch: pytest.MonkeyPatch, texts: list[str], max_cycle: int
) -> None:
    """A small chunk is read as text, one whose names repeat in a cycle skips the hash of
    every row's text, any other is dictionary-encoded; whichever way, each row's name,
    the table (first appearance, stripped) and the empty flag are the dictionary's."""
    import pyarrow as pa

    monkeypatch.setattr(columnar, "MAX_CYCLE", max_cycle)
    col = pa.array(texts, pa.string())
    for arr in (col, pa.concat_arrays([pa.array(["x"]), col]).slice(1)):  # an offset into the buffers too
        if max_cycle == 1024:
            assert columnar._cycle(arr) is not None  # read as text whole
        names, idx, empty = columnar._sensors(arr)
        want = columnar._sensors(arr.dictionary_encode())
        assert (names, idx.tolist(), empty) == (want[0], want[1].tolist(), want[2])
        assert [names[i] for i in idx] == [t.strip() for t in texts]
        assert empty == ("" in texts)


@pytest.mark.parametrize(
    ("texts", "cycle"),
    [
        (["a", "b"] * 4, True),
        (["a", "b", "a", "b", "a", "c", "a", "b"], False),  # the text breaks the cycle past the head
        (["a", "b", "a", "b", "a", "bb", "a", "b"], False),  # a length breaks it
        (["a", "b", "a", "b", "b", "a", "a", "b"], False),  # the lengths cycle, the text does not
    ],
)
def test_a_cycle_is_checked_past_the_rows_it_was_guessed_from(
    monkeypatch: pytest.MonkeyPatch, texts: list[str], cycle: bool
) -> None:
    """Only the first 2 * MAX_CYCLE names are read as text; the rest are compared in
    Arrow's buffers, so a break anywhere after them sends the chunk to the dictionary."""
    import pyarrow as pa

    monkeypatch.setattr(columnar, "MAX_CYCLE", 2)
    col = pa.array(texts, pa.string())
    assert (columnar._cycle(col) is not None) is cycle
    names, idx, _ = columnar._sensors(col)
    assert [names[i] for i in idx] == texts


def test_a_cycle_is_looked_for_among_the_first_few_repeats_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first row's name coming back is a possible cycle length, each compared over the
    head; only the first eight are tried (a head with many repeats that break late would
    cost a comparison each), so a cycle past them is left to the dictionary, read the same."""
    import pyarrow as pa

    monkeypatch.setattr(columnar, "MAX_CYCLE", 32)
    cycle = [t for k in range(9) for t in ("a", f"x{k}")]  # "a" eight times more before it cycles
    texts = cycle * 5
    col = pa.array(texts, pa.string())
    assert columnar._cycle(col) is None
    names, idx, _ = columnar._sensors(col)
    assert [names[i] for i in idx] == texts
    short = [t for k in range(8) for t in ("a", f"x{k}")]  # repeats at 2, 4 .. 14, cycles at 16
    assert columnar._cycle(pa.array(short * 5, pa.string())) is not None


@pytest.mark.parametrize("late_sensor", [True, False])
def test_a_sensor_first_read_in_a_later_batch_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, late_sensor: bool
) -> None:
    """The summary's sensor count is marked batch by batch until every sensor has been
    seen: one that starts later still counts, one never read does not."""
    rows = [f"{1780444800 + 60 * i},{s},{7 + i % 3}" for i in range(120) for s in SENSORS[:2]]
    if late_sensor:
        rows += [f"{1780444800 + 60 * i},{SENSORS[2]},20" for i in range(120, 130)]
    path = tmp_path / "late.csv"
    path.write_text("time,sensor,value\n" + "\n".join(rows) + "\n")
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 300)  # many batches, the third sensor in the last
    result = replay(
        "--config", str(CASE / "config.yaml"), "--input", str(path), "--events", str(tmp_path / "e.jsonl"),
        "--no-incidents",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"replay: {len(rows)} samples, {3 if late_sensor else 2} sensors," in result.stdout
