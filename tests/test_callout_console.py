"""The console's Callout panel in real headless Chromium: who is on call now, and an alarm's
escalation (who was told, who is next) after a real SMTP delivery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from monitor.callout import Callout
from monitor.config import build_config
from monitor.model import ManualClock, Sample
from monitor.web.callout import add_callout_routes
from tests.console import T0, LiveConsole, TableView
from tests.mqtt_tools import make_ca
from tests.smtp import MailServer
from tests.test_callout import raw_config


def test_callout_panel_shows_who_is_on_call_who_was_told_and_who_is_next(
    browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = make_ca(tmp_path / "ca")
    monkeypatch.setenv("CALLOUT_SMTP_PASSWORD", "mail-pw")
    monkeypatch.setenv("CALLOUT_LINK_SECRET", "secret")
    monkeypatch.setenv("CALLOUT_CA", str(certs["ca"]))
    with MailServer(users={"monitor": "mail-pw"}, certs=certs) as smtp:
        config = build_config(raw_config(tmp_path, smtp.port))
        clock = ManualClock(T0)
        view = TableView(tmp_path / "journal.sqlite", clock)
        callout = Callout(config, view.alarms, clock)
        live = LiveConsole(view, refresh=0.3)
        add_callout_routes(live.app, callout, None)
        with live:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(live.url)
            panel = page.locator("#callout-section")
            expect(panel).to_be_visible()
            expect(panel).to_contain_text("On call now: Alice Smith (operators)")
            expect(panel).to_contain_text("No callouts yet.")

            live.call(lambda: view.inject(Sample("outfall.ph", T0 + 60, 9.62), 9.0, "§139-15 C(3)"))
            sent = asyncio.run_coroutine_threadsafe(callout.deliver_due(), live.loop).result(timeout=20)
            assert sent == 1 and len(smtp.to("alice@example.org")) == 1
            page.reload()
            row = panel.locator("tbody tr")
            expect(row).to_have_count(1)
            expect(row).to_contain_text("outfall.ph high")
            expect(row).to_contain_text("escalating")
            expect(row).to_contain_text("alice by mail: sent")
            expect(row).to_contain_text("bob at ")
            expect(row).to_contain_text(" EDT")  # station local time (America/New_York, T0 is in May)
            asyncio.run_coroutine_threadsafe(callout.aclose(), live.loop).result(timeout=10)
