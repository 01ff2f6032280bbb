"""/metrics as Prometheus reads it, pinned whole: every series the collector writes, in
order, from a health snapshot with every figure set (and one with none), so a change to
how the collector is built shows here as a diff of the text a scraper gets."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from monitor.model import ManualClock, Sample
from monitor.web.service import StationCollector
from tests.console import T0, TableView

CASES = Path(__file__).resolve().parent / "cases" / "metrics"

# Every figure different, so a series reading the wrong key shows.
FULL: dict[str, object] = {
    "samples_by_source": {"modbus": 1201, "mqtt": 302},
    "sources": [
        {
            "source": "modbus", "name": "outfall-plc", "connected": True,
            "requests": 4000, "errors": 3, "malformed": 2, "latency_ms": 12.5,
        },
        {"source": "modbus", "name": "lift-plc", "connected": False, "requests": 40, "errors": 40},
        {"source": "mqtt", "name": "field", "connected": True, "received": 302, "bad_payloads": 4,
         "stamped_ahead": 3},
    ],
    "outbox": {
        "configured": True, "pending": 17, "pending_bytes": 1870, "written": 9000,
        "dropped": 5, "dead_letters": 6, "oldest_queued": T0 - 90.0,
    },
    "engine": {"bad_values": 7, "slug_not_judged": ["outfall.flow", "lift.flow"]},
    "pipeline": {"stalled": True, "waiting": 8, "dropped": 9, "unjournaled": 10, "restamped": 11},
    "alarm_listener_failures": {"mqtt": 12, "notify": 13},
    "alarm_early_clears": 14,
    "meters": {
        "clock_step_failures": 15, "clock_steps_pending": 16, "unsent_unconfigured": 20, "held_back": 21,
    },
    "incidents": {"failing": True, "failures": 18, "evidence_incomplete": 19},
    "clock": {
        "steps": 21, "episode_steps": 22, "episode_largest": -3.0, "heartbeat_ahead": 2_592_000.5,
        "steady_left": 604_799.25, "meter_rows_ahead": 57, "meters_ahead": 2,
    },
}  # fmt: skip


class SnapshotView(TableView):
    """The console's test station (real AlarmManager and journal) with a fixed health snapshot."""

    def __init__(self, journal: Path, snapshot: Mapping[str, object]) -> None:
        super().__init__(journal, ManualClock(T0))
        self.snapshot = snapshot

    def health(self) -> Mapping[str, object]:
        return self.snapshot


def scrape(view: SnapshotView) -> str:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StationCollector(view))  # type: ignore[arg-type]  # a StationView, no config
    return generate_latest(registry).decode()


@pytest.mark.parametrize("case", ["full", "bare"])
def test_metrics_text_is_pinned_series_by_series(tmp_path: Path, case: str) -> None:
    view = SnapshotView(tmp_path / "journal.jsonl", FULL if case == "full" else {})
    if case == "full":
        view.inject(Sample("outfall.ph", T0, 9.8), limit=9.5, citation="§139-15 C(3)")  # one active alarm
    assert scrape(view) == (CASES / f"{case}.txt").read_text(encoding="utf-8")
