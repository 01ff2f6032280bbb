"""The gateway panel's `attention` list (monitor/health.py): what an operator must see
first, from the daemon's real health snapshot, faults before warnings, nothing for a
healthy gateway, and no failure on a snapshot missing parts (another StationView)."""

from __future__ import annotations

from monitor.health import (
    EngineHealth,
    Health,
    IncidentHealth,
    MeterHealth,
    ModbusHealth,
    MqttHealth,
    OutboxHealth,
    PipelineHealth,
    attention,
    readiness,
)


def fault(text: str) -> dict[str, str]:
    """An attention line the gateway cannot work right without (listed first)."""
    return {"level": "fault", "text": text}


def warning(text: str) -> dict[str, str]:
    """An attention line for what was lost or is not judged yet."""
    return {"level": "warning", "text": text}


PLC = ModbusHealth("outfall-plc", "10.0.0.5:502", True, "2026-12-03T10:00:00Z", 40, 0, 0, 0, (), 0, 4.0, 2)
ENGINE = EngineHealth(100, 0, 0, 0, 0)
PIPELINE = PipelineHealth(10, 0, None, 0, 0, 0, 0, 0)


def test_a_healthy_gateway_needs_no_attention() -> None:
    health = Health(
        (PLC,),
        OutboxHealth(configured=True, max_bytes=1 << 30, written=10),
        ENGINE,
        PIPELINE,
        incidents=IncidentHealth(),
    )
    assert attention(health.to_json()) == []


def test_faults_come_first_then_what_was_lost() -> None:
    down = ModbusHealth("lift-plc", "10.0.0.6:502", False, None, 9, 9, 9, 0, (), 9, None, 1)
    flaky = ModbusHealth(
        "meter-rtu", "10.0.0.7:502", True, None, 50, 2, 0, 0, ("fc3 at 40001: illegal address",), 1, 8.0, 1
    )
    mqtt = MqttHealth("mqtt://broker:8883", True, "bad topic payloads", 10, 9, 1, 0, 0)
    health = Health(
        (PLC, down, flaky, mqtt),
        OutboxHealth(
            configured=True,
            pending=40,
            pending_bytes=4000,
            max_bytes=1 << 20,
            dropped=1,
            dead_letters=3,
            failures=2,
            last_error="HTTP 401 from InfluxDB",
            failing=True,
        ),
        EngineHealth(100, 5, 0, 0, 0, slug_not_judged=("outfall.flow",)),
        PipelineHealth(10, 0, "disk full", 1, 7, 0, 0, 1),
        alarm_listener_failures={"mqtt": 2, "email": 0},
        incidents=IncidentHealth(
            failing="database disk image is malformed", failures=3, evidence_incomplete=2
        ),
        meters=MeterHealth(
            clock_step_failures=1, clock_steps_pending=1, unsent_unconfigured=2, held_back=1200
        ),
    )
    assert attention(health.to_json()) == [
        fault("modbus lift-plc not connected"),
        fault("state disk refuses writes: disk full"),
        fault("incident store refuses to record: database disk image is malformed"),
        fault("meter ledger: 1 clock step back not moved yet (meter readings wait for the state disk)"),
        warning("modbus meter-rtu: 1 poll failed"),
        warning("modbus meter-rtu: the device refused fc3 at 40001: illegal address"),
        warning("mqtt mqtt://broker:8883: bad topic payloads"),
        warning("2 incidents on record with evidence incomplete"),
        warning("2 meter points of meters no longer configured not in InfluxDB (kept in the ledger)"),
        warning("1,200 meter points held in the ledger at the outbox's size cap (none dropped)"),
        warning("1 point dropped at the outbox's size cap (not in InfluxDB)"),
        warning("3 points dead-lettered (InfluxDB refused them)"),
        warning("InfluxDB not taking points (40 points waiting): HTTP 401 from InfluxDB"),
        warning("7 readings dropped while the state disk refused writes"),
        warning("1 alarm transition the alarm journal did not record"),
        warning("alarm notification mqtt: 2 failures"),
        warning("slug rule not judged yet (24 h average below min_baseline): outfall.flow"),
    ]
    # the faults are exactly what /readyz and the callout heartbeat call not ready, and more
    assert set(readiness(health.to_json())) <= {a["text"] for a in attention(health.to_json())}


def test_the_outbox_at_its_cap_is_a_fault() -> None:
    full = OutboxHealth(configured=True, pending=9000, pending_bytes=1 << 20, max_bytes=1 << 20)
    assert attention(Health((PLC,), full, ENGINE, PIPELINE).to_json()) == [fault("outbox at its size cap")]


def test_a_snapshot_missing_parts_does_not_fail() -> None:
    """The console serves any StationView's health; a free-form one must not break the page."""
    assert attention({}) == []
    assert attention({"sources": [{"name": "plc", "state": "polling"}], "outbox_depth": 0}) == [
        fault("source plc not connected")
    ]


def test_influxdb_back_again_is_not_listed() -> None:
    """The drainer keeps its last error and its failure count after a recovery; only a
    drainer backing off now (`failing`) is news, or the line would stay after the blip."""
    recovered = OutboxHealth(
        configured=True,
        pending=3,
        pending_bytes=300,
        max_bytes=1 << 30,
        failures=4,
        last_error="cannot reach",
    )
    assert attention(Health((PLC,), recovered, ENGINE, PIPELINE).to_json()) == []


def test_a_source_down_says_why() -> None:
    """The broker refusing the password reads as that, not only as 'not connected'."""
    mqtt = MqttHealth(
        "mqtts://broker:8883", False, "not authorised (bad user name or password)", 0, 0, 0, 0, 0
    )
    assert attention(Health((mqtt,), OutboxHealth(False), ENGINE, PIPELINE).to_json()) == [
        fault("mqtt mqtts://broker:8883 not connected: not authorised (bad user name or password)")
    ]
