"""Shared by the incident tests: the golden cases, a station config in tmp, and a live
daemon fed the case's samples in small batches (as the pipeline would)."""

from __future__ import annotations

import csv
import json
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from monitor.config import Config, load_config
from monitor.daemon import Daemon
from monitor.incidents import IncidentTracker
from monitor.model import ManualClock, Sample
from tests.cli import run_monitor
from tests.console import TableView

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted(p for p in (ROOT / "tests" / "cases" / "incidents").iterdir() if p.is_dir())


class StationWithIncidents(TableView):
    """The console's test station at `now`, with the incident tracker the daemon offers
    over the state `config` names (a golden case replayed); the caller closes
    `incidents`."""

    def __init__(self, tmp_path: Path, config: Path, now: float) -> None:
        super().__init__(tmp_path / "journal.sqlite", ManualClock(now))
        self.incidents = IncidentTracker(load(config))


@contextmanager
def golden_station(tmp_path: Path, now: float) -> Iterator[tuple[StationWithIncidents, Any, Any]]:
    """The console's station at `now` over the slug-and-oil golden case replayed: (view, the
    slug incident, the oil incident, as `incidents_json` gives them); the tracker closed after."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    view = StationWithIncidents(tmp_path, cfg, now)
    try:
        yield view, slug, oil
    finally:
        view.incidents.close()


def case_config(case: Path, state: Path, **extra: Any) -> Path:
    """The case's config with its own state_dir (and any extra sections) under tmp."""
    raw = yaml.safe_load((case / "config.yaml").read_text(encoding="utf-8"))
    raw["state_dir"] = str(state)
    raw.setdefault("console", {"enabled": False})
    raw.update(extra)
    path = state.parent / f"{state.name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def read_samples(case: Path) -> list[Sample]:
    with (case / "input.csv").open(encoding="utf-8") as fh:
        return [Sample(r["sensor"], float(r["time"]), float(r["value"])) for r in csv.DictReader(fh)]


def expected(case: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads((case / "expected.json").read_text(encoding="utf-8"))
    return out


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return run_monitor(*args, cwd=ROOT)


def replay_case(name: str, tmp_path: Path) -> Path:
    """Replay the incident golden case `name` into a fresh state under `tmp_path`; its config."""
    case = next(c for c in CASES if c.name == name)
    cfg = case_config(case, tmp_path / "state")
    events = tmp_path / "e.jsonl"
    result = monitor(
        "replay", "--config", str(cfg), "--input", str(case / "input.csv"), "--events", str(events)
    )
    assert result.returncode == 0, result.stderr
    return cfg


def incidents_json(config: Path) -> list[dict[str, Any]]:
    result = monitor("incidents", "list", "--config", str(config), "--format", "json")
    assert result.returncode == 0, result.stderr
    out: list[dict[str, Any]] = json.loads(result.stdout)
    return out


def run_live(config: Config, samples: Iterable[Sample], batch: int = 7) -> Daemon:
    """A daemon (no console, no sources started) processing the samples in batches;
    the caller closes it with `close_daemon`."""
    items = list(samples)
    daemon = Daemon(config, ManualClock(items[0].time if items else 0.0))
    feed(daemon, items, batch)
    return daemon


def feed(daemon: Daemon, items: list[Sample], batch: int = 7) -> None:
    clock = daemon.clock
    for i in range(0, len(items), batch):
        part = items[i : i + batch]
        assert isinstance(clock, ManualClock)
        clock.set(part[-1].time)
        daemon.pipeline.process(part)


def close_daemon(daemon: Daemon) -> None:
    daemon.checkpoint()
    if daemon.incidents is not None:
        daemon.incidents.close()
    daemon.meters.close()
    daemon.alarms.close()
    daemon.sink.close()


def load(path: Path) -> Config:
    return load_config(path)


def oil_station(tmp_path: Path, incidents: str = "") -> Config:
    """One oil concentration sensor judged by its limit only (no slug), its state in
    tmp_path: the station the incident tests drive by hand. `incidents` is the section's
    flow mapping body (e.g. "merge_window: 1h"), none if empty."""
    raw = tmp_path / "station.yaml"
    raw.write_text(
        f"station: {{id: ps-1}}\nstate_dir: {tmp_path / 'state'}\nconsole: {{enabled: false}}\n"
        + (f"incidents: {{{incidents}}}\n" if incidents else "")
        + "sensors:\n  - {id: oil, kind: concentration, substance: oil, slug: false, stale_after: 10m}\n",
        encoding="utf-8",
    )
    return load(raw)
