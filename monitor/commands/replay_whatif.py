"""`monitor replay --what-if CANDIDATE.yaml`: two configs over the same history, one pass.

Alarm rationalization (ISA-18.2 management of change): before a limit, deadband or
delay change is deployed, see what it would have done over the last quarter. The
samples are read once; each batch goes through an engine (and, on a pumping station,
a station tracker) built from the current config and one built from the candidate.
The samples are in the current config's units; the candidate's side gets them
converted where it reads a sensor in another unit. Per sensor and rule, each side's alarms
become episodes (active until cleared; one still active at the end lasts to the
last sample) and are summed:

- count: activations; total and longest time in alarm;
- chattering episodes: how often the alarm became chattering as the console would
  flag it, by that side's own `alarms.chatter_count` and `alarms.chatter_window`
  (more than 5 activations in 10 minutes by default): the count of activations in
  the trailing window rises past the limit (one episode), until it falls back;
- only-current / only-candidate: an episode of one side that no episode of the
  other side overlaps in time, with its times in the station's local zone.

An alarm both raise, only earlier or later, counts as shared (its times differ in
the totals); an alarm the candidate no longer raises at all is listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.engine import Engine
from monitor.engine.baseline import Floats
from monitor.errors import InputUsageError, SourceError
from monitor.model import Condition, ConditionState, ManualClock, Rule
from monitor.reconcile import device_stamped
from monitor.sources.replay import ReadReport, Samples
from monitor.station.derive import Derivation, derive_arrays
from monitor.station.replay import judge_steps
from monitor.station.tracker import StationTracker
from monitor.units import conversion

# What `monitor replay` writes as events (its EVENT_RULES; a test keeps the two the same),
# pump and wet-well alarms included, but the bad-value diagnostic (a data-quality note,
# not an alarm an operator acts on).
EVENT_RULES = frozenset(
    {
        Rule.SLUG,
        Rule.HIGH,
        Rule.LOW,
        Rule.STALE,
        Rule.FROZEN,
        *(Rule.HIGH_LEVEL, Rule.OVERFLOW, Rule.FAIL_TO_START, Rule.PUMP_STARTS, Rule.LONG_RUN),
    }
)


@dataclass(frozen=True, slots=True)
class Episode:
    start: float
    end: float
    open: bool  # still active when the samples ran out


@dataclass
class Side:
    """One config's alarms: transitions in, episodes per (sensor, rule) out."""

    chatter_count: int = 5
    chatter_window: float = 600.0
    active: dict[tuple[str, str], float] = field(default_factory=dict)
    episodes: dict[tuple[str, str], list[Episode]] = field(default_factory=lambda: defaultdict(list))

    def add(self, conditions: Sequence[Condition]) -> None:
        for c in conditions:
            if c.rule not in EVENT_RULES:
                continue
            key = (c.sensor, str(c.rule))
            if c.state is ConditionState.ACTIVE:
                self.active.setdefault(key, c.time)
            elif key in self.active:
                self.episodes[key].append(Episode(self.active.pop(key), c.time, False))

    def close(self, last: float) -> None:
        for key, start in self.active.items():
            self.episodes[key].append(Episode(start, max(start, last), True))
        self.active.clear()


def summary(episodes: list[Episode], side: Side) -> dict[str, float | int]:
    spans = [e.end - e.start for e in episodes]
    return {
        "count": len(episodes),
        "total_s": round(float(sum(spans)), 3),  # 0.0, not 0, with no alarm: one type for tools
        "longest_s": round(max(spans, default=0.0), 3),
        "chattering": chattering([e.start for e in episodes], side.chatter_count, side.chatter_window),
    }


def chattering(starts: list[float], count: int, window: float) -> int:
    """Times the activations within the trailing `window` rose past `count`."""
    recent: deque[float] = deque()
    episodes, flagged = 0, False
    for t in starts:
        while recent and recent[0] <= t - window:
            recent.popleft()
        recent.append(t)
        many = len(recent) > count
        if many and not flagged:
            episodes += 1
        flagged = many
    return episodes


def only(mine: list[Episode], theirs: list[Episode]) -> list[Episode]:
    """My episodes that no episode of the other side overlaps."""
    starts = np.array([e.start for e in theirs])
    ends = np.array([e.end for e in theirs])
    out = []
    for e in mine:
        if not bool(np.any((starts <= e.end) & (ends >= e.start))):
            out.append(e)
    return out


def compare(current: Side, candidate: Side, zone: tzinfo | None = None) -> list[dict[str, object]]:
    """One row per sensor and rule that either side alarmed on."""
    rows: list[dict[str, object]] = []
    for key in sorted(set(current.episodes) | set(candidate.episodes)):
        a, b = current.episodes.get(key, []), candidate.episodes.get(key, [])
        rows.append(
            {
                "sensor": key[0],
                "rule": key[1],
                "current": summary(a, current),
                "candidate": summary(b, candidate),
                "only_current": [_span(e, zone) for e in only(a, b)],
                "only_candidate": [_span(e, zone) for e in only(b, a)],
            }
        )
    return rows


def _span(e: Episode, zone: tzinfo | None) -> dict[str, object]:
    def when(t: float) -> str:
        return datetime.fromtimestamp(t, zone).isoformat(timespec="seconds")

    return {"start": when(e.start), "end": when(e.end), "still_active": e.open}


def _duration(seconds: object) -> str:
    s = round(float(seconds)) if isinstance(seconds, (int, float)) else 0
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def text(rows: list[dict[str, object]], station: str, samples: int) -> list[str]:
    out = [f"what-if for station {station}: per sensor and rule, current -> candidate ({samples} samples)"]
    if not samples:
        out.append("  no samples to judge: nothing to compare (stderr says why)")
    elif not rows:
        out.append("  neither config raised an alarm over these samples")
    for row in rows:
        a, b = row["current"], row["candidate"]
        assert isinstance(a, dict) and isinstance(b, dict)
        out.append(
            f"  {row['sensor']} {row['rule']}: {a['count']} -> {b['count']} alarm(s),"
            f" in alarm {_duration(a['total_s'])} -> {_duration(b['total_s'])},"
            f" longest {_duration(a['longest_s'])} -> {_duration(b['longest_s'])},"
            f" chattering {a['chattering']} -> {b['chattering']}"
        )
        for side in ("only_current", "only_candidate"):
            spans = row[side]
            assert isinstance(spans, list)
            for span in spans:
                tail = " (still active at the end)" if span["still_active"] else ""
                out.append(f"    only {side[5:]}: {span['start']} .. {span['end']}{tail}")
    return out


def converted_units(
    config: Config, candidate: Config, names: Sequence[str]
) -> tuple[Floats, Floats, list[str]] | None:
    """`(scale, offset, notes)` per name for the candidate's samples, or None if no unit changed.

    The history is in the current config's units; a candidate that reads a sensor in
    another unit (the transmitter re-ranged to degC) judges those readings converted,
    else 140 degF would be judged as 140 degC. A unit that does not convert (the kind
    changed) is judged as it is, and said so."""
    scale, offset = np.ones(len(names)), np.zeros(len(names))
    notes: list[str] = []
    for i, name in enumerate(names):
        was, now = config.rules.get(name), candidate.rules.get(name)
        if was is None or now is None or was.unit == now.unit:
            continue
        head = f"what-if: {name} is {was.unit} in the history, {now.unit} in the candidate:"
        try:
            scale[i], offset[i] = conversion(was.unit, now.unit)
        except ValueError:
            notes.append(f"{head} they do not convert, its readings are judged as they are")
            continue
        notes.append(f"{head} its readings are converted for the candidate")
    return (scale, offset, notes) if notes else None


def silent_sensors(
    config: Config, candidate: Config, names: Sequence[str], seen: npt.NDArray[np.int64]
) -> list[str]:
    """A line per sensor without a sample: one added or renamed in the candidate has no
    history under its id, so it raises nothing, and the old id's alarms show as the
    current config's only (derived sensors are computed, not read)."""
    out = []
    derived = {*config.derived, *candidate.derived}
    for name, n in zip(names, seen.tolist(), strict=True):
        if n or name in derived:
            continue
        mine = (name in config.rules, name in candidate.rules)
        whose = {(True, False): "the current config's only", (False, True): "the candidate's only"}
        out.append(
            f"what-if: no samples of {name} ({whose.get(mine, 'in both configs')}) in the history:"
            " it raises nothing here"
        )
    return out


Opener = Callable[[argparse.Namespace, Config, tuple[str, ...]], tuple[Iterable[Samples], list[ReadReport]]]


def run_what_if(args: argparse.Namespace, config: Config, candidate: Config, open_samples: Opener) -> int:
    """Both configs over the samples `open_samples` gives (files or the historian)."""
    names = list(config.rules) + [s for s in candidate.rules if s not in config.rules]
    engines = [Engine(config.rules, ManualClock()), Engine(candidate.rules, ManualClock())]
    maps = [
        np.array([e.sensors.index(s) if s in e.sensors else -1 for s in names], np.int32) for e in engines
    ]
    sides = [Side(c.alarms.chatter_count, c.alarms.chatter_window) for c in (config, candidate)]
    # Derived sensors (monitor/station) are computed from their inputs on each side.
    derivations = [Derivation(c.derived, c.rules) if c.derived else None for c in (config, candidate)]
    derived = [
        np.array([e.index(s) for s in c.derived], np.int64)
        for e, c in zip(engines, (config, candidate), strict=True)
    ]
    # Pump and wet-well alarms, each side by its own setpoints and pump limits; nothing stored.
    trackers = [
        StationTracker(c, device=device_stamped(c)) if c.has_station else None for c in (config, candidate)
    ]
    units = converted_units(config, candidate, names)
    for note in units[2] if units is not None else []:
        print(f"replay: {note}", file=sys.stderr)
    last = -np.inf
    samples = 0  # read for a sensor of either config
    per_sensor = np.zeros(len(names), np.int64)
    try:
        batches, reports = open_samples(args, config, tuple(names))
        for b in batches:
            values = [b.value, b.value]
            if units is not None:
                values[1] = b.value * units[0][b.sensor] + units[1][b.sensor]
            for engine, index, side, derivation, own, tracker, value in zip(
                engines, maps, sides, derivations, derived, trackers, values, strict=True
            ):
                sensor = index[b.sensor]
                known = (sensor >= 0) & ~np.isin(sensor, own)  # recorded derived values: computed again
                arrays: tuple[npt.NDArray[np.integer], Floats, Floats, npt.NDArray[np.integer]] = (
                    sensor[known],
                    b.time[known],
                    value[known],
                    b.quality[known],
                )
                if derivation is not None:
                    arrays = derive_arrays(derivation, engine.sensors, *arrays, final=False)
                for step in judge_steps(engine, tracker, *arrays):
                    side.add(step.conditions)
            if len(b):
                last = max(last, float(b.time[-1]))
                samples += len(b)
                per_sensor += np.bincount(b.sensor, minlength=len(names))
        for engine, side, derivation, tracker in zip(engines, sides, derivations, trackers, strict=True):
            if derivation is not None:  # the derived samples still pending, as replay makes them
                none = np.empty(0, np.int64), np.empty(0), np.empty(0), np.empty(0, np.int8)
                for step in judge_steps(engine, tracker, *derive_arrays(derivation, engine.sensors, *none)):
                    side.add(step.conditions)
    except InputUsageError as exc:  # as `replay.input_error` (which imports this module)
        print(f"replay: --input {exc}", file=sys.stderr)
        return 2
    except SourceError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 1
    for side in sides:
        side.close(float(last))
    for report in reports:
        for line in report.lines():
            print(f"replay: {line}", file=sys.stderr)
    if samples:
        for line in silent_sensors(config, candidate, names, per_sensor):
            print(f"replay: {line}", file=sys.stderr)
    rows = compare(sides[0], sides[1], config.station.zone)
    if args.format == "json":
        doc = {
            "station": config.station.id,
            "current": args.config,
            "candidate": args.what_if,
            "samples": samples,
            "rules": rows,
        }
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print("\n".join(text(rows, config.station.id, samples)))
    return 0
