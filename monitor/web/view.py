"""What the console needs from the daemon, as a protocol, so the web layer never
reaches into sources or the engine: the daemon implements `StationView`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from monitor.alarms import AlarmManager


@dataclass(frozen=True, slots=True)
class SensorReading:
    """One sensor as the console shows it: latest reading and its 24 h baseline.

    `value` is None (not NaN) when there is no believable reading; `quality` is
    the `Quality` name in lower case (good, bad_data, comm_failure).
    """

    id: str
    kind: str
    unit: str
    value: float | None
    quality: str
    time: float | None
    baseline: float | None
    name: str = ""
    # The slug rule: "" (none), "warming_up", "not_judged" (baseline below min_baseline), "judged".
    slug: str = ""


class StationView(Protocol):
    """The daemon's face towards the console. Called on the event loop; keep it quick."""

    @property
    def station_id(self) -> str: ...

    @property
    def station_name(self) -> str: ...

    @property
    def alarms(self) -> AlarmManager:
        """Actions (acknowledge, shelve, ...), the active list and the journal."""
        ...

    def sensors(self) -> Sequence[SensorReading]:
        """Every configured sensor, in config order."""
        ...

    def series(self, sensor: str, since: float, until: float) -> Sequence[tuple[float, float]]:
        """(time, value) readings of one sensor in [since, until) for the sparkline.

        Raises KeyError for an unknown sensor.
        """
        ...

    def health(self) -> Mapping[str, object]:
        """Gateway health as JSON-able data: sources, outbox depth, last poll, ..."""
        ...

    def now(self) -> float:
        """The daemon's clock (so replay and tests see their own time)."""
        ...
