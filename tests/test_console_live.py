"""Live updates send changes, not a full snapshot each time; streams are limited. Over real
HTTP against the real uvicorn server (tests/console.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor.model import ManualClock, Sample
from tests.console import T0, LiveConsole, TableView, fill_day


@pytest.fixture
def view(tmp_path: Path) -> Iterator[TableView]:
    v = TableView(tmp_path / "journal.sqlite", ManualClock(T0))
    fill_day(v, T0 - 86400)
    yield v
    v.alarms.close()


def events(lines: Iterator[str], deadline: float) -> Iterator[tuple[str, Any]]:
    event = ""
    for line in lines:
        assert time.monotonic() < deadline, "no event in time"
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


def test_after_one_snapshot_only_changed_sensors_are_sent(view: TableView) -> None:
    with (
        LiveConsole(view, refresh=0.2) as live,
        httpx.stream("GET", f"{live.url}/api/events", timeout=10) as resp,
    ):
        stream = events(resp.iter_lines(), time.monotonic() + 15)
        kind, first = next(stream)
        assert kind == "sensors" and len(first["sensors"]) == 3 and "health" in first
        kind, quiet = next(stream)
        assert kind == "changes" and quiet["sensors"] == [] and "health" not in quiet
        live.call(lambda: view.inject(Sample("outfall.oil", T0 + 60, 30.0)))
        for kind, delta in stream:
            if kind == "changes" and delta["sensors"]:
                break
        assert [s["id"] for s in delta["sensors"]] == ["outfall.oil"]
        assert delta["sensors"][0]["value"] == 30.0
        assert "health" in delta  # the last poll moved


def test_streams_past_the_limit_get_503(view: TableView) -> None:
    with LiveConsole(view, refresh=0.2) as live:
        live.app.state.hub.limit = 2
        with (
            httpx.stream("GET", f"{live.url}/api/events", timeout=10) as a,
            httpx.stream("GET", f"{live.url}/api/events", timeout=10) as b,
        ):
            assert a.status_code == b.status_code == 200
            # keep the line iterators: a dropped one closes its stream when collected
            lines = [a.iter_lines(), b.iter_lines()]
            assert [next(x) for x in lines] == ["retry: 2000"] * 2
            third = httpx.get(f"{live.url}/api/events", timeout=10)
            assert third.status_code == 503 and third.headers["retry-after"] == "30"
            assert httpx.get(f"{live.url}/api/station", timeout=10).status_code == 200
