"""The one module that imports paho: `MqttLink`, the daemon's connection to its broker.

One link per daemon carries everything MQTT: sensor subscriptions, alarm topics,
operator commands, and the station's birth / last-will status. paho runs its
network loop on its own thread; handlers registered with `subscribe` are called on
that thread and must only hand the message over (see `MqttSource`).

Sessions are persistent (MQTT 5 session expiry, or clean_session false on 3.1.1)
with a stable client id, so QoS 1 messages published while the daemon was briefly
away are delivered when it comes back. Acknowledgement is manual: a message is
acknowledged when its handler returns, or, for handlers subscribed with
`acked=True` (sensor readings), when the handler's `Receipt.done()` says it is
stored; a message not acknowledged when the daemon dies is delivered again.
paho reconnects with exponential backoff; every subscription is made again on each
connect, so a broker that restarted without its persistence file still feeds us.
Every paho error is translated into `SourceError` here; the password is never put
into a message or a log line.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.client import WebsocketConnectionError
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.exception import MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import MQTTException as SubscribeOptionsError

from monitor.config.sources import Mqtt
from monitor.errors import SourceError
from monitor.sources.mqtt_receipt import AckedHandler, Receipt
from monitor.sources.payload import matches

log = logging.getLogger(__name__)

Handler = Callable[[str, bytes], None]
"""Called on paho's thread with (topic, payload) for each message on a subscription;
the message is acknowledged when the handler returns."""


MAX_ROUTES = 10_000

# The error map: every exception paho defines or lets through from our calls (a test checks
# paho's own classes are covered), most specific first -> the cause in words. Each becomes a
# SourceError naming the broker; the password is never part of it.
ERRORS: dict[type[BaseException], str] = {
    WebsocketConnectionError: "websocket handshake failed",
    MQTTException: "MQTT protocol error",  # and MalformedPacket
    SubscribeOptionsError: "invalid subscription options",  # a class of its own in paho 2
    ssl.SSLError: "TLS error",
    OSError: "network error",
    ValueError: "invalid argument",
    RuntimeError: "not possible in this state",
}
CAUGHT = tuple(ERRORS)


def translate(exc: BaseException, what: str) -> SourceError:
    cause = next((text for cls, text in ERRORS.items() if isinstance(exc, cls)), "error")
    return SourceError(f"{what}: {cause}: {exc}" if str(exc) else f"{what}: {cause}")


ONLINE = b"online"
OFFLINE = b"offline"


TOPIC_ROOM = 4096  # bytes of topic, properties and header a packet may add to max_payload


def max_packet(max_payload: int) -> int:
    """The largest packet read at all: twice max_payload, so a payload a little over the
    limit still arrives and is counted and logged as a bad payload on its topic, while
    a huge one is refused by size before it is read (by the broker on MQTT 5)."""
    return 2 * max_payload + TOPIC_ROOM


_HEAD = 2 + 65535 + 2  # a PUBLISH's topic length, longest topic and packet id
_CHUNK = 65536
_PUBLISH = 0x30


class GuardedClient(paho.Client):
    """paho reads a whole packet into memory before any callback sees it, so a 200 MB
    payload cost 200 MB (and more) before `max_payload` could refuse it. MQTT 5 asks the
    broker not to send such packets at all (Maximum Packet Size in CONNECT); this guard
    covers 3.1.1 and a broker that ignores the limit: a packet over `max_packet` is read
    in 64 KB chunks and thrown away as it arrives, keeping only its topic and packet id,
    then acknowledged (so the broker does not send it again) and reported to `on_oversized`.

    It overrides two private paho methods (`_sock_recv`, `_packet_handle`);
    tests/test_mqtt_guard.py proves it against a real Mosquitto on each paho upgrade.
    """

    max_packet: int = 1 << 20
    on_oversized: Callable[[str, int], None] | None = None

    _skipping = 0  # remaining length of the packet being thrown away; 0 when none

    def _sock_recv(self, bufsize: int) -> bytes:
        packet = self._in_packet
        if packet["have_remaining"] and packet["remaining_length"] > self.max_packet:
            self._skipping = int(packet["remaining_length"])
            kept = packet["packet"]
            if len(kept) > _HEAD:
                del kept[_HEAD:]
            bufsize = min(bufsize, _CHUNK)
        return super()._sock_recv(bufsize)

    def _packet_handle(self) -> MQTTErrorCode:
        size, self._skipping = self._skipping, 0
        if not size:
            return super()._packet_handle()
        command = int(self._in_packet["command"])
        if command & 0xF0 != _PUBLISH:
            return MQTTErrorCode.MQTT_ERR_PROTOCOL  # an oversized non-PUBLISH: drop the link
        head = bytes(self._in_packet["packet"])
        length = int.from_bytes(head[:2], "big")
        topic = head[2 : 2 + length].decode("utf-8", "replace")
        qos = (command & 0x06) >> 1
        if qos and len(head) >= 4 + length:
            mid = int.from_bytes(head[2 + length : 4 + length], "big")
            # Acknowledge: refused for good, so the broker must not send it again.
            (self._send_puback if qos == 1 else self._send_pubrec)(mid)
        if self.on_oversized is not None:
            self.on_oversized(topic, size)
        return MQTTErrorCode.MQTT_ERR_SUCCESS


class MqttLink:
    """A persistent, self-healing connection to one broker for one station."""

    def __init__(
        self,
        config: Mqtt,
        station: str,
        *,
        client_id: str | None = None,
        reconnect_min: int = 1,
        reconnect_max: int = 30,
        announce: bool = True,
    ) -> None:
        """`announce=False` for a client that is not a station (the fleet view): no
        birth, no last will, so it never shows up as a station itself."""
        self.config = config
        self.announce = announce
        self.station = station
        self.client_id = client_id or config.client_id or f"station-monitor-{station}"
        self.status_topic = f"{config.topic_prefix}/{station}/status"
        self.where = f"{config.host}:{config.port}"
        self.user = config.username or "(anonymous)"
        self._subs: dict[str, tuple[int, Handler | AckedHandler, bool]] = {}
        self._connected_callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._settled = threading.Event()  # first CONNACK (good or refused) or connect failure
        self._connected = False
        self._stopping = False
        self._error: str | None = None
        self._down_since: float | None = None
        self._pending_subs: dict[int, str] = {}
        self._subs_sent = False  # this connection's subscriptions have been sent
        self._subs_acked = threading.Event()  # ... and the broker acknowledged every one
        # topic -> (handlers, acked handlers), filled as topics arrive
        self._routes: dict[str, tuple[tuple[Handler, ...], tuple[AckedHandler, ...]]] = {}
        self.max_packet = max_packet(config.max_payload)
        self.oversized = 0  # packets refused by size before they were read into memory
        self.handler_errors = 0  # messages a handler failed on
        self._handler_failing: set[str] = set()  # topics whose handler failure was logged
        self._client = self._make_client(reconnect_min, reconnect_max)

    def __repr__(self) -> str:
        return f"MqttLink({self.client_id!r} -> {self.where}, user {self.user})"

    # -- public surface ------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def last_error(self) -> str | None:
        """Why the last connect attempt failed (None once connected)."""
        return self._error

    def subscribe(
        self, topic_filter: str, qos: int, handler: Handler | AckedHandler, *, acked: bool = False
    ) -> None:
        """Route messages on `topic_filter` to `handler`; kept across reconnects.

        With `acked`, `handler` is an `AckedHandler` and acknowledges through its
        `Receipt`. Register before `start()` so that messages the broker kept for our
        session are not delivered before anyone listens for them."""
        with self._lock:
            self._subs[topic_filter] = (qos, handler, acked)
            self._routes = {}
        if self._connected:
            self._subscribe_all([topic_filter])

    @property
    def subscribed(self) -> bool:
        """Connected, and the broker has acknowledged every subscription of this connection:
        from here on a message published to a subscribed topic reaches us (a broker that
        restarted without its sessions has none of ours until then)."""
        with self._lock:
            return self._connected and self._subs_sent and not self._pending_subs

    def on_connected(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on paho's thread) after every successful connect."""
        self._connected_callbacks.append(callback)

    def unsubscribe(self, topic_filter: str) -> None:
        with self._lock:
            self._subs.pop(topic_filter, None)
            self._routes = {}
        if self._connected:
            self._client.unsubscribe(topic_filter)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False) -> None:
        """Queue a message. QoS 1/2 messages wait in paho's queue while the broker is
        away and go out after the reconnect; QoS 0 ones are dropped then."""
        try:
            info = self._client.publish(topic, payload, qos=qos, retain=retain)
        except CAUGHT as exc:
            raise translate(exc, f"cannot publish to {topic!r} on {self.where}") from exc
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise SourceError(f"cannot publish to {topic!r} on {self.where}: {paho.error_string(info.rc)}")

    def start(self) -> None:
        """Connect in the background; paho's thread keeps reconnecting until `stop()`."""
        cfg = self.config
        properties = None
        if cfg.protocol == "5":
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = int(cfg.session_expiry)
            properties.MaximumPacketSize = self.max_packet  # the broker must not send more
        try:
            self._client.connect_async(
                cfg.host, cfg.port, keepalive=max(1, round(cfg.keepalive)), clean_start=False,
                properties=properties,
            )  # fmt: skip
        except CAUGHT as exc:
            raise translate(exc, f"cannot connect to MQTT broker {self.where}") from exc
        self._client.loop_start()

    def wait_connected(self, timeout: float = 10.0) -> None:
        """Block until the first connect succeeded; raise `SourceError` saying why not.

        Then wait (within the same `timeout`) for the broker to acknowledge the
        subscriptions: until it has, a message published to them is not delivered to us,
        so "connected" alone would let a caller start too early. A broker that never
        answers a SUBSCRIBE is not an error here; the connection stands."""
        deadline = time.monotonic() + timeout
        while not self._connected:
            self._settled.wait(max(0.0, deadline - time.monotonic()))
            if self._connected:
                break
            if self._error is not None:
                raise SourceError(self._error)
            if time.monotonic() >= deadline:
                raise SourceError(f"no answer from MQTT broker {self.where} within {timeout:g} s")
        self._subs_acked.wait(max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 5.0) -> None:
        """Say `offline` (retained), flush what is queued, disconnect, end the thread.

        The session stays on the broker (session expiry), so messages published
        while the daemon is down are delivered when it starts again."""
        self._stopping = True
        if self._connected and self.announce:
            info = self._client.publish(self.status_topic, OFFLINE, qos=1, retain=True)
            try:
                info.wait_for_publish(timeout)
            except CAUGHT as exc:
                log.warning("MQTT %s: offline status not confirmed before disconnect (%s)", self.where,
                            translate(exc, "publish"))  # fmt: skip
        self._client.disconnect()
        self._client.loop_stop()
        self._connected = False

    # -- paho callbacks (paho's thread) ----------------------------------------------

    def _make_client(self, reconnect_min: int, reconnect_max: int) -> paho.Client:
        cfg = self.config
        v5 = cfg.protocol == "5"
        client = GuardedClient(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if v5 else False,
            manual_ack=True,
        )
        client.max_packet = self.max_packet
        client.on_oversized = self._on_oversized
        client.suppress_exceptions = True  # a bug in a handler must not end the network thread
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(reconnect_min, reconnect_max)
        if cfg.username is not None:
            password = cfg.password.get_secret_value() if cfg.password is not None else None
            client.username_pw_set(cfg.username, password)
        _set_tls(client, cfg, self.where)
        if self.announce:
            client.will_set(self.status_topic, OFFLINE, qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        return client

    def _on_message(self, _client: Any, _userdata: Any, msg: paho.MQTTMessage) -> None:
        """Route by topic through a cache: one dict lookup per message on the hot path."""
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            log.warning("MQTT %s: dropped a message whose topic is not UTF-8", self.where)
            return
        routes = self._routes.get(topic)
        if routes is None:
            with self._lock:
                subs = [(h, acked) for f, (_q, h, acked) in self._subs.items() if matches(f, topic)]
                routes = (
                    tuple(h for h, acked in subs if not acked),  # type: ignore[misc]
                    tuple(h for h, acked in subs if acked),  # type: ignore[misc]
                )
                if len(self._routes) >= MAX_ROUTES:  # a publisher inventing topics
                    self._routes = {}
                self._routes[topic] = routes
            if not subs:
                log.debug("MQTT %s: message on %r matches no subscription", self.where, topic)
        plain, acked = routes
        payload = bytes(msg.payload)  # bytes(b) is b itself: no copy
        for handler in plain:
            try:
                handler(topic, payload)
            except Exception as exc:  # a handler bug must not kill paho's thread or lose the rest
                self._handler_failed(topic, exc)
        if not acked:
            if msg.qos > 0:
                self._client.ack(msg.mid, msg.qos)
            return
        receipt = Receipt(self._client, msg.mid, msg.qos, bool(msg.retain), len(acked))
        for acked_handler in acked:
            try:
                acked_handler(topic, payload, receipt)
            except Exception as exc:
                self._handler_failed(topic, exc)
                receipt.done()

    def _handler_failed(self, topic: str, exc: Exception) -> None:
        """Counted always; a traceback once per topic, not once per message."""
        self.handler_errors += 1
        if topic in self._handler_failing or len(self._handler_failing) >= MAX_ROUTES:
            log.debug("MQTT %s: handler failed on topic %r again: %r", self.where, topic, exc)
            return
        self._handler_failing.add(topic)
        log.error("MQTT %s: handler failed on topic %r (logged once per topic)", self.where, topic,
                  exc_info=exc)  # fmt: skip

    def _on_oversized(self, topic: str, size: int) -> None:
        """paho's thread: a packet over the size limit was thrown away unread."""
        self.oversized += 1
        if self.oversized == 1 or self.oversized % 1000 == 0:
            log.warning(
                "MQTT %s: refused a %d-byte message on %r unread (over max_payload %d); %d so far",
                self.where, size, topic, self.config.max_payload, self.oversized,
            )  # fmt: skip

    def _on_connect(
        self, client: paho.Client, _userdata: Any, flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            self._fail(
                f"MQTT broker {self.where} refused the connection for user {self.user}: {reason}"
                + _hint(reason)
            )
            return
        was_down = self._down_since
        self._connected = True
        self._error = None
        self._down_since = None
        if self.announce:
            client.publish(self.status_topic, ONLINE, qos=1, retain=True)
        with self._lock:
            filters = list(self._subs)
        self._subscribe_all(filters)
        self._subs_sent = True
        self._note_subscribed()
        for callback in self._connected_callbacks:
            try:
                callback()
            except Exception:
                log.exception("MQTT %s: on-connect callback failed", self.where)
        if was_down is not None:
            log.info("MQTT %s: connected again after %.0f s", self.where, time.monotonic() - was_down)
        else:
            log.info("MQTT %s: connected as %s (session present: %s)", self.where, self.client_id,
                     bool(getattr(flags, "session_present", False)))  # fmt: skip
        self._settled.set()

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        # paho calls this inside its `except OSError`, so the cause is still at hand.
        exc = sys.exc_info()[1]
        _close_sockets(exc)
        self._fail(f"cannot connect to MQTT broker {self.where}: {exc or 'connection failed'}")

    def _on_disconnect(
        self, _client: Any, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if not self._connected:
            return
        self._connected = False
        self._subs_sent = False
        self._subs_acked.clear()
        if self._stopping:
            return
        self._down_since = time.monotonic()
        log.warning("MQTT %s: connection lost (%s); reconnecting with backoff", self.where, reason)

    def _on_subscribe(
        self, _client: Any, _userdata: Any, mid: int, reasons: list[ReasonCode], _props: Any
    ) -> None:
        with self._lock:
            topic = self._pending_subs.pop(mid, "?")
        self._note_subscribed()
        for reason in reasons:
            if reason.is_failure:
                log.error("MQTT %s: broker refused subscription %r for user %s: %s (check the ACL)",
                          self.where, topic, self.user, reason)  # fmt: skip

    def _note_subscribed(self) -> None:
        if self.subscribed:
            self._subs_acked.set()

    def _fail(self, message: str) -> None:
        """One failed attempt: ERROR when an episode starts, DEBUG while it lasts."""
        if self._down_since is None:
            self._down_since = time.monotonic()
        if message != self._error:
            log.error("%s", message)
        else:
            log.debug("%s (still)", message)
        self._error = message
        self._settled.set()

    def _subscribe_all(self, filters: list[str]) -> None:
        for topic_filter in filters:
            with self._lock:
                entry = self._subs.get(topic_filter)
            if entry is None:
                continue
            rc, mid = self._client.subscribe(topic_filter, entry[0])
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                with self._lock:
                    self._pending_subs[mid] = topic_filter


def _set_tls(client: paho.Client, cfg: Mqtt, where: str) -> None:
    if cfg.tls is None:
        return
    tls = cfg.tls
    try:
        client.tls_set(
            ca_certs=str(tls.ca_file) if tls.ca_file else None,
            certfile=str(tls.cert_file) if tls.cert_file else None,
            keyfile=str(tls.key_file) if tls.key_file else None,
            cert_reqs=ssl.CERT_REQUIRED if tls.verify else ssl.CERT_NONE,
        )
    except CAUGHT as exc:
        raise translate(exc, f"MQTT TLS setup for {where} failed") from exc
    client.tls_insecure_set(not tls.verify)


def _close_sockets(exc: BaseException | None) -> None:
    """paho 2.2 leaves the socket of a failed TLS handshake to the garbage collector;
    close it now (it is still referenced from the traceback's frames)."""
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, socket.socket):
                value.close()
        tb = tb.tb_next


def _hint(reason: ReasonCode) -> str:
    text = str(reason).lower()
    if "password" in text or "not authorized" in text or "bad user" in text:
        return " (check mqtt.username, the password source and the broker's password file)"
    return ""


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    """What became of one operator command sent on a person's behalf.

    `status`: `applied` / `refused` (the station replied), `not_authorized` (the
    broker refused the login or, on MQTT 5, the publish: its ACL decides who may
    command which station), `no_reply` (nothing came back in time: the station is
    offline, or an MQTT 3.1.1 broker dropped a publish its ACL forbids), or
    `unreachable` (no broker)."""

    status: str
    detail: str
    reply: dict[str, Any] | None = None


def send_command(
    config: Mqtt, station: str, user: str, password: str, command: dict[str, Any], timeout: float = 5.0
) -> CommandOutcome:
    """Publish one command to `<prefix>/<station>/commands/<user>` as `user`, wait for the reply.

    A short-lived connection with the person's own credentials, so the broker's ACL
    (not this process) decides who may command which station, and the station
    journals the person's name. The password is never logged."""
    where = f"{config.host}:{config.port}"
    base = f"{config.topic_prefix}/{station}/commands/{user}"
    v5 = config.protocol == "5"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"fleet-cmd-{user}-{secrets.token_hex(4)}",
        protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
        clean_session=None if v5 else True,
    )
    client.suppress_exceptions = True
    client.username_pw_set(user, password)
    _set_tls(client, config, where)
    connected, subscribed, published, replied = (threading.Event() for _ in range(4))
    state: dict[str, Any] = {}
    command_id = str(command.get("id") or secrets.token_hex(6))
    body = json.dumps({**command, "id": command_id}, separators=(",", ":")).encode()

    def on_connect(_c: Any, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        state["connect"] = reason
        connected.set()

    def on_subscribe(_c: Any, _u: Any, _mid: int, reasons: list[ReasonCode], _p: Any) -> None:
        state["subscribe"] = reasons
        subscribed.set()

    def on_publish(_c: Any, _u: Any, _mid: int, reason: ReasonCode, _p: Any) -> None:
        state["publish"] = reason
        published.set()

    def on_message(_c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        try:
            doc = json.loads(msg.payload)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return
        if isinstance(doc, dict) and doc.get("id") == command_id:
            state["reply"] = doc
            replied.set()

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_publish = on_publish
    client.on_message = on_message
    try:
        client.connect_async(config.host, config.port, keepalive=max(1, round(config.keepalive)))
    except (OSError, ValueError) as exc:
        return CommandOutcome("unreachable", f"cannot connect to MQTT broker {where}: {exc}")
    client.loop_start()
    try:
        if not connected.wait(timeout):
            return CommandOutcome("unreachable", f"no answer from MQTT broker {where} within {timeout:g} s")
        reason: ReasonCode = state["connect"]
        if reason.is_failure:
            return CommandOutcome("not_authorized", f"broker {where} refused user {user}: {reason}")
        client.subscribe(f"{base}/reply", 1)
        subscribed.wait(timeout)
        client.publish(base, body, qos=1)
        if published.wait(timeout):
            pub: ReasonCode | None = state.get("publish")
            if pub is not None and pub.is_failure:
                return CommandOutcome(
                    "not_authorized", f"broker {where} refused the command for {user}: {pub}"
                )
        if not replied.wait(timeout):
            return CommandOutcome(
                "no_reply",
                f"no reply from station {station} within {timeout:g} s (offline, or the broker's ACL "
                f"does not let {user} command it)",
            )
        reply: dict[str, Any] = state["reply"]
        if reply.get("ok"):
            return CommandOutcome("applied", "applied", reply)
        return CommandOutcome("refused", str(reply.get("error", "refused")), reply)
    finally:
        client.disconnect()
        client.loop_stop()
