"""Samples from CSV files (`time,sensor,value`) as NumPy arrays for the engine's replay path.

`time` is ISO 8601 with `Z` or an offset, or epoch seconds. Bad rows never stop a
replay: a row for an unknown sensor or with an unreadable time is skipped, a row
whose value cannot be read becomes a BAD_DATA sample (the reading happened, it is
just not a number), and a row not later than the previous row of the same sensor
in the same file is skipped as out of order. Each kind is counted, with the first
line it happened on, for the report at the end.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import numpy.typing as npt

from monitor.errors import PayloadError, SourceError
from monitor.model import Quality, parse_time

CHUNK_ROWS = 200_000
COLUMNS = ("time", "sensor", "value")


@dataclass
class BadRows:
    """How often one kind of bad row occurred, and where first."""

    count: int = 0
    first_line: int = 0
    example: str = ""

    def add(self, line: int, example: str, count: int = 1) -> None:
        if self.count == 0 or line < self.first_line:
            self.first_line, self.example = line, example
        self.count += count


@dataclass
class ReadReport:
    """Bad rows of one file, by kind."""

    path: str
    rows: int = 0
    unknown_sensor: dict[str, BadRows] = field(default_factory=dict)
    bad_time: BadRows = field(default_factory=BadRows)
    bad_value: BadRows = field(default_factory=BadRows)
    out_of_order: BadRows = field(default_factory=BadRows)

    def lines(self) -> list[str]:
        """One line per kind of problem, for stderr."""
        out: list[str] = []
        for sensor, p in sorted(self.unknown_sensor.items()):
            out.append(
                f"{self.path}: {p.count} row(s) for unknown sensor {sensor!r} (first at line {p.first_line})"
            )
        for what, p in (
            ("unreadable time or too few columns", self.bad_time),
            ("unreadable value (kept as bad data)", self.bad_value),
            ("out of order or duplicate time (skipped)", self.out_of_order),
        ):
            if p.count:
                out.append(
                    f"{self.path}: {p.count} row(s) with {what}, first at line {p.first_line}: {p.example}"
                )
        return out


@dataclass(frozen=True, slots=True)
class Samples:
    """Samples as parallel arrays; `sensor` indexes the sensor list the reader was given."""

    sensor: npt.NDArray[np.int32]
    time: npt.NDArray[np.float64]
    value: npt.NDArray[np.float64]
    quality: npt.NDArray[np.int8]

    def __len__(self) -> int:
        return int(self.time.size)

    @staticmethod
    def concat(parts: Sequence[Samples]) -> Samples:
        """Several inputs merged into one stream in time order (stable: ties keep input order)."""
        if not parts:
            return Samples(np.empty(0, np.int32), np.empty(0), np.empty(0), np.empty(0, np.int8))
        time = np.concatenate([p.time for p in parts])
        order = np.argsort(time, kind="stable")
        return Samples(
            np.concatenate([p.sensor for p in parts])[order],
            time[order],
            np.concatenate([p.value for p in parts])[order],
            np.concatenate([p.quality for p in parts])[order],
        )


def read_csv(
    path: str | Path, sensors: Sequence[str], chunk_rows: int = CHUNK_ROWS
) -> tuple[Samples, ReadReport]:
    """Read one CSV file; raises SourceError only when the file itself is unusable."""
    path = Path(path)
    index = {s: i for i, s in enumerate(sensors)}
    report = ReadReport(str(path))
    parts: list[_Chunk] = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: spreadsheet exports start with a BOM
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise PayloadError(f"{path}: empty file, expected a header {','.join(COLUMNS)}")
            names = [h.strip().lower() for h in header]
            missing = [c for c in COLUMNS if c not in names]
            if missing:
                raise PayloadError(
                    f"{path}: header {','.join(header)!r} lacks column(s) {', '.join(missing)}"
                )
            cols = [names.index(c) for c in COLUMNS]
            line = 1
            while True:
                rows = list(islice(reader, chunk_rows))
                if not rows:
                    break
                parts.append(_chunk(rows, line + 1, cols, index, report))
                line += len(rows)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PayloadError(f"{path}: not a readable CSV file ({exc})") from exc
    if not parts:
        return Samples.concat([]), report
    sensor, time, value, quality, lines = (np.concatenate([p[i] for p in parts]) for i in range(5))
    keep = _in_order(sensor, time, lines, report, sensors)
    samples = Samples(sensor[keep].astype(np.int32), time[keep], value[keep], quality[keep].astype(np.int8))
    order = np.argsort(samples.time, kind="stable")
    return Samples(
        samples.sensor[order], samples.time[order], samples.value[order], samples.quality[order]
    ), report


_Chunk = tuple[
    npt.NDArray[np.int32],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int8],
    npt.NDArray[np.int64],
]


def _chunk(
    rows: list[list[str]], first_line: int, cols: list[int], index: dict[str, int], report: ReadReport
) -> _Chunk:
    """Convert a chunk of rows; vectorised when the chunk is clean, row by row when not."""
    report.rows += len(rows)
    ti, si, vi = cols
    width = max(cols) + 1
    short = [i for i, r in enumerate(rows) if len(r) < width]
    for i in short:
        if any(cell.strip() for cell in rows[i]):  # blank lines are not rows
            report.bad_time.add(first_line + i, ",".join(rows[i]))
    if short:
        drop = set(short)
        lines = np.array([first_line + i for i in range(len(rows)) if i not in drop], dtype=np.int64)
        rows = [r for i, r in enumerate(rows) if i not in drop]
    else:
        lines = np.arange(first_line, first_line + len(rows), dtype=np.int64)
    n = len(rows)
    sensor = np.fromiter((index.get(r[si].strip(), -1) for r in rows), np.int32, n)
    time = _times([r[ti] for r in rows], lines, report)
    value, ok = _values([r[vi] for r in rows])
    quality = np.where(ok, int(Quality.GOOD), int(Quality.BAD_DATA)).astype(np.int8)
    for i in np.flatnonzero(~ok).tolist():
        report.bad_value.add(int(lines[i]), ",".join(rows[i]))
    for i in np.flatnonzero(sensor < 0).tolist():
        name = rows[i][si].strip()
        report.unknown_sensor.setdefault(name, BadRows()).add(int(lines[i]), ",".join(rows[i]))
    keep = (sensor >= 0) & np.isfinite(time)
    return sensor[keep], time[keep], value[keep], quality[keep], lines[keep]


def _times(texts: list[str], lines: npt.NDArray[np.int64], report: ReadReport) -> npt.NDArray[np.float64]:
    try:
        out = np.array(texts, dtype=np.float64)
    except ValueError:
        cache: dict[str, float] = {}
        out = np.empty(len(texts))
        for i, s in enumerate(texts):
            t = cache.get(s)
            if t is None:
                try:
                    t = parse_time(s)
                except ValueError:
                    t = math.nan
                cache[s] = t
            out[i] = t
    for i in np.flatnonzero(~np.isfinite(out)).tolist():
        report.bad_time.add(int(lines[i]), texts[i])
    return out


def _values(texts: list[str]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Values and whether each could be read at all (NaN/inf read fine: the engine judges them)."""
    try:
        return np.array(texts, dtype=np.float64), np.ones(len(texts), dtype=bool)
    except ValueError:
        pass
    out = np.empty(len(texts))
    ok = np.ones(len(texts), dtype=bool)
    for i, s in enumerate(texts):
        try:
            out[i] = float(s)
        except ValueError:
            out[i] = math.nan
            ok[i] = False
    return out, ok


def _in_order(
    sensor: npt.NDArray[np.int32],
    time: npt.NDArray[np.float64],
    lines: npt.NDArray[np.int64],
    report: ReadReport,
    sensors: Sequence[str],
) -> npt.NDArray[np.bool_]:
    """Rows later than every earlier row of the same sensor in this file."""
    n_sensors = len(sensors)
    keep = np.ones(sensor.size, dtype=bool)
    order = np.argsort(sensor.astype(np.uint16) if n_sensors < 65535 else sensor, kind="stable")
    bounds = np.searchsorted(sensor[order], np.arange(n_sensors + 1))
    for s in range(n_sensors):
        sel = order[bounds[s] : bounds[s + 1]]
        if sel.size < 2:
            continue
        t = time[sel]
        ok = np.concatenate(([True], t[1:] > np.maximum.accumulate(t)[:-1]))
        if not ok.all():
            bad = sel[~ok]
            first = int(bad[np.argmin(lines[bad])])
            example = f"{sensors[s]} at {time[first]:.3f} after a later row"
            report.out_of_order.add(int(lines[first]), example, int(bad.size))
            keep[bad] = False
    return keep
