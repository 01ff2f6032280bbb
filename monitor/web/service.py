"""The daemon's HTTP face: the console plus /healthz, /readyz and Prometheus /metrics.

Health and metrics sit beside the console (not inside `app.py`) because they
describe the daemon, not the operator's view; both read `StationView.health()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
        h: Mapping[str, Any] = self.view.health()
        station = self.view.station_id
        samples = CounterMetricFamily(
            "station_monitor_samples", "Samples ingested per source", labels=["station", "source"]
        )
        for source, count in h.get("samples_by_source", {}).items():
            samples.add_metric([station, source], count)
        yield samples
        requests = CounterMetricFamily(
            "station_monitor_modbus_requests", "Modbus requests sent", labels=["station", "device"]
        )
        errors = CounterMetricFamily(
            "station_monitor_modbus_errors", "Modbus requests failed", labels=["station", "device"]
        )
        malformed = CounterMetricFamily(
            "station_monitor_modbus_malformed",
            "Modbus answers that did not fit their request",
            labels=["station", "device"],
        )
        latency = GaugeMetricFamily(
            "station_monitor_modbus_latency_seconds", "Last request round trip", labels=["station", "device"]
        )
        connected = GaugeMetricFamily(
            "station_monitor_source_connected", "1 when the source is connected", labels=["station", "source"]
        )
        mqtt_msgs = CounterMetricFamily("station_monitor_mqtt_messages", "MQTT messages", labels=["station"])
        mqtt_bad = CounterMetricFamily(
            "station_monitor_mqtt_bad_payloads", "MQTT payloads refused", labels=["station"]
        )
        for src in h.get("sources", []):
            connected.add_metric(
                [station, f"{src['source']}:{src['name']}"], 1.0 if src["connected"] else 0.0
            )
            if src["source"] == "modbus":
                requests.add_metric([station, src["name"]], src["requests"])
                errors.add_metric([station, src["name"]], src["errors"])
                malformed.add_metric([station, src["name"]], src.get("malformed", 0))
                if src.get("latency_ms") is not None:
                    latency.add_metric([station, src["name"]], src["latency_ms"] / 1000.0)
            else:
                mqtt_msgs.add_metric([station], src.get("received", 0))
                mqtt_bad.add_metric([station], src.get("bad_payloads", 0))
        yield from (requests, errors, malformed, latency, connected, mqtt_msgs, mqtt_bad)
        outbox = h.get("outbox", {})
        if outbox.get("configured"):
            for name, key, doc in (
                ("outbox_pending_points", "pending", "Points waiting in the outbox"),
                ("outbox_pending_bytes", "pending_bytes", "Bytes waiting in the outbox"),
            ):
                g = GaugeMetricFamily(f"station_monitor_{name}", doc, labels=["station"])
                g.add_metric([station], outbox.get(key, 0))
                yield g
            for name, key, doc in (
                ("points_written", "written", "Points the server acknowledged"),
                ("points_dropped", "dropped", "Points dropped by the outbox size cap"),
                ("points_dead_lettered", "dead_letters", "Points the server rejected for good"),
            ):
                yield _station_metric(CounterMetricFamily, name, doc, station, outbox.get(key, 0))
            age = GaugeMetricFamily(
                "station_monitor_outbox_oldest_age_seconds",
                "Age of the oldest pending point",
                labels=["station"],
            )
            oldest = outbox.get("oldest_queued")
            age.add_metric([station], max(0.0, self.view.now() - oldest) if oldest else 0.0)
            yield age
        active = GaugeMetricFamily(
            "station_monitor_active_alarms", "Active alarms by priority", labels=["station", "priority"]
        )
        by_priority: dict[str, int] = {"critical": 0, "high": 0, "medium": 0, "low": 0}
        for alarm in (a for a in self.view.alarms.active() if a.active):
            by_priority[str(alarm.priority)] = by_priority.get(str(alarm.priority), 0) + 1
        for priority, count in by_priority.items():
            active.add_metric([station, priority], count)
        yield active
        engine = h.get("engine", {})
        yield _station_metric(
            CounterMetricFamily,
            "bad_values",
            "Readings rejected as not believable",
            station,
            engine.get("bad_values", 0),
        )
        not_judged = GaugeMetricFamily(
            "station_monitor_slug_not_judged",
            "1 while a sensor's slug rule is not judged (baseline below slug.min_baseline)",
            labels=["station", "sensor"],
        )
        for sensor in engine.get("slug_not_judged", []):
            not_judged.add_metric([station, sensor], 1)
        yield not_judged
        pipeline = h.get("pipeline", {})
        for kind, name, doc, value in (
            (
                GaugeMetricFamily,
                "intake_stalled",
                "1 while the state disk refuses writes",
                1.0 if pipeline.get("stalled") else 0.0,
            ),
            (
                GaugeMetricFamily,
                "intake_waiting",
                "Readings taken in and not yet stored",
                pipeline.get("waiting", 0),
            ),
            (
                CounterMetricFamily,
                "intake_dropped",
                "Readings dropped while intake was stalled",
                pipeline.get("dropped", 0),
            ),
            (
                CounterMetricFamily,
                "alarm_unjournaled",
                "Alarm transitions the journal refused (not recorded, not shown)",
                pipeline.get("unjournaled", 0),
            ),
            (
                CounterMetricFamily,
                "clock_restamped",
                "Readings stamped before a gateway clock step, moved onto the new clock by the step",
                pipeline.get("restamped", 0),
            ),
        ):
            yield _station_metric(kind, name, doc, station, value)
        listeners = CounterMetricFamily(
            "station_monitor_alarm_listener_failures",
            "Alarm transitions a listener (console, MQTT, notification, InfluxDB) failed on",
            labels=["station", "listener"],
        )
        for name, count in h.get("alarm_listener_failures", {}).items():
            listeners.add_metric([station, name], count)
        yield listeners
        yield _station_metric(
            CounterMetricFamily,
            "alarm_early_clears",
            "Clears stamped before their alarm's activation, journaled at the activation",
            station,
            h.get("alarm_early_clears", 0),
        )
        meters = h.get("meters", {})
        yield _station_metric(
            CounterMetricFamily,
            "meter_clock_step_failures",
            "Gateway clock steps back whose move the meter ledger refused (counted once per step)",
            station,
            meters.get("clock_step_failures", 0),
        )
        yield _station_metric(
            GaugeMetricFamily,
            "meter_clock_steps_pending",
            "Gateway clock steps back not yet moved in the meter ledger (it refuses writes)",
            station,
            meters.get("clock_steps_pending", 0),
        )
        yield _station_metric(
            GaugeMetricFamily,
            "meter_points_unsent_unconfigured",
            "Meter ledger points of meters no longer configured that InfluxDB lacks (kept until configured)",
            station,
            meters.get("unsent_unconfigured", 0),
        )
        incidents = h.get("incidents")
        if isinstance(incidents, Mapping):
            for kind, name, doc, value in (
                (
                    GaugeMetricFamily,
                    "incident_store_failing",
                    "1 while the incident store refuses to record incidents",
                    1.0 if incidents.get("failing") else 0.0,
                ),
                (
                    CounterMetricFamily,
                    "incident_record_failures",
                    "Batches whose incidents the incident store refused to record",
                    incidents.get("failures", 0),
                ),
                (
                    GaugeMetricFamily,  # how many are on record, not events: kept across a restart
                    "incident_evidence_incomplete",
                    "Incidents on record marked 'evidence incomplete' for a damaged evidence block",
                    incidents.get("evidence_incomplete", 0),
                ),
            ):
                yield _station_metric(kind, name, doc, station, value)


def _station_metric(
    kind: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str, doc: str, station: str, value: float
) -> CounterMetricFamily | GaugeMetricFamily:
    """One `station_monitor_<name>` series labelled by station alone: most of /metrics."""
    family = kind(f"station_monitor_{name}", doc, labels=["station"])
    family.add_metric([station], value)
    return family
