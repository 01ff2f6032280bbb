"""`monitor replay --input` from a pipe: standard input (`zcat day.csv.gz | monitor replay
... --input -`) and named pipes (mkfifo). A pipe cannot be read twice; the reader read
the header from one open of the file and the rows from another, so a pipe failed with
"header ... lacks column(s)". Here a pipe reads exactly as a file of the same bytes:
the same samples, the same bad rows at the same lines, the same events and incidents.
Parquet cannot come from a pipe (it is read from its end): exit 2 naming --input.

Real pipes throughout: os.mkfifo with a writer thread, `cat` feeding a real `monitor`
process's standard input, a pseudo-terminal for the terminal case."""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import pty
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from monitor.errors import InputUsageError, SourceError
from monitor.sources import columnar
from monitor.sources.replay import read_csv
from tests import cli
from tests.incident_helpers import CASES as INCIDENT_CASES
from tests.incident_helpers import case_config, incidents_json

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "replay" / "station-day"
SENSORS = ("outfall.flow", "outfall.ph", "outfall.temp")
DAY = (CASE / "input.csv").read_bytes()
DEADLINE = 60.0  # seconds: a bound for what must happen, never a wait for it


@contextlib.contextmanager
def fed(
    fifo: Path, data: bytes, piece: int = 4093, gate: threading.Event | None = None
) -> Iterator[dict[str, object]]:
    """A named pipe at `fifo` with a thread writing `data` into it in pieces of `piece`
    bytes, then closing it: the other end of `zcat | monitor replay`. With `gate`, the
    thread writes the first half, then waits for the gate (up to DEADLINE) before the
    rest; `state["gate_opened"]` says whether it opened in time. On the way out a reader
    that never came is stood in for, so the writer is never left blocked."""
    os.mkfifo(fifo)
    state: dict[str, object] = {"error": None, "gate_opened": None}

    def write() -> None:
        try:
            with fifo.open("wb", buffering=0) as out:  # waits for the reader, as `cat > fifo` does
                half = len(data) // 2 if gate is not None else len(data)
                for i in range(0, half, piece):
                    out.write(data[i : min(i + piece, half)])
                if gate is not None:
                    state["gate_opened"] = gate.wait(DEADLINE)
                for i in range(half, len(data), piece):
                    out.write(data[i : i + piece])
        except BrokenPipeError as exc:  # the reader stopped reading: it refused the input
            state["error"] = exc

    writer = threading.Thread(target=write, name="fifo writer", daemon=True)
    writer.start()
    try:
        yield state
    finally:
        if writer.is_alive():  # a reader that never opened the pipe: open it so the writer goes on
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(DEADLINE)
        assert not writer.is_alive(), "the fifo writer is still blocked"


def outcome(path: Path) -> object:
    """What reading `path` gives, with its name taken out: the samples and the report's
    lines and row count, or the error's text."""
    try:
        samples, report = read_csv(path, SENSORS)
    except SourceError as exc:
        return str(exc).replace(str(path), "INPUT")
    rows = list(zip(samples.sensor.tolist(), samples.time.tolist(), samples.value.tolist(), strict=True))
    nan_free = [(s, t, "nan" if math.isnan(v) else v) for s, t, v in rows]
    return (
        nan_free,
        samples.quality.tolist(),
        report.rows,
        [line.replace(str(path), "INPUT") for line in report.lines()],
    )


CUT = DAY.index(b"\n", len(DAY) // 2) + 12  # the pipe closes 11 bytes into a line: in its time
PAYLOADS = {
    "station day": DAY,
    "crlf": DAY.replace(b"\n", b"\r\n"),
    "bom": b"\xef\xbb\xbf" + DAY,
    "closes mid-line": DAY[:CUT],
    "header only": b"time,sensor,value\n",
    "header only, no line end": b"time,sensor,value",
    "empty": b"",
    "mac line endings": DAY.replace(b"\n", b"\r"),
    "not a header": b"when,what\n1,2\n",
    "a first line past the header limit": b"time,sensor,value" + b"," * columnar.HEADER_BYTES + b"\n1,a,1\n",
}


@pytest.mark.parametrize("block", [columnar.BLOCK_BYTES, 256])
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_a_named_pipe_reads_as_a_file_of_the_same_bytes(
    tmp_path: Path, name: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Samples, bad rows with their first lines, and refusals in the same words; with
    256-byte blocks, lines are cut across blocks and across the writer's pieces."""
    monkeypatch.setattr(columnar, "BLOCK_BYTES", block)
    data = PAYLOADS[name]
    regular = tmp_path / "input.csv"
    regular.write_bytes(data)
    expected = outcome(regular)
    with fed(tmp_path / "pipe", data) as state:
        got = outcome(tmp_path / "pipe")
    assert got == expected
    if name in ("station day", "crlf", "bom"):  # the bad rows are there to be counted
        assert isinstance(got, tuple) and state["error"] is None
        assert any("unreadable value (kept as bad data), first at line 84" in line for line in got[3])
        assert any("unknown sensor 'outfall.level' (first at line 53)" in line for line in got[3])
    if name == "a first line past the header limit":  # refused, not read on
        assert got == "INPUT: the first line is longer than 64 KiB, expected a header time,sensor,value"
    if name == "closes mid-line":  # the cut line is a bad row, at its own line
        last = DAY[:CUT].count(b"\n") + 1
        assert isinstance(got, tuple)
        assert any(f"too few columns, first at line {last}" in line for line in got[3]), got[3]


def test_a_gzip_file_is_refused_from_a_file_and_from_a_pipe_saying_to_decompress(tmp_path: Path) -> None:
    packed = tmp_path / "day.csv.gz"
    packed.write_bytes(gzip.compress(DAY))
    with pytest.raises(
        SourceError,
        match=re.escape(f"day.csv.gz: gzip-compressed; decompress it on the way in: zcat {packed} |"),
    ):
        read_csv(packed, SENSORS)
    with (
        fed(tmp_path / "pipe", packed.read_bytes()),
        pytest.raises(SourceError, match=r"zcat FILE\.gz \| monitor replay"),
    ):
        read_csv(tmp_path / "pipe", SENSORS)


def test_a_pipe_is_read_in_blocks_as_it_comes_not_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays bounded on a huge pipe: the first chunk comes out while the writer
    still holds back half the data (it waits for that chunk before writing the rest)."""
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 64 << 10)
    rows = b"".join(b"%d,outfall.flow,%d.5\n" % (1780444800 + 10 * i, i % 500) for i in range(40_000))
    gate = threading.Event()
    with fed(tmp_path / "pipe", b"time,sensor,value\n" + rows, gate=gate) as state:
        chunks = columnar.open_chunks(tmp_path / "pipe")
        first = next(chunks)
        gate.set()
        n = int(first.lines.size) + sum(int(c.lines.size) for c in chunks)
    assert state["gate_opened"] is True, "the reader waited for the whole pipe before its first chunk"
    assert int(first.lines[0]) == 2 and int(first.lines.size) < 40_000 // 4
    assert n == 40_000


def test_parquet_from_a_named_pipe_exits_2_naming_input(tmp_path: Path) -> None:
    regular = tmp_path / "day.parquet"
    columnar.write_table(regular, {"time": [1780444800.0], "sensor": ["outfall.ph"], "value": [7.0]})
    with fed(tmp_path / "pipe", regular.read_bytes()), pytest.raises(InputUsageError):
        read_csv(tmp_path / "pipe", SENSORS)
    with fed(tmp_path / "pipe2", regular.read_bytes()):
        result = replay("--input", str(tmp_path / "pipe2"), "--events", str(tmp_path / "e.jsonl"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"replay: --input {tmp_path / 'pipe2'}: Parquet cannot be read from a pipe (its index is at"
        " the end); save it to a file and give that file"
    )
    assert not (tmp_path / "e.jsonl").exists()


def test_one_pipe_named_twice_exits_2_before_it_is_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    pipe = str(tmp_path / "pipe")
    result = replay("--input", pipe, "--input", pipe, "--events", str(tmp_path / "e.jsonl"))
    assert result.returncode == 2
    assert (
        f"replay: --input {pipe}: the same pipe as {pipe}, and a pipe can be read only once" in result.stderr
    )


def replay(*args: str, config: Path = CASE / "config.yaml") -> subprocess.CompletedProcess[str]:
    """`monitor replay --config CONFIG *args` in this process (tests/cli.py), from a directory
    of its own: the case config sets no state_dir, so its incidents go to ./state, which must
    be no other test's (nor the repository's): a replay holds its state dir's lock."""
    with tempfile.TemporaryDirectory(prefix="replay-cwd-") as cwd:
        return cli.run_monitor("replay", "--config", str(config), *args, cwd=cwd)


def bad_row_lines(stderr: str, name: str) -> list[str]:
    """The report's lines about the input, its name taken out."""
    return [
        line.replace(name, "INPUT") for line in stderr.splitlines() if line.startswith(f"replay: {name}:")
    ]


def test_a_named_pipe_replays_the_golden_case_as_the_file_does(tmp_path: Path) -> None:
    from_file = replay("--input", str(CASE / "input.csv"), "--events", str(tmp_path / "file.jsonl"))
    assert from_file.returncode == 0, from_file.stderr
    pipe = tmp_path / "pipe"
    with fed(pipe, DAY) as state:
        from_pipe = replay("--input", str(pipe), "--events", str(tmp_path / "pipe.jsonl"))
    assert from_pipe.returncode == 0, from_pipe.stderr
    assert state["error"] is None
    assert (tmp_path / "pipe.jsonl").read_text() == (CASE / "events.jsonl").read_text()
    assert (tmp_path / "file.jsonl").read_text() == (CASE / "events.jsonl").read_text()
    lines = bad_row_lines(from_pipe.stderr, str(pipe))
    assert lines == bad_row_lines(from_file.stderr, str(CASE / "input.csv")) and len(lines) == 3
    assert "replay: 592 samples, 3 sensors, 8 events" in from_pipe.stdout


def test_a_file_named_dash_is_read_as_dot_slash_dash(tmp_path: Path) -> None:
    """`-` is standard input; a file of that name is given as `./-`."""
    (tmp_path / "-").write_bytes(DAY)
    result = cli.run_monitor(
        "replay", "--config", str(CASE / "config.yaml"), "--input", "./-", "--events", "e.jsonl", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "e.jsonl").read_text() == (CASE / "events.jsonl").read_text()


# Standard input: a real `monitor` process (the test process's own stdin is not the one to read).


def monitor_process(*args: str, stdin: int | IO[bytes]) -> subprocess.CompletedProcess[str]:
    """`monitor replay ARGS` as a process, from a directory of its own (as `replay` above)."""
    with tempfile.TemporaryDirectory(prefix="replay-cwd-") as cwd:
        return subprocess.run(
            [sys.executable, "-m", "monitor", "replay", *args],
            stdin=stdin,
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's `monitor`, as cwd=ROOT gave
            timeout=DEADLINE,
            check=False,
        )


def from_cat(source: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cat SOURCE | monitor replay ARGS`: two processes and an anonymous pipe."""
    cat = subprocess.Popen(["cat", str(source)], stdout=subprocess.PIPE)
    try:
        assert cat.stdout is not None
        return monitor_process(*args, stdin=cat.stdout)
    finally:
        if cat.stdout is not None:
            cat.stdout.close()
        cat.wait(DEADLINE)


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_standard_input_from_a_pipe_replays_as_the_file_does(tmp_path: Path, name: str) -> None:
    events = tmp_path / "e.jsonl"
    result = from_cat(
        CASE / "input.csv", "--config", str(CASE / "config.yaml"), "--input", name, "--events", str(events)
    )
    assert result.returncode == 0, result.stderr
    assert events.read_text() == (CASE / "events.jsonl").read_text()
    from_file = replay("--input", str(CASE / "input.csv"), "--events", str(tmp_path / "file.jsonl"))
    lines = bad_row_lines(result.stderr, "/dev/stdin")
    assert lines == bad_row_lines(from_file.stderr, str(CASE / "input.csv")) and len(lines) == 3


def test_incidents_from_a_pipe_are_the_files_incidents(tmp_path: Path) -> None:
    case = next(c for c in INCIDENT_CASES if c.name == "slug-and-oil")
    by_file, by_pipe = case_config(case, tmp_path / "file"), case_config(case, tmp_path / "pipe")
    assert (
        replay(
            "--input", str(case / "input.csv"), "--events", str(tmp_path / "f.jsonl"), config=by_file
        ).returncode
        == 0
    )
    result = from_cat(
        case / "input.csv", "--config", str(by_pipe), "--input", "-", "--events", str(tmp_path / "p.jsonl")
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "p.jsonl").read_text() == (tmp_path / "f.jsonl").read_text()
    incidents = incidents_json(by_pipe)
    assert len(incidents) == 2 and incidents == incidents_json(by_file)


def test_parquet_on_standard_input_is_read_from_a_file_refused_from_a_pipe(tmp_path: Path) -> None:
    """`< day.parquet` makes standard input a file, which can be read from its end;
    `cat day.parquet |` makes it a pipe, which cannot."""
    day = tmp_path / "day.parquet"
    columnar.write_table(day, {"time": [1780444800.0], "sensor": ["outfall.ph"], "value": [7.0]})
    args = ("--config", str(CASE / "config.yaml"), "--input", "-", "--events", str(tmp_path / "e.jsonl"))
    with day.open("rb") as redirected:
        result = monitor_process(*args, stdin=redirected)
    assert result.returncode == 0, result.stderr
    assert "replay: 1 samples, 1 sensors" in result.stdout
    result = from_cat(day, *args)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "replay: --input /dev/stdin: Parquet cannot be read from a pipe (its index is at the end);"
        " save it to a file and give that file"
    )


def test_dash_on_a_terminal_exits_2_rather_than_wait_for_typed_rows(tmp_path: Path) -> None:
    main, terminal = pty.openpty()
    try:
        result = monitor_process(
            "--config",
            str(CASE / "config.yaml"),
            "--input",
            "-",
            "--events",
            str(tmp_path / "e.jsonl"),
            stdin=terminal,
        )
    finally:
        os.close(terminal)
        os.close(main)
    assert result.returncode == 2
    assert "replay: --input -: standard input is a terminal; pipe the samples in" in result.stderr
