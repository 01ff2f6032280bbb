"""The console's Incidents panel over a real incident store and tracker (the golden case
`slug-and-oil` replayed): the API gives what the panel shows."""

from __future__ import annotations

from pathlib import Path

from tests.incident_helpers import incidents_json, replay_case


def test_incident_api_gives_start_and_end_in_station_local_time(tmp_path: Path) -> None:
    """`start_local` and `end_local` (null while open) beside the UTC times, as `due_local`
    is: the console shows the station's clock, not UTC. Before: only `start` in UTC."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    assert (slug["start_local"], slug["end_local"]) == ("2026-06-03 22:13 EDT", "2026-06-04 01:29 EDT")
    assert (oil["start_local"], oil["end_local"]) == ("2026-06-04 02:06 EDT", "2026-06-04 03:15 EDT")
