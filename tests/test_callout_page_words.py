"""What a page says of time, read by a person woken at 3 a.m.: no wrong day from an unset
gateway clock, and a link lifetime in words ("24 h", not "1d 0h"). Real SMTP (aiosmtpd with
STARTTLS and a login), as tests/test_callout.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from monitor.callout.message import flood_message, lasting
from monitor.config import build_config
from monitor.model import Alarm, AlarmState, ConditionState, Priority, Rule
from tests.mqtt_tools import make_ca
from tests.smtp import MailServer
from tests.test_callout import ALICE, BOB, TR, YEAR, Station, ph, raw_config, write_heartbeat


@pytest.fixture
def smtp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MailServer]:
    """A real SMTP server with STARTTLS and a login, as tests/test_callout.py's."""
    certs = make_ca(tmp_path / "ca")
    monkeypatch.setenv("CALLOUT_SMTP_PASSWORD", "mail-pw")
    monkeypatch.setenv("CALLOUT_LINK_SECRET", "link-secret-for-tests")
    monkeypatch.setenv("CALLOUT_CA", str(certs["ca"]))
    with MailServer(users={"monitor": "mail-pw"}, certs=certs) as server:
        yield server


@pytest.mark.parametrize("clock", ["set", "unset"])
def test_a_page_names_a_day_only_on_a_set_clock_and_a_day_long_link_reads_24_h(
    tmp_path: Path, smtp: MailServer, clock: str
) -> None:
    """The pH alarm, active 12 minutes before its page, pages Alice with a link valid 24 h.
    On a set clock the page says since when (the station's local time) and until when the link
    works. On a clock a year behind its heartbeat (not set: no battery-backed clock, NTP not
    answered) it said "since 2026-01-15 ..." (a day of last year) and "for 1d 0h"; now it says
    how long the alarm has been on, that the clock is not set, and "for 24 h"."""
    raw = raw_config(tmp_path, smtp.port)
    raw["notify"]["link_ttl"] = "24h"
    config = build_config(raw)
    write_heartbeat(config.state_dir, TR - 60)
    now = TR if clock == "set" else TR - YEAR

    async def go() -> None:
        st = Station(config, now)
        try:
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, now - 720))
            assert await st.tick(now + 1, 1) == 1
            [page] = smtp.to(ALICE)
            body = page.body
            if clock == "set":
                assert "since 2027-01-15 02:48 EST" in body, body
                assert "(once, until 2027-01-16 03:00 EST)" in body, body
            else:
                assert "since" not in body and "2026-01" not in body, body
                assert "in alarm for 12 min (the gateway clock is not set)" in body, body
                assert "(once, for 24 h)" in body, body
        finally:
            await st.close()

    asyncio.run(go())


def test_a_page_after_ntp_set_the_clock_names_no_day_of_the_unset_clock(
    tmp_path: Path, smtp: MailServer
) -> None:
    """The pH alarm activates on a clock a year behind its heartbeat (not set) and Alice is
    paged at once ("in alarm for 0 s"); 5 minutes later NTP steps the clock to the real time,
    and Bob's step 15 minutes after the alarm pages him on the set clock. The alarm's start is
    still the unset clock's (the journal is not rewritten by a step): Bob's page said "since
    2026-01-15 ...", a day of last year, the wrong day the unset-clock wording was made to
    avoid. Now it says the alarm began before the clock was set, and names no day."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    write_heartbeat(config.state_dir, TR - 60)
    unset = TR - YEAR

    async def go() -> None:
        st = Station(config, unset)
        try:
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, unset))
            assert await st.tick(unset + 1, 1) == 1
            [first] = smtp.to(ALICE)
            assert "in alarm for 0 s (the gateway clock is not set)" in first.body, first.body
            await st.tick(TR + 300, 299)  # NTP: the clock is set
            assert await st.tick(TR + 901, 601) == 1
            [page] = smtp.to(BOB)
            assert "2026" not in page.body, page.body  # "since 2026-01-15 03:00 EST"
            assert "in alarm since before the gateway clock was set" in page.body, page.body
            assert "(once, until 2027-01-15 04:15 EST)" in page.body, page.body
        finally:
            await st.close()

    asyncio.run(go())


@pytest.mark.parametrize("stop", ["clean", "kill"])
def test_a_page_after_ntp_set_the_clock_and_a_restart_names_no_day_of_the_unset_clock(
    tmp_path: Path, smtp: MailServer, stop: str
) -> None:
    """As above, but the daemon restarts (its stop, or kill -9) a minute after NTP set the
    clock, before Bob's step. The note that the alarm began on the unset clock was kept in
    memory only: after the restart Bob's page said "since 2026-01-15 03:00 EST" again, a day
    of last year. Now it is kept in the callout store. An alarm that begins after the restart,
    on the set clock, still says since when."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    write_heartbeat(config.state_dir, TR - 60)
    unset = TR - YEAR

    async def go() -> None:
        st = Station(config, unset)
        try:
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, unset))
            assert await st.tick(unset + 1, 1) == 1
            await st.tick(TR + 300, 299)  # NTP: the clock is set
        finally:
            await st.stop(stop)
        st = Station(config, TR + 360)
        try:
            assert await st.tick(TR + 901, 541) == 1
            [page] = smtp.to(BOB)
            assert "2026" not in page.body, page.body  # "since 2026-01-15 03:00 EST"
            assert "in alarm since before the gateway clock was set" in page.body, page.body
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, TR + 1000, 9.8, Rule.HIGH))
            assert await st.tick(TR + 1001, 100) == 1
            pages = smtp.to(ALICE)
            assert len(pages) == 2 and "since 2027-01-15 03:16 EST" in pages[1].body, pages[1].body
        finally:
            await st.close()

    asyncio.run(go())


def test_a_page_after_ntp_set_the_clock_while_the_daemon_was_stopped_names_no_day_of_the_unset_clock(
    tmp_path: Path, smtp: MailServer
) -> None:
    """The pH alarm activates on a clock a year behind its heartbeat (not set) and Alice is
    paged; the daemon stops, NTP sets the clock while it is down, and it starts on the set
    clock: no step is seen in any run. Bob's step, overdue, pages him at the first tick: it
    said "since 2026-01-15 03:00 EST", a day of last year; now it says the alarm began before
    the clock was set."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    write_heartbeat(config.state_dir, TR - 60)
    unset = TR - YEAR

    async def go() -> None:
        st = Station(config, unset)
        try:
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, unset))
            assert await st.tick(unset + 1, 1) == 1
            await st.tick(unset + 60, 59)
        finally:
            await st.close()
        st = Station(config, TR + 1200)
        try:
            await st.tick(TR + 1201, 1)
            [page] = smtp.to(BOB)
            assert "2026" not in page.body, page.body  # "since 2026-01-15 03:00 EST"
            assert "in alarm since before the gateway clock was set" in page.body, page.body
        finally:
            await st.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    "damage",
    [
        "not json",
        '{"a": 1}',
        "[[1, 2, 3]]",
        "[[5, 1]]",
        '[["nan", 1]]',
        "[" * 100_000,
        f"[[1{'0' * 400}, 1]]",
    ],
)
def test_a_damaged_note_of_unset_clock_starts_is_forgotten_with_a_warning_not_a_failed_start(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The callout store's note of alarm starts on an unset clock (`meta`, no schema change:
    the version stays 1 and the last release opens the file) damaged by hand or a bad disk:
    forgotten with one warning naming it (pages name the start's day, as before the note),
    and written again at the next such start. JSON nested past the parser's depth too, and an
    integer too large for a float (OverflowError, no ValueError: the daemon did not start)."""
    from monitor.callout.store import SCHEMA_VERSION, CalloutStore
    from monitor.callout.unset_starts import KEY, UnsetStarts

    store = CalloutStore(tmp_path / "callout.sqlite")
    try:
        store.keep_note(KEY, damage)
        starts = UnsetStarts(store)
        assert starts.spans == [] and not starts.unset(TR - YEAR)
        assert [r.levelname for r in caplog.records if KEY in r.getMessage()] == ["WARNING"]
        starts.began(TR - YEAR)
        starts.began(TR - YEAR + 60)
        starts.clock_set()
        assert UnsetStarts(store).spans == [(TR - YEAR, TR - YEAR + 60)]
        assert store.note("schema") == str(SCHEMA_VERSION) == "1"
    finally:
        store.close()


def test_a_flood_page_on_an_unset_clock_names_no_day() -> None:
    """A flood summary said "unacknowledged at <time>" of the unset clock: a wrong day."""
    alarm = Alarm("outfall.ph", Rule.LOW, AlarmState.UNACK, Priority.HIGH, 3.2, 5.0, "§139-15 C(3)")
    _subject, text = flood_message(
        [alarm] * 12, "PS 1", ZoneInfo("UTC"), TR - YEAR, "L", None, 3600.0, clock_set=False
    )
    assert "2026" not in text and "unacknowledged now" in text, text
    _subject, text = flood_message([alarm] * 12, "PS 1", ZoneInfo("UTC"), TR, "L", TR + 3600, None)
    assert "unacknowledged at 2027-01-15 08:00 UTC" in text, text


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(42, "42 s"), (600, "10 min"), (3600, "1 h"), (5400, "1 h 30 min"), (86_400, "24 h"),
     (172_800, "2 days"), (3 * 86_400 + 7200, "3 days 2 h")],
)  # fmt: skip
def test_lasting_reads_as_a_person_says_it(seconds: float, words: str) -> None:
    assert lasting(seconds) == words


def test_a_page_after_a_clock_in_doubt_is_taken_as_right_names_the_day_the_alarm_began(
    tmp_path: Path, smtp: MailServer
) -> None:
    """The heartbeat was written by a clock a month wrong in the future; the gateway starts on
    the right clock, so it is in doubt (judged not set) and the pH alarm that begins an hour
    later is noted as begun on an unset clock. The clock runs a week without a step and is
    taken as right (`ClockFile.settle`): that alarm's start was the right clock's all along.
    Bob's step, after the settle, said "in alarm since before the gateway clock was set (since
    when is not known)" of an alarm whose start is known, and would for every page of it (and
    after a restart). Now the starts of the steady run taken as right are forgotten: it says
    since when."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    write_heartbeat(config.state_dir, TR + 30 * 86400.0)
    week = 7 * 86400.0

    async def go() -> None:
        st = Station(config, TR)
        try:
            assert await st.tick(TR + 3600, 3600) == 0
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, TR + 3600))
            assert await st.tick(TR + 3601, 1) == 1
            [first] = smtp.to(ALICE)
            assert "in alarm for 0 s (the gateway clock is not set)" in first.body, first.body
            assert await st.tick(TR + week + 3600, week - 1) == 1  # taken as right, Bob's step
            [page] = smtp.to(BOB)
            assert "since 2027-01-15 04:00 EST" in page.body, page.body
        finally:
            await st.close()
        st = Station(config, TR + week + 4000)  # and after a restart
        try:
            assert not st.callout.unset_starts.unset(TR + 3600)
        finally:
            await st.close()

    asyncio.run(go())


@pytest.mark.parametrize("stop", ["clean", "kill"])
def test_a_page_after_a_reboot_onto_an_unset_clock_again_tells_no_length_the_clock_cannot_know(
    tmp_path: Path, smtp: MailServer, stop: str
) -> None:
    """The pH alarm begins on a clock a year behind its heartbeat (not set) and Alice is paged;
    10 minutes later the gateway reboots, and its clock (no battery-backed clock) reads what it
    read at the last boot again. Bob's step comes after the 15 minutes it waited (5 in this
    run): his page said "in alarm for 5 min", this clock's now less the start the last run's
    unset clock stamped, to a person deciding how urgent it is when it had been on for 15 min
    and a reboot. An alarm that began in an earlier run on an unset clock has no length on
    this one: "since when is not known". One that begins in this run still says how long."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    write_heartbeat(config.state_dir, TR - 60)
    unset = TR - YEAR

    async def go() -> None:
        st = Station(config, unset)
        try:
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, unset))
            assert await st.tick(unset + 1, 1) == 1
            for k in range(2, 601):
                assert await st.tick(unset + k, 1) == 0
        finally:
            await st.stop(stop)
        st = Station(config, unset)  # the RTC reset: the same reading as the last boot
        paged = 0
        try:
            for k in range(1, 400):
                paged += await st.tick(unset + k, 1)
                if paged:
                    break
            [page] = smtp.to(BOB)
            assert "in alarm for" not in page.body, page.body  # "in alarm for 5 min"
            assert "in alarm (the gateway clock is not set: since when is not known)" in page.body, page.body
            assert await st.tick(unset + k + 60, 60) == 0
            st.daemon.alarms.apply(ph(ConditionState.ACTIVE, unset + k + 60, 9.8, Rule.HIGH))
            assert await st.tick(unset + k + 61, 1) == 1
            pages = smtp.to(ALICE)
            assert len(pages) == 2 and "in alarm for 0 s (the gateway clock is not set)" in pages[1].body
        finally:
            await st.close()

    asyncio.run(go())
