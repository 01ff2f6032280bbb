"""The console's station view, from the real daemon fed simulated polls, in headless Chromium
on a phone-sized screen: level bar with setpoints, a pump failed to start, then an overflow.
Screenshots go to build/test-artifacts/ (and tmp)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import yaml
from playwright.sync_api import Browser, Page, ViewportSize, expect

from monitor.config import load_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Sample, iso
from monitor.web.station import StationAdapter
from simulators.lift_station import LiftStation
from tests.console import LiveConsole
from tests.test_station_live import DAY, START, write_config

ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "test-artifacts"
PHONE: ViewportSize = {"width": 390, "height": 844}


def shoot(page: Page, tmp: Path, name: str) -> None:
    shot = tmp / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / name)


def test_station_view_on_a_phone(browser: Browser, tmp_path: Path) -> None:
    sim = LiftStation(
        START, days=1.2, storm=(0.8 * DAY, 3 * 3600.0, 1150.0), failure=(0.05 * DAY, 6 * 3600.0), slug=None
    ).run()
    episode = next(a for a, b in sim.truth.fail_to_start if b - a > 200)
    over_start, _ = sim.truth.overflows[0]
    clock = ManualClock(START)
    daemon = Daemon(load_config(write_config(tmp_path, "console")), clock)
    t = START

    def feed_until(until: float) -> None:
        nonlocal t
        while t <= until:
            clock.set(t)
            daemon.pipeline.process([Sample(s, t, v) for s, v in sim.values(t).items()])
            t += 10.0

    try:
        feed_until(episode + 150)  # the fail-to-start alarm is up (2 min delay), no pump runs
        with LiveConsole(StationAdapter(daemon)) as live:  # type: ignore[arg-type]
            state = httpx.get(f"{live.url}/api/wet-well", timeout=10).json()
            assert state["level"]["fail_to_start"] is True
            # Pump 1 is the one that failed: with alternation, the lead is the pump idle longest.
            assert [p["state"] for p in state["pumps"]] == ["failed", "stopped"]
            page = browser.new_page(viewport=PHONE)
            page.goto(live.url)  # the alarm console links the wet-well page for a station with one
            page.locator("#station-link").click()
            expect(page).to_have_url(f"{live.url}/station")
            expect(page.locator('.pump.failed[data-sensor="ps.pump1"]')).to_have_count(1)
            expect(page.locator(".pump.failed")).to_have_count(1)
            expect(page.locator("#level-state")).to_contain_text("FAIL TO START")
            expect(page.locator(".mark")).to_have_count(5)  # off, lead on, lag on, high, overflow
            expect(page.locator("#overflow")).to_be_hidden()
            starts = page.locator('.pump[data-sensor="ps.pump2"] .figs')
            expect(starts).to_contain_text("starts today")
            shoot(page, tmp_path, "station-fail-to-start.png")
            page.close()

        # The daemon's stores belong to the thread that opened them (its loop, here the test's).
        feed_until(over_start + 1800)  # half an hour into the storm's overflow
        with LiveConsole(StationAdapter(daemon)) as live:  # type: ignore[arg-type]
            page = browser.new_page(viewport=PHONE)
            page.goto(f"{live.url}/station")
            expect(page.locator("#overflow")).to_contain_text("OVERFLOW since")
            expect(page.locator("#overflow")).to_contain_text("report due")
            expect(page.locator(".pump.running")).to_have_count(2)
            expect(page.locator(".fill.over")).to_have_count(1)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"]  # nothing runs off a phone's screen sideways
            shoot(page, tmp_path, "station-overflow.png")
            state = httpx.get(f"{live.url}/api/wet-well", timeout=10).json()
            assert state["overflow"]["volume_gal"] > 0
            assert state["overflow"]["report_due_local"].endswith("-05:00")  # America/New_York
            assert all(p["today_starts"] > 0 and p["today_run_hours"] > 0 for p in state["pumps"])
            totals = state["totals"]
            assert totals["today_starts"] == sum(p["today_starts"] for p in state["pumps"])
            expect(page.locator("#today")).to_contain_text(f"{totals['today_starts']} starts")
    finally:
        daemon.station.close()
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()


def test_the_overflow_banner_says_the_level_is_not_read(browser: Browser, tmp_path: Path) -> None:
    """The wet-well page in Chromium: an overflow open (ps.level 9.5 ft, over 9) whose level
    transmitter then goes silent, the pumps and flow meter still polled. Past the level's
    `stale_after` (2 min) the banner says since when it is not read: the end is open because
    nothing said the well stopped spilling, not because it was measured spilling."""
    clock = ManualClock(START)
    daemon = Daemon(load_config(write_config(tmp_path, "banner")), clock)
    try:
        for k in range(0, 61):  # 10 s polls for 10 minutes; the level silent after +60 s
            t = START + 10.0 * k
            clock.set(t)
            batch = [Sample("ps.pump1", t, 1.0), Sample("ps.pump2", t, 1.0), Sample("ps.flow", t, 1000.0)]
            if k <= 6:
                batch.append(Sample("ps.level", t, 9.5))
            daemon.pipeline.process(batch)
        with LiveConsole(StationAdapter(daemon)) as live:  # type: ignore[arg-type]
            state = httpx.get(f"{live.url}/api/wet-well", timeout=10).json()
            since = state["overflow"]["level_not_read_since_local"]
            assert since is not None
            page = browser.new_page(viewport=PHONE)
            page.goto(f"{live.url}/station")
            expect(page.locator("#overflow")).to_contain_text("OVERFLOW since")
            expect(page.locator("#overflow")).to_contain_text(f"level not read since {since}")
            shoot(page, tmp_path, "station-overflow-level-stale.png")
            page.close()
    finally:
        daemon.station.close()
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()


def test_the_overflow_banner_says_which_overflow_it_continues(browser: Browser, tmp_path: Path) -> None:
    """The wet-well page in Chromium, the real daemon: ps.level 9.5 ft (over 9) then its
    transmitter dead, the float switch on, then off at +130 s: the float ends the overflow
    (the level stale, `stale_after` 2 min). The level comes back at +400 s reading 9.4 ft:
    the banner of the second overflow says it continues the first (one spill, one event)
    and that the time between was not measured."""
    path = write_config(tmp_path, "link")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["sensors"].append({"id": "ps.float", "kind": "status", "name": "Overflow float"})
    raw["wet_well"]["overflow_switch"] = "ps.float"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    clock = ManualClock(START)
    daemon = Daemon(load_config(path), clock)
    try:
        for k in range(0, 46):  # 10 s polls; the level dead from +70 s to +400 s
            t = START + 10.0 * k
            clock.set(t)
            batch = [Sample("ps.pump1", t, 0.0), Sample("ps.pump2", t, 0.0), Sample("ps.flow", t, 0.0)]
            batch.append(Sample("ps.float", t, 1.0 if 10 <= 10 * k < 130 else 0.0))
            if k <= 6 or k >= 40:
                batch.append(Sample("ps.level", t, 9.5 if k <= 6 else 9.4))
            daemon.pipeline.process(batch)
        with LiveConsole(StationAdapter(daemon)) as live:  # type: ignore[arg-type]
            state = httpx.get(f"{live.url}/api/wet-well", timeout=10).json()
            since = state["overflow"]["continues_local"]
            assert state["overflow"]["continues"] == iso(START)
            page = browser.new_page(viewport=PHONE)
            page.goto(f"{live.url}/station")
            expect(page.locator("#overflow")).to_contain_text(
                f"continues the overflow from {since} (the time between not measured)"
            )
            shoot(page, tmp_path, "station-overflow-continues.png")
            page.close()
    finally:
        daemon.station.close()
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()
