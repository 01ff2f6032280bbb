"""The `incidents:` section: how incident records are kept (issue 16).

Incidents are on by default: every slug or limit alarm opens one. The figures here
are the ordinance's (§139-15: a written statement "within 15 days of the date of
occurrence") and the evidence window the Superintendent asked for (24 h before the
start to 1 h after the end).
"""

from typing import Any

from pydantic import Field

from monitor.config.types import Duration, Section
from monitor.model import Kind


class Incidents(Section):
    """Incident records for the Superintendent."""

    enabled: bool = True
    merge_window: Duration = Field(
        3600.0, ge=0, description="a re-activation within this time after the end extends the incident"
    )
    statement_days: int = Field(15, ge=1, le=365, description="§139-15: written statement within N days")
    evidence_before: Duration = Field(86400.0, ge=0, le=7 * 86400)
    evidence_after: Duration = Field(3600.0, ge=0, le=7 * 86400)


def check_pairings(raw_sensors: list[tuple[int, dict[str, Any], Kind | None]]) -> list[str]:
    """`flow_sensor:` must name a flow sensor and sit on a concentration sensor."""
    kinds = {s.get("id"): k for _, s, k in raw_sensors}
    problems: list[str] = []
    for i, sensor, kind in raw_sensors:
        ref = sensor.get("flow_sensor")
        if ref is None:
            continue
        if kind is not Kind.CONCENTRATION:
            problems.append(f"sensors[{i}].flow_sensor: only a concentration sensor can name a flow sensor")
        elif ref not in kinds:
            problems.append(f"sensors[{i}].flow_sensor: unknown sensor {ref!r}")
        elif kinds[ref] is not Kind.FLOW:
            problems.append(f"sensors[{i}].flow_sensor: {ref!r} is not a flow sensor")
    return problems
