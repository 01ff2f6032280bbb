"""The fleet as the broker's retained topics describe it: every station, its status, its alarms.

Each daemon keeps three things on its broker (see `monitor.alarms.mqtt`):
`<p>/<s>/status` (retained `online`, or `offline` from a clean stop or from the
last will the broker publishes 1.5 x keepalive after the gateway went silent),
`<p>/<s>/alarms/<sensor>/<rule>` (retained alarm JSON, emptied once normal) and
`<p>/<s>/events` (every transition). `FleetView` folds those messages into one
picture; it knows nothing of paho or HTTP, and takes `now` from its caller, so
tests drive it with any clock.

What the fields mean:

- `online`: the last status message said so. A station whose gateway died is
  offline as soon as the broker publishes its will; the fleet never guesses.
- `since`: when this view saw the status change (null when the status was
  already retained before the view subscribed: the broker does not keep when).
- `last_seen`: for an online station, now (the broker holds its session alive, so
  it answered within 1.5 x keepalive); for an offline one, the last moment it was
  known online, or null when never seen online by this view.
- alarms of an offline station are kept and marked `stale`, never cleared: the
  retained state is the last the station published, and nobody knows if it holds.

Hostile publishers are bounded: at most `max_stations` stations and
`max_alarms` alarms per station, payloads over `max_payload` bytes and
topics that do not parse are counted in `refused` and otherwise ignored.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from monitor.model import AlarmState, Priority, iso

log = logging.getLogger(__name__)

_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")
PRIORITIES = tuple(p.value for p in Priority)
UNACKNOWLEDGED = frozenset({AlarmState.UNACK.value, AlarmState.RTN_UNACK.value})


def _of(doc: dict[str, Any], key: str, kind: type) -> Any:
    """A field of a station's alarm as the type a station sends, else None: whatever a
    publisher wrote must not break the page for every other station."""
    value = doc.get(key)
    return value if isinstance(value, kind) else None


def _number(value: Any) -> float | None:
    """A finite number or None (the JSON answer refuses NaN and infinities)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _is_id(text: str) -> bool:
    return bool(text) and len(text) <= 128 and set(text) <= _ID_CHARS


@dataclass(slots=True)
class StationState:
    """What the view knows of one station."""

    id: str
    online: bool | None = None  # None: no status message seen yet
    bridge: bool | None = None  # a Mosquitto bridge's notification: None when not bridged
    since: float | None = None
    last_online: float | None = None
    alarms: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def up(self) -> bool:
        """Online as far as anyone can tell: its status says so and its bridge (if any) is up."""
        return bool(self.online) and self.bridge is not False


class FleetView:
    """Every station under one topic prefix, built from the broker's messages alone."""

    def __init__(
        self,
        prefix: str,
        consoles: dict[str, str] | None = None,
        *,
        max_stations: int = 1000,
        max_alarms: int = 2000,
        max_payload: int = 65536,
    ) -> None:
        self.prefix = prefix
        self.consoles = dict(consoles or {})
        self.max_stations = max_stations
        self.max_alarms = max_alarms
        self.max_payload = max_payload
        self.stations: dict[str, StationState] = {}
        self.broker_connected = False
        self.refused = 0
        self._warned: set[str] = set()

    # -- input: one MQTT message ----------------------------------------------------

    def handle(self, topic: str, payload: bytes, now: float) -> None:
        """Fold one message in; anything that does not parse is counted and dropped."""
        head = self.prefix + "/"
        if not topic.startswith(head):
            return
        parts = topic[len(head) :].split("/")
        if len(payload) > self.max_payload:
            self._refuse(topic, f"payload over {self.max_payload} bytes")
            return
        if not _is_id(parts[0]):
            self._refuse(topic, "station id is not [A-Za-z0-9_.:-]")
            return
        if parts[1:] == ["status"]:
            self._status(parts[0], payload, now)
        elif len(parts) == 4 and parts[1] == "alarms":
            self._alarm(parts[0], parts[2], parts[3], payload, topic)
        elif parts[1:] == ["bridge"]:
            self._bridge(parts[0], payload, now)
        elif parts[1:] == ["events"]:
            station = self._station(parts[0], topic)
            if station is not None and station.up:
                station.last_online = now

    def _station(self, sid: str, topic: str) -> StationState | None:
        station = self.stations.get(sid)
        if station is None:
            if len(self.stations) >= self.max_stations:
                self._refuse(topic, f"more than {self.max_stations} stations")
                return None
            station = self.stations[sid] = StationState(sid)
        return station

    def _status(self, sid: str, payload: bytes, now: float) -> None:
        text = payload.decode("utf-8", "replace").strip()
        topic = f"{self.prefix}/{sid}/status"
        if text not in ("online", "offline", ""):
            self._refuse(topic, "status is neither online nor offline")
            return
        if text == "":  # the retained status was deleted: the station was decommissioned
            self.stations.pop(sid, None)
            return
        station = self._station(sid, topic)
        if station is None:
            return
        self._change(station, now, online=text == "online")

    def _bridge(self, sid: str, payload: bytes, now: float) -> None:
        """`<p>/<s>/bridge`: a gateway's Mosquitto bridge says 1 (up) or 0 (down, its will on
        the central broker). With the link down the station's own last will cannot reach
        the centre, so its retained `online` there would be a lie: the bridge decides."""
        topic = f"{self.prefix}/{sid}/bridge"
        text = payload.decode("utf-8", "replace").strip()
        if text not in ("0", "1"):
            self._refuse(topic, "bridge notification is neither 0 nor 1")
            return
        station = self._station(sid, topic)
        if station is not None:
            self._change(station, now, bridge=text == "1")

    @staticmethod
    def _change(station: StationState, now: float, **update: bool) -> None:
        before_known, before = station.online is not None, station.up
        for key, value in update.items():
            setattr(station, key, value)
        if before_known and station.online is not None and station.up != before:
            station.since = now  # a change this view saw happen
        if before or station.up:  # online now, or online until this moment
            station.last_online = now

    def _alarm(self, sid: str, sensor: str, rule: str, payload: bytes, topic: str) -> None:
        if not (_is_id(sensor) and _is_id(rule)):
            self._refuse(topic, "sensor or rule is not [A-Za-z0-9_.:-]")
            return
        station = self._station(sid, topic)
        if station is None:
            return
        key = (sensor, rule)
        if not payload:
            station.alarms.pop(key, None)
            return
        try:
            doc = json.loads(payload)
        except (UnicodeDecodeError, ValueError, RecursionError):
            self._refuse(topic, "alarm payload is not JSON")
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("state"), str):
            self._refuse(topic, "alarm payload has no state")
            return
        if key not in station.alarms and len(station.alarms) >= self.max_alarms:
            self._refuse(topic, f"more than {self.max_alarms} alarms for one station")
            return
        station.alarms[key] = doc

    def _refuse(self, topic: str, why: str) -> None:
        self.refused += 1
        if why not in self._warned:  # once per kind of problem, not per message
            self._warned.add(why)
            log.warning("fleet: ignored a message on %r: %s", topic[:200], why)

    def connection(self, connected: bool) -> None:
        """The view's own link to the broker went up or down."""
        self.broker_connected = connected

    # -- output: the fleet as JSON --------------------------------------------------

    def snapshot(self, now: float) -> dict[str, Any]:
        """`{"stations": [...], "broker_connected": ...}`, times ISO 8601 UTC with Z."""
        return {
            "broker_connected": self.broker_connected,
            "refused_messages": self.refused,
            "stations": [self._station_json(s, now) for _, s in sorted(self.stations.items())],
        }

    def _station_json(self, s: StationState, now: float) -> dict[str, Any]:
        online = s.up and self.broker_connected
        last_seen = now if online else s.last_online
        stale = not online
        alarms = []
        for (sensor, rule), doc in sorted(s.alarms.items()):
            alarms.append(
                {
                    "sensor": sensor,
                    "rule": rule,
                    "state": doc.get("state"),
                    "priority": _of(doc, "priority", str),
                    "active": _of(doc, "active", bool),
                    "acknowledged": _of(doc, "acknowledged", bool),
                    "value": _number(doc.get("value")),
                    "limit": _number(doc.get("limit")),
                    "citation": _of(doc, "citation", str),
                    "message": _of(doc, "message", str),
                    "activated_at": _of(doc, "activated_at", str),
                    "stale": stale,
                }
            )
        counts = {p: 0 for p in PRIORITIES}
        unacked = {p: 0 for p in PRIORITIES}
        for a in alarms:
            p = a["priority"] if a["priority"] in counts else "low"
            if a["active"]:
                counts[p] += 1
            if a["state"] in UNACKNOWLEDGED:
                unacked[p] += 1
        return {
            "id": s.id,
            "online": s.up,
            "bridge": s.bridge,
            "since": None if s.since is None else iso(s.since),
            "last_seen": None if last_seen is None else iso(last_seen),
            "console": self.consoles.get(s.id),
            "active_by_priority": counts,
            "unacknowledged_by_priority": unacked,
            "alarms": alarms,
        }
