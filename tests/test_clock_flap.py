"""A flapping gateway clock (NTP stepping it back and forth every few seconds): the first
step of an episode is logged in full, the rest counted and said in one line per window
(`EPISODE`), and the count is in /api/health and /metrics. Injected wall and monotonic
clocks, a check a second as the daemon's tick makes, no sleeps."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from monitor.engine import ClockWatch, Engine
from monitor.engine.clock_log import EPISODE
from monitor.model import ManualClock, Rule, Sample, iso
from monitor.web.service import StationCollector
from monitor.web.station import StationAdapter
from tests.engine_helpers import T0
from tests.test_clock_step import CONFIG, Stepped
from tests.test_pipeline import close

WATCH = "monitor.engine"


def flap(k: int, size: float = 3.0) -> float:
    """The gateway clock's error `k` s into the flap: right, then `size` s behind, every 5 s
    in turn (once 8 s behind, at +305 s)."""
    if (k // 5) % 2 == 0:
        return 0.0
    return -8.0 if k // 5 == 61 else -size


def test_a_flapping_clock_is_logged_once_an_episode_and_summarised_every_ten_minutes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The clock steps every 5 s from +5 s to +1800 s (360 steps, back 3 s and forward 3 s
    in turn, once 8 s), then holds steady; one more step at +2500 s. Logged: the first step
    in full; at +605 s, +1205 s and +1805 s one line each for the steps of the 10 min before
    (119, 120 and 120, with how many back and forward and the largest); at +2405 s, a window
    with no step, one INFO line that the episode is over; the step at +2500 s in full again.
    Before: 361 WARNING lines, one per step."""
    assert EPISODE == 600.0
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    watch = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=wall.now, monotonic=mono.now)
    assert watch.check() == []
    lines: list[tuple[int, int, str]] = []
    with caplog.at_level(logging.INFO, logger=WATCH):
        for k in range(1, 2601):
            wall.set(T0 + k + (flap(k) if k <= 1800 else 0.0) + (-5.0 if k >= 2500 else 0.0))
            mono.set(1000.0 + k)
            caplog.clear()
            conditions = watch.check()
            watch.forget(mono.now())  # as the pipeline's tick does while it holds no reading
            if (k % 5 == 0 and 5 <= k <= 1800) or k == 2500:
                assert [c.rule for c in conditions] == [Rule.CLOCK], k  # every step still raises it
            lines += [(k, r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    warn, info = logging.WARNING, logging.INFO
    assert lines == [
        (5, warn, "gateway clock stepped back by 3s; readings re-based, judging goes on"),
        (605, warn, "gateway clock stepped 119 more times in the last 10m (59 back, 60 forward,"
                    " the largest back by 8s), not logged one by one; judging goes on"),
        (1205, warn, "gateway clock stepped 120 more times in the last 10m (60 back, 60 forward,"
                     " the largest back by 3s), not logged one by one; judging goes on"),
        (1805, warn, "gateway clock stepped 120 more times in the last 10m (60 back, 60 forward,"
                     " the largest back by 3s), not logged one by one; judging goes on"),
        (2405, info, "gateway clock steady for 10m: its next step is logged in full"),
        (2500, warn, "gateway clock stepped back by 5s; readings re-based, judging goes on"),
    ]  # fmt: skip
    assert watch.step_log.steps == 361
    assert (watch.step_log.episode_steps, watch.step_log.episode_largest) == (1, -5.0)


def test_the_steps_not_summarised_yet_are_said_at_shutdown(caplog: pytest.LogCaptureFixture) -> None:
    """The daemon stops (or reloads) 2 min into an episode: the steps counted since its
    first are said then (`StepLog.flush`, called by the daemon's shutdown), not lost; with
    none counted, nothing is said."""
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    watch = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=wall.now, monotonic=mono.now)
    watch.check()
    for k in range(1, 121):
        wall.set(T0 + k + flap(k))
        mono.set(1000.0 + k)
        watch.check()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=WATCH):
        watch.step_log.flush(mono.now())
        watch.step_log.flush(mono.now())  # said once
    assert [r.getMessage() for r in caplog.records] == [
        "gateway clock stepped 23 more times in the last 1m before shutdown (11 back, 12 forward,"
        " the largest forward by 3s), not logged one by one; judging goes on"
    ]


def test_a_reading_moved_by_a_step_is_logged_once_an_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A poll stamped before a step and judged after it is moved onto the new clock and
    logged (`ClockWatch.restamp`); while the clock flaps (30 s back and forth every 5 s, a
    poll taken 2 s before each step judged 1 s after it), the first so moved in the episode
    is logged and the rest only counted (`pipeline.restamped`). Before: a line per step."""
    gw = Stepped(tmp_path, 0.0)
    daemon = gw.daemon
    try:
        with caplog.at_level(logging.INFO, logger=WATCH):
            for k in range(1, 301):
                gw.wall.set(T0 + k + flap(k, 30.0))
                gw.mono.set(1000.0 + k)
                daemon.tick()
                if k % 5 == 1:  # the poll of 2 s before, queued across the step
                    daemon.pipeline.process([Sample("ph", T0 + k - 2 + flap(k - 2, 30.0), 7.0)])
        moved = [r.getMessage() for r in caplog.records if "was stamped before" in r.getMessage()]
        assert len(moved) == 1 and moved[0].startswith(f"ph at {iso(T0 + 4)} was stamped before")
        assert daemon.pipeline.stats.restamped == 59  # each poll, 59 steps
        assert daemon.engine.counters.out_of_order == 0
    finally:
        close(daemon)


@pytest.mark.parametrize("polls", [True, False], ids=["polled", "silent"])
def test_the_step_count_is_in_the_health_and_metrics_and_no_other_part_logs_each_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, polls: bool
) -> None:
    """Through the daemon (its tick checks the clock each second, the station and the meter
    ledger move with each step), with polls every 10 s or none: 15 min of a flapping clock
    give 2 WARNING lines in all, from any part (the first step, the summary at +605 s; the
    clock alarm is journaled once), and /api/health and /metrics count every step. Before,
    with no poll, the pipeline never let the watch forget a step, and at +505 s it said
    "gateway clock stepped 101 times while readings waited" (none did)."""
    gw = Stepped(tmp_path, 0.0)
    daemon = gw.daemon
    try:
        with caplog.at_level(logging.WARNING):
            for k in range(1, 901):
                t = T0 + k + flap(k)
                gw.wall.set(t)
                gw.mono.set(1000.0 + k)
                daemon.tick()
                if polls and k % 10 == 3:
                    daemon.pipeline.process([Sample("ph", t, 7.0), Sample("lvl", t, 4.0)])
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 2, warnings
        assert warnings[0] == "gateway clock stepped back by 3s; readings re-based, judging goes on"
        assert warnings[1].startswith("gateway clock stepped 119 more times in the last 10m")
        health = daemon.health().to_json()
        assert health["clock"] == {
            "steps": 180,
            "episode_steps": 180,
            "episode_largest": -8.0,
            "heartbeat_ahead": 0.0,
            "steady_left": 0.0,
            "ntp_disagrees": False,
            "meter_rows_ahead": 0,
            "meters_ahead": 0,
        }
        registry = CollectorRegistry()
        registry.register(StationCollector(StationAdapter(daemon)))  # what /metrics serves
        text = generate_latest(registry).decode()
        assert 'station_monitor_clock_steps_total{station="ps-step-station"} 180.0' in text
        assert [e.event for e in daemon.alarms.journal.entries(sensor="gateway")] == ["activated"]
        assert daemon.engine.counters.out_of_order == 0
    finally:
        close(daemon)


def test_a_large_step_inside_a_flapping_episode_is_logged_in_full_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The clock flaps by 3 s every 5 s; at +102 s NTP steps it back by an hour on top of
    the flap (the RTC had run an hour fast). That step moves every reading and every open
    record an hour: it is logged in full when noticed, not counted among the flap's steps;
    the window's summary at +605 s counts the others. Before: a DEBUG line, and an operator
    read of it only in the summary up to 10 min later ("the largest back by 1h")."""
    wall, mono = ManualClock(T0), ManualClock(1000.0)
    watch = ClockWatch(Engine(CONFIG.rules, ManualClock()), wall=wall.now, monotonic=mono.now)
    watch.check()
    lines: list[tuple[int, str]] = []
    with caplog.at_level(logging.WARNING, logger=WATCH):
        for k in range(1, 611):
            wall.set(T0 + k + flap(k) - (3600.0 if k >= 102 else 0.0))
            mono.set(1000.0 + k)
            caplog.clear()
            watch.check()
            watch.forget(mono.now())
            lines += [(k, r.getMessage()) for r in caplog.records]
    assert lines == [
        (5, "gateway clock stepped back by 3s; readings re-based, judging goes on"),
        (102, "gateway clock stepped back by 1h 0m; readings re-based, judging goes on"),
        (605, "gateway clock stepped 119 more times in the last 10m (59 back, 60 forward,"
              " the largest back by 8s), not logged one by one; judging goes on"),
    ]  # fmt: skip
    assert watch.step_log.steps == 123  # with the two of the next window (+605 s, +610 s)
    assert watch.step_log.episode_largest == -3600.0


def test_a_stop_says_the_steps_counted_and_not_summarised_yet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The path SIGTERM (and a SIGHUP reload) takes: `Daemon.stop()` while it runs, 2 min
    into a flap. Its shutdown says the steps counted since the first (one WARNING line
    "... before shutdown"), so none is lost with the process."""
    gw = Stepped(tmp_path, 0.0)
    daemon = gw.daemon
    for k in range(1, 121):
        gw.wall.set(T0 + k + flap(k))
        gw.mono.set(1000.0 + k)
        daemon.tick()

    async def run_and_stop() -> None:
        task = asyncio.create_task(daemon.run())
        await daemon.ready.wait()
        daemon.stop()
        await task

    with caplog.at_level(logging.WARNING, logger=WATCH):
        asyncio.run(run_and_stop())
    said = [r.getMessage() for r in caplog.records if "before shutdown" in r.getMessage()]
    assert said == [
        "gateway clock stepped 23 more times in the last 1m before shutdown (11 back, 12 forward,"
        " the largest forward by 3s), not logged one by one; judging goes on"
    ]
