"""Evidence in bulk (the replay speed work on issue 16): the column-wise CSV is byte for
byte the row-at-a-time one (frozen hashes keep verifying), the block store reads a
schema 1 store's rows alongside and stores a sample once, and the windowed end search
gives the whole run's answer."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.errors import StateError
from monitor.incidents import IncidentStore, IncidentTracker
from monitor.incidents.evidence import EvidenceFileError, csv_rows, parse_csv, slow_rows
from monitor.incidents.figures import Series, median, run_end, run_end_since, run_ends
from monitor.incidents.store import CSV_HEADER
from tests.examples import examples
from tests.incident_helpers import load, oil_station

# Times an evidence file meets: whole seconds, milliseconds, sub-microsecond fractions that
# round (half to even) up to the next second, the epoch, and the years the fast path refuses.
TIMES = st.one_of(
    st.integers(0, 253_402_300_798).map(float),
    st.floats(0.0, 253_402_300_798.0, allow_nan=False),
    st.integers(1_700_000_000_000, 1_800_000_000_000).map(lambda ms: ms / 1000),
    st.integers(1_700_000_000, 1_800_000_000).map(lambda s: s + 0.9999996),
    st.integers(0, 10**6).map(lambda us: us * 0.5e-6),
    st.floats(-1e10, 1e12, allow_nan=False),
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6).map(lambda x: x / 1000),
    st.integers(-(10**16), 10**16).map(lambda x: x / 1000),
    st.integers(-(10**8), 10**8).map(lambda x: x / 10**4),
    st.sampled_from([0.0, -0.0, 1e16, 1e-5, 5e-324, 1e22, 0.1, math.nan, math.inf, -math.inf]),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.tuples(TIMES, VALUES, st.integers(-128, 127)), min_size=0, max_size=60),
    st.sampled_from(["flow", "outfall.oil", "pH é"]),
)
def test_the_column_wise_csv_is_the_row_at_a_time_csv(
    rows: list[tuple[float, float, int]], name: str
) -> None:
    t = np.array([r[0] for r in rows], np.float64)
    v = np.array([r[1] for r in rows], np.float64)
    q = np.array([r[2] for r in rows], np.int8)
    try:
        want = slow_rows(name, t, v, q)
    except (ValueError, OverflowError, OSError) as exc:  # year 10000: refused alike
        with pytest.raises(type(exc)):
            csv_rows(name, t, v, q)
        return
    assert csv_rows(name, t, v, q) == want


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(TIMES, VALUES, st.integers(-128, 127)), min_size=0, max_size=40),
    st.lists(st.tuples(st.integers(0, 4_102_444_800_000), VALUES), min_size=1, max_size=40),
)
def test_an_evidence_csv_reads_back_to_its_columns(
    rows: list[tuple[float, float, int]], ms_rows: list[tuple[int, float]]
) -> None:
    """`parse_csv`, by which a frozen incident's verified file is read back for its package
    when the store's blocks are damaged: each sensor's values bit for bit (not finite: NaN),
    its qualities, its times to the millisecond the file prints; times in whole milliseconds
    up to 2100 (what a station records) are formatted again to the same bytes."""
    t = np.array([r[0] for r in rows], np.float64)
    v = np.array([r[1] for r in rows], np.float64)
    q = np.array([r[2] for r in rows], np.int8)
    if not (np.isfinite(t).all() and (t >= 0).all() and (t < 253_402_300_000).all()):
        return  # before 1970 or in year 9999's last hour: not a time a station's evidence holds
    t2 = np.array([m for m, _ in ms_rows], np.int64) / 1000.0
    v2 = np.array([x for _, x in ms_rows], np.float64)
    q2 = np.zeros(t2.size, np.int8)
    data = CSV_HEADER.encode() + csv_rows("b.flow", t2, v2, q2) + csv_rows("a.oil", t, v, q)
    got = parse_csv(data)
    assert list(got) == ["b.flow", "a.oil"][: 1 + bool(rows)]
    for name, (tt, vv, qq) in (("b.flow", (t2, v2, q2)), ("a.oil", (t, v, q))):
        if not tt.size:
            continue
        pt, pv, pq = got[name]
        want = np.where(np.isfinite(vv), vv, np.nan)
        assert pv.view(np.int64).tolist() == want.view(np.int64).tolist()  # bit for bit: -0.0, NaN
        assert pq.tolist() == qq.tolist()
        assert (np.abs(pt - tt) < 1e-3 + 1e-4 * np.maximum(1.0, tt / 1e11)).all()
    assert csv_rows("b.flow", *got["b.flow"]) == csv_rows("b.flow", t2, v2, q2)


def test_bytes_not_an_evidence_csv_are_an_error_not_columns() -> None:
    """An empty evidence file reads as no columns and a name with a comma (config allows
    none) whole; bytes that are not an evidence CSV (cut short, another header, a short
    line, a value not a number, a time with a zone numpy would warn about) are an error."""
    good = CSV_HEADER.encode() + csv_rows("flow", np.array([1.0]), np.array([2.5]), np.zeros(1, np.int8))
    assert parse_csv(good)["flow"][1].tolist() == [2.5]
    assert parse_csv(CSV_HEADER.encode()) == {}
    odd = good + csv_rows("a,b", np.array([2.0, 3.0]), np.array([1.0, math.nan]), np.ones(2, np.int8))
    got = {k: str(c[1].tolist()) for k, c in parse_csv(odd).items()}
    assert got == {"flow": "[2.5]", "a,b": "[1.0, nan]"} and list(got) == ["flow", "a,b"]
    for bad in (
        good[:-1],
        b"time,value\n",
        good + b"2026-01-01T00:00:00Z,flow\n",
        good.replace(b"2.5", b"x"),
    ):
        with pytest.raises(EvidenceFileError):
            parse_csv(bad)


_PARSE_MANY = """
import sys
from monitor.incidents.evidence import HEADER, EvidenceFileError, parse_csv
stamp = sys.argv[1].encode()
try:
    parse_csv(HEADER + b"\\n" + (stamp + b",a.oil,1.5,0\\n") * 2000)
except EvidenceFileError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("stamp", ["2026-03-08T07:00:00-0500Z", "2026-03-08T02:00:00-05:00Z"])
def test_a_time_with_an_offset_before_its_z_is_refused_not_a_crash(stamp: str) -> None:
    """Times of the bytes `iso` writes (digits, `-:.T`, a last `Z`) but not its shape: an
    offset before the Z. With the Z dropped numpy sees a zone, and numpy 2.4.6 segfaults
    casting 501 or more such bytes strings to datetime64 (500 pass; a bare `...Z` or `+00:00` too,
    measured in a subprocess). Run in a subprocess so a crash fails this test, not the run.
    Before: the process died of SIGSEGV (-11), no refusal."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    got = subprocess.run(
        [sys.executable, "-c", _PARSE_MANY, stamp], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    assert got.stdout.startswith("refused: not an evidence CSV: a time not in ISO 8601 UTC"), got.stdout


def test_the_word_wise_lines_mix_every_field_width_as_the_row_at_a_time_csv() -> None:
    """One call with what makes the words differ row by row: every quality, times with and
    without milliseconds across midnight and a new year, readings of four decimals beside
    whole numbers above 10^4, NaN, -0.0 and `repr`s wider than the value's two words."""
    n = 4096
    rng = np.random.default_rng(11)
    t = 1_798_761_000.0 + np.cumsum(rng.choice([0.001, 0.25, 1.0, 7.0, 1e-7], n))  # over 2027-01-01
    v = np.round(rng.normal(0.0, 50.0, n), 3)
    v[::7] = np.round(rng.normal(0.0, 1e6, n // 7 + 1), 1)
    v[::11] = rng.normal(0.0, 1.0, n // 11 + 1) / 3.0  # 17 digits
    v[::13] = -1.2345678901234567e-300
    v[5::17], v[6::17] = math.nan, -0.0
    q = (np.arange(n) % 256 - 128).astype(np.int8)
    assert csv_rows("pH é", t, v, q) == slow_rows("pH é", t, v, q)


@pytest.mark.parametrize("days", [2.0, 90.0])  # an incident's span, and one past a date a day
def test_whole_seconds_and_four_decimals_take_six_words_a_line_as_the_row_at_a_time_csv(days: float) -> None:
    """Most evidence: whole-second times and readings of up to four decimals, where the
    quality shares the value's second word; every quality, a sign, every decimal count,
    whole numbers up to 9999, across midnight and a new year."""
    n = 5000
    rng = np.random.default_rng(5)
    t = np.sort(rng.integers(0, int(days * 86400), n)).astype(np.float64) + 1_798_700_000.0
    v = rng.integers(-99_999_999, 99_999_999, n) / 10**4
    v[::9] = np.round(v[::9], 1)
    v[1::9] = np.trunc(v[1::9])
    v[2::9] = 0.0
    v[3::9] = -0.0
    q = (np.arange(n) % 256 - 128).astype(np.int8)
    for name in ("flow", "a.long.sensor_name:9", "pH é"):
        assert csv_rows(name, t, v, q) == slow_rows(name, t, v, q)


def test_the_rows_of_an_evidence_file_are_its_lines_even_for_a_name_with_a_newline(tmp_path: Path) -> None:
    """`freeze_evidence` gives the rows without counting the file's lines: the same number."""
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", np.array([1.0, 2.0, 3.0]), np.ones(3), np.zeros(3, np.int8))
        store.add_evidence("i1", "odd\nname", np.array([1.0, 2.0]), np.ones(2), np.zeros(2, np.int8))
        sha, rows = store.freeze_evidence("i1")
        data = store.evidence_path("i1").read_bytes()
        assert rows == data.count(b"\n") - 1 == 7
        assert store.write_evidence("i2", data) == (sha, rows)  # counted: the same


def test_an_evidence_file_written_in_parts_is_the_joined_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`freeze_evidence` writes and hashes the CSV's parts (several chunks of rows a sensor,
    one of them printed row by row) without joining them: the file, its hash and its rows
    are `evidence_csv`'s, and the same bytes given whole give the same answer."""
    monkeypatch.setattr("monitor.incidents.evidence._CHUNK", 3)
    with IncidentStore(tmp_path) as store:
        t = 1_780_000_000.0 + np.arange(8.0)
        store.add_evidence("i1", "flow", t, np.linspace(0.5, 9.25, 8), np.zeros(8, np.int8))
        store.add_evidence("i1", "odd\nname", t[:2], np.array([1.0, math.nan]), np.array([0, 2], np.int8))
        store.add_evidence("i1", "year 1969", np.array([-1.0]), np.array([0.1]), np.zeros(1, np.int8))
        parts = store.evidence_parts("i1")
        assert len(parts) == 1 + 3 + 1 + 1  # the header; flow in three chunks; one part each
        whole = store.evidence_csv("i1")
        assert b"".join(parts) == whole
        sha, rows = store.freeze_evidence("i1")
        assert store.evidence_path("i1").read_bytes() == whole
        assert (sha, rows) == (hashlib.sha256(whole).hexdigest(), whole.count(b"\n") - 1)
        assert store.write_evidence("i2", whole) == (sha, rows)
        assert store.write_evidence("i4", bytearray(whole)) == (sha, rows)  # whole, not its bytes
        assert store.write_evidence("i3", parts) == (sha, rows)  # parts, rows counted
        assert store.evidence_path("i3").read_bytes() == whole


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from([1.0, 10.0, 10.5, 1e300]), st.floats(1e-300, 1e308, allow_nan=False)),
        min_size=1,
        max_size=40,
    )
)
def test_the_usual_intervals_median_is_numpys(spacings: list[float]) -> None:
    """`median` (the usual interval) gives `np.median`'s float, to the bit: odd and even
    counts, ties, halves that round, sums that overflow."""
    x = np.array(spacings, np.float64)
    with np.errstate(over="ignore"):  # both warn of an overflow (inf), in their own words
        assert np.array(median(x)).tobytes() == np.array(float(np.median(x))).tobytes()


def test_a_schema_1_store_reads_and_verifies_and_a_sample_is_stored_once(tmp_path: Path) -> None:
    with IncidentStore(tmp_path) as store:
        pass
    # A store as schema 1 wrote it: one row per sample in `evidence` (one with no value).
    db = sqlite3.connect(tmp_path / "incidents.sqlite")
    db.executemany(
        "INSERT INTO evidence (incident, sensor, t, value, quality) VALUES (?, ?, ?, ?, ?)",
        [("i1", "flow", 10.0, 1.5, 0), ("i1", "flow", 20.0, None, 1), ("i1", "oil", 15.0, 7.25, 0)],
    )
    db.execute("DROP TABLE evidence_block")  # schema 2's (and 3's column), made again on open
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with IncidentStore(tmp_path) as store:
        # 20.0 is on record already (the stored row wins), 30.0 and 40.0 are new; then a
        # batch sent again adds nothing, and within a batch the first sample at a time wins.
        new = store.add_evidence(
            "i1", "flow", np.array([20.0, 30.0, 40.0, 30.0]), np.array([9.0, 2.5, np.inf, 8.0]),
            np.array([0, 0, 2, 0], np.int8),
        )  # fmt: skip
        again = store.add_evidence("i1", "flow", np.array([30.0, 40.0]), np.ones(2), np.zeros(2, np.int8))
        assert (new, again) == (2, 0)
        names, t, v, q = store.evidence("i1")
        assert names == ["flow"] * 4 + ["oil"]
        assert t.tolist() == [10.0, 20.0, 30.0, 40.0, 15.0]
        assert [None if math.isnan(x) else x for x in v.tolist()] == [1.5, None, 2.5, None, 7.25]
        assert q.tolist() == [0, 1, 0, 2, 0]
        csv = store.evidence_csv("i1")
        assert (
            csv
            == (
                CSV_HEADER
                + "1970-01-01T00:00:10Z,flow,1.5,0\n1970-01-01T00:00:20Z,flow,,1\n"
                + "1970-01-01T00:00:30Z,flow,2.5,0\n1970-01-01T00:00:40Z,flow,,2\n"
                + "1970-01-01T00:00:15Z,oil,7.25,0\n"
            ).encode()
        )
        sha, rows = store.freeze_evidence("i1")
        assert rows == 5 and sha == hashlib.sha256(csv).hexdigest()
        assert store.evidence("i1", "oil")[1].tolist() == [15.0]


def test_a_batch_in_time_order_is_stored_as_a_shuffled_one_with_repeats_is(tmp_path: Path) -> None:
    """A step's samples (in time order, one a time) are stored without a sort; the same
    samples shuffled, with repeats (the first at a time wins), store the same."""
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.uniform(0.5, 2.0, 300))
    v, q = rng.normal(size=300), rng.integers(0, 3, 300).astype(np.int8)
    v[::9] = np.nan
    mixed = np.concatenate((rng.permutation(300), rng.integers(0, 300, 50)))
    stored = []
    for name, order in (("sorted", np.arange(300)), ("mixed", mixed)):
        with IncidentStore(tmp_path / name) as store:
            assert store.add_evidence("i1", "flow", t[order], v[order], q[order]) == 300
            stored.append([c.tobytes() for c in store.columns("i1")["flow"]])
    assert stored[0] == stored[1] == [t.tobytes(), v.tobytes(), q.tobytes()]


def test_evidence_blocks_stored_out_of_time_order_are_read_in_time_order(tmp_path: Path) -> None:
    """Blocks in time order (a replay, a live run) are read without a sort; a batch older
    than what is stored (a backfill) is still read where it belongs, values with it."""
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", np.array([10.0, 11.0]), np.array([1.0, 2.0]), np.zeros(2, np.int8))
        store.add_evidence("i1", "oil", np.array([3.0, 4.0]), np.array([5.0, 6.0]), np.zeros(2, np.int8))
        store.add_evidence("i1", "flow", np.array([5.0, 6.0]), np.array([3.0, 4.0]), np.ones(2, np.int8))
        cols = store.columns("i1")
        assert list(cols) == ["flow", "oil"]
        t, v, q = cols["flow"]
        assert (t.tolist(), v.tolist(), q.tolist()) == (
            [5.0, 6.0, 10.0, 11.0],
            [3.0, 4.0, 1.0, 2.0],
            [1, 1, 0, 0],
        )
        assert t.flags.writeable and t.dtype == np.float64 and q.dtype == np.int8
        assert [c.tolist() for c in store.columns("i1", "oil")["oil"]] == [[3.0, 4.0], [5.0, 6.0], [0, 0]]
        assert store.evidence_csv("i1", cols) == store.evidence_csv("i1")


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 40.0), st.booleans()), min_size=0, max_size=400),
    st.floats(0.0, 2e5),
    st.booleans(),
)
def test_the_windowed_end_is_the_whole_runs_end(
    steps: list[tuple[float, bool]], start: float, high: bool
) -> None:
    """Samples every 0-40 s (some bad), values around a threshold of 10."""
    t = np.cumsum([0.0] + [60.0 * (s[0] + 0.001) for s in steps])
    rng = np.random.default_rng(len(steps))
    v = rng.uniform(0.0, 20.0, t.size)
    q = np.array([0] + [0 if s[1] else 1 for s in steps], np.int8)

    def fetch(after: float, until: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep = (t > after) & (t <= until)
        return t[keep], v[keep], q[keep]

    clear = float(t[-1])
    after = min(start, clear)
    whole = run_end(Series.of(*fetch(after, clear)), clear, 10.0, high)
    assert run_end_since(fetch, after, clear, 10.0, high) == whole


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 40.0), st.booleans()), min_size=0, max_size=300),
    st.lists(st.floats(-100.0, 1.5e5), min_size=1, max_size=30),
    st.floats(-100.0, 1e5),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_the_ends_of_many_clears_at_once_are_each_clears_own(
    steps: list[tuple[float, bool]], clears: list[float], after: float, high: bool, seed: int
) -> None:
    """`run_ends` (a whole step's clears of one incident) against `run_end_since` per clear:
    samples every 0-40 min (some bad, some NaN), clears anywhere, also on a sample's time."""
    t = np.cumsum([0.0] + [60.0 * (s[0] + 0.001) for s in steps])
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.0, 20.0, t.size)
    v[rng.uniform(size=t.size) < 0.05] = np.nan
    q = np.array([0] + [0 if s[1] else 1 for s in steps], np.int8)
    on_samples = [float(t[int(c) % t.size]) for c in clears[: len(clears) // 2]]
    times = np.array(sorted(clears + on_samples), np.float64)

    def fetch(a: float, until: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep = (t > a) & (t <= until)
        return t[keep], v[keep], q[keep]

    one_by_one = [run_end_since(fetch, after, float(c), 10.0, high) for c in times]
    assert run_ends(t, v, q, after, times, 10.0, high).tolist() == one_by_one


def test_a_full_store_says_it_is_full(tmp_path: Path) -> None:
    """SQLite's own SQLITE_FULL (the file held to a few more pages by `max_page_count`,
    as a full disk would: the tests cannot mount a small file system) rolls the
    transaction back itself; the store's ROLLBACK after it raised "cannot rollback - no
    transaction is active" over the real cause, and the replay said that."""
    store = IncidentStore(tmp_path)
    try:
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + 8}")
        t = np.arange(100_000, dtype=np.float64)
        with pytest.raises(StateError, match=r"cannot add evidence: database or disk is full$"):
            for i in range(4):
                store.add_evidence("i1", f"s{i}", t, t, np.zeros(t.size, np.int8))
        assert not store._db.in_transaction
        store._db.execute(f"PRAGMA max_page_count = {1 << 30}")
        assert store.add_evidence("i1", "after", t[:3], t[:3], np.zeros(3, np.int8)) == 3  # usable again
    finally:
        store.close()


def test_only_sensors_that_can_open_an_incident_and_their_paired_flows_are_kept(tmp_path: Path) -> None:
    (tmp_path / "station.yaml").write_text(
        f"station: {{id: ps-1}}\nstate_dir: {tmp_path / 'state'}\nsensors:\n"
        "  - {id: outfall.flow, kind: flow, unit: gpm, slug: false}\n"
        "  - {id: spare.flow, kind: flow, unit: gpm, slug: false}\n"
        "  - {id: inlet.flow, kind: flow, unit: gpm}\n"
        "  - {id: outfall.oil, kind: concentration, substance: oil, unit: mg/L, slug: false,"
        " flow_sensor: outfall.flow}\n"
    )
    config = load(tmp_path / "station.yaml")
    tracker = IncidentTracker(config)
    try:
        # spare.flow has no rule that opens an incident and pairs with none: not copied
        assert sorted(tracker.recent) == ["inlet.flow", "outfall.flow", "outfall.oil"]
    finally:
        tracker.close()


def test_live_batches_of_one_sample_fill_a_few_blocks_not_one_each(tmp_path: Path) -> None:
    with IncidentStore(tmp_path) as store:
        for i in range(5000):
            assert store.add_evidence(
                "i1", "flow", np.array([i * 1.0]), np.array([i / 8]), np.zeros(1, np.int8)
            )
        blocks = store._db.execute("SELECT COUNT(*) FROM evidence_block").fetchone()[0]
        assert blocks == 2  # 4096 samples, then the rest
        _, t, v, _ = store.evidence("i1")
        assert t.tolist() == [i * 1.0 for i in range(5000)] and v.tolist() == [i / 8 for i in range(5000)]
        # an earlier sample that arrives late (a backfill) gets a block of its own, read in order
        assert store.add_evidence("i1", "flow", np.array([-1.0]), np.array([7.0]), np.zeros(1, np.int8)) == 1
        assert store.evidence("i1")[1][:2].tolist() == [-1.0, 0.0]


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),  # time step (0: same time as the previous row)
            st.integers(-1, 3),  # sensor index (-1: unknown, as the readers mark it)
            st.one_of(st.floats(-10.0, 4000.0), st.sampled_from([math.nan, math.inf, -5.0, 1e9])),
            st.sampled_from([0, 0, 0, 1, 2]),  # quality in: good, bad data, not good
            st.booleans(),  # sent out of order (30 s earlier)
        ),
        min_size=1,
        max_size=300,
    ),
    st.integers(1, 80),
)
def test_the_engines_split_by_sensor_fills_the_tracker_as_the_columns_do(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int, int, float, int, bool]], batch: int
) -> None:
    """`add_admitted` (the engine's per-sensor split of a replay step) keeps exactly what
    `add_columns` keeps: unknown sensors, out-of-order rows and bad values included."""
    from monitor.engine import Engine, replay_steps
    from monitor.model import ManualClock

    tmp = tmp_path_factory.mktemp("split")
    (tmp / "station.yaml").write_text(
        f"station: {{id: ps-1}}\nstate_dir: {tmp / 'state'}\nsensors:\n"
        "  - {id: outfall.flow, kind: flow, unit: gpm, slug: false}\n"
        "  - {id: inlet.flow, kind: flow, unit: gpm}\n"
        "  - {id: spare.flow, kind: flow, unit: gpm, slug: false}\n"
        "  - {id: outfall.oil, kind: concentration, substance: oil, unit: mg/L, slug: false,"
        " flow_sensor: outfall.flow}\n"
    )
    config = load(tmp / "station.yaml")
    t = np.cumsum([float(r[0]) for r in rows]) + 1.78e9
    t = np.where([r[4] for r in rows], t - 30.0, t)
    t = np.maximum.accumulate(t)  # a batch is in time order; the sensor's own order may not be
    sensor = np.array([r[1] for r in rows])
    value = np.array([r[2] for r in rows])
    quality = np.array([r[3] for r in rows], np.int8)
    kept: list[dict[str, tuple[list[float], list[float], list[int]]]] = []
    for split in (True, False):
        engine = Engine(config.rules, ManualClock())
        tracker = IncidentTracker(config)
        try:
            for step in replay_steps(engine, sensor, t, value, quality, batch_size=batch):
                assert step.by_sensor is not None
                if split:
                    tracker.add_admitted(engine.sensors, step.by_sensor, step.quality)
                else:
                    tracker.add_columns(
                        engine.sensors, step.sensor, step.time, step.value, step.quality, step.accepted
                    )
            kept.append(
                {
                    name: (r.t[: r.n].tolist(), r.v[: r.n].tolist(), r.q[: r.n].tolist())
                    for name, r in tracker.recent.items()
                }
            )
            kept[-1]["latest"] = ([tracker.latest], [], [])
        finally:
            tracker.close()
    assert repr(kept[0]) == repr(kept[1])  # repr: NaN values compare equal


def test_a_batch_of_chattering_transitions_extends_an_incident_unless_its_case_was_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Re-activations within the merge window extend the incident within one batch (its
    activations counted, its end the last clear's, a DEBUG line each); after an operator
    closed its case, one opens a new incident instead."""
    from monitor.model import Condition, ConditionState, Rule, Sample

    config = oil_station(tmp_path, "merge_window: 1h")
    t0 = 1_780_000_000.0

    def value(m: int) -> float:
        return 150.0 if 60 <= m < 70 or 90 <= m < 100 or 110 <= m < 115 or 160 <= m < 170 else 20.0

    def cond(m: int, state: ConditionState) -> Condition:
        return Condition(t0 + 60 * m, "oil", Rule.HIGH, state, value(m), 100.0, "§139-5")

    tracker = IncidentTracker(config)
    try:
        tracker.add_samples([Sample("oil", t0 + 60 * m, value(m)) for m in range(0, 130)])
        chatter = [(60, True), (70, False), (90, True), (100, False), (110, True), (115, False)]
        batch = [cond(m, ConditionState.ACTIVE if on else ConditionState.CLEARED) for m, on in chatter]
        with caplog.at_level(logging.DEBUG, logger="monitor.incidents.tracker"):
            tracker.apply(batch)
        extended = [r.getMessage() for r in caplog.records if "active again" in r.getMessage()]
        assert len(extended) == 2
        assert all(m.endswith(": oil active again within the merge window") for m in extended)
        tracker.advance()
        (first,) = tracker.live.values()
        assert first.activations == 3 and first.end == t0 + 60 * 115 and first.clear_time == t0 + 60 * 115
        tracker.store.close_case(first.id, t0 + 60 * 120, "R. Alvarez", "penalty paid")
        tracker.add_samples([Sample("oil", t0 + 60 * m, value(m)) for m in range(130, 175)])
        tracker.apply([cond(160, ConditionState.ACTIVE), cond(170, ConditionState.CLEARED)])
        tracker.advance()
        on_record = {i.id: i for i in tracker.incidents()}
        assert len(on_record) == 2 and on_record[first.id].activations == 3
        (second,) = (i for i in on_record.values() if i.id != first.id)
        assert second.start == t0 + 60 * 160 and second.end == t0 + 60 * 170
    finally:
        tracker.close()


def test_a_steps_evidence_is_copied_whole_or_not_at_all_and_then_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evidence a step copies is one transaction: when a write fails part way (here
    the paired flow's, after the oil's was copied), none of it is on record and the tracker
    forgets that it copied it; the next `advance` copies it again, so the frozen incident
    is the one a run without the failure records."""
    from monitor.errors import StateError
    from monitor.model import Condition, ConditionState, Rule, Sample

    t0 = 1_780_000_000.0
    oil = [Sample("oil", t0 + 60 * m, 150.0 if 60 <= m < 70 else 20.0) for m in range(240)]
    flow = [Sample("flow", t0 + 60 * m + 30, 400.0 + m) for m in range(240)]
    samples = sorted(oil + flow, key=lambda s: s.time)

    def cond(m: int, state: ConditionState) -> Condition:
        return Condition(t0 + 60 * m, "oil", Rule.HIGH, state, oil[m].value, 100.0, "§139-5")

    frozen = []
    for fail in (True, False):
        state = tmp_path / str(fail)
        state.mkdir()
        (state / "station.yaml").write_text(
            f"station: {{id: ps-1}}\nstate_dir: {state / 'state'}\nsensors:\n"
            "  - {id: flow, kind: flow, unit: gpm, slug: false}\n"
            "  - {id: oil, kind: concentration, substance: oil, slug: false, stale_after: 10m,"
            " flow_sensor: flow}\n",
            encoding="utf-8",
        )
        tracker = IncidentTracker(load(state / "station.yaml"))
        try:
            tracker.add_samples(samples[:130])
            tracker.apply([cond(60, ConditionState.ACTIVE)])
            if fail:
                (iid,) = tracker.live
                opened = tracker.live[iid]
                add = tracker.store.add_evidence

                def full(iid: str, sensor: str, *args: Any, add: Any = add, **kw: Any) -> int:
                    if sensor == "flow":
                        raise StateError("incident store: database or disk is full")
                    return int(add(iid, sensor, *args, **kw))

                monkeypatch.setattr(tracker.store, "add_evidence", full)
                with pytest.raises(StateError, match="disk is full"):
                    tracker.advance()
                assert tracker.store.columns(iid) == {}  # the oil's copy was rolled back
                assert tracker.live == {iid: opened}
                monkeypatch.setattr(tracker.store, "add_evidence", add)
            tracker.advance()
            tracker.add_samples(samples[130:])
            tracker.apply([cond(70, ConditionState.CLEARED)])
            tracker.advance()
            (inc,) = tracker.incidents()
            assert inc.frozen and inc.evidence_rows == 131 + 130  # up to the hour after the end (m 70)
            frozen.append((inc, tracker.store.evidence_csv(inc.id)))
        finally:
            tracker.close()
    assert frozen[0] == frozen[1]


def test_history_on_record_already_is_not_applied_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three trackers on one store, each fed the history from its beginning (a replay run
    again over a longer history each time). What a frozen incident spans is not recorded
    twice, even with its case closed (a closed incident absorbs nothing: each of its
    re-activations would open one); an activation after its end is new, even within the
    merge window; an incident left open by the previous run is continued, without its
    activations counted twice. Each incident on record is said once, not per transition."""
    from monitor.model import Condition, ConditionState, Rule, Sample

    config = oil_station(tmp_path, "merge_window: 1h")
    t0 = 1_780_000_000.0
    high = [(60, 70), (90, 100), (110, 115), (160, 170), (300, 305), (310, 320)]

    def value(m: int) -> float:
        return 150.0 if any(a <= m < b for a, b in high) else 20.0

    def transitions(until: int) -> list[Condition]:
        out = []
        for a, b in high:
            for m, state in ((a, ConditionState.ACTIVE), (b, ConditionState.CLEARED)):
                if m <= until:
                    out.append(Condition(t0 + 60 * m, "oil", Rule.HIGH, state, value(m), 100.0, "§139-5"))
        return out

    def run(until: int) -> IncidentTracker:
        tracker = IncidentTracker(config)
        tracker.add_samples([Sample("oil", t0 + 60 * m, value(m)) for m in range(until + 1)])
        tracker.apply(transitions(until))
        tracker.advance(final=True)
        return tracker

    first = run(130)  # one chattering incident, frozen; the operator closes its case
    try:
        (recorded,) = first.incidents()
        a_id = recorded.id
        assert recorded.frozen and recorded.activations == 3 and recorded.end == t0 + 60 * 115
        first.store.close_case(a_id, t0 + 60 * 130, "R. Alvarez", "penalty paid")
        a = first.store.get(a_id)
        assert a is not None and a.closed_at is not None
    finally:
        first.close()

    with caplog.at_level(logging.INFO, logger="monitor.incidents.tracker"):
        second = run(312)  # the same again, then one more at 160 and one still open at 312
    try:
        on_record = {i.id: i for i in second.incidents()}
        assert on_record.pop(a_id) == a  # untouched
        b, c = sorted(on_record.values(), key=lambda i: i.start)
        assert (b.start, b.end, b.activations, b.frozen) == (t0 + 60 * 160, t0 + 60 * 170, 1, True)
        assert (c.start, c.end, c.activations, c.frozen) == (t0 + 60 * 300, None, 2, False)
        assert second.met_again == {a_id: 6}  # its three activations and three clears
        said = [r.getMessage() for r in caplog.records if "on record already" in r.getMessage()]
        assert said == [f"incident {a_id} is on record already (history replayed again); not recorded twice"]
    finally:
        second.close()

    third = run(340)  # all of it: the open one is continued and ends at 320
    try:
        on_record = {i.id: i for i in third.incidents()}
        assert on_record[a_id] == a and on_record[b.id] == b
        done = on_record[c.id]
        assert (done.end, done.activations, done.frozen) == (t0 + 60 * 320, 2, True)
        assert len(on_record) == 3
        assert third.met_again == {a_id: 6, b.id: 2, c.id: 3}  # C's: on at 300, off at 305, on at 310
    finally:
        third.close()


@pytest.mark.parametrize("tmp_name", ["evidence.tmp", "evidence.csv.tmp"])
def test_a_symlink_left_at_the_evidence_tmp_is_not_followed(tmp_path: Path, tmp_name: str) -> None:
    """Someone with write access to the state dir leaves a symlink where the freeze writes
    its temporary file (the name before and after this fix): the freeze once opened it as
    found, overwrote the link's target (here a file standing for `/etc/passwd`) and renamed
    the link into place. The target keeps its bytes and the evidence is a regular file."""
    target = tmp_path / "precious"
    target.write_bytes(b"not yours\n")
    with IncidentStore(tmp_path / "state") as store:
        store.add_evidence("i1", "flow", np.array([1.0, 2.0]), np.ones(2), np.zeros(2, np.int8))
        path = store.evidence_path("i1")
        path.parent.mkdir(parents=True)
        (path.parent / tmp_name).symlink_to(target)
        sha, rows = store.freeze_evidence("i1")
        assert target.read_bytes() == b"not yours\n"
        assert not path.is_symlink()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
        assert path.read_bytes() == store.evidence_csv("i1")
        assert rows == 2


def test_a_frozen_evidence_file_is_durable_before_its_record_says_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a power cut a record said frozen (with its SHA-256) while its file was missing:
    the rename into the incident's new directory, and that directory's own entry, were never
    fsynced. A power cut cannot be aimed here, so `os.fsync` is watched (the one fake: it
    records which file or directory each fsync was for, then does it): the file, its
    directory and the directory that holds the new one are all synced before it returns."""
    synced: list[str] = []
    real_fsync = os.fsync

    def watched(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    with IncidentStore(tmp_path / "state") as store:
        store.add_evidence("i1", "flow", np.array([1.0, 2.0]), np.ones(2), np.zeros(2, np.int8))
        path = store.evidence_path("i1")
        monkeypatch.setattr(os, "fsync", watched)
        store.freeze_evidence("i1")
        monkeypatch.undo()
        assert str(path.with_name(path.name + ".tmp")) in synced or str(path) in synced
        assert str(path.parent) in synced  # the rename
        assert str(path.parent.parent) in synced  # the incident's directory, made by this freeze
        synced.clear()
        monkeypatch.setattr(os, "fsync", watched)
        store.freeze_evidence("i1")  # written again (a restart's freeze): its directory once
        monkeypatch.undo()
        assert synced.count(str(path.parent)) == 1
        assert str(path.parent.parent) not in synced
