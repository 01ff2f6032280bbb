"""Alarm-system performance figures (ISA-18.2 / EEMUA 191) from the journal.

Counts *annunciated* alarms: activations that reached an operator, i.e. not
those raised while shelved, suppressed or out of service. The journal records
those too, and they still count for excursion time, which is about the
discharge, not the operator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from monitor.alarms.journal import Entry
from monitor.model import AlarmState, Rule, iso

DAY = 86400.0
TEN_MIN = 600.0
STANDING = DAY  # ISA-18.2 "stale alarm": active for more than 24 h

# Benchmarks operators and inspectors quote (ISA-18.2 table 5 / EEMUA 191).
TARGETS = {
    "per_day_acceptable": 150,
    "per_day_max_manageable": 300,
    "per_10min_acceptable": 1,
    "per_10min_max_manageable": 2,
    "flood_percent_max": 1.0,
}


@dataclass
class Report:
    since: float
    until: float
    total: int = 0
    per_day_avg: float = 0.0
    per_day_peak: int = 0
    per_10min_avg: float = 0.0
    per_10min_peak: int = 0
    flood_windows: int = 0
    windows: int = 0
    flood_percent: float = 0.0
    top: list[tuple[str, str, int, str]] = field(default_factory=list)  # sensor, rule, count, citation
    chattering: list[tuple[str, str, int]] = field(default_factory=list)  # sensor, rule, episodes
    standing: list[tuple[str, str, float, bool]] = field(default_factory=list)  # sensor, rule, hours, still
    ph_excursion: dict[str, dict[str, float]] = field(default_factory=dict)  # month -> sensor -> minutes
    shelved: int = 0
    acknowledged: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "since": iso(self.since),
            "until": iso(self.until),
            "alarms": self.total,
            "per_day": {"average": round(self.per_day_avg, 2), "peak": self.per_day_peak},
            "per_10min": {"average": round(self.per_10min_avg, 3), "peak": self.per_10min_peak},
            "flood": {
                "windows": self.flood_windows,
                "of": self.windows,
                "percent": round(self.flood_percent, 2),
            },
            "top10": [{"sensor": s, "rule": r, "count": n, "citation": c} for s, r, n, c in self.top],
            "chattering": [{"sensor": s, "rule": r, "episodes": n} for s, r, n in self.chattering],
            "stale": [
                {"sensor": s, "rule": r, "hours": round(h, 1), "still_active": still}
                for s, r, h, still in self.standing
            ],
            "ph_excursion_minutes": {
                m: {s: round(v, 1) for s, v in by.items()} for m, by in self.ph_excursion.items()
            },
            "shelve_actions": self.shelved,
            "acknowledgements": self.acknowledged,
            "targets": TARGETS,
        }


def build_report(
    entries: Iterable[Entry], since: float, until: float, ph_sensors: set[str], flood_count: int = 10
) -> Report:
    """Figures for [since, until); `entries` is the whole journal in order (for open intervals)."""
    rep = Report(since, until)
    days = max(1, int(-(-(until - since) // DAY)))
    windows = max(1, int(-(-(until - since) // TEN_MIN)))
    per_day = [0] * days
    per_win = [0] * windows
    counts: Counter[tuple[str, str]] = Counter()
    citations: dict[tuple[str, str], str] = {}
    chatter: Counter[tuple[str, str]] = Counter()
    open_since: dict[tuple[str, str], float] = {}
    standing: dict[tuple[str, str], tuple[float, bool]] = {}
    ph_open: dict[tuple[str, str], float] = {}
    for e in entries:
        key = (e.sensor, str(e.rule))
        if e.time >= until:
            continue  # ids, not times, order the journal: do not stop at the first late row
        is_ph = e.sensor in ph_sensors and e.rule in (Rule.HIGH, Rule.LOW)
        if e.event == "activated":
            open_since.setdefault(key, e.time)
            if is_ph:
                ph_open.setdefault(key, e.time)
        elif e.event == "cleared":
            start = open_since.pop(key, None)
            if start is not None and e.time - start > STANDING and e.time > since:
                _longest(standing, key, (e.time - start) / 3600, still=False)
            begun = ph_open.pop(key, None)
            if begun is not None:
                _add_excursion(rep.ph_excursion, e.sensor, max(begun, since), e.time)
        if e.time < since:
            continue
        if e.event == "activated" and e.state == AlarmState.UNACK.value:
            rep.total += 1
            per_day[min(days - 1, int((e.time - since) // DAY))] += 1
            per_win[min(windows - 1, int((e.time - since) // TEN_MIN))] += 1
            counts[key] += 1
            citations[key] = e.citation
        elif e.event == "chattering":
            chatter[key] += 1
        elif e.event == "shelved":
            rep.shelved += 1
        elif e.event == "acknowledged":
            rep.acknowledged += 1
    for key, start in open_since.items():
        if until - start > STANDING:
            _longest(standing, key, (until - start) / 3600, still=True)
    for (sensor, _), begun in ph_open.items():
        _add_excursion(rep.ph_excursion, sensor, max(begun, since), until)
    rep.per_day_avg = rep.total / ((until - since) / DAY) if until > since else 0.0
    rep.per_day_peak = max(per_day)
    rep.windows = windows
    rep.per_10min_avg = rep.total / windows
    rep.per_10min_peak = max(per_win)
    rep.flood_windows = sum(1 for n in per_win if n > flood_count)
    rep.flood_percent = 100.0 * rep.flood_windows / windows
    rep.top = [(s, r, n, citations[(s, r)]) for (s, r), n in counts.most_common(10)]
    rep.chattering = [(s, r, n) for (s, r), n in chatter.most_common()]
    rep.standing = sorted(((s, r, h, still) for (s, r), (h, still) in standing.items()), key=lambda x: -x[2])
    rep.ph_excursion = dict(sorted(rep.ph_excursion.items()))
    return rep


def _longest(
    found: dict[tuple[str, str], tuple[float, bool]], key: tuple[str, str], hours: float, still: bool
) -> None:
    if key not in found or found[key][0] < hours:
        found[key] = (hours, still)


def _add_excursion(out: dict[str, dict[str, float]], sensor: str, start: float, end: float) -> None:
    """Split [start, end) at calendar-month boundaries (UTC) and add minutes to each month."""
    while start < end:
        dt = datetime.fromtimestamp(start, tz=UTC)
        nxt = datetime(dt.year + (dt.month == 12), dt.month % 12 + 1, 1, tzinfo=UTC).timestamp()
        stop = min(end, nxt)
        month = f"{dt.year:04d}-{dt.month:02d}"
        by = out.setdefault(month, {})
        by[sensor] = by.get(sensor, 0.0) + (stop - start) / 60
        start = stop


def render(rep: Report) -> str:
    """The report as an operator reads it in a terminal."""
    t = TARGETS
    lines = [
        f"alarm report {iso(rep.since)} .. {iso(rep.until)}",
        f"  annunciated alarms     {rep.total}",
        f"  per day                average {rep.per_day_avg:.1f}, peak {rep.per_day_peak}"
        f"   (ISA-18.2: ~{t['per_day_acceptable']} acceptable, {t['per_day_max_manageable']} max)",
        f"  per 10 minutes         average {rep.per_10min_avg:.2f}, peak {rep.per_10min_peak}"
        f"   (~{t['per_10min_acceptable']} acceptable, {t['per_10min_max_manageable']} max)",
        f"  10-min windows in flood {rep.flood_percent:.2f} % ({rep.flood_windows} of {rep.windows};"
        f" EEMUA 191: < {t['flood_percent_max']:g} %)",
        f"  acknowledgements {rep.acknowledged}, shelve actions {rep.shelved}",
        "top 10 most frequent alarms:",
    ]
    if not rep.top:
        lines.append("  none")
    for sensor, rule, n, citation in rep.top:
        share = 100.0 * n / rep.total if rep.total else 0.0
        lines.append(f"  {n:6d}  {share:5.1f} %  {sensor}/{rule}  [{citation}]")
    lines.append("chattering alarms:")
    lines.extend([f"  {s}/{r}: flagged {n} time(s)" for s, r, n in rep.chattering] or ["  none"])
    lines.append("stale alarms (active > 24 h):")
    lines.extend(
        [f"  {s}/{r}: {h:.1f} h{' (still active)' if still else ''}" for s, r, h, still in rep.standing]
        or ["  none"]
    )
    lines.append("pH excursion time per calendar month (UTC):")
    if not rep.ph_excursion:
        lines.append("  none")
    for month, by in rep.ph_excursion.items():
        for sensor, minutes in by.items():
            lines.append(f"  {month}  {sensor}: {_hm(minutes)}")
    return "\n".join(lines)


def _hm(minutes: float) -> str:
    h, m = divmod(round(minutes), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"
