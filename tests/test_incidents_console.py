"""The console's Incidents panel in real headless Chromium, over a real incident store and
tracker (the golden case `slug-and-oil` replayed): what is open or ended but not closed,
newest first, with what is owed next and the "evidence incomplete" mark as text."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
from playwright.sync_api import Browser, Page, expect

from monitor.incidents.due import statement_due
from monitor.incidents.model import incident_id
from monitor.model import ManualClock, Sample, iso
from tests.console import LiveConsole, TableView
from tests.incident_helpers import StationWithIncidents, incidents_json, replay_case

# 2026-06-20T00:00Z (June 19, 20:00 EDT): the slug's statement (due the end of June 18 EDT)
# is overdue, the oil's (the end of June 19) is not yet
NOW = 1781913600.0


def alarm_event(live: LiveConsole, view: StationWithIncidents, minute: int) -> None:
    """An alarm transition: the console refreshes its incident panels on it, as on a real one."""
    t = NOW + 60 * minute
    live.call(lambda: view.inject(Sample("outfall.ph", t, 9.6 if minute % 2 else 7.0), 9.0, "§139-15 C(3)"))


def open_console(browser: Browser, live: LiveConsole) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(live.url)
    return page


def test_incident_api_gives_start_and_end_in_station_local_time(tmp_path: Path) -> None:
    """`start_local` and `end_local` (null while open) beside the UTC times, as `due_local`
    is: the console shows the station's clock, not UTC. Before: only `start` in UTC."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    assert (slug["start_local"], slug["end_local"]) == ("2026-06-03 22:13 EDT", "2026-06-04 01:29 EDT")
    assert (oil["start_local"], oil["end_local"]) == ("2026-06-04 02:06 EDT", "2026-06-04 03:15 EDT")


def test_panel_lists_open_and_ended_incidents_newest_first_until_closed(
    browser: Browser, tmp_path: Path
) -> None:
    """The oil incident still going on (its end taken off, as the tracker leaves an open one)
    and the slug ended: both listed, the oil first, each with the sensor's configured name,
    rule, citation, local start, status, peak and multiple and what is owed next (the slug's
    statement OVERDUE). Closing the slug's case takes it off at the next alarm event; closing
    the oil's leaves "No open incidents." (the panel stays: the store is there)."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    view = StationWithIncidents(tmp_path, cfg, NOW)
    try:
        store = view.incidents.store
        inc = store.get(oil["id"])
        assert inc is not None
        with store.batch():
            store.save(inc.with_(end=None, clear_time=None, frozen=False))
        with LiveConsole(view, refresh=0.3) as live:
            got = httpx.get(f"{live.url}/api/incidents?status=open").json()
            assert [(i["id"], i["start_local"], i["end_local"]) for i in got] == [
                (oil["id"], "2026-06-04 02:06 EDT", None)
            ]
            page = open_console(browser, live)
            section = page.locator("#open-incidents-section")
            expect(section).to_be_visible()
            items = page.locator("#incidents-open li")
            expect(items).to_have_count(2)
            assert [items.nth(k).get_attribute("data-incident") for k in range(2)] == [oil["id"], slug["id"]]
            first, second = items.nth(0), items.nth(1)
            expect(first.locator(".what")).to_have_text("Outfall oil high")  # the configured name
            expect(first.locator(".status")).to_have_text("open")
            expect(first.locator(".citation")).to_have_text(oil["citation"])
            expect(first).to_contain_text("since 2026-06-04 02:06 EDT")
            # a limit's incident shows its limit; "x baseline" means something for a slug only
            expect(first).to_contain_text("peak 151 mg/L · limit 100 mg/L")
            expect(first).not_to_contain_text("baseline")
            expect(first.locator(".owed")).to_have_text(
                "Next: §139-15 written statement, due 2026-06-20 00:00 EDT"
            )
            expect(second.locator(".what")).to_have_text("Outfall flow slug")
            expect(second.locator(".status")).to_have_text("ended, not closed")
            expect(second).to_contain_text("2026-06-03 22:13 EDT to 2026-06-04 01:29 EDT")
            expect(second).to_contain_text(f"peak 703 gpm · {slug['peak_multiple']:.2f} × baseline")
            expect(second.locator(".owed.overdue")).to_have_text(
                "Next: §139-15 written statement, due 2026-06-19 00:00 EDT: OVERDUE"
            )
            assert first.locator(".evidence-incomplete").count() == 0
            expect(page.locator("#incidents-none")).to_be_hidden()
            expect(page.locator("#incidents-more")).to_be_hidden()
            page.screenshot(path=str(tmp_path / "console-incidents.png"), full_page=True)

            live.call(lambda: store.close_case(slug["id"], NOW, "R. Alvarez", "statement received"))
            alarm_event(live, view, 1)
            expect(items).to_have_count(1)
            expect(items.first).to_have_attribute("data-incident", oil["id"])

            live.call(lambda: store.close_case(oil["id"], NOW, "R. Alvarez", "corrected"))
            alarm_event(live, view, 2)
            expect(items).to_have_count(0)
            expect(page.locator("#incidents-none")).to_have_text("No open incidents.")
            expect(section).to_be_visible()
            page.close()
    finally:
        view.incidents.close()


def test_panel_refreshes_on_the_minute_timer(browser: Browser, tmp_path: Path) -> None:
    """No alarm event: the minute timer alone brings a closed case off the panel (the
    browser's clock is Playwright's, stepped a minute; nothing waits in wall-clock time)."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    view = StationWithIncidents(tmp_path, cfg, NOW)
    try:
        with LiveConsole(view, refresh=0.3) as live:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.clock.install()
            page.goto(live.url)
            items = page.locator("#incidents-open li")
            expect(items).to_have_count(2)
            live.call(lambda: view.incidents.store.close_case(slug["id"], NOW, "R. Alvarez", "settled"))
            page.clock.run_for(60_000)
            expect(items).to_have_count(1)
            expect(items.first).to_have_attribute("data-incident", oil["id"])
            page.close()
    finally:
        view.incidents.close()


def test_evidence_incomplete_mark_is_shown_as_text_in_the_panel(browser: Browser, tmp_path: Path) -> None:
    """The oil incident (nothing overdue, so not in the overdue panel) is marked "evidence
    incomplete from T: reason" through the store, as the tracker's `_mark` leaves it; the
    Incidents panel shows the mark on its line, the reason as text: a `<script>` and an
    `<img onerror>` in it are shown, never made HTML. The slug, not marked, has none."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    hostile = 'block 3 <script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    view = StationWithIncidents(tmp_path, cfg, NOW)
    try:
        store = view.incidents.store
        inc = store.get(oil["id"])
        assert inc is not None
        with store.batch():
            store.save(inc.with_(frozen=False, evidence_broken_at=inc.start + 600, evidence_broken=hostile))
        with LiveConsole(view, refresh=0.3) as live:
            page = open_console(browser, live)
            marked = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
            expect(marked.locator(".evidence-incomplete")).to_have_text(
                f"evidence incomplete from {iso(inc.start + 600)}: {hostile}"
            )
            assert marked.locator("script, img").count() == 0
            assert page.evaluate("window.pwned") is None
            unmarked = page.locator(f'#incidents-open li[data-incident="{slug["id"]}"]')
            expect(unmarked).to_have_count(1)
            assert unmarked.locator(".evidence-incomplete").count() == 0
            page.screenshot(path=str(tmp_path / "console-incidents-marked.png"), full_page=True)
            page.close()
    finally:
        view.incidents.close()


def test_panel_shows_the_newest_twenty_and_says_how_many_more(browser: Browser, tmp_path: Path) -> None:
    """25 incidents not closed (the two of the case and 23 more slugs on the flow, an hour
    apart, saved through the store): the 20 newest are listed, newest first, and the panel
    says "5 more: monitor incidents list"."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    view = StationWithIncidents(tmp_path, cfg, NOW)
    try:
        store = view.incidents.store
        inc, last = store.get(slug["id"]), store.get(oil["id"])
        assert inc is not None and inc.end is not None and last is not None and last.end is not None
        length, zone = inc.end - inc.start, view.incidents.zone
        ids = []
        with store.batch():
            for k in range(23):
                start = last.end + 3600 * (k + 1)
                more = inc.with_(
                    id=incident_id(start, inc.sensor, inc.rule),
                    figures=dataclasses.replace(inc.figures, start=start),
                    alarm_time=start,
                    end=start + length,
                    clear_time=start + length,
                    statement_due=statement_due(start, zone),
                )
                store.save(more)
                ids.append(more.id)
        with LiveConsole(view, refresh=0.3) as live:
            page = open_console(browser, live)
            items = page.locator("#incidents-open li")
            expect(items).to_have_count(20)
            shown = [items.nth(k).get_attribute("data-incident") for k in range(20)]
            assert shown == ids[::-1][:20]
            expect(page.locator("#incidents-more")).to_have_text("5 more: monitor incidents list")
            page.close()
    finally:
        view.incidents.close()


def test_panel_is_hidden_where_no_incidents_are_recorded(browser: Browser, tmp_path: Path) -> None:
    """A console without an incident tracker (no /api/incidents): no Incidents panel at all,
    rather than a "No open incidents." that nobody checked."""
    view = TableView(tmp_path / "journal.sqlite", ManualClock(NOW))
    with LiveConsole(view, refresh=0.3) as live:
        page = open_console(browser, live)
        expect(page.locator("#live")).to_have_text("live")  # the first refresh ran
        alarm_event_plain(live, view)
        expect(page.locator("#journal tbody tr")).to_have_count(1)  # and one after an alarm event
        assert page.locator("#open-incidents-section").count() == 1  # there, and hidden
        assert page.locator("#open-incidents-section").is_hidden()
        assert page.locator("#incidents-section").is_hidden()
        page.close()


def alarm_event_plain(live: LiveConsole, view: TableView) -> None:
    live.call(lambda: view.inject(Sample("outfall.ph", NOW + 60, 9.6), 9.0, "§139-15 C(3)"))
