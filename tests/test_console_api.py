"""Console HTTP API: reads, token-guarded writes, errors, OpenAPI, live events over real HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor.model import ManualClock, Sample
from tests.console import T0, TOKEN, LiveConsole, TableView, call, fill_day

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CITE = "§139-15 C(3)"


@pytest.fixture
def view(tmp_path: Path) -> Iterator[TableView]:
    clock = ManualClock(T0)
    v = TableView(tmp_path / "journal.sqlite", clock)
    fill_day(v, T0 - 86400)
    yield v
    v.alarms.close()


def test_reads(view: TableView) -> None:
    view.inject(Sample("outfall.ph", T0, 9.4), limit=9.0, citation=CITE)
    station = call(view, "GET", "/api/station").json()
    assert station["id"] == "ps-1" and station["writes_enabled"] is True
    (alarm,) = call(view, "GET", "/api/alarms").json()
    assert alarm["sensor"] == "outfall.ph" and alarm["state"] == "active_unacknowledged"
    assert alarm["citation"] == CITE and alarm["priority"] == "high"
    sensors = {s["id"]: s for s in call(view, "GET", "/api/sensors").json()}
    assert sensors["outfall.ph"]["value"] == 9.4 and sensors["outfall.ph"]["quality"] == "good"
    assert sensors["outfall.flow"]["baseline"] == pytest.approx(400, abs=1)
    series = call(view, "GET", "/api/sensors/outfall.flow/series?hours=24&points=48").json()
    assert series["unit"] == "gpm" and len(series["points"]) == 48
    values = [v for _, v in series["points"]]
    assert min(values) < 300 and max(values) > 500  # the daily shape survives downsampling
    health = call(view, "GET", "/api/health").json()
    assert health["uptime_s"] is None  # NaN became null, not a 500
    assert health["alarms"] == {"active_unacknowledged": 1}
    assert call(view, "GET", "/api/sensors/nope/series").status_code == 404
    page = call(view, "GET", "/")
    assert page.status_code == 200 and "<title>" in page.text
    assert call(view, "GET", "/static/app.js").status_code == 200


def test_writes_need_the_token(view: TableView) -> None:
    view.inject(Sample("outfall.ph", T0, 9.4), limit=9.0, citation=CITE)
    url = "/api/alarms/outfall.ph/high/ack"
    missing = call(view, "POST", url, json={"by": "dana"})
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    wrong = call(view, "POST", url, json={"by": "dana"}, headers={"Authorization": "Bearer guess"})
    assert wrong.status_code == 401
    basic = call(view, "POST", url, json={"by": "dana"}, headers={"Authorization": "Basic ZGFuYTp4"})
    assert basic.status_code == 401
    disabled = call(view, "POST", url, token=None, json={"by": "dana"}, headers=AUTH)
    assert disabled.status_code == 403 and "console.token" in disabled.json()["detail"]
    assert call(view, "GET", "/api/alarms").json()[0]["state"] == "active_unacknowledged"
    ok = call(view, "POST", url, json={"by": "dana", "note": "dosing pump restarted"}, headers=AUTH)
    assert ok.status_code == 200, ok.text
    assert ok.json()["state"] == "active_acknowledged" and ok.json()["acked_by"] == "dana"
    again = call(view, "POST", url, json={"by": "dana"}, headers=AUTH)
    assert again.status_code == 409 and "already acknowledged by dana" in again.json()["detail"]
    unknown = call(view, "POST", "/api/alarms/outfall.ph/low/ack", json={"by": "dana"}, headers=AUTH)
    assert unknown.status_code == 404
    bad_rule = call(view, "POST", "/api/alarms/outfall.ph/hihg/ack", json={"by": "dana"}, headers=AUTH)
    assert bad_rule.status_code == 422


def test_shelve_unshelve_remove_return(view: TableView) -> None:
    view.inject(Sample("outfall.ph", T0, 9.4), limit=9.0, citation=CITE)
    base = "/api/alarms/outfall.ph/high"
    r = call(
        view,
        "POST",
        f"{base}/shelve",
        json={"by": "dana", "reason": "probe cleaning", "minutes": 30},
        headers=AUTH,
    )
    assert r.status_code == 200 and r.json()["state"] == "shelved"
    assert r.json()["shelved_until"] == "2026-05-28T20:56:40Z"  # T0 + 30 min
    naive = call(
        view,
        "POST",
        f"{base}/shelve",
        json={"by": "d", "reason": "x", "until": "2026-05-28T21:00:00"},
        headers=AUTH,
    )
    assert naive.status_code == 422
    far = call(
        view,
        "POST",
        f"{base}/shelve",
        json={"by": "d", "reason": "x", "until": "2027-01-01T00:00:00Z"},
        headers=AUTH,
    )
    assert far.json()["shelved_until"] == "2026-05-29T04:26:40Z"  # capped at shelve_max 8 h
    assert call(view, "POST", f"{base}/unshelve", json={"by": "dana"}, headers=AUTH).json()["state"] == (
        "active_unacknowledged"
    )
    r = call(view, "POST", f"{base}/remove", json={"by": "dana", "reason": "probe replaced"}, headers=AUTH)
    assert r.json()["state"] == "out_of_service"
    assert call(view, "POST", f"{base}/return", json={"by": "dana"}, headers=AUTH).json()["state"] == (
        "active_unacknowledged"
    )
    journal = call(view, "GET", "/api/journal?limit=3").json()
    assert [e["event"] for e in journal] == ["returned_to_service", "removed_from_service", "unshelved"]
    assert journal[1]["actor"] == "dana" and journal[1]["note"] == "probe replaced"
    empty_name = call(view, "POST", f"{base}/ack", json={"by": "   "}, headers=AUTH)
    assert empty_name.status_code == 409 and "say who you are" in empty_name.json()["detail"]


def test_openapi_document_describes_the_api(view: TableView) -> None:
    doc = call(view, "GET", "/openapi.json").json()
    paths = doc["paths"]
    assert "/api/alarms/{sensor}/{rule}/ack" in paths and "/api/journal" in paths
    ack = paths["/api/alarms/{sensor}/{rule}/ack"]["post"]
    assert ack["security"] == [{"HTTPBearer": []}]
    assert {"401", "403", "404", "409"} <= set(ack["responses"])
    assert "get" not in paths.get("/api/alarms/{sensor}/{rule}/ack", {})
    assert call(view, "GET", "/docs").status_code == 404  # Swagger UI would need a CDN


def test_page_needs_no_internet() -> None:
    """The gateway has no internet: the page must not load anything from elsewhere."""
    import re

    from monitor.web.app import STATIC

    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8").replace("http://www.w3.org/2000/svg", "")
        assert not re.search(r"https?://|//cdn|@import", text), path.name


def test_live_events_over_real_http(view: TableView) -> None:
    """An alarm raised on the daemon's loop reaches an open SSE stream at once."""
    with LiveConsole(view) as live, httpx.stream("GET", f"{live.url}/api/events", timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()
        events: list[tuple[str, Any]] = []
        injected = False
        deadline = time.monotonic() + 10
        event = ""
        for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
                if event == "sensors" and not injected:
                    live.call(lambda: view.inject(Sample("outfall.ph", T0 + 60, 9.7), 9.0, CITE))
                    injected = True
                if event == "alarm":
                    break
            assert time.monotonic() < deadline, "no alarm event within 10 s"
        kind, data = events[-1]
        assert kind == "alarm" and data["event"] == "activated"
        assert data["alarm"]["sensor"] == "outfall.ph" and data["alarm"]["citation"] == CITE
        first = events[0][1]
        assert {s["id"] for s in first["sensors"]} == {"outfall.ph", "outfall.flow", "outfall.oil"}
        assert first["health"]["outbox_depth"] == 0


def test_action_the_journal_cannot_record_is_refused(view: TableView) -> None:
    view.inject(Sample("outfall.ph", T0, 9.4), limit=9.0, citation=CITE)
    # The journal becoming unusable (disk gone, file locked) shown by closing its connection.
    view.alarms.journal.close()
    r = call(view, "POST", "/api/alarms/outfall.ph/high/ack", json={"by": "dana"}, headers=AUTH)
    assert r.status_code == 503 and r.json()["detail"].startswith("not done: alarm journal")
    alarm = view.alarms.get("outfall.ph", "high")
    assert alarm is not None and alarm.state.value == "active_unacknowledged"  # memory unchanged
