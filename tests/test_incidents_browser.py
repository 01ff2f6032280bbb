"""The exported incident report in real headless Chromium, offline: it renders from the
one HTML file (no request leaves the page), the plot shows the threshold and the shaded
incident, and it prints. The screenshot is kept in build/test-artifacts/ (and tmp)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from playwright.sync_api import Browser, Request

from monitor.model import iso
from tests.incident_helpers import ROOT, incidents_json, monitor, replay_case

ARTIFACTS = ROOT / "build" / "test-artifacts"


def test_export_opens_offline_and_shows_threshold_and_shaded_incident(
    browser: Browser, tmp_path: Path
) -> None:
    cfg = replay_case("slug-and-oil", tmp_path)
    inc = next(i for i in incidents_json(cfg) if i["rule"] == "slug")
    out = tmp_path / "export"
    assert (
        monitor("incidents", "export", "--config", str(cfg), "--id", inc["id"], "--out", str(out)).returncode
        == 0
    )
    report = out / f"{inc['id']}.html"

    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 1400})
    requests: list[str] = []

    def record(request: Request) -> None:
        requests.append(request.url)

    context.on("request", record)
    page = context.new_page()
    page.goto(report.as_uri())
    assert requests == [report.as_uri()]  # nothing but the file itself: no script, font or CDN
    assert page.title() == f"Incident {inc['id']}"
    svg = page.locator("svg")
    assert svg.count() == 1
    threshold = page.locator("#threshold")
    shaded = page.locator("#incident-period")
    readings = page.locator("#readings")
    assert shaded.is_visible() and readings.is_visible()
    assert threshold.get_attribute("stroke") == "#c00"  # a horizontal line has no height to be "visible"
    box_t, box_s, box_r = threshold.bounding_box(), shaded.bounding_box(), readings.bounding_box()
    assert box_t is not None and box_s is not None and box_r is not None
    # the shaded period is a real width (about 3 h 16 min of a 29 h plot) and the readings rise above the
    # threshold line inside it
    assert box_t["width"] > 800
    assert 0.05 < box_s["width"] / box_t["width"] < 0.2
    assert box_r["y"] < box_t["y"] < box_r["y"] + box_r["height"]
    text = page.locator("body").inner_text()
    assert "§139-11" in text and "excess vol." in text and "Barton Plating Co." in text

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = tmp_path / "incident-report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    shutil.copy(shot, ARTIFACTS / "incident-report.png")
    pdf = tmp_path / "incident-report.pdf"
    page.pdf(path=str(pdf), format="Letter")  # it prints
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 10_000
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["files"]) == 3
    context.close()


def test_console_shows_what_is_overdue(browser: Browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from monitor.incidents import IncidentTracker
    from monitor.incidents.model import Note, NoteKind
    from monitor.model import ManualClock, Sample
    from tests.console import LiveConsole, TableView
    from tests.incident_helpers import load

    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)

    class StationWithIncidents(TableView):
        """The console's test station, with the incident tracker the daemon offers."""

        def __init__(self) -> None:
            # 2026-06-20T00:00Z: the slug's statement (due the end of 2026-06-18 EDT) is overdue
            super().__init__(tmp_path / "journal.sqlite", ManualClock(1781913600.0))
            self.incidents = IncidentTracker(load(cfg))

    view = StationWithIncidents()
    try:
        with LiveConsole(view, refresh=0.3) as live:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(live.url)
            section = page.locator("#incidents-section")
            expect(section).to_be_visible()
            items = page.locator("#incidents-overdue li")
            expect(items).to_have_count(1)
            expect(items.first).to_have_attribute("data-incident", slug["id"])
            expect(items.first).to_contain_text("§139-15 written statement")
            expect(items.first).to_contain_text("2026-06-19 00:00 EDT")
            page.screenshot(path=str(tmp_path / "console-overdue.png"), full_page=True)

            # the statement arrives; the next refresh (an alarm transition here) clears the panel
            live.call(
                lambda: view.incidents.store.add_note(
                    slug["id"], Note(1781913600.0, "R. Alvarez", "received", NoteKind.STATEMENT)
                )
            )
            live.call(lambda: view.inject(Sample("outfall.ph", 1781913660.0, 9.6), 9.0, "§139-15 C(3)"))
            expect(section).to_be_hidden()
            # the oil's statement is not overdue: not in this panel (the Incidents panel lists it)
            assert page.locator(f'#incidents-overdue [data-incident="{oil["id"]}"]').count() == 0
            page.close()
    finally:
        view.incidents.close()


def test_console_marks_an_overdue_incident_whose_evidence_is_incomplete_as_text(
    browser: Browser, tmp_path: Path
) -> None:
    """The slug's statement is overdue and its evidence was marked incomplete (a damaged
    block: the mark is put on its record through the store, as the tracker's `_mark` leaves
    it; tests/test_incidents_failing.py damages a real block). The console's overdue list
    says "evidence incomplete from T: reason" beside it, the reason as text: a `<script>` and
    an `<img onerror>` in it are shown, never made HTML (nothing runs). The oil incident, not
    marked, says nothing of it. Before: the console did not show the mark at all."""
    from playwright.sync_api import expect

    from monitor.incidents import IncidentTracker
    from monitor.model import ManualClock
    from tests.console import LiveConsole, TableView
    from tests.incident_helpers import load

    cfg = replay_case("slug-and-oil", tmp_path)
    slug, _ = incidents_json(cfg)
    hostile = 'block 3 <script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'

    class StationWithIncidents(TableView):
        def __init__(self) -> None:
            super().__init__(tmp_path / "journal.sqlite", ManualClock(1781913600.0))  # the statement overdue
            self.incidents = IncidentTracker(load(cfg))

    view = StationWithIncidents()
    try:
        store = view.incidents.store
        inc = store.get(slug["id"])
        assert inc is not None
        with store.batch():
            store.save(inc.with_(evidence_broken_at=inc.start + 600, evidence_broken=hostile))
        note = f"evidence incomplete from {iso(inc.start + 600)}: {hostile}"
        with LiveConsole(view, refresh=0.3) as live:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(live.url)
            items = page.locator("#incidents-overdue li")
            expect(items).to_have_count(1)
            mark = items.first.locator(".evidence-incomplete")
            expect(mark).to_have_text(note)
            assert items.first.locator("script, img").count() == 0
            assert page.evaluate("window.pwned") is None
            page.screenshot(path=str(tmp_path / "console-evidence-incomplete.png"), full_page=True)
            page.close()
    finally:
        view.incidents.close()


def test_the_report_of_a_marked_incident_says_so_at_its_top_as_text(browser: Browser, tmp_path: Path) -> None:
    """The slug incident is marked "evidence incomplete from T: <reason>" (through the store,
    as the tracker's `_mark` leaves it: unfrozen, no hash; tests/test_incidents_failing.py
    damages a real block), with a reason holding a `<script>` and an `<img onerror>`. Its
    exported report, opened offline in Chromium, says at its top "Not the whole evidence:
    evidence incomplete from T: <reason>; samples at or after T are not in this package",
    the reason shown as text (no element made of it, nothing runs), and the plot holds no
    reading from T on. Before: the mark was only a line of the summary, and the export said
    exit 0 with the readings after T drawn as if whole."""
    from playwright.sync_api import expect

    from monitor.incidents import IncidentStore

    cfg = replay_case("slug-and-oil", tmp_path)
    slug, _ = incidents_json(cfg)
    hostile = 'block 3 <script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    with IncidentStore(tmp_path / "state") as store:
        inc = store.get(slug["id"])
        assert inc is not None
        since = inc.start + 600
        store.save(
            inc.with_(frozen=False, evidence_sha256=None, evidence_broken_at=since, evidence_broken=hostile)
        )
    out = tmp_path / "export"
    got = monitor("incidents", "export", "--config", str(cfg), "--id", slug["id"], "--out", str(out))
    assert got.returncode == 3, got.stderr
    statement = (
        f"evidence incomplete from {iso(since)}: {hostile};"
        f" samples at or after {iso(since)} are not in this package"
    )
    assert got.stderr.rstrip().endswith(f"incident {slug['id']}: {statement}")

    report = out / f"{slug['id']}.html"
    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 1400})
    page = context.new_page()
    page.goto(report.as_uri())
    banner = page.locator("#evidence-incomplete")
    expect(banner).to_have_text(f"Not the whole evidence: {statement}.")
    assert page.locator("body script, body img").count() == 0
    assert page.evaluate("window.pwned") is None
    readings = page.locator("#readings").get_attribute("points")
    shaded = page.locator("#incident-period")
    assert readings is not None and shaded.is_visible()
    x_start = float(shaded.get_attribute("x") or "nan")
    span = (float(shaded.get_attribute("width") or "nan")) / (float(slug["duration_s"]))
    last_x = max(float(p.split(",")[0]) for p in readings.split())
    assert last_x < x_start + 600 * span + 1  # nothing drawn from T on (1 px for rounding)
    page.screenshot(path=str(tmp_path / "report-evidence-incomplete.png"), full_page=True)
    context.close()
