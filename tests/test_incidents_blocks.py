"""The evidence block codec (schema 3): a regular grid of times stored as first and step,
rounded readings as scaled integers, each only when it decodes bit for bit; blocks a
schema 2 store wrote (raw) read, joined and verified as before."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.errors import StateError
from monitor.incidents import IncidentStore
from monitor.incidents.blocks import GRID, BlockError, checksum, decode, encode
from monitor.incidents.evidence import slow_rows
from monitor.incidents.store import CSV_HEADER, SCHEMA, SCHEMA_VERSION
from monitor.sqlite import Schema, connect
from tests.examples import examples
from tests.incident_helpers import ROOT, incidents_json, monitor, replay_case

FLOATS = st.floats(allow_nan=False, allow_infinity=True)
STEPS = st.one_of(
    st.sampled_from([10.0, 1.0, 0.1, 1e-9, 1e-300, 5e-324, 1e300, 0.0, -0.0, 1 / 3]),
    st.floats(1e-12, 1e6),
)
FIRSTS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.7e9, 1_780_000_000.5, 1e300, -1e300, 5e-324]),
    st.integers(0, 253_402_300_798).map(float),
    FLOATS,
)


@st.composite
def times(draw: st.DrawFn) -> np.ndarray:
    """Sorted NaN-free times: a grid first + i * step (exact or not in float64), with or
    without 1e-9 jitter, or any floats at all."""
    if draw(st.booleans()):
        n = draw(st.integers(0, 300))
        with np.errstate(over="ignore", invalid="ignore"):
            t = draw(FIRSTS) + np.arange(n, dtype=np.float64) * draw(STEPS)
        if n and draw(st.booleans()):
            t[draw(st.integers(0, n - 1))] += draw(st.sampled_from([1e-9, -1e-9, 1e-6]))
        if draw(st.booleans()):
            t = t[np.isfinite(t)]
    else:
        t = np.array(draw(st.lists(FLOATS, max_size=60)), np.float64)
    return np.sort(t) if draw(st.booleans()) else t


VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6).map(lambda x: x / 1000),
    st.integers(-(2**31), 2**31).map(lambda x: x / 100),
    st.integers(-(10**16), 10**16).map(lambda x: x / 1000),
    st.sampled_from([0.0, -0.0, 1e-5, 5e-324, 1e22, 0.1, 0.1 + 0.2, float("nan"), float("inf")]),
)


def _polled(n: int, step: float = 10.0) -> npt.NDArray[np.float64]:
    """Times of a device polled every `step` seconds."""
    return np.asarray(1_780_000_000.0 + np.arange(n) * step, np.float64)


def _readings(n: int) -> npt.NDArray[np.float64]:
    """Readings rounded to three decimals."""
    return np.asarray(np.round(np.linspace(50.0, 900.0, n), 3), np.float64)


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


@settings(max_examples=examples(300), deadline=None)
@given(times(), st.data())
def test_a_block_decodes_to_the_bits_it_was_given(t: np.ndarray, data: st.DataObject) -> None:
    n = int(t.size)
    # up to 40 drawn values repeated over the block (drawing 300 one by one took seconds)
    drawn = np.array(data.draw(st.lists(VALUES, min_size=1, max_size=40)), np.float64)
    v = np.resize(drawn, n)
    if data.draw(st.booleans()):  # a reading rounded alike (most blocks), or anything at all
        with np.errstate(over="ignore", invalid="ignore"):
            v = np.round(v, 3)
    q = np.resize(np.array(data.draw(st.lists(st.integers(-128, 127), min_size=1, max_size=5)), np.int8), n)
    codec, tb, vb, qb = encode(t, v, q)
    got_t, got_v, got_q = decode(codec, tb, vb, qb)
    assert _bits(got_t) == _bits(t)
    assert _bits(got_v) == _bits(np.where(np.isfinite(v), v, np.nan))  # as schema 2 stored them
    assert _bits(got_q) == _bits(q)
    assert got_t.dtype == got_v.dtype == np.float64 and got_q.dtype == np.int8
    assert len(tb) + len(vb) <= 16 * n  # never larger than raw


def test_a_polled_device_takes_a_third_of_the_bytes_and_what_is_not_exact_stays_raw() -> None:
    t = _polled(8640)
    v = _readings(8640)
    q = np.zeros(8640, np.int8)
    codec, tb, vb, qb = encode(t, v, q)
    assert (codec, len(tb), len(vb), len(qb)) == (GRID | (3 + 1) << 1, 16, 4 * 8640, 8640)
    jittered = t.copy()
    jittered[4000] += 1e-6  # a poll a microsecond late: the times as they are
    assert encode(jittered, v, q)[0] & GRID == 0 and len(encode(jittered, v, q)[1]) == 8 * 8640
    assert encode(t, np.full(8640, 0.1 + 0.2), q)[0] == GRID  # 0.30000000000000004: not rounded
    signed = v.copy()
    signed[7] = -0.0
    assert encode(t, signed, q)[0] == GRID  # -0.0 would read back as 0.0
    with_none = v.copy()
    with_none[::5] = np.inf  # no value: stored as NaN, scaled still
    codec, _, vb, _ = encode(t, with_none, q)
    assert codec == GRID | 4 << 1 and np.isnan(decode(codec, tb, vb, qb)[1][::5]).all()
    sub_second = _polled(1000, 0.1)  # first differences are not 0.1
    assert encode(sub_second, v[:1000], q[:1000])[0] & GRID


def test_the_store_keeps_a_days_evidence_in_a_third_of_the_space(tmp_path: Path) -> None:
    t = _polled(8640)
    v = _readings(8640)
    q = np.zeros(8640, np.int8)
    with IncidentStore(tmp_path) as store:
        assert store.add_evidence("i1", "flow", t, v, q) == 8640
        assert store.add_evidence("i1", "flow", t[:5000], v[:5000], q[:5000]) == 0  # re-sent
        row = store._db.execute("SELECT codec, length(t), length(value), length(quality) FROM evidence_block")
        assert row.fetchall() == [(9, 16, 4 * 8640, 8640)]
        got = store.columns("i1")["flow"]
        assert [_bits(c) for c in got] == [_bits(t), _bits(v), _bits(q)]


def _as_schema_2(path: Path) -> None:
    """Rewrite a store as schema 2 wrote it: every block raw (float64 times and values,
    int8 qualities), no codec or crc column, user_version 2."""
    db = sqlite3.connect(path)
    for rowid, codec, tb, vb, qb in db.execute(
        "SELECT rowid, codec, t, value, quality FROM evidence_block"
    ).fetchall():
        t, v, _ = decode(codec, tb, vb, qb)
        db.execute(
            "UPDATE evidence_block SET t = ?, value = ? WHERE rowid = ?",
            (t.astype("<f8").tobytes(), v.astype("<f8").tobytes(), rowid),
        )
    db.execute("ALTER TABLE evidence_block DROP COLUMN codec")
    db.execute("ALTER TABLE evidence_block DROP COLUMN crc")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    assert db.execute(
        "SELECT COUNT(*) FROM evidence_block WHERE length(t) != 8 * length(quality)"
    ).fetchone() == (0,)
    db.close()


def test_a_schema_2_store_reads_joins_and_resends_as_before(tmp_path: Path) -> None:
    t = _polled(3000)
    v = _readings(3000)
    v[::7] = np.nan
    q = (np.arange(3000) % 3).astype(np.int8)
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t, v, q)
        store.add_evidence("i1", "oil", t[:10], v[:10], q[:10])
        before = {k: [_bits(c) for c in cols] for k, cols in store.columns("i1").items()}
        csv = store.evidence_csv("i1")
    _as_schema_2(tmp_path / "incidents.sqlite")
    with IncidentStore(tmp_path) as store:
        assert {k: [_bits(c) for c in cols] for k, cols in store.columns("i1").items()} == before
        assert store.evidence_csv("i1") == csv
        assert store.add_evidence("i1", "flow", t[100:200], v[100:200], q[100:200]) == 0  # on record
        # a live sample joins the old raw block, which is written again encoded
        later = np.array([t[-1] + 10.0])
        assert store.add_evidence("i1", "flow", later, np.array([1.5]), np.zeros(1, np.int8)) == 1
        rows = store._db.execute("SELECT sensor, codec, length(quality) FROM evidence_block ORDER BY rowid")
        assert rows.fetchall() == [("flow", 9, 3001), ("oil", 0, 10)]
        flow_t, flow_v, flow_q = store.columns("i1", "flow")["flow"]
        assert _bits(flow_t) == _bits(np.append(t, later))
        assert _bits(flow_v) == _bits(np.append(v, 1.5)) and _bits(flow_q) == _bits(np.append(q, np.int8(0)))


def test_an_incident_frozen_by_a_schema_2_store_still_verifies(tmp_path: Path) -> None:
    cfg = replay_case("slug-and-oil", tmp_path)
    listed = incidents_json(cfg)
    with IncidentStore(tmp_path / "state") as store:
        before = {inc["id"]: store.evidence_csv(inc["id"]) for inc in listed}
        assert store._db.execute("SELECT COUNT(*) FROM evidence_block WHERE codec != 0").fetchone()[0]
    _as_schema_2(tmp_path / "state" / "incidents.sqlite")
    assert incidents_json(cfg) == listed
    for inc in listed:
        assert inc["evidence"]["frozen"]
        shown = monitor("incidents", "show", "--config", str(cfg), "--id", inc["id"])
        assert shown.returncode == 0 and "evidence verifies" in shown.stdout, shown.stdout
    with IncidentStore(tmp_path / "state") as store:
        assert {inc["id"]: store.evidence_csv(inc["id"]) for inc in listed} == before


def test_a_damaged_block_is_an_error_that_says_so(tmp_path: Path) -> None:
    t = _polled(100)
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t, _readings(100), np.zeros(100, np.int8))
        store._db.execute("UPDATE evidence_block SET t = zeroblob(15)")
        damaged = r"incident i1, sensor flow: .* damaged: a grid of times is 16 bytes, not 15;"
        with pytest.raises(StateError, match=damaged):
            store.columns("i1")
        store._db.execute("UPDATE evidence_block SET codec = 0, t = zeroblob(8 * 99)")
        with pytest.raises(StateError, match="792 bytes of times for 100 samples"):
            store.add_evidence("i1", "flow", t[:3], t[:3], np.zeros(3, np.int8))


def _damage(state: Path, sql: str) -> tuple[str, str]:
    """Apply `sql` (with `?` the rowid) to the first encoded block of a replayed store, as a
    bad disk, a bad restore or a hand edit would; (incident, sensor) of that block."""
    db = sqlite3.connect(state / "incidents.sqlite")
    rowid, iid, sensor = db.execute(
        "SELECT rowid, incident, sensor FROM evidence_block WHERE codec & 1 ORDER BY rowid LIMIT 1"
    ).fetchone()
    db.execute(sql, (rowid,))
    db.commit()
    db.close()
    return iid, sensor


def test_a_damaged_block_names_its_incident_in_export_and_show(tmp_path: Path) -> None:
    """`monitor incidents show` over a truncated block of a frozen incident: exit 1, a line
    that names the incident and the sensor whose evidence is damaged, no traceback; it says
    first, where the verdict always stands, that the evidence does not verify. `export`
    builds the package from the frozen evidence file, which still verifies, and names the
    same block on stderr and in the manifest (exit 0: the package is whole; before, exit 1
    and no package; tests/test_incidents_failing.py has the file damaged too)."""
    cfg = replay_case("slug-and-oil", tmp_path)
    state = tmp_path / "state"
    iid, sensor = _damage(state, "UPDATE evidence_block SET t = substr(t, 1, 15) WHERE rowid = ?")
    got = monitor("incidents", "show", "--config", str(cfg), "--id", iid)
    assert got.returncode == 1 and "Traceback" not in got.stderr, got.stderr
    assert f"incident {iid}" in got.stderr and f"sensor {sensor}" in got.stderr, got.stderr
    assert "a grid of times is 16 bytes, not 15" in got.stderr
    assert "evidence DOES NOT VERIFY" in got.stdout
    out = tmp_path / "report"
    got = monitor("incidents", "export", "--config", str(cfg), "--id", iid, "--out", str(out))
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    assert f"incident {iid}" in got.stderr and f"of sensor {sensor} damaged" in got.stderr, got.stderr
    (block,) = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["evidence_store_damaged"][
        "damaged_blocks"
    ]
    assert block["sensor"] == sensor and "a grid of times is 16 bytes, not 15" in block["error"]
    frozen = state / "incidents" / iid / "evidence.csv"
    assert (out / f"{iid}-evidence.csv").read_bytes() == frozen.read_bytes()


@pytest.mark.parametrize("codec", [16, 9 | 16, 9 | 1 << 40, -1, -(2**63), "9x", 9.0, None])
def test_a_codec_this_release_does_not_know_is_an_error_never_a_guess(tmp_path: Path, codec: object) -> None:
    """A codec id with a bit no release has written (a newer layout, a damaged or edited
    row; -1 has all of them), or not an integer at all, is refused: read as the bits it
    knows, it gave numbers (25 read as 9)."""
    t, v, q = _polled(100), _readings(100), np.zeros(100, np.int8)
    _, tb, vb, qb = encode(t, v, q)
    with pytest.raises(BlockError, match="unknown codec"):
        decode(codec, tb, vb, qb)  # type: ignore[arg-type]
    if not isinstance(codec, int | str):
        return  # in the store: NOT NULL refuses None, INTEGER affinity makes 9.0 the 9 it is
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t, v, q)
        store._db.execute("UPDATE evidence_block SET codec = ?", (codec,))
        for read in (
            lambda: store.columns("i1"),
            lambda: store.add_evidence("i1", "flow", t[:3], v[:3], q[:3]),
        ):
            with pytest.raises(StateError, match=r"incident i1, sensor flow: .* damaged: unknown codec"):
                read()


@pytest.mark.parametrize("column", ["t", "value", "quality"])
def test_a_blob_stored_as_text_is_an_error(tmp_path: Path, column: str) -> None:
    """A blob a hand edit left as TEXT (SQLite keeps any type in any column): an error
    naming the block, not a traceback (a TypeError, or sqlite3 failing to decode its UTF-8)."""
    t, v, q = _polled(100), _readings(100), np.zeros(100, np.int8)
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t, v, q)
        store._db.execute(f"UPDATE evidence_block SET {column} = CAST({column} AS TEXT)")
        with pytest.raises(
            StateError, match=f"incident i1, sensor flow: .* damaged: {column} is text, not a blob"
        ):
            store.columns("i1")
        if column != "value":  # what a re-sent batch is checked against: its times and count
            with pytest.raises(StateError, match=f"incident i1, sensor flow: .* damaged: {column} is"):
                store.add_evidence("i1", "flow", t[:3], v[:3], q[:3])


_DAMAGES = {  # a block's (t, value, quality) blobs -> damaged ones, as a bad disk or edit would
    "first": lambda t, v, q: (struct.pack("<d", 1_780_000_000.0 + 2**-20) + t[8:], v, q),
    "step": lambda t, v, q: (t[:8] + struct.pack("<d", 10.0 + 2**-20), v, q),
    "count": lambda t, v, q: (t, v[:200], q[:50]),
}


@pytest.mark.parametrize("damage", sorted(_DAMAGES))
def test_a_grid_that_does_not_span_its_blocks_times_is_an_error(tmp_path: Path, damage: str) -> None:
    """A grid's 16 bytes stand for the block's every time: a flipped bit of its first
    or step (2**-20 s), or a count cut short with its values, read back as other
    times of the right length, silently. Each block's first and last time, stored beside
    it, are checked (schema 3 wrote no checksum: crc NULL, as here)."""
    t, v, q = _polled(100), _readings(100), np.zeros(100, np.int8)
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t, v, q)
        blobs = store._db.execute("SELECT t, value, quality FROM evidence_block").fetchone()
        store._db.execute(
            "UPDATE evidence_block SET t = ?, value = ?, quality = ?, crc = NULL", _DAMAGES[damage](*blobs)
        )
        for read in (
            lambda: store.columns("i1"),
            lambda: store.add_evidence("i1", "flow", t[:3], v[:3], q[:3]),
        ):
            with pytest.raises(StateError, match=r"incident i1, sensor flow: .* damaged: times .* to .*"):
                read()


@settings(max_examples=examples(200), deadline=None)
@given(times(), st.data())
def test_a_flipped_bit_in_a_block_is_an_error_never_other_numbers(
    tmp_path_factory: pytest.TempPathFactory, t: np.ndarray, data: st.DataObject
) -> None:
    """Any one bit of a stored block's codec or blobs flipped (a bad disk, a bad copy, a
    hand edit): reading it is an error naming it. 9 -> 11 (three decimals read as four)
    gave every value a tenth of itself; a flipped bit of a value, another value."""
    t = np.unique(t[np.isfinite(t)])  # times as the store keeps them
    if t.size < 3:
        t = _polled(3)
    n = int(t.size)
    v = np.resize(np.array(data.draw(st.lists(VALUES, min_size=1, max_size=20)), np.float64), n)
    if data.draw(st.booleans()):  # rounded readings (scaled), or anything (raw)
        with np.errstate(over="ignore", invalid="ignore"):  # 1.8e305 * 1000: inf, not rounded
            v = np.asarray(np.round(np.where(np.isfinite(v), v, 0.0), 3), np.float64)
    q = np.resize(np.array(data.draw(st.lists(st.integers(-128, 127), min_size=1, max_size=5)), np.int8), n)
    with IncidentStore(tmp_path_factory.mktemp("flip")) as store:
        store.add_evidence("i1", "flow", t, v, q)
        row = store._db.execute("SELECT codec, t, value, quality FROM evidence_block").fetchone()
        column = data.draw(st.sampled_from(["codec", "t", "value", "quality"]))
        i = ["codec", "t", "value", "quality"].index(column)
        if column == "codec":
            damaged: object = row[0] ^ (1 << data.draw(st.integers(0, 3)))
        else:
            blob = bytearray(row[i])
            bit = data.draw(st.integers(0, 8 * len(blob) - 1))
            blob[bit // 8] ^= 1 << (bit % 8)
            damaged = bytes(blob)
        store._db.execute(f"UPDATE evidence_block SET {column} = ?", (damaged,))
        with pytest.raises(StateError, match=r"incident i1, sensor flow: .* damaged"):
            store.columns("i1")


def test_three_decimals_read_as_four_is_an_error(tmp_path: Path) -> None:
    t, v, q = _polled(100), _readings(100), np.zeros(100, np.int8)
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t, v, q)
        assert store._db.execute("UPDATE evidence_block SET codec = 11 WHERE codec = 9").rowcount == 1
        with pytest.raises(StateError, match=r"incident i1, sensor flow: .* damaged: .*checksum"):
            store.columns("i1")


def test_a_schema_3_store_reads_its_blocks_unchecked_and_checks_what_it_writes(tmp_path: Path) -> None:
    """A store schema 3 wrote (encoded blocks, no checksum) opens as schema 4: its blocks
    read as they were (crc NULL: nothing to check them by), a block joined is written
    with its checksum."""
    t, v, q = _polled(200), _readings(200), np.zeros(200, np.int8)
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", t[:100], v[:100], q[:100])
    db = sqlite3.connect(tmp_path / "incidents.sqlite")
    db.execute("ALTER TABLE evidence_block DROP COLUMN crc")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with IncidentStore(tmp_path) as store:
        assert store._db.execute("SELECT codec, crc FROM evidence_block").fetchall() == [(9, None)]
        assert [_bits(c) for c in store.columns("i1")["flow"]] == [
            _bits(t[:100]),
            _bits(v[:100]),
            _bits(q[:100]),
        ]
        store.add_evidence("i1", "flow", t[100:], v[100:], q[100:])
        (crc,) = store._db.execute("SELECT crc FROM evidence_block").fetchone()
        assert crc == checksum(
            *store._db.execute("SELECT codec, t, value, quality FROM evidence_block").fetchone()
        )
        assert [_bits(c) for c in store.columns("i1")["flow"]] == [_bits(t), _bits(v), _bits(q)]


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """What a tracker sends the store: (sensor, times, values, qualities) batches, grids and
    not, live single samples, re-sent overlaps, out of order, duplicates within a batch,
    0.1 s steps, pre-1970 and far-future times."""
    out: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["grid", "any", "resend", "single"]))
        if kind == "grid" or not out:
            n = draw(st.integers(0, 80))
            first = draw(st.sampled_from([0.0, -0.0, 1.7e9, -86_400.5, -1e10, 2.5e11, 1_780_000_000.25]))
            step = draw(st.sampled_from([1.0, 10.0, 0.1, 1 / 3, 0.001, 1e-6, 60.0]))
            t = first + np.arange(n, dtype=np.float64) * step + draw(st.sampled_from([0.0, 1e-9, 5.0]))
        elif kind == "any":
            t = np.array(draw(st.lists(st.floats(-1e10, 2.5e11), max_size=30)), np.float64)
        elif kind == "resend":  # part of an earlier batch again, maybe with other values
            t = out[draw(st.integers(0, len(out) - 1))][1]
            t = t[draw(st.integers(0, max(0, t.size - 1))) :]
        else:
            t = np.array([out[-1][1][-1] + 1.0 if out[-1][1].size else 0.0])
        if draw(st.booleans()):
            t = np.concatenate((t, t[: draw(st.integers(0, 3))]))  # repeats within the batch
        if draw(st.booleans()):
            t = t[np.random.default_rng(draw(st.integers(0, 9))).permutation(t.size)]
        n = int(t.size)
        v = np.resize(np.array(draw(st.lists(VALUES, min_size=1, max_size=12)), np.float64), n)
        if draw(st.booleans()):
            with np.errstate(over="ignore", invalid="ignore"):
                v = np.asarray(np.round(v, draw(st.integers(0, 6))), np.float64)
        q = np.resize(np.array(draw(st.lists(st.integers(-128, 127), min_size=1, max_size=4)), np.int8), n)
        out.append((draw(st.sampled_from(["flow", "pH é"])), t, v, q))
    return out


@settings(max_examples=examples(150), deadline=None)
@given(batches(), st.sampled_from([3, 64, 4096]))
def test_the_store_gives_back_every_sample_as_first_sent_bit_for_bit(
    tmp_path_factory: pytest.TempPathFactory,
    sent: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
    block_rows: int,
) -> None:
    """Whatever batches come (see `batches`), encoded or not, joined or not (blocks of 3, 64
    or 4096 samples): the columns are each sensor's samples, the first sent at a time
    winning, in time order, bit for bit (values not finite as NaN), and the evidence CSV is
    the row-at-a-time formatter's of them, so its SHA-256 is what it was with raw blocks."""
    model: dict[str, dict[float, tuple[float, float, int]]] = {}
    with pytest.MonkeyPatch.context() as mp, IncidentStore(tmp_path_factory.mktemp("model")) as store:
        mp.setattr("monitor.incidents.store.BLOCK_ROWS", block_rows)
        for sensor, t, v, q in sent:
            seen = model.setdefault(sensor, {})
            new = 0
            for ti, vi, qi in zip(t.tolist(), v.tolist(), q.tolist(), strict=True):
                if ti not in seen:
                    seen[ti] = (ti, vi if math.isfinite(vi) else math.nan, qi)
                    new += 1
            assert store.add_evidence("i1", sensor, t, v, q) == new
        cols = store.columns("i1")
        csv = store.evidence_csv("i1")
    assert sorted(cols) == sorted(name for name, rows in model.items() if rows)
    want_csv = CSV_HEADER.encode()
    for name in sorted(cols):
        rows = [model[name][k] for k in sorted(model[name])]
        want = [
            np.array([r[i] for r in rows], dtype) for i, dtype in enumerate((np.float64, np.float64, np.int8))
        ]
        assert [_bits(c) for c in cols[name]] == [_bits(w) for w in want]
        want_csv += slow_rows(name, *want)
    assert csv == want_csv


# The child: `monitor incidents list` opening a schema 2 store, SIGKILLed (by itself, from
# SQLite's trace hook) as it is about to commit the migration that runs $ARMED_BY.
CHILD = """
import os, signal, sqlite3, sys
real = sqlite3.connect
armed = [False]
def trace(statement):
    if os.environ["ARMED_BY"] in statement:
        armed[0] = True
    if armed[0] and statement.strip().startswith("COMMIT"):
        os.kill(os.getpid(), signal.SIGKILL)
def connect(*args, **kwargs):
    db = real(*args, **kwargs)
    if "incidents.sqlite" in str(args[0]):
        db.set_trace_callback(trace)
    return db
sqlite3.connect = connect
from monitor.cli import main
sys.exit(main(["incidents", "list", "--config", sys.argv[1]]))
"""


@pytest.mark.parametrize("armed_by", ["ADD COLUMN codec", "ADD COLUMN crc"])
def test_kill_9_during_the_upgrade_of_a_schema_2_store_leaves_it_usable(
    tmp_path: Path, armed_by: str
) -> None:
    """SIGKILL as the upgrade to schema 3 (or 4) is about to commit: the next start upgrades
    the file, and it reads as a store upgraded without the kill does: every incident,
    evidence that verifies, the same CSV bytes, this release's schema (`SCHEMA_VERSION`)."""
    cfg = replay_case("slug-and-oil", tmp_path)
    listed = incidents_json(cfg)
    path = tmp_path / "state" / "incidents.sqlite"
    _as_schema_2(path)
    schema_2 = path.read_bytes()
    results = []
    for killed in (True, False):
        for suffix in ("-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        path.write_bytes(schema_2)
        if killed:
            env = {**os.environ, "ARMED_BY": armed_by, "PYTHONPATH": str(ROOT)}
            child = subprocess.run(
                [sys.executable, "-c", CHILD, str(cfg)],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert child.returncode == -signal.SIGKILL, child.stderr
            db = sqlite3.connect(path)  # killed before that migration's COMMIT: not applied
            assert db.execute("PRAGMA user_version").fetchone() == (2 if "codec" in armed_by else 3,)
            db.close()
        assert incidents_json(cfg) == listed  # the next start
        for inc in listed:
            shown = monitor("incidents", "show", "--config", str(cfg), "--id", inc["id"])
            assert shown.returncode == 0 and "evidence verifies" in shown.stdout, shown.stdout
        with IncidentStore(tmp_path / "state") as store:
            version = store._db.execute("PRAGMA user_version").fetchone()[0]
            columns = [r[1] for r in store._db.execute("PRAGMA table_info(evidence_block)")]
            results.append((version, columns, [store.evidence_csv(inc["id"]) for inc in listed]))
    assert results[0] == results[1] and results[0][:2] == (
        SCHEMA_VERSION,
        ["incident", "sensor", "first", "last", "t", "value", "quality", "codec", "crc"],
    )


@pytest.mark.parametrize("reads_up_to", [2, 3])
def test_an_older_release_refuses_this_store_before_reading_a_block(tmp_path: Path, reads_up_to: int) -> None:
    """Schema 2's code (raw blocks only) and schema 3's (no checksum) meet a store this
    release wrote: each is its migrations so far (never edited, so the first 2 or 3 of
    ours), and refuses the file before it reads or writes anything."""
    with IncidentStore(tmp_path) as store:
        store.add_evidence("i1", "flow", _polled(100), _readings(100), np.zeros(100, np.int8))
    before = (tmp_path / "incidents.sqlite").read_bytes()
    older = Schema("incident store", SCHEMA.migrations[:reads_up_to])
    with pytest.raises(
        StateError,
        match=rf"written by a newer station-monitor \(schema {SCHEMA_VERSION},"
        rf" this release reads up to {reads_up_to}\)",
    ):
        connect(tmp_path / "incidents.sqlite", older)
    assert (tmp_path / "incidents.sqlite").read_bytes() == before


def test_a_damaged_page_reads_as_before_or_as_an_error_naming_the_incident(tmp_path: Path) -> None:
    """Each page of a store of two incidents' evidence damaged in turn (its first bytes, an
    overflow chain's next page or a b-tree page's header, as a bad sector would): reading an
    incident's evidence gives it bit for bit or an error naming that incident, never other
    numbers. SQLite's own 'database disk image is malformed' named only the file."""
    rng = np.random.default_rng(1)
    t, q = _polled(1000), np.zeros(1000, np.int8)
    sent = {iid: rng.normal(size=1000) for iid in ("i1", "i2")}  # raw values: overflow chains
    with IncidentStore(tmp_path / "sound") as store:
        for iid, v in sent.items():
            store.add_evidence(iid, "flow", t, v, q)
    sound = (tmp_path / "sound" / "incidents.sqlite").read_bytes()
    outcomes = set()
    for page in range(2, len(sound) // 4096 + 1):
        damaged = bytearray(sound)
        damaged[(page - 1) * 4096 : (page - 1) * 4096 + 6] = b"\xff\xff\xff\xf0\xff\xff"
        (tmp_path / str(page)).mkdir()
        (tmp_path / str(page) / "incidents.sqlite").write_bytes(damaged)
        with IncidentStore(tmp_path / str(page)) as store:
            for iid, v in sent.items():
                try:
                    got = store.columns(iid)
                except StateError as exc:
                    assert f"incident {iid}" in str(exc), (page, str(exc))
                    outcomes.add("error")
                    continue
                assert [_bits(c) for c in got["flow"]] == [_bits(t), _bits(v), _bits(q)], page
                outcomes.add("sound")
    assert outcomes == {"error", "sound"}
