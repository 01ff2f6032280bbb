"""Callout against a real SMTP server (aiosmtpd on loopback): escalation along a roster on an
injected clock, acknowledge links (single use, expiry, forgery), acknowledgement and return to
normal stopping it, a failing provider retried with back-off behind a diagnostic alarm, floods
as one summary per person, schedules in station local time, and the `notify:` config checks."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml
from fastapi import FastAPI

from monitor.alarms import AlarmManager
from monitor.callout import Callout
from monitor.clockfile import CLOCK_FILE, ClockFile
from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.engine import ClockWatch
from monitor.errors import ConfigError
from monitor.model import AlarmState, Condition, ConditionState, ManualClock, Rule
from monitor.web.callout import add_callout_routes
from tests.conftest import fill_disk
from tests.mqtt_tools import make_ca
from tests.smtp import MailServer
from tests.test_pipeline import close as close_daemon

# Wednesday 14 January 2026, 03:00 UTC: 22:00 on Tuesday in Barton (America/New_York, EST).
T0 = datetime(2026, 1, 14, 3, 0, tzinfo=UTC).timestamp()
TR = 1_800_000_000.0  # 2027-01-15 08:00 UTC: a real time after this release's floor
YEAR = 365 * 86400.0
UNSET = TR - YEAR  # what a gateway without a battery-backed clock reads at boot, NTP not answering
ALICE, BOB = "alice@example.org", "bob@example.org"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch, certs: dict[str, Path]) -> Iterator[MailServer]:
    monkeypatch.setenv("CALLOUT_SMTP_PASSWORD", "mail-pw")
    monkeypatch.setenv("CALLOUT_LINK_SECRET", "link-secret-for-tests")
    monkeypatch.setenv("CALLOUT_CA", str(certs["ca"]))
    with MailServer(users={"monitor": "mail-pw"}, certs=certs) as server:
        yield server


def raw_config(tmp_path: Path, smtp_port: int, **pipeline: Any) -> dict[str, Any]:
    return {
        "station": {"id": "ps-1", "name": "Barton PS 1", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "console": {"enabled": False},
        "sensors": [
            {"id": "outfall.ph", "kind": "ph", "discharger": "acme-plating"},
            {"id": "outfall.flow", "kind": "flow", "unit": "gpm"},
        ],
        "notify": {
            "channels": {
                "mail": {
                    "type": "email",
                    "host": "127.0.0.1",
                    "port": smtp_port,
                    "security": "starttls",
                    "ca_file": os.environ["CALLOUT_CA"],
                    "username": "monitor",
                    "password": "${CALLOUT_SMTP_PASSWORD}",
                    "sender": "monitor@ps-1.example",
                }
            },
            "people": {
                "alice": {"name": "Alice Smith", "contacts": {"mail": ALICE}},
                "bob": {"name": "Bob Jones", "contacts": {"mail": BOB}},
            },
            "rosters": {"operators": ["alice", "bob"]},
            "pipelines": [
                {
                    "name": "operators",
                    "roster": "operators",
                    "delay": "5s",
                    "match": {"rules": ["low", "high", "slug"]},  # not the channel's own diagnostic
                    **pipeline,
                }
            ],
            "link_base": "https://gateway.example/",
            "link_secret": "${CALLOUT_LINK_SECRET}",
            "link_ttl": "1h",
        },
    }


def ph(state: ConditionState, t: float, value: float = 3.2, rule: Rule = Rule.LOW) -> Condition:
    return Condition(t, "outfall.ph", rule, state, value, 5.0, "§139-15 C(3)")


class Rig:
    def __init__(self, config: Config, clock: ManualClock) -> None:
        self.clock = clock
        self.manager = AlarmManager.open(config, clock)
        self.callout = Callout(config, self.manager, clock)
        app = FastAPI()
        add_callout_routes(app, self.callout, None)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")

    async def step(self, seconds: float = 0.0) -> int:
        self.clock.advance(seconds)
        self.callout.tick()
        return await self.callout.deliver_due()

    async def close(self) -> None:
        await self.http.aclose()
        await self.callout.aclose()
        self.manager.close()


def escalations(rig: Rig) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], rig.callout.status()["escalations"])


def link(body: str) -> str:
    found = re.search(r"https://gateway\.example(/callout/ack/\S+)", body)
    assert found is not None, body
    return found.group(1)


def run(tmp_path: Path, smtp: MailServer, test: Any, **pipeline: Any) -> None:
    run_config(build_config(raw_config(tmp_path, smtp.port, **pipeline)), test)


def run_config(config: Config, test: Any) -> None:
    """`test(rig)` on a rig of `config` whose clock reads T0, the rig closed whatever it asserts."""

    async def go() -> None:
        rig = Rig(config, ManualClock(T0))
        try:
            await test(rig)
        finally:
            await rig.close()

    asyncio.run(go())


def test_ph_alarm_mails_alice_then_bob_after_the_delay_until_the_link_acknowledges(
    tmp_path: Path, smtp: MailServer
) -> None:
    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        assert await rig.step() == 1
        [first] = smtp.to(ALICE)
        assert first.subject == "[Barton PS 1] HIGH outfall.ph low"
        body = first.body
        for fact in (
            "Barton PS 1",
            "outfall.ph",
            "value 3.2",
            "limit 5",
            "§139-15 C(3)",
            "2026-01-13 22:00 EST",
        ):
            assert fact in body
        assert "until 2026-01-13 23:00 EST" in body  # the link's expiry, local time too
        console = (await rig.http.get("/api/callout")).json()
        assert [o["name"] for o in console["on_call"]] == ["Alice Smith"]
        [shown] = console["escalations"]
        assert shown["next"]["person"] == "bob" and shown["next"]["at_local"] == "2026-01-13 22:00 EST"
        assert shown["told"][0]["person"] == "alice" and shown["told"][0]["state"] == "sent"
        assert await rig.step(4.9) == 0 and smtp.to(BOB) == []
        assert await rig.step(0.2) == 1
        [second] = smtp.to(BOB)
        ack = link(second.body)

        page = await rig.http.get(ack)  # opening the link (or a mail scanner) does not acknowledge
        assert page.status_code == 200 and "Bob Jones" in page.text
        assert rig.manager.get("outfall.ph", Rule.LOW).state is AlarmState.UNACK  # type: ignore[union-attr]
        done = await rig.http.post(ack)
        assert done.status_code == 200, done.text
        alarm = rig.manager.get("outfall.ph", Rule.LOW)
        assert alarm is not None and alarm.state is AlarmState.ACKED and alarm.acked_by == "Bob Jones"
        [entry] = [e for e in rig.manager.journal.entries() if e.event == "acknowledged"]
        assert entry.actor == "Bob Jones" and entry.note == "acknowledged by callout link"

        again = await rig.http.post(ack)
        assert again.status_code == 410 and "used already (2026-01-13 22:00 EST)" in again.text
        assert await rig.step(3600) == 0
        assert len(smtp.mails) == 2
        [esc] = escalations(rig)
        assert esc["status"] == "acknowledged" and esc["ended_by"] == "Bob Jones"
        assert [(t["person"], t["state"]) for t in esc["told"]] == [("alice", "sent"), ("bob", "sent")]

    run(tmp_path, smtp, test, repeat=1)


def test_links_expire_and_forged_or_garbage_links_are_refused(tmp_path: Path, smtp: MailServer) -> None:
    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        await rig.step()
        ack = link(smtp.to(ALICE)[0].body)
        nonce, sig = ack.rsplit("/", 1)[1].split(".")
        forged = f"/callout/ack/{nonce}.{'A' * len(sig)}"
        for bad in (
            forged,
            "/callout/ack/nonsense",
            "/callout/ack/" + "x" * 150 + ".y",
            "/callout/ack/a.b.c",
        ):
            resp = await rig.http.post(bad)
            assert resp.status_code == 410, bad
        rig.clock.advance(3600)
        expired = await rig.http.post(ack)
        assert expired.status_code == 410 and "expired" in expired.text
        assert rig.manager.get("outfall.ph", Rule.LOW).state is AlarmState.UNACK  # type: ignore[union-attr]

    run(tmp_path, smtp, test, delay="2h")


def test_acknowledgement_elsewhere_stops_it_at_once_even_a_message_still_retrying(
    tmp_path: Path, smtp: MailServer
) -> None:
    async def test(rig: Rig) -> None:
        smtp.refuse = True
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        assert await rig.step() == 0  # the mail server says 451; the message waits for a retry
        rig.manager.acknowledge("outfall.ph", Rule.LOW, "console operator")
        smtp.refuse = False
        assert await rig.step(60) == 0
        assert smtp.mails == []
        [esc] = escalations(rig)
        assert esc["status"] == "acknowledged" and esc["told"][0]["state"] == "cancelled"

    run(tmp_path, smtp, test)


def test_return_to_normal_stops_it_when_configured(tmp_path: Path, smtp: MailServer) -> None:
    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        await rig.step()
        rig.manager.apply(ph(ConditionState.CLEARED, T0 + 1, value=7.0))
        assert await rig.step(10) == 0
        assert len(smtp.to(ALICE)) == 1 and smtp.to(BOB) == []

    run(tmp_path, smtp, test)


def test_an_ack_after_the_clear_keeps_the_return_to_normal_in_the_history(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Alice paged, the alarm returns to normal (its escalation ended by the clear), she acks
    an hour later. Before: the history read "acknowledged by Alice Smith" with the clear's
    time as its end: as if she had answered while it was active. Now it says both, in order."""

    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        await rig.step()
        rig.manager.apply(ph(ConditionState.CLEARED, T0 + 60, value=7.0))
        await rig.step(3600)
        rig.manager.acknowledge("outfall.ph", Rule.LOW, "Alice Smith")
        [esc] = escalations(rig)
        assert esc["status"] == "acknowledged after clear" and esc["ended_by"] == "Alice Smith"
        assert len(smtp.to(ALICE)) == 1 and smtp.to(BOB) == []

    run(tmp_path, smtp, test)


def test_without_stop_on_clear_it_goes_on_until_acknowledged(tmp_path: Path, smtp: MailServer) -> None:
    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        await rig.step()
        rig.manager.apply(ph(ConditionState.CLEARED, T0 + 1, value=7.0))
        assert await rig.step(10) == 1
        assert len(smtp.to(BOB)) == 1

    run(tmp_path, smtp, test, stop_on_clear=False)


def test_a_failing_provider_is_retried_with_backoff_and_raises_a_diagnostic_alarm(
    tmp_path: Path, smtp: MailServer
) -> None:
    async def test(rig: Rig) -> None:
        smtp.refuse = True
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        assert await rig.step() == 0
        diag = rig.manager.get("notify.mail", Rule.NOTIFY)
        assert diag is not None and diag.active and diag.state is AlarmState.UNACK
        assert "451" in diag.message
        assert await rig.step(4.9) == 0  # first retry after retry_initial (5 s)
        assert rig.callout.failed == 1
        assert await rig.step(0.1) == 0
        assert rig.callout.failed == 2
        assert await rig.step(9.9) == 0 and rig.callout.failed == 2  # then 10 s
        smtp.refuse = False
        assert await rig.step(0.1) == 1
        assert len(smtp.to(ALICE)) == 1
        diag = rig.manager.get("notify.mail", Rule.NOTIFY)
        assert diag is not None and not diag.active
        [esc] = escalations(rig)
        assert esc["told"][0]["attempts"] == 3 and esc["told"][0]["error"] is None

    run(tmp_path, smtp, test, delay="1h")


def test_a_flood_is_one_summary_per_person(tmp_path: Path, smtp: MailServer) -> None:
    async def test(rig: Rig) -> None:
        for i in range(12):  # EEMUA 191: more than 10 alarms in 10 minutes
            rig.manager.apply(
                Condition(T0 + i, f"wetwell.level{i}", Rule.HIGH, ConditionState.ACTIVE, 9.0, 8.0, "site")
            )
        assert await rig.step() == 1
        [summary] = smtp.to(ALICE)
        assert "ALARM FLOOD: 12 alarms" in summary.subject
        assert "wetwell.level9 " in summary.body and "and 2 more" in summary.body
        assert await rig.step(5) == 1
        [bob] = smtp.to(BOB)
        assert "ALARM FLOOD" in bob.subject
        done = await rig.http.post(link(bob.body))
        assert done.status_code == 200
        assert all(a.acked_by == "Bob Jones" for a in rig.manager.alarms())
        assert await rig.step(3600) == 0
        assert len(smtp.mails) == 2

    run(tmp_path, smtp, test, repeat=3)


def test_a_continuation_in_a_flood_stays_in_the_summary(tmp_path: Path, smtp: MailServer) -> None:
    """A wet-well alarm among twelve (a flood: one summary per person, Alice's now, Bob's in
    an hour) clears and comes back as the continuation of its event (a float bouncing at the
    crest). Before: the continuation resumed its folded escalation on its own, due at once:
    Bob paged for it alone an hour early while the summary still had Alice. Now it joins the
    running summary: nobody paged for it alone; Bob gets the summary at the hour."""

    async def test(rig: Rig) -> None:
        for i in range(12):
            rig.manager.apply(
                Condition(T0 + i, f"wetwell.level{i}", Rule.HIGH, ConditionState.ACTIVE, 9.0, 8.0, "site")
            )
        await rig.step()
        level0 = Condition(T0 + 20, "wetwell.level0", Rule.HIGH, ConditionState.CLEARED, 7.9, 8.0, "site")
        rig.manager.apply(level0)
        await rig.step(20)
        again = Condition(
            T0 + 30,
            "wetwell.level0",
            Rule.HIGH,
            ConditionState.ACTIVE,
            9.0,
            8.0,
            "site",
            extra={"continues": T0},
        )
        rig.manager.apply(again)
        await rig.step(10)
        assert smtp.to(BOB) == []
        [summary] = smtp.to(ALICE)
        assert "ALARM FLOOD" in summary.subject
        await rig.step(3600)
        [bob] = smtp.to(BOB)
        assert "ALARM FLOOD" in bob.subject

    run(tmp_path, smtp, test, delay="1h")


def test_pipelines_match_by_schedule_in_local_time_holidays_and_discharger(
    tmp_path: Path, smtp: MailServer
) -> None:
    raw = raw_config(tmp_path, smtp.port)
    notify = raw["notify"]
    notify["holidays"] = ["2026-01-13"]
    notify["schedules"] = {
        "office": {"days": ["mon", "tue", "wed", "thu", "fri"], "from": "07:00", "to": "17:00"},
        "nights": {
            "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun", "holiday"],
            "from": "17:00",
            "to": "07:00",
        },
    }
    notify["rosters"]["day"] = ["bob"]
    notify["pipelines"] = [
        {"name": "acme", "roster": "day", "match": {"dischargers": ["acme-plating"], "schedule": "office"}},
        {"name": "night", "roster": "operators", "match": {"schedule": "nights"}},
    ]
    config = build_config(raw)

    async def go() -> None:
        clock = ManualClock(T0)
        rig = Rig(config, clock)
        try:
            m = rig.callout.matcher
            # 22:00 local on Tuesday 13 Jan, a holiday: nights (the holiday listed), not office
            assert [o["pipeline"] for o in m.on_call(T0)] == ["night"]
            # Wednesday 14 Jan 10:00 local: office hours, acme's pipeline first
            ten = datetime(2026, 1, 14, 15, 0, tzinfo=UTC).timestamp()
            assert [o["name"] for o in m.on_call(ten)] == ["Bob Jones"]
            # Wednesday 06:59 local: still the night that started on Tuesday
            early = datetime(2026, 1, 14, 11, 59, tzinfo=UTC).timestamp()
            assert [o["pipeline"] for o in m.on_call(early)] == ["night"]
            clock.set(ten)
            rig.manager.apply(ph(ConditionState.ACTIVE, ten))
            await rig.callout.deliver_due()
            assert len(smtp.to(BOB)) == 1 and smtp.to(ALICE) == []
            clock.set(ten + 60)
            rig.manager.apply(
                Condition(ten, "outfall.flow", Rule.SLUG, ConditionState.ACTIVE, 9, 5, "§139-11")
            )
            await rig.callout.deliver_due()
            assert smtp.to(ALICE) == []  # flow has no discharger and the night pipeline is off
        finally:
            await rig.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda n: n["rosters"].update(operators=["alice", "carol"]),
            "notify.rosters.operators: unknown person",
        ),
        (lambda n: n["people"]["bob"]["contacts"].update(sms="+15550100"), "notify.people.bob.contacts.sms"),
        (lambda n: n["pipelines"][0].update(roster="nobody"), "notify.pipelines[0].roster: unknown roster"),
        (
            lambda n: n["channels"]["mail"].update(password="plain-text"),
            "notify.channels.mail.email.password",
        ),
        (lambda n: n.update(link_secret=None), "notify.link_secret: link_base and link_secret go together"),
        (
            lambda n: n["channels"].update(
                sms={"type": "http", "url": "https://sms.example/{too}", "form": {"Body": "{text}"}}
            ),
            "notify.channels.sms.http.url: unknown placeholder {too}",
        ),
        (lambda n: n["pipelines"][0].update(delay="soon"), "notify.pipelines[0].delay"),
    ],
)
def test_bad_notify_config_names_the_key(tmp_path: Path, smtp: MailServer, change: Any, problem: str) -> None:
    raw = raw_config(tmp_path, smtp.port)
    change(raw["notify"])
    with pytest.raises(ConfigError) as info:
        build_config(raw)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems
    assert "plain-text" not in str(info.value)


def test_the_documented_callout_config_is_valid(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    section = (repo_root / "docs" / "callout.md").read_text(encoding="utf-8")
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    for name in ("SMTP_PASSWORD", "TWILIO_AUTH_TOKEN", "CALLOUT_LINK_SECRET"):
        monkeypatch.setenv(name, "x")
    config = build_config(yaml.safe_load(block))
    assert config.notify is not None
    assert config.notify.rosters["operators"] == ["alice", "bob"]
    assert config.notify.channels["sms"].type == "http"


def test_an_acknowledgement_through_the_console_api_stops_the_escalation(
    tmp_path: Path, smtp: MailServer
) -> None:
    from tests.console import TOKEN, TableView, call

    config = build_config(raw_config(tmp_path, smtp.port))
    clock = ManualClock(T0)
    view = TableView(tmp_path / "journal.sqlite", clock)
    callout = Callout(config, view.alarms, clock)
    view.alarms.apply(ph(ConditionState.ACTIVE, T0))
    assert asyncio.run(callout.deliver_due()) == 1
    headers = {"Authorization": f"Bearer {TOKEN}"}
    resp = call(view, "POST", "/api/alarms/outfall.ph/low/ack", json={"by": "dana"}, headers=headers)
    assert resp.status_code == 200, resp.text
    clock.advance(60)
    callout.tick()
    assert asyncio.run(callout.deliver_due()) == 0
    assert smtp.to(BOB) == []
    [esc] = cast(list[dict[str, Any]], callout.status()["escalations"])
    assert esc["status"] == "acknowledged" and esc["ended_by"] == "dana"
    asyncio.run(callout.aclose())


def test_a_restart_starts_what_the_store_missed_and_repeats_nothing(tmp_path: Path, smtp: MailServer) -> None:
    config = build_config(raw_config(tmp_path, smtp.port))
    clock = ManualClock(T0)

    async def go() -> None:
        # killed between the journal's commit and the callout's: the alarm is there, no escalation
        manager = AlarmManager.open(config, clock)
        manager.apply(ph(ConditionState.ACTIVE, T0))
        manager.close()
        for _ in range(2):  # two restarts: the first starts the escalation, the second repeats nothing
            manager = AlarmManager.open(config, clock)
            callout = Callout(config, manager, clock)
            callout.resume()
            callout.tick()
            await callout.deliver_due()
            await callout.aclose()
            manager.close()
        assert len(smtp.to(ALICE)) == 1 and smtp.to(BOB) == []

    asyncio.run(go())


def test_repeat_goes_round_the_roster_again_then_stops(tmp_path: Path, smtp: MailServer) -> None:
    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        sent = [await rig.step()] + [await rig.step(5) for _ in range(5)]
        assert sent == [1, 1, 1, 1, 0, 0]
        assert len(smtp.to(ALICE)) == 2 and len(smtp.to(BOB)) == 2
        [esc] = escalations(rig)
        assert esc["status"] == "done" and esc["next"] is None

    run(tmp_path, smtp, test, repeat=1)


def test_a_station_name_with_a_line_break_still_pages_with_a_one_line_subject(
    tmp_path: Path, smtp: MailServer
) -> None:
    """A YAML folded scalar (`name: >`) leaves a trailing newline in the station name; a
    newline in a header made EmailMessage raise ValueError, which killed the callout task
    (and with it the daemon) at the first page."""
    raw = raw_config(tmp_path, smtp.port)
    raw["station"]["name"] = "Barton PS 1\r\nBcc: mallory@example.org\n"

    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        assert await rig.step() == 1
        [mail] = smtp.mails
        assert mail.to == (ALICE,)
        assert mail.subject == "[Barton PS 1 Bcc: mallory@example.org] HIGH outfall.ph low"
        assert mail.message["Bcc"] is None

    run_config(build_config(raw), test)


def test_an_address_with_a_line_break_fails_the_channel_not_the_callout(
    tmp_path: Path, smtp: MailServer
) -> None:
    """A contact address the mail library refuses is that channel failing (retried, the
    diagnostic alarm raised), never an exception out of the delivery loop."""
    raw = raw_config(tmp_path, smtp.port)
    raw["notify"]["people"]["alice"]["contacts"]["mail"] = ALICE + "\nBcc: mallory@example.org"

    async def test(rig: Rig) -> None:
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        assert await rig.step() == 0
        assert smtp.mails == []
        assert rig.callout.failed == 1
        diag = rig.manager.get("notify.mail", Rule.NOTIFY)
        assert diag is not None and diag.active

    run_config(build_config(raw), test)


def test_a_restart_on_an_unset_clock_goes_on_escalating(tmp_path: Path, smtp: MailServer) -> None:
    """Alice was paged; the gateway reboots without a battery-backed clock and reads a year
    before the page. Bob's step was due 5 s after Alice's on the old clock, a year ahead of
    this one: it waited for the clock to come round (on a gateway NTP never reaches, for
    ever), and nothing said so. At a restart, a step due later than its delay from now is due
    its delay from now: Bob is paged 5 s after the restart."""
    config = build_config(raw_config(tmp_path, smtp.port, repeat=1))
    clock = ManualClock(T0)

    async def go() -> None:
        rig = Rig(config, clock)
        rig.manager.apply(ph(ConditionState.ACTIVE, T0))
        assert await rig.step() == 1
        await rig.close()
        clock.set(T0 - 365 * 86400.0)
        rig = Rig(config, clock)
        try:
            rig.callout.resume()
            assert await rig.step() == 0
            assert await rig.step(5.1) == 1
        finally:
            await rig.close()
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


class Station:
    """The daemon (its callout, alarms and clock watch) on injected gateway and monotonic
    clocks, as `monitor run` wires them on the real ones; the test drives its ticks."""

    def __init__(self, config: Config, wall: float) -> None:
        self.wall, self.mono = ManualClock(wall), ManualClock(1000.0)
        self.daemon = Daemon(config, self.wall)
        self.daemon.watch_clock(ClockWatch(self.daemon.engine, wall=self.wall.now, monotonic=self.mono.now))
        assert self.daemon.callout is not None
        self.callout = self.daemon.callout
        self.callout.resume()

    async def tick(self, wall: float, elapsed: float) -> int:
        """The gateway clock reads `wall` after `elapsed` real seconds more: one timer tick,
        and the messages it made due delivered."""
        self.wall.set(wall)
        self.mono.advance(elapsed)
        self.daemon.tick()
        return await self.callout.deliver_due()

    async def close(self) -> None:
        await self.callout.aclose()
        close_daemon(self.daemon)

    def kill(self) -> None:
        """What `kill -9` (or the watchdog's hard reset) leaves: the stores as last committed,
        nothing flushed at a stop (the callout's store closed, not `aclose`d)."""
        self.callout.store.close()
        close_daemon(self.daemon)

    async def stop(self, how: str) -> None:
        """ "clean" (the daemon's stop) or "kill"."""
        if how == "kill":
            self.kill()
        else:
            await self.close()


@asynccontextmanager
async def station(config: Config, wall: float, end: str = "clean") -> AsyncIterator[Station]:
    """One run of the daemon, started on a gateway clock reading `wall`, ended by `end`
    ("clean": the daemon's stop; "kill": kill -9 / a hard reset), whatever the test asserts."""
    st = Station(config, wall)
    try:
        yield st
    finally:
        await st.stop(end)


async def page_alice(st: Station, at: float, after: float = 0.0) -> None:
    """The pH alarm comes at `at`; the tick `after` s later pages Alice, the roster's first."""
    st.daemon.alarms.apply(ph(ConditionState.ACTIVE, at))
    assert await st.tick(at + after, after) == 1


def assert_alice_and_bob_paged_once(smtp: MailServer) -> None:
    """Both steps of the roster paged, neither twice (a clock or a restart repeats nobody)."""
    assert len(smtp.to(ALICE)) == 1 and len(smtp.to(BOB)) == 1


def config_with_heartbeat(tmp_path: Path, smtp: MailServer, delay: str) -> Config:
    """The callout config with a heartbeat a minute before TR in its state dir, so the daemon
    judges a clock reading UNSET (a year behind it) unset."""
    config = build_config(raw_config(tmp_path, smtp.port, delay=delay))
    write_heartbeat(config.state_dir, TR - 60)
    return config


@pytest.mark.parametrize("down", [30.0, 7200.0])
def test_ntp_after_a_restart_on_an_unset_clock_pages_the_next_person_on_the_real_schedule(
    tmp_path: Path, smtp: MailServer, down: float
) -> None:
    """Alice was paged at T0 (a 15 min delay to Bob); the gateway reboots `down` s later
    without a battery-backed clock, reads a year behind, and the restart moves Bob's step to
    its delay from now (so an unset clock still escalates). A minute later NTP steps the clock
    forward to the real time. Bob's step, due on the unset clock's time, was due at once: after
    a 30 s reboot Bob was paged 14 minutes early. Moved forward with the clock it came 15 min
    after the restart: after a 2 h power cut, 15 min after his step was overdue on the real
    clock. Now it is the earlier of the two, the real schedule: T0 + 15 min after the short
    reboot, at once after the long one; once, never twice."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    # T0 a real time after this release's date: the daemon judges the first run's clock set
    # (its due time is remembered as the right clock's), the unset one not.
    T0 = TR  # noqa: N806
    unset = T0 - 365 * 86400.0  # at T0 + down, real time

    async def go() -> None:
        async with station(config, T0) as st:
            await page_alice(st, T0)
        async with station(config, unset) as st:
            assert await st.tick(unset + 30, 30) == 0
            ntp = T0 + down + 60
            if down < 900:
                assert await st.tick(ntp, 30) == 0  # NTP: forward to the real time
                assert await st.tick(T0 + 899, T0 + 899 - ntp) == 0
                assert await st.tick(T0 + 901, 2) == 1
            else:
                assert await st.tick(ntp, 30) == 1  # overdue on the real clock: at once
            assert await st.tick(T0 + down + 3600, 3600) == 0
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


def test_a_suspend_of_an_hour_pages_the_next_person_on_time(tmp_path: Path, smtp: MailServer) -> None:
    """Alice was paged at T0 (90 min to Bob); a minute later the gateway is suspended for an
    hour (a VM host pausing it, a laptop-class gateway asleep). At resume the kernel moves the
    wall clock on by the hour, and CLOCK_BOOTTIME, the watch's clock, with it; `time.monotonic()`
    does not: the watch saw a step forward of an hour and moved Bob's step with it, paging him
    at T0 + 150 min. A suspend cannot be made on demand: the injected monotonic clock moves as
    CLOCK_BOOTTIME does. No step is reported, and Bob is paged at T0 + 90 min: the hour asleep
    counted as the time Alice did not answer."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="90m"))

    async def go() -> None:
        async with station(config, T0) as st:
            await page_alice(st, T0)
            assert await st.tick(T0 + 60, 60) == 0
            assert await st.tick(T0 + 3660, 3600) == 0  # resumed after an hour asleep
            watch = st.daemon.clock_watch
            assert watch is not None and watch.step_log.steps == 0
            assert not [a for a in st.daemon.alarms.active() if a.rule is Rule.CLOCK]
            assert await st.tick(T0 + 5399, 5399 - 3660) == 0
            assert await st.tick(T0 + 5401, 2) == 1
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


def test_a_clock_stepped_back_a_day_while_running_still_pages_the_next_person(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Alice was paged at T0 (15 min to Bob); a bad NTP server steps the running gateway's
    clock back a day a minute later. Bob's step stayed due at T0 + 15 min on the old clock, a
    day away on this one: nobody after Alice was paged for a day. A step back takes the
    start's rule: a step due further ahead than its delay is due its delay less the time it
    has waited from now: Bob at 15 min of run time after Alice."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))

    async def go() -> None:
        async with station(config, T0) as st:
            await page_alice(st, T0, after=1)
            back = T0 + 60 - 86400.0
            assert await st.tick(back, 59) == 0
            assert await st.tick(back + 839, 839) == 0
            assert await st.tick(back + 841, 2) == 1
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


def test_a_restart_loop_on_a_correct_clock_pages_nobody_again_and_skips_no_step(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Alice was paged at T0 (15 min to Bob); from T0 + 2 min the daemon restarts ten times
    in ten seconds (systemd Restart=always on a crash at start), each start on the right
    clock, with its start rule and its clock watch. Nobody is paged by a restart, Bob's step
    is neither restarted nor taken early: Bob is paged once, at T0 + 15 min. (Held at review.)"""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))

    async def go() -> None:
        async with station(config, T0) as st:
            await page_alice(st, T0)
        for k in range(10):
            async with station(config, T0 + 120 + k) as st:
                assert await st.tick(T0 + 120.5 + k, 0.5) == 0
        async with station(config, T0 + 131) as st:
            assert await st.tick(T0 + 899, 768) == 0
            assert await st.tick(T0 + 900, 1) == 1
            assert await st.tick(T0 + 1799, 899) == 0
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


async def reboot_loop(
    config: Config, stop: str, ntp_in_run: int | None = None, back_in_run: int | None = None
) -> tuple[float | None, float]:
    """Alice paged at T0 (15 min to Bob) on the right clock; two minutes later the gateway
    starts a reboot loop (the watchdog every 5 min: each run 295 s, ticking every second) on
    a clock that reads `unset` at every boot (no battery-backed clock, NTP never answers).
    Each run ends with `stop` ("clean": the daemon's stop; "kill": kill -9 / a hard reset).
    With `ntp_in_run`, NTP answers 100 s into that run (a step forward to the real time); with
    `back_in_run`, a bad NTP server steps the clock back a day 100 s into that run.
    Returns (the real seconds the daemon had run since Alice's page when Bob was paged, or
    None; and the real time, downtime not counted, the loop ran)."""
    unset = T0 - YEAR
    ran = 0.0
    paged: float | None = None
    async with station(config, T0, stop) as st:
        await page_alice(st, T0)
        for k in range(1, 121):
            assert await st.tick(T0 + k, 1) == 0
            ran += 1
    for run_no in range(1, 7):
        wall = unset
        async with station(config, unset, stop) as st:
            for _ in range(295):
                wall += 1
                if run_no == ntp_in_run and wall == unset + 100:
                    wall = T0 + ran + 60 * run_no  # a minute's boot per restart, real time
                if run_no == back_in_run and wall == unset + 100:
                    wall -= 86400.0
                ran += 1
                if await st.tick(wall, 1):
                    assert paged is None
                    paged = ran
    return paged, ran


@pytest.mark.parametrize("stop", ["clean", "kill"])
def test_a_reboot_loop_on_an_unset_clock_pages_the_next_person_after_the_delay_served(
    tmp_path: Path, smtp: MailServer, stop: str
) -> None:
    """The reboot loop of `reboot_loop`. Each start moved Bob's step, due further ahead than
    its delay on the unset clock, to its delay from that start: 15 min from a boot that lives
    5 min, so Bob was never paged while Alice slept through hers. Now the time the step has
    waited counts (the monotonic clock while the daemon runs, persisted every
    `SERVED_PERSIST` s and at a stop): Bob is paged once 15 min of run time have passed since
    Alice's page. A kill -9 loses what was served since the last persist (here 5 s per kill,
    two kills before the page): at most `SERVED_PERSIST` per kill."""
    from monitor.callout.service import SERVED_PERSIST

    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    paged, _ = asyncio.run(reboot_loop(config, stop))
    assert paged is not None, "Bob was never paged"
    if stop == "clean":
        assert paged == 900
    else:
        assert 900 < paged <= 900 + 2 * SERVED_PERSIST
        assert paged == 910  # measured: 5 s lost at each of the two kills before the page
    assert_alice_and_bob_paged_once(smtp)


def test_ntp_answering_in_a_reboot_loop_keeps_the_time_served(tmp_path: Path, smtp: MailServer) -> None:
    """The reboot loop; in its second run on the unset clock NTP answers (the clock steps
    forward a year, while running). The step forward moves Bob's step with it, so what was
    served before the step still counts: Bob is paged at 15 min of run time, not 15 min after
    NTP, and once."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    paged, _ = asyncio.run(reboot_loop(config, "kill", ntp_in_run=2))
    assert paged is not None and 900 < paged <= 910
    assert_alice_and_bob_paged_once(smtp)


def test_a_callout_store_of_the_last_release_upgrades_in_place(tmp_path: Path) -> None:
    """A store written before the time served was kept (schema version 1) with a running
    escalation: opened by this release it is upgraded in one transaction, the escalation
    kept, its step having waited nothing yet."""
    from monitor.callout.store import _SCHEMA, CalloutStore
    from monitor.sqlite import Schema, connect

    path = tmp_path / "callout.sqlite"
    old = connect(path, Schema("callout store", (_SCHEMA,)), synchronous="FULL")
    old.execute(
        "INSERT INTO escalation (kind, sensor, rule, activated_at, pipeline, roster, steps, delay,"
        " stop_on_clear, started, next_step, next_at, status) VALUES"
        " ('alarm', 'outfall.ph', 'low', ?, 'operators', '[\"alice\", \"bob\"]', 2, 900, 1, ?, 1, ?,"
        " 'running')",
        (T0, T0, T0 + 900),
    )
    old.close()
    store = CalloutStore(path)
    try:
        [esc] = store.running()
        assert (esc.next_step, esc.next_at, esc.served) == (1, T0 + 900, 0.0)
        store.serve(12.5, 3600.0)
        assert store.running()[0].served == 12.5
    finally:
        store.close()


def test_the_last_release_refuses_an_upgraded_callout_store(tmp_path: Path) -> None:
    """Going back a release: the last one's schema (its one script) meets the columns it does
    not know (`served`: it would step without resetting it, and a later upgrade would page
    early from the stale time). It refuses the file, naming the schema, instead of writing."""
    from monitor.callout.store import _SCHEMA, STORE_SCHEMA, CalloutStore
    from monitor.errors import StateError
    from monitor.sqlite import Schema, connect

    path = tmp_path / "callout.sqlite"
    CalloutStore(path).close()
    with pytest.raises(
        StateError,
        match=f"newer station-monitor \\(schema {STORE_SCHEMA.version}, this release reads up to 1\\)",
    ):
        connect(path, Schema("callout store", (_SCHEMA,)))


def write_heartbeat(state: Path, t: float) -> None:
    """The station's last known good time as a daemon on a clock reading `t` wrote it."""
    state.mkdir(parents=True, exist_ok=True)
    clock = ClockFile(state / CLOCK_FILE)
    clock.not_before = -float("inf")
    assert clock.beat(t, force=True)


def console(callout: Callout) -> httpx.AsyncClient:
    """The console's callout routes (`/callout/ack/...`) over real HTTP requests (ASGI)."""
    app = FastAPI()
    add_callout_routes(app, callout, None)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


def test_a_link_signed_on_an_unset_clock_still_acknowledges_after_ntp(
    tmp_path: Path, smtp: MailServer
) -> None:
    """The gateway boots a year behind the station's heartbeat (no battery-backed clock,
    NTP not answering yet); the pH alarm pages Alice with a link valid for 1 h. Ten minutes
    later NTP steps the clock forward to the real time, and she taps the link: it said
    "expired" (its expiry was an hour after the unset clock's time, a year ago on the real
    one). A link signed by a clock the daemon judges unset moves with the clock's step
    forward: it acknowledges, in her name, once. The page says "for 1 h", not an expiry in last
    year. A forged link is still refused."""
    config = config_with_heartbeat(tmp_path, smtp, delay="2h")

    async def go() -> None:
        async with station(config, UNSET) as st, console(st.callout) as http:
            await page_alice(st, UNSET, after=1)
            [page] = smtp.to(ALICE)
            assert "(once, for 1 h)" in page.body, page.body
            ack = link(page.body)
            nonce, sig = ack.rsplit("/", 1)[1].split(".")
            assert await st.tick(UNSET + 600, 599) == 0
            assert await st.tick(TR + 600, 1) == 0  # NTP: forward a year, 10 min after the page
            forged = await http.post(f"/callout/ack/{nonce}.{'A' * len(sig)}")
            assert forged.status_code == 410
            done = await http.post(ack)
            assert done.status_code == 200, done.text
            alarm = st.daemon.alarms.get("outfall.ph", Rule.LOW)
            assert alarm is not None and alarm.state is AlarmState.ACKED and alarm.acked_by == "Alice Smith"
            again = await http.post(ack)
            assert again.status_code == 410 and "used already" in again.text

    asyncio.run(go())


def test_old_links_stay_refused_across_an_unset_clock_and_its_ntp_step(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Attacker's view: a link must not become valid for ever. (1) Alice's link, signed on the
    right clock, then the gateway reboots onto an unset clock (a year behind): the unset clock
    reads long before its expiry, so the wall clock alone kept it valid as long as NTP stayed
    away; after its 1 h of the daemon's run time it is refused. (2) Bob's link, signed on the
    unset clock, not used within its hour on that clock (100 min of it): NTP stepping the clock forward later
    does not bring it back. Both refused as expired, the alarm still waiting."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="30m"))

    async def go() -> None:
        async with station(config, TR) as st:
            await page_alice(st, TR, after=1)
            assert await st.tick(TR + 60, 59) == 0
        alice = link(smtp.to(ALICE)[0].body)
        async with station(config, UNSET) as st, console(st.callout) as http:
            wall = UNSET
            bob = None
            for _ in range(100):  # 100 min on the unset clock, a tick a minute
                wall += 60
                await st.tick(wall, 60)
                if bob is None and smtp.to(BOB):
                    bob = link(smtp.to(BOB)[0].body)
                    assert (await http.get(bob)).status_code == 200  # valid when sent
                if wall == UNSET + 1800:
                    assert (await http.get(alice)).status_code == 200  # 31 min of run time: valid
            assert bob is not None
            for old in (alice, bob):
                resp = await http.post(old)
                assert resp.status_code == 410 and "expired" in resp.text, resp.text
            await st.tick(TR + 7200, 60)  # NTP, after Bob's hour on the unset clock
            for old in (alice, bob):
                resp = await http.post(old)
                assert resp.status_code == 410 and "expired" in resp.text, resp.text
            alarm = st.daemon.alarms.get("outfall.ph", Rule.LOW)
            assert alarm is not None and alarm.state is AlarmState.UNACK

    asyncio.run(go())


def test_the_time_waited_a_full_disk_refuses_is_kept_and_written_when_there_is_room(
    tiny_disk: Path, smtp: MailServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A real 3 MB tmpfs filled to its last byte while Bob's step waits: each write of the
    time waited is refused (SQLITE_FULL), said once, never a crash, and the time is kept in
    memory; with room again the next write carries all of it (310 s, nothing lost)."""
    config = build_config(raw_config(tiny_disk, smtp.port, delay="15m"))
    clock, mono = ManualClock(TR), ManualClock(1000.0)

    async def go() -> None:
        manager = AlarmManager.open(config, clock)
        callout = Callout(config, manager, clock, monotonic=mono.now)
        try:
            manager.apply(ph(ConditionState.ACTIVE, TR))
            assert await callout.deliver_due() == 1
            ballast = fill_disk(tiny_disk)
            with caplog.at_level(logging.INFO, logger="monitor.callout.service"):
                for _ in range(30):
                    clock.advance(10)
                    mono.advance(10)
                    callout.tick()
                [esc] = callout.store.running()
                assert esc.served == 0
                ballast.unlink()
                clock.advance(10)
                mono.advance(10)
                callout.tick()
            [esc] = callout.store.running()
            assert esc.served == 310
            said = [r.getMessage() for r in caplog.records]
            assert len([m for m in said if "the time waited is kept" in m]) == 1, said
            assert len([m for m in said if "written again" in m]) == 1, said
        finally:
            await callout.aclose()
            manager.close()

    asyncio.run(go())


def test_a_step_back_in_a_reboot_loop_still_pages_the_next_person(tmp_path: Path, smtp: MailServer) -> None:
    """The reboot loop; in its second run a bad NTP server steps the clock back a day. The
    step back while running makes Bob's step due its delay less the time served (385 s),
    more than that run lives. The next boot reads the unset clock again, a day ahead of the
    schedule the stepped-back clock wrote: to the store that is a day of downtime, Bob's step
    overdue, paged at once at the third start, at 711 s of run time (189 s before his 15 min
    were served). Paged, not never; early, because without a set clock the daemon cannot tell
    a day's power cut from a clock a day ahead (measured, left as is: see docs/callout.md)."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))
    paged, _ = asyncio.run(reboot_loop(config, "kill", back_in_run=2))
    assert paged == 120 + 295 + 295 + 1
    assert_alice_and_bob_paged_once(smtp)


def test_a_clock_stepped_back_late_in_the_delay_pages_the_next_person_on_time(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Alice paged at T0 (15 min to Bob); 14 min later, the daemon running, a bad NTP server
    steps the clock back a day. The step back made Bob's step due its whole delay from then,
    the 14 min already waited thrown away although the monotonic clock had measured them: Bob
    paged 29 min after Alice. Now the time served counts as at a start: Bob at 15 min."""
    config = build_config(raw_config(tmp_path, smtp.port, delay="15m"))

    async def go() -> None:
        async with station(config, T0) as st:
            await page_alice(st, T0, after=1)
            back = T0 + 1 + 840 - 86400.0
            assert await st.tick(back, 840) == 0
            assert await st.tick(back + 58, 58) == 0
            assert await st.tick(back + 59, 1) == 1  # 900 s of run time after Alice's page (at T0)
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("served", "due_in"), [(-3600.0, 900.0), (-1e12, 900.0), (5000.0, 0.0), (300.0, 600.0)]
)
def test_a_damaged_time_served_never_holds_a_step_back_longer_than_its_delay(
    tmp_path: Path, served: float, due_in: float
) -> None:
    """A store whose `served` column was damaged (a hand edit, a bad restore): negative, it
    made a start on an unset clock put Bob's step its delay plus that far ahead (-1e12 s: never
    paged); larger than the delay, at once. A start now counts what was served between none
    and the whole delay: due between now and its delay from now, never later."""
    from monitor.callout.store import CalloutStore

    store = CalloutStore(tmp_path / "callout.sqlite")
    try:
        esc = store.start("alarm", "outfall.ph", "low", T0, "operators", ["alice", "bob"], 2, 900.0, True, T0)
        assert esc is not None and store.step(esc, [], "alice", None, T0)
        store._db.execute("UPDATE escalation SET served=?", (served,))
        unset = T0 - YEAR
        steps, _ = store.behind(unset, 300.0)
        assert len(steps) == 1
        [esc] = store.running()
        assert esc.next_at == unset + due_in
    finally:
        store.close()


def test_a_step_back_then_ntp_on_an_unset_clock_pages_the_next_person_after_the_delay(
    tmp_path: Path, smtp: MailServer
) -> None:
    """The gateway runs on an unset clock (a year behind the heartbeat): Alice paged, 15 min to
    Bob. 5 min later a bad NTP server steps it back a day, 5 min after that NTP steps it to the
    real time. The step back remembered Bob's due time as the right clock's (it was a whole
    delay ahead), and the step forward made him due at the earlier of that and the moved time:
    an hour of last year, paged at once, 5 min early. Only a due time a clock judged set wrote
    is remembered: Bob at 15 min of run time."""
    config = config_with_heartbeat(tmp_path, smtp, delay="15m")

    async def go() -> None:
        async with station(config, UNSET) as st:
            await page_alice(st, UNSET)
            assert await st.tick(UNSET + 300 - 86400.0, 300) == 0  # a day back
            assert await st.tick(TR + 600, 300) == 0  # NTP: the real time, 10 min after the page
            assert await st.tick(TR + 899, 299) == 0
            assert await st.tick(TR + 900, 1) == 1
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


def test_a_link_signed_on_an_unset_clock_stepped_back_then_forward_expires_on_time(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Attacker's view: Alice's link is signed on the unset clock (a year behind); 10 min later
    a bad NTP server steps it back a day, 10 min after that NTP steps it forward to the real
    time. Only the forward step moved the link: its expiry landed a day late on the real clock.
    The run time (`link_ttl` of it) still refused it while the daemon ran, but a restart 3 h
    after the page on the right clock (20 min of run time) took it: the alarm acknowledged
    by a 3 h old link that said "for 1h". The link now moves with the step back too."""
    config = config_with_heartbeat(tmp_path, smtp, delay="2h")

    async def go() -> None:
        async with station(config, UNSET) as st:
            await page_alice(st, UNSET, after=1)
            assert await st.tick(UNSET + 600 - 86400.0, 599) == 0  # a day back
            assert await st.tick(TR + 1200, 600) == 0  # NTP: the real time, 20 min after the page
        ack = link(smtp.to(ALICE)[0].body)
        async with station(config, TR + 3 * 3600.0) as st, console(st.callout) as http:
            resp = await http.post(ack)
            assert resp.status_code == 410 and "expired" in resp.text, resp.text
            alarm = st.daemon.alarms.get("outfall.ph", Rule.LOW)
            assert alarm is not None and alarm.state is AlarmState.UNACK

    asyncio.run(go())


def test_ntp_in_a_reboot_loop_that_paged_on_the_unset_clock_pages_after_the_delay(
    tmp_path: Path, smtp: MailServer
) -> None:
    """A reboot loop wholly on the unset clock (a year behind the heartbeat; each boot reads the
    same time): the pH alarm pages Alice 5 s into the first run, kill -9 at 295 s. The second
    start found Bob's step due 5 s more than its delay ahead of the clock, took that due time
    (the unset clock's) for the right clock's, and NTP answering 100 s into that run made Bob
    due at it: paged at once, at 390 s of run time instead of 900."""
    config = config_with_heartbeat(tmp_path, smtp, delay="15m")

    async def go() -> None:
        async with station(config, UNSET, "kill") as st:
            assert await st.tick(UNSET + 5, 5) == 0
            await page_alice(st, UNSET + 5)
            assert await st.tick(UNSET + 295, 290) == 0
        async with station(config, UNSET) as st:
            assert await st.tick(UNSET + 100, 100) == 0
            assert await st.tick(TR + 100, 1) == 0  # NTP
            assert await st.tick(TR + 100 + 499, 499) == 0  # 890 s of run time since Alice's page
            assert await st.tick(TR + 100 + 499 + 20, 20) == 1
        assert_alice_and_bob_paged_once(smtp)

    asyncio.run(go())


def test_a_link_signed_on_an_unset_clock_is_expired_after_a_restart_onto_the_set_clock(
    tmp_path: Path, smtp: MailServer
) -> None:
    """Alice paged on the unset clock (a year behind); the watchdog reboots the gateway 5 min
    later and NTP answers before the daemon starts. No running clock watch saw the step, and
    nothing measures the downtime: her link reads expired (early, never late, as a step
    overdue pages at once), and she is told to acknowledge on the console."""
    config = config_with_heartbeat(tmp_path, smtp, delay="2h")

    async def go() -> None:
        async with station(config, UNSET, "kill") as st:
            await page_alice(st, UNSET, after=300)
        async with station(config, TR + 360) as st, console(st.callout) as http:
            resp = await http.post(link(smtp.to(ALICE)[0].body))
            assert resp.status_code == 410 and "expired" in resp.text and "console" in resp.text, resp.text

    asyncio.run(go())
