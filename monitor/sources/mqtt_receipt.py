"""A received MQTT message that its handler acknowledges itself, once it is stored.

Free of paho (the link in `mqtt.py` is the one module that imports it): a `Receipt`
holds what the acknowledgement needs and calls the client's `ack(mid, qos)` when
every handler the message reached said `done()`. `done()` may be called on any
thread; the last one sends the PUBACK.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class Acker(Protocol):
    """The client that sends acknowledgements (paho's `Client.ack`)."""

    def ack(self, mid: int, qos: int) -> object: ...


class Receipt:
    """One received message, for a handler that acknowledges it itself (`subscribe(...,
    acked=True)`): `done()` once it is stored; the PUBACK goes out when every such
    handler the message reached said so. `retain` is the broker's retained flag."""

    __slots__ = ("_client", "_left", "_lock", "mid", "qos", "retain")

    def __init__(self, client: Acker, mid: int, qos: int, retain: bool, handlers: int) -> None:
        self._client = client
        self.mid = mid
        self.qos = qos
        self.retain = retain
        self._left = handlers
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left != 0:
                return
        if self.qos > 0:
            self._client.ack(self.mid, self.qos)


AckedHandler = Callable[[str, bytes, Receipt], None]
"""Called on paho's thread with (topic, payload, receipt); the handler calls
`receipt.done()` (on any thread) once the message may be acknowledged."""
