"""What the console's incident writes do with input meant to hurt, or typed at 3 a.m.: the
real console server and incident store (the golden case `slug-and-oil` replayed), the CLI
beside it, and real headless Chromium where it is what the operator sees."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Route, expect

from monitor.model import Rule, Sample
from tests.console import TOKEN, LiveConsole, operator_page
from tests.incident_helpers import StationWithIncidents, golden_station, incidents_json, monitor, replay_case

# 2026-06-20T00:00Z (June 19, 20:00 EDT), as in test_incidents_console_writes.py
NOW = 1781913600.0
NOTICE = {"by": "R. Alvarez", "text": "NOV 2026-17 served", "kind": "notice"}


@pytest.fixture
def station(tmp_path: Path) -> Iterator[tuple[StationWithIncidents, dict[str, Any]]]:
    """The station with the case's incidents: (view, the oil incident)."""
    with golden_station(tmp_path, NOW) as (view, _, oil):
        yield view, oil


def post(live: LiveConsole, url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{live.url}{url}", json=body, headers={"Authorization": f"Bearer {TOKEN}"})


def test_a_time_limit_the_record_cannot_show_is_refused_not_stored(
    station: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """A notice whose time limit is year 1 at +14:00 (year 0 in UTC) or 9999-12-31 at -14:00
    (year 10000) was stored; then every read of the incident failed on rendering it: the
    POST's own answer (500, after storing it), GET /api/incidents (the console's panel
    froze), `monitor incidents show`, `list --format json` and `export` (the
    Superintendent's report): a traceback, until someone edited the SQLite file. A time
    limit before the incident began is refused too: `0026-06-19` is what a date field makes
    of a two-digit year typed at 3 a.m., and it stood OVERDUE on the panel for good (a note
    cannot be taken back)."""
    view, oil = station
    notes = f"/api/incidents/{oil['id']}/notes"
    with LiveConsole(view) as live:
        for due in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-14:00", "0026-06-19", "1970-01-01"):
            got = post(live, notes, {**NOTICE, "due": due})
            assert got.status_code == 422, (due, got.text)
            assert isinstance(got.json()["detail"], str), got.text  # a sentence the console shows as is
        got = post(live, notes, {**NOTICE, "due": "0026-06-19"})
        assert got.json()["detail"] == (
            "the time limit 0026-06-20 00:00 LMT is before the incident began (2026-06-04 02:06 EDT)"
        )
        assert httpx.get(f"{live.url}/api/incidents").status_code == 200
        assert httpx.get(f"{live.url}/api/incidents/overdue").status_code == 200
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and stored.notes == ()


def test_the_cli_refuses_the_same_time_limits(tmp_path: Path) -> None:
    """`monitor incidents note --due` takes the same dates and times as the API: the same
    refusals (exit 2), and the record stays readable."""
    cfg = replay_case("slug-and-oil", tmp_path)
    _, oil = incidents_json(cfg)
    for due in ("0001-01-01T00:00:00+14:00", "1e300", "0026-06-19"):
        bad = monitor(
            "incidents", "note", "--config", str(cfg), "--id", oil["id"], "--by", "R. Alvarez",
            "--text", "NOV 2026-17 served", "--kind", "notice", "--due", due,
        )  # fmt: skip
        assert bad.returncode == 2, (due, bad.stdout, bad.stderr)
        assert "--due: " in bad.stderr
    for args in (("list", "--format", "json"), ("show", "--id", oil["id"])):
        shown = monitor("incidents", *args, "--config", str(cfg))
        assert shown.returncode == 0, shown.stderr


# where the first character of each of `words` in `node`'s text is, as Chromium lays them
# out: [line's top, x], rounded (a long line wraps)
WHERE = """(node, words) => {
  const walk = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  const found = {};
  for (let t = walk.nextNode(); t; t = walk.nextNode()) {
    for (const w of words) {
      const i = t.data.indexOf(w);
      if (i < 0 || w in found) continue;
      const r = document.createRange();
      r.setStart(t, i);
      r.setEnd(t, i + 1);
      const box = r.getBoundingClientRect();
      found[w] = [Math.round(box.top), Math.round(box.left)];
    }
  }
  return words.map((w) => found[w] || null);
}"""


def test_a_name_with_a_bidi_override_does_not_reorder_the_note_line(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """A name ending in U+202E (RIGHT-TO-LEFT OVERRIDE), typed under Operator or sent to the
    API: the note line ran `2026-06-19 20:00 EDT, Mallory` and then the kind and the text
    mirrored (`:)deviecer tnemetats nettirw(`), so whoever records a note can make its line
    read as something else. The name is isolated: what follows it reads left to right."""
    view, oil = station
    with LiveConsole(view, refresh=0.3) as live:
        page = operator_page(browser, live, "Mallory\u202e")
        line = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.select_option("#note-kind", "statement")
        page.fill("#note-text", "plant called back")
        page.click("#note-ok")
        note = line.locator(".notes .note")
        expect(note).to_have_count(1)
        words = ["2026-06-19", "Mallory", "written", "received", "plant", "back"]
        xs = note.evaluate(WHERE, words)
        assert None not in xs, xs
        assert xs == sorted(xs), dict(zip(words, xs, strict=True))  # left to right, as recorded
        page.close()


def test_a_broken_character_is_a_422_naming_the_field_not_a_500(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """JSON may carry an unpaired UTF-16 surrogate (`"\\ud800"`; the console's
    JSON.stringify writes one for a textarea holding one, e.g. half of an emoji pasted). It
    was refused (422, `string_unicode`), but the 422 echoes the input and could not be
    encoded: a 500, which the dialog showed as "the gateway answered HTTP 500", on notes,
    closes and the alarm actions alike. Now a 422 naming the field, and the dialog says the
    note holds a broken character; nothing is recorded."""
    view, oil = station
    view.inject(Sample("outfall.ph", NOW, 12.0), limit=9.0, citation="§139-15 D(1)")
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    with LiveConsole(view, refresh=0.3) as live:
        for url, body, field in (
            (f"/api/incidents/{oil['id']}/notes", b'{"by": "a", "text": "x\\ud800"}', "text"),
            (f"/api/incidents/{oil['id']}/notes", b'{"by": "a\\udfff", "text": "x"}', "by"),
            (f"/api/incidents/{oil['id']}/close", b'{"by": "a", "reason": "\\ud83d paid"}', "reason"),
            ("/api/alarms/outfall.ph/high/ack", b'{"by": "a", "note": "x\\ud800"}', "note"),
        ):
            got = httpx.post(f"{live.url}{url}", content=body, headers=headers)
            assert got.status_code == 422, (url, got.text)
            [item] = got.json()["detail"]
            assert (item["loc"], item["type"]) == (["body", field], "string_unicode"), got.text

        page = operator_page(browser, live)
        line = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.evaluate("document.querySelector('#note-text').value = 'called \\uD83D back'")
        page.click("#note-ok")
        expect(page.locator("#note-error")).to_have_text("Not done: the note holds a broken character.")
        expect(page.locator("#note-dialog")).to_be_visible()
        page.close()
        alarm = live.call(lambda: view.alarms.get("outfall.ph", Rule.HIGH))
        assert alarm is not None and alarm.acked_by is None
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and stored.notes == () and stored.closed_at is None


def test_a_blank_name_or_text_is_refused_as_the_cli_refuses_it(
    station: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """`monitor incidents note` refuses a name or a text of spaces (exit 2) and records
    them stripped; the API took `by: "   "` (a note by nobody on the Superintendent's
    record) and kept the spaces. Now the same: stripped, and empty after it is a 422
    the console words ("your name (under Operator) is empty")."""
    view, oil = station
    notes, close = f"/api/incidents/{oil['id']}/notes", f"/api/incidents/{oil['id']}/close"
    with LiveConsole(view) as live:
        for url, body, field in (
            (notes, {"by": "   ", "text": "called the plant"}, "by"),
            (notes, {"by": "R. Alvarez", "text": " \n\t "}, "text"),
            (close, {"by": "\u3000", "reason": "penalty paid"}, "by"),
            (close, {"by": "R. Alvarez", "reason": "  "}, "reason"),
        ):
            got = post(live, url, body)
            assert got.status_code == 422, (body, got.text)
            assert [(i["loc"], i["type"]) for i in got.json()["detail"]] == [
                (["body", field], "string_too_short")
            ], got.text
        got = post(live, notes, {"by": "  R. Alvarez ", "text": " called the plant\n"})
        assert got.status_code == 200, got.text
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and stored.closed_at is None
    assert [(n.by, n.text) for n in stored.notes] == [("R. Alvarez", "called the plant")]


def test_the_cli_refuses_a_blank_name_or_reason_on_close(tmp_path: Path) -> None:
    """`monitor incidents close --by " "` closed the case by nobody (`note` refused it)."""
    cfg = replay_case("slug-and-oil", tmp_path)
    _, oil = incidents_json(cfg)
    for by, reason in ((" ", "penalty paid"), ("R. Alvarez", "\t")):
        bad = monitor(
            "incidents", "close", "--config", str(cfg), "--id", oil["id"], "--by", by, "--reason", reason
        )
        assert bad.returncode == 2, (by, reason, bad.stdout, bad.stderr)
    ok = monitor(
        "incidents", "close", "--config", str(cfg), "--id", oil["id"], "--by", " R. Alvarez ",
        "--reason", "penalty paid ",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    _, closed = incidents_json(cfg)
    assert (closed["closed_by"], closed["close_reason"]) == ("R. Alvarez", "penalty paid")


def test_a_notice_shows_the_time_limit_it_was_recorded_with(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """A §139-21 A notice entered with its time limit as a date: the line showed who served
    it and the text, but the limit only while it was the next thing owed -- never here (the
    oil's violation ended on June 4, before the limit: nothing owed). The operator could not
    see what was recorded from the date typed. Now the note says it, on the station's
    clock, as the owed line does (`due_local` in the JSON)."""
    view, oil = station
    with LiveConsole(view, refresh=0.3) as live:
        page = operator_page(browser, live)
        line = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.select_option("#note-kind", "notice")
        page.fill("#note-due", "2026-06-25")
        page.fill("#note-text", "NOV 2026-17 served")
        page.click("#note-ok")
        expect(line.locator(".notes .note")).to_have_text(
            "2026-06-19 20:00 EDT, R. Alvarez (notice of violation served, time limit"
            " 2026-06-26 00:00 EDT): NOV 2026-17 served"
        )
        [note] = httpx.get(f"{live.url}/api/incidents/{oil['id']}").json()["notes"]
        assert (note["due"], note["due_local"]) == ("2026-06-26T04:00:00Z", "2026-06-26 00:00 EDT")
        page.close()


def test_show_says_a_notice_time_limit(tmp_path: Path) -> None:
    """`monitor incidents show` (and the export's report, which prints it) listed a notice
    without its time limit once nothing was owed on it."""
    cfg = replay_case("slug-and-oil", tmp_path)
    _, oil = incidents_json(cfg)
    noted = monitor(
        "incidents", "note", "--config", str(cfg), "--id", oil["id"], "--by", "R. Alvarez",
        "--text", "NOV 2026-17 served", "--kind", "notice", "--due", "2026-06-25",
    )  # fmt: skip
    assert noted.returncode == 0, noted.stderr
    shown = monitor("incidents", "show", "--config", str(cfg), "--id", oil["id"])
    assert shown.returncode == 0, shown.stderr
    [line] = [x for x in shown.stdout.splitlines() if "NOV 2026-17" in x]
    assert "by R. Alvarez (time limit 2026-06-26 00:00 EDT): NOV 2026-17 served" in line, line


def test_a_slow_answer_goes_to_its_own_dialog_not_the_one_open_now(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """A slow gateway: "Close" on one case, Esc while it answers, "Close" on another. The
    first answer closed the second case's dialog and said "Case closed." over it (the
    operator reads: that case is closed; it is not), or put the first case's refusal in the
    second's dialog. Now the answer goes to its own dialog, or to the toast naming its case
    (here: a success), and the second dialog stays as it is. The request is held in the browser (page.route):
    a gateway that answers late on cue is what a real one cannot be made to do."""
    view, oil = station
    slug = next(i for i in view.incidents.store.incidents() if i.id != oil["id"])
    held: list[Route] = []

    def hold(route: Route) -> None:  # Playwright wants a function, not a builtin method
        held.append(route)

    with LiveConsole(view, refresh=0.3) as live:
        page = operator_page(browser, live)
        page.route("**/api/incidents/*/close", hold)
        first = page.locator(f'#incidents-open li[data-incident="{slug.id}"]')
        second = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        first.get_by_role("button", name="Close").click()
        page.fill("#close-reason", "statement received, penalty paid")
        with page.expect_request("**/close"):
            page.click("#close-ok")
        page.keyboard.press("Escape")
        expect(page.locator("#close-dialog")).to_be_hidden()
        second.get_by_role("button", name="Close").click()
        page.fill("#close-reason", "still thinking")
        page.evaluate("1")  # let the route handler run
        [route] = held
        route.continue_()
        expect(first).to_have_count(0)  # answered and refreshed
        expect(page.locator("#close-dialog")).to_be_visible()
        expect(page.locator("#close-title")).to_contain_text("Outfall oil")
        expect(page.locator("#close-reason")).to_have_value("still thinking")
        expect(page.locator("#close-error")).to_be_hidden()
        expect(page.locator("#toast")).to_have_text("Case closed: Outfall flow slug.")
        expect(second).to_have_count(1)
        page.close()
    closed = view.incidents.store.get(oil["id"])
    assert closed is not None and closed.closed_at is None


def test_an_answer_lost_after_the_gateway_recorded_does_not_say_not_done(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """The gateway records the note and the connection drops before its answer arrives (a
    phone on a VPN at 3 a.m.), for the page's automatic retry too. The dialog said "Not
    done: ... Try again" with the draft still in it, and saving again recorded the notice
    twice on the Superintendent's record. Now it says the gateway did not answer, that the
    note may be recorded, and that saving again is safe: it is, the draft's request id
    goes with it and the gateway answers without a second note. The requests go to the
    real server and their answers are dropped in the browser (route.fetch, then abort): a
    real connection cannot be cut on cue between the two."""
    view, oil = station
    lost: list[str | None] = []

    def lose_answer(route: Route) -> None:
        lost.append(route.request.headers.get("idempotency-key"))
        route.fetch()  # the real gateway records it
        route.abort("connectionreset")

    with LiveConsole(view, refresh=0.3) as live:
        page = operator_page(browser, live)
        page.route("**/api/incidents/*/notes", lose_answer)
        line = page.locator(f'#incidents-open li[data-incident="{oil["id"]}"]')
        line.get_by_role("button", name="Add note").click()
        page.fill("#note-text", "called the plant")
        page.click("#note-ok")
        error = page.locator("#note-error")
        expect(error).to_have_text(
            "No answer from the gateway, twice: it may or may not be recorded."
            " Saving again is safe: the gateway records this write once."
        )
        expect(line.locator(".notes .note")).to_have_count(1)  # the panel refreshed: it is
        assert len(lost) == 2 and lost[0] == lost[1] and lost[0] is not None  # one id, sent twice
        page.unroute("**/api/incidents/*/notes")
        page.click("#note-ok")  # the Wi-Fi is back: the operator saves again
        expect(page.locator("#note-dialog")).to_be_hidden()
        expect(line.locator(".notes .note")).to_have_count(1)
        page.close()
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and [n.text for n in stored.notes] == ["called the plant"]


def test_a_refused_nan_is_answered_in_strict_json(
    station: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """Python's JSON reader takes `NaN` and `Infinity`; the 422 echoes the input, and
    Starlette's strict writer refused to write it: a 500 for `"due": NaN`. The answer is a
    422 in strict JSON (what a browser's `r.json()` reads), naming the field."""
    view, oil = station
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def strict(text: str) -> Any:
        def refuse(word: str) -> None:
            raise ValueError(f"{word} is not JSON")

        return json.loads(text, parse_constant=refuse)

    with LiveConsole(view) as live:
        for body in (
            b'{"by": "a", "text": "t", "kind": "notice", "due": NaN}',
            b'{"by": "a", "text": "t", "kind": "notice", "due": -Infinity}',
        ):
            got = httpx.post(f"{live.url}/api/incidents/{oil['id']}/notes", content=body, headers=headers)
            assert got.status_code == 422, (body, got.text)
            assert {tuple(i["loc"][:2]) for i in strict(got.text)["detail"]} == {("body", "due")}
    stored = view.incidents.store.get(oil["id"])
    assert stored is not None and stored.notes == ()


def test_an_alarm_card_isolates_who_acknowledged_and_shelved_it(
    browser: Browser, station: tuple[StationWithIncidents, dict[str, Any]]
) -> None:
    """The alarm card's meta line (`acknowledged by NAME: “note”`, `shelved by NAME until T:
    reason`) printed the operator's name and words inline: a name ending in U+202E mirrored
    the rest of the line, as it did on incident notes. Each typed part is isolated (<bdi>)."""
    view, _ = station
    view.inject(Sample("outfall.ph", NOW, 12.0), limit=9.0, citation="§139-15 D(1)")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with LiveConsole(view, refresh=0.3) as live:
        got = httpx.post(
            f"{live.url}/api/alarms/outfall.ph/high/ack",
            json={"by": "Mallory\u202e", "note": "called plant back"},
            headers=headers,
        )
        assert got.status_code == 200, got.text
        got = httpx.post(
            f"{live.url}/api/alarms/outfall.ph/high/shelve",
            json={"by": "Eve\u202e", "reason": "probe swap", "minutes": 30},
            headers=headers,
        )
        assert got.status_code == 200, got.text
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(live.url)
        card = page.locator('article.alarm[data-key="outfall.ph/high"] .meta').last
        expect(card).to_contain_text("shelved by")
        words = ["acknowledged", "Mallory", "called", "plant", "back"]
        words += ["shelved", "Eve", "until", "probe", "swap"]
        xs = card.evaluate(WHERE, words)
        assert None not in xs, xs
        assert xs == sorted(xs), dict(zip(words, xs, strict=True))
        page.close()
