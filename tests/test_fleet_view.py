"""The fleet view as a pure fold of broker messages (no broker, clock given)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.fleet.view import FleetView
from tests.examples import examples

P = "station-monitor"
ALARM = {
    "sensor": "outfall.ph",
    "rule": "high",
    "state": "active_unacknowledged",
    "priority": "high",
    "active": True,
    "acknowledged": False,
    "message": "pH 12.5 above 9",
}


def alarm(**kw: object) -> bytes:
    return json.dumps({**ALARM, **kw}).encode()


def test_status_since_and_last_seen() -> None:
    view = FleetView(P)
    view.connection(True)
    view.handle(f"{P}/ps-1/status", b"online", 100.0)  # retained: already online when we came
    view.handle(f"{P}/ps-2/status", b"offline", 100.0)  # retained offline: since when is unknown
    snap = {s["id"]: s for s in view.snapshot(130.0)["stations"]}
    assert (snap["ps-1"]["online"], snap["ps-1"]["since"], snap["ps-1"]["last_seen"]) == (
        True,
        None,
        "1970-01-01T00:02:10Z",
    )
    assert (snap["ps-2"]["online"], snap["ps-2"]["since"], snap["ps-2"]["last_seen"]) == (False, None, None)
    view.handle(f"{P}/ps-1/status", b"offline", 140.0)  # the broker published its last will
    s1 = view.snapshot(200.0)["stations"][0]
    assert (s1["online"], s1["since"], s1["last_seen"]) == (
        False,
        "1970-01-01T00:02:20Z",
        "1970-01-01T00:02:20Z",
    )
    view.handle(f"{P}/ps-1/status", b"online", 210.0)
    s1 = view.snapshot(215.0)["stations"][0]
    assert (s1["online"], s1["since"]) == (True, "1970-01-01T00:03:30Z")


def test_alarms_of_an_offline_station_are_stale_not_cleared() -> None:
    view = FleetView(P)
    view.connection(True)
    view.handle(f"{P}/ps-1/status", b"online", 1.0)
    view.handle(f"{P}/ps-1/alarms/outfall.ph/high", alarm(), 1.0)
    view.handle(f"{P}/ps-1/alarms/outfall.flow/slug", alarm(sensor="outfall.flow", rule="slug",
                priority="critical", state="active_acknowledged", acknowledged=True), 1.0)  # fmt: skip
    (s,) = view.snapshot(2.0)["stations"]
    assert [a["stale"] for a in s["alarms"]] == [False, False]
    assert s["active_by_priority"]["critical"] == 1 and s["active_by_priority"]["high"] == 1
    assert s["unacknowledged_by_priority"] == {"critical": 0, "high": 1, "medium": 0, "low": 0}
    view.handle(f"{P}/ps-1/status", b"offline", 3.0)
    (s,) = view.snapshot(4.0)["stations"]
    assert len(s["alarms"]) == 2 and all(a["stale"] for a in s["alarms"])
    view.handle(f"{P}/ps-1/alarms/outfall.ph/high", b"", 5.0)  # normal again: the retained topic emptied
    (s,) = view.snapshot(6.0)["stations"]
    assert [a["sensor"] for a in s["alarms"]] == ["outfall.flow"]


def test_a_bridged_station_is_offline_while_its_bridge_is_down() -> None:
    """Behind a cut bridge the station's own will cannot reach the central broker; the
    bridge's notification (its will there) is what says the station is out of reach."""
    view = FleetView(P)
    view.connection(True)
    view.handle(f"{P}/ps-1/bridge", b"1", 1.0)
    view.handle(f"{P}/ps-1/status", b"online", 1.0)
    view.handle(f"{P}/ps-1/alarms/outfall.ph/high", alarm(), 1.0)
    (s,) = view.snapshot(2.0)["stations"]
    assert (s["online"], s["bridge"], s["alarms"][0]["stale"]) == (True, True, False)
    view.handle(f"{P}/ps-1/bridge", b"0", 5.0)
    (s,) = view.snapshot(9.0)["stations"]
    assert (s["online"], s["since"], s["last_seen"]) == (
        False,
        "1970-01-01T00:00:05Z",
        "1970-01-01T00:00:05Z",
    )
    assert s["alarms"][0]["stale"] is True
    view.handle(f"{P}/ps-1/bridge", b"1", 20.0)
    (s,) = view.snapshot(21.0)["stations"]
    assert (s["online"], s["since"]) == (True, "1970-01-01T00:00:20Z")


def test_a_view_without_its_broker_claims_nothing_is_online() -> None:
    view = FleetView(P)
    view.connection(True)
    view.handle(f"{P}/ps-1/status", b"online", 1.0)
    view.handle(f"{P}/ps-1/alarms/outfall.ph/high", alarm(), 1.0)
    view.connection(False)
    doc = view.snapshot(2.0)
    assert doc["broker_connected"] is False
    (s,) = doc["stations"]
    assert s["alarms"][0]["stale"] is True and s["last_seen"] == "1970-01-01T00:00:01Z"


def test_hostile_publishers_are_bounded_and_counted() -> None:
    view = FleetView(P, max_stations=3, max_alarms=2, max_payload=1000)
    view.connection(True)
    for i in range(10):
        view.handle(f"{P}/ps-{i}/status", b"online", 1.0)
    assert len(view.stations) == 3
    view.handle(f"{P}/ps-0/alarms/a/high", b"x" * 2000, 1.0)
    view.handle(f"{P}/ps-0/alarms/a/high", b"{not json", 1.0)
    view.handle(f"{P}/ps-0/alarms/a/high", b"[1, 2]", 1.0)
    view.handle(f"{P}/ps-0/alarms/a b/high", alarm(), 1.0)
    view.handle(f"{P}/ps-0/status", b"<script>", 1.0)
    for i in range(5):
        view.handle(f"{P}/ps-0/alarms/s{i}/high", alarm(), 1.0)
    assert len(view.stations["ps-0"].alarms) == 2
    assert view.refused == 7 + 5 + 3  # 7 stations, 5 bad messages, 3 alarms past the cap
    view.handle(f"{P}/ps-0/status", b"", 2.0)  # retained status deleted: decommissioned
    assert "ps-0" not in view.stations


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["status", "bridge", "events", "alarms/x/high", "alarms/y/slug", "other/z"]),
            st.sampled_from(["ps-1", "ps-2", "bad id", ""]),
            st.one_of(
                st.binary(max_size=50), st.sampled_from([b"online", b"offline", b"", b"0", b"1", alarm()])
            ),
        ),
        max_size=40,
    )
)
def test_any_message_sequence_gives_a_well_formed_snapshot(msgs: list[tuple[str, str, bytes]]) -> None:
    view = FleetView(P)
    view.connection(True)
    for i, (suffix, sid, payload) in enumerate(msgs):
        view.handle(f"{P}/{sid}/{suffix}", payload, float(i))
    doc = json.loads(json.dumps(view.snapshot(1000.0)))
    for s in doc["stations"]:
        assert isinstance(s["online"], bool)
        assert all(isinstance(a["state"], str) and a["stale"] is not s["online"] for a in s["alarms"])


def test_an_alarm_with_nan_or_odd_types_cannot_take_the_fleet_page_down() -> None:
    """json.loads takes NaN, Infinity and 1e999; the app's JSONResponse refuses them
    (allow_nan=False), and an object as priority is unhashable: one station's odd alarm
    answered 500 on /api/stations for the whole fleet. Such fields are shown as null."""
    view = FleetView(P)
    view.connection(True)
    view.handle(f"{P}/ps-1/status", b"online", 1.0)
    view.handle(f"{P}/ps-2/status", b"online", 1.0)
    view.handle(f"{P}/ps-1/alarms/a/high", b'{"state": "active_unacknowledged", "value": NaN, "limit": 1e999,'
                b' "priority": {"x": 1}, "active": "yes", "message": ["m"], "citation": 7,'
                b' "activated_at": Infinity}', 1.0)  # fmt: skip
    view.handle(f"{P}/ps-2/alarms/b/high", alarm(value=12.5, limit=9), 1.0)
    doc = json.loads(json.dumps(view.snapshot(2.0), allow_nan=False))  # as the app renders it
    one, two = doc["stations"]
    [odd] = one["alarms"]
    assert odd["state"] == "active_unacknowledged"
    assert all(odd[k] is None for k in ("value", "limit", "priority", "active", "message", "citation"))
    assert odd["activated_at"] is None
    assert two["alarms"][0]["value"] == 12.5 and two["alarms"][0]["priority"] == "high"
