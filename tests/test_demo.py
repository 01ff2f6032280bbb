"""`monitor demo`, the README's first command, run for a bounded time as a newcomer would."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from monitor.commands.demo import HISTORY, slug_factor
from simulators.scenarios import Station
from tests.demo_process import running_demo
from tests.services import wait_until

# The demo's own accelerated clock: at 240x the first slug alarm (station minute 17)
# comes about 4 s after start instead of 17 s; the demo then polls every 0.25 s, one
# reading per station minute, so the slug rule still sees a continuous run.
SPEED = "240"


def test_demo_serves_the_console_and_raises_a_slug_alarm(tmp_path: Path) -> None:
    """Started, watched until its slug alarm, stopped with Ctrl-C as a newcomer would."""
    with running_demo(SPEED, tmp_path / "state") as demo:
        lines = demo.lines
        wait_until(lambda: any("console: http" in ln for ln in lines), timeout=90, what="console URL")
        url = re.search(r"console: (http://\S+)", demo.text())
        assert url is not None
        with urllib.request.urlopen(url.group(1), timeout=5) as resp:
            assert resp.status == 200
            assert b"<html" in resp.read().lower()
        assert any("seeding a day of history" in ln for ln in lines)

        def slug_alarm_raised() -> bool:
            with urllib.request.urlopen(url.group(1) + "api/alarms", timeout=5) as resp:
                alarms = json.loads(resp.read())
            return any(a["sensor"] == "outfall.flow" and a["rule"] == "slug" for a in alarms)

        wait_until(slug_alarm_raised, timeout=60, what="slug alarm in the demo")
        wait_until(lambda: any("alarm outfall.flow/slug active" in ln for ln in lines), what="the log line")
        text = demo.stop()
        assert "alarm outfall.flow/slug active" in text
        assert "Traceback" not in text
    # The demo's clock runs 240x: its times must never become the station's last known good
    # time (monitor/clockfile.py), not while running, not at its stop.
    assert any((tmp_path / "state").iterdir())  # the demo wrote its state there
    assert not (tmp_path / "state" / "clock.json").exists()


@pytest.mark.parametrize("hour", range(24))
def test_demo_slug_is_a_slug_at_any_hour(hour: int) -> None:
    """The demo's slug must exceed 5x the daily mean flow whenever it runs (it used to
    stay under it when started between about 00:00 and 05:00 UTC, with no alarm)."""
    start = 1_700_000_000.0 - 1_700_000_000.0 % 86400 + hour * 3600.0
    station = Station(seed=7, speed=60.0, start=start - HISTORY / 60.0, origin=start - HISTORY)
    el = HISTORY + 120.0
    station.inject("slug", el, 1200.0, factor=slug_factor(station, el, 1200.0))
    flows = [station.values(station.start + (el + s) / station.speed)["flow"] for s in range(0, 1200, 10)]
    assert min(flows) > 5.0 * station.mean_flow
