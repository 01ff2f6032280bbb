"""The replay's incident tracker in a process of its own (monitor/incidents/worker.py):
the same incidents, evidence and log lines as the tracker in process, and a worker that
dies is reported once while the replay writes every event and exits 0."""

from __future__ import annotations

import json
import math
import os
import select
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import yaml

from monitor.config import Config, build_config
from monitor.engine import Engine, replay_steps
from monitor.errors import MonitorError
from monitor.incidents import Incident, IncidentStore, IncidentTracker, worker
from monitor.incidents.freezer import Freezer
from monitor.incidents.tracker import Part
from monitor.incidents.worker import IncidentWorker, ReplayTracker, hand_over
from monitor.model import ManualClock
from tests.incident_helpers import CASES, case_config, load, read_samples
from tests.incident_helpers import monitor as run

T0 = 1_780_000_000.0


CHATTERING = [
    {"id": "temp1", "kind": "temperature", "unit": "degF"},
    {"id": "temp2", "kind": "temperature", "unit": "degF"},
    {"id": "flow1", "kind": "flow", "unit": "gpm"},
]


def station(state: Path, sensors: list[dict[str, Any]]) -> dict[str, Any]:
    """A station config (as YAML would give it) with its state under `state`."""
    return {
        "station": {"id": "ps-w"},
        "state_dir": str(state),
        "console": {"enabled": False},
        "sensors": sensors,
    }


def chattering(state: Path, days: int = 3) -> tuple[Config, np.ndarray, np.ndarray, np.ndarray]:
    """Two temperatures that cross 65 degC every evening, with noise (thousands of
    transitions, incidents that end and freeze mid-replay), and a flow with a slug; a
    PLC's garbage here and there (NaN, 1e30: bad data, not judged, kept as evidence)."""
    config = build_config(station(state, CHATTERING))
    rng = np.random.default_rng(7)
    n = days * 8640
    t = T0 + np.arange(n) * 10.0
    day = np.sin(2 * np.pi * (t - T0) / 86400.0)
    temps = [120.0 * (1 + 0.2 * day) * rng.normal(1.0, 0.03, n) for _ in range(2)]
    flow = 300.0 * (1 + 0.2 * day) * rng.normal(1.0, 0.03, n)
    flow[(t > T0 + 1.5 * 86400) & (t < T0 + 1.5 * 86400 + 3600)] *= 8  # an hour's slug on day 2
    for series in (*temps, flow):
        series[rng.choice(n, 20, replace=False)] = math.nan
        series[rng.choice(n, 20, replace=False)] = 1e30
    sensor = np.tile(np.arange(3), n)
    time = np.repeat(t, 3)
    value = np.column_stack([temps[0], temps[1], flow]).ravel()
    return config, sensor, time, value


def record(
    config: Config,
    tracker: ReplayTracker,
    sensor: np.ndarray,
    time: np.ndarray,
    value: np.ndarray,
    batch: int,
) -> dict[str, Incident]:
    """What `monitor replay` does with a tracker: each step handed over, then advance."""
    engine = Engine(config.rules, ManualClock())
    last: dict[str, Incident] = {}
    try:
        for step in replay_steps(engine, sensor, time, value, batch_size=batch):
            hand_over(tracker, engine.sensors, step)
            last.update((i.id, i) for i in tracker.advance())
        last.update((i.id, i) for i in tracker.advance(final=True))
    finally:
        tracker.close()
    return last


def on_record(state: Path) -> tuple[str, dict[str, bytes]]:
    """The store's incidents (repr: NaN equals NaN) and every evidence file's bytes."""
    store = IncidentStore(state)
    try:
        incidents = repr(store.incidents())
    finally:
        store.close()
    files = {str(p.relative_to(state)): p.read_bytes() for p in sorted(state.rglob("*.csv*"))}
    return incidents, files


def in_process(config: Config) -> IncidentTracker:
    return IncidentTracker(config, background=True)


def test_the_worker_records_what_the_tracker_in_process_records(tmp_path: Path) -> None:
    config, sensor, time, value = chattering(tmp_path / "a")
    other = chattering(tmp_path / "b")[0]
    here = record(config, in_process(config), sensor, time, value, batch=20_000)
    there = record(other, IncidentWorker(other), sensor, time, value, batch=20_000)
    assert len(here) >= 4 and any(i.rule == "slug" for i in here.values())
    assert all(i.frozen for i in here.values())
    # the same incidents in their final (frozen) form; when each came back depends on the
    # freezing thread's pace, here and there
    assert repr(sorted(there.items())) == repr(sorted(here.items()))
    assert on_record(tmp_path / "b") == on_record(tmp_path / "a")
    assert on_record(tmp_path / "a")[1], "evidence files were written"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_worker_records_the_golden_cases_as_in_process(case: Path, tmp_path: Path) -> None:
    samples = read_samples(case)
    configs = [load(case_config(case, tmp_path / s)) for s in ("a", "b")]
    names = configs[0].rules.keys()
    index = {s: i for i, s in enumerate(names)}
    sensor = np.array([index.get(s.sensor, -1) for s in samples])
    time = np.array([s.time for s in samples])
    value = np.array([s.value for s in samples])
    here = record(configs[0], in_process(configs[0]), sensor, time, value, batch=97)
    there = record(configs[1], IncidentWorker(configs[1]), sensor, time, value, batch=97)
    assert here and repr(sorted(there.items())) == repr(sorted(here.items()))
    assert on_record(tmp_path / "b") == on_record(tmp_path / "a")


def test_a_worker_that_dies_is_reported_once_and_the_replay_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is killed (SIGKILL, a real process) after the first step it was given:
    the replay says so once, writes every event (as a replay without incidents does),
    exits 0 and leaves no process behind."""
    config, sensor, time, value = chattering(tmp_path / "state", days=2)
    csv = tmp_path / "input.csv"
    names = list(config.rules)
    rows = zip(sensor.tolist(), time.tolist(), value.tolist(), strict=True)
    lines = [f"{t:.0f},{names[s]},{v!r}" for s, t, v in rows]
    csv.write_text("time,sensor,value\n" + "\n".join(lines) + "\n", encoding="utf-8")
    cfg = tmp_path / "station.yaml"
    cfg.write_text(yaml.safe_dump(station(tmp_path / "state", CHATTERING)), encoding="utf-8")

    killed: list[int] = []
    advance = IncidentWorker.advance

    def advance_then_die(self: IncidentWorker, final: bool = False) -> list[Incident]:
        out = advance(self, final)
        pid = self._proc.pid if self._proc is not None else None
        if not killed and pid is not None:
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
        return out

    monkeypatch.setattr(IncidentWorker, "advance", advance_then_die)
    result = run("replay", "--config", str(cfg), "--input", str(csv), "--events", str(tmp_path / "e.jsonl"))
    assert result.returncode == 0, result.stderr
    failed = [line for line in result.stderr.splitlines() if "not recorded" in line]
    assert failed == [
        "replay: incidents not recorded from here on: the incident worker process stopped (exit -9)"
    ]
    assert killed
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)  # reaped, not a zombie
    monkeypatch.undo()
    plain = run(
        "replay", "--config", str(cfg), "--input", str(csv), "--events", str(tmp_path / "plain.jsonl"),
        "--no-incidents",
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    events = (tmp_path / "e.jsonl").read_text(encoding="utf-8")
    assert events and events == (tmp_path / "plain.jsonl").read_text(encoding="utf-8")


def test_the_workers_log_lines_are_the_replays(tmp_path: Path) -> None:
    """What the tracker logs in the child (an incident opened, one final) reaches the
    replay's own stderr, in the replay's log format."""
    case = next(c for c in CASES if c.name == "slug-and-oil")
    cfg = case_config(case, tmp_path / "state")
    result = run(
        "replay", "--config", str(cfg), "--input", str(case / "input.csv"), "--events", str(tmp_path / "e")
    )
    assert result.returncode == 0, result.stderr
    opened = [
        line
        for line in result.stderr.splitlines()
        if "monitor.incidents.tracker" in line and "opened" in line
    ]
    final = [line for line in result.stderr.splitlines() if "final:" in line and "sha256" in line]
    assert len(opened) == 2 and len(final) == 2, result.stderr


def _in_child(owner: type, name: str, before: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """`owner.name` calls `before()` first when it runs in the forked worker (the fork
    copies the patched class), as it was elsewhere."""
    parent = os.getpid()
    method = getattr(owner, name)

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        if os.getpid() != parent and (name != "advance" or kwargs.get("final") or any(args)):
            before()
        return method(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, patched)


def _worker_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the incident workers started from here on (noted when the replay
    first waits on one: for "ready")."""
    pids: list[int] = []
    drain = IncidentWorker._drain

    def noted(self: IncidentWorker, *args: Any, **kwargs: Any) -> None:
        pid = self._proc.pid if self._proc is not None else None
        if pid is not None and pid not in pids:
            pids.append(pid)
        drain(self, *args, **kwargs)

    monkeypatch.setattr(IncidentWorker, "_drain", noted)
    return pids


def _held_until_the_replay_waits(
    hold: Callable[[int], bool], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, int]:
    """In the forked worker, each `add_series` of a step whose sample count `hold` picks
    waits (before it copies anything) for a byte the replay writes each time it starts to
    wait for ring space (and a thousand at the final): the worker keeps up with small
    steps, so without this whether the ring ever fills (and the replay waits, and the
    spans wrap) depended on the two processes' pace. The pipe's fds, for the caller to
    close."""
    waiting, told = os.pipe()
    drain = IncidentWorker._drain
    parent, add_series = os.getpid(), IncidentTracker.add_series

    def tell(self: IncidentWorker, until: tuple[str, ...] = (), wait: float | None = None) -> None:
        if until in (("free",), ("done",)):
            os.write(told, b"w" * (1 if until == ("free",) else 1000))
        drain(self, until, wait)

    def add_held(self: IncidentTracker, series: list[Any]) -> None:
        if os.getpid() != parent and hold(sum(t.size for _, t, _, _ in series)):
            select.select([waiting], [], [], 60)  # bounded, should the replay never wait
            os.read(waiting, 1)
        add_series(self, series)

    monkeypatch.setattr(IncidentWorker, "_drain", tell)
    monkeypatch.setattr(IncidentTracker, "add_series", add_held)
    return waiting, told


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


KILL_POINTS = {
    "before ready": (IncidentTracker, "__init__", "worker"),
    "mid-step": (IncidentTracker, "apply_transitions", "worker"),
    "in the final advance": (IncidentTracker, "advance", "worker"),
    "mid-freeze": (Freezer, "_prepare", "freezer"),  # the worker's freezing process
}


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_worker_killed_at_any_point_leaves_a_usable_store(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL (a real one, the child sends it to itself) before the worker is ready, in
    the middle of a step, during the final advance and while an incident freezes: the
    replay says so once, writes every event, exits 0, and `monitor incidents list` reads
    what was recorded."""
    owner, name, who = KILL_POINTS[point]
    _in_child(owner, name, _kill_self, monkeypatch)
    case = next(c for c in CASES if c.name == "slug-and-oil")
    cfg = case_config(case, tmp_path / "state")
    events = tmp_path / "e.jsonl"
    result = run("replay", "--config", str(cfg), "--input", str(case / "input.csv"), "--events", str(events))
    assert result.returncode == 0, result.stderr
    failed = [line for line in result.stderr.splitlines() if "not recorded" in line]
    assert len(failed) == 1 and failed[0].endswith(f"the incident {who} process stopped (exit -9)"), failed
    assert len(events.read_text(encoding="utf-8").splitlines()) == 4  # every alarm event
    listed = run("incidents", "list", "--config", str(cfg))
    assert listed.returncode == 0, listed.stderr


def test_a_ctrl_c_while_the_worker_cleans_up_does_not_hang_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C goes to the whole process group, the worker included, and one can land
    while the worker closes its tracker (a second Ctrl-C, or the first one at the end of
    a replay): here a real SIGINT the child sends itself there. The worker still finishes
    its cleanup and exits on its own; it used to stop its cleanup halfway and then wait for
    its result writer for ever, until the replay killed it after CLOSE_WAIT."""
    monkeypatch.setattr(worker, "CLOSE_WAIT", 5.0)
    _in_child(IncidentTracker, "close", lambda: os.kill(os.getpid(), signal.SIGINT), monkeypatch)
    pids = _worker_pids(monkeypatch)
    case = next(c for c in CASES if c.name == "slug-and-oil")
    cfg = case_config(case, tmp_path / "state")
    events = tmp_path / "e.jsonl"
    result = run("replay", "--config", str(cfg), "--input", str(case / "input.csv"), "--events", str(events))
    assert result.returncode == 0, result.stderr
    assert "did not stop" not in result.stderr and "not recorded" not in result.stderr, result.stderr
    assert "2 incident(s) recorded" in result.stderr
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # reaped
    listed = run("incidents", "list", "--config", str(cfg), "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [i["evidence"]["frozen"] for i in json.loads(listed.stdout)] == [True, True]


def test_the_worker_is_stopped_when_the_replay_fails_before_its_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker starts first (before the input is opened); a part opened after it that
    fails (here the meter ledger: a directory where the database should be) still ends
    the worker and reaps it, as every later failure does."""
    pids = _worker_pids(monkeypatch)
    state = tmp_path / "state"
    (state / "ledger.sqlite").mkdir(parents=True)
    meter = {"id": "home.meter", "kind": "meter", "unit": "gal", "register_digits": 6, "max_rate": 200}
    cfg = tmp_path / "station.yaml"
    cfg.write_text(yaml.safe_dump(station(state, [CHATTERING[2], meter])), encoding="utf-8")
    csv = tmp_path / "input.csv"
    csv.write_text(f"time,sensor,value\n{T0:.0f},flow1,300\n", encoding="utf-8")
    result = run("replay", "--config", str(cfg), "--input", str(csv), "--events", str(tmp_path / "e.jsonl"))
    assert result.returncode == 1 and "meter ledger" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr  # one line that names the file, not a traceback
    assert [line for line in result.stderr.splitlines() if line.startswith("replay: ")] == [
        line for line in result.stderr.splitlines() if "ledger.sqlite" in line
    ], result.stderr
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # stopped and reaped, not left to the garbage collector


def test_without_a_worker_process_the_replay_records_its_incidents_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway at its process limit refuses the fork (EAGAIN). That cannot be caused on
    demand here (the tests run as root, which RLIMIT_NPROC does not bind), so `os.fork`
    is replaced by one that raises, and only here. The replay says so once and records
    the same incidents in its own process instead of none."""
    import errno

    case = next(c for c in CASES if c.name == "slug-and-oil")
    normal = case_config(case, tmp_path / "normal")
    result = run(
        "replay", "--config", str(normal), "--input", str(case / "input.csv"), "--events", str(tmp_path / "a")
    )
    assert result.returncode == 0, result.stderr

    def refuse() -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    cfg = case_config(case, tmp_path / "state")
    result = run(
        "replay", "--config", str(cfg), "--input", str(case / "input.csv"), "--events", str(tmp_path / "b")
    )
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "incident worker" in line]
    assert len(said) == 1 and "Resource temporarily unavailable" in said[0], result.stderr
    assert "recorded in this process" in said[0]
    assert "not recorded" not in result.stderr
    assert (tmp_path / "b").read_text() == (tmp_path / "a").read_text()
    assert on_record(tmp_path / "state") == on_record(tmp_path / "normal")  # incidents, evidence files


def test_a_steps_samples_cross_the_pipe_as_raw_bytes_unchanged() -> None:
    """The series go down the step pipe as bytes, not pickled: every column comes back
    with its dtype and values (NaN, -0.0, a strided view, an empty series, odd lengths
    that would misalign the floats if the qualities were not sent last)."""
    rng = np.random.default_rng(3)
    wide = rng.normal(size=14)
    series = [
        ("a", np.array([1.0, 2.5, 3.0]), np.array([math.nan, -0.0, 1e30]), np.array([0, 1, 2], np.int8)),
        ("b", np.empty(0), np.empty(0), np.empty(0, np.int8)),
        ("c", wide[::2], wide[1::2], rng.integers(-3, 3, 7).astype(np.int8)),
    ]
    read, write = os.pipe()
    try:
        for part in worker._payload(series):
            worker._write_all(write, part)
        got = worker._read_series(read, [(name, int(t.size)) for name, t, _, _ in series])
    finally:
        os.close(read)
        os.close(write)
    assert [g[0] for g in got] == ["a", "b", "c"]
    for (_, t, v, q), (_, gt, gv, gq) in zip(series, got, strict=True):
        assert gt.dtype == np.float64 and gv.dtype == np.float64 and gq.dtype == np.int8
        assert gt.tobytes() == t.tobytes() and gv.tobytes() == v.tobytes() and gq.tobytes() == q.tobytes()


def test_a_step_cut_short_by_the_replays_end_is_the_end_of_the_input() -> None:
    """A replay that dies mid-step (its half of the bytes sent) ends the child's input
    (`_read_ahead` puts None): no step is made of what was left."""
    series = [("a", np.arange(4.0), np.arange(4.0), np.zeros(4, np.int8))]
    read, write = os.pipe()
    try:
        worker._write_all(write, worker._payload(series)[0])
        os.close(write)
        with pytest.raises(EOFError):
            worker._read_series(read, [("a", 4)])
    finally:
        os.close(read)


def test_the_replay_collects_its_garbage_as_before_once_the_worker_is_forked(tmp_path: Path) -> None:
    """The worker is forked with the interpreter's objects frozen (its collections skip
    them); the replay unfreezes at once: nothing of its own stays out of its collections."""
    import gc

    config = chattering(tmp_path)[0]
    gc.unfreeze()  # as a replay starts (an earlier test may have frozen in this process)
    started = IncidentWorker(config)
    try:
        assert gc.get_freeze_count() == 0
    finally:
        started.close()


def test_a_steps_transitions_cross_as_columns_and_come_back_equal() -> None:
    """The incident rules' transitions on watched sensors go down pickled one list a
    field; the child's are the replay's, field for field as the tracker reads them (no
    limit, both states, several steps joined in order); other rules and sensors stay behind."""
    import pickle

    from monitor.incidents.transitions import Transitions, transitions
    from monitor.model import Condition, ConditionState, Rule

    sent = [
        Condition(T0, "temp1", Rule.HIGH, ConditionState.ACTIVE, 151.5, 149.0, "§139-5"),
        Condition(T0 + 5, "temp1", Rule.STALE, ConditionState.ACTIVE, 151.5, 60.0, "§139-9"),
        Condition(T0 + 6, "other", Rule.LOW, ConditionState.ACTIVE, 1.0, 2.0, "§139-5"),
        Condition(
            T0 + 10, "flow1", Rule.SLUG, ConditionState.CLEARED, 300.0, None, "§139-7", "m", {"x": 1.5}
        ),
    ]
    watched = {"temp1", "flow1"}
    parts = [transitions(sent[:2], watched), transitions(sent[2:], watched)]
    got = pickle.loads(pickle.dumps(Transitions.join(parts)))
    kept = [sent[0], sent[3]]
    assert got == transitions(sent, watched)
    fields = ("time", "sensor", "rule", "state", "limit", "citation")
    assert [tuple(getattr(got.condition(i), f) for f in fields) for i in range(len(got.time))] == [
        tuple(getattr(c, f) for f in fields) for c in kept
    ]
    assert got.condition(0).rule is Rule.HIGH and got.condition(1).state is ConditionState.CLEARED
    assert transitions([], watched) == Transitions([], [], [], [], [], [])


def test_the_rings_spans_are_taken_in_order_and_never_wrap_a_step() -> None:
    """Spans are 8-byte aligned (the floats), follow one another, start over at 0 when the
    end is reached and the start is free (or when everything was given back), and are
    refused (None) while the space they need is still in use."""
    spans = worker._Spans(100)
    assert [spans.take(17), spans.take(30), spans.take(40)] == [0, 24, 56]
    assert spans.take(8) is None  # 96 + 8 > 100, and the oldest span starts at 0
    spans.give_back()  # [0, 24) free
    assert spans.take(25) is None  # does not fit before the span at 24
    assert spans.take(20) == 0  # wrapped
    assert spans.take(1) is None  # 24 bytes in use right after it
    spans.give_back()
    spans.give_back()  # only the wrapped span at 0 is left
    assert spans.take(60) == 24
    assert spans.take(17) is None  # 84 + 24 > 100
    spans.give_back()
    spans.give_back()
    assert spans.take(100) == 0  # all given back: from the start, the whole ring


def test_a_steps_samples_cross_the_ring_unchanged() -> None:
    """`_fill` puts a step's kept parts where the child's `_series` finds them: every
    column with its dtype and values (NaN, -0.0, a strided view, an empty part, odd
    lengths), the qualities taken by the part's indices from the step's column."""
    rng = np.random.default_rng(5)
    wide = rng.normal(size=14)
    quality = rng.integers(-3, 3, 20).astype(np.int8)
    parts: list[tuple[str, Part, np.ndarray]] = [
        ("a", (np.array([4, 0, 9]), np.array([1.0, 2.5, 3.0]), np.array([math.nan, -0.0, 1e30])), quality),
        ("b", (np.empty(0, np.intp), np.empty(0), np.empty(0)), quality),
        ("c", (np.arange(7) * 2, wide[::2], wide[1::2]), quality),
        ("d", (np.array([1, 2]), np.array([5.0, 6.0]), np.array([7.0, 8.0])), quality.astype(np.int16)),
    ]
    sizes = [(name, int(part[1].size)) for name, part, _ in parts]
    ring = np.zeros(4096, np.uint8)
    at = 64
    total = 17 * sum(n for _, n in sizes)
    worker._fill(ring[at : at + total], parts)
    got = worker._series(ring[at : at + total], sizes)
    assert [g[0] for g in got] == ["a", "b", "c", "d"]
    for (_, (sel, t, v), q), (_, gt, gv, gq) in zip(parts, got, strict=True):
        assert gt.dtype == np.float64 and gv.dtype == np.float64 and gq.dtype == np.int8
        assert gt.tobytes() == t.tobytes() and gv.tobytes() == v.tobytes()
        assert gq.tobytes() == q[sel].astype(np.int8).tobytes()
    assert not ring[:at].any() and not ring[at + total :].any()  # nothing written outside its span


@pytest.mark.parametrize(
    "ring", [1 << 10, 256 << 10], ids=["steps larger than the ring", "a ring of 3 steps"]
)
def test_the_worker_records_the_same_through_a_small_ring(
    ring: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps of ~85 KB: through a 1 KiB ring every one goes down the pipe instead; through a
    256 KiB ring the replay waits for the child to give space back and the steps wrap
    around its end. Either way the incidents and evidence are the tracker's in process."""
    monkeypatch.setattr(worker, "RING", ring)
    piped: list[int] = []
    waits: list[int] = []
    write_all, drain = worker._write_all, IncidentWorker._drain

    def noted_write(fd: int, data: memoryview) -> None:
        piped.append(len(data))
        write_all(fd, data)

    def noted_drain(self: IncidentWorker, until: tuple[str, ...] = (), wait: float | None = None) -> None:
        if until == ("free",):
            waits.append(1)
        drain(self, until, wait)

    monkeypatch.setattr(worker, "_write_all", noted_write)
    monkeypatch.setattr(IncidentWorker, "_drain", noted_drain)
    fds: tuple[int, ...] = ()
    if ring > 85_000:  # the child lags (whatever the pace): the ring fills, the replay waits
        fds = _held_until_the_replay_waits(lambda n: True, monkeypatch)
    config, sensor, time, value = chattering(tmp_path / "a")
    other = chattering(tmp_path / "b")[0]
    here = record(config, in_process(config), sensor, time, value, batch=5_000)
    try:
        there = record(other, IncidentWorker(other), sensor, time, value, batch=5_000)
    finally:
        for fd in fds:
            os.close(fd)
    assert here and repr(sorted(there.items())) == repr(sorted(here.items()))
    assert on_record(tmp_path / "b") == on_record(tmp_path / "a")
    if ring < 85_000:
        assert sum(piped) == 17 * sensor.size and not waits  # every sample down the pipe
    else:
        assert not piped and waits


KILLED = r"the incident worker process stopped \(exit -9\)"


def _record_expecting(
    config: Config,
    series: tuple[np.ndarray, np.ndarray, np.ndarray],
    raises: type[BaseException],
    match: str | None,
    pipe: tuple[int, int],
) -> IncidentWorker:
    """A worker-fed replay of `series` that must end in `raises`: the test's pipe is closed
    and the worker closed either way, and the child is reaped."""
    tracker = IncidentWorker(config)
    pid = tracker._proc.pid if tracker._proc is not None else None
    try:
        with pytest.raises(raises, match=match):
            record(config, tracker, *series, batch=5_000)
    finally:
        tracker.close()
        for fd in pipe:
            os.close(fd)
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped
    return tracker


def test_a_worker_that_dies_while_the_replay_waits_for_ring_space_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real forked worker, SIGKILLed once the replay is waiting for it to give space in
    the ring back (a pipe tells it when: the replay writes a byte as it starts to wait, the
    child's tracker reads it in its first `add_series`, then kills itself): `advance`
    raises the worker's end, as for a worker that dies elsewhere, and `close` reaps it."""
    monkeypatch.setattr(worker, "RING", 128 << 10)  # one ~85 KB step at a time
    waiting, told = os.pipe()
    drain = IncidentWorker._drain
    waited: list[int] = []

    def tell(self: IncidentWorker, until: tuple[str, ...] = (), wait: float | None = None) -> None:
        if until == ("free",):
            waited.append(os.write(told, b"w"))
        drain(self, until, wait)

    def die_once_waited_for() -> None:
        # bounded, should the replay never wait (then `waited` fails below instead of a hang)
        select.select([waiting], [], [], 60)
        _kill_self()

    monkeypatch.setattr(IncidentWorker, "_drain", tell)
    _in_child(IncidentTracker, "add_series", die_once_waited_for, monkeypatch)
    config, sensor, time, value = chattering(tmp_path / "state")
    _record_expecting(config, (sensor, time, value), MonitorError, KILLED, (waiting, told))
    assert waited


def test_without_shared_memory_for_the_ring_the_tracker_runs_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring cannot be mapped (out of memory or address space: not something a test can
    bring about without starving its own process, so `mmap.mmap` is replaced by one that
    raises, and only here): no worker, the tracker in process, and the replay says why."""
    import errno
    import mmap

    def refuse(*args: Any, **kwargs: Any) -> mmap.mmap:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    config = chattering(tmp_path)[0]
    tracker = worker.replay_tracker(config)
    try:
        assert isinstance(tracker, IncidentTracker)
    finally:
        tracker.close()


def test_the_step_pipe_holds_a_steps_header_or_keeps_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step pipe is widened to `PIPE` bytes (a header no longer waits on the child's
    reader); where the kernel refuses (a user at their pipe memory limit: not something a
    test can bring about without changing the machine's settings, so `fcntl.fcntl` is
    replaced by one that refuses, and only for that call) the worker starts all the same
    and records the same incidents."""
    import errno
    import fcntl

    config, sensor, time, value = chattering(tmp_path / "a", days=1)
    started = IncidentWorker(config)
    try:
        assert started._send is not None
        assert fcntl.fcntl(started._send.fileno(), fcntl.F_GETPIPE_SZ) == worker.PIPE
    finally:
        started.close()
    real = fcntl.fcntl

    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETPIPE_SZ:
            raise OSError(errno.EPERM, "Operation not permitted")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    other = chattering(tmp_path / "b", days=1)[0]
    narrow = IncidentWorker(other)
    assert narrow._send is not None
    assert fcntl.fcntl(narrow._send.fileno(), fcntl.F_GETPIPE_SZ) == 65536
    alone = chattering(tmp_path / "c", days=1)[0]
    here = record(alone, in_process(alone), sensor, time, value, batch=5_000)
    there = record(other, narrow, sensor, time, value, batch=5_000)
    assert here and repr(sorted(there.items())) == repr(sorted(here.items()))


def test_a_ctrl_c_while_a_step_is_copied_into_the_ring_ends_the_replay_with_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while the replay copies a step into the ring: a real SIGINT, which the
    replay sends itself as `_fill` starts (that moment cannot be hit from outside without a
    sleep). The replay exits 130 without a traceback and the worker is reaped: the views of
    the ring that the interrupt's traceback holds made `close` raise BufferError over it
    (exit 1, "cannot close exported pointers exist")."""
    fill = worker._fill

    def interrupted(buf: np.ndarray, parts: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        fill(buf, parts)

    monkeypatch.setattr(worker, "_fill", interrupted)
    pids = _worker_pids(monkeypatch)
    case = next(c for c in CASES if c.name == "slug-and-oil")
    cfg = case_config(case, tmp_path / "state")
    result = run(
        "replay", "--config", str(cfg), "--input", str(case / "input.csv"), "--events", str(tmp_path / "e")
    )
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and "BufferError" not in result.stderr, result.stderr
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # reaped
    listed = run("incidents", "list", "--config", str(cfg))
    assert listed.returncode == 0, listed.stderr


def test_a_ctrl_c_while_the_replay_waits_for_ring_space_stops_both_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C reaches the replay and the worker alike (the terminal signals the process
    group) while the replay waits for the worker to give ring space back: real SIGINTs,
    sent by the child to the replay and to itself once the replay has said it waits (a
    pipe, as in the SIGKILL test above; the test's own process group is pytest's, so not
    `killpg`). The replay gets its KeyboardInterrupt, `close` lets the worker finish and
    reaps it, and the store opens and lists what was recorded."""
    monkeypatch.setattr(worker, "RING", 128 << 10)  # one ~85 KB step at a time
    waiting, told = os.pipe()
    parent = os.getpid()
    drain = IncidentWorker._drain
    waited: list[int] = []

    def tell(self: IncidentWorker, until: tuple[str, ...] = (), wait: float | None = None) -> None:
        if until == ("free",) and not waited:
            waited.append(1)  # first: the interrupt can land as soon as the byte is written
            os.write(told, b"w")
        drain(self, until, wait)

    def ctrl_c_once_waited_for() -> None:
        select.select([waiting], [], [], 60)  # bounded, should the replay never wait
        os.kill(parent, signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(IncidentWorker, "_drain", tell)
    _in_child(IncidentTracker, "add_series", ctrl_c_once_waited_for, monkeypatch)
    config, sensor, time, value = chattering(tmp_path / "state")
    tracker = _record_expecting(config, (sensor, time, value), KeyboardInterrupt, None, (waiting, told))
    assert waited and tracker._proc is None  # `record` closed it
    store = IncidentStore(tmp_path / "state")
    try:
        store.incidents()
    finally:
        store.close()


def test_steps_of_every_size_share_the_ring_and_every_span_is_given_back_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One replay whose steps are, in turn: exactly the ring's size (each waits for the one
    before to be given back, all at 0), none of the kept sensors' samples (0 bytes: nothing
    taken of the ring), larger than the ring (down the pipe, between ring steps), and a
    third of the ring (they follow one another and wrap around its end). The incidents and
    evidence are the in-process tracker's; at the end every span has been given back, once
    (a "free" counted twice would raise on the empty ring, or free a span still in use)."""
    rows = 4_992  # 3 sensors a time, 8 | 17 * rows: a full step's samples fill the ring exactly
    monkeypatch.setattr(worker, "RING", 17 * rows)
    taken: list[tuple[int, int | None]] = []
    piped: list[int] = []
    take, write_all = worker._Spans.take, worker._write_all

    def noted_take(self: worker._Spans, size: int) -> int | None:
        at = take(self, size)
        taken.append((size, at))
        return at

    def noted_write(fd: int, data: memoryview) -> None:
        piped.append(len(data))
        write_all(fd, data)

    # each ring step waits in the child for the replay to wait: the ring fills, whatever the pace
    waiting, told = _held_until_the_replay_waits(lambda n: n <= rows, monkeypatch)
    monkeypatch.setattr(worker._Spans, "take", noted_take)
    monkeypatch.setattr(worker, "_write_all", noted_write)
    config, sensor, time, value = chattering(tmp_path / "a", days=2)
    sensor = sensor.copy()
    sensor[3 * rows : 4 * rows] = -1  # a step of no known sensor: none of its samples kept
    segments = [(0, 3 * rows, rows), (3 * rows, 4 * rows, rows), (4 * rows, 8 * rows, 4 * rows)]
    segments += [(8 * rows, sensor.size, rows // 3 - 2)]  # 3 such steps fit, a 4th wraps

    def replayed(config: Config, tracker: ReplayTracker) -> dict[str, Incident]:
        engine = Engine(config.rules, ManualClock())
        last: dict[str, Incident] = {}
        try:
            for a, b, batch in segments:
                for step in replay_steps(engine, sensor[a:b], time[a:b], value[a:b], batch_size=batch):
                    hand_over(tracker, engine.sensors, step)
                    last.update((i.id, i) for i in tracker.advance())
            last.update((i.id, i) for i in tracker.advance(final=True))
            if isinstance(tracker, IncidentWorker):
                assert not tracker._spans._used  # every ring step given back
        finally:
            tracker.close()
        return last

    other = chattering(tmp_path / "b", days=2)[0]
    here = replayed(config, in_process(config))
    try:
        there = replayed(other, IncidentWorker(other))
    finally:
        os.close(waiting)
        os.close(told)
    assert here and repr(sorted(there.items())) == repr(sorted(here.items()))
    assert on_record(tmp_path / "b") == on_record(tmp_path / "a")
    full = [at for size, at in taken if size == worker.RING]
    assert full and set(full) <= {0, None}  # the whole ring, from its start, once it was free
    assert (worker.RING, None) in taken  # ... waited for
    assert piped and sum(piped) % 17 == 0 and min(piped) > 0  # the larger steps, down the pipe
    thirds = [at for size, at in taken if size < worker.RING // 2 and at is not None]
    assert len(set(thirds)) >= 3 and thirds.count(0) > 1  # one after another, around the ring


def test_a_worker_that_dies_while_the_replay_writes_a_full_step_pipe_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps larger than the ring go down the 1 MiB step pipe. The worker is held in its
    first `add_series` (its reader stops at `AHEAD` steps), so the pipe fills; when the
    replay's write would block (a non-blocking try says EAGAIN), it tells the worker (a byte
    down a pipe of the test's), which SIGKILLs itself (a real process and signal), and
    writes on, blocking, until EPIPE: `advance` raises the worker's end, nothing hangs,
    and `close` reaps it."""
    monkeypatch.setattr(worker, "RING", 1 << 10)  # every ~85 KB step down the pipe
    waiting, told = os.pipe()
    write_all = worker._write_all
    said: list[int] = []

    def tell_when_full(fd: int, data: memoryview) -> None:
        if not said:  # as much as fits now, without blocking: the rest would block
            os.set_blocking(fd, False)
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except BlockingIOError:
                said.append(1)
                os.write(told, b"w")
            finally:
                os.set_blocking(fd, True)
        write_all(fd, data)  # blocks on the full pipe until the worker is gone: EPIPE

    def die_once_the_pipe_is_full() -> None:
        select.select([waiting], [], [], 60)  # bounded, should the pipe never fill
        _kill_self()

    monkeypatch.setattr(worker, "_write_all", tell_when_full)
    _in_child(IncidentTracker, "add_series", die_once_the_pipe_is_full, monkeypatch)
    config, sensor, time, value = chattering(tmp_path / "state", days=6)
    _record_expecting(config, (sensor, time, value), MonitorError, KILLED, (waiting, told))
    assert said


def test_a_replay_short_of_address_space_for_the_ring_records_its_incidents_in_process(
    tmp_path: Path,
) -> None:
    """A real ENOMEM for the ring: a replay in a process of its own whose address space
    (RLIMIT_AS) leaves less than the ring's 64 MiB but enough for the rest (56 MiB more
    than it has mapped once the replay's modules are in). It says why once, records the
    same incidents and evidence in its own process, and exits 0."""
    import subprocess
    import sys

    from tests.incident_helpers import ROOT

    assert worker.RING > 56 << 20
    case = next(c for c in CASES if c.name == "slug-and-oil")
    normal = case_config(case, tmp_path / "normal")
    result = run(
        "replay", "--config", str(normal), "--input", str(case / "input.csv"), "--events", str(tmp_path / "a")
    )
    assert result.returncode == 0, result.stderr
    starved = (
        "import resource, sys\n"
        "import monitor.commands.replay, monitor.engine, monitor.incidents.worker\n"
        "from monitor.cli import main\n"
        "size = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize:'))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size * 1024 + (56 << 20), resource.RLIM_INFINITY))\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    cfg = case_config(case, tmp_path / "state")
    args = [
        "replay",
        "--config",
        str(cfg),
        "--input",
        str(case / "input.csv"),
        "--events",
        str(tmp_path / "b"),
    ]
    out = subprocess.run([sys.executable, "-c", starved, *args], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "incident worker" in line]
    assert len(said) == 1 and "incident worker: Cannot allocate memory" in said[0], out.stderr
    assert "recorded in this process" in said[0] and "not recorded" not in out.stderr
    assert (tmp_path / "b").read_text() == (tmp_path / "a").read_text()
    assert on_record(tmp_path / "state") == on_record(tmp_path / "normal")


def test_the_freezer_knows_what_it_is_freezing_until_it_is_taken(tmp_path: Path) -> None:
    """`in` is asked at every re-activation; it answers from a set kept with the queue.
    The freezing itself is held on an event (a stand-in: what is asked is the queue's
    membership, not how an incident is frozen)."""
    release = threading.Event()

    class Held(Freezer):
        def _freeze(self, inc: Incident) -> Incident:
            release.wait(timeout=60)
            return inc

    freezer = Held(tmp_path, lambda inc, store, columns: inc.figures, 86400.0)
    a, b = (cast(Incident, SimpleNamespace(id=i)) for i in ("a", "b"))
    freezer.submit(a)
    freezer.submit(b)
    assert "a" in freezer and "b" in freezer and "c" not in freezer
    assert freezer.take(wait=False) == []  # still freezing: still known
    assert "a" in freezer
    release.set()
    assert [i.id for i in freezer.take(wait=True)] == ["a", "b"]
    assert "a" not in freezer and "b" not in freezer
    freezer.close()
