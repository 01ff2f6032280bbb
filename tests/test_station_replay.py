"""Seven simulated days of a two-pump lift station, replayed: the issue's "Done when".

The simulator (simulators/lift_station.py) integrates the wet well second by second
and keeps its own count; the monitor sees only what the instruments read every 10 s.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from monitor.config import load_config
from monitor.engine import Engine
from monitor.model import ManualClock, Sample, parse_time
from monitor.sources.replay import Samples, read_csv
from monitor.station import Derivation, StationTracker, derive_arrays, station_steps, track_arrays
from simulators.lift_station import LiftStation
from tests import cli

pytestmark = pytest.mark.integration  # whole commands over golden cases: `make test`, not `make check`

ROOT = Path(__file__).resolve().parent.parent
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
INTERVAL = 10.0
DELAY = 120.0  # fail_to_start_delay of config/pump-station.yaml


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


@dataclass
class Run:
    sim: LiftStation
    config: Path
    csv: Path
    events: list[dict[str, object]]
    report: dict[str, list[dict[str, object]]]


def station_config(tmp: Path) -> Path:
    raw = yaml.safe_load((ROOT / "config" / "pump-station.yaml").read_text(encoding="utf-8"))
    raw["state_dir"] = str(tmp / "state")
    raw["profile"] = str(ROOT / "monitor" / "profiles" / "barton-139.yaml")
    path = tmp / "station.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("week")
    sim = LiftStation(START, days=7.0).run()
    csv = tmp / "station.csv"
    sim.write_csv(csv, INTERVAL)
    config = station_config(tmp)
    out = monitor("replay", "--config", str(config), "--input", str(csv), "--events", str(tmp / "ev.jsonl"))
    assert out.returncode == 0, out.stderr
    events = [json.loads(x) for x in (tmp / "ev.jsonl").read_text(encoding="utf-8").splitlines()]
    rep = monitor(
        "pumps", "report", "--config", str(config), "--start", "2026-01-01T00:00:00Z",
        "--end", "2026-01-08T00:00:00Z", "--format", "json",
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    yield Run(sim, config, csv, events, json.loads(rep.stdout))


def test_run_hours_and_starts_within_one_percent(week: Run) -> None:
    pumps = {p["sensor"]: p for p in week.report["pumps"]}
    assert set(pumps) == {"ps.pump1", "ps.pump2"}
    for pump, seconds in week.sim.truth.run_seconds.items():
        assert pumps[pump]["run_hours"] == pytest.approx(seconds / 3600.0, rel=0.01)
        assert pumps[pump]["starts"] == pytest.approx(week.sim.truth.starts[pump], rel=0.01)
        assert week.sim.truth.starts[pump] > 200  # a real week of cycling, not a trivial case


def test_overflow_volume_within_ten_percent(week: Run) -> None:
    truth = week.sim.truth
    assert len(truth.overflows) == 1 and truth.overflow_gal > 1000
    (record,) = week.report["overflows"]
    assert record["sensor"] == "ps.level"
    assert record["volume_gal"] == pytest.approx(truth.overflow_gal, rel=0.10)
    start, end = truth.overflows[0]
    assert abs(parse_time(str(record["start"])) - start) <= INTERVAL
    assert abs(parse_time(str(record["end"])) - end) <= INTERVAL
    assert str(record["start"]).endswith("Z") and str(record["end"]).endswith("Z")
    # Due two hours after the start, shown in the station's zone (New York, EST in January).
    assert record["report_due_local"] == "2026-01-03T07:33-05:00"
    overflow = [e for e in week.events if e["rule"] == "overflow"]
    assert [e["state"] for e in overflow] == ["active", "cleared"]


def test_fail_to_start_raised_within_its_delay(week: Run) -> None:
    episodes = week.sim.truth.fail_to_start
    assert episodes, "the simulated failure never left the well without a running pump"
    raised = [
        parse_time(str(e["time"]))
        for e in week.events
        if e["rule"] == "fail_to_start" and e["state"] == "active"
    ]
    long_enough = [(a, b) for a, b in episodes if b - a > DELAY + INTERVAL]
    assert long_enough
    for a, _b in long_enough:
        hits = [t for t in raised if a + DELAY <= t <= a + DELAY + INTERVAL]
        assert len(hits) == 1, (a, raised)
    # Nothing raised outside an episode that lasted longer than the delay.
    for t in raised:
        assert any(a + DELAY <= t <= b + INTERVAL for a, b in episodes), t


def test_no_slug_on_the_derived_inflow_only_the_injected_one(week: Run) -> None:
    slugs = [e for e in week.events if e["rule"] == "slug" and e["state"] == "active"]
    assert [e["sensor"] for e in slugs] == ["mill.flow"]
    assert week.sim.truth.slug is not None
    begin, _ = week.sim.truth.slug
    t = parse_time(str(slugs[0]["time"]))
    assert begin + 900.0 < t <= begin + 900.0 + INTERVAL


def test_live_feeding_gives_the_same_derived_samples_and_events_as_replay(week: Run) -> None:
    """`feed` one sample at a time (the live path) against the array path (replay)."""
    config = load_config(week.config)
    names = tuple(config.rules)
    samples, _ = read_csv(week.csv, names)
    n = 20_000  # a stretch with pump cycles
    sel = slice(0, n)
    s_arr, t_arr, v_arr, q_arr = derive_arrays(
        Derivation(config.derived, config.rules), names,
        samples.sensor[sel], samples.time[sel], samples.value[sel], samples.quality[sel],
    )  # fmt: skip
    tracker_arrays = StationTracker(config)
    replayed = track_arrays(tracker_arrays, names, s_arr, t_arr, v_arr, q_arr)
    live = Derivation(config.derived, config.rules)
    tracker_live = StationTracker(config)
    made: list[Sample] = []
    conditions = []
    for i, t, v in zip(
        samples.sensor[sel].tolist(), samples.time[sel].tolist(), samples.value[sel].tolist(), strict=True
    ):
        sample = Sample(names[i], t, v)
        derived = live.feed(sample)
        made.extend(derived)
        for d in derived:
            conditions.extend(tracker_live.feed(d))
        conditions.extend(tracker_live.feed(sample))
    made.extend(live.flush())
    inflow = names.index("ps.inflow")
    mask = s_arr == inflow
    assert len(made) == int(mask.sum()) > 1000
    assert np.array_equal(np.array([m.time for m in made]), t_arr[mask])
    assert np.array_equal(np.array([m.value for m in made]), v_arr[mask])
    assert conditions == replayed
    assert tracker_live.pumps["ps.pump1"].starts == tracker_arrays.pumps["ps.pump1"].starts > 10


def test_batches_cut_anywhere_give_the_same_events_as_one_batch(week: Run) -> None:
    """The replay reader streams batches; a derived sample pending at a cut comes with the next."""
    config = load_config(week.config)
    names = tuple(config.rules)
    samples, _ = read_csv(week.csv, names)
    n = 100_000  # 55 h: the first fail-to-start episodes

    def run(cuts: list[int]) -> list[object]:
        parts = [
            Samples(samples.sensor[a:b], samples.time[a:b], samples.value[a:b], samples.quality[a:b])
            for a, b in zip([0, *cuts], [*cuts, n], strict=True)
        ]
        engine = Engine(config.rules, ManualClock())
        out: list[object] = []
        for step in station_steps(config, engine, parts, StationTracker(config)):
            out.extend((c.time, c.sensor, str(c.rule), str(c.state)) for c in step.conditions)
            out.append(int(step.accepted.sum()))
        return [x for x in out if not isinstance(x, int)] + [sum(x for x in out if isinstance(x, int))]

    whole = run([])
    assert run([7, 12_345, 12_346, 40_001]) == whole
    assert any(x[2] == "fail_to_start" for x in whole[:-1])  # type: ignore[index]


def test_what_if_computes_the_derived_inflow_on_both_sides(week: Run, tmp_path: Path) -> None:
    """A candidate that judges the derived inflow at 2x its 24 h average (the storm is ~4x)."""
    raw = yaml.safe_load(week.config.read_text(encoding="utf-8"))
    raw["state_dir"] = str(tmp_path / "candidate-state")
    for s in raw["sensors"]:
        if s["id"] == "ps.inflow":
            s["slug"] = {"factor": 2.0}
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    out = monitor(
        "replay", "--config", str(week.config), "--input", str(week.csv), "--what-if", str(candidate),
        "--format", "json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {(r["sensor"], r["rule"]): r for r in json.loads(out.stdout)["rules"]}
    inflow = rows[("ps.inflow", "slug")]
    assert inflow["current"]["count"] == 0 and inflow["candidate"]["count"] >= 1
    assert rows[("mill.flow", "slug")]["only_current"] == rows[("mill.flow", "slug")]["only_candidate"] == []
