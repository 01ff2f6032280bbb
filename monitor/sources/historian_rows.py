"""The rows a historian reader hands to replay, shared by `historian` (InfluxDB 1.x,
VictoriaMetrics) and `historian_flux` (InfluxDB 2.x), in a module of its own so the
two do not import each other (the Flux reader loads influxdb-client only when used)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from monitor.config import Config
from monitor.model import iso
from monitor.sources.replay import T_MAX, T_MIN, BadRows, ReadReport, Rows

WINDOW_S = 6 * 3600.0


@dataclass
class HistoryReport(ReadReport):
    """A file's report, plus a line when the range held nothing: a wrong range, database or
    station id would otherwise read as a quiet quarter ("0 samples", no alarms)."""

    station: str = ""
    start: float = 0.0
    end: float = 0.0

    def lines(self) -> list[str]:
        out = super().lines()
        if self.rows == 0:
            out.insert(
                0,
                f"{self.path}: no samples of station {self.station} from {iso(self.start)} to"
                f" {iso(self.end)} (end exclusive): check --start/--end, station.id and the influx section",
            )
        return out


class _History:
    """Rows from a historian: sensor names mapped, unknown ones counted like a file's."""

    def __init__(self, config: Config, start: float, end: float, what: str) -> None:
        self.sensors = list(config.rules)  # `open_history(sensors=...)` may widen it
        self.index = {s: i for i, s in enumerate(self.sensors)}
        self.station = config.station.id
        self.start, self.end = start, end
        self.report: ReadReport = HistoryReport(what, station=self.station, start=start, end=end)
        self.points = 0

    def rows(self) -> Iterator[Rows]:
        raise NotImplementedError

    def _rows(self, names: list[str], time: list[float], value: list[float], quality: list[int]) -> Rows:
        n = len(time)
        lines = np.arange(self.points + 1, self.points + n + 1, dtype=np.int64)
        self.points += n
        self.report.rows += n
        sensor = np.fromiter((self.index.get(s, -1) for s in names), np.int32, n)
        t = np.asarray(time, dtype=np.float64)
        unknown = np.flatnonzero(sensor < 0)
        for i in unknown.tolist():
            self.report.unknown_sensor.setdefault(names[i], BadRows()).add(int(lines[i]), names[i])
        outside = (t < T_MIN) | (t >= T_MAX)
        keep = (sensor >= 0) & ~outside
        q = np.asarray(quality, dtype=np.int8)
        rows = Rows(sensor, t, np.asarray(value, dtype=np.float64), q, lines)
        return rows if keep.all() else rows.take(keep)
