"""The operator's page when Wi-Fi drops the answer after the gateway committed: real headless
Chromium, the real console server and stores, and between them `DroppingProxy`, which
passes the first write to the server and closes the browser's connection without its
answer (the one fault a browser cannot be made to suffer on cue; see tests/dropping_proxy.py).
The page retries once with the same request id, the gateway answers with its first answer
and records nothing twice, and the page says the write is confirmed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from monitor.model import ManualClock, Sample
from tests.console import T0, LiveConsole, TableView, operator_page
from tests.dropping_proxy import DroppingProxy
from tests.incident_helpers import StationWithIncidents, golden_station

NOW = 1781913600.0  # 2026-06-20T00:00Z, after the case's incidents
CONFIRMED = "confirmed by the gateway after its first answer was lost (recorded once)."


@pytest.fixture
def station(tmp_path: Path) -> Iterator[tuple[StationWithIncidents, dict[str, Any]]]:
    """The station with the golden case's incidents: (view, the oil incident)."""
    with golden_station(tmp_path, NOW) as (view, _, oil):
        yield view, oil


class ProxiedLive:
    """`operator_page` wants something with a `url`: the proxy's, not the server's."""

    def __init__(self, url: str) -> None:
        self.url = url


def test_a_notice_whose_answer_is_lost_is_retried_once_recorded_once_and_confirmed(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """Before: the page said "No answer ... may or may not be recorded" and an operator who
    saved again put a second notice of violation on the record. Now the second POST (the
    page's own, with the first's id) is answered from the first, the dialog closes, and the
    toast says the notice is confirmed and recorded once."""
    view, oil = station
    with (
        LiveConsole(view, refresh=0.3) as live,
        DroppingProxy(
            live.console.port, lambda method, path: method == "POST" and path.endswith("/notes")
        ) as proxy,
    ):
        page = operator_page(browser, ProxiedLive(proxy.url))  # type: ignore[arg-type]
        line = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.select_option("#note-kind", "notice")
        page.fill("#note-due", "2026-07-01")
        page.fill("#note-text", "§139-21 A notice of violation served on Barton Plating Co.")
        page.click("#note-ok")
        expect(page.locator("#note-dialog")).to_be_hidden()
        expect(page.locator("#toast")).to_have_text(f"Note recorded on Outfall oil high: {CONFIRMED}")
        expect(line.locator(".notes .note")).to_have_count(1)
        posts = [s for s in proxy.seen if s.method == "POST"]
        assert [s.dropped for s in posts] == [True, False]
        assert posts[0].key is not None and posts[0].key == posts[1].key
        page.close()
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and [n.kind.value for n in stored.notes] == ["notice"]


def test_an_acknowledgement_whose_answer_is_lost_is_confirmed_not_refused(
    browser: Browser, tmp_path: Path
) -> None:
    """Without the id the retry of an acknowledgement would be refused ("already
    acknowledged"), telling the operator "Not done" for an alarm they had acknowledged.
    Now: one `acknowledged` row and the page says it is confirmed."""
    view = TableView(tmp_path / "journal.sqlite", ManualClock(T0))
    view.inject(Sample("outfall.ph", T0, 9.6), limit=9.0, citation="§139-15 C(3)")
    with (
        LiveConsole(view, refresh=0.3) as live,
        DroppingProxy(
            live.console.port, lambda method, path: method == "POST" and path.endswith("/ack")
        ) as proxy,
    ):
        page = operator_page(browser, ProxiedLive(proxy.url))  # type: ignore[arg-type]
        card = page.locator('article[data-key="outfall.ph/high"]')
        card.get_by_role("button", name="Acknowledge").click()
        expect(page.locator("#toast")).to_have_text(f"Acknowledged outfall.ph high: {CONFIRMED}")
        expect(card.locator(".state")).to_have_text("Acknowledged")
        posts = [s for s in proxy.seen if s.method == "POST"]
        assert [s.dropped for s in posts] == [True, False] and posts[0].key == posts[1].key
        page.close()
        events = [e.event for e in live.call(lambda: list(view.alarms.journal.entries(sensor="outfall.ph")))]
    assert events.count("acknowledged") == 1
