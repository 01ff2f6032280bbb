"""Totalizer arithmetic, the ledger and the meter alarms."""

from __future__ import annotations

import logging
import random
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.config import build_config
from monitor.errors import MeterError
from monitor.meters.book import MeterBook, MeterRecord, meter_records, meter_specs
from monitor.meters.ledger import Ledger, Replacement, to_ms
from monitor.meters.totalizer import MeterSpec, dec, ft3_to_gal, judge, to_ft3
from monitor.model import ConditionState, Quality, Rule, Sample, parse_time
from tests.examples import examples

H = 3600.0


def spec(
    digits: int | None = 6, multiplier: str = "1", max_rate: str | None = None, unit: str = "ft3"
) -> MeterSpec:
    return MeterSpec(
        "m", unit, digits, Decimal(multiplier), None if max_rate is None else Decimal(max_rate), "acct"
    )


def test_plain_delta_times_multiplier_is_exact() -> None:
    step = judge(spec(multiplier="0.1"), Decimal(100), H, Decimal(103))
    assert step.accepted and step.counts == 3 and step.volume == Decimal("0.3")  # not 0.30000000000000004
    assert step.flags == frozenset()


def test_rollover_is_modulo_the_register() -> None:
    step = judge(spec(digits=6, max_rate="1000"), Decimal(999_800), H, Decimal(300))
    assert step.accepted and step.counts == 500 and "rollover" in step.flags


def test_rollover_without_max_rate_must_be_under_half_the_register() -> None:
    assert judge(spec(digits=4), Decimal(9_000), H, Decimal(3_000)).accepted  # wrapped 4,000 < 5,000
    step = judge(spec(digits=4), Decimal(9_000), H, Decimal(4_500))  # wrapped 5,500: not believable
    assert not step.accepted and step.flags == frozenset({"backwards"})


def test_drop_that_is_not_a_plausible_rollover_is_flagged() -> None:
    # 900,000 -> 100 looks like a rollover, but 100,100 ft3 in one hour is more than 1,000 ft3/h.
    step = judge(spec(digits=6, max_rate="1000"), Decimal(900_000), H, Decimal(100))
    assert not step.accepted and step.flags == frozenset({"drop"}) and step.volume == 0
    assert "more than the meter can pass" in step.message


def test_backwards_and_jump_and_range() -> None:
    back = judge(spec(digits=6, max_rate="1000"), Decimal(5_000), H, Decimal(4_990))
    assert not back.accepted and back.flags == frozenset({"backwards"})
    assert not judge(spec(digits=None), Decimal(5), H, Decimal(4)).accepted  # no register width: no rollover
    jump = judge(spec(max_rate="1000"), Decimal(0), 1800, Decimal(501))  # 500 ft3 allowed in half an hour
    assert not jump.accepted and jump.flags == frozenset({"jump"}) and jump.limit == 500
    assert judge(spec(max_rate="1000"), Decimal(0), 1800, Decimal(500)).accepted
    assert judge(spec(digits=4), Decimal(1), H, Decimal(10_000)).flags == frozenset({"range"})


def test_a_rollover_is_only_believed_when_the_register_falls() -> None:
    # A reset meter: 33,880 -> 15 is rejected; 700 h later 22,355 would fit as a rollover
    # at 100 ft3/h, but the register did not fall at that reading (22,335 came before).
    s = spec(digits=5, max_rate="100")
    assert not judge(s, Decimal(33_880), H, Decimal(15)).accepted
    late = judge(s, Decimal(33_880), 900 * H, Decimal(22_355), last_raw=Decimal(22_335))
    assert not late.accepted and late.flags == frozenset({"backwards"})


def test_units_convert_exactly() -> None:
    assert to_ft3(Decimal(1728), "gal") == 231 * Fraction(1728, 1728) * 1  # 1728 gal = 231 ft3
    assert ft3_to_gal(Fraction(231)) == 1728
    assert to_ft3(Decimal("0.028316846592"), "m3") == 1
    assert float(ft3_to_gal(Fraction(1))) == pytest.approx(7.480519, abs=1e-6)
    assert dec(59290400.0) == Decimal(59290400) and str(dec(0.1)) == "0.1"
    with pytest.raises(MeterError):
        dec(float("nan"))


@given(
    start=st.integers(0, 99_999),
    uses=st.lists(st.integers(0, 400), min_size=1, max_size=300),
)
def test_sum_of_deltas_is_the_true_consumption_across_rollovers(start: int, uses: list[int]) -> None:
    s = spec(digits=5, max_rate="400")
    reading, total, last = start, Decimal(0), Decimal(start)
    for used in uses:
        reading = (reading + used) % 100_000
        step = judge(s, last, H, Decimal(reading), last_raw=last)
        assert step.accepted
        total += step.volume
        last = Decimal(reading)
    assert total == sum(uses)


CONFIG = {
    "station": {"id": "ps-1"},
    "sensors": [
        {"id": "outfall.flow", "kind": "flow"},
        {
            "id": "a.meter",
            "kind": "meter",
            "unit": "ft3",
            "register_digits": 5,
            "account": "a",
            "max_rate": 100,
        },
        {"id": "b.meter", "kind": "meter", "unit": "gal", "multiplier": 0.1, "account": "b"},
    ],
    "billing": {"rate_per_kcf": "4.25", "accounts": [{"id": "a"}, {"id": "b"}]},
}


def book_at(tmp_path: Path) -> MeterBook:
    config = build_config({**CONFIG, "state_dir": str(tmp_path / "state")})
    return MeterBook.open(config)


def t(hour: float) -> float:
    return parse_time("2026-07-01T00:00:00Z") + hour * H


def test_reingest_is_idempotent_and_a_conflict_is_kept_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    book = book_at(tmp_path)
    samples = [Sample("a.meter", t(h), 1000 + 10 * h) for h in range(5)]
    book.ingest(samples)
    assert book.ingest(samples) == [] and book.ledger.count("a.meter") == 5
    with caplog.at_level(logging.WARNING, logger="monitor.meters.ledger"):
        book.ingest([Sample("a.meter", t(2), 1234), Sample("a.meter", t(3), 1)])  # same times, other values
    (line,) = caplog.messages  # one line for the batch, naming the meter and the first conflict
    assert "meter a.meter: 2 reading(s) differ" in line and "offered 1234, held 1020" in line
    rows = book.ledger.rows("a.meter")
    assert [r.reading for r in rows] == [1000, 1010, 1020, 1030, 1040]
    assert book.ledger.conflicts("a.meter") == 2
    book.close()


def test_bad_quality_samples_and_other_sensors_are_not_readings(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    book.ingest(
        [
            Sample("outfall.flow", t(0), 5.0),
            Sample("a.meter", t(0), float("nan"), Quality.COMM_FAILURE),
            Sample("a.meter", t(1), 7.0, Quality.BAD_DATA),
            Sample("a.meter", t(2), 7.0),
        ]
    )
    assert book.skipped == 2 and [r.reading for r in book.ledger.rows("a.meter")] == [7]
    book.close()


@settings(max_examples=examples(25), deadline=None)  # two SQLite ledgers per example
@given(seed=st.integers(0, 2**32 - 1))
def test_any_arrival_order_gives_the_same_ledger(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    rng = random.Random(seed)
    readings, r = [], 99_000
    for h in range(40):
        r = (r + rng.choice([0, 20, 80])) % 100_000
        if h == 17:
            r = 5  # a reset nobody recorded yet -> rejected
        readings.append(Sample("a.meter", t(h), float(r)))
    ordered = book_at(tmp_path_factory.mktemp("ordered"))
    ordered.ingest(readings)
    shuffled = book_at(tmp_path_factory.mktemp("shuffled"))
    mixed = readings[:]
    rng.shuffle(mixed)
    for i in range(0, len(mixed), 7):
        shuffled.ingest(mixed[i : i + 7])
    assert ordered.ledger.rows("a.meter") == shuffled.ledger.rows("a.meter")
    ordered.close()
    shuffled.close()


def test_meter_alarm_is_one_episode_until_the_replacement_is_recorded(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    old = [Sample("a.meter", t(h), 40_000 + 20 * h) for h in range(10)]  # 40,180 at hour 9
    new = [Sample("a.meter", t(10 + h), 15 + 20 * h) for h in range(10)]  # new meter from 9:30
    assert book.ingest(old) == []
    conditions = book.ingest(new)
    assert [(c.state, c.time) for c in conditions] == [(ConditionState.ACTIVE, t(10))]
    c = conditions[0]
    assert c.rule is Rule.METER and c.citation == "§139-3" and c.extra["flag"] == "backwards"
    assert "went backwards from 40180 to 15" in c.message

    with pytest.raises(MeterError, match="does not follow"):
        book.record_replacement("a.meter", t(9.5), old_final=40_100, new_initial=5)  # below the last read
    with pytest.raises(MeterError, match="does not lead"):
        book.record_replacement("a.meter", t(9.5), old_final=40_190, new_initial=50)  # above the next read
    cleared = book.record_replacement("a.meter", t(9.5), old_final=40_190, new_initial=5)
    assert [(x.state, x.time) for x in cleared] == [(ConditionState.CLEARED, t(19))]
    assert book.record_replacement("a.meter", t(9.5), old_final=40_190, new_initial=5) == []  # same again
    with pytest.raises(MeterError, match="already recorded"):
        book.record_replacement("a.meter", t(9.5), old_final=40_191, new_initial=5)
    rows = book.ledger.rows("a.meter")
    # 9 x 20 before the swap, (40,190 - 40,180) + (15 - 5) across it, 9 x 20 after.
    assert sum(r.volume for r in rows) == 9 * 20 + 20 + 9 * 20
    assert all(r.accepted for r in rows)

    records = book.take_records()
    assert {r.time for r in records if "replacement" in r.flags} == {t(9.5)}
    assert sum(r.consumption_ft3 for r in records if r.accepted) >= 20  # the outbox gets re-judged rows
    book.close()

    again = book_at(tmp_path)  # restart: state comes from the ledger, no duplicate transitions
    assert again.ingest([Sample("a.meter", t(20), 15 + 20 * 10)]) == []
    again.close()


def test_alarm_transitions_keep_their_times_within_one_batch(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    samples = [Sample("a.meter", t(h), 1000 + 20 * h) for h in range(6)]
    samples[3] = Sample("a.meter", t(3), 90_000)  # a spike
    got = book.ingest(samples)
    assert [(c.state, c.time) for c in got] == [(ConditionState.ACTIVE, t(3)), (ConditionState.CLEARED, t(4))]
    assert got[0].extra["flag"] == "jump" and got[0].limit == 100
    book.close()


def test_meter_records_sum_to_the_ledger(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    book.ingest([Sample("b.meter", t(h), 100 * h) for h in range(4)])  # 10 gal an hour
    records = book.take_records()
    assert [r.consumption for r in records] == [0, 10, 10, 10]
    assert sum(r.consumption_ft3 for r in records) == pytest.approx(30 * 231 / 1728)
    assert records[1].reading == 10 and records[1].unit == "gal" and records[1].account == "b"
    book.sent()  # the outbox holds them
    assert book.take_records() == []
    rows = book.ledger.rows("b.meter")
    assert meter_records(rows, book.ledger.specs) == records
    book.close()


def test_a_setting_corrected_from_the_first_reading_rejudges_the_whole_history(tmp_path: Path) -> None:
    config = build_config({**CONFIG, "state_dir": str(tmp_path / "state")})
    ledger = Ledger(tmp_path / "l.sqlite", meter_specs(config), now=t(10))
    ledger.add_many([("b.meter", t(h), Decimal(100 * h)) for h in range(3)])
    ledger.close()
    changed = {**meter_specs(config)}
    changed["b.meter"] = MeterSpec("b.meter", "gal", None, Decimal(1), None, "b", since=t(0))
    reopened = Ledger(tmp_path / "l.sqlite", changed, now=t(11))
    assert [r.volume for r in reopened.rows("b.meter")] == [0, 100, 100]
    assert [(p.first, p.source, p.superseded) for p in reopened.periods("b.meter", superseded=True)] == [
        (True, "config", True),
        (True, "corrected", False),
    ]
    with pytest.raises(MeterError, match="unknown meter"):
        reopened.record_replacement(Replacement("nope", to_ms(t(1)), Decimal(1), Decimal(0)))
    reopened.close()


def test_a_replacement_recorded_by_another_process_reaches_the_running_book(tmp_path: Path) -> None:
    daemon = book_at(tmp_path)  # the daemon's book stays open
    daemon.ingest([Sample("a.meter", t(h), 40_000 + 20 * h) for h in range(3)])  # 40,040 at hour 2
    operator = book_at(tmp_path)  # `monitor meters replace` in another process
    operator.record_replacement("a.meter", t(2.5), old_final=40_050, new_initial=0)
    operator.close()
    assert daemon.ingest([Sample("a.meter", t(3), 10.0)]) == []  # judged against the new meter
    rows = daemon.ledger.rows("a.meter")
    assert rows[-1].accepted and rows[-1].volume == 10 and sum(r.volume for r in rows) == 40 + 10 + 10
    daemon.close()


def test_replay_columns_feed_only_the_meters(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    names = ("outfall.flow", "a.meter", "b.meter")
    sensor = np.array([0, 1, 2, 1, 0, 1])
    time = np.array([t(0), t(0), t(0), t(1), t(1), t(2)])
    value = np.array([5.0, 100.0, 7.0, 120.0, 6.0, 99_000.0])
    accepted = np.array([True, True, True, True, True, True])
    got = book.ingest_arrays(names, sensor, time, value, np.zeros(6, dtype=np.int8), accepted)
    assert [(c.sensor, c.state, c.time) for c in got] == [("a.meter", ConditionState.ACTIVE, t(2))]
    assert [r.reading for r in book.ledger.rows("a.meter")] == [100, 120, 99_000]
    assert [r.reading for r in book.ledger.rows("b.meter")] == [7]
    accepted[3] = False  # the engine refused it (e.g. out of order): not a reading
    other = book_at(tmp_path / "other")
    other.ingest_arrays(names, sensor, time, value, None, accepted)
    assert [r.reading for r in other.ledger.rows("a.meter")] == [100, 99_000]
    book.close()
    other.close()


def test_records_carry_the_latest_verdict_once(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    book.ingest([Sample("a.meter", t(h), 1000 + 20 * h) for h in (0, 1, 3)])
    book.ingest([Sample("a.meter", t(2), 1040)])  # late: hour 3 is re-judged (40 -> 20)
    records = book.take_records()
    assert [(r.time, r.consumption) for r in records] == [(t(0), 0), (t(1), 20), (t(2), 20), (t(3), 20)]
    book.close()


def test_a_failed_batch_leaves_nothing_behind(tmp_path: Path) -> None:
    book = book_at(tmp_path)
    ledger = book.ledger
    ledger.add_many([("a.meter", t(0), Decimal(100))])
    with pytest.raises(MeterError, match="unknown meter 'nope'"):
        ledger.add_many([("a.meter", t(1), Decimal(120)), ("nope", t(1), Decimal(1))])
    assert [r.reading for r in ledger.rows("a.meter")] == [100]
    rows = ledger.add_many([("a.meter", t(2), Decimal(140))])  # judged against hour 0, not the lost hour 1
    assert rows[0].volume == 40 and ledger.last("a.meter") == rows[0]
    book.close()


def test_a_book_without_an_outbox_leaves_its_points_marked_for_the_daemon(tmp_path: Path) -> None:
    # `monitor meters ingest` (or a replay without InfluxDB) holds nothing in memory; the ledger
    # keeps the points marked, and the next book that has an outbox sends them, once.
    config = build_config({**CONFIG, "state_dir": str(tmp_path / "state")})
    book = MeterBook.open(config, records=False)
    book.ingest([Sample("a.meter", t(h), 1000 + 10 * h) for h in range(50)])
    assert book.ledger.count("a.meter") == 50
    book.close()
    daemon = MeterBook.open(config)
    got: list[MeterRecord] = []
    assert daemon.send(got.extend, limit=20) == 20 and daemon.due()  # a TAKE at a time
    assert daemon.send(got.extend, limit=None) == 30 and not daemon.due()
    assert [r.time for r in got] == [t(h) for h in range(50)]
    assert daemon.take_records() == []
    daemon.close()
