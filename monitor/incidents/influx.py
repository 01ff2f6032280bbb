"""Incidents in InfluxDB: measurement `incident`, one point per incident at its start.

The point is rewritten (same time, same tags) as the figures change, so the
measurement holds each incident's latest figures, not a history of updates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from monitor.incidents.model import Incident
from monitor.sinks.lineproto import line


def incident_line(inc: Incident) -> str:
    f = inc.figures
    fields: dict[str, float | int | bool] = {
        "open": int(inc.end is None),
        "alarm_time": inc.alarm_time,
        "threshold": inc.threshold,
        "activations": inc.activations,
    }
    for name, value in (
        ("end", inc.end),
        ("duration_s", None if inc.end is None else inc.end - inc.start),
        ("baseline", f.baseline),
        ("peak_value", f.peak_value),
        ("peak_multiple", f.peak_multiple),
        ("mean_multiple", f.mean_multiple),
        ("excess_volume_gal", f.excess_volume_gal),
        ("excess_volume_ft3", f.excess_volume_ft3),
        ("excess_mass_lb", f.excess_mass_lb),
        ("coverage", f.coverage),
        ("statement_due", inc.statement_due),
    ):
        if value is not None and math.isfinite(value):
            fields[name] = float(value)
    tags = {
        "station": inc.station,
        "sensor": inc.sensor,
        "rule": inc.rule,
        "citation": inc.citation,
        "incident": inc.id,
        "discharger": inc.discharger or "",
    }
    return line("incident", tags, fields, inc.start)


def incident_lines(incidents: Sequence[Incident]) -> list[str]:
    return [incident_line(i) for i in incidents]
