"""End to end in real headless Chromium (Debian's), driven by Playwright: an alarm appears
live, the operator acknowledges it with the token, the page shows the new state."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from playwright.sync_api import Browser, expect

from monitor.health import EngineHealth, Health, ModbusHealth, MqttHealth, OutboxHealth, PipelineHealth
from monitor.model import ManualClock, Quality, Sample, iso
from tests.console import T0, TOKEN, LiveConsole, TableView, fill_day


def test_alarm_appears_live_and_is_acknowledged(browser: Browser, tmp_path: Path) -> None:
    view = TableView(tmp_path / "journal.sqlite", ManualClock(T0))
    fill_day(view, T0 - 86400)
    with LiveConsole(view, refresh=0.3) as live:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(live.url)
        expect(page.locator("#summary")).to_have_text("NO ACTIVE ALARMS")
        expect(page.locator(".sensor")).to_have_count(3)
        expect(page.locator("#live")).to_have_text("live")
        expect(page.locator(".sensor svg polyline")).to_have_count(3)  # 24 h sparklines drawn

        # the engine's part: a pH sample above 9.0 raises the HIGH condition
        live.call(lambda: view.inject(Sample("outfall.ph", T0 + 60, 9.62), 9.0, "§139-15 C(3)"))
        card = page.locator('article.alarm[data-key="outfall.ph/high"]')
        expect(card).to_have_class("alarm active_unacknowledged")
        expect(card.locator(".citation")).to_have_text("§139-15 C(3)")
        expect(page.locator("#summary")).to_have_text("1 UNACKNOWLEDGED")

        # a wrong token is refused and says so; nothing changes
        page.fill("#op-name", "dana")
        page.fill("#op-token", "not-the-token")
        card.get_by_role("button", name="Acknowledge").click()
        expect(page.locator("#toast")).to_contain_text("valid bearer token")
        expect(card).to_have_class("alarm active_unacknowledged")

        page.fill("#op-token", TOKEN)
        card.get_by_role("button", name="Acknowledge").click()
        expect(card).to_have_class("alarm active_acknowledged")
        expect(card).to_contain_text("acknowledged by dana")
        expect(page.locator("#journal tbody tr").first).to_contain_text("acknowledged")
        alarm = live.call(lambda: view.alarms.get("outfall.ph", "high"))
        assert alarm is not None and alarm.acked_by == "dana"

        # more going on, for the screenshot an operator would see
        live.call(lambda: view.inject(Sample("outfall.oil", T0 + 90, 131.0), 100.0, "§139-15 D(2)"))
        live.call(lambda: view.inject(Sample("outfall.flow", T0 + 95, float("nan"), Quality.COMM_FAILURE)))
        expect(page.locator("article.alarm")).to_have_count(2)
        expect(page.locator('.sensor[data-sensor="outfall.flow"] .q')).to_have_text("comm failure")
        shot = tmp_path / "console.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000

        # shelve from the dialog: reason and duration, then the card shows who and until when
        oil = page.locator('article.alarm[data-key="outfall.oil/high"]')
        oil.get_by_role("button", name="Shelve").click()
        page.fill("#shelve-reason", "analyser calibration")
        page.select_option("#shelve-minutes", "60")
        page.click("#shelve-ok")
        expect(oil).to_have_class("alarm shelved")
        expect(oil).to_contain_text("shelved by dana")
        expect(oil.get_by_role("button", name="Unshelve")).to_be_visible()
        expect(page.locator("#summary")).to_have_text("1 ACTIVE, ACKNOWLEDGED · 1 SHELVED/OOS")
        shelved = live.call(lambda: view.alarms.get("outfall.oil", "high"))
        assert shelved is not None and shelved.shelve_reason == "analyser calibration"
        assert shelved.shelved_until == T0 + 95 + 3600

        phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        phone.goto(live.url)
        expect(phone.locator("article.alarm")).to_have_count(2)
        phone_shot = tmp_path / "console-phone.png"
        phone.screenshot(path=str(phone_shot))
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"page is {width}px wide on a 390px phone"
        page.close()
        phone.close()
    print(f"screenshots: {shot} {phone_shot}")


class FaultyGateway(TableView):
    """The real health snapshot (`Health.to_json()`, as the daemon serves it) of a gateway
    whose PLC does not answer and whose InfluxDB outbox dropped points at its cap; the
    device's configured name carries markup, which must show as text."""

    def health(self) -> Mapping[str, object]:
        plc = ModbusHealth("<b>outfall-plc</b>", "10.0.0.5:502", False, None, 12, 12, 12, 0, (), 12, None, 2)
        lift = ModbusHealth("lift", "10.0.0.6:502", True, iso(T0), 40, 3, 0, 0, (), 3, 5.0, 1)
        outbox = OutboxHealth(configured=True, pending=10, pending_bytes=900, max_bytes=1 << 20, dropped=250)
        engine = EngineHealth(0, 0, 0, 0, 0)
        pipeline = PipelineHealth(0, 0, None, 0, 0, 0, 0, 0)
        return Health((plc, lift), outbox, engine, pipeline).to_json()


class HealthyGateway(TableView):
    """The real snapshot of a gateway with its one PLC answering and no outbox."""

    def health(self) -> Mapping[str, object]:
        plc = ModbusHealth("outfall-plc", "10.0.0.5:502", True, iso(T0), 40, 0, 0, 0, (), 0, 4.0, 2)
        return Health(
            (plc,),
            OutboxHealth(False),
            EngineHealth(0, 0, 0, 0, 0),
            PipelineHealth(0, 0, None, 0, 0, 0, 0, 0),
        ).to_json()


def test_gateway_panel_puts_what_needs_attention_first(browser: Browser, tmp_path: Path) -> None:
    """An operator reads the gateway panel at 3 a.m.: the PLC not answering is a red line at
    the top (its name as text, not markup), the lift station failing its polls while still
    connected and the points the outbox dropped are amber lines under it, each source has
    one readable line, and the forty counters are folded under "All counters". Alarm cards
    name the sensor as the operator knows it, with its id beside it."""
    view = FaultyGateway(tmp_path / "journal.sqlite", ManualClock(T0))
    fill_day(view, T0 - 86400)
    with LiveConsole(view, refresh=0.3) as live:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(live.url)
        notes = page.locator("#health .attention li")
        expect(notes).to_have_count(3)
        expect(notes.nth(0)).to_have_class("att-fault")
        expect(notes.nth(0)).to_have_text("modbus <b>outfall-plc</b> not connected")
        expect(notes.nth(1)).to_have_text("modbus lift: 3 polls failed in a row")
        expect(notes.nth(2)).to_have_text("250 points dropped at the outbox's size cap (not in InfluxDB)")
        expect(page.locator("#health b")).to_have_count(0)
        expect(page.locator("#health dl.parts dd.bad")).to_have_text("NOT CONNECTED")
        expect(page.locator("#health details.counters")).not_to_have_attribute("open", "")
        expect(page.locator("#health details.counters dl")).to_be_hidden()

        live.call(lambda: view.inject(Sample("outfall.ph", T0 + 60, 9.62), 9.0, "§139-15 C(3)"))
        card = page.locator('article.alarm[data-key="outfall.ph/high"]')
        expect(card.locator(".what")).to_have_text("Outfall pH high")
        expect(card.locator(".sensor-id")).to_have_text("outfall.ph")
        page.close()


def test_gateway_panel_says_all_parts_work_when_nothing_needs_attention(
    browser: Browser, tmp_path: Path
) -> None:
    """Nothing to list: one green line, not an empty box an operator has to wonder about."""
    view = HealthyGateway(tmp_path / "journal.sqlite", ManualClock(T0))
    with LiveConsole(view, refresh=0.3) as live:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(live.url)
        expect(page.locator("#health .att-ok")).to_have_text("All parts working.")
        expect(page.locator("#station-link")).to_be_hidden()  # no wet well at this station
        expect(page.locator("#health .attention")).to_have_count(0)
        page.close()


class GatewayBehind(TableView):
    """The real snapshot of a gateway an hour behind its MQTT devices: seven sensors' readings
    refused as stamped ahead; the broker link's configured name carries markup."""

    def health(self) -> Mapping[str, object]:
        sensors = tuple(f"well{i}.level" for i in range(1, 8))
        mqtt = MqttHealth("<i>field</i>", True, None, 70, 0, 70, 0, 0, 70, 3600.0, sensors)
        engine = EngineHealth(0, 0, 0, 0, 0)
        pipeline = PipelineHealth(0, 0, None, 0, 0, 0, 0, 0)
        return Health((mqtt,), OutboxHealth(False), engine, pipeline).to_json()


def test_gateway_panel_says_readings_are_refused_as_stamped_ahead_of_its_clock(
    browser: Browser, tmp_path: Path
) -> None:
    """The amber line an operator reads when the gateway booted an hour behind: which clock to
    check, five sensors named and the rest counted, the link's name as text, not markup."""
    view = GatewayBehind(tmp_path / "journal.sqlite", ManualClock(T0))
    with LiveConsole(view, refresh=0.3) as live:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(live.url)
        notes = page.locator("#health .attention li")
        expect(notes).to_have_count(1)
        expect(notes.nth(0)).to_have_class("att-warning")
        expect(notes.nth(0)).to_have_text(
            "mqtt <i>field</i>: readings of well1.level, well2.level, well3.level, well4.level,"
            " well5.level and 2 more refused, stamped ahead of the gateway clock by ~1.0 h (over"
            " max_skew): the gateway clock is behind (check NTP/time sync), or the device's clock"
            " is ahead"
        )
        expect(page.locator("#health i")).to_have_count(0)
        page.close()
