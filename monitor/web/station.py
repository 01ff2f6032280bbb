"""The console's view of a running daemon (`StationView`), built on top of it.

The daemon does not import the web layer; `monitor run` composes the two:
`console_server(StationAdapter(daemon))`. Operator actions that change alarm
state through the pipeline (a meter replacement's re-judged alarm) go through
`submit`, so nothing reaches the alarm manager around the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from monitor.alarms import AlarmManager
from monitor.callout import Callout, HeartbeatPinger
from monitor.config import Config
from monitor.daemon import Daemon
from monitor.engine import slug_status
from monitor.incidents import IncidentTracker
from monitor.meters.book import MeterBook
from monitor.model import Alarm, Condition, Quality
from monitor.station.live import LiveStation
from monitor.web.server import ConsoleServer
from monitor.web.service import console_server
from monitor.web.view import SensorReading


class StationAdapter:
    """A `DaemonView` (console, health, metrics) over a `Daemon`."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._kinds = {s.id for s in daemon.config.sensors}

    @property
    def config(self) -> Config:
        return self.daemon.config

    @property
    def alarms(self) -> AlarmManager:
        return self.daemon.alarms

    @property
    def callout(self) -> Callout | None:
        """The console's callout panel reads this (None without `notify.pipelines`)."""
        return self.daemon.callout

    @property
    def heartbeat(self) -> HeartbeatPinger | None:
        return self.daemon.heartbeat

    @property
    def incidents(self) -> IncidentTracker | None:
        """The console's incident routes read this (None with `incidents.enabled: false`)."""
        return self.daemon.incidents

    @property
    def live_station(self) -> LiveStation:
        """The console's wet-well routes read this (monitor/web/wetwell.py)."""
        return self.daemon.station

    @property
    def meter_book(self) -> MeterBook:
        """The console mounts its meter routes (replacement through the API) on this."""
        return self.daemon.meters

    def submit(self, conditions: Sequence[Condition]) -> list[Alarm]:
        """Alarm transitions an operator action caused, through the pipeline."""
        return self.daemon.pipeline.submit(conditions)

    @property
    def station_id(self) -> str:
        return self.daemon.config.station.id

    @property
    def station_name(self) -> str:
        return self.daemon.config.station.name

    def now(self) -> float:
        return self.daemon.clock.now()

    def sensors(self) -> Sequence[SensorReading]:
        out = []
        latest_by_sensor = self.daemon.pipeline.latest
        for sensor in self.daemon.config.sensors:
            latest = latest_by_sensor.get(sensor.id)
            status = self.daemon.engine.status(sensor.id)
            value = latest.value if latest is not None and latest.quality is Quality.GOOD else None
            out.append(
                SensorReading(
                    id=sensor.id,
                    kind=str(sensor.kind),
                    unit=sensor.effective_unit,
                    value=value,
                    quality=latest.quality.name.lower() if latest is not None else "no_data",
                    time=latest.time if latest is not None else None,
                    baseline=status.baseline_mean,
                    name=sensor.name,
                    slug=slug_status(status, self.daemon.config.rules[sensor.id]),
                )
            )
        return out

    def series(self, sensor: str, since: float, until: float) -> Sequence[tuple[float, float]]:
        if sensor not in self._kinds:
            raise KeyError(sensor)
        return [(s.time, s.value) for s in self.daemon.sink.store.query(sensor, since, until)]

    def health(self) -> Mapping[str, object]:
        return self.daemon.health().to_json()


def console_for(daemon: Daemon) -> ConsoleServer | None:
    """The console server for `daemon`, or None when `console.enabled` is false."""
    if not daemon.config.console.enabled:
        return None
    return console_server(StationAdapter(daemon))
