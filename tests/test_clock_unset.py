"""At start: a gateway clock not set yet, or one meter's bogus far-future stamps?

A meter's rows more than a day ahead of the clock at start are one or the other, and the
ledger alone cannot tell. Before, more than one such row was always taken for an unset clock:
two bad stamps of one meter (a typo in an ingested file) were left where they were, the meter's
real readings alarmed `backwards` and the quarter billed short until an operator corrected
them. Now the station's own record of time decides (`monitor.clockfile`, the heartbeat
`state_dir/clock.json`, and the engine checkpoint, the alarm journal, the other meters): a
clock more than a day behind it is unset (nothing moves, the ERROR names the evidence), a
clock not behind the heartbeat is set (the rows ahead are bad stamps, moved). Without a
heartbeat (a first start, a damaged or unwritable file) the old rule stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from monitor.alarms.journal import Entry, Journal
from monitor.clockfile import CLOCK_FILE, ClockFile
from monitor.config import Config, load_config
from monitor.daemon import Daemon
from monitor.engine import ClockWatch
from monitor.kernelclock import KernelClock
from monitor.meters.ledger import Ledger
from monitor.meters.periods import quarter
from monitor.meters.totalizer import MeterSpec
from monitor.model import Condition, ConditionState, ManualClock, Rule
from tests.cli import run_monitor
from tests.conftest import fill_disk
from tests.daemon_process import ROOT, running_daemon
from tests.services import wait_until
from tests.test_alarm_notify import Receiver
from tests.test_meter_clock_step import METER, SPEC, meter_station, snapshot
from tests.test_pipeline import close

HOME = "home.meter"
HOME_SPEC = MeterSpec(HOME, "ft3", 6, Decimal(1), None, "home")
DAY = 86_400.0
YEAR = 365 * DAY
TR = 1_800_000_000.0  # 2027-01-15: the real time of the in-process gateways (after the release floor)


def two_meter_station(tmp_path: Path) -> Path:
    """`meter_station` with a second meter, on its own account."""
    path = meter_station(tmp_path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["sensors"].append(
        {"id": HOME, "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "home"}
    )
    raw["billing"]["accounts"].append({"id": "home", "class": "residential"})
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def rows_of(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """The ledger's tables but `unsent` (the daemon hands the marked points to the outbox)."""
    return {t: rows for t, rows in snapshot(path).items() if t != "unsent"}


def one_reading_station(tmp_path: Path) -> tuple[Path, Path]:
    """The meter station's config and state dir with one reading in its ledger, a day before
    the release (`TR`): the single row a clock's step is judged by (config path, state)."""
    path = meter_station(tmp_path)
    state = load_config(path).state_dir
    state.mkdir(parents=True)
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=TR - DAY)
    ledger.add_many([(METER, TR - DAY, Decimal(5))])
    ledger.close()
    return path, state


def heartbeat(state: Path) -> float | None:
    """The time the heartbeat file holds, as the next start reads it."""
    return ClockFile(state / CLOCK_FILE).held


def write_heartbeat(state: Path, t: float) -> None:
    """The heartbeat as a daemon on a clock reading `t` writes it."""
    state.mkdir(parents=True, exist_ok=True)
    clock = ClockFile(state / CLOCK_FILE)
    clock.not_before = -float("inf")
    assert clock.beat(t, force=True)


class Gateway:
    """A daemon on injected clocks with the clock watch (as `monitor run` has on the real one)."""

    def __init__(self, config: Config, wall: float) -> None:
        self.wall, self.mono = ManualClock(wall), ManualClock(1000.0)
        self.daemon = Daemon(config, self.wall)
        self.daemon.watch_clock(ClockWatch(self.daemon.engine, wall=self.wall.now, monotonic=self.mono.now))

    def tick(self, wall: float, elapsed: float) -> None:
        """The clock reads `wall` after `elapsed` real (monotonic) seconds more."""
        self.wall.set(wall)
        self.mono.advance(elapsed)
        self.daemon.tick()


def export_rows(path: Path, q: str) -> dict[str, dict[str, str]]:
    got = run_monitor("billing", "export", "--config", str(path), "--quarter", q, "--out", "-")
    assert got.returncode == 0, got.stderr
    return {row["account"]: row for row in csv.DictReader(io.StringIO(got.stdout))}


def errors(caplog: pytest.LogCaptureFixture, level: int = logging.ERROR) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_two_far_future_readings_of_one_meter_are_moved_when_the_clock_agrees_with_the_heartbeat(
    tmp_path: Path,
) -> None:
    """Two real `monitor run`s on the real clock, a two-meter station. The first writes the
    heartbeat (at its clean stop at the latest); then two readings of one meter are stamped
    five years ahead (an ingested file's typo). The second start finds them: the clock is not
    behind the heartbeat, so they are bad stamps, moved below now (audited found at start),
    and the other meter is untouched. The clerk's export bills 100 -> 161 (61 ft3). Before,
    two rows ahead were taken for an unset clock: not moved, the quarter billed 59 ft3."""
    path = two_meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    state.mkdir(parents=True)
    now0 = time.time()
    day = datetime.fromtimestamp(now0, UTC)
    q = f"{day.year}Q{(day.month - 1) // 3 + 1}"
    start = max(now0 - 3600, quarter(q).start.timestamp() + 1)
    gap = (now0 - 120 - start) / 59
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC, HOME: HOME_SPEC}, now=start)
    ledger.add_many([(m, start + gap * i, Decimal(100 + i)) for m in (METER, HOME) for i in range(60)])
    ledger.close()
    log = tmp_path / "daemon.log"
    with running_daemon(path, log) as daemon:
        wait_until(lambda: " running: " in log.read_text(), timeout=60, what="the first start")
        daemon.stop()
    held = heartbeat(state)
    assert held is not None and now0 <= held <= time.time()

    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC, HOME: HOME_SPEC})
    bogus = time.time() + 5 * YEAR
    ledger.add_many([(METER, bogus, Decimal(160)), (METER, bogus + 60, Decimal(161))])
    ledger.close()
    before = snapshot(state / "ledger.sqlite")
    with running_daemon(path, log) as daemon:
        wait_until(lambda: log.read_text().count(" running: ") == 2, timeout=60, what="the second start")
        daemon.stop()
    second = log.read_text().split(" running: ")[1]
    assert "bad stamps" in second and "found at start" in second
    assert "not synchronised" not in log.read_text()
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC, HOME: HOME_SPEC})
    try:
        (step,) = ledger.clock_steps()
        assert (step.meter, step.rows, step.found) == (METER, 2, True)
        rows = ledger.rows(METER)
        assert [float(r.reading) for r in rows] == [100.0 + i for i in range(62)]
        assert all(r.accepted for r in rows) and all(r.time < time.time() for r in rows)
    finally:
        ledger.close()
    after = snapshot(state / "ledger.sqlite")
    assert [r for r in after["readings"] if r[0] == HOME] == [r for r in before["readings"] if r[0] == HOME]
    got = export_rows(path, q)
    assert got["shop"]["consumption_ft3"] == "61.000", got["shop"]
    assert got["home"]["consumption_ft3"] == "59.000", got["home"]


def test_monitor_run_on_a_clock_a_year_behind_the_heartbeat_moves_nothing_and_keeps_the_heartbeat(
    tmp_path: Path,
) -> None:
    """A real `monitor run` on a one-meter station whose records (61 readings, the heartbeat)
    are a year ahead of the real clock: the clock is a year behind the station, as an unset
    one is. Nothing moves, the ERROR names the heartbeat it was judged by, and the unset
    clock's time is not written over the heartbeat (not while running, not at the clean
    stop): the next start before NTP still knows. Before, the ERROR could name no evidence.
    On a host whose kernel says the clock is synchronised, the heartbeat is the wrong one."""
    path = meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    ahead = time.time() + YEAR
    write_heartbeat(state, ahead + 3600)
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=ahead)
    ledger.add_many([(METER, ahead + 60 * i, Decimal(100 + i)) for i in range(61)])
    ledger.close()
    before = rows_of(state / "ledger.sqlite")
    log = tmp_path / "daemon.log"
    with running_daemon(path, log) as daemon:
        wait_until(lambda: " running: " in log.read_text(), timeout=60, what="the daemon's start")
        text = daemon.stop()
    if KernelClock().synchronised():
        # This host's NTP client keeps the real clock synchronised, and the kernel says so: the
        # heartbeat a year ahead is the one that is wrong (tests/test_clock_heartbeat.py).
        assert "was wrong in the future" in text and "found at start" in text, text[-3000:]
        return
    said = [line for line in text.splitlines() if "not synchronised" in line]
    assert len(said) == 1 and "61 reading(s)" in said[0] and "behind the heartbeat" in said[0], said
    assert "found at start" not in text
    assert rows_of(state / "ledger.sqlite") == before
    assert heartbeat(state) == ahead + 3600


def test_an_unset_clock_moves_not_even_a_single_row_and_the_heartbeat_follows_ntp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway boots a year behind (no battery-backed clock), the heartbeat says the
    station ran a minute before the real time TR. One meter has 61 readings ahead, the other
    one reading (installed the day before). Neither moves: before, the one-row meter was
    taken for a bad stamp and moved a year back (its reading then billed in last year's
    quarter). The unset clock writes no heartbeat; NTP steps it forward, and the next tick
    writes the real time."""
    path = two_meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    write_heartbeat(state, TR - 60)
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC, HOME: HOME_SPEC}, now=TR - 2 * DAY)
    ledger.add_many([(METER, TR - 3600 + 50 * i, Decimal(100 + i)) for i in range(61)])
    ledger.add_many([(HOME, TR - DAY, Decimal(5))])
    ledger.close()
    before = rows_of(state / "ledger.sqlite")
    boot = TR - YEAR
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, boot)
    try:
        assert rows_of(state / "ledger.sqlite") == before
        said = [e for e in errors(caplog) if "not synchronised" in e]
        assert len(said) == 2 and all("behind the heartbeat" in e for e in said), said
        for k in range(1, 4):  # three minutes on the unset clock
            gw.tick(boot + 60 * k, 60)
        assert heartbeat(state) == TR - 60
        gw.tick(TR + 240, 10)  # NTP: the clock steps forward to the real time
        assert heartbeat(state) == TR + 240
        gw.tick(TR + 270, 30)  # at most once a minute
        assert heartbeat(state) == TR + 240
        gw.tick(TR + 300, 30)
        assert heartbeat(state) == TR + 300
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("heart", ["good", "missing", "damaged", "truncated"])
def test_without_a_heartbeat_the_old_rule_stands_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, heart: str
) -> None:
    """One meter with two readings five years ahead of a clock that is right. With the
    heartbeat (written a minute before), they are bad stamps, moved. Without one (a first
    start, a file damaged or cut short), nothing says the clock is set: two rows ahead are
    taken for an unset clock as before, nothing moves, one ERROR; a damaged file is one
    WARNING more. And the heartbeat is not written while those rows stand ahead (the clock
    may be the one that is wrong: a first boot's build date must not become "last known good")."""
    path = meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    state.mkdir(parents=True)
    file = state / CLOCK_FILE
    if heart == "good":
        write_heartbeat(state, TR - 60)
    elif heart == "damaged":
        file.write_bytes(b"\xff\x00 not json")
    elif heart == "truncated":
        write_heartbeat(state, TR - 60)
        file.write_bytes(file.read_bytes()[:25])
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=TR - 3600)
    ledger.add_many([(METER, TR - 3600 + 60 * i, Decimal(100 + i)) for i in range(59)])
    ledger.add_many([(METER, TR + 5 * YEAR, Decimal(159)), (METER, TR + 5 * YEAR + 60, Decimal(160))])
    ledger.close()
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, TR)
        try:
            for k in range(1, 6):
                gw.tick(TR + 60 * k, 60)
            rows = gw.daemon.meters.ledger.rows(METER)
            moved = gw.daemon.meters.ledger.clock_steps(METER)
        finally:
            close(gw.daemon)
    said = errors(caplog, logging.WARNING)
    unset = [e for e in said if "not synchronised" in e]
    damaged = [e for e in said if "damaged" in e]
    if heart == "good":
        assert unset == [] and len(moved) == 1 and moved[0].rows == 2
        assert all(r.time <= TR for r in rows) and all(r.accepted for r in rows)
        assert heartbeat(state) == TR + 300
        return
    assert moved == [] and [r.time for r in rows][-2:] == [TR + 5 * YEAR, TR + 5 * YEAR + 60]
    assert len(unset) == 1 and "no heartbeat" in unset[0], said
    assert len(damaged) == (0 if heart == "missing" else 1), said
    assert heartbeat(state) is None


def test_a_heartbeat_the_full_disk_refuses_is_logged_once_and_written_again_when_room(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real 3 MB tmpfs filled to its last byte while the daemon runs: each minute's write is
    refused (the old file stays whole: a temporary file and a rename), logged once, counted,
    never a crash; with room again the next minute writes, said once."""
    path = meter_station(tiny_disk)
    gw = Gateway(load_config(path), TR)
    state = tiny_disk / "state"
    try:
        gw.tick(TR + 1, 1)
        assert heartbeat(state) == TR + 1
        ballast = fill_disk(tiny_disk)
        with caplog.at_level(logging.INFO, logger="monitor.clockfile"):
            for k in range(1, 6):
                gw.tick(TR + 1 + 60 * k, 60)
            assert heartbeat(state) == TR + 1
            assert gw.daemon.clock_file.failures == 5
            refused = [
                r.getMessage() for r in caplog.records if "cannot write the heartbeat" in r.getMessage()
            ]
            assert len(refused) == 1, refused
            ballast.unlink()
            gw.tick(TR + 1 + 360, 60)
        assert heartbeat(state) == TR + 361
        again = [r.getMessage() for r in caplog.records if "written again" in r.getMessage()]
        assert len(again) == 1
        assert not (state / (CLOCK_FILE + ".tmp")).exists()
    finally:
        close(gw.daemon)


def test_the_heartbeat_survives_kill_9_whole(tmp_path: Path) -> None:
    """A real `monitor run` on the real clock writes the heartbeat within its first tick;
    killed with SIGKILL, the file is whole and says when. A temporary file a kill left
    half-written is not read."""
    path = meter_station(tmp_path)
    state = tmp_path / "state"
    log = tmp_path / "daemon.log"
    started = time.time()
    with running_daemon(path, log) as daemon:
        wait_until((state / CLOCK_FILE).exists, timeout=60, what="the heartbeat")
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(timeout=30)
    held = heartbeat(state)
    assert held is not None and started <= held <= time.time()
    doc = json.loads((state / CLOCK_FILE).read_text(encoding="utf-8"))
    assert doc["format"] == "station-monitor clock" and doc["version"] == 1
    (state / (CLOCK_FILE + ".tmp")).write_bytes(b'{"format": "station-monitor clock", "ver')
    assert heartbeat(state) == held


def test_bad_stamps_of_two_meters_and_their_journaled_alarm_do_not_outvote_the_heartbeat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One ingested file's typo put two readings of each meter five years ahead, and a meter
    alarm was journaled at one of those stamps (a meter's alarm carries its row's time). The
    clock agrees with the heartbeat: all four rows are bad stamps, moved. Counted as evidence,
    each meter's rows made the other's clock "unset", and so did the journaled alarm: nothing
    moved. A gateway-stamped journal entry still counts (the next test)."""
    path = two_meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    write_heartbeat(state, TR - 60)
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC, HOME: HOME_SPEC}, now=TR - 3600)
    for m in (METER, HOME):
        ledger.add_many([(m, TR - 3600 + 60 * i, Decimal(100 + i)) for i in range(59)])
        ledger.add_many([(m, TR + 5 * YEAR, Decimal(159)), (m, TR + 5 * YEAR + 60, Decimal(160))])
    ledger.close()
    journal = Journal(state / "journal.sqlite")
    journal.append(Entry(TR + 5 * YEAR + 60, METER, Rule.METER, "activated", "active", "high"))
    journal.close()
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, TR)
    try:
        assert [e for e in errors(caplog) if "not synchronised" in e] == []
        steps = gw.daemon.meters.ledger.clock_steps()
        assert sorted((s.meter, s.rows, s.found) for s in steps) == [(HOME, 2, True), (METER, 2, True)]
    finally:
        close(gw.daemon)


def test_a_clock_a_year_behind_the_journal_is_unset_without_a_heartbeat_even_for_one_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No heartbeat (the first start of this release), the clock a year behind the station:
    the alarm journal's last gateway-stamped entry (an operator's acknowledgement) says so.
    The meter's one reading ahead is not moved a year back as a bad stamp; the ERROR names
    the journal entry."""
    path, state = one_reading_station(tmp_path)
    config = load_config(path)
    journal = Journal(state / "journal.sqlite")
    journal.append(Entry(TR - 60, "ph", Rule.HIGH, "acknowledged", "active_acked", "high", actor="op"))
    journal.close()
    before = rows_of(state / "ledger.sqlite")
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, TR - YEAR)
    try:
        assert rows_of(state / "ledger.sqlite") == before
        (said,) = [e for e in errors(caplog) if "not synchronised" in e]
        assert "behind the alarm journal's last entry (ph," in said
        gw.tick(TR - YEAR + 60, 60)
        assert heartbeat(state) is None  # the unset clock writes none
    finally:
        close(gw.daemon)


def test_the_heartbeat_is_written_only_by_a_plausible_clock(tmp_path: Path) -> None:
    """Not before the start was judged (a test's or the demo's clock: no verdict), not before
    the release (1970, an old image's build date; a first start has no other evidence), not a
    day behind what the station held at start; then at most once a minute, or at once at a
    clean stop or a step."""
    file = ClockFile(tmp_path / CLOCK_FILE, floor=TR - DAY)
    assert not file.beat(TR) and heartbeat(tmp_path) is None  # not judged
    file.not_before = -float("inf")
    assert not file.beat(0.0) and not file.beat(TR - DAY - 1)  # 1970; before the release
    file.not_before = TR + 2 * DAY
    assert not file.beat(TR) and heartbeat(tmp_path) is None  # two days behind the station
    assert file.beat(TR + DAY) and heartbeat(tmp_path) == TR + DAY
    assert not file.beat(TR + DAY + 59) and file.beat(TR + DAY + 59, force=True)
    assert file.beat(TR + DAY + 300) and file.beat(TR + DAY + 180)  # a step back of 2 min: at once
    assert heartbeat(tmp_path) == TR + DAY + 180


def test_a_heartbeat_out_of_range_does_not_stop_the_daemon_starting(tmp_path: Path) -> None:
    """A real `monitor run` on the real clock with a heartbeat holding `1e308` (a damaged
    disk, a hand edit): a finite float, so it was taken as the station's last good time, and
    naming it in the evidence (`iso`) raised OverflowError in the daemon's constructor: every
    start died, and systemd restarted it into the same death (the station unwatched). Now it
    is a damaged heartbeat (one WARNING), the daemon runs, and its clean stop writes the time."""
    path = meter_station(tmp_path)
    state = load_config(path).state_dir
    state.mkdir(parents=True)
    doc = {"format": "station-monitor clock", "version": 1, "time": 1e308}
    (state / CLOCK_FILE).write_text(json.dumps(doc), encoding="utf-8")
    log = tmp_path / "daemon.log"
    with running_daemon(path, log) as daemon:
        wait_until(lambda: " running: " in log.read_text() or daemon.proc.poll() is not None, timeout=60,
                   what="the daemon's start")  # fmt: skip
        assert daemon.proc.poll() is None, log.read_text()[-3000:]
        text = daemon.stop()
    assert text.count("the heartbeat is damaged") == 1, text[-3000:]
    held = heartbeat(state)
    assert held is not None and held <= time.time()


@pytest.mark.parametrize("held", [0.0, -5.0, True, 1e19])
def test_a_heartbeat_before_the_release_does_not_make_a_1970_clock_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, held: object
) -> None:
    """The gateway boots at 1970 (no battery-backed clock, before NTP); the heartbeat holds a
    time no clock of this release writes (0, a negative, `true`: before the release; 1e19:
    past year 9999). Taken as the last good time, the 1970 clock was "not behind" it, so set,
    and the meter's 61 real readings were bad stamps: moved 57 years back, the whole history
    (or, for 1e19, the start died on OverflowError). Now such a file is damaged (one WARNING,
    taken as missing): the rule without a heartbeat stands, nothing moves; NTP then steps the
    clock to the real time and the next tick writes a good heartbeat over it."""
    path = meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    state.mkdir(parents=True)
    doc = {"format": "station-monitor clock", "version": 1, "time": held}
    (state / CLOCK_FILE).write_text(json.dumps(doc), encoding="utf-8")
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=TR - 3600)
    ledger.add_many([(METER, TR - 3600 + 50 * i, Decimal(100 + i)) for i in range(61)])
    ledger.close()
    before = rows_of(state / "ledger.sqlite")
    boot = 1000.0
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, boot)
    try:
        assert rows_of(state / "ledger.sqlite") == before
        said = errors(caplog, logging.WARNING)
        assert len([e for e in said if "the heartbeat is damaged" in e]) == 1, said
        (unset,) = [e for e in said if "not synchronised" in e]
        assert "before this release's date" in unset
        gw.tick(boot + 60, 60)
        assert heartbeat(state) is None  # the file stays as it was: taken as missing
        gw.tick(TR + 60, 10)  # NTP
        assert heartbeat(state) == TR + 60
    finally:
        close(gw.daemon)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_a_heartbeat_that_is_not_a_small_file_is_not_read_whole(tmp_path: Path, kind: str) -> None:
    """`clock.json` a symlink to /dev/zero, a FIFO nobody writes, a 64 MiB file: the start read
    it whole (`read_bytes`): memory until the kernel killed the daemon, or a start blocked for
    ever in open(). Read in a child process held to 1 GiB of address space (and a timeout),
    as the daemon's constructor reads it: taken as missing, with one line that says why."""
    file = tmp_path / CLOCK_FILE
    if kind == "dev-zero":
        file.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(file)
    else:
        doc = json.dumps({"format": "station-monitor clock", "version": 1, "time": TR})
        with file.open("w", encoding="utf-8") as f:
            f.write(" " * (64 << 20) + doc)
    code = (
        "import sys; from pathlib import Path; from monitor.clockfile import ClockFile; "
        "c = ClockFile(Path(sys.argv[1])); print(c.held, '|', c.problem)"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    got = subprocess.run(
        [sys.executable, "-c", code, str(file)], capture_output=True, text=True, timeout=30,
        preexec_fn=limit, cwd=ROOT,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    held, problem = got.stdout.strip().split(" | ")
    assert held == "None" and "taken as missing" in problem, got.stdout


def reminders_after_a_restart(
    tmp_path: Path, boot: float, ticks: Sequence[tuple[float, float]]
) -> list[float]:
    """An unacknowledged high-priority pH alarm raised at TR (reminders every 15 min to a real
    webhook); the daemon restarts on a clock reading `boot` and ticks at `ticks` ((gateway
    clock, real seconds since the last)): the gateway times of the reminders."""
    path = meter_station(tmp_path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    with Receiver() as hook:
        raw["alarms"] = {"renotify_interval": "15m", "webhook": {"url": hook.url}}
        path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        config = load_config(path)
        gw = Gateway(config, TR)
        try:
            gw.daemon.alarms.apply(Condition(TR, "ph", Rule.HIGH, ConditionState.ACTIVE, 9.6, 9.0, "§"))
        finally:
            close(gw.daemon)

        async def go() -> list[float]:
            gw = Gateway(config, boot)
            dispatcher = gw.daemon.dispatcher
            task = asyncio.create_task(dispatcher.run())
            reminded = []
            try:
                for wall, elapsed in ticks:
                    gw.tick(wall, elapsed)
                    await dispatcher.drain()
                    reminded += [wall] * sum(1 for b in hook.bodies if b["type"] == "reminder")
                    hook.bodies.clear()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                close(gw.daemon)
            return reminded

        return asyncio.run(go())


@pytest.mark.parametrize("down", [30.0, 7200.0])
def test_ntp_after_a_restart_on_an_unset_clock_reminds_on_the_real_schedule(
    tmp_path: Path, down: float
) -> None:
    """The gateway reboots `down` s after the alarm, a year behind. The first tick finds the
    clock behind the alarm and counts the reminder interval from itself (so an unset clock
    still reminds); a minute after the reboot NTP steps the clock forward to the real time.
    That tick's time, a year old on the new clock, made the reminder due at once: 15 min early
    after a 30 s reboot. Now the reminder is due at the earlier of that tick's time moved with
    the step and the schedule before the restart: TR + 15 min after the short reboot, at NTP
    after a 2 h power cut (overdue), then every 15 min."""
    unset = TR - YEAR  # at TR + down, real time
    ntp = TR + down + 60
    if down < 900:
        ticks = [(unset + 30, 30), (ntp, 30), (TR + 899, TR + 899 - ntp), (TR + 901, 2), (TR + 1799, 898),
                 (TR + 1802, 3)]  # fmt: skip
        assert reminders_after_a_restart(tmp_path, unset, ticks) == [TR + 901, TR + 1802]
    else:
        ticks = [(unset + 30, 30), (ntp, 30), (ntp + 899, 899), (ntp + 901, 2)]
        assert reminders_after_a_restart(tmp_path, unset, ticks) == [ntp, ntp + 901]


def test_an_ordinary_restart_keeps_the_reminder_schedule(tmp_path: Path) -> None:
    """The same alarm, the daemon restarted 2 min after it on the right clock: reminded at
    TR + 15 min and TR + 30 min, as before the unset-clock rule (892f408). (Held at review.)"""
    ticks = [(TR + 121, 1), (TR + 899, 778), (TR + 900, 1), (TR + 1799, 899), (TR + 1800, 1)]
    assert reminders_after_a_restart(tmp_path, TR + 120, ticks) == [TR + 900, TR + 1800]


def test_a_bad_ntp_step_back_of_two_days_while_running_does_not_poison_the_heartbeat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The clock is right (heartbeat a minute old at start); a bad NTP server steps it back two
    days while the daemon runs. The ledger's rows move with the step, as any step (audited,
    logged); the bad clock is more than a day behind what the station held at start, so it
    is not written to the heartbeat (said once), not at the clean stop either. The restart on
    the bad clock finds nothing ahead: nothing more moves, no "not synchronised". The right
    NTP server steps it forward, and the next tick writes the real time. (Held at review.)"""
    path = meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    write_heartbeat(state, TR - 60)
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=TR - 3600)
    ledger.add_many([(METER, TR - 3600 + 60 * i, Decimal(100 + i)) for i in range(59)])
    ledger.close()
    bad = TR - 2 * DAY
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, TR)
        try:
            gw.tick(TR + 60, 60)
            assert heartbeat(state) == TR + 60
            gw.tick(bad + 120, 60)  # the bad step back
            gw.tick(bad + 180, 60)
            (step,) = gw.daemon.meters.ledger.clock_steps()
            assert step.rows == 59 and not step.found
            gw.daemon.clock_file.beat(gw.wall.now(), force=True)  # the clean stop's write
        finally:
            close(gw.daemon)
        assert heartbeat(state) == TR + 60
        told = [r.getMessage() for r in caplog.records if "is not written to" in r.getMessage()]
        assert len(told) == 1, told
        caplog.clear()
        gw = Gateway(config, bad + 240)
        try:
            assert len(gw.daemon.meters.ledger.clock_steps()) == 1
            assert [e for e in errors(caplog) if "not synchronised" in e] == []
            gw.tick(bad + 300, 60)
            assert heartbeat(state) == TR + 60
            gw.tick(TR + 360, 60)  # the right NTP server
            assert heartbeat(state) == TR + 360
        finally:
            close(gw.daemon)


def test_a_symlink_left_as_the_heartbeats_temporary_file_is_not_written_through(tmp_path: Path) -> None:
    """`clock.json.tmp` a symlink (to the ledger, say): the write opened it and followed it,
    the ledger's bytes became the heartbeat's line, and the rename made `clock.json` itself
    the symlink. A leftover temporary file is removed and made anew, never followed."""
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "ledger.sqlite"
    victim.write_bytes(b"SQLite format 3\x00 precious")
    (state / (CLOCK_FILE + ".tmp")).symlink_to(victim)
    file = ClockFile(state / CLOCK_FILE)
    file.not_before = -float("inf")
    assert file.beat(TR, force=True)
    assert victim.read_bytes() == b"SQLite format 3\x00 precious"
    assert not (state / CLOCK_FILE).is_symlink() and heartbeat(state) == TR
    assert not (state / (CLOCK_FILE + ".tmp")).exists()
