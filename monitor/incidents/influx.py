"""Incidents in InfluxDB: measurement `incident`, one point per incident at its start.

The point is rewritten (same time, same tags) as the figures change, so the
measurement holds each incident's latest figures, not a history of updates.

`evidence_incomplete` (0 or 1, on every point) says whether the incident is marked
"evidence incomplete from T" (a damaged evidence block), `evidence_incomplete_from` T
(epoch seconds, as `alarm_time`) when it is. A rewrite keeps the fields it does not write,
so the mark is 0 or 1 on every point, never left out: a record restored whole is written
0 over the 1 (its `evidence_incomplete_from` may stay, read only with a 1).
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
        "evidence_incomplete": int(inc.evidence_broken is not None),
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
        ("evidence_incomplete_from", None if inc.evidence_broken is None else inc.evidence_broken_at),
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
