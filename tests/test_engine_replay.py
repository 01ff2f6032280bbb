"""The vectorised replay path raises exactly what the live path raises, and a checkpoint
in the middle of a stream changes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import Config
from monitor.engine import (
    Engine,
    load_checkpoint_or_start_fresh,
    replay_steps,
    restore_checkpoint,
    save_checkpoint,
)
from monitor.errors import StateError
from monitor.model import ConditionState, ManualClock, Sample
from tests.engine_helpers import T0, as_samples, canon, cut_by_a_checkpoint, live, station
from tests.examples import examples

# Short windows so a few hundred samples cover warm-up, slugs, gaps and restarts.
CONFIG = station(
    {
        "id": "flow",
        "kind": "flow",
        "unit": "gpm",
        "slug": {"window": "30m", "warmup": "10m", "duration": "3m", "max_sample_gap": "2m"},
        "limits": {"high": 900, "unit": "gpm", "on_delay": "1m", "off_delay": "30s", "deadband": 50},
        "stale_after": "4m",
    },
    {
        "id": "ph",
        "kind": "ph",
        "limits": {"deadband": 0.2, "on_delay": "20s", "off_delay": "40s"},
        "stale_after": "3m",
    },
    {"id": "temp", "kind": "temperature", "unit": "degF", "stale_after": "10m"},
    {
        "id": "oil",
        "kind": "concentration",
        "substance": "oil",
        "slug": {"window": "20m", "warmup": "0s", "duration": "1m"},
    },
    {"id": "meter", "kind": "meter", "unit": "ft3"},
)

# The same station with no delays, no deadband and the slug's other edges.
PLAIN = station(
    {
        "id": "flow",
        "kind": "flow",
        "unit": "L/s",
        "slug": {"window": "10m", "warmup": "0s", "duration": "0s", "max_sample_gap": "30s"},
        "limits": {"high": 40, "unit": "cfs"},
        "stale_after": "90s",
    },
    {"id": "ph", "kind": "ph", "stale_after": "1s"},
    {
        "id": "temp",
        "kind": "temperature",
        "unit": "degF",
        "influent": True,
        "limits": {"low": 100, "unit": "degF"},
    },
    {"id": "oil", "kind": "concentration", "slug": {"window": "3d", "factor": 1.5, "duration": "30s"}},
    {"id": "meter", "kind": "meter", "unit": "gal"},
)

# Issue 12's edges: a floor the flow's average crosses (not judged / judged), the
# period_mean method, a device error value, a narrow plausible range.
EDGES = station(
    {
        "id": "flow",
        "kind": "flow",
        "unit": "gpm",
        "slug": {
            "window": "20m",
            "warmup": "5m",
            "duration": "2m",
            "max_sample_gap": "1m",
            "min_baseline": 150,
        },
        "bad_values": [-1.0],
        "stale_after": "3m",
    },
    {"id": "ph", "kind": "ph", "limits": {"on_delay": "10s"}, "valid_range": {"min": 4.5, "max": 9.5}},
    {"id": "temp", "kind": "temperature", "unit": "degF", "stale_after": "10m"},
    {
        "id": "oil",
        "kind": "concentration",
        "slug": {"window": "30m", "warmup": "0s", "duration": "2m", "method": "period_mean"},
    },
    {"id": "meter", "kind": "meter", "unit": "ft3"},
)

Stream = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    """Time-ordered samples for all sensors with slugs, excursions, gaps and bad values."""
    n = draw(st.integers(1, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    steps = rng.choice(
        [0.0, 1.0, 5.0, 10.0, 30.0, 60.0, 400.0, 2000.0],
        size=n,
        p=[0.1, 0.2, 0.25, 0.2, 0.15, 0.06, 0.03, 0.01],
    )
    time = T0 + np.cumsum(steps) + draw(st.sampled_from([0.0, 0.5, 17.25]))
    sensor = rng.choice(5, size=n, p=[0.5, 0.15, 0.1, 0.15, 0.1])
    # slug-sized jumps that last a while: the level switches now and then
    switches = np.cumsum(rng.random(n) < draw(st.floats(0.0, 0.2)))
    level = np.where(switches % 2 == 1, draw(st.sampled_from([3.0, 6.0, 20.0])), 1.0)
    value = np.select(
        [sensor == 0, sensor == 1, sensor == 2, sensor == 3],
        [
            np.round(100 * level * rng.uniform(0.8, 1.2, n), 1),
            np.round(rng.uniform(4.0, 10.0, n), 1),
            np.round(rng.uniform(140.0, 160.0, n)),
            np.round(20 * level * rng.uniform(0.5, 1.5, n), 2),
        ],
        np.round(rng.uniform(0, 1e4, n)),
    )
    bad = rng.random(n) < 0.03
    value[bad] = rng.choice([np.nan, np.inf, -1.0, 1e9], size=int(bad.sum()))
    quality = np.where(rng.random(n) < 0.03, 2, 0)
    return sensor, time, value, quality


def replay_all(engine: Engine, stream: Stream, batch: int) -> list:  # type: ignore[type-arg]
    sensor, time, value, quality = stream
    out = []
    for step in replay_steps(engine, sensor, time, value, quality, batch_size=batch):
        out += step.conditions
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), batch=st.integers(1, 500), config=st.sampled_from([CONFIG, PLAIN, EDGES]))
def test_replay_equals_live(stream: Stream, batch: int, config: Config) -> None:
    a = Engine(config.rules, ManualClock())
    expected = live(a, as_samples(config, *stream))
    b = Engine(config.rules, ManualClock())
    got = replay_all(b, stream, batch)
    assert canon(got) == canon(expected)
    assert a.counters == b.counters
    for sensor in a.sensors:
        assert a.status(sensor) == b.status(sensor)
    assert np.array_equal(a.baselines.sums, b.baselines.sums)
    assert np.array_equal(a.baselines.counts, b.baselines.counts)


@st.composite
def time_major(draw: st.DrawFn) -> Stream:
    """Every sensor once per step in config order (a station's export; the engine groups
    such a batch by a transpose); a few steps of zero length repeat a time."""
    sensor, _, value, quality = draw(streams())
    m = draw(st.integers(1, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = rng.choice([0.0, 5.0, 10.0, 60.0, 400.0], size=m, p=[0.05, 0.3, 0.4, 0.2, 0.05])
    time = np.repeat(T0 + np.cumsum(dt), 5)
    sensors = np.tile(np.arange(5), m)
    # each sensor's values drawn from the stream's values for that sensor (kinds differ)
    pick = [value[sensor == i] if (sensor == i).any() else np.array([1.0]) for i in range(5)]
    value = np.array([pick[i][j % pick[i].size] for j, i in enumerate(sensors.tolist())])
    return sensors, time, value, np.resize(quality, time.size)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=time_major(), batch=st.integers(1, 500), config=st.sampled_from([CONFIG, PLAIN, EDGES]))
def test_time_major_batches_equal_live(stream: Stream, batch: int, config: Config) -> None:
    """Grouped by the transpose (and by the sort where a cut leaves a part step), the
    conditions, their order, qualities and accepted flags are the live path's."""
    sensor, time, value, quality = stream
    a = Engine(config.rules, ManualClock())
    expected = live(a, as_samples(config, *stream))
    b = Engine(config.rules, ManualClock())
    got = []
    for step in replay_steps(b, sensor, time, value, quality, batch_size=batch):
        got += step.conditions
        parts = step.by_sensor
        assert parts is not None
        for i, part in enumerate(parts):
            if part is not None:  # each sensor's accepted samples, by position in the batch
                assert (step.sensor[part[0]] == i).all() and step.accepted[part[0]].all()
                assert np.array_equal(step.time[part[0]], part[1])
    assert canon(got) == canon(expected)
    assert a.counters == b.counters
    for s in a.sensors:
        assert a.status(s) == b.status(s)
    assert np.array_equal(a.baselines.sums, b.baselines.sums)
    c = Engine(config.rules, ManualClock())  # one batch, the transpose; shuffled steps, the sort
    whole = c.replay(sensor, time, value, quality)
    d = Engine(config.rules, ManualClock())
    swap = np.arange(time.size).reshape(-1, 5)[:, ::-1].ravel()
    other = d.replay(sensor[swap], time[swap], value[swap], quality[swap])
    assert canon(whole.conditions) == canon(expected) == canon(other.conditions)
    assert np.array_equal(whole.quality[swap], other.quality) and np.array_equal(
        whole.accepted[swap], other.accepted
    )


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), cut=st.floats(0, 1), use_replay=st.booleans())
def test_checkpoint_and_restore_give_the_same_events(
    stream: Stream, cut: float, use_replay: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("ckpt") / "engine.npz"
    whole, cut_up = cut_by_a_checkpoint(CONFIG, stream, cut, use_replay, path)
    assert canon(cut_up) == canon(whole)


def test_a_symlink_left_as_the_checkpoints_temporary_file_is_not_written_through(tmp_path: Path) -> None:
    """`engine-checkpoint.npz.tmp` a symlink (to the ledger, say): the write opened and
    followed it, overwrote the ledger with the checkpoint and renamed the link into place, as
    the heartbeat's did (monitor/durable.py: a leftover is removed and made anew)."""
    victim = tmp_path / "ledger.sqlite"
    victim.write_bytes(b"SQLite format 3\x00 precious")
    path = tmp_path / "engine.npz"
    path.with_name(path.name + ".tmp").symlink_to(victim)
    engine = Engine(CONFIG.rules, ManualClock())
    save_checkpoint(engine, path)
    assert victim.read_bytes() == b"SQLite format 3\x00 precious"
    assert not path.is_symlink() and not path.with_name(path.name + ".tmp").exists()
    restore_checkpoint(Engine(CONFIG.rules), path)  # the checkpoint itself, whole


def test_checkpoint_from_another_station_is_refused(tmp_path: Path) -> None:
    engine = Engine(CONFIG.rules, ManualClock())
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    other = station({"id": "flow", "kind": "flow", "unit": "gpm"})
    with pytest.raises(StateError, match="different sensor set"):
        restore_checkpoint(Engine(other.rules), path)
    renamed = station({"id": "x", "kind": "ph"})
    with pytest.raises(StateError, match="missing"):
        restore_checkpoint(Engine(renamed.rules), path)


def test_checkpoint_with_another_window_is_refused(tmp_path: Path) -> None:
    a = station({"id": "flow", "kind": "flow", "slug": {"window": "24h"}})
    b = station({"id": "flow", "kind": "flow", "slug": {"window": "48h"}})
    path = tmp_path / "engine.npz"
    save_checkpoint(Engine(a.rules), path)
    with pytest.raises(StateError, match="window"):
        restore_checkpoint(Engine(b.rules), path)


def test_corrupt_checkpoint_is_reported_and_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(CONFIG.rules, ManualClock())
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    fresh = Engine(CONFIG.rules, ManualClock())
    with pytest.raises(StateError, match="corrupt"):
        restore_checkpoint(fresh, path)
    assert load_checkpoint_or_start_fresh(fresh, path) is False
    assert "ignored" in caplog.text
    path.write_bytes(b"not a checkpoint at all")
    assert load_checkpoint_or_start_fresh(fresh, path) is False
    assert load_checkpoint_or_start_fresh(fresh, tmp_path / "missing.npz") is False
    assert not (tmp_path / "engine.npz.tmp").exists()


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams())
def test_replay_falls_back_to_one_sample_at_a_time_identically(stream: Stream) -> None:
    # One round is rarely enough when something is over; the fallback must agree too.
    from monitor.engine import slug_replay as slug

    saved = slug.MAX_ROUNDS
    slug.MAX_ROUNDS = 1
    try:
        a = Engine(CONFIG.rules, ManualClock())
        expected = live(a, as_samples(CONFIG, *stream))
        got = replay_all(Engine(CONFIG.rules, ManualClock()), stream, 10_000)
    finally:
        slug.MAX_ROUNDS = saved
    assert canon(got) == canon(expected)


def test_checkpoint_schedule_saves_when_due_and_survives_a_failing_disk(tmp_path: Path) -> None:
    from monitor.engine import CHECKPOINT_FILE, CheckpointSchedule

    engine = Engine(CONFIG.rules, ManualClock())
    schedule = CheckpointSchedule(engine, tmp_path / CHECKPOINT_FILE, interval=60.0)
    assert schedule.save_if_due(T0) is True
    assert schedule.save_if_due(T0 + 30) is False
    assert schedule.save_if_due(T0 + 60) is True
    restore_checkpoint(Engine(CONFIG.rules, ManualClock()), tmp_path / CHECKPOINT_FILE)
    # A directory where the file should go: writing fails, is reported, nothing raises.
    blocked = CheckpointSchedule(engine, tmp_path / "blocked" / "x.npz")
    (tmp_path / "blocked").write_text("a file, not a directory")
    assert blocked.save(T0) is False
    with pytest.raises(StateError, match="cannot write"):
        save_checkpoint(engine, tmp_path / "blocked" / "x.npz")


def test_a_restart_restarts_the_stale_watch_but_keeps_active_stale(tmp_path: Path) -> None:
    config = station(
        {"id": "a", "kind": "ph", "stale_after": "1m"}, {"id": "b", "kind": "ph", "stale_after": "1m"}
    )
    engine = Engine(config.rules, ManualClock())
    engine.tick(T0)
    engine.process(Sample("a", T0 + 1, 7.0))
    assert [c.sensor for c in engine.tick(T0 + 61)] == ["b"]  # b never reported
    engine.process(Sample("a", T0 + 61, 7.0))
    save_checkpoint(engine, tmp_path / "c.npz")
    # The daemon comes back an hour later: a is not stale yet, b still is (no new event).
    restarted = Engine(config.rules, ManualClock())
    assert load_checkpoint_or_start_fresh(restarted, tmp_path / "c.npz") is True
    assert restarted.tick(T0 + 3600) == []
    assert restarted.tick(T0 + 3630) == []
    assert [(c.sensor, c.state) for c in restarted.tick(T0 + 3661)] == [("a", ConditionState.ACTIVE)]
    assert [c.state for c in restarted.process(Sample("b", T0 + 3662, 7.0))] == [ConditionState.CLEARED]
    assert restarted.baseline_mean("a") == 7.0


def test_partial_restore_keeps_the_sensors_that_match(tmp_path: Path) -> None:
    """A reload that adds a sensor must not cost the others their 24 h of history."""
    before = station(
        {"id": "flow", "kind": "flow", "unit": "gpm"},
        {"id": "oil", "kind": "concentration", "slug": {"window": "24h"}},
    )
    engine = Engine(before.rules, ManualClock())
    samples = [Sample(s, T0 + i * 60.0, 100.0 + i % 7) for i in range(1320) for s in ("flow", "oil")]  # 22 h
    live(engine, samples)
    mean = engine.baseline_mean("flow")
    assert mean is not None
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)

    after = station(
        {"id": "new.ph", "kind": "ph"},
        {"id": "flow", "kind": "flow", "unit": "gpm"},
        {"id": "oil", "kind": "concentration", "slug": {"window": "48h"}},  # changed: starts fresh
    )
    with pytest.raises(StateError, match="different sensor set"):
        restore_checkpoint(Engine(after.rules), path)
    resumed = Engine(after.rules, ManualClock())
    assert restore_checkpoint(resumed, path, partial=True) == ["flow"]
    assert resumed.baseline_mean("flow") == mean
    assert not resumed.warming_up("flow")
    assert resumed.baseline_mean("oil") is None and resumed.warming_up("oil")
    assert resumed.status("new.ph").time is None
    # The restored sensor carries on exactly as the uninterrupted engine does.
    more = [Sample("flow", T0 + (1320 + i) * 60.0, 1000.0) for i in range(20)]  # a 20 min slug
    # (Stale-data conditions of the other sensors differ by design: they are not the same.)
    flow_only = [c for c in live(resumed, more) if c.sensor == "flow"]
    assert canon(flow_only) == canon([c for c in live(engine, more) if c.sensor == "flow"])
    assert any(c.rule == "slug" for c in flow_only)
    assert resumed.baseline_mean("flow") == engine.baseline_mean("flow")


def test_partial_restore_with_nothing_in_common_is_refused(tmp_path: Path) -> None:
    engine = Engine(station({"id": "a", "kind": "flow"}).rules)
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    with pytest.raises(StateError, match="no sensor matches"):
        restore_checkpoint(Engine(station({"id": "b", "kind": "flow"}).rules), path, partial=True)


def test_replay_freezes_what_exists_for_its_steps_only() -> None:
    """The objects that exist before the replay are frozen while it runs (the collections
    its conditions set off skip them) and thawed after it, unless the caller froze them."""
    import gc

    sensor, time, value, quality = (
        np.zeros(3, np.int64),
        T0 + np.arange(3.0),
        np.ones(3),
        np.zeros(3, np.int8),
    )
    engine = Engine(CONFIG.rules, ManualClock())
    assert gc.get_freeze_count() == 0
    during = [gc.get_freeze_count() for _ in replay_steps(engine, sensor, time, value, quality, batch_size=1)]
    assert len(during) == 3 and min(during) > 0 and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        list(replay_steps(engine, sensor, time + 10, value, quality))
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a few were freed since)
    finally:
        gc.unfreeze()


def test_time_major_is_recognised_only_when_every_index_matches() -> None:
    """The transpose is taken only for every sensor once per step in index order; a narrow
    integer array cannot pass for more sensors than its type holds (uint8: 256)."""
    from monitor.engine.engine import _time_major

    assert _time_major(np.tile(np.arange(5, dtype=np.int32), 3), 3, 5)
    assert not _time_major(np.array([0, 1, 2, 3, 4, 0, 1, 2, 4, 3]), 2, 5)
    assert not _time_major(np.array([0, 1, 2, 3, -1, 0, 1, 2, 3, 4]), 2, 5)
    assert not _time_major(np.tile(np.arange(300) % 256, 2).astype(np.uint8), 2, 300)
    assert _time_major(np.tile(np.arange(300), 2).astype(np.int16), 2, 300)


def _rewrite_meta(path: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """The checkpoint at `path` with its JSON meta replaced by `edit`'s (arrays kept)."""
    with path.open("rb") as f, np.load(f, allow_pickle=False) as z:
        doc, sums, counts = json.loads(str(z["meta"])), z["sums"], z["counts"]
    meta = edit(doc)
    text = meta if isinstance(meta, str) else json.dumps(meta)
    with path.open("wb") as out:
        np.savez(out, meta=np.array(text), sums=sums, counts=counts)


def doc_sensors(path: Path) -> list[list[object]]:
    with path.open("rb") as f, np.load(f, allow_pickle=False) as z:
        sensors: list[list[object]] = json.loads(str(z["meta"]))["sensors"]
    return sensors


def test_a_hostile_checkpoint_is_ignored_not_a_failed_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a damaged or hand-edited checkpoint can hold that a parse of it does not refuse as
    # ValueError: JSON nested deeper than the parser's recursion (RecursionError) and an
    # integer too large for a float (OverflowError). Either crashed every start of the daemon.
    engine = Engine(CONFIG.rules, ManualClock())
    engine.process(Sample("ph", T0, 7.0))
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    good = path.read_bytes()

    def huge(doc: dict[str, Any]) -> object:
        doc["state"][0]["last_time"] = 10**400
        return doc

    _rewrite_meta(path, lambda doc: "[" * 100_000 + "]" * 100_000)
    fresh = Engine(CONFIG.rules, ManualClock())
    with pytest.raises(StateError):
        restore_checkpoint(fresh, path)
    assert load_checkpoint_or_start_fresh(fresh, path) is False
    assert "ignored" in caplog.text
    # The integer is one sensor's entry: that sensor starts afresh, the rest is restored
    # (tests/test_checkpoint_entries.py).
    path.write_bytes(good)
    _rewrite_meta(path, huge)
    first = str(doc_sensors(path)[0][0])
    fresh = Engine(CONFIG.rules, ManualClock())
    assert load_checkpoint_or_start_fresh(fresh, path) is False
    assert f"sensor {first}'s entry makes no sense" in caplog.text
