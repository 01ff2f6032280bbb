"""The rows a historian reader hands to replay, shared by `historian` (InfluxDB 1.x,
VictoriaMetrics) and `historian_flux` (InfluxDB 2.x), in a module of its own so the
two do not import each other (the Flux reader loads influxdb-client only when used)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.model import iso
from monitor.sources.replay import T_MAX, T_MIN, BadRows, ReadReport, Rows
from monitor.units import conversion

WINDOW_S = 6 * 3600.0
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class StoredSeries:
    """One stored series' points as arrays (VictoriaMetrics answers a series at a time)."""

    sensor: str
    time: Floats  # epoch seconds
    value: Floats
    quality: npt.NDArray[np.int8]
    unit: str | None  # its `unit` tag


@dataclass
class HistoryReport(ReadReport):
    """A file's report, plus a line when the range held nothing: a wrong range, database or
    station id would otherwise read as a quiet quarter ("0 samples", no alarms)."""

    station: str = ""
    start: float = 0.0
    end: float = 0.0
    # (sensor, stored unit, the config's unit) -> points; converted, or not convertible
    converted: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    unconverted: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def lines(self) -> list[str]:
        out = super().lines()
        for (sensor, stored, unit), n in sorted(self.converted.items()):
            out.append(
                f"{self.path}: {n} point(s) of {sensor} stored in {stored},"
                f" converted to {unit} (the config's unit)"
            )
        for (sensor, stored, unit), n in sorted(self.unconverted.items()):
            out.append(
                f"{self.path}: {n} point(s) of {sensor} stored in {stored}, which does not convert to"
                f" {unit}: judged as stored"
            )
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
        self.history = HistoryReport(what, station=self.station, start=start, end=end)
        self.report: ReadReport = self.history
        self.units = {s: r.unit for s, r in config.rules.items()}  # what the stored unit tags are read into
        self.points = 0
        # The latest time handed on and the sensors given at it: a repeat of one of them at
        # the start of the next chunk is a repeat too (`_once`).
        self._edge_time = -np.inf
        self._edge_sensors: npt.NDArray[np.int32] = np.empty(0, np.int32)

    def rows(self) -> Iterator[Rows]:
        raise NotImplementedError

    def _rows(
        self,
        names: list[str],
        time: list[float],
        value: list[float],
        quality: list[int],
        unit: Sequence[str | None] | None = None,
    ) -> Rows:
        """Rows of known sensors in the config's units; `unit` is each point's stored `unit` tag."""
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
        v = np.asarray(value, dtype=np.float64)
        if unit is not None:
            self._convert(names, unit, v)
        if n:
            keep &= self._once(sensor, t, lines)
        rows = Rows(sensor, t, v, q, lines)
        return rows if keep.all() else rows.take(keep)

    def _convert(self, names: list[str], unit: Sequence[str | None], value: npt.NDArray[np.float64]) -> None:
        """Values stored in another unit than the config's (the config changed with the
        transmitter), converted in place: the `unit` tag says what a stored number is in."""
        units = self.units
        odd: dict[tuple[str, str], list[int]] = {}
        for i, (s, u) in enumerate(zip(names, unit, strict=True)):
            if u and s in units and u != units[s]:
                odd.setdefault((s, u), []).append(i)
        for (s, u), at in odd.items():
            key = (s, u, units[s])
            try:
                scale, offset = conversion(u, units[s])
            except ValueError:
                self.history.unconverted[key] += len(at)
                continue
            index = np.asarray(at)
            value[index] = value[index] * scale + offset
            self.history.converted[key] += len(at)

    def _series_rows(self, parts: list[StoredSeries]) -> Rows:
        """`_rows` for whole series: the same rows, report and conversions, in time order,
        with no Python object per point."""
        units = self.units
        for k, part in enumerate(parts):
            want = units.get(part.sensor)
            if part.unit and want is not None and part.unit != want:
                key = (part.sensor, part.unit, want)
                try:
                    scale, offset = conversion(part.unit, want)
                except ValueError:
                    self.history.unconverted[key] += part.time.size
                    continue
                parts[k] = StoredSeries(
                    part.sensor, part.time, part.value * scale + offset, part.quality, part.unit
                )
                self.history.converted[key] += part.time.size
        t = np.concatenate([p.time for p in parts])
        order = np.argsort(t, kind="stable")
        t = t[order]
        of = np.concatenate([np.full(p.time.size, k, np.int32) for k, p in enumerate(parts)])[order]
        index = np.array([self.index.get(p.sensor, -1) for p in parts], np.int32)
        sensor = index[of]
        n = t.size
        lines = np.arange(self.points + 1, self.points + n + 1, dtype=np.int64)
        self.points += n
        self.report.rows += n
        for k in np.flatnonzero(index < 0).tolist():
            at = np.flatnonzero(of == k)
            if at.size:
                name = parts[k].sensor
                self.report.unknown_sensor.setdefault(name, BadRows()).add(
                    int(lines[at[0]]), name, int(at.size)
                )
        value = np.concatenate([p.value for p in parts])[order]
        quality = np.concatenate([p.quality for p in parts])[order]
        keep = (sensor >= 0) & (t >= T_MIN) & (t < T_MAX)
        if _may_repeat(parts):
            keep &= self._first_of_each_time(sensor, t, lines)
        rows = Rows(sensor, t, value, quality, lines)
        return rows if keep.all() else rows.take(keep)

    def _once(self, sensor: npt.NDArray[np.int32], t: Floats, lines: Ints) -> Mask:
        """`_first_of_each_time` for a chunk of a streamed answer (InfluxQL's chunks, Flux's
        windows), and across chunks: a sensor's time given at the end of one chunk and again
        at the start of the next is a repeat too. InfluxDB keeps one point per series and
        time, but a sensor whose tags changed (unit or kind added, a tag renamed) has two
        series, and the InfluxQL answer, which merges them in time order, gives such a time
        twice, the two copies side by side or on both sides of a chunk's end. Enough for an
        answer in time order (InfluxQL) or in windows of time (Flux): the next chunk starts
        at or after the latest time of this one."""
        edge = self._edge_time
        before = np.zeros(t.size, dtype=bool)
        if self._edge_sensors.size and float(t.min()) <= edge:
            before = (t == edge) & np.isin(sensor, self._edge_sensors)
        latest = float(t.max())
        if latest >= edge:
            at_latest = sensor[(t == latest) & (sensor >= 0)]  # an unknown sensor is counted as such
            kept = self._edge_sensors if latest == edge else self._edge_sensors[:0]
            self._edge_sensors, self._edge_time = np.union1d(kept, at_latest).astype(np.int32), latest
        return self._first_of_each_time(sensor, t, lines, before)

    def _first_of_each_time(
        self, sensor: npt.NDArray[np.int32], t: Floats, lines: Ints, before: Mask | None = None
    ) -> Mask:
        """False for a sensor's time already given in this chunk (or, `before`, in the one
        before): the first is kept, the rest counted and skipped, as a file's repeated row is
        (`out of order or duplicate time`). VictoriaMetrics without
        `-dedup.minScrapeInterval` keeps both copies of a batch the outbox sent again
        (delivery is at least once); InfluxDB keeps one a series, but a sensor can have two."""
        order = np.lexsort((sensor, t))  # stable: of a repeat, the one read first stays first
        ts, ss = t[order], sensor[order]
        again = np.zeros(t.size, dtype=bool) if before is None else before
        again[order[1:]] |= (ts[1:] == ts[:-1]) & (ss[1:] == ss[:-1]) & (ss[1:] >= 0)  # unknown: counted
        at = np.flatnonzero(again)
        if at.size:
            i = int(at[0])
            example = f"{self.sensors[int(sensor[i])]} at {t[i]:.3f} stored twice"
            self.report.out_of_order.add(int(lines[i]), example, int(at.size))
        return ~again


def _may_repeat(parts: list[StoredSeries]) -> bool:
    """Whether a sensor's time can be there twice: a series with a time repeated (its times
    come sorted), or a sensor in two series. One pass over the times, no sort, when not."""
    names = [p.sensor for p in parts]
    return len(set(names)) < len(names) or any(bool(np.any(p.time[1:] <= p.time[:-1])) for p in parts)
