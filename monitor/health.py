"""The daemon's health as JSON-able data: the console's gateway panel, /readyz and /metrics
read it, so each figure is gathered in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from monitor.model import iso

if TYPE_CHECKING:
    from monitor.daemon import Daemon


def health_snapshot(daemon: Daemon) -> dict[str, object]:
    """Sources, outbox and pipeline as JSON-able data (console, /readyz, /metrics)."""
    sources: list[dict[str, object]] = []
    if daemon.modbus is not None:
        for dev in daemon.modbus.health():
            sources.append(
                {
                    "source": "modbus",
                    "name": dev.device,
                    "endpoint": dev.endpoint,
                    "connected": dev.connected,
                    "last_poll": iso(dev.last_poll) if dev.last_poll is not None else None,
                    "requests": dev.requests,
                    "errors": dev.errors,
                    "timeouts": dev.timeouts,
                    "malformed": dev.malformed,
                    "invalid_requests": list(dev.invalid_requests),
                    "failed_in_row": dev.failed_in_row,
                    "latency_ms": None if dev.last_latency is None else round(dev.last_latency * 1000, 2),
                    "requests_per_cycle": dev.requests_per_cycle,
                }
            )
    if daemon.mqtt_link is not None:
        src = daemon.mqtt_source
        sources.append(
            {
                "source": "mqtt",
                "name": daemon.mqtt_link.where,
                "connected": daemon.mqtt_link.connected,
                "error": daemon.mqtt_link.last_error,
                "received": src.received if src else 0,
                "samples": src.samples if src else 0,
                "bad_payloads": src.bad.total if src else 0,
                "oversized": daemon.mqtt_link.oversized,  # refused by size, unread
                "handler_errors": daemon.mqtt_link.handler_errors,
            }
        )
    outbox: dict[str, object] = {"configured": daemon.sink.outbox is not None}
    if daemon.sink.outbox is not None:
        st = daemon.sink.outbox.stats()
        outbox.update(
            pending=st.pending,
            pending_bytes=st.pending_bytes,
            max_bytes=st.max_bytes,
            oldest_queued=st.oldest_queued,
            dead_letters=st.dead_letters,
            dropped=st.dropped,
            written=st.written,
        )
        if daemon.sink.drainer is not None:
            ds = daemon.sink.drainer.stats
            outbox.update(last_error=ds.last_error, last_success=ds.last_success, failures=ds.failures)
    c = daemon.engine.counters
    return {
        "sources": sources,
        "outbox": outbox,
        "engine": {
            "samples": c.samples,
            "bad_values": c.bad_values,
            "unknown_sensor": c.unknown_sensor,
            "out_of_order": c.out_of_order,
            "conditions": c.conditions,
            # Sensors whose slug rule is not judged now (baseline below slug.min_baseline).
            "slug_not_judged": [s.sensor for s in daemon.engine.statuses() if s.slug_not_judged],
        },
        "samples_by_source": dict(daemon.counters.samples_by_source),
        "baselines_restored": daemon.restored,
        "alarm_listener_failures": dict(daemon.alarms.listener_failures),
    }


def readiness(health: Mapping[str, Any]) -> list[str]:
    """Why the daemon is not ready: a source down, the outbox at its cap (/readyz and the
    callout heartbeat both ask this)."""
    problems = []
    for src in health.get("sources", []):
        if not src.get("connected", False):
            problems.append(f"{src['source']} {src['name']} not connected")
    outbox = health.get("outbox", {})
    if outbox.get("configured") and outbox.get("pending_bytes", 0) >= 0.95 * outbox.get("max_bytes", 1):
        problems.append("outbox at its size cap")
    return problems
