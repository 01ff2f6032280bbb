"""The poller against the real pymodbus simulator over TCP on loopback, and each field fault."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time

import pytest

from monitor.model import ConditionState, ManualClock, Quality, Rule
from monitor.sources.modbus import ModbusPoller
from simulators.modbus_server import StationServer
from simulators.scenarios import Station
from tests.modbus_support import STATION_FIELDS, Collector, RecordingProxy, device, running, wait_for
from tests.services import free_port

T0 = 1_700_000_000.0


def frozen_station(**kw: float) -> Station:
    return Station(seed=11, speed=60, start=T0, **kw)  # type: ignore[arg-type]


def test_polls_the_simulator_and_decodes_its_map() -> None:
    async def scenario() -> None:
        port = free_port()
        station = frozen_station()
        at = T0 + 600.0
        async with StationServer(station, port=port, clock=lambda: at):
            fields = [
                *STATION_FIELDS,
                {"sensor": "ph_scaled", "address": 12, "type": "UINT16", "scale": 0.01},
                {"sensor": "temp_scaled", "address": 13, "type": "INT16", "scale": 0.1},
                {
                    "sensor": "oil_input",
                    "register": "input",
                    "address": 0,
                    "type": "FLOAT32",
                    "byte_order": "CDAB",
                },
                {
                    "sensor": "meter_input",
                    "register": "input",
                    "address": 4,
                    "type": "UINT32",
                    "byte_order": "CDAB",
                },
                {"sensor": "pump", "register": "coil", "address": 0, "type": "BIT"},
                {"sensor": "pump_bit", "address": 14, "type": "BIT", "bit": 0},
                {"sensor": "flow_offset", "address": 0, "type": "FLOAT32", "scale": 2.0, "offset": -1.0},
            ]
            poller = ModbusPoller([device("plc", port, fields)], ManualClock(T0 + 5))
            items = await poller.poll("plc")
        expected = station.values(at)
        got = {s.sensor: s for s in items}
        assert all(s.quality is Quality.GOOD and s.time == T0 + 5 for s in got.values())  # type: ignore[union-attr]
        for sensor, key in [
            ("flow", "flow"),
            ("ph", "ph"),
            ("temp", "temperature"),
            ("oil", "oil"),
            ("oil_input", "oil"),
        ]:
            assert got[sensor].value == pytest.approx(expected[key], rel=1e-6)
        assert got["meter"].value == got["meter_input"].value == expected["meter"]
        assert got["ph_scaled"].value == pytest.approx(expected["ph"], abs=0.006)
        assert got["temp_scaled"].value == pytest.approx(expected["temperature"], abs=0.06)
        assert got["pump"].value == got["pump_bit"].value == 1.0
        assert got["flow_offset"].value == pytest.approx(expected["flow"] * 2 - 1, rel=1e-6)
        # holding 0..14 in one request, input 0..5 in one, the coil in one
        assert [r.describe().split(" (")[0] for r in poller.devices["plc"].requests] == [
            "FC1 coil 0..0",
            "FC3 holding 0..14",
            "FC4 input 0..5",
        ]

    asyncio.run(scenario())


def test_a_timed_out_device_never_delays_another_and_reconnects() -> None:
    async def scenario() -> None:
        slow_port, fast_port = free_port(), free_port()
        clock = ManualClock(T0)
        async with (
            StationServer(frozen_station(), port=slow_port) as slow,
            StationServer(frozen_station(), port=fast_port) as fast,
        ):
            slow.faults.delay = 2.0  # answers, but far too late
            devices = [
                device(
                    "slow", slow_port, STATION_FIELDS[:2], timeout=0.8, poll_interval=0.1, comm_loss_after=2
                ),
                device(
                    "fast",
                    fast_port,
                    [{"sensor": "fast.flow", "address": 0, "type": "FLOAT32"}],
                    poll_interval=0.05,
                ),
            ]
            poller = ModbusPoller(devices, clock)
            out = Collector()
            async with running(lambda: poller.run(out)):
                await wait_for(lambda: out.count("flow", Quality.COMM_FAILURE) >= 3, what="3 timeouts")
                await wait_for(lambda: len(out.conditions()) >= 2, what="comm-loss")
                slow.faults.delay = 0.0
                await wait_for(
                    lambda: any(c.state is ConditionState.CLEARED for c in out.conditions()), what="clear"
                )
        fast_times = out.times("fast.flow")
        assert out.count("fast.flow", Quality.GOOD) == len(fast_times)
        # The fast device kept its 50 ms grid while the slow one waited 0.8 s per poll; had
        # it waited behind the slow one, a gap would be >= 0.8 s. 0.5 s leaves room for a
        # busy CI machine without letting a real stall through.
        gaps = [b - a for a, b in itertools.pairwise(fast_times) if b - a > 0.001]
        assert len(fast_times) >= 20
        assert max(gaps) < 0.5, f"fast device stalled for {max(gaps):.3f}s"
        # Each timeout closed the connection; the next poll reopened it.
        assert slow.connections >= 3 and fast.connections == 1
        active = [c for c in out.conditions() if c.state is ConditionState.ACTIVE]
        assert {c.sensor for c in active} == {"flow", "ph"} and all(c.rule is Rule.COMM_LOSS for c in active)
        assert all(c.time == T0 for c in active) and "slow" in active[0].message
        health = {h.device: h for h in poller.health()}
        assert health["slow"].timeouts >= 3 and health["fast"].errors == 0

    asyncio.run(scenario())


def test_after_a_timeout_a_late_reply_cannot_answer_the_next_request() -> None:
    async def scenario() -> None:
        port = free_port()
        # The server's clock moves 10 s with each read it serves, so every answer is distinct.
        reads: list[int] = []
        async with StationServer(frozen_station(), port=port, clock=lambda: T0 + len(reads) * 10.0) as srv:
            reads = srv.function_codes
            srv.faults.delay, srv.faults.delay_count = 0.3, 1
            poller = ModbusPoller([device("plc", port, STATION_FIELDS[:1], timeout=0.1)], ManualClock(T0))
            first = await poller.poll("plc")
            await asyncio.sleep(0.35)  # let the late reply go out on the old connection
            second = await poller.poll("plc")
            third = await poller.poll("plc")
        assert [s.quality for s in first] == [Quality.COMM_FAILURE]  # type: ignore[union-attr]
        assert math.isnan(first[0].value)
        assert [s.quality for s in second + third] == [Quality.GOOD, Quality.GOOD]  # type: ignore[union-attr]
        assert srv.connections == 2
        # Had the late reply (read 1) been taken, `second` would carry read 1's value.
        flow = [frozen_station().values(T0 + k * 10.0)["flow"] for k in range(4)]
        assert second[0].value == pytest.approx(flow[2], rel=1e-6) != flow[1]
        assert third[0].value == pytest.approx(flow[3], rel=1e-6)

    asyncio.run(scenario())


def test_exception_2_marks_only_the_offending_field_and_splits(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[list[object]]:
        port = free_port()
        async with StationServer(frozen_station(), port=port) as srv:
            srv.faults.holes = [("holding", 4, 2), ("holding", 20, 1)]
            fields = [
                *STATION_FIELDS,  # 0..9; temp at 4 sits in the hole
                {"sensor": "a", "address": 15, "type": "UINT16"},
                {"sensor": "b", "address": 25, "type": "UINT16"},  # the hole at 20 is in the gap
            ]
            poller = ModbusPoller([device("plc", port, fields, max_gap=10)], ManualClock(T0))
            assert len(poller.plans[0].requests) == 1
            cycles = [await poller.poll("plc") for _ in range(3)]
            requests = [r.describe().split(" (")[0] for r in poller.devices["plc"].requests]
        # bisected until each part reads or is the one bad field
        assert requests == [
            "FC3 holding 0..1",
            "FC3 holding 2..3",
            "FC3 holding 4..5",
            "FC3 holding 6..9",
            "FC3 holding 15..15",
            "FC3 holding 25..25",
        ]
        return cycles  # type: ignore[return-value]

    with caplog.at_level(logging.DEBUG, logger="monitor.sources.modbus"):
        cycles = asyncio.run(scenario())
    for items in cycles:
        quality = {s.sensor: s.quality for s in items}  # type: ignore[attr-defined]
        assert quality.pop("temp") is Quality.BAD_DATA
        assert set(quality.values()) == {Quality.GOOD}, quality
        assert not any(isinstance(i, type(None)) for i in items)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "holding 4 -> temp" in errors[0].getMessage() and "address - 1" in errors[0].getMessage()


def test_exception_6_is_retried_after_a_pause() -> None:
    async def scenario() -> None:
        port = free_port()
        async with StationServer(frozen_station(), port=port) as srv:
            dev = device("plc", port, STATION_FIELDS[:1], busy_retries=2, busy_pause=0.05)
            poller = ModbusPoller([dev], ManualClock(T0))
            srv.faults.busy = 2
            began = time.monotonic()
            ok = await poller.poll("plc")
            waited = time.monotonic() - began
            srv.faults.busy = 3
            busy = await poller.poll("plc")
            codes = list(srv.function_codes)
        assert [s.quality for s in ok] == [Quality.GOOD]  # type: ignore[union-attr]
        assert waited >= 0.1  # two pauses of 50 ms (a lower bound: sleeps never end early)
        assert [s.quality for s in busy] == [Quality.COMM_FAILURE]  # type: ignore[union-attr]
        assert codes == [3] * 6

    asyncio.run(scenario())


def test_reconnect_backs_off_exponentially_with_jitter_then_recovers() -> None:
    async def scenario() -> None:
        port = free_port()  # nothing listens here yet
        dev = device("plc", port, STATION_FIELDS[:1], poll_interval=0.01, timeout=0.2)
        poller = ModbusPoller([dev], ManualClock(T0), reconnect_delay=0.02, reconnect_delay_max=0.16)
        hub = poller.devices["plc"].hub
        out = Collector()
        async with running(lambda: poller.run(out)):
            await wait_for(lambda: len(hub.connect_attempts) >= 6, what="6 connect attempts")
            attempts = list(hub.connect_attempts)
            polls = out.count("flow", Quality.COMM_FAILURE)
            async with StationServer(frozen_station(), port=port):
                await wait_for(lambda: out.count("flow", Quality.GOOD) >= 1, what="recovery")
                assert poller.health()[0].connected
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        steps = [min(0.16, 0.02 * 2**i) for i in range(len(gaps))]
        # each wait is at least half its exponential step (full jitter in [50 %, 100 %])
        assert all(g >= 0.5 * s - 0.002 for g, s in zip(gaps, steps, strict=True)), (gaps, steps)
        assert sum(gaps[3:]) > sum(gaps[:2])  # grows, not fixed
        assert polls > len(attempts)  # polls in between fail fast, without a connect each

    asyncio.run(scenario())


@pytest.mark.parametrize("close_after_cycle", [True, False])
def test_close_after_cycle_for_single_connection_devices(close_after_cycle: bool) -> None:
    async def scenario() -> int:
        port = free_port()
        async with StationServer(frozen_station(), port=port) as srv:
            dev = device("plc", port, STATION_FIELDS, close_after_cycle=close_after_cycle)
            poller = ModbusPoller([dev], ManualClock(T0))
            for _ in range(3):
                items = await poller.poll("plc")
                assert {s.quality for s in items} == {Quality.GOOD}  # type: ignore[union-attr]
            return srv.connections

    assert asyncio.run(scenario()) == (3 if close_after_cycle else 1)


def test_units_behind_one_endpoint_share_one_connection() -> None:
    async def scenario() -> None:
        port = free_port()
        stations = {1: Station(seed=1, start=T0), 2: Station(seed=2, start=T0)}
        async with StationServer(stations, port=port, clock=lambda: T0) as srv:
            devs = [
                device("u1", port, [{"sensor": "f1", "address": 0, "type": "FLOAT32"}], device_id=1),
                device("u2", port, [{"sensor": "f2", "address": 0, "type": "FLOAT32"}], device_id=2),
            ]
            poller = ModbusPoller(devs, ManualClock(T0))
            assert len(poller.hubs) == 1
            a, b = await asyncio.gather(poller.poll("u1"), poller.poll("u2"))
        assert a[0].value == pytest.approx(stations[1].values(T0)["flow"], rel=1e-6)
        assert b[0].value == pytest.approx(stations[2].values(T0)["flow"], rel=1e-6)
        assert srv.connections == 1

    asyncio.run(scenario())


def test_read_only_only_function_codes_1_to_4_reach_the_device() -> None:
    """A proxy in front records every function code the poller sends, through every
    path: merged reads of all four tables, splits after exception 2, busy retries,
    timeouts with reconnects."""

    async def scenario() -> list[int]:
        port, proxy_port = free_port(), free_port()
        async with StationServer(frozen_station(), port=port) as srv:
            proxy = RecordingProxy(port, proxy_port)
            await proxy.start()
            try:
                fields = [
                    *STATION_FIELDS,
                    {"sensor": "oil_in", "register": "input", "address": 0, "type": "FLOAT32"},
                    {"sensor": "pump", "register": "coil", "address": 0, "type": "BIT"},
                    {"sensor": "alarm", "register": "discrete", "address": 0, "type": "BIT"},
                ]
                dev = device("plc", proxy_port, fields, timeout=0.2, busy_pause=0.01)
                poller = ModbusPoller([dev], ManualClock(T0))
                await poller.poll("plc")
                srv.faults.holes = [("holding", 4, 1)]
                await poller.poll("plc")
                srv.faults.busy = 1
                await poller.poll("plc")
                srv.faults.delay, srv.faults.delay_count = 0.5, 1
                await poller.poll("plc")
                await poller.poll("plc")
                for hub in poller.hubs.values():
                    hub.close()
                await wait_for(lambda: len(proxy.function_codes) >= len(srv.function_codes), what="proxy")
            finally:
                await proxy.stop()
            return proxy.function_codes

    codes = asyncio.run(scenario())
    assert len(codes) >= 20
    assert set(codes) == {1, 2, 3, 4}


def test_device_offline_scenario_logs_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    """The simulator's device_offline scenario goes silent; the poller logs ERROR once,
    DEBUG while it lasts, INFO on recovery, and raises then clears comm-loss."""

    async def scenario() -> list[list[object]]:
        port = free_port()
        station = frozen_station()
        station.inject("device_offline", "10m", "10m")
        now = [T0]  # real seconds; speed 60 -> offline from T0+10 s to T0+20 s
        async with StationServer(station, port=port, clock=lambda: now[0], update_interval=0):
            dev = device("plc", port, STATION_FIELDS[:2], timeout=0.1, comm_loss_after=2)
            clock = ManualClock(T0)
            poller = ModbusPoller([dev], clock)
            cycles = []
            for t in (5, 12, 14, 16, 25):
                now[0] = T0 + t
                clock.set(T0 + t)
                cycles.append(await poller.poll("plc"))
            return cycles  # type: ignore[return-value]

    with caplog.at_level(logging.DEBUG, logger="monitor.sources.modbus"):
        cycles = asyncio.run(scenario())
    qualities = [{i.quality for i in c if hasattr(i, "quality")} for c in cycles]
    assert qualities == [
        {Quality.GOOD},
        {Quality.COMM_FAILURE},
        {Quality.COMM_FAILURE},
        {Quality.COMM_FAILURE},
        {Quality.GOOD},
    ]
    conditions = [(i.time, i.state) for c in cycles for i in c if hasattr(i, "rule")]  # type: ignore[attr-defined]
    assert conditions == [(T0 + 14, ConditionState.ACTIVE)] * 2 + [(T0 + 25, ConditionState.CLEARED)] * 2
    mine = [r for r in caplog.records if r.name == "monitor.sources.modbus" and "plc" in r.getMessage()]
    levels = [r.levelname for r in mine]
    assert levels.count("ERROR") == 1 and levels.count("DEBUG") == 2
    assert mine[-1].levelname == "INFO" and "answering again after 3 failed poll(s)" in mine[-1].getMessage()
    assert "timeout" in mine[0].getMessage() and "holding 0..3" in mine[0].getMessage()


def test_a_silent_device_costs_one_timeout_per_cycle_not_one_per_request() -> None:
    async def scenario() -> None:
        port = free_port()
        async with StationServer(frozen_station(), port=port) as srv:
            fields = [
                *STATION_FIELDS,
                {"sensor": "oil_in", "register": "input", "address": 0, "type": "FLOAT32"},
            ]
            poller = ModbusPoller([device("plc", port, fields, timeout=0.1)], ManualClock(T0))
            srv.faults.delay = 0.3
            items = await poller.poll("plc")
            sent = list(srv.function_codes)
        assert sent == [3]  # the input-register read was not sent after the holding read timed out
        assert {s.quality for s in items} == {Quality.COMM_FAILURE}  # type: ignore[union-attr]
        assert len(items) == len(fields)

    asyncio.run(scenario())


def test_a_plc_error_value_and_the_ieee_extremes_are_bad_data_not_readings() -> None:
    """Issue 12: FLOAT32's largest (3.4028235e38, the error code many PLCs send) was stored
    as GOOD; a field's `bad_values` are the device's own error values, compared with what
    the register holds (before scale)."""

    async def scenario() -> None:
        port = free_port()
        station = frozen_station()
        station.inject("error_value", 0, "1d", sensor="flow", value=3.4028235e38)
        station.inject("error_value", 0, "1d", sensor="temperature", value=-999.9)  # INT16 x0.1: -9999
        at = T0 + 60.0
        async with StationServer(station, port=port, clock=lambda: at):
            fields = [
                {"sensor": "flow", "address": 0, "type": "FLOAT32"},
                {
                    "sensor": "temp_scaled",
                    "address": 13,
                    "type": "INT16",
                    "scale": 0.1,
                    "bad_values": [-9999],
                },
                {"sensor": "temp_plain", "address": 13, "type": "INT16", "scale": 0.1},
                {"sensor": "ph", "address": 2, "type": "FLOAT32", "bad_values": [-9999]},
            ]
            poller = ModbusPoller([device("plc", port, fields)], ManualClock(T0 + 5))
            items = await poller.poll("plc")
        got = {s.sensor: s for s in items}
        assert got["flow"].quality is Quality.BAD_DATA  # type: ignore[union-attr]
        assert got["temp_scaled"].quality is Quality.BAD_DATA  # type: ignore[union-attr]
        # Without bad_values the same register is a reading (the engine's plausible range
        # for temperature, -50..150 degC, is what catches it there).
        assert got["temp_plain"].quality is Quality.GOOD and got["temp_plain"].value == pytest.approx(-999.9)  # type: ignore[union-attr]
        assert got["ph"].quality is Quality.GOOD  # type: ignore[union-attr]
        assert poller.devices["plc"].health.bad_fields == 0  # bad data, not a failing field

    asyncio.run(scenario())
