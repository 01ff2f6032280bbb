"""A clock in doubt across a restart of the daemon (not a reload): the steady run and the
settle are kept in the heartbeat file, for the same boot on a clock that did not step.

See `monitor.clockfile` ("Kept across a restart") and docs/billing.md ("Not a step").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from monitor.clockfile import CLOCK_FILE, STEADY
from monitor.health import attention
from tests.test_clock_heartbeat import WEEK, Kernel, KernelGateway, a_week_on_a_clock_a_month_ahead
from tests.test_clock_unset import DAY, TR, errors, heartbeat
from tests.test_meter_clock_step import METER
from tests.test_pipeline import close


def doubt_left(gw: KernelGateway) -> float:
    """The seconds of steady running left before the clock in doubt is taken as right."""
    return gw.daemon.health().to_json()["clock"]["steady_left"]  # type: ignore[index,no-any-return]


def test_a_restart_in_doubt_on_the_same_clock_goes_on_counting_the_steady_days(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """systemd restarts the daemon (a crash, `systemctl restart`, an upgrade) 6 days into the
    7 steady days, in the same boot, the clock not stepped. Before, the new process counted 7
    days again: a daemon restarted every few days kept the clock in doubt for ever (its meter
    readings alarming, billed nothing). Now the steady run is kept in the heartbeat file
    (its time untouched): the new daemon counts on, the WARNING names the first date, and the
    clock is taken as right a day after the restart."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    kernel = Kernel(False)
    gw = KernelGateway(config, now, kernel)
    try:
        gw.tick(now + 6 * DAY, 6 * DAY)
        assert gw.daemon.meters.ledger.clock_steps() == []
    finally:
        close(gw.daemon)  # kill -9: no clean stop
    assert heartbeat(config.state_dir) == held  # the heartbeat's time is not the doubted clock's
    caplog.clear()
    kernel.mono.advance(30)  # systemd's restart, the clock steady
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, now + 6 * DAY + 30, kernel)
    try:
        (told,) = [e for e in errors(caplog, logging.WARNING) if e.startswith("the heartbeat")]
        assert "2027-01-29T09:00:00Z" in told, told  # the first run's date, not 7 days from now
        assert doubt_left(gw) == DAY - 30
        gw.tick(now + STEADY + 30, DAY - 30)
        (step,) = gw.daemon.meters.ledger.clock_steps()
        assert step.rows == 57 and heartbeat(config.state_dir) == now + STEADY + 30
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("why", ["stepped while down", "another boot", "stepped while running"])
def test_a_step_or_a_reboot_starts_the_steady_days_again(tmp_path: Path, why: str) -> None:
    """What the heartbeat file keeps holds only for the clock that ran it: a step while the
    daemon was down (the wall clock against CLOCK_BOOTTIME), a reboot (the kernel's boot id:
    no clock of a boot is known steady in the next), or a step the running daemon saw (kept at
    once) start the 7 days again at the restart, as an unset clock stepped by NTP must."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    kernel = Kernel(False)
    gw = KernelGateway(config, now, kernel)
    wall = now + 6 * DAY
    try:
        if why == "stepped while running":
            gw.tick(now + 3 * DAY, 3 * DAY)
            wall = now + 6 * DAY + 3 * 3600  # three hours forward, still a month behind
        gw.tick(wall, now + 6 * DAY - gw.wall.now())
    finally:
        close(gw.daemon)
    kernel.mono.advance(30)
    wall += 30
    if why == "stepped while down":
        wall += 2 * 3600
    elif why == "another boot":
        kernel = Kernel(False, boot="boot-next")
    gw = KernelGateway(config, wall, kernel)
    try:
        left = doubt_left(gw)
        # After a step seen while running: the 30 s since it, kept; otherwise the 7 days again.
        assert left == (STEADY - 30 if why == "stepped while running" else STEADY), left
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("stepped", [False, True])
def test_a_settle_at_start_killed_before_the_first_tick_is_not_in_doubt_again(
    tmp_path: Path, stepped: bool
) -> None:
    """The start took the clock as right (the kernel said NTP keeps it synchronised) and moved
    the 57 rows; kill -9 before the first tick wrote the heartbeat. The next start, in the same
    boot and on the same clock, finds the kernel not synchronised for now (NTP unreachable a
    while: its error bound grew past 16 s). Before, the clock was in doubt again for 7 days
    (nothing moved twice, but the meter's readings alarmed and billed nothing). Now the settle
    was kept before the move: the clock is right, and the first tick writes the heartbeat. Not
    when the clock stepped while the daemon was down (two hours back): in doubt again, 7 days."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    kernel = Kernel(True)
    gw = KernelGateway(config, now, kernel)
    try:
        rows = gw.daemon.meters.ledger.rows(METER)
    finally:
        close(gw.daemon)
    assert heartbeat(config.state_dir) == held
    kernel.synced = False
    kernel.mono.advance(600)
    if stepped:
        gw = KernelGateway(config, now + 600 - 7200, kernel)
        try:
            assert doubt_left(gw) == STEADY
        finally:
            close(gw.daemon)
        return
    gw = KernelGateway(config, now + 600, kernel)
    try:
        assert doubt_left(gw) == 0.0
        assert [a for a in attention(gw.daemon.health().to_json()) if "heartbeat" in a["text"]] == []
        assert gw.daemon.meters.ledger.rows(METER) == rows
        gw.tick(now + 660, 60)
        assert heartbeat(config.state_dir) == now + 660
    finally:
        close(gw.daemon)


def test_a_clock_flapping_in_doubt_keeps_its_steady_run_once_a_minute(tmp_path: Path) -> None:
    """A clock in doubt that steps every second for two minutes (a flapping time source):
    each step starts the steady run again and is kept for a restart, but the file is written
    (and fsynced) at most once a minute, not each second; a restart counts from the last step
    kept or, the clock having stepped since it, 7 days again."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    kernel = Kernel(False)
    gw = KernelGateway(config, now, kernel)
    writes = set()
    try:
        for k in range(1, 121):
            gw.tick(now + k * 6, 1)  # 5 s ahead each second
            kept = json.loads((config.state_dir / CLOCK_FILE).read_text(encoding="utf-8"))["doubt"]
            writes.add(kept["wall"])
        assert 2 <= len(writes) <= 3, sorted(writes)
        assert heartbeat(config.state_dir) == held
    finally:
        close(gw.daemon)


def test_a_step_and_its_undoing_in_the_first_minute_after_a_restart_starts_the_days_again(
    tmp_path: Path,
) -> None:
    """Restarted 6 days into the 7 (the count goes on), the clock in doubt steps an hour back
    10 s later and forward again 30 s after that (two NTP answers an hour apart), and the
    daemon is killed 10 s later, the clock on the line it started on. Before, neither step
    was kept (the start's own keep counted as the minute's write), and the next start, the
    clock consistent with the start's record, counted on from 6 days ago across both steps
    (taken as right a day later). The first step after a keep is kept at once: the record is
    of the stepped line, the clock is not on it, and the 7 days start again."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    kernel = Kernel(False)
    gw = KernelGateway(config, now, kernel)
    try:
        gw.tick(now + 6 * DAY, 6 * DAY)
    finally:
        close(gw.daemon)
    kernel.mono.advance(30)
    now += 6 * DAY + 30
    gw = KernelGateway(config, now, kernel)
    try:
        assert doubt_left(gw) == DAY - 30
        gw.tick(now + 1, 1)  # the first tick: the clock watch's first look
        gw.tick(now + 10 - 3600, 9)  # an hour back
        gw.tick(now + 40, 30)  # and forward again
        gw.tick(now + 50, 10)
    finally:
        close(gw.daemon)  # kill -9
    kernel.mono.advance(30)
    gw = KernelGateway(config, now + 80, kernel)
    try:
        assert doubt_left(gw) == STEADY
    finally:
        close(gw.daemon)
