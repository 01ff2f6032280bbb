"""Notifications: webhook against a real local HTTP server; flood, chattering, re-notify."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import SecretStr

from monitor.alarms import AlarmManager, Dispatcher, Flood, Journal, LogNotifier
from monitor.alarms.webhook import WebhookNotifier
from monitor.config import Alarms, Webhook
from monitor.errors import WriteError
from monitor.model import Alarm, AlarmState, Condition, ConditionState, ManualClock, Rule

T0 = 1_780_000_000.0


class Receiver:
    """A real HTTP server on loopback that records POSTed JSON and can fail on demand."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.headers: list[dict[str, str]] = []
        self.fail_next = 0
        self.fail_status = 503
        self.hold = threading.Event()  # set = answer at once; clear = keep the client waiting
        self.hold.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                receiver.hold.wait(5)
                receiver.headers.append(dict(self.headers.items()))
                if receiver.fail_next > 0:
                    receiver.fail_next -= 1
                    self.send_response(receiver.fail_status)
                else:
                    receiver.bodies.append(body)
                    self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?key=k"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def _alarm() -> Alarm:
    return Alarm(
        "outfall.ph", Rule.HIGH, AlarmState.UNACK, Alarms().priorities[Rule.HIGH], 9.6, 9.0, "§139-15 C(3)"
    )


def test_webhook_posts_json_with_token(receiver: Receiver) -> None:
    hook = WebhookNotifier(Webhook(url=receiver.url, token=SecretStr("pager-key")), "ps-1", backoff=0.01)

    async def go() -> None:
        await hook.notify(_alarm())
        await hook.notify(_alarm(), reminder=True)
        await hook.flood(Flood(T0, True, 11, 600.0, (_alarm(),)))
        await hook.aclose()

    asyncio.run(go())
    first, reminder, flood = receiver.bodies
    assert first["type"] == "alarm" and first["station"] == "ps-1"
    alarm = first["alarm"]
    assert isinstance(alarm, dict)
    assert alarm["sensor"] == "outfall.ph" and alarm["citation"] == "§139-15 C(3)"
    assert alarm["state"] == "active_unacknowledged"
    assert reminder["type"] == "reminder"
    assert flood["type"] == "flood" and "11 alarms in 10 min" in str(flood["text"])
    assert receiver.headers[0]["Authorization"] == "Bearer pager-key"


def test_webhook_retries_server_errors_then_delivers(receiver: Receiver) -> None:
    receiver.fail_next = 2
    hook = WebhookNotifier(Webhook(url=receiver.url, retries=3), "ps-1", backoff=0.01)
    asyncio.run(_notify_and_close(hook))
    assert len(receiver.headers) == 3 and len(receiver.bodies) == 1


def test_webhook_gives_up_after_retries_without_leaking_the_query(receiver: Receiver) -> None:
    receiver.fail_next = 10
    hook = WebhookNotifier(Webhook(url=receiver.url, retries=2), "ps-1", backoff=0.01)
    with pytest.raises(WriteError, match=r"HTTP 503 after 3 attempt") as info:
        asyncio.run(_notify_and_close(hook))
    assert "key=k" not in str(info.value) and info.value.status == 503
    assert len(receiver.headers) == 3


def test_webhook_does_not_retry_a_refusal(receiver: Receiver) -> None:
    receiver.fail_next, receiver.fail_status = 10, 400
    hook = WebhookNotifier(Webhook(url=receiver.url, retries=3), "ps-1", backoff=0.01)
    with pytest.raises(WriteError, match="HTTP 400 after 4 attempt"):
        asyncio.run(_notify_and_close(hook))
    assert len(receiver.headers) == 1


def test_webhook_times_out_on_a_silent_server(receiver: Receiver) -> None:
    receiver.hold.clear()  # the server reads the request and does not answer
    hook = WebhookNotifier(Webhook(url=receiver.url, timeout=0.2, retries=1), "ps-1", backoff=0.01)
    with pytest.raises(WriteError, match="Timeout"):
        asyncio.run(_notify_and_close(hook))
    receiver.hold.set()


async def _notify_and_close(hook: WebhookNotifier) -> None:
    try:
        await hook.notify(_alarm())
    finally:
        await hook.aclose()


class Pager:
    """A notifier that remembers what it was told (the consumer under test)."""

    def __init__(self, name: str = "pager") -> None:
        self.name = name
        self.told: list[tuple[str, str, bool]] = []
        self.floods: list[Flood] = []

    async def notify(self, alarm: Alarm, reminder: bool = False) -> None:
        self.told.append((alarm.sensor, alarm.state.value, reminder))

    async def flood(self, flood: Flood) -> None:
        self.floods.append(flood)


class Rig:
    def __init__(self, path: Path, config: Alarms) -> None:
        self.clock = ManualClock(T0)
        self.manager = AlarmManager(config, Journal(path), self.clock)
        self.pager, self.mirror = Pager(), Pager("mqtt")
        self.dispatcher = Dispatcher(
            config, self.clock, notifiers=[self.pager, LogNotifier()], mirrors=[self.mirror]
        )
        self.dispatcher.attach(self.manager)

    def raise_alarm(self, sensor: str, active: bool = True) -> None:
        state = ConditionState.ACTIVE if active else ConditionState.CLEARED
        self.manager.apply(
            Condition(self.clock.now(), sensor, Rule.HIGH, state, 120.0, 100.0, "§139-15 D(2)")
        )

    async def settle(self) -> None:
        task = asyncio.create_task(self.dispatcher.run())
        await self.dispatcher.drain()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_flood_is_one_notification_not_dozens(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", Alarms(flood_count=10, flood_window=600, renotify_interval=0))

    async def go() -> None:
        for i in range(30):
            rig.raise_alarm(f"s{i}")
            rig.clock.advance(10)
        await rig.settle()
        assert len(rig.pager.told) == 10  # the first ten, then the flood notice
        assert [f.active for f in rig.pager.floods] == [True]
        assert rig.pager.floods[0].count == 11
        assert len(rig.mirror.told) == 30  # mirrors keep an exact copy of the state
        rig.clock.advance(600)
        rig.dispatcher.tick()
        await rig.settle()
        end = rig.pager.floods[-1]
        assert not end.active and end.count == 20 and len(end.alarms) == 30
        assert rig.dispatcher.stats()["floods"] == 1

    asyncio.run(go())
    rig.manager.close()


def test_unacknowledged_high_priority_is_renotified_until_acked(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", Alarms(renotify_interval=900))

    async def go() -> None:
        rig.raise_alarm("outfall.oil")
        rig.clock.advance(899)
        rig.dispatcher.tick()
        rig.clock.advance(1)
        rig.dispatcher.tick()
        rig.clock.advance(900)
        rig.dispatcher.tick()
        rig.manager.acknowledge("outfall.oil", Rule.HIGH, "dana")
        rig.clock.advance(900)
        rig.dispatcher.tick()
        await rig.settle()

    asyncio.run(go())
    assert rig.pager.told == [
        ("outfall.oil", "active_unacknowledged", False),
        ("outfall.oil", "active_unacknowledged", True),
        ("outfall.oil", "active_unacknowledged", True),
        ("outfall.oil", "active_acknowledged", False),
    ]
    rig.manager.close()


def test_chattering_alarm_stops_paging_after_the_flag(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", Alarms(chatter_count=2, chatter_window=600, renotify_interval=0))

    async def go() -> None:
        for _ in range(6):
            rig.raise_alarm("outfall.oil")
            rig.clock.advance(5)
            rig.raise_alarm("outfall.oil", active=False)
            rig.clock.advance(5)
        await rig.settle()

    asyncio.run(go())
    # 3 activations + 2 clears before the flag, the flag itself, then silence
    assert len(rig.pager.told) == 6
    assert len(rig.mirror.told) == 13
    rig.manager.close()


def test_shelved_alarm_does_not_page_but_mirrors_follow(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.sqlite", Alarms(renotify_interval=60))

    async def go() -> None:
        rig.raise_alarm("outfall.oil")
        rig.manager.shelve("outfall.oil", Rule.HIGH, "dana", "analyser being calibrated", duration=600)
        rig.raise_alarm("outfall.oil", active=False)
        rig.raise_alarm("outfall.oil")
        rig.clock.advance(300)
        rig.dispatcher.tick()  # no reminder while shelved
        await rig.settle()

    asyncio.run(go())
    assert [s for _, s, _ in rig.pager.told] == ["active_unacknowledged", "shelved"]
    assert [s for _, s, _ in rig.mirror.told] == ["active_unacknowledged", "shelved", "shelved", "shelved"]
    rig.manager.close()


def test_a_failing_notifier_does_not_stop_the_others(tmp_path: Path, receiver: Receiver) -> None:
    receiver.fail_next = 100
    config = Alarms(renotify_interval=0)
    clock = ManualClock(T0)
    manager = AlarmManager(config, Journal(tmp_path / "j.sqlite"), clock)
    pager = Pager()
    hook = WebhookNotifier(Webhook(url=receiver.url, retries=0), "ps-1", backoff=0.01)
    dispatcher = Dispatcher(config, clock, notifiers=[hook, pager])
    dispatcher.attach(manager)

    async def go() -> None:
        task = asyncio.create_task(dispatcher.run())
        manager.apply(Condition(T0, "outfall.ph", Rule.LOW, ConditionState.ACTIVE, 4.2, 5.0, "§139-15 C(3)"))
        await dispatcher.drain()
        task.cancel()
        await hook.aclose()

    asyncio.run(go())
    assert len(pager.told) == 1
    stats = dispatcher.stats()["consumers"]
    assert isinstance(stats, dict)
    assert stats["webhook"]["failed"] == 1 and stats["webhook"]["failing"]
    manager.close()


def test_people_notifiers_follow_the_config(receiver: Receiver) -> None:
    from monitor.alarms import people_notifiers
    from monitor.config import build_config

    base = {"station": {"id": "ps-1"}, "sensors": [{"id": "outfall.ph", "kind": "ph"}]}
    assert [n.name for n in people_notifiers(build_config(base))] == ["log"]
    hooked = build_config({**base, "alarms": {"webhook": {"url": receiver.url}}})
    notifiers = people_notifiers(hooked)
    assert [n.name for n in notifiers] == ["log", "webhook"]

    async def go() -> None:
        await notifiers[1].notify(_alarm())
        hook = notifiers[1]
        assert isinstance(hook, WebhookNotifier)
        await hook.aclose()

    asyncio.run(go())
    assert receiver.bodies[0]["station"] == "ps-1"


def test_a_restart_on_an_unset_clock_still_reminds_of_an_unacknowledged_alarm(tmp_path: Path) -> None:
    """An unacknowledged critical alarm from before a reboot on a gateway without a
    battery-backed clock: the clock now reads a year before the alarm's last change. The
    reminder measured `now - updated_at`, negative for the year until the clock is set (on a
    gateway NTP never reaches, for ever): no reminder, and nothing said. The interval is
    measured on the clock of now from the first tick that finds it behind."""
    config = Alarms(renotify_interval=900)
    rig = Rig(tmp_path / "j.sqlite", config)

    async def before() -> None:
        rig.raise_alarm("outfall.oil")
        await rig.settle()

    asyncio.run(before())
    rig.manager.close()
    boot = T0 - 365 * 86400.0
    clock = ManualClock(boot)
    manager = AlarmManager(config, Journal(tmp_path / "j.sqlite"), clock)
    pager = Pager()
    dispatcher = Dispatcher(config, clock, notifiers=[pager])
    dispatcher.attach(manager)

    async def after() -> None:
        for _ in range(3):
            dispatcher.tick()
            clock.advance(900)
        task = asyncio.create_task(dispatcher.run())
        await dispatcher.drain()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(after())
    manager.close()
    assert pager.told == [("outfall.oil", "active_unacknowledged", True)] * 2
