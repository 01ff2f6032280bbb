"""End to end in real headless Chromium (Debian's), driven by Playwright: an alarm appears
live, the operator acknowledges it with the token, the page shows the new state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from monitor.model import ManualClock, Quality, Sample
from tests.console import T0, TOKEN, LiveConsole, TableView, fill_day

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


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
