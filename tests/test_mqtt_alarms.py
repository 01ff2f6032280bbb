"""Alarm state, events and operator commands over a real Mosquitto."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.alarms.journal import Journal
from monitor.alarms.manager import AlarmManager
from monitor.alarms.mqtt import AlarmCommand, AlarmPublisher, MqttCommands, parse_command
from monitor.alarms.notify import Dispatcher, Notifier
from monitor.config import Alarms
from monitor.errors import AlarmError, SourceError
from monitor.model import Alarm, AlarmState, Condition, ConditionState, ManualClock, Priority, Rule
from monitor.sources.mqtt import MqttLink
from tests.examples import examples
from tests.mqtt_tools import Peer, make_ca, mqtt_config
from tests.services import Mosquitto, free_port, wait_until
from tests.waiting import until

T0 = 1_767_225_600.0
PH_HIGH = Alarm(
    sensor="outfall.ph",
    rule=Rule.HIGH,
    state=AlarmState.UNACK,
    priority=Priority.HIGH,
    value=9.6,
    limit=9.0,
    citation="§139-15 C(3)",
    message="pH above 9.0",
    active=True,
    activated_at=T0,
    updated_at=T0,
)
SLUG = dataclasses.replace(
    PH_HIGH, sensor="outfall.flow", rule=Rule.SLUG, value=900.0, limit=600.0, citation="§139-11"
)
PH_HIGH_CONDITION = Condition(T0, "outfall.ph", Rule.HIGH, ConditionState.ACTIVE, 9.6, 9.0, "§139-15 C(3)")
SLUG_CONDITION = Condition(T0, "outfall.flow", Rule.SLUG, ConditionState.ACTIVE, 900.0, 600.0, "§139-11")


def test_retained_alarm_state_seen_by_a_late_subscriber(mosquitto: Mosquitto) -> None:
    link = MqttLink(mqtt_config(mosquitto.port), "ps-1", client_id="t-alarm-pub")
    link.start()
    link.wait_connected()
    events = Peer(mosquitto.port, "t-alarm-events")
    events.subscribe("station-monitor/ps-1/events")
    alarms = AlarmPublisher(link, "station-monitor", "ps-1")
    try:
        acked = dataclasses.replace(
            PH_HIGH, state=AlarmState.ACKED, acknowledged=True, acked_by="op", acked_at=T0 + 60
        )
        cleared = dataclasses.replace(acked, state=AlarmState.NORMAL, active=False, cleared_at=T0 + 120)
        for alarm in (PH_HIGH, SLUG, acked, cleared):
            alarms.publish(alarm)
        wait_until(lambda: len(events.received()) == 4, what="4 events")

        late = Peer(mosquitto.port, "t-alarm-late")
        late.subscribe("station-monitor/+/alarms/#")
        wait_until(lambda: len(late.received()) >= 1, what="retained alarms")
        (only,) = late.received()  # the pH alarm is normal again: its retained message is gone
        topic, payload, retained = only
        assert (topic, retained) == ("station-monitor/ps-1/alarms/outfall.flow/slug", True)
        doc = json.loads(payload)
        assert doc["station"] == "ps-1"
        assert doc["state"] == "active_unacknowledged" and doc["citation"] == "§139-11"
        assert doc["value"] == 900.0 and doc["limit"] == 600.0
        assert doc["activated_at"] == "2026-01-01T00:00:00Z"

        states = [json.loads(p)["state"] for _, p, _ in events.received()]
        assert states == ["active_unacknowledged", "active_unacknowledged", "active_acknowledged", "normal"]
        assert not any(r for _, _, r in events.received())  # the events stream is not retained
        late.close()
        alarms.publish(dataclasses.replace(SLUG, state=AlarmState.NORMAL, active=False, acknowledged=True))
    finally:
        events.close()
        link.stop()


def test_alarm_lifecycle_through_the_manager_and_dispatcher_mirror(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """Raise, clear, acknowledge in the real alarm manager; the publisher, as the
    dispatcher's mirror, leaves the broker with no retained alarm and four events."""
    link = MqttLink(mqtt_config(mosquitto.port), "ps-2", client_id="t-alarm-mirror")
    link.start()
    link.wait_connected()
    events = Peer(mosquitto.port, "t-alarm-mirror-events")
    events.subscribe("station-monitor/ps-2/events")
    clock = ManualClock(T0)
    manager = AlarmManager(Alarms(), Journal(tmp_path / "journal.sqlite"), clock)
    mirror: Notifier = AlarmPublisher(link, "station-monitor", "ps-2")
    dispatcher = Dispatcher(Alarms(), clock, mirrors=[mirror])
    dispatcher.attach(manager)
    watcher = Peer(mosquitto.port, "t-alarm-mirror-watch")
    watcher.subscribe("station-monitor/ps-2/alarms/#")

    async def scenario() -> None:
        task = asyncio.create_task(dispatcher.run())
        manager.apply(PH_HIGH_CONDITION)
        clock.advance(60)
        manager.apply(
            dataclasses.replace(PH_HIGH_CONDITION, time=T0 + 60, state=ConditionState.CLEARED, value=7.0)
        )
        manager.acknowledge("outfall.ph", Rule.HIGH, "operator", "back to normal")
        await until(lambda: len(events.received()) >= 3, what="3 events")
        task.cancel()

    try:
        asyncio.run(scenario())
        states = [json.loads(p)["state"] for _, p, _ in events.received()]
        assert states == ["active_unacknowledged", "returned_unacknowledged", "normal"]
        wait_until(lambda: len(watcher.received()) == 3, what="3 alarm state messages")
        assert watcher.received()[-1][1] == b""  # normal again: the retained state is cleared
        late = Peer(mosquitto.port, "t-alarm-mirror-late")
        late.subscribe("station-monitor/ps-2/#")
        wait_until(lambda: any(t.endswith("/status") for t, _, _ in late.received()), what="retained status")
        assert [t for t, _, _ in late.received()] == ["station-monitor/ps-2/status"]  # no alarm left
        late.close()
    finally:
        events.close()
        watcher.close()
        link.stop()
        manager.close()


def test_alarm_raised_while_the_broker_is_down_arrives_after_it_returns(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "broker")
    broker.start()
    link = MqttLink(mqtt_config(broker.port), "ps-1", client_id="t-alarm-outage", reconnect_max=2)
    link.start()
    link.wait_connected()
    try:
        broker.stop()
        wait_until(lambda: not link.connected, what="link to notice")
        AlarmPublisher(link, "station-monitor", "ps-1").publish(PH_HIGH)
        broker.start()
        wait_until(lambda: link.connected, timeout=30, what="reconnect")
        late = Peer(broker.port, "t-alarm-outage-late")
        late.subscribe("station-monitor/ps-1/alarms/#")
        wait_until(lambda: len(late.received()) == 1, what="the alarm queued during the outage")
        assert json.loads(late.received()[0][1])["sensor"] == "outfall.ph"
        late.close()
    finally:
        link.stop()
        broker.stop()


class DeployedMosquitto(Mosquitto):
    """Mosquitto started from a shipped `deploy/mosquitto/*.conf` and the shipped `acl`,
    with only the listeners and file paths moved into the test's directory."""

    def __init__(self, workdir: Path, repo: Path, conf_name: str, users: dict[str, str]) -> None:
        self.repo = repo
        self.conf_name = conf_name
        self.tls_port = 0
        super().__init__(workdir, users=users)

    def _write_conf(self) -> None:
        d = self.workdir
        pw = d / "passwd"
        pw.write_text("")
        for user, password in (self.users or {}).items():
            subprocess.run(["mosquitto_passwd", "-b", str(pw), user, password], check=True)
        pw.chmod(0o600)
        (d / "acl").write_text((self.repo / "deploy/mosquitto/acl").read_text())
        (d / "acl").chmod(0o600)
        text = (self.repo / "deploy/mosquitto" / self.conf_name).read_text()
        moves = [
            (r"^listener 1883( 127\.0\.0\.1)?$", f"listener {self.port} 127.0.0.1"),
            (r"^password_file .*$", f"password_file {pw}"),
            (r"^acl_file .*$", f"acl_file {d / 'acl'}"),
        ]
        if self.conf_name == "container.conf":
            moves.append((r"^persistence_location .*$", f"persistence_location {d}/"))
        if re.search(r"^listener 8883$", text, flags=re.M):
            certs = make_ca(d / "certs")
            self.tls_port = free_port()
            moves += [
                (r"^listener 8883$", f"listener {self.tls_port} 127.0.0.1"),
                (r"^cafile .*$", f"cafile {certs['ca']}"),
                (r"^certfile .*$", f"certfile {certs['cert']}"),
                (r"^keyfile .*$", f"keyfile {certs['key']}"),
            ]
        for old, new in moves:
            text, n = re.subn(old, new, text, flags=re.M)
            assert n == 1, old
        assert "allow_anonymous false" in text and "max_queued_messages 1000000" in text
        if self.conf_name == "container.conf":
            self.conf.write_text(f"user {getpass.getuser()}\nlog_dest stdout\n" + text)
            return
        # mosquitto.conf goes into Debian's conf.d, under Debian's own main file, which sets
        # persistence already: a second persistence_location stops Mosquitto 2.0.11.
        (d / "conf.d").mkdir(exist_ok=True)
        (d / "conf.d" / "station-monitor.conf").write_text(text)
        main = DEBIAN_MOSQUITTO_CONF.replace("/var/lib/mosquitto/", f"{d}/")
        main = main.replace("/etc/mosquitto/", f"{d}/")
        main = main.replace("pid_file /run/mosquitto/mosquitto.pid\n", "")
        main = main.replace("log_dest file /var/log/mosquitto/mosquitto.log", "log_dest stdout")
        self.conf.write_text(f"user {getpass.getuser()}\n" + main)


# /etc/mosquitto/mosquitto.conf as Debian's mosquitto 2.0.11 package ships it.
DEBIAN_MOSQUITTO_CONF = """\
# Place your local configuration in /etc/mosquitto/conf.d/
#
# A full description of the configuration file is at
# /usr/share/doc/mosquitto/examples/mosquitto.conf.example

pid_file /run/mosquitto/mosquitto.pid

persistence true
persistence_location /var/lib/mosquitto/

log_dest file /var/log/mosquitto/mosquitto.log

include_dir /etc/mosquitto/conf.d
"""


@pytest.fixture(params=["mosquitto.conf", "container.conf"])
def deployed(tmp_path: Path, repo_root: Path, request: pytest.FixtureRequest) -> Iterator[DeployedMosquitto]:
    users = {"station-monitor": "daemon-pw", "operator": "op-pw", "intruder": "in-pw", "field": "field-pw"}
    server = DeployedMosquitto(tmp_path / "deployed", repo_root, request.param, users)
    server.start()
    yield server
    server.stop()


def test_commands_over_the_shipped_broker_config_and_acl(
    deployed: DeployedMosquitto, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Operator commands through the shipped ACL into the real alarm manager, whose
    transitions go back out as retained alarm state."""
    monkeypatch.setenv("T_DAEMON_PW", "daemon-pw")
    cfg = mqtt_config(
        deployed.port, username="station-monitor", password="${T_DAEMON_PW}", command_users=["operator"]
    )
    link = MqttLink(cfg, "ps-1", client_id="t-cmd-daemon")
    manager = AlarmManager(Alarms(), Journal(tmp_path / "journal.sqlite"), ManualClock(T0))
    publisher = AlarmPublisher(link, cfg.topic_prefix, "ps-1")
    manager.listen(lambda _entry, alarm: publisher.publish(alarm))
    for c in (PH_HIGH_CONDITION, SLUG_CONDITION):
        manager.apply(c)
    commands = MqttCommands(link, cfg.topic_prefix, "ps-1", cfg.command_users, manager)
    link.start()
    link.wait_connected()
    operator = Peer(deployed.port, "t-cmd-op", "operator", "op-pw")
    intruder = Peer(deployed.port, "t-cmd-in", "intruder", "in-pw")
    base = "station-monitor/ps-1/commands"

    async def scenario() -> None:
        task = asyncio.create_task(commands.run())
        await asyncio.to_thread(operator.subscribe, f"{base}/operator/reply")
        await asyncio.to_thread(intruder.subscribe, f"{base}/intruder/reply")
        await asyncio.to_thread(intruder.subscribe, f"{base}/operator/reply")  # the ACL refuses this
        # the broker's ACL drops a message under someone else's name before the daemon sees it
        ack = {"action": "ack", "sensor": "outfall.ph", "rule": "high", "note": "dosing pump restarted"}
        await asyncio.to_thread(intruder.publish, f"{base}/operator", json.dumps(ack))
        # under its own name it arrives, and the daemon refuses a user not in command_users
        await asyncio.to_thread(intruder.publish, f"{base}/intruder", json.dumps(ack))
        await asyncio.to_thread(operator.publish, f"{base}/operator", json.dumps({**ack, "id": "c1"}))
        shelve = {"action": "shelve", "sensor": "outfall.flow", "rule": "slug", "duration": "30m"}
        await asyncio.to_thread(operator.publish, f"{base}/operator", json.dumps(shelve))  # no reason
        await asyncio.to_thread(
            operator.publish,
            f"{base}/operator",
            json.dumps({**shelve, "reason": "tank cleaning", "id": "c3"}),
        )
        await asyncio.to_thread(
            operator.publish, f"{base}/operator", json.dumps({**ack, "id": "c4"})
        )  # again
        await until(
            lambda: len(operator.received()) >= 4 and bool(intruder.received()),
            what="4 replies to the operator and 1 to the intruder",
        )
        task.cancel()

    try:
        asyncio.run(scenario())
        assert commands.accepted == 2 and commands.refused == 3  # the ACL-dropped one never arrived
        ph = manager.get("outfall.ph", Rule.HIGH)
        assert ph is not None and (ph.state, ph.acked_by, ph.ack_note) == (
            AlarmState.ACKED,
            "operator",
            "dosing pump restarted",
        )
        slug = manager.get("outfall.flow", Rule.SLUG)
        assert slug is not None and (slug.state, slug.shelved_by, slug.shelve_reason, slug.shelved_until) == (
            AlarmState.SHELVED,
            "operator",
            "tank cleaning",
            T0 + 1800,
        )
        replies = [json.loads(p) for _, p, _ in operator.received()]
        assert [(r["ok"], r["id"]) for r in replies] == [
            (True, "c1"),
            (False, None),
            (True, "c3"),
            (False, "c4"),
        ]
        assert replies[0]["alarm"]["state"] == "active_acknowledged"
        assert replies[1]["error"] == "shelve needs a reason"
        assert "already acknowledged by operator" in replies[3]["error"]  # the manager's own words
        ((topic, payload, _),) = intruder.received()  # only its own reply: it cannot read the operator's
        assert topic == f"{base}/intruder/reply"
        assert "may not command alarms" in json.loads(payload)["error"]

        late = Peer(deployed.port, "t-cmd-late", "operator", "op-pw")
        late.subscribe("station-monitor/ps-1/alarms/#")
        wait_until(lambda: len(late.received()) == 2, what="retained alarm state")
        retained = {t.rsplit("/", 2)[-2]: json.loads(p)["state"] for t, p, _ in late.received()}
        assert retained == {"outfall.ph": "active_acknowledged", "outfall.flow": "shelved"}
        late.close()
    finally:
        operator.close()
        intruder.close()
        link.stop()
        manager.close()


def test_anonymous_client_is_refused_by_the_shipped_config(deployed: DeployedMosquitto) -> None:
    link = MqttLink(mqtt_config(deployed.port), "ps-1", client_id="t-anon")
    link.start()
    try:
        with pytest.raises(SourceError, match="refused the connection for user \\(anonymous\\)"):
            link.wait_connected()
    finally:
        link.stop()


def test_shipped_debian_config_serves_tls_with_passwords(
    tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = DeployedMosquitto(
        tmp_path / "tls", repo_root, "mosquitto.conf", {"station-monitor": "daemon-pw"}
    )
    server.start()
    monkeypatch.setenv("T_DAEMON_PW", "daemon-pw")
    cfg = mqtt_config(
        server.tls_port,
        username="station-monitor",
        password="${T_DAEMON_PW}",
        tls={"ca_file": str(server.workdir / "certs" / "ca.crt")},
    )
    link = MqttLink(cfg, "ps-1", client_id="t-deployed-tls")
    try:
        link.start()
        link.wait_connected()
    finally:
        link.stop()
        server.stop()


BASE = "station-monitor/ps-1"


def cmd(doc: object, user: str = "operator") -> AlarmCommand:
    return parse_command(f"{BASE}/commands/{user}", json.dumps(doc).encode(), BASE, ["operator"])


def test_command_parsing() -> None:
    c = cmd({"action": "shelve", "sensor": "outfall.ph", "rule": "low", "reason": "calibration",
             "until": "2026-01-01T02:00:00Z"})  # fmt: skip
    assert (c.action, c.sensor, c.rule, c.user, c.until) == (
        "shelve",
        "outfall.ph",
        Rule.LOW,
        "operator",
        T0 + 7200,
    )
    assert cmd({"action": "unshelve", "sensor": "a", "rule": "slug", "user": "operator"}).user == "operator"


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ({"action": "delete", "sensor": "a", "rule": "high"}, "action must be ack, shelve or unshelve"),
        ({"action": "ack", "sensor": "a/b", "rule": "high"}, "sensor must be a sensor id"),
        ({"action": "ack", "sensor": "a", "rule": "loud"}, "rule must be one of"),
        ({"action": "ack", "sensor": "a", "rule": "high", "user": "boss"}, "not the sender 'operator'"),
        ({"action": "ack", "sensor": "a", "rule": "high", "reason": "x"}, "unknown key"),
        ({"action": "shelve", "sensor": "a", "rule": "high", "reason": "x", "until": "tomorrow"}, "until"),
        ({"action": "shelve", "sensor": "a", "rule": "high", "reason": "x", "duration": "-5m"}, "duration"),
        ({"action": "ack", "sensor": "a", "rule": "high", "note": "n" * 501}, "at most 500"),
        (["ack"], "not a JSON object"),
    ],
)
def test_bad_commands_are_refused_with_reason(doc: object, reason: str) -> None:
    with pytest.raises(AlarmError, match=reason):
        cmd(doc)


def test_command_from_user_not_in_command_users_is_refused() -> None:
    with pytest.raises(AlarmError, match="user 'mallory' may not command alarms"):
        cmd({"action": "ack", "sensor": "a", "rule": "high"}, user="mallory")
    with pytest.raises(AlarmError, match="is not station-monitor/ps-1/commands/<user>"):
        parse_command(f"{BASE}/commands/operator/x", b"{}", BASE, ["operator"])


command_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=30),
    st.sampled_from(["ack", "shelve", "unshelve", "high", "slug", "outfall.ph", "30m", "2026-01-01T00:00Z"]),
)  # fmt: skip
command_docs = st.one_of(
    st.dictionaries(
        st.sampled_from(
            ["action", "sensor", "rule", "user", "note", "reason", "until", "duration", "id", "x"]
        ),
        command_values,
        max_size=8,
    ),
    st.recursive(command_values, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c)),
)


@settings(max_examples=examples(600), deadline=None)
@given(doc=command_docs, raw=st.binary(max_size=64), use_raw=st.booleans())
def test_random_commands_give_a_command_or_an_alarm_error(doc: object, raw: bytes, use_raw: bool) -> None:
    payload = raw if use_raw else json.dumps(doc).encode()
    try:
        c = parse_command(f"{BASE}/commands/operator", payload, BASE, ["operator"])
    except AlarmError as exc:
        assert str(exc)
        return
    assert c.action in ("ack", "shelve", "unshelve") and c.user == "operator"
    assert c.action != "shelve" or c.reason
