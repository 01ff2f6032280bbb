"""The daemon's health as a typed snapshot: the console's gateway panel, /readyz and
/metrics read it, so each figure is gathered in one place.

`gather` takes the parts (sources, sink, engine, pipeline), not the daemon, so this
module sits below `daemon.py`; `Health.to_json()` is the JSON the console serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from monitor.engine import Engine
from monitor.model import CLOCK_AHEAD_ADVICE, about, iso
from monitor.pipeline import PipelineStats
from monitor.sinks.pipeline import SampleSink
from monitor.sources.modbus import ModbusPoller
from monitor.sources.mqtt import MqttLink
from monitor.sources.mqtt_ingest import MqttSource


@dataclass(frozen=True, slots=True)
class ModbusHealth:
    name: str
    endpoint: str
    connected: bool
    last_poll: str | None
    requests: int
    errors: int
    timeouts: int
    malformed: int
    invalid_requests: tuple[str, ...]
    failed_in_row: int
    latency_ms: float | None
    requests_per_cycle: int
    source: str = "modbus"


AHEAD_RECENT = 600.0
"""Readings refused as stamped ahead of the gateway clock within this long are news (health's
`stamped_ahead_by`, the console's warning); older ones are history, counted only."""


@dataclass(frozen=True, slots=True)
class MqttHealth:
    name: str
    connected: bool
    error: str | None
    received: int
    samples: int
    bad_payloads: int
    oversized: int  # refused by size, unread
    handler_errors: int
    # Refused as stamped ahead of the gateway clock by over max_skew (among `bad_payloads`):
    # how many since start; how far ahead the worst of the sensors' last ones was, and the
    # sensors refused, while they arrive (within `AHEAD_RECENT`), else None and none.
    stamped_ahead: int = 0
    stamped_ahead_by: float | None = None
    stamped_ahead_sensors: tuple[str, ...] = ()
    source: str = "mqtt"


@dataclass(frozen=True, slots=True)
class OutboxHealth:
    configured: bool
    pending: int = 0
    pending_bytes: int = 0
    max_bytes: int = 0
    oldest_queued: float | None = None
    dead_letters: int = 0
    dropped: int = 0
    written: int = 0
    last_error: str | None = None
    last_success: float | None = None
    failures: int = 0  # since start; `last_error` stays after a recovery
    failing: bool = False  # the last write failed and the drainer is backing off now


@dataclass(frozen=True, slots=True)
class EngineHealth:
    samples: int
    bad_values: int
    unknown_sensor: int
    out_of_order: int
    conditions: int
    slug_not_judged: tuple[str, ...] = ()  # slug rule not judged now (baseline below min_baseline)


@dataclass(frozen=True, slots=True)
class PipelineHealth:
    """`stalled` names the store's error while the state disk refuses writes."""

    batches: int
    waiting: int
    stalled: str | None
    stalls: int
    dropped: int
    recovered: int
    listener_errors: int
    unjournaled: int
    restamped: int = 0  # stamped before a gateway clock step, moved onto the new clock


@dataclass(frozen=True, slots=True)
class IncidentHealth:
    """The incident store: `failing` names its error while it refuses to record (the
    `incident_store` alarm is active); `failures` counts the batches not recorded; and
    `evidence_incomplete` the incidents on record marked for a damaged evidence block (read
    from the store at the start, so a restart does not zero it)."""

    failing: str | None = None
    failures: int = 0
    evidence_incomplete: int = 0


@dataclass(frozen=True, slots=True)
class MeterHealth:
    """The meter ledger across gateway clock steps back: `clock_step_failures` counts the
    steps whose move the ledger refused (a full or read-only state disk), once per step;
    `clock_steps_pending` those still waiting to be moved (until then, a reading of the
    new clock cannot be written: it would be judged `backwards` against the unmoved rows)."""

    clock_step_failures: int = 0
    clock_steps_pending: int = 0
    # Points of meters no longer configured still marked for InfluxDB (kept until configured).
    unsent_unconfigured: int = 0
    # Points kept marked in the ledger while the outbox is at its cap with meter points alone
    # (none dropped: each goes to the outbox as deliveries make room; `MeterBook.held_back`).
    held_back: int = 0


@dataclass(frozen=True, slots=True)
class ClockHealth:
    """The gateway clock (`StepLog`): `steps` noticed since start, back or forward (a step
    found at start included); `episode_steps` those of the episode in progress (0 while the
    clock is steady: a flapping clock's are counted here, and logged once per window), and
    `episode_largest` its largest step in seconds (< 0 back). `heartbeat_ahead`: seconds the
    heartbeat is ahead of a clock in doubt since start (taken for unset: nothing moved, meter
    readings not billed; 0 when not in doubt), `steady_left` the seconds without a step
    before the clock is taken as right (`ClockFile.settle`); `ntp_disagrees`: the kernel says
    the clock is synchronised and said so when the heartbeat was written too (one NTP answer
    was wrong: the cure is the NTP server). `meter_rows_ahead` and `meters_ahead`: while in
    doubt, the meter readings that stood ahead of the clock at start, kept (those meters' new
    readings alarm `backwards` and are not billed until the clock is right), and of how many
    meters; 0 when none did (nothing stands in a new reading's way)."""

    steps: int = 0
    episode_steps: int = 0
    episode_largest: float = 0.0
    heartbeat_ahead: float = 0.0
    steady_left: float = 0.0
    ntp_disagrees: bool = False
    meter_rows_ahead: int = 0
    meters_ahead: int = 0


@dataclass(frozen=True, slots=True)
class Health:
    sources: tuple[ModbusHealth | MqttHealth, ...]
    outbox: OutboxHealth
    engine: EngineHealth
    pipeline: PipelineHealth
    samples_by_source: dict[str, int] = field(default_factory=dict)
    baselines_restored: bool = False
    alarm_listener_failures: dict[str, int] = field(default_factory=dict)
    # Clears stamped before their alarm's activation, journaled at the activation instead
    # (an alarm a restart restored, ended by an older reading). Top level beside the
    # listener failures, the alarm manager's other counter: the console's /api/health
    # already uses "alarms" for its counts by state.
    alarm_early_clears: int = 0
    incidents: IncidentHealth | None = None  # None: incidents are not enabled
    meters: MeterHealth = field(default_factory=MeterHealth)
    clock: ClockHealth = field(default_factory=ClockHealth)

    def to_json(self) -> dict[str, object]:
        """JSON-able data; an unconfigured outbox is `{"configured": false}` only, and
        incidents that are not enabled are left out."""
        doc = asdict(self)
        if not self.outbox.configured:
            doc["outbox"] = {"configured": False}
        if self.incidents is None:
            del doc["incidents"]
        return doc


def gather(
    *,
    modbus: ModbusPoller | None,
    mqtt_link: MqttLink | None,
    mqtt_source: MqttSource | None,
    sink: SampleSink,
    engine: Engine,
    pipeline: PipelineStats,
    waiting: int,
    restored: bool,
    alarm_listener_failures: Mapping[str, int] | None = None,
    alarm_early_clears: int = 0,
    incidents: IncidentHealth | None = None,
    meters: MeterHealth | None = None,
    clock: ClockHealth | None = None,
) -> Health:
    """The snapshot from the running parts."""
    sources: list[ModbusHealth | MqttHealth] = []
    if modbus is not None:
        for dev in modbus.health():
            sources.append(
                ModbusHealth(
                    name=dev.device,
                    endpoint=dev.endpoint,
                    connected=dev.connected,
                    last_poll=iso(dev.last_poll) if dev.last_poll is not None else None,
                    requests=dev.requests,
                    errors=dev.errors,
                    timeouts=dev.timeouts,
                    malformed=dev.malformed,
                    invalid_requests=tuple(dev.invalid_requests),
                    failed_in_row=dev.failed_in_row,
                    latency_ms=None if dev.last_latency is None else round(dev.last_latency * 1000, 2),
                    requests_per_cycle=dev.requests_per_cycle,
                )
            )
    if mqtt_link is not None:
        src = mqtt_source
        ahead_by: float | None = None
        ahead_sensors: tuple[str, ...] = ()
        if src is not None and src.ahead.last is not None:
            since = src.clock.now() - AHEAD_RECENT
            # A run ended by a reading taken is over at once (the device's clock set right),
            # not ten minutes later; past the table's cap the sensors are not known. The
            # worst of the sensors' skews, not the last refusal's: the real one to fix.
            ahead_by = src.ahead.worst(since)
            if ahead_by is not None:
                ahead_sensors = tuple(src.ahead.sensors(since))
        sources.append(
            MqttHealth(
                name=mqtt_link.where,
                connected=mqtt_link.connected,
                error=mqtt_link.last_error,
                received=src.received if src else 0,
                samples=src.samples if src else 0,
                bad_payloads=src.bad.total if src else 0,
                oversized=mqtt_link.oversized,
                handler_errors=mqtt_link.handler_errors,
                stamped_ahead=src.ahead.total if src else 0,
                stamped_ahead_by=ahead_by,
                stamped_ahead_sensors=ahead_sensors,
            )
        )
    outbox = OutboxHealth(configured=False)
    if sink.outbox is not None:
        st = sink.outbox.stats()
        ds = sink.drainer.stats if sink.drainer is not None else None
        outbox = OutboxHealth(
            configured=True,
            pending=st.pending,
            pending_bytes=st.pending_bytes,
            max_bytes=st.max_bytes,
            oldest_queued=st.oldest_queued,
            dead_letters=st.dead_letters,
            dropped=st.dropped,
            written=st.written,
            last_error=ds.last_error if ds else None,
            last_success=ds.last_success if ds else None,
            failures=ds.failures if ds else 0,
            failing=ds.retry_at is not None if ds else False,
        )
    c = engine.counters
    return Health(
        sources=tuple(sources),
        outbox=outbox,
        engine=EngineHealth(
            samples=c.samples,
            bad_values=c.bad_values,
            unknown_sensor=c.unknown_sensor,
            out_of_order=c.out_of_order,
            conditions=c.conditions,
            slug_not_judged=tuple(s.sensor for s in engine.statuses() if s.slug_not_judged),
        ),
        pipeline=PipelineHealth(
            batches=pipeline.batches,
            waiting=waiting,
            stalled=pipeline.stalled,
            stalls=pipeline.stalls,
            dropped=pipeline.dropped,
            recovered=pipeline.recovered,
            listener_errors=pipeline.listener_errors,
            unjournaled=pipeline.unjournaled,
            restamped=pipeline.restamped,
        ),
        samples_by_source=dict(pipeline.samples_by_source),
        baselines_restored=restored,
        alarm_listener_failures=dict(alarm_listener_failures or {}),
        alarm_early_clears=alarm_early_clears,
        incidents=incidents,
        meters=meters if meters is not None else MeterHealth(),
        clock=clock if clock is not None else ClockHealth(),
    )


def readiness(health: Mapping[str, Any]) -> list[str]:
    """Why the daemon is not ready: a source down, the outbox at its cap, the state disk
    refusing writes (/readyz and the callout heartbeat both ask this)."""
    problems = []
    for src in health.get("sources", []):
        if not src.get("connected", False):
            problems.append(f"{src.get('source', 'source')} {src.get('name', '?')} not connected")
    outbox = health.get("outbox", {})
    if outbox.get("configured") and outbox.get("pending_bytes", 0) >= 0.95 * outbox.get("max_bytes", 1):
        problems.append("outbox at its size cap")
    stalled = health.get("pipeline", {}).get("stalled")
    if stalled:
        problems.append(f"state disk refuses writes: {stalled}")
    return problems


def _count(n: object, one: str, many: str) -> str:
    """`1 point dropped`, `250 points dropped`."""
    return f"{n:,} {one}" if n == 1 else f"{n:,} {many}" if isinstance(n, int) else f"{n} {many}"


def _part(health: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A section of the snapshot; empty when absent or not a mapping (another StationView)."""
    part = health.get(name)
    return part if isinstance(part, Mapping) else {}


# What was lost or is not there, said with its count when above 0, in this order (part, key,
# one, many); "drain" is the drainer backing off now, said with its error (`attention`). Meter
# points held back at the outbox's cap are not lost (the ledger keeps them, the outbox takes them
# as deliveries make room) but not in InfluxDB yet: a warning, the cap itself being the fault.
_LOST: tuple[tuple[str, str, str, str], ...] = (
    ("incidents", "evidence_incomplete", "incident on record with evidence incomplete",
     "incidents on record with evidence incomplete"),
    ("meters", "unsent_unconfigured",
     "meter point of a meter no longer configured not in InfluxDB (kept in the ledger)",
     "meter points of meters no longer configured not in InfluxDB (kept in the ledger)"),
    ("meters", "held_back", "meter point held in the ledger at the outbox's size cap (none dropped)",
     "meter points held in the ledger at the outbox's size cap (none dropped)"),
    ("outbox", "dropped", "point dropped at the outbox's size cap (not in InfluxDB)",
     "points dropped at the outbox's size cap (not in InfluxDB)"),
    ("outbox", "dead_letters", "point dead-lettered (InfluxDB refused it)",
     "points dead-lettered (InfluxDB refused them)"),
    ("outbox", "failing", "", ""),
    ("pipeline", "dropped", "reading dropped while the state disk refused writes",
     "readings dropped while the state disk refused writes"),
    ("pipeline", "unjournaled", "alarm transition the alarm journal did not record",
     "alarm transitions the alarm journal did not record"),
)  # fmt: skip


def _held_back(clock: Mapping[str, Any]) -> str:
    """What a clock in doubt holds back: the meter readings that stood ahead of it at start
    make their meters' new readings `backwards` (not billed); with none, nothing is held."""
    rows, meters = clock.get("meter_rows_ahead") or 0, clock.get("meters_ahead") or 0
    if not rows:
        return "no meter reading stood ahead of it: new readings are judged and billed on this clock"
    whose = "that meter's" if meters == 1 else "those meters'"
    return (
        f"{_count(rows, 'reading', 'readings')} of {_count(meters, 'meter', 'meters')} stood ahead of it at"
        f" start: {whose} new readings alarm `backwards` and are not billed"
    )


def attention(health: Mapping[str, Any]) -> list[dict[str, str]]:
    """What the console's gateway panel puts first, worst first: each `{"level", "text"}`,
    `fault` for what stops the station being watched or its records being kept (the
    readiness problems, the incident store refusing, a meter ledger move waiting), `warning`
    for what was lost or is not judged (points dropped or dead-lettered, alarm transitions
    not journaled, a device failing its polls while still connected, a slug rule waiting
    for its baseline). An operator at 3 a.m. reads this list, not forty counters; the
    counters stay under it. Counters since start (bad values, out-of-order samples) are not
    listed: the alarms and /metrics carry them."""
    faults = []
    for src in health.get("sources", []) or []:  # readiness's first problems, with the cause
        if isinstance(src, Mapping) and not src.get("connected", False):
            why = f": {src['error']}" if src.get("error") else ""
            faults.append(f"{src.get('source', 'source')} {src.get('name', '?')} not connected{why}")
    faults += readiness({**health, "sources": []})
    if failing := _part(health, "incidents").get("failing"):
        faults.append(f"incident store refuses to record: {failing}")
    clock = _part(health, "clock")
    if isinstance(ahead := clock.get("heartbeat_ahead"), (int, float)) and ahead > 0:
        left = clock.get("steady_left", 0)
        cure = (
            "NTP said synchronised then and now: check its servers (`chronyc tracking`: an offset"
            " being slewed), or"
            if clock.get("ntp_disagrees")
            else "if `date -u` is right, make the kernel say it is synchronised (NTP), or"
        )
        faults.append(
            f"gateway clock {ahead / 86_400:.1f} days behind its heartbeat, taken for unset"
            f" ({_held_back(clock)}): {cure} it is taken as right after {left / 3600:.0f} h more"
            " without a step"
        )
    if pending := _part(health, "meters").get("clock_steps_pending"):
        steps = _count(pending, "clock step back", "clock steps back")
        faults.append(f"meter ledger: {steps} not moved yet (meter readings wait for the state disk)")

    warnings = []
    for src in health.get("sources", []) or []:
        if not isinstance(src, Mapping) or not src.get("connected", False):
            continue
        name = f"{src.get('source', 'source')} {src.get('name', '')}".strip()
        if src.get("failed_in_row"):
            warnings.append(f"{name}: {_count(src['failed_in_row'], 'poll failed', 'polls failed in a row')}")
        if src.get("invalid_requests"):
            warnings.append(f"{name}: the device refused {', '.join(map(str, src['invalid_requests']))}")
        if src.get("error"):
            warnings.append(f"{name}: {src['error']}")
        if isinstance(ahead := src.get("stamped_ahead_by"), (int, float)):
            refused = [str(n) for n in src.get("stamped_ahead_sensors") or ()]
            more = len(refused) - 5
            sensors = ", ".join(refused[:5]) + (f" and {more} more" if more > 0 else "")
            warnings.append(
                f"{name}: readings of {sensors or 'a sensor'} refused, stamped ahead of the gateway clock"
                f" by ~{about(ahead)} (over max_skew): {CLOCK_AHEAD_ADVICE}"
            )
    outbox = _part(health, "outbox")
    for part, key, one, many in _LOST:
        if not (n := _part(health, part).get(key)):
            continue
        if key == "failing":  # the drainer keeps its last error after a recovery: only now is news
            waiting = _count(outbox.get("pending", 0), "point waiting", "points waiting")
            warnings.append(
                f"InfluxDB not taking points ({waiting}): {outbox.get('last_error') or 'no answer'}"
            )
        else:
            warnings.append(_count(n, one, many))
    for listener, n in (health.get("alarm_listener_failures") or {}).items():
        if n:
            warnings.append(f"alarm notification {listener}: {_count(n, 'failure', 'failures')}")
    if names := _part(health, "engine").get("slug_not_judged"):
        warnings.append(
            f"slug rule not judged yet (24 h average below min_baseline): {', '.join(map(str, names))}"
        )
    return [{"level": "fault", "text": t} for t in faults] + [
        {"level": "warning", "text": t} for t in warnings
    ]
