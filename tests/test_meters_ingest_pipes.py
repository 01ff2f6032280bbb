"""`monitor meters ingest --input` from a pipe, with `monitor replay`'s conventions: `-` is
standard input (`zcat readings.csv.gz | monitor meters ingest --input -`), a named pipe
reads as a file of the same bytes, a terminal on `-` or one pipe named twice exits 2
naming --input, and a file named `-` is given as `./-`.

Real pipes throughout: os.mkfifo with a writer thread, `cat` feeding a real `monitor`
process's standard input, a pseudo-terminal for the terminal case."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests import cli

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 60.0  # seconds: a bound for what must happen, never a wait for it
# Two meters, a row for a sensor that is not a meter, a bad row (line 6) and a blank line.
READINGS = (
    b"time,sensor,value\n"
    b"2026-07-01T00:00:00Z,m1,100\n"
    b"2026-07-01T00:00:00Z,m2,5000\n"
    b"2026-07-01T00:00:00Z,level,2.5\n"
    b"2026-07-02T00:00:00Z,m1,150\n"
    b"yesterday,m1,170\n"
    b"\n"
    b"2026-07-03T00:00:00Z,m2,5100\n"
)
SUMMARY = "4 meter reading(s) from 1 file(s), 0 meter alarm transition(s), 1 other row(s), 1 bad row(s)"


def station(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    meter = {"kind": "meter", "unit": "ft3", "register_digits": 8}
    raw = {
        "station": {"id": "ps-1"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [{"id": "m1", **meter}, {"id": "m2", **meter}, {"id": "level", "kind": "level"}],
    }
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def ingest(config: Path, *inputs: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`monitor meters ingest` in this process (tests/cli.py)."""
    args = [a for i in inputs for a in ("--input", i)]
    return cli.run_monitor("meters", "ingest", "--config", str(config), *args, cwd=cwd)


def ledger(config: Path) -> list[str]:
    """Both meters' ledger rows as `meters show` prints them."""
    out = []
    for meter in ("m1", "m2"):
        got = cli.run_monitor("meters", "show", "--config", str(config), "--meter", meter, cwd=ROOT)
        assert got.returncode == 0, got.stderr
        out.append(got.stdout)
    return out


def from_a_file(tmp_path: Path) -> list[str]:
    """The ledger the same bytes give from a plain file: what every pipe must give."""
    config = station(tmp_path / "file")
    (tmp_path / "file" / "r.csv").write_bytes(READINGS)
    got = ingest(config, str(tmp_path / "file" / "r.csv"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(SUMMARY)
    return ledger(config)


@contextlib.contextmanager
def fed(fifo: Path, data: bytes, piece: int = 7) -> Iterator[None]:
    """A named pipe with a thread writing `data` into it in small pieces, then closing it;
    a reader that never came is stood in for on the way out, so the writer is never left
    blocked."""
    os.mkfifo(fifo)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb", buffering=0) as out:
            for i in range(0, len(data), piece):
                out.write(data[i : i + piece])

    writer = threading.Thread(target=write, name="fifo writer", daemon=True)
    writer.start()
    try:
        yield
    finally:
        if writer.is_alive():
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(DEADLINE)
        assert not writer.is_alive(), "the fifo writer is still blocked"


def test_a_named_pipe_ingests_as_a_file_of_the_same_bytes(tmp_path: Path) -> None:
    want = from_a_file(tmp_path)
    config = station(tmp_path / "pipe")
    pipe = tmp_path / "pipe" / "readings"
    with fed(pipe, READINGS):
        got = ingest(config, str(pipe))
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(SUMMARY)
    assert f"{pipe}:6: skipped: " in got.stderr
    assert ledger(config) == want


def monitor_process(*args: str, stdin: int | IO[bytes]) -> subprocess.CompletedProcess[str]:
    """A real `monitor` process: standard input is the process's own, not this test's."""
    return subprocess.run(
        [sys.executable, "-m", "monitor", "meters", "ingest", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=DEADLINE,
        check=False,
    )


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_standard_input_from_a_pipe_ingests_as_the_file_does(tmp_path: Path, name: str) -> None:
    want = from_a_file(tmp_path)
    (tmp_path / "r.csv").write_bytes(READINGS)
    config = station(tmp_path / "stdin")
    cat = subprocess.Popen(["cat", str(tmp_path / "r.csv")], stdout=subprocess.PIPE)
    try:
        assert cat.stdout is not None
        got = monitor_process("--config", str(config), "--input", name, stdin=cat.stdout)
    finally:
        if cat.stdout is not None:
            cat.stdout.close()
        cat.wait(DEADLINE)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(SUMMARY)
    assert "/dev/stdin:6: skipped: " in got.stderr
    assert ledger(config) == want


def test_dash_on_a_terminal_exits_2_rather_than_wait_for_typed_rows(tmp_path: Path) -> None:
    main, terminal = pty.openpty()
    try:
        got = monitor_process("--config", str(station(tmp_path)), "--input", "-", stdin=terminal)
    finally:
        os.close(terminal)
        os.close(main)
    assert got.returncode == 2
    assert "monitor meters ingest: --input -: standard input is a terminal" in got.stderr


def test_one_pipe_named_twice_exits_2_before_it_is_read(tmp_path: Path) -> None:
    config = station(tmp_path)
    os.mkfifo(tmp_path / "pipe")
    pipe = str(tmp_path / "pipe")
    got = ingest(config, pipe, pipe)  # never opened: a reader would wait for a writer here
    assert got.returncode == 2
    assert f"monitor meters ingest: --input {pipe}: the same pipe as {pipe}" in got.stderr


def test_a_file_named_dash_is_read_as_dot_slash_dash(tmp_path: Path) -> None:
    want = from_a_file(tmp_path)
    config = station(tmp_path / "dash")
    (tmp_path / "dash" / "-").write_bytes(READINGS)
    got = ingest(config, "./-", cwd=tmp_path / "dash")
    assert got.returncode == 0, got.stderr
    assert ledger(config) == want
