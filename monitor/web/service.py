"""The daemon's HTTP face: the console plus /healthz, /readyz and Prometheus /metrics.

Health and metrics sit beside the console (not inside `app.py`) because they
describe the daemon, not the operator's view; both read `StationView.health()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor.health import readiness
from monitor.web.app import create_app
from monitor.web.callout import add_callout_routes
from monitor.web.server import ConsoleServer
from monitor.web.view import StationView


class DaemonView(StationView, Protocol):
    """What the health endpoints need beyond the console's view."""

    @property
    def config(self) -> Any: ...


def console_server(view: DaemonView) -> ConsoleServer:
    app = create_app(view, view.config.console)
    add_health_routes(app, view)
    add_callout_routes(app, getattr(view, "callout", None), getattr(view, "heartbeat", None))  # callout
    return ConsoleServer(app, view.config.console)


def add_health_routes(app: FastAPI, view: DaemonView) -> None:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StationCollector(view))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        """Liveness: the event loop answers."""
        return JSONResponse({"status": "ok", "station": view.station_id})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """Readiness: every source connected, outbox below its cap."""
        health: Mapping[str, Any] = view.health()
        problems = readiness(health)
        status = 200 if not problems else 503
        return JSONResponse({"ready": not problems, "problems": problems}, status_code=status)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class StationCollector(Collector):
    """Reads the health snapshot at scrape time, so no module outside this one
    needs to know about Prometheus."""

    def __init__(self, view: DaemonView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        scrape = Scrape(self.view.health(), self.view)
        for family in FAMILIES:
            if family.shown(scrape):
                yield family.metric(scrape, self.view.station_id)


@dataclass(frozen=True)
class Scrape:
    """What one scrape reads: the daemon's health snapshot, and its view for the alarms and time."""

    health: Mapping[str, Any]
    view: DaemonView

    def part(self, key: str) -> Mapping[str, Any]:
        """One part of the snapshot (`outbox`, `engine`, ...), empty if this daemon has none."""
        value = self.health.get(key)
        return value if isinstance(value, Mapping) else {}

    def modbus(self) -> list[Mapping[str, Any]]:
        return [src for src in self.health.get("sources", []) if src["source"] == "modbus"]

    def mqtt(self) -> list[Mapping[str, Any]]:
        return [src for src in self.health.get("sources", []) if src["source"] != "modbus"]


Kind = type[CounterMetricFamily] | type[GaugeMetricFamily]
Labelled = Iterable[tuple[Sequence[str], float]]  # (label values after the station's, value)


def _always(scrape: Scrape) -> bool:
    return True


@dataclass(frozen=True)
class Family:
    """One family of /metrics, `station_monitor_<name>`, labelled by station and `labels`.

    `read` gives the value of a family labelled by station alone; `each` the label values
    and value of every series of a family with more labels (or of none, or several).
    `shown`: whether the family is on this daemon at all (the outbox's only with an outbox)."""

    name: str
    help: str
    kind: Kind
    read: Callable[[Scrape], float] | None = None
    each: Callable[[Scrape], Labelled] | None = None
    labels: tuple[str, ...] = ()
    shown: Callable[[Scrape], bool] = _always

    def metric(self, scrape: Scrape, station: str) -> CounterMetricFamily | GaugeMetricFamily:
        family = self.kind(f"station_monitor_{self.name}", self.help, labels=["station", *self.labels])
        if self.read is not None:
            family.add_metric([station], self.read(scrape))
        for labels, value in self.each(scrape) if self.each is not None else ():
            family.add_metric([station, *labels], value)
        return family


def _figure(path: str) -> Callable[[Scrape], float]:
    """A count in the snapshot: "alarm_early_clears", or "outbox.pending" in a part; 0 if absent."""
    part, _, key = path.rpartition(".")
    return lambda scrape: (scrape.part(part) if part else scrape.health).get(key, 0)


def _flag(path: str) -> Callable[[Scrape], float]:
    """1.0 while a condition in a part of the snapshot ("pipeline.stalled") holds, else 0.0."""
    part, _, key = path.partition(".")
    return lambda scrape: 1.0 if scrape.part(part).get(key) else 0.0


def _outbox(scrape: Scrape) -> bool:
    return bool(scrape.part("outbox").get("configured"))


def _incidents(scrape: Scrape) -> bool:
    return isinstance(scrape.health.get("incidents"), Mapping)


def _oldest_age(scrape: Scrape) -> float:
    oldest = scrape.part("outbox").get("oldest_queued")
    return max(0.0, scrape.view.now() - oldest) if oldest else 0.0


def _active_by_priority(scrape: Scrape) -> Labelled:
    by_priority: dict[str, int] = {"critical": 0, "high": 0, "medium": 0, "low": 0}
    for alarm in (a for a in scrape.view.alarms.active() if a.active):
        by_priority[str(alarm.priority)] = by_priority.get(str(alarm.priority), 0) + 1
    return [((priority,), count) for priority, count in by_priority.items()]


Counter, Gauge = CounterMetricFamily, GaugeMetricFamily

# Every family /metrics serves, in the order it serves them (tests/cases/metrics pins the text).
FAMILIES: tuple[Family, ...] = (
    Family("samples", "Samples ingested per source", Counter, labels=("source",),
           each=lambda s: [((source,), n) for source, n in s.health.get("samples_by_source", {}).items()]),
    Family("modbus_requests", "Modbus requests sent", Counter, labels=("device",),
           each=lambda s: [((d["name"],), d["requests"]) for d in s.modbus()]),
    Family("modbus_errors", "Modbus requests failed", Counter, labels=("device",),
           each=lambda s: [((d["name"],), d["errors"]) for d in s.modbus()]),
    Family("modbus_malformed", "Modbus answers that did not fit their request", Counter, labels=("device",),
           each=lambda s: [((d["name"],), d.get("malformed", 0)) for d in s.modbus()]),
    Family("modbus_latency_seconds", "Last request round trip", Gauge, labels=("device",),
           each=lambda s: [((d["name"],), d["latency_ms"] / 1000.0) for d in s.modbus()
                           if d.get("latency_ms") is not None]),
    Family("source_connected", "1 when the source is connected", Gauge, labels=("source",),
           each=lambda s: [((f"{d['source']}:{d['name']}",), 1.0 if d["connected"] else 0.0)
                           for d in s.health.get("sources", [])]),
    Family("mqtt_messages", "MQTT messages", Counter,
           each=lambda s: [((), d.get("received", 0)) for d in s.mqtt()]),
    Family("mqtt_bad_payloads", "MQTT payloads refused", Counter,
           each=lambda s: [((), d.get("bad_payloads", 0)) for d in s.mqtt()]),
    Family("mqtt_stamped_ahead",
           "MQTT readings refused as stamped ahead of the gateway clock (over max_skew)", Counter,
           each=lambda s: [((), d.get("stamped_ahead", 0)) for d in s.mqtt()]),
    Family("outbox_pending_points", "Points waiting in the outbox", Gauge,
           read=_figure("outbox.pending"), shown=_outbox),
    Family("outbox_pending_bytes", "Bytes waiting in the outbox", Gauge,
           read=_figure("outbox.pending_bytes"), shown=_outbox),
    Family("points_written", "Points the server acknowledged", Counter,
           read=_figure("outbox.written"), shown=_outbox),
    Family("points_dropped", "Points dropped by the outbox size cap", Counter,
           read=_figure("outbox.dropped"), shown=_outbox),
    Family("points_dead_lettered", "Points the server rejected for good", Counter,
           read=_figure("outbox.dead_letters"), shown=_outbox),
    Family("outbox_oldest_age_seconds", "Age of the oldest pending point", Gauge,
           read=_oldest_age, shown=_outbox),
    Family("active_alarms", "Active alarms by priority", Gauge,
           labels=("priority",), each=_active_by_priority),
    Family("bad_values", "Readings rejected as not believable", Counter, read=_figure("engine.bad_values")),
    Family("slug_not_judged",
           "1 while a sensor's slug rule is not judged (baseline below slug.min_baseline)", Gauge,
           labels=("sensor",),
           each=lambda s: [((sensor,), 1) for sensor in s.part("engine").get("slug_not_judged", [])]),
    Family("intake_stalled", "1 while the state disk refuses writes", Gauge, read=_flag("pipeline.stalled")),
    Family("intake_waiting", "Readings taken in and not yet stored", Gauge, read=_figure("pipeline.waiting")),
    Family("intake_dropped", "Readings dropped while intake was stalled", Counter,
           read=_figure("pipeline.dropped")),
    Family("alarm_unjournaled", "Alarm transitions the journal refused (not recorded, not shown)", Counter,
           read=_figure("pipeline.unjournaled")),
    Family("clock_restamped",
           "Readings stamped before a gateway clock step, moved onto the new clock by the step", Counter,
           read=_figure("pipeline.restamped")),
    Family("clock_steps", "Gateway clock steps noticed, back or forward (logged once an episode)", Counter,
           read=_figure("clock.steps")),
    Family("clock_heartbeat_ahead_seconds",
           "Seconds the heartbeat is ahead of a gateway clock in doubt since start (taken for unset:"
           " nothing moved); 0 when not in doubt", Gauge,
           read=_figure("clock.heartbeat_ahead")),
    Family("clock_steady_left_seconds",
           "Seconds the gateway clock in doubt must run awake without a step before it is taken as right;"
           " 0 when not in doubt", Gauge,
           read=_figure("clock.steady_left")),
    Family("clock_meter_rows_ahead",
           "Meter readings that stood ahead of a gateway clock in doubt at start, kept (those meters' new"
           " readings alarm backwards and are not billed until it is right); 0 when not in doubt or none did",
           Gauge, read=_figure("clock.meter_rows_ahead")),
    Family("clock_meters_ahead",
           "Meters with readings ahead of a gateway clock in doubt at start (clock_meter_rows_ahead);"
           " 0 when not in doubt or none did", Gauge,
           read=_figure("clock.meters_ahead")),
    Family("alarm_listener_failures",
           "Alarm transitions a listener (console, MQTT, notification, InfluxDB) failed on", Counter,
           labels=("listener",),
           each=lambda s: [((name,), n) for name, n in s.health.get("alarm_listener_failures", {}).items()]),
    Family("alarm_early_clears",
           "Clears stamped before their alarm's activation, journaled at the activation", Counter,
           read=_figure("alarm_early_clears")),
    Family("meter_clock_step_failures",
           "Gateway clock steps back whose move the meter ledger refused (counted once per step)", Counter,
           read=_figure("meters.clock_step_failures")),
    Family("meter_clock_steps_pending",
           "Gateway clock steps back not yet moved in the meter ledger (it refuses writes)", Gauge,
           read=_figure("meters.clock_steps_pending")),
    Family("meter_points_unsent_unconfigured",
           "Meter ledger points of meters no longer configured that InfluxDB lacks (kept until configured)",
           Gauge, read=_figure("meters.unsent_unconfigured")),
    Family("meter_points_held_back",
           "Meter ledger points held back while the outbox is at its size cap with meter points alone"
           " (kept marked, none dropped)",
           Gauge, read=_figure("meters.held_back")),
    Family("incident_store_failing", "1 while the incident store refuses to record incidents", Gauge,
           read=_flag("incidents.failing"), shown=_incidents),
    Family("incident_record_failures",
           "Batches whose incidents the incident store refused to record", Counter,
           read=_figure("incidents.failures"), shown=_incidents),
    Family("incident_evidence_incomplete",  # how many are on record, not events: kept across a restart
           "Incidents on record marked 'evidence incomplete' for a damaged evidence block", Gauge,
           read=_figure("incidents.evidence_incomplete"), shown=_incidents),
)  # fmt: skip
