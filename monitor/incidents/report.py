"""An incident as JSON (the `incidents list --format json` contract) and as text.

Times in JSON are ISO 8601 UTC with `Z`; the `*_local` twins and the text are in
the station's zone, which is what the Superintendent's calendar runs on.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from monitor.incidents.due import dues, last_day_text, local_text, violation_days
from monitor.incidents.model import Incident, finite
from monitor.model import iso


def _t(x: float | None) -> str | None:
    return None if x is None else iso(x)


def incident_json(inc: Incident, zone: ZoneInfo, now: float) -> dict[str, object]:
    """The contract: id, sensor, rule, citation, start, alarm_time, end (null while open),
    baseline, peak_value, peak_multiple, excess_volume_gal, excess_mass_lb, coverage,
    statement_due; and more for the report. `start_local` and `end_local` are the station's
    clock (`2026-06-03 22:13 EDT`), as the console and the Superintendent read them."""
    f = inc.figures
    until = inc.end if inc.end is not None else now
    owed = dues(inc, now)
    return {
        "id": inc.id,
        "station": inc.station,
        "sensor": inc.sensor,
        "discharger": inc.discharger,
        "rule": inc.rule,
        "method": inc.method,
        "citation": inc.citation,
        "status": str(inc.status),
        "start": iso(inc.start),
        "start_local": local_text(inc.start, zone),
        "alarm_time": iso(inc.alarm_time),
        "end": _t(inc.end),
        "end_local": None if inc.end is None else local_text(inc.end, zone),
        "clear_time": _t(inc.clear_time),
        "duration_s": None if inc.end is None else finite(inc.end - inc.start, 3),
        "unit": inc.unit,
        "threshold": finite(inc.threshold),
        "factor": inc.factor,
        "baseline": finite(f.baseline),
        "peak_value": finite(f.peak_value),
        "peak_time": _t(f.peak_time),
        "peak_multiple": finite(f.peak_multiple),
        "mean_multiple": finite(f.mean_multiple),
        "excess_volume_gal": finite(f.excess_volume_gal, 3),
        "excess_volume_ft3": finite(f.excess_volume_ft3, 3),
        "excess_mass_lb": finite(f.excess_mass_lb, 4),
        "flow_sensor": inc.flow_sensor,
        "coverage": finite(f.coverage, 4),
        "samples": f.samples,
        "activations": inc.activations,
        "statement_due": iso(inc.statement_due),
        "statement_due_local": last_day_text(inc.statement_due, zone),
        "violation_days": violation_days(inc.start, until, zone),
        "due": [d.to_json(zone) for d in owed],
        "overdue": [d.what for d in owed if d.overdue],
        "evidence": {
            "frozen": inc.frozen,
            "rows": inc.evidence_rows,
            "sha256": inc.evidence_sha256,
            # a damaged evidence block: from when and why the evidence is not whole (else null)
            "incomplete": inc.evidence_note,
        },
        "closed_at": _t(inc.closed_at),
        "closed_by": inc.closed_by,
        "close_reason": inc.close_reason,
        # each note's time (and a notice's time limit) on the station's clock too, as the
        # console shows them beside the start
        "notes": [
            {
                **n.to_json(),
                "time_local": local_text(n.time, zone),
                "due_local": None if n.due is None else local_text(n.due, zone),
            }
            for n in inc.notes
        ],
    }


def _num(x: float | None, unit: str = "", digits: int = 4) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}g}{' ' + unit if unit else ''}"


def duration_text(seconds: float) -> str:
    m = round(seconds / 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    parts = [f"{d} d"] if d else []
    if h or d:
        parts.append(f"{h} h")
    parts.append(f"{m} min")
    return " ".join(parts)


def summary_line(inc: Incident, zone: ZoneInfo, now: float) -> str:
    """`monitor incidents list`: one line an incident, what is overdue and a mark for a
    damaged evidence block at its end (the list is where an incident is picked to report on)."""
    owed = [d.what for d in dues(inc, now) if d.overdue]
    flag = f"  OVERDUE: {'; '.join(owed)}" if owed else ""
    if inc.evidence_broken is not None:  # the reason, a long error, is in `show`
        since = "?" if inc.evidence_broken_at is None else iso(inc.evidence_broken_at)
        flag += f"  EVIDENCE INCOMPLETE from {since}"
    peak = _num(inc.figures.peak_value, inc.unit)
    return (
        f"{inc.id}  {inc.status:6}  {inc.sensor}/{inc.rule}  start {local_text(inc.start, zone)}"
        f"  peak {peak}  [{inc.citation}]{flag}"
    )


def detail_lines(inc: Incident, zone: ZoneInfo, now: float) -> list[str]:
    """`monitor incidents show`: the record as a Superintendent reads it."""
    f = inc.figures
    until = inc.end if inc.end is not None else now
    lines = [
        f"Incident {inc.id}  ({inc.status})",
        f"  station      {inc.station}",
        f"  sensor       {inc.sensor}" + (f"  (discharger: {inc.discharger})" if inc.discharger else ""),
        f"  rule         {inc.rule}, {inc.method}  [{inc.citation}]",
        f"  start        {local_text(inc.start, zone)}  (first sample beyond the threshold)",
        f"  alarm        {local_text(inc.alarm_time, zone)}",
        "  end          "
        + (local_text(inc.end, zone) if inc.end is not None else "(still going on)")
        + (
            f"  (alarm cleared {local_text(inc.clear_time, zone)})"
            if inc.clear_time is not None and inc.end is not None and inc.clear_time != inc.end
            else ""
        ),
        f"  duration     {duration_text(until - inc.start)}",
        f"  threshold    {_num(inc.threshold, inc.unit)}"
        + (f"  ({inc.factor:g} x baseline)" if inc.factor else ""),
        f"  baseline     {_num(f.baseline, inc.unit)}",
        f"  peak         {_num(f.peak_value, inc.unit)}"
        + (f" at {local_text(f.peak_time, zone)}" if f.peak_time is not None else "")
        + (f", {f.peak_multiple:.2f} x baseline" if f.peak_multiple is not None else ""),
        "  mean         " + ("-" if f.mean_multiple is None else f"{f.mean_multiple:.2f} x baseline"),
    ]
    if f.excess_volume_gal is not None:
        lines.append(
            f"  excess vol.  {f.excess_volume_gal:,.0f} gal"
            f" ({_num(f.excess_volume_ft3, 'ft3', 6)}) over the baseline"
        )
    if f.excess_mass_lb is not None:
        lines.append(f"  excess mass  {f.excess_mass_lb:,.2f} lb (with flow from {inc.flow_sensor})")
    cov = "-" if f.coverage is None else f"{f.coverage:.1%}"
    lines += [
        f"  coverage     {cov} of the expected samples ({f.samples} present)",
        f"  §139-21 days {violation_days(inc.start, until, zone)} (each day a separate offense)",
        f"  statement    due by the end of {last_day_text(inc.statement_due, zone)} (§139-15, 15 days)",
    ]
    for d in dues(inc, now):
        lines.append(
            f"  due          {d.what}: {local_text(d.due, zone)}" + ("  OVERDUE" if d.overdue else "")
        )
    ev = "frozen" if inc.frozen else "collecting"
    lines.append(
        f"  evidence     {inc.evidence_rows} samples, {ev}"
        + (f", sha256 {inc.evidence_sha256}" if inc.evidence_sha256 else "")
    )
    if inc.evidence_note is not None:  # figures: the last ones computed from whole evidence
        lines.append(f"  EVIDENCE     {inc.evidence_note} (figures as of before it)")
    for n in inc.notes:
        # a notice's time limit, also once nothing is owed on it (corrected in time)
        limit = "" if n.due is None else f" (time limit {local_text(n.due, zone)})"
        lines.append(f"  {n.kind:12} {local_text(n.time, zone)} by {n.by}{limit}: {n.text}")
    if inc.closed_at is not None:
        lines.append(
            f"  closed       {local_text(inc.closed_at, zone)} by {inc.closed_by}: {inc.close_reason}"
        )
    return lines
