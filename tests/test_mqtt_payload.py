"""The MQTT payload parser: each form, each refusal, and a fuzzing property test."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.config import Subscription
from monitor.errors import PayloadError
from monitor.sources.payload import BadPayloads, Limits, Route, matches, parse
from tests.examples import examples

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def route(**kw: object) -> Route:
    base: dict[str, object] = {"topic": "plant/+/ph", "sensor": "{1}.ph"}
    base.update(kw)
    return Route.compile(Subscription.model_validate(base))


def test_bare_number_binds_sensor_from_topic() -> None:
    s = parse(route(), "plant/outfall/ph", b" 7.25\n", NOW)
    assert (s.sensor, s.time, s.value) == ("outfall.ph", NOW, 7.25)


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        (1_767_225_000, 1_767_225_000.0),  # epoch seconds
        (1_767_225_000_500, 1_767_225_000.5),  # epoch milliseconds
        ("2026-01-01T00:00:00Z", NOW),
        ("2025-12-31T19:00:00-05:00", NOW),
        ("1767225000", 1_767_225_000.0),
    ],
)
def test_json_with_value_and_time_paths(stamp: object, expected: float) -> None:
    r = route(format="json", value_path="reading.value", time_path="reading.ts")
    payload = json.dumps({"reading": {"value": 6.5, "ts": stamp}}).encode()
    s = parse(r, "plant/mill/ph", payload, NOW)
    assert (s.sensor, s.value) == ("mill.ph", 6.5)
    assert s.time == pytest.approx(expected)


def test_json_without_time_path_gets_receive_time() -> None:
    s = parse(route(format="json"), "plant/a/ph", b'{"value": 8}', NOW)
    assert (s.time, s.value) == (NOW, 8.0)


def test_json_list_index_in_path() -> None:
    s = parse(route(format="json", value_path="v.1"), "plant/a/ph", b'{"v": [1, 2.5]}', NOW)
    assert s.value == 2.5


@pytest.mark.parametrize(
    ("kw", "payload", "reason"),
    [
        ({}, b"\xff\xfe7", "not UTF-8"),
        ({}, b"seven", "not a number"),
        ({}, b"nan", "not finite"),
        ({}, b"-inf", "not finite"),
        ({"format": "json"}, b"{value: 1}", "not JSON"),
        ({"format": "json"}, b'{"val": 1}', "no 'value'"),
        ({"format": "json"}, b'{"value": NaN}', "not finite"),
        ({"format": "json"}, b'{"value": Infinity}', "not finite"),
        ({"format": "json"}, b'{"value": "7.1"}', "a string"),
        ({"format": "json"}, b'{"value": true}', "a boolean"),
        ({"format": "json"}, b'{"value": null}', "null"),
        ({"format": "json"}, b'{"value": 1e400}', "not finite"),
        ({"format": "json"}, b'{"value": ' + b"9" * 400 + b"}", "out of range"),
        ({"format": "json"}, b"[" * 100_000, "not JSON"),
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": "2026-01-01T00:00:00"}', "no zone"),
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": "yesterday"}', "neither epoch"),
        ({"format": "json", "time_path": "ts"}, b'{"value": 1}', "no 'ts'"),
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": 1767229200}', "in the future"),
        # An ISO time is never milliseconds: a garbage clock at year 9999 was divided by 1000
        # and taken as a reading of 1978 (and ended a run of refusals ahead).
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": "9999-12-31T23:59:59Z"}', "range"),
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": "6000-01-01T00:00:00Z"}', "range"),
        # Before 1970: no clock a device has; it was taken as a reading of 1969.
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": -5}', "out of range"),
        ({"format": "json", "time_path": "ts"}, b'{"value": 1, "ts": "1969-12-31T23:00:00Z"}', "range"),
    ],
)
def test_bad_payload_is_refused_with_reason(kw: dict[str, object], payload: bytes, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        parse(route(**kw), "plant/a/ph", payload, NOW, Limits(max_payload=200_000))


def test_oversized_payload_refused_before_decoding() -> None:
    blob = b"1" * (10 * 1024 * 1024)
    with pytest.raises(PayloadError, match=r"10485760 bytes is over max_payload \(65536\)"):
        parse(route(), "plant/a/ph", blob, NOW)


def test_skew_within_limit_accepted() -> None:
    r = route(format="json", time_path="ts")
    s = parse(r, "plant/a/ph", json.dumps({"value": 1, "ts": NOW + 60}).encode(), NOW, Limits(max_skew=120))
    assert s.time == NOW + 60


def test_topic_level_that_is_not_a_sensor_id_refused() -> None:
    with pytest.raises(PayloadError, match="not a valid sensor id"):
        parse(route(), "plant/a b/ph", b"7", NOW)


def test_config_refuses_bad_filters_and_templates() -> None:
    with pytest.raises(ValueError, match="names a '\\+' level, but the topic has 1"):
        Subscription.model_validate({"topic": "plant/+/ph", "sensor": "{2}.ph"})
    with pytest.raises(ValueError, match="'#' must be the last"):
        Subscription.model_validate({"topic": "plant/#/ph", "sensor": "x"})
    with pytest.raises(ValueError, match="fill a whole level"):
        Subscription.model_validate({"topic": "plant/a+/ph", "sensor": "x"})


@pytest.mark.parametrize(
    ("flt", "topic", "expected"),
    [
        ("plant/+/ph", "plant/a/ph", True),
        ("plant/+/ph", "plant/a/b/ph", False),
        ("plant/#", "plant", True),
        ("plant/#", "plant/a/b", True),
        ("#", "$SYS/broker", False),
        ("plant/ph", "plant/ph/x", False),
    ],
)
def test_filter_matching(flt: str, topic: str, expected: bool) -> None:
    assert matches(flt, topic) is expected


def test_bad_payloads_logged_once_per_topic_per_interval() -> None:
    bad = BadPayloads(interval=60)
    assert bad.record("plant/a/ph", 0.0) == 1  # first one is logged
    assert bad.record("plant/a/ph", 10.0) is None
    assert bad.record("plant/b/ph", 11.0) == 1  # another topic logs on its own
    assert bad.record("plant/a/ph", 30.0) is None
    assert bad.record("plant/a/ph", 61.0) == 3  # the line stands for the 3 since the last one
    assert bad.counts == {"plant/a/ph": 4, "plant/b/ph": 1}
    assert bad.total == 5


def test_bad_payload_topic_table_is_capped() -> None:
    bad = BadPayloads(max_topics=2)
    for i in range(5):
        bad.record(f"t/{i}", float(i))
    assert bad.counts == {"t/0": 1, "t/1": 1, BadPayloads.OTHER: 3}


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20)
)
json_doc = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
payloads = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=60).map(str.encode),
    json_doc.map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"value": json_doc, "ts": json_doc}, optional={"extra": json_doc}).map(
        lambda d: json.dumps(d).encode()
    ),
    st.floats().map(lambda f: repr(f).encode()),
)
routes = st.sampled_from(
    [
        route(),
        route(format="json"),
        route(format="json", time_path="ts"),
        route(format="json", value_path="value.0", time_path="ts.a"),
    ]
)
topics = st.one_of(st.just("plant/outfall/ph"), st.text(max_size=10).map(lambda t: f"plant/{t}/ph"))


@settings(max_examples=examples(2000), deadline=None)
@given(r=routes, topic=topics, payload=payloads)
def test_random_payloads_give_a_good_sample_or_a_payload_error(r: Route, topic: str, payload: bytes) -> None:
    limits = Limits(max_payload=256, max_skew=300)
    try:
        s = parse(r, topic, payload, NOW, limits)
    except PayloadError as exc:
        assert str(exc)  # every refusal says why
        return
    assert math.isfinite(s.value)
    assert math.isfinite(s.time) and s.time <= NOW + 300
    assert len(payload) <= 256
    assert s.sensor.endswith(".ph") and "/" not in s.sensor


def test_route_knows_which_sensors_it_can_feed() -> None:
    r = route(topic="plant/+/+", sensor="{1}.{2}")
    assert r.feeds("outfall.ph") and r.feeds("a.b.c")
    assert not r.feeds("outfall") and not route().feeds("outfall.flow")
    assert route(topic="lab/temp", sensor="lab.temp").feeds("lab.temp")
