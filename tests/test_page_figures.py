"""What a page, a mail and the alarm log line say of an alarm's value and limit: each number in
its real unit. A Modbus comm loss paged "value 5 degF, limit 3 degF" (failed polls as a
temperature), a frozen alarm logged "limit 21600" (six hours with no unit), and a reading of
-0.0 read "-0 degC". Real SMTP (aiosmtpd with STARTTLS and a login) and a real Modbus poll of
a port nobody answers, as tests/test_callout_page_words.py and tests/test_modbus_poll.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from monitor.alarms.figures import figures
from monitor.alarms.notify import LogNotifier
from monitor.config import build_config
from monitor.model import (
    Alarm,
    AlarmState,
    Condition,
    ConditionState,
    ManualClock,
    Priority,
    Rule,
    Sample,
    amount,
)
from monitor.sources.modbus import ModbusPoller
from tests.console import T0 as CONSOLE_T0
from tests.console import LiveConsole, TableView, fill_day
from tests.engine_helpers import every, live, run_live, station
from tests.modbus_support import device
from tests.mqtt_tools import make_ca
from tests.services import free_port
from tests.smtp import MailServer
from tests.test_callout import ALICE, TR, Station, raw_config, write_heartbeat


@pytest.fixture
def smtp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MailServer]:
    """A real SMTP server with STARTTLS and a login, as tests/test_callout.py's."""
    certs = make_ca(tmp_path / "ca")
    monkeypatch.setenv("CALLOUT_SMTP_PASSWORD", "mail-pw")
    monkeypatch.setenv("CALLOUT_LINK_SECRET", "link-secret-for-tests")
    monkeypatch.setenv("CALLOUT_CA", str(certs["ca"]))
    with MailServer(users={"monitor": "mail-pw"}, certs=certs) as server:
        yield server


def alarm(
    rule: Rule, value: float | None, limit: float | None, message: str = "", sensor: str = "s"
) -> Alarm:
    return Alarm(sensor, rule, AlarmState.UNACK, Priority.HIGH, value, limit, "", message)


def modbus_comm_loss(polls: int) -> list[Condition]:
    """The conditions a real Modbus poll raises after `polls` polls of a port nobody listens on
    (connection refused), the device's `comm_loss_after` 3."""

    async def go() -> list[Condition]:
        fields = [{"sensor": "outfall.temp", "address": 4, "type": "FLOAT32"}]
        dev = device("plc", free_port(), fields, timeout=0.2, comm_loss_after=3)
        clock = ManualClock(TR)
        poller = ModbusPoller([dev], clock)
        out: list[Condition] = []
        try:
            for i in range(polls):
                clock.set(TR + i)
                out.extend(c for c in await poller.poll("plc") if isinstance(c, Condition))
        finally:
            for hub in poller.hubs.values():
                hub.close()
        return out

    return asyncio.run(go())


def test_a_modbus_comm_loss_page_counts_failed_polls_not_degrees(tmp_path: Path, smtp: MailServer) -> None:
    """The outfall temperature's PLC stops answering; after 3 failed polls the comm-loss page
    read "value 3 degF, limit 3 degF". It says "3 failed polls, alarm after 3"."""
    [cond] = modbus_comm_loss(3)
    assert cond.rule is Rule.COMM_LOSS and cond.message.startswith("modbus device plc")
    raw = raw_config(tmp_path, smtp.port)
    raw["sensors"].append({"id": "outfall.temp", "kind": "temperature", "unit": "degF"})
    raw["notify"]["pipelines"][0]["match"] = {"rules": ["comm_loss"]}
    config = build_config(raw)
    write_heartbeat(config.state_dir, TR - 60)

    async def go() -> None:
        st = Station(config, TR + 2)
        try:
            st.daemon.alarms.apply(cond)
            await st.tick(TR + 10, 8)
            await st.tick(TR + 20, 10)
            [page] = smtp.to(ALICE)
            assert "outfall.temp comm_loss" in page.subject
            assert "degF" not in page.body, page.body
            assert "3 failed polls, alarm after 3" in page.body, page.body
        finally:
            await st.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("shown", "unit", "text"),
    [
        # limits, slug, level: a reading and its threshold, in the sensor's unit
        (alarm(Rule.HIGH, 71.5, 65.0), "degC", "value 71.5 degC, limit 65 degC"),
        (alarm(Rule.SLUG, 2600.0, 2500.0), "gpm", "value 2600 gpm, limit 2500 gpm"),
        (alarm(Rule.HIGH_LEVEL, 9.2, 8.5), "ft", "value 9.2 ft, limit 8.5 ft"),
        (alarm(Rule.FAIL_TO_START, 6.1, 5.0), "ft", "value 6.1 ft, limit 5 ft"),
        (alarm(Rule.OVERFLOW, 12.3, 12.0), "ft", "value 12.3 ft, limit 12 ft"),
        # the level stale, the float switch deciding: no "value -"
        (alarm(Rule.OVERFLOW, math.nan, 12.0), "ft", "level not read, overflow at 12 ft"),
        (alarm(Rule.OVERFLOW, math.nan, None), "", "level not read"),
        # timers: a time, not a reading
        (alarm(Rule.FROZEN, 7.2, 21600.0), "", "value 7.2, unchanged for longer than 6 h"),
        (alarm(Rule.STALE, 412.0, 300.0), "gpm", "last value 412 gpm, no reading for longer than 5 min"),
        (
            alarm(Rule.COMM_LOSS, 95.0, 60.0, "MQTT broker 127.0.0.1:1883: no broker for 95 s: refused"),
            "gpm",
            "no broker for 2 min, alarm after 1 min",
        ),
        (
            alarm(Rule.COMM_LOSS, 5.0, 3.0, "modbus device plc (127.0.0.1:502 unit 1): timeout"),
            "degF",
            "5 failed polls, alarm after 3",
        ),
        (alarm(Rule.COMM_LOSS, 5.0, 3.0, "some other source"), "degF", "value 5, limit 3"),
        (alarm(Rule.CLOCK, -86400.0, 120.0), "", "stepped back by 24 h (tolerance 2 min)"),
        # a pump: hours run, starts counted
        (alarm(Rule.LONG_RUN, 2.5, 2.0), "", "running for 2 h 30 min, max_run 2 h"),
        (alarm(Rule.PUMP_STARTS, 9.0, 6.0), "", "9 starts in the last hour, at most 6 allowed"),
        # the gateway's own: bytes, points, attempts; flags with nothing to show
        (alarm(Rule.DISK_LOW, 50 * 2**20, 200 * 2**20), "", "50 MiB free, floor 200 MiB"),
        (alarm(Rule.DISK_FULL, float("nan"), float("nan")), "", ""),
        (alarm(Rule.OUTBOX, 1.0, 1e6), "", "1 point dropped, cap 1000000 bytes"),
        (alarm(Rule.NOTIFY, 3.0, None), "", "3 failed attempts"),
        (alarm(Rule.STATE, 1.0, None), "", ""),
        (alarm(Rule.INCIDENTS, float("nan"), None), "", ""),
        (alarm(Rule.BAD_VALUE, 65535.0, None), "degF", "last bad reading 65535"),
        # -0.0, or a value that rounds to it, is 0
        (alarm(Rule.LOW, -0.0, 0.0), "degC", "value 0 degC, limit 0 degC"),
        (alarm(Rule.STALE, -0.0, 300.0), "degC", "last value 0 degC, no reading for longer than 5 min"),
    ],
    ids=lambda x: x.rule.value if isinstance(x, Alarm) else None,
)
def test_every_rule_shows_its_numbers_in_their_real_unit(shown: Alarm, unit: str, text: str) -> None:
    assert figures(shown, unit) == text


def test_minus_zero_reads_zero_in_a_message() -> None:
    """A probe at -0.0 degC read "-0 degC" in a message: below zero, which it was not."""
    assert amount(-0.0, "degC") == "0 degC"
    assert amount(-0.0, "") == "0"
    assert amount(-2.5, "degC") == "-2.5 degC"  # a real negative reading keeps its sign


def test_the_alarm_log_line_gives_a_time_as_a_time_and_a_reading_with_its_unit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The log line said "value 7.2 limit 21600" for a frozen pH (six hours, no unit) and
    "value 3 limit 3" for a comm loss; it says what each number is, readings with their unit."""
    notifier = LogNotifier(units={"outfall.temp": "degF", "outfall.ph": "pH"})
    frozen = alarm(Rule.FROZEN, 7.2, 21600.0, sensor="outfall.ph")
    high = alarm(Rule.HIGH, 151.0, 149.0, sensor="outfall.temp")
    lost = alarm(
        Rule.COMM_LOSS, 3.0, 3.0, "modbus device plc (127.0.0.1:502 unit 1): timeout", "outfall.temp"
    )
    with caplog.at_level(logging.INFO, logger="monitor.alarms.notify.log"):
        for a in (frozen, high, lost):
            asyncio.run(notifier.notify(a))
    lines = [r.getMessage() for r in caplog.records]
    assert "21600" not in lines[0] and "unchanged for longer than 6 h" in lines[0], lines[0]
    assert "value 151 degF, limit 149 degF" in lines[1], lines[1]
    assert "degF" not in lines[2] and "3 failed polls, alarm after 3" in lines[2], lines[2]


def test_the_daemons_log_notifier_knows_the_sensors_units(tmp_path: Path, smtp: MailServer) -> None:
    """The log notifier the daemon builds is given each sensor's unit (it had none)."""
    from monitor.alarms.people import people_notifiers

    raw = raw_config(tmp_path, smtp.port)
    [log_notifier] = [n for n in people_notifiers(build_config(raw)) if isinstance(n, LogNotifier)]
    assert log_notifier.units["outfall.flow"] == "gpm"


def test_a_frozen_clear_at_minus_zero_reads_zero() -> None:
    """A temperature probe held at 0.5 degC reads -0.0 at last: the clear said "temperature
    reading changed: -0.0 degC (was 0.5 degC)", a reading below zero that was not."""
    config = station({"id": "t", "kind": "temperature", "unit": "degC", "frozen_after": "1h"})
    points = every(60.0, [0.5] * 62)
    engine, out = run_live(config, "t", points)
    assert [c.state for c in out if c.rule is Rule.FROZEN] == [ConditionState.ACTIVE]
    (cleared,) = [c for c in live(engine, [Sample("t", points[-1][0] + 60.0, -0.0)]) if c.rule is Rule.FROZEN]
    assert cleared.message == "temperature reading changed: 0.0 degC (was 0.5 degC)"


def test_the_console_card_gives_each_rule_its_real_unit_and_no_minus_zero(
    browser: Browser, tmp_path: Path
) -> None:
    """The alarm card read "3 gpm (limit 3)" for a flow meter's PLC that stopped answering
    (failed polls as gpm), "52,428,800 (limit 209,715,200)" for a low state disk (bytes), and "-0 gpm" for
    a flow that read -0.0001. Real Chromium."""
    view = TableView(tmp_path / "journal.sqlite", ManualClock(CONSOLE_T0))
    fill_day(view, CONSOLE_T0 - 86400)
    with LiveConsole(view, refresh=0.3) as console:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(console.url)
        expect(page.locator("#live")).to_have_text("live")
        t = CONSOLE_T0 + 60
        plc = "modbus device plc (127.0.0.1:502 unit 1): 3 failed polls: timeout"
        conditions = [
            Condition(t, "outfall.flow", Rule.COMM_LOSS, ConditionState.ACTIVE, 3.0, 3.0, "", plc),
            Condition(t, "outfall.oil", Rule.STALE, ConditionState.ACTIVE, -0.0001, 300.0, ""),
            Condition(
                t, "gateway.disk", Rule.DISK_LOW, ConditionState.ACTIVE, 50 * 2.0**20, 200 * 2.0**20, ""
            ),
        ]
        console.call(lambda: [view.alarms.apply(c) for c in conditions])
        flow = page.locator('article.alarm[data-key="outfall.flow/comm_loss"]')
        expect(flow).to_contain_text("3 failed polls (alarm after 3)")
        expect(flow).not_to_contain_text("gpm")
        oil = page.locator('article.alarm[data-key="outfall.oil/stale"]')
        expect(oil).to_contain_text("0 mg/L (no reading for longer than 5 min)")
        expect(oil).not_to_contain_text("-0")
        disk = page.locator('article.alarm[data-key="gateway.disk/disk_low"]')
        expect(disk).to_contain_text("50 MiB free (floor 200 MiB)")
        page.close()


def test_a_rule_that_is_not_a_reading_never_shows_the_sensors_unit() -> None:
    """Only the rules whose value and limit are a reading and its threshold show the sensor's
    unit. Any other falls through to "value N unit, limit M unit" unless figures() names it:
    a meter alarm paged its register (counts, before the multiplier) as "value 123456 gal,
    limit 50 gal" beside the volume the meter could pass in that time; a rule added later
    would page its numbers as a temperature. This fails for it until it gets its wording."""
    from monitor.alarms.figures import READING_RULES

    for rule in set(Rule) - READING_RULES - {Rule.METER}:  # a meter's limit is a volume: below
        shown = figures(alarm(rule, 5.0, 3.0, "some source"), "degF")
        assert "degF" not in shown, (rule, shown)


def test_a_meter_alarm_gives_its_register_reading_and_the_volume_it_could_pass() -> None:
    meter = alarm(Rule.METER, 123456.0, 50.0, "meter m: reading jumped from 123000 to 123456")
    assert figures(meter, "gal") == "register reading 123456, at most 50 gal could pass"
    assert figures(alarm(Rule.METER, 7.0, None), "gal") == "register reading 7"


def test_the_console_words_every_rule_or_names_it_a_reading() -> None:
    """app.js repeats figures(): every rule is either a `case` of figuresText or listed among
    the readings, as in figures.py, so a rule added to one is not missed in the other."""
    import re

    from monitor.alarms.figures import READING_RULES

    js = (Path(__file__).parent.parent / "monitor/web/static/app.js").read_text()
    cases = set(re.findall(r'case "([a-z_]+)"', js))
    [listed] = re.findall(r"const READING_RULES = new Set\(\[([^\]]*)\]\)", js)
    readings = set(re.findall(r'"([a-z_]+)"', listed))
    assert readings == {r.value for r in READING_RULES}
    assert {r.value for r in Rule} - readings <= cases, {r.value for r in Rule} - readings - cases


def test_the_console_card_words_a_meter_and_a_reading_not_read_as_the_page_does(
    browser: Browser, tmp_path: Path
) -> None:
    """The card read a meter's register as a reading ("123,456 gpm (limit 50)"), and gave
    nothing at all for a stale sensor that never read or an overflow with the level not read,
    where the page says "no reading for longer than 5 min" and "level not read, overflow at
    12 ft". Real Chromium."""
    view = TableView(tmp_path / "journal.sqlite", ManualClock(CONSOLE_T0))
    fill_day(view, CONSOLE_T0 - 86400)
    with LiveConsole(view, refresh=0.3) as console:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(console.url)
        expect(page.locator("#live")).to_have_text("live")
        t = CONSOLE_T0 + 60
        conditions = [
            Condition(t, "outfall.flow", Rule.METER, ConditionState.ACTIVE, 123456.0, 50.0, "", "meter"),
            Condition(t, "outfall.oil", Rule.STALE, ConditionState.ACTIVE, math.nan, 300.0, ""),
            Condition(t, "outfall.ph", Rule.OVERFLOW, ConditionState.ACTIVE, math.nan, 12.0, ""),
        ]
        console.call(lambda: [view.alarms.apply(c) for c in conditions])
        meter = page.locator('article.alarm[data-key="outfall.flow/meter"]')
        expect(meter).to_contain_text("register reading 123,456 (at most 50 gpm could pass)")
        oil = page.locator('article.alarm[data-key="outfall.oil/stale"]')
        expect(oil).to_contain_text("no reading for longer than 5 min")
        level = page.locator('article.alarm[data-key="outfall.ph/overflow"]')
        expect(level).to_contain_text("level not read (overflow at 12)")
        page.close()
