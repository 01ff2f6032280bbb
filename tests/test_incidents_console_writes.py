"""Notes, statements, notices and closing a case from the console's Incidents panel, in real
headless Chromium against the real console server and incident store (the golden case
`slug-and-oil` replayed), with the token as the alarm cards use it; and the API's refusals
the panel turns into plain words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from monitor.incidents.model import NoteKind
from tests.console import TOKEN, LiveConsole, operator_page
from tests.incident_helpers import StationWithIncidents, golden_station

# 2026-06-20T00:00Z (June 19, 20:00 EDT): the slug's §139-15 statement is overdue, the oil's not yet
NOW = 1781913600.0
HOSTILE = 'statement received <script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
DISABLED = "writes are disabled on this gateway (no console.token in the station config)"


@pytest.fixture
def case(tmp_path: Path) -> Iterator[tuple[StationWithIncidents, dict[str, Any], dict[str, Any]]]:
    """The station with the case's two incidents, both ended: (view, slug, oil)."""
    with golden_station(tmp_path, NOW) as found:
        yield found


def open_console(browser: Browser, live: LiveConsole, token: str | None = TOKEN) -> Page:
    """The console with the operator's name (and token) typed under Operator."""
    page = operator_page(browser, live, token=token)
    expect(page.locator("#incidents-open li")).to_have_count(2)
    return page


def test_operator_records_a_statement_a_notice_and_closes_the_case(
    browser: Browser, case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    """On the slug's line: "Add note", kind "written statement received", a text holding a
    `<script>` and an `<img onerror>`: the note is on the line as text (nothing runs), the
    overdue panel empties, nothing is owed. On the oil's: a §139-21 A notice whose time
    limit is a date (the end of that day on the station's clock, as `monitor incidents note
    --due DATE`). Then "Close" with its reason takes the slug's case off the panel. Before:
    the panel only read."""
    view, slug, oil = case
    store = view.incidents.store
    with LiveConsole(view, refresh=0.3) as live:
        page = open_console(browser, live)
        expect(page.locator("#incidents-section")).to_be_visible()  # the slug's statement overdue
        line = page.locator(f'#incidents-open li[data-incident="{slug["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        dialog = page.locator("#note-dialog")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("Outfall flow slug")
        expect(dialog).to_contain_text("R. Alvarez")  # who records it: the name under Operator
        expect(page.locator("#note-due")).to_be_hidden()  # a time limit goes with a notice only
        page.select_option("#note-kind", "statement")
        page.fill("#note-text", HOSTILE)
        page.click("#note-ok")
        expect(dialog).to_be_hidden()
        note = line.locator(".notes .note")
        expect(note).to_have_count(1)
        expect(note.locator(".note-text")).to_have_text(HOSTILE)
        expect(note.locator(".note-head")).to_have_text(
            "2026-06-19 20:00 EDT, R. Alvarez (written statement received): "
        )  # when on the station's clock, as the start beside it
        expect(note).to_contain_text("written statement received")
        assert line.locator("script, img").count() == 0
        assert page.evaluate("window.pwned") is None
        expect(page.locator("#incidents-section")).to_be_hidden()
        expect(line.locator(".owed")).to_have_text("Nothing owed: the case waits to be closed")
        recorded = live.call(lambda: store.get(slug["id"]))
        assert recorded is not None
        assert [(n.by, n.kind, n.text, n.time) for n in recorded.notes] == [
            ("R. Alvarez", NoteKind.STATEMENT, HOSTILE, NOW)
        ]

        other = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        other.get_by_role("button", name="Add note").click()
        expect(page.locator("#note-text")).to_have_value("")  # another incident: a fresh form
        page.select_option("#note-kind", "notice")
        expect(page.locator("#note-due-label")).to_contain_text("station time")
        page.fill("#note-due", "2026-06-19")
        page.fill("#note-text", "NOV 2026-17 served")
        page.click("#note-ok")
        expect(dialog).to_be_hidden()
        expect(other.locator(".notes .note")).to_contain_text("notice of violation served")
        noticed = live.call(lambda: store.get(oil["id"]))
        assert noticed is not None and len(noticed.notes) == 1
        assert (noticed.notes[0].kind, noticed.notes[0].due) == (NoteKind.NOTICE, NOW + 4 * 3600)
        page.screenshot(path=str(tmp_path / "console-incident-notes.png"), full_page=True)

        line.get_by_role("button", name="Close").click()
        closing = page.locator("#close-dialog")
        expect(closing).to_be_visible()
        expect(closing).to_contain_text("Outfall flow slug")
        page.fill("#close-reason", "statement received, penalty paid")
        page.click("#close-ok")
        expect(closing).to_be_hidden()
        expect(page.locator("#incidents-open li")).to_have_count(1)
        expect(page.locator("#incidents-open li").first).to_have_attribute("data-incident", oil["id"])
        closed = live.call(lambda: store.get(slug["id"]))
        assert closed is not None and closed.closed_at == NOW
        assert (closed.closed_by, closed.close_reason) == ("R. Alvarez", "statement received, penalty paid")
        page.close()


def test_refusals_are_shown_in_plain_words_and_the_draft_is_kept(
    browser: Browser, case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]]
) -> None:
    """A wrong token (401): the dialog stays open and says so and where to fix it; the note
    typed is still there after the token is corrected. A note over 4000 characters (422):
    "the note is too long", not the validator's JSON. A case someone closed meanwhile
    (409, here through the store, as `monitor incidents close` would): "closed already", and
    the panel drops it. Nothing refused is recorded."""
    view, slug, _ = case
    store = view.incidents.store
    with LiveConsole(view, refresh=0.3) as live:
        page = open_console(browser, live, token="not-the-token")
        line = page.locator(f'#incidents-open li[data-incident="{slug["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.fill("#note-text", "called the plant, no answer")
        page.click("#note-ok")
        error = page.locator("#note-error")
        expect(error).to_have_text(
            "Not done: a valid bearer token is required for this action."
            " Check the console token under Operator."
        )
        expect(page.locator("#note-dialog")).to_be_visible()
        page.click("#note-cancel")
        page.fill("#op-token", TOKEN)
        line.get_by_role("button", name="Add note").click()
        expect(page.locator("#note-text")).to_have_value("called the plant, no answer")
        expect(error).to_be_hidden()

        page.fill("#note-text", "x" * 4001)
        page.click("#note-ok")
        expect(error).to_have_text("Not done: the note is too long (at most 4000 characters).")
        recorded = live.call(lambda: store.get(slug["id"]))
        assert recorded is not None and recorded.notes == ()

        page.click("#note-cancel")
        live.call(lambda: store.close_case(slug["id"], NOW, "J. Ortiz", "closed from the CLI"))
        line.get_by_role("button", name="Close").click()
        page.fill("#close-reason", "penalty paid")
        page.click("#close-ok")
        expect(page.locator("#close-error")).to_have_text(
            f"Not done: incident {slug['id']} is closed already."
        )
        expect(line).to_have_count(0)  # the panel refreshed after the refusal
        closed = live.call(lambda: store.get(slug["id"]))
        assert closed is not None and (closed.closed_by, closed.close_reason) == (
            "J. Ortiz",
            "closed from the CLI",
        )
        page.close()


def test_without_a_token_the_buttons_say_writes_are_disabled(
    browser: Browser, case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]]
) -> None:
    """No console.token configured: "Add note" and "Close" are there, disabled, and say why,
    as the alarm cards' buttons do."""
    view, slug, _ = case
    with LiveConsole(view, token=None, refresh=0.3) as live:
        page = open_console(browser, live, token=None)
        line = page.locator(f'#incidents-open li[data-incident="{slug["id"]}"]')
        for name in ("Add note", "Close"):
            button = line.get_by_role("button", name=name)
            expect(button).to_be_disabled()
            expect(button).to_have_attribute("title", "writes disabled: no console token configured")
        expect(page.locator("#op-status")).to_contain_text("Writes are disabled")
        page.close()


def test_a_gateway_restarted_without_a_token_refuses_in_plain_words(
    browser: Browser, case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]]
) -> None:
    """The page was loaded while writes were enabled; the gateway restarts (same port) with
    no console.token. The note is refused with 403 and the dialog says writes are disabled."""
    view, slug, _ = case
    with LiveConsole(view, refresh=0.3) as before:
        page = open_console(browser, before)
        port = before.console.port
    with LiveConsole(view, token=None, refresh=0.3, port=port):
        line = page.locator(f'#incidents-open li[data-incident="{slug["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.fill("#note-text", "called the plant")
        page.click("#note-ok")
        expect(page.locator("#note-error")).to_have_text(f"Not done: {DISABLED}.")
        page.close()
    recorded = view.incidents.store.get(slug["id"])
    assert recorded is not None and recorded.notes == ()


# --- the API the panel writes through, on the real server ------------------------------------


def post(live: LiveConsole, url: str, body: dict[str, str], bearer: str | None = TOKEN) -> httpx.Response:
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    return httpx.post(f"{live.url}{url}", json=body, headers=headers)


def test_writes_without_a_configured_token_say_so_for_any_write(
    case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]],
) -> None:
    """403's words name no alarm action: they are shown for notes and closes too. Before:
    "... to acknowledge or shelve" on a note."""
    view, slug, _ = case
    with LiveConsole(view, token=None) as live:
        for url, body in (
            (f"/api/incidents/{slug['id']}/notes", {"by": "a", "text": "t"}),
            (f"/api/incidents/{slug['id']}/close", {"by": "a", "reason": "r"}),
            ("/api/alarms/outfall.ph/high/ack", {"by": "a"}),
        ):
            got = post(live, url, body)
            assert (got.status_code, got.json()) == (403, {"detail": DISABLED}), url


def test_refusals_carry_what_the_console_words_them_from(
    case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]],
) -> None:
    """The console turns a 422 into "the note is too long (at most 4000 characters)" from
    each item's `loc`, `type` and `ctx`; 401, 404 and 409 carry a sentence in `detail`."""
    view, slug, _ = case
    notes, close = f"/api/incidents/{slug['id']}/notes", f"/api/incidents/{slug['id']}/close"
    with LiveConsole(view) as live:
        got = post(live, notes, {"by": "a", "text": "x" * 4001})
        assert got.status_code == 422
        [item] = got.json()["detail"]
        assert (item["loc"], item["type"], item["ctx"]) == (
            ["body", "text"],
            "string_too_long",
            {"max_length": 4000},
        )
        got = post(live, notes, {"by": "", "text": "t"})
        assert [(i["loc"], i["type"]) for i in got.json()["detail"]] == [(["body", "by"], "string_too_short")]

        got = post(live, notes, {"by": "a", "text": "t"}, bearer="nope")
        assert (got.status_code, got.json()) == (
            401,
            {"detail": "a valid bearer token is required for this action"},
        )
        got = post(live, "/api/incidents/no-such/close", {"by": "a", "reason": "r"})
        assert (got.status_code, got.json()) == (404, {"detail": "no incident no-such on this station"})
        assert post(live, close, {"by": "a", "reason": "r"}).status_code == 200
        got = post(live, close, {"by": "b", "reason": "again"})
        assert (got.status_code, got.json()) == (409, {"detail": f"incident {slug['id']} is closed already"})


def test_a_notice_time_limit_may_be_a_date_on_the_station_clock(
    case: tuple[StationWithIncidents, dict[str, Any], dict[str, Any]],
) -> None:
    """`due: "2026-06-19"` is the end of that day in the station's zone (EDT here:
    2026-06-20T04:00Z), as `monitor incidents note --due 2026-06-19`; the console's date
    field sends that. A time still needs its zone, and a date past the calendar is a 422,
    not a 500. Before: a date alone was a 422."""
    view, _, oil = case
    notes = f"/api/incidents/{oil['id']}/notes"
    body = {"by": "a", "text": "NOV 17", "kind": "notice"}
    with LiveConsole(view) as live:
        got = post(live, notes, {**body, "due": "2026-06-19"})
        assert got.status_code == 200, got.text
        assert got.json()["notes"][-1]["due"] == "2026-06-20T04:00:00Z"
        for due in ("2026-06-19T12:00:00", "9999-12-31", "2026-02-30", "19 June"):
            got = post(live, notes, {**body, "due": due})
            assert got.status_code == 422, (due, got.text)
            assert "due" in got.text
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and len(stored.notes) == 1
