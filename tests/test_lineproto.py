"""Line protocol serialisation: escaping (property-tested against a reference parser), numbers, schema."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from monitor.model import Alarm, AlarmState, Condition, ConditionState, Priority, Quality, Rule, Sample
from monitor.sinks.lineproto import (
    SampleSerializer,
    SeriesInfo,
    alarm_line,
    condition_line,
    line,
    meter_line,
    ns,
)


def _split(text: str, seps: str) -> tuple[str, str, str]:
    """Read up to the first unescaped char in `seps`; returns (unescaped token, sep, rest)."""
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in ",= \\":
                out.append(nxt)
                i += 2
                continue
            out.append(c)
            i += 1
            continue
        if c in seps:
            return "".join(out), c, text[i + 1 :]
        out.append(c)
        i += 1
    return "".join(out), "", ""


def parse(text: str) -> tuple[str, dict[str, str], dict[str, str], int]:
    """A reference parser written from the InfluxDB v2 line protocol spec (not from our code)."""
    assert "\n" not in text
    measurement, sep, rest = _split(text, ", ")
    tags: dict[str, str] = {}
    while sep == ",":
        key, eq, rest = _split(rest, "=")
        assert eq == "="
        value, sep, rest = _split(rest, ", ")
        tags[key] = value
    assert sep == " "
    fields: dict[str, str] = {}
    while True:
        key, eq, rest = _split(rest, "=")
        assert eq == "="
        value, sep, rest = _split(rest, ", ")
        fields[key] = value
        if sep == " ":
            break
        assert sep == ","
    return measurement, tags, fields, int(rest)


# Everything a tag can hold except newlines, which line protocol cannot carry there.
tag_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\r\t"), min_size=1
)


@given(
    measurement=tag_text.filter(lambda s: not s.startswith("#")),  # a leading # is a comment
    tags=st.dictionaries(tag_text, tag_text, max_size=4),
    field_key=tag_text,
    value=st.floats(allow_nan=False, allow_infinity=False),
    t=st.floats(min_value=0, max_value=4e9),
)
def test_escaping_round_trips_through_a_reference_parser(
    measurement: str, tags: dict[str, str], field_key: str, value: float, t: float
) -> None:
    text = line(measurement, tags, {field_key: value}, t)
    assert "\n" not in text
    m, got_tags, fields, stamp = parse(text)
    assert m == measurement
    assert got_tags == {k: v for k, v in tags.items() if v}
    assert float(fields[field_key]) == value
    assert stamp == ns(t)


@given(st.text(alphabet=",= \\\n\t\"'x", min_size=1, max_size=12))
def test_control_characters_never_break_the_line(text: str) -> None:
    out = line("sensor", {"sensor": text}, {"value": 1.0}, 1.0)
    assert "\n" not in out
    _, tags, fields, _ = parse(out)
    expected = text.replace("\n", " ").replace("\t", " ")
    assert tags.get("sensor", "") == (expected if text else "")
    assert fields == {"value": "1.0"}


def test_ns_is_exact_at_microsecond_resolution() -> None:
    assert ns(1700000000.123) == 1700000000123000000
    assert ns(1700000000.000001) == 1700000000000001000
    assert ns(0.0) == 0


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_sample_values_read_back_exactly(value: float) -> None:
    ser = SampleSerializer("ps-1", {"outfall.flow": SeriesInfo("flow", "gpm")})
    (text,) = ser.samples([Sample("outfall.flow", 1.5, value)])
    m, tags, fields, stamp = parse(text)
    assert m == "sensor"
    assert tags == {"station": "ps-1", "sensor": "outfall.flow", "kind": "flow", "unit": "gpm"}
    assert float(fields["value"]) == value
    assert fields["quality"] == "0i"
    assert stamp == 1_500_000_000


def test_non_finite_value_keeps_quality_only() -> None:
    ser = SampleSerializer("ps-1", {})
    text = ser.sample(Sample("dead.sensor", 10.0, math.nan, Quality.COMM_FAILURE))
    assert text == "sensor,sensor=dead.sensor,station=ps-1 quality=2i 10000000000"


def test_sensor_id_with_odd_characters_is_escaped() -> None:
    ser = SampleSerializer("ps 1", {"a,b=c": SeriesInfo("ph", "pH")})
    _, tags, _, _ = parse(ser.sample(Sample("a,b=c", 0.0, 7.0)))
    assert tags["sensor"] == "a,b=c"
    assert tags["station"] == "ps 1"


def test_condition_line_is_numeric_with_citation_tag() -> None:
    cond = Condition(
        time=100.0,
        sensor="outfall.ph",
        rule=Rule.HIGH,
        state=ConditionState.ACTIVE,
        value=9.4,
        limit=9.0,
        citation="§139-15 C(3)",
    )
    m, tags, fields, stamp = parse(condition_line("ps-1", cond, "high"))
    assert m == "alarm"
    assert tags == {
        "station": "ps-1",
        "sensor": "outfall.ph",
        "rule": "high",
        "priority": "high",
        "citation": "§139-15 C(3)",
    }
    assert fields == {"active": "1i", "value": "9.4", "limit": "9.0"}
    assert stamp == 100 * 10**9
    cleared = Condition(100.0, "outfall.ph", Rule.HIGH, ConditionState.CLEARED, 8.0, None, "")
    _, tags, fields, _ = parse(condition_line("ps-1", cleared))
    assert fields == {"active": "0i", "value": "8.0"}
    assert "citation" not in tags and "priority" not in tags


def test_alarm_snapshot_encodes_state_as_integer() -> None:
    alarm = Alarm(
        sensor="outfall.ph",
        rule=Rule.LOW,
        state=AlarmState.ACKED,
        priority=Priority.HIGH,
        value=4.2,
        limit=5.0,
        citation="§139-15 C(3)",
        active=True,
        acknowledged=True,
        updated_at=50.0,
    )
    _, tags, fields, _ = parse(alarm_line("ps-1", alarm))
    assert tags["priority"] == "high"
    assert fields == {
        "active": "1i",
        "state_code": "2i",
        "acknowledged": "1i",
        "value": "4.2",
        "limit": "5.0",
    }


def test_meter_line() -> None:
    text = meter_line("ps-1", "mill.meter", 60.0, 12345.0, 17.5, account="acme-mill", unit="ft3")
    m, tags, fields, _ = parse(text)
    assert m == "meter"
    assert tags == {"station": "ps-1", "meter": "mill.meter", "account": "acme-mill", "unit": "ft3"}
    assert fields == {"reading": "12345.0", "consumption_ft3": "17.5"}
