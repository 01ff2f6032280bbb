"""The heartbeat's gaps: a clock before the release with nothing else to judge it by, a
heartbeat a clock wrong in the future wrote, and a release floor a release forgot to move.

See `monitor.clockfile` and docs/billing.md ("Not a step").
"""

from __future__ import annotations

import json
import logging
import math
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor.alarms.journal import Entry, Journal
from monitor.clockfile import CLOCK_FILE, RELEASE_FLOOR, STEADY, ClockFile
from monitor.config import Config, load_config
from monitor.daemon import Daemon
from monitor.engine import ClockWatch
from monitor.engine.checkpoint import CHECKPOINT_FILE, save_checkpoint
from monitor.health import attention
from monitor.kernelclock import KernelClock
from monitor.meters.ledger import Ledger
from monitor.model import ManualClock, Rule, Sample, iso
from tests.services import free_port
from tests.test_clock_unset import DAY, TR, Gateway, errors, heartbeat, one_reading_station, rows_of
from tests.test_meter_clock_step import METER, SPEC, meter_station
from tests.test_pipeline import close, get, served


def test_a_1970_clock_without_a_heartbeat_moves_not_even_a_single_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first boot after install: no heartbeat yet, no engine checkpoint, no journal, and the
    gateway (no battery-backed clock, NTP not answered) reads 1970. The meter's one reading
    (installed the day before) is 56 years "ahead": before, one row ahead with nothing to
    judge by was a bad stamp, moved back to 1970 (billed in no quarter the clerk exports). A
    clock before this release's date is not set, whatever else is known: nothing moves, the
    ERROR says why, and the heartbeat is not written until NTP steps the clock forward."""
    path, state = one_reading_station(tmp_path)
    config = load_config(path)
    before = rows_of(state / "ledger.sqlite")
    boot = 1000.0
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, boot)
    try:
        assert rows_of(state / "ledger.sqlite") == before
        assert gw.daemon.meters.ledger.clock_steps() == []
        (said,) = [e for e in errors(caplog) if "not synchronised" in e]
        assert "before this release" in said, said
        gw.tick(boot + 60, 60)
        assert heartbeat(state) is None
        gw.tick(TR + 60, 10)  # NTP
        assert heartbeat(state) == TR + 60
    finally:
        close(gw.daemon)
    assert boot < RELEASE_FLOOR


# --- a heartbeat a clock wrong in the future wrote -----------------------------------------

AHEAD = 30 * DAY  # the gateway's RTC was set a month ahead
WEEK = 7 * DAY  # and it ran a week on it


class Kernel:
    """The kernel's answers, faked: only whether NTP keeps the clock synchronised (a real
    kernel here cannot be made to say so on demand, nor a boot other than this one), and the
    boot's id and time, on the test's monotonic clock."""

    def __init__(self, synced: bool | None, boot: str = "boot-now", mono: ManualClock | None = None) -> None:
        self.synced = synced
        self.boot = boot
        self.mono = mono or ManualClock(1000.0)

    def synchronised(self) -> bool | None:
        return self.synced

    def boot_id(self) -> str | None:
        return self.boot

    def since_boot(self) -> float:
        return self.mono.now()


class KernelGateway(Gateway):
    """`Gateway` with the kernel's answers given (`Kernel`)."""

    def __init__(
        self, config: Config, wall: float, kernel: Kernel, steady_since: float | None = None
    ) -> None:
        self.wall, self.mono = ManualClock(wall), kernel.mono
        self.daemon = Daemon(config, self.wall, kernel=kernel, steady_since=steady_since)
        self.daemon.watch_clock(ClockWatch(self.daemon.engine, wall=self.wall.now, monotonic=self.mono.now))


def a_week_on_a_clock_a_month_ahead(tmp_path: Path) -> tuple[Config, float]:
    """A station whose gateway ran a week on a clock a month ahead, in an earlier boot: 57
    readings three hours apart, an operator's acknowledgement, the engine checkpoint's last
    tick and the heartbeat all stamped by it. Returns the config and the heartbeat's time
    (TR + AHEAD + WEEK)."""
    path = meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    state.mkdir(parents=True)
    wrong = TR + AHEAD
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=wrong)
    ledger.add_many([(METER, wrong + 3 * 3600 * k, Decimal(100 + k)) for k in range(57)])
    ledger.close()
    journal = Journal(state / "journal.sqlite")
    journal.append(
        Entry(wrong + WEEK - 600, "ph", Rule.HIGH, "acknowledged", "active_acked", "high", actor="op")
    )
    journal.close()
    gw = KernelGateway(config, wrong + WEEK + 1, Kernel(False, boot="boot-before"))
    try:  # the engine checkpoint every running station has, its last tick on the wrong clock
        gw.daemon.pipeline.process([Sample("ph", wrong + WEEK - 30, 7.0)])
        gw.daemon.engine.last_tick = wrong + WEEK
        save_checkpoint(gw.daemon.engine, state / CHECKPOINT_FILE)
    finally:
        close(gw.daemon)
    file = ClockFile(state / CLOCK_FILE, kernel=Kernel(False, boot="boot-before"))
    file.not_before = -math.inf
    assert file.beat(wrong + WEEK, force=True)
    return config, wrong + WEEK


def test_a_synchronised_clock_replaces_a_heartbeat_a_clock_wrong_in_the_future_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway reboots with its clock right (NTP answered before the daemon started:
    `After=time-sync.target`), a week after the RTC went wrong: the heartbeat, the journal and
    the ledger are all a month ahead of it. Before, the clock was taken for unset: nothing moved,
    every reading of the right clock alarmed `backwards` and billed nothing, and the heartbeat
    was not written, until the clock came round to the wrong one's time, a month later (or
    someone deleted clock.json). Now the kernel says the clock is synchronised (faked here: the
    only thing faked): the records ahead were stamped by a clock wrong in the future. The
    meter's rows move below now (found at start, audited), one WARNING says what happened and
    what to do, and the first tick writes the right time into the heartbeat."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    state = config.state_dir
    now = TR + WEEK + 3600
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, now, Kernel(True))
    try:
        assert [e for e in errors(caplog) if "not synchronised" in e] == []
        (step,) = gw.daemon.meters.ledger.clock_steps()
        assert (step.meter, step.rows, step.found) == (METER, 57, True)
        rows = gw.daemon.meters.ledger.rows(METER)
        assert len(rows) == 57 and all(r.time < now for r in rows) and all(r.accepted for r in rows)
        (told,) = [
            e
            for e in errors(caplog, logging.WARNING)
            if e.startswith("the heartbeat") and "wrong in the future" in e
        ]
        assert f"{(held - now) / DAY:.1f} days ahead" in told and "synchronised" in told
        assert "set the clock" in told, told
        gw.tick(now + 60, 60)
        assert heartbeat(state) == now + 60
    finally:
        close(gw.daemon)


def test_without_a_second_opinion_a_clock_that_runs_steadily_replaces_the_heartbeat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same station, but the kernel does not say the clock is synchronised (a gateway
    without an NTP client: its RTC was corrected by hand). At start nothing is known: nothing
    moves (an unset clock looks the same), the ERROR names the heartbeat, and one WARNING says
    in words what it may be and what to do. It does not last: once the clock has run
    `STEADY` without a step (the step NTP gives an unset clock), it is taken as right: the
    rows move, the heartbeat is written, said once; the next start finds nothing ahead."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    state = config.state_dir
    now = TR + WEEK + 3600
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, now, Kernel(False))
        try:
            assert gw.daemon.meters.ledger.clock_steps() == []
            (unset,) = [e for e in errors(caplog) if "not synchronised" in e]
            assert "behind the heartbeat" in unset
            (told,) = [
                e
                for e in errors(caplog, logging.WARNING)
                if e.startswith("the heartbeat") and "wrong in the future" in e
            ]
            assert "timedatectl set-ntp true" in told and iso(now + STEADY) in told, told
            (fault,) = [
                a["text"] for a in attention(gw.daemon.health().to_json()) if "heartbeat" in a["text"]
            ]
            assert "30.0 days behind its heartbeat" in fault and "168 h more" in fault, fault
            t = now
            while t + 3600 < now + STEADY:  # hourly ticks, the clock steady
                t += 3600
                gw.tick(t, 3600)
            assert gw.daemon.meters.ledger.clock_steps() == [] and heartbeat(state) == held
            gw.tick(now + STEADY, now + STEADY - t)
            (step,) = gw.daemon.meters.ledger.clock_steps()
            assert (step.meter, step.rows, step.found) == (METER, 57, True)
            assert heartbeat(state) == now + STEADY
            assert [a for a in attention(gw.daemon.health().to_json()) if "heartbeat" in a["text"]] == []
            taken = [e for e in errors(caplog, logging.WARNING) if "taken as right, " in e]
            assert len(taken) == 1, taken
        finally:
            close(gw.daemon)
        caplog.clear()
        gw = KernelGateway(config, now + STEADY + 600, Kernel(False))
        try:
            assert [
                e for e in errors(caplog, logging.WARNING) if "not synchronised" in e or "wrong" in e
            ] == []
        finally:
            close(gw.daemon)


def test_an_unset_clock_in_doubt_is_settled_by_ntp_and_nothing_moves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The other reading of the same start: the heartbeat was right and this clock is not set
    (a year behind). Steps reset the steady run (an unset clock is stepped, by NTP): a step
    forward to the heartbeat's time ends the doubt, nothing is moved, and the heartbeat
    follows the clock. And a clock that the kernel starts calling synchronised mid-run,
    still a month behind the heartbeat, is taken as right at the next tick."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    state = config.state_dir
    boot = held - 365 * DAY
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, boot, Kernel(False))
        try:
            gw.tick(boot + STEADY - 60, STEADY - 60)  # a steady run short of STEADY
            gw.tick(boot + STEADY + 100_000, 60)  # a step (forward, still a year behind)
            gw.tick(boot + STEADY + 100_060 + STEADY - 120, STEADY - 120)  # not STEADY since it
            assert gw.daemon.meters.ledger.clock_steps() == [] and heartbeat(state) == held
            gw.tick(held + 120, 60)  # NTP: the heartbeat was right
            assert gw.daemon.meters.ledger.clock_steps() == [] and heartbeat(state) == held + 120
            assert [e for e in errors(caplog, logging.WARNING) if "taken as right, " in e] == []
        finally:
            close(gw.daemon)
    (tmp_path / "second").mkdir()
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path / "second")
    kernel = Kernel(None)
    now = TR + WEEK
    gw = KernelGateway(config, now, kernel)
    try:
        gw.tick(now + 60, 60)
        assert gw.daemon.meters.ledger.clock_steps() == []
        kernel.synced = True  # chrony answered
        gw.tick(now + 120, 60)
        (step,) = gw.daemon.meters.ledger.clock_steps()
        assert step.rows == 57 and heartbeat(config.state_dir) == now + 120
    finally:
        close(gw.daemon)


def test_the_heartbeat_records_the_boot_and_whether_the_kernel_said_synchronised(tmp_path: Path) -> None:
    """Version 1 still (a release before this one reads it), with three keys more: the boot's
    id, seconds since that boot, and the kernel's word at the write. A file of the last
    release (without them) is read as before."""
    kernel = Kernel(True, boot="b-1", mono=ManualClock(1234.5))
    file = ClockFile(tmp_path / CLOCK_FILE, kernel=kernel)
    file.not_before = -math.inf
    assert file.beat(TR, force=True)
    doc = json.loads((tmp_path / CLOCK_FILE).read_text(encoding="utf-8"))
    assert doc["version"] == 1 and doc["time"] == TR
    assert (doc["boot_id"], doc["since_boot"], doc["synchronised"]) == ("b-1", 1234.5, True)
    old = {"format": "station-monitor clock", "version": 1, "time": TR, "iso": iso(TR)}
    (tmp_path / CLOCK_FILE).write_text(json.dumps(old), encoding="utf-8")
    assert heartbeat(tmp_path) == TR


def test_a_kernel_that_said_synchronised_when_the_heartbeat_was_written_is_no_second_opinion(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat was written while the kernel said NTP kept the clock synchronised (every
    running station with an NTP client writes it so), and at start the kernel says so again of a
    clock a month behind it. Two NTP answers a month apart: one source was wrong, or the clock
    now is being slewed, not stepped, towards the time (chrony without `makestep` says
    synchronised while it slews a large offset at 0.5 ms/s). The kernel cannot tell which of
    its own two answers was right. Before, its word now moved the meter's 57 rows a month back
    at start (and again mid-run, `settle`); now the clock is in doubt, as with no second
    opinion: nothing moves, the WARNING says both answers, and the doubt ends as it does there."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    state = config.state_dir
    file = ClockFile(state / CLOCK_FILE, kernel=Kernel(True, boot="boot-before"))
    file.not_before = -math.inf
    assert file.beat(held, force=True)
    now = TR + WEEK + 3600
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, now, Kernel(True))
        try:
            assert gw.daemon.meters.ledger.clock_steps() == []
            (told,) = [e for e in errors(caplog, logging.WARNING) if e.startswith("the heartbeat")]
            assert "said so too when the heartbeat was written" in told, told
            assert "timedatectl set-ntp true" not in told and iso(now + STEADY) in told, told
            gw.tick(now + 60, 60)
            assert gw.daemon.meters.ledger.clock_steps() == [] and heartbeat(state) == held
            assert [e for e in errors(caplog, logging.WARNING) if "taken as right, " in e] == []
            (fault,) = [
                a["text"] for a in attention(gw.daemon.health().to_json()) if "heartbeat" in a["text"]
            ]
            assert "30.0 days behind its heartbeat" in fault and "chronyc tracking" in fault, fault
            assert "make the kernel say" not in fault, fault  # it says so already
            assert gw.daemon.health().to_json()["clock"]["ntp_disagrees"] is True  # type: ignore[index]
        finally:
            close(gw.daemon)


def test_a_reload_in_doubt_goes_on_counting_the_steady_days(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reload (SIGHUP: `monitor run` starts a new daemon in the same process, on the same
    monotonic clock) 6 days into the 7 steady days. Before, the new daemon judged its start
    afresh and counted 7 days again: a config pushed every few days (a reload each time) left
    the clock in doubt for ever, the meter's readings alarming and billed nothing. Now the
    daemon it replaces hands its steady run over (`serve` passes it): the clock is taken as
    right a day after the reload, and the WARNING names that date."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    kernel = Kernel(False)
    gw = KernelGateway(config, now, kernel)
    try:
        gw.tick(now + 6 * DAY, 6 * DAY)
        assert gw.daemon.meters.ledger.clock_steps() == []
        since = gw.daemon.clock_file.steady_since
    finally:
        close(gw.daemon)
    caplog.clear()
    kernel.mono.advance(5)  # the old daemon's clean stop, the new one's start
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, now + 6 * DAY + 5, kernel, steady_since=since)
    try:
        (told,) = [e for e in errors(caplog, logging.WARNING) if e.startswith("the heartbeat")]
        assert iso(now + STEADY) in told, told
        gw.tick(now + STEADY + 5, DAY)
        (step,) = gw.daemon.meters.ledger.clock_steps()
        assert step.rows == 57
    finally:
        close(gw.daemon)


_SPAWNED: list[str] = []


def _count_spawns(event: str, args: tuple[object, ...]) -> None:
    if event in {"subprocess.Popen", "os.posix_spawn", "os.fork"}:
        _SPAWNED.append(event)


def test_asking_the_real_kernel_each_tick_starts_no_process() -> None:
    """While the clock is in doubt the daemon asks the kernel at every tick (each second, for up
    to 7 days), and at each heartbeat write. Before, each question looked libc up again
    (`ctypes.util.find_library` runs `ldconfig -p`): a process started every second in the
    event loop, 4.6 ms a question here. The real kernel, counted by the interpreter's own
    audit events (a hook cannot be removed: it only counts into a list read here)."""
    kernel = KernelClock()
    kernel.synchronised()
    sys.addaudithook(_count_spawns)
    _SPAWNED.clear()
    for _ in range(20):
        kernel.synchronised()
    assert _SPAWNED == []


def test_killed_after_the_move_before_the_heartbeat_nothing_moves_twice(tmp_path: Path) -> None:
    """kill -9 after the start moved the 57 rows (one committed transaction) and before the
    first tick wrote the heartbeat: the next start finds the heartbeat still a month ahead. With
    the kernel synchronised again, or not (the clock in doubt again), nothing moves twice: the
    rows are below the clock now, and a move takes only rows ahead of it."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    now = TR + WEEK + 3600
    gw = KernelGateway(config, now, Kernel(True))
    try:
        rows = gw.daemon.meters.ledger.rows(METER)
    finally:
        close(gw.daemon)  # no clean stop: the heartbeat is not written
    assert heartbeat(config.state_dir) == held
    for synced in (True, False):
        gw = KernelGateway(config, now + 600, Kernel(synced))
        try:
            assert len(gw.daemon.meters.ledger.clock_steps()) == 1
            assert gw.daemon.meters.ledger.rows(METER) == rows
        finally:
            close(gw.daemon)


@pytest.mark.parametrize("key", ["time", "since_boot"])
def test_a_heartbeat_holding_an_integer_too_large_for_a_float_does_not_stop_the_daemon(
    tmp_path: Path, key: str
) -> None:
    """A damaged or hand-edited heartbeat whose `time` or `since_boot` is a 400-digit integer
    (valid JSON): `math.isfinite` of it raised OverflowError in the daemon's constructor, every
    start died and systemd restarted it into the same death (the station unwatched). Now such a
    time is damage (taken as missing, said), such a `since_boot` is not read (the time is)."""
    path = meter_station(tmp_path)
    config = load_config(path)
    config.state_dir.mkdir(parents=True)
    doc = {"format": "station-monitor clock", "version": 1, "time": TR, "boot_id": "b", "since_boot": 1.0}
    doc[key] = 10**400
    (config.state_dir / CLOCK_FILE).write_text(json.dumps(doc), encoding="utf-8")
    gw = KernelGateway(config, TR + 60, Kernel(False))
    try:
        file = gw.daemon.clock_file
        if key == "time":
            assert file.held is None and file.problem is not None and "damaged" in file.problem
        else:
            assert file.held == TR and file.problem is None and file.boot == ("b", None)
    finally:
        close(gw.daemon)


def test_a_clock_before_the_release_is_never_taken_as_right_by_steady_days(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway reading 1970 (no battery-backed clock, no NTP) behind its heartbeat: unset
    whatever else is known (`RELEASE_FLOOR`). Before, it was also 'in doubt': the console
    counted down 168 h to taking it as right ('if `date -u` is right'), and after 7 steady
    days a WARNING said 1970 was taken as right and the rows moved (they did not: the floor
    kept them). Now it is not in doubt: no countdown, no such WARNING, nothing moved."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    boot = 1000.0
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, boot, Kernel(False))
        try:
            assert [a for a in attention(gw.daemon.health().to_json()) if "heartbeat" in a["text"]] == []
            gw.tick(boot + STEADY + 60, STEADY + 60)
            assert gw.daemon.meters.ledger.clock_steps() == [] and heartbeat(config.state_dir) == held
            assert [e for e in errors(caplog, logging.WARNING) if "taken as right" in e] == []
        finally:
            close(gw.daemon)


def test_a_suspend_is_no_steady_run_for_an_unset_clock_in_doubt(tmp_path: Path) -> None:
    """The heartbeat was right and this clock is not (40 days behind, after the release's date:
    nothing says which is right); the gateway is suspended for more than `STEADY` before NTP
    could answer. The clock watch measures steps on CLOCK_BOOTTIME, which counts the suspend;
    had the steady run been on it too, the clock was taken as right at resume, the meter's rows
    moved back 40 days and the heartbeat overwritten, a minute before NTP stepped the clock.
    The steady run is on the awake clock (`ClockWatch.awake`), which stops: NTP's step ends the
    doubt, nothing moved. A suspend cannot be made on demand: both clocks are injected."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    state = config.state_dir
    boot = held - 40 * DAY
    kernel = Kernel(False)
    wall, asleep_too = ManualClock(boot), ManualClock(kernel.mono.now())
    daemon = Daemon(config, wall, kernel=kernel)
    daemon.watch_clock(
        ClockWatch(daemon.engine, wall=wall.now, monotonic=asleep_too.now, awake=kernel.mono.now)
    )
    try:
        wall.advance(60)
        asleep_too.advance(60)
        kernel.mono.advance(60)
        daemon.tick()
        wall.advance(STEADY + DAY)  # suspended: the wall clock and CLOCK_BOOTTIME move on at resume
        asleep_too.advance(STEADY + DAY)
        daemon.tick()
        assert daemon.meters.ledger.clock_steps() == [] and heartbeat(state) == held
        wall.set(held + 120)  # NTP, a minute after resume: the heartbeat was right
        asleep_too.advance(60)
        kernel.mono.advance(60)
        daemon.tick()
        assert daemon.meters.ledger.clock_steps() == [] and heartbeat(state) == held + 120
    finally:
        close(daemon)


def test_metrics_show_a_clock_in_doubt_as_health_does(tmp_path: Path) -> None:
    """/api/health had `clock.heartbeat_ahead` and `clock.steady_left` and /metrics did not: a
    keeper alerting from Prometheus never learnt that a gateway's clock was taken for unset
    (meter readings not billed) until the 7 days ran out. Served as `monitor run` serves it (a
    real GET on a real port): the heartbeat a month ahead, 7 days less an hour of awake time
    left after an hour's ticks, the meter's 57 readings ahead of it kept (/metrics had no gauge
    of them); 0 for all once the kernel says the clock is synchronised."""
    config, held = a_week_on_a_clock_a_month_ahead(tmp_path)
    port = free_port()
    console = config.console.model_copy(update={"enabled": True, "port": port})
    # No outbox: its SQLite connection is this thread's, and `served` answers on another.
    config = config.model_copy(update={"console": console, "influx": None})
    now = TR + WEEK
    kernel = Kernel(False)
    gw = KernelGateway(config, now, kernel)
    try:
        with served(gw.daemon):
            gw.tick(now + 3600, 3600)
            got = clock_gauges(get(f"http://127.0.0.1:{port}/metrics"))
            assert got == (held - now - 3600, STEADY - 3600, 57.0, 1.0)
            health = json.loads(get(f"http://127.0.0.1:{port}/api/health"))
            assert health["clock"]["heartbeat_ahead"] == held - now - 3600
            assert health["clock"]["steady_left"] == STEADY - 3600
            kernel.synced = True  # chrony answered
            gw.tick(now + 3660, 60)
            assert clock_gauges(get(f"http://127.0.0.1:{port}/metrics")) == (0.0, 0.0, 0.0, 0.0)
    finally:
        close(gw.daemon)


def clock_gauges(text: str) -> tuple[float, float, float, float]:
    """The heartbeat-ahead, steady-left, meter-rows-ahead and meters-ahead gauges of a /metrics
    text, as Prometheus parses it."""
    got = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels == {"station": "ps-meter-step"}
    }
    return (
        got["station_monitor_clock_heartbeat_ahead_seconds"],
        got["station_monitor_clock_steady_left_seconds"],
        got["station_monitor_clock_meter_rows_ahead"],
        got["station_monitor_clock_meters_ahead"],
    )
