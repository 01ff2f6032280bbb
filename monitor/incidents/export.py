"""`monitor incidents export`: a self-contained report a Superintendent can file.

Writes four files into a directory:

- `<id>.html`: the report, one file with an inline SVG plot of the readings against
  the threshold (factor x baseline for a slug, the limit otherwise), the incident
  shaded; no scripts, fonts, stylesheets or images from anywhere, and a print style
  so it goes on paper as it looks on screen;
- `<id>-evidence.csv`: the frozen samples (time UTC, sensor, value, quality);
- `<id>.json`: the incident as `monitor incidents show --format json` prints it;
- `manifest.json`: SHA-256 of each of those files, and the evidence hash recorded
  when the incident was frozen.

What the package holds when the evidence is not whole, or the store's copy of it is damaged,
is `package.py`'s: a marked incident's readings up to the damage (the manifest's
`evidence_incomplete`, the report and stderr say so; exit 3), a frozen incident's verified
evidence file whatever became of the store's blocks since (`evidence_store_damaged`; exit 0:
the package is whole). A Superintendent preparing a notice of violation needs what is
intact; nobody may take it for the whole.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt

from monitor.incidents.figures import Series
from monitor.incidents.model import Incident
from monitor.incidents.package import FileNotVerified, Incomplete, StoreDamaged, contents
from monitor.incidents.report import detail_lines, incident_json
from monitor.incidents.store import IncidentStore
from monitor.model import iso

W, H = 920, 340


LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 40
MAX_POINTS = 1800  # min/max per column keeps a peak visible when a day is drawn in 900 px


def _downsample(
    t: npt.NDArray[np.float64], v: npt.NDArray[np.float64], cols: int
) -> list[tuple[float, float]]:
    if t.size <= MAX_POINTS:
        return list(zip(t.tolist(), v.tolist(), strict=True))
    edges = np.linspace(t[0], t[-1], cols + 1)
    idx = np.clip(np.searchsorted(edges, t, "right") - 1, 0, cols - 1)
    out: list[tuple[float, float]] = []
    bounds = np.flatnonzero(np.diff(idx)) + 1
    for a, b in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [t.size])), strict=True):
        seg_t, seg_v = t[a:b], v[a:b]
        i, j = int(np.argmin(seg_v)), int(np.argmax(seg_v))
        for k in sorted({i, j}):
            out.append((float(seg_t[k]), float(seg_v[k])))
    return out


def plot_svg(inc: Incident, s: Series, zone: ZoneInfo, now: float) -> str:
    """Readings, threshold and baseline over the evidence period, the incident shaded."""
    end = inc.end if inc.end is not None else (float(s.t[-1]) if s.t.size else now)
    t0 = float(s.t[0]) if s.t.size else inc.start - 3600
    t1 = float(s.t[-1]) if s.t.size else end + 3600
    t1 = max(t1, end, t0 + 60)
    top = float(max([inc.threshold, *(s.v.tolist() or [0.0])]))
    values: list[float] = s.v.tolist() or [0.0]
    bottom = float(min(values) if inc.rule == "low" else min(0.0, *values))
    top = top + 0.08 * (top - bottom or 1.0)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return TOP + (top - v) / (top - bottom or 1.0) * ph

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img"'
        f' aria-label="readings of {html.escape(inc.sensor)} against the threshold">',
        f'<rect id="incident-period" x="{x(inc.start):.1f}" y="{TOP}"'
        f' width="{max(1.0, x(end) - x(inc.start)):.1f}"'
        f' height="{ph}" fill="#f4b6b6" fill-opacity="0.55"/>',
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444" stroke-width="1"/>',
    ]
    for k in range(5):
        v = bottom + (top - bottom) * k / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}"'
            ' stroke="#ddd" stroke-width="0.5"/>'
            f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="11">{v:.4g}</text>'
        )
    for k in range(7):
        t = t0 + (t1 - t0) * k / 6
        label = datetime.fromtimestamp(t, tz=zone).strftime("%m-%d %H:%M")
        anchor = "start" if k == 0 else "end" if k == 6 else "middle"
        parts.append(
            f'<text x="{x(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="{anchor}" font-size="11">{label}</text>'
        )
    if inc.figures.baseline is not None and math.isfinite(inc.figures.baseline):
        yb = y(inc.figures.baseline)
        parts.append(
            f'<line id="baseline" x1="{LEFT}" x2="{LEFT + pw}" y1="{yb:.1f}" y2="{yb:.1f}" stroke="#777"'
            f' stroke-dasharray="2 3" stroke-width="1"/>'
        )
    yt = y(inc.threshold)
    parts.append(
        f'<line id="threshold" x1="{LEFT}" x2="{LEFT + pw}" y1="{yt:.1f}" y2="{yt:.1f}" stroke="#c00"'
        f' stroke-dasharray="8 4" stroke-width="1.5"/>'
    )
    points = _downsample(s.t, s.v, pw)
    if points:
        text = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(
            f'<polyline id="readings" points="{text}" fill="none" stroke="#1f4e9e" stroke-width="1.2"/>'
        )
    unit = html.escape(inc.unit)
    parts.append(
        f'<text x="{LEFT}" y="{H - 6}" font-size="11">time ({html.escape(str(zone))}); readings in {unit};'
        f" red dashed: threshold; grey dotted: baseline; shaded: the incident</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


CSS = """
body { font-family: serif; margin: 2em auto; max-width: 62em; color: #000; background: #fff; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.4em; }
table { border-collapse: collapse; }
td, th { padding: 0.15em 0.8em 0.15em 0; text-align: left; vertical-align: top; }
th { font-weight: normal; color: #333; } pre { white-space: pre-wrap; font-size: 0.85em; }
.overdue { font-weight: bold; } .small { font-size: 0.85em; color: #333; }
@media print {
  body { margin: 0; max-width: none; } @page { size: auto; margin: 15mm; } svg { break-inside: avoid; }
}
"""


def render_html(
    inc: Incident,
    s: Series,
    zone: ZoneInfo,
    now: float,
    csv_sha: str,
    incomplete: Incomplete | None = None,
    store_damaged: StoreDamaged | None = None,
    file_not_verified: FileNotVerified | None = None,
) -> str:
    """The report; with `incomplete`, `store_damaged` or `file_not_verified`, said at its top
    and under Evidence (else unchanged)."""
    data = incident_json(inc, zone, now)
    recorded = " (as recorded when the incident was frozen)" if inc.evidence_sha256 == csv_sha else ""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape('-' if v is None else str(v))}</td></tr>"
        for k, v in data.items()
        if not isinstance(v, (list, dict))
    )
    text = html.escape("\n".join(detail_lines(inc, zone, now)))
    overdue = "".join(f'<p class="overdue">Overdue: {html.escape(w)}</p>' for w in data["overdue"])  # type: ignore[attr-defined]
    evidence = f"""{inc.evidence_rows} samples from 24 h before the start to 1 h after the end, with
their quality"""
    if incomplete is not None:
        statement = html.escape(incomplete.statement)
        banner = f'<p class="overdue" id="evidence-incomplete">Not the whole evidence: {statement}.</p>'
        overdue = f"{banner}\n{overdue}"
        evidence = f"""The samples from 24 h before the start up to {html.escape(iso(incomplete.since))}
only ({statement}), with their quality"""
    if store_damaged is not None:
        statement = html.escape(store_damaged.statement)
        banner = f'<p class="overdue" id="evidence-store-damaged">Note: {statement}.</p>'
        overdue = f"{banner}\n{overdue}"
        evidence = f"""{evidence}, from the evidence file written when the incident was frozen
({statement})"""
    if file_not_verified is not None:
        statement = html.escape(file_not_verified.statement)
        banner = f'<p class="overdue" id="evidence-file-not-verified">Note: {statement}.</p>'
        overdue = f"{banner}\n{overdue}"
        evidence = f"""{evidence}, from the incident store ({statement})"""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Incident {html.escape(inc.id)}</title>
<style>{CSS}</style></head>
<body>
<h1>Incident report {html.escape(inc.id)}</h1>
<p class="small">Station {html.escape(inc.station)}; {html.escape(inc.sensor)} {html.escape(inc.rule)}
[{html.escape(inc.citation)}]; generated {html.escape(iso(now))}; times below in {html.escape(str(zone))}.</p>
{overdue}
<h2>Summary</h2>
<pre>{text}</pre>
<h2>Readings</h2>
{plot_svg(inc, s, zone, now)}
<h2>Record</h2>
<table>{rows}</table>
<h2>Evidence</h2>
<p class="small">{evidence} (0 good, 1 bad data, 2 communication failure), in the CSV beside this report; its
SHA-256 is {html.escape(csv_sha)}{recorded}.</p>
</body></html>
"""


@dataclass(frozen=True, slots=True)
class Package:
    """What `export` wrote: {file name: SHA-256}, and what its evidence lacks or what became
    of the store's copy (`package.Contents`), each None when nothing."""

    hashes: dict[str, str]
    incomplete: Incomplete | None
    store_damaged: StoreDamaged | None
    file_not_verified: FileNotVerified | None = None


def export(store: IncidentStore, inc: Incident, out: Path, zone: ZoneInfo, now: float) -> Package:
    """Write the report files into `out`. Nothing is written when the evidence cannot be
    read (`package.contents` raises)."""
    got = contents(store, inc)
    csv = got.csv
    csv_sha = hashlib.sha256(csv).hexdigest()
    out.mkdir(parents=True, exist_ok=True)
    report = render_html(
        inc, got.series, zone, now, csv_sha, got.incomplete, got.store_damaged, got.file_not_verified
    )
    files = {
        f"{inc.id}.html": report.encode("utf-8"),
        f"{inc.id}-evidence.csv": csv,
        f"{inc.id}.json": (
            json.dumps(incident_json(inc, zone, now), indent=2, ensure_ascii=False) + "\n"
        ).encode(),
    }
    hashes = {}
    for name, data in files.items():
        (out / name).write_bytes(data)
        hashes[name] = hashlib.sha256(data).hexdigest()
    manifest: dict[str, object] = {"incident": inc.id, "generated": iso(now)}
    if got.incomplete is not None:
        manifest["evidence_incomplete"] = got.incomplete.to_json()
    if got.store_damaged is not None:
        manifest["evidence_store_damaged"] = got.store_damaged.to_json()
    if got.file_not_verified is not None:
        manifest["evidence_file_not_verified"] = got.file_not_verified.to_json()
    manifest["evidence_sha256_recorded"] = inc.evidence_sha256
    manifest["files"] = [{"name": k, "sha256": h, "bytes": len(files[k])} for k, h in hashes.items()]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return Package(hashes, got.incomplete, got.store_damaged, got.file_not_verified)
