"""Open, extend, end and freeze incidents from the same stream the engine judged.

The daemon (one batch at a time) and `monitor replay` (one replay step at a time)
both hand over the batch's samples, then the conditions the batch raised, then ask
the tracker to `advance`. Everything the tracker decides depends on event times
only, so the two paths open the same incidents with the same figures.

- An ACTIVE slug/high/low condition opens an incident whose start is the first
  sample of the run that qualified (figures.run_start). A re-activation within
  `incidents.merge_window` after the end extends the last incident instead.
- A CLEARED condition ends it (end = the first sample back within).
- Evidence (24 h before the start to 1 h after the end) is copied from the recent
  buffer into the incident store as it arrives; once event time passes the end by
  both the evidence window and the merge window, the incident is final: the figures
  are computed one last time and the evidence is written to a file and hashed.
- A transition within an incident on record already (frozen, or restored from a run that
  stopped) is the same history again: it is not applied twice (`_OnRecord`).
- One incident whose evidence cannot be read or written (a damaged block: `DamagedEvidenceError`)
  is marked ("evidence incomplete from T: <reason>", logged once) and the others go on: its
  copies are undone alone (a savepoint), its figures stay the last ones computed from whole
  evidence, its later evidence goes to new blocks beside the damaged one, and once ended it
  stays unfrozen (no hash over evidence that is not all there) and stops holding memory.
  Any other store error (a full disk, a damaged file) is the whole store's and is raised.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Container, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.engine.columns import ConditionColumns
from monitor.incidents.buffer import Recent
from monitor.incidents.due import statement_due
from monitor.incidents.figures import (
    Series,
    compute,
    mean_before,
    run_ends,
    run_start,
    usual_interval,
)
from monitor.incidents.freezer import Freezer, Freezing
from monitor.incidents.model import Figures, Incident, incident_id, incomplete_since
from monitor.incidents.store import Columns, DamagedEvidenceError, IncidentStore, csv_lines
from monitor.incidents.transitions import INCIDENT_RULES, Transitions, transitions
from monitor.model import Condition, ConditionState, Kind, Rule, Sample, iso
from monitor.units import conversion

log = logging.getLogger(__name__)

REFRESH = 300.0  # event seconds between figure updates of an open incident
BASELINE_WINDOW = 86400.0  # a limit incident's baseline: the mean of the 24 h before the start
Part = tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.float64]]  # indices, t, v
FREEZE_TOGETHER = 8  # incidents whose evidence files are written at once (each file in memory)
SHORT_KEEP = 1800.0  # seconds kept in memory beyond the longest rule delay when a store has the rest


_NO_EVIDENCE: Columns = (np.empty(0, np.float64), np.empty(0, np.float64), np.empty(0, np.int8))

# One sensor's samples of a replay step: name, time, value, quality (int8).
Series_ = tuple[str, npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int8]]


def kept_series(
    kept: Container[str],
    names: tuple[str, ...],
    by_sensor: Sequence[Part | None],
    quality: npt.NDArray[np.integer],
) -> list[Series_]:
    """The engine's split of a replay step (its `by_sensor`), for the sensors in `kept`."""
    out: list[Series_] = []
    for name, part in zip(names, by_sensor, strict=True):
        if part is not None and name in kept:
            sel, t, v = part
            out.append((name, t, v, quality[sel].astype(np.int8)))
    return out


def kept_sensors(config: Config, watch: Mapping[str, Watch] | None = None) -> set[str]:
    """The sensors whose samples an incident can need: those a rule can open one on, and
    the flows paired with them (a day of every other sensor would be copied for nothing).
    `watch`: `watches(config)`, when the caller has it already."""
    watch = watches(config) if watch is None else watch
    judged = [s for s in watch if config.rules[s].slug is not None or config.rules[s].limits is not None]
    paired = {watch[s].flow_sensor for s in judged} - {None}
    return {s for s in watch if s in judged or s in paired}


@dataclass(frozen=True, slots=True)
class Watch:
    """What the tracker needs to know about one judged sensor."""

    sensor: str
    kind: Kind
    unit: str
    discharger: str | None
    flow_sensor: str | None
    factor: float | None
    slug_gap: float
    slug_method: str
    limit_unit: str | None
    limit_method: str
    stale_after: float


def watches(config: Config) -> dict[str, Watch]:
    out: dict[str, Watch] = {}
    for sensor in config.sensors:
        rules = config.rules[sensor.id]
        if rules.kind is Kind.METER:
            continue
        slug, lim = rules.slug, rules.limits
        on_delay = lim.on_delay if lim is not None else 0.0
        out[sensor.id] = Watch(
            sensor=sensor.id,
            kind=rules.kind,
            unit=rules.unit,
            discharger=sensor.discharger,
            flow_sensor=sensor.flow_sensor,
            factor=slug.factor if slug is not None else None,
            slug_gap=slug.max_sample_gap if slug is not None else rules.stale_after,
            # `method` (sustained | period_mean) arrives with the slug rule rewrite; until
            # then every slug is judged sample by sample over a sustained run.
            slug_method=str(getattr(slug, "method", "sustained")),
            limit_unit=lim.unit if lim is not None else None,
            limit_method="instantaneous" if on_delay == 0 else f"on_delay {on_delay:g}s",
            stale_after=rules.stale_after,
        )
    return out


History = Callable[[str, float, float], Sequence[Sample]]


@dataclass(slots=True)
class _Draft:
    """An incident's end, clear time and activations while one batch is applied."""

    inc: Incident
    end: float | None
    clear_time: float | None
    activations: int
    changed: bool = False


class _OnRecord:
    """One sensor and rule's incidents whose history is on record already: frozen ones,
    and ones restored from a run that stopped, as spans [start, last] in start order
    (`last`: the end or clear, whichever is later; an open one's evidence so far). A
    transition within one was judged before -- the same history replayed again -- and is
    not applied twice. The latest `last` is kept apart: a transition after it (forward
    data, the common case) costs one comparison, not a bisect."""

    __slots__ = ("ids", "lasts", "latest", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.lasts: list[float] = []
        self.ids: list[str] = []
        self.latest = -math.inf

    def add(self, iid: str, start: float, last: float) -> None:
        """A span; the same incident's again (a restored one frozen now) widens its own."""
        i = bisect_left(self.starts, start)
        j = i
        while j < len(self.starts) and self.starts[j] == start:
            if self.ids[j] == iid:
                self.lasts[j] = max(self.lasts[j], last)
                self.latest = max(self.latest, last)
                return
            j += 1
        self.starts.insert(i, start)
        self.lasts.insert(i, last)
        self.ids.insert(i, iid)
        self.latest = max(self.latest, last)

    def holding(self, t: float) -> str | None:
        """The incident whose span holds event time `t`, if one does."""
        i = bisect_right(self.starts, t) - 1
        return self.ids[i] if i >= 0 and t <= self.lasts[i] else None


def figures_of(
    watch: Mapping[str, Watch], inc: Incident, store: IncidentStore, columns: dict[str, Columns] | None = None
) -> Figures:
    """The incident's figures from its evidence rows (`IncidentTracker.figures`), from
    what a forked freezer has without the tracker: its sensors' `watches`."""

    def evidence(sensor: str) -> Series:
        cols = store.columns(inc.id, sensor) if columns is None else columns
        t, v, q = cols.get(sensor, _NO_EVIDENCE)
        return Series.of_sorted(t, v, q)  # `columns` are in time order

    s = evidence(inc.sensor)
    until = inc.end if inc.end is not None else (float(s.t[-1]) if s.t.size else inc.start)
    w = watch.get(inc.sensor)
    gap = (w.slug_gap if inc.rule == Rule.SLUG else w.stale_after) if w is not None else math.inf
    paired = None
    if inc.flow_sensor is not None and inc.flow_sensor in watch:
        paired = (evidence(inc.flow_sensor), watch[inc.flow_sensor].unit)
    return compute(
        s,
        start=inc.start,
        until=until,
        baseline=inc.figures.baseline,
        high=inc.rule != Rule.LOW,
        max_gap=gap,
        interval=usual_interval(s, inc.start, BASELINE_WINDOW),
        flow_unit=inc.unit if w is not None and w.kind is Kind.FLOW else None,
        paired_flow=paired,
    )


class IncidentTracker:
    """One station's incidents, fed in event time.

    `history(sensor, since, until)` reads older samples (the daemon's series store, where
    every sample is committed before it is judged): with it the tracker keeps only the
    last half hour or so in memory and reads the 24 h before a start back when an incident
    opens (also after a restart); without it (replay) it keeps the whole day.
    """

    def __init__(
        self,
        config: Config,
        store: IncidentStore | None = None,
        history: History | None = None,
        background: bool = False,
        freezer: Freezing | None = None,
    ) -> None:
        self.config = config
        # `background` (replay): final incidents are frozen (figures, evidence file, hash,
        # the frozen record) on a worker thread with a connection of its own, in order, while
        # the replay goes on; their frozen form is returned by a later `advance`, and a
        # failure there is raised by it. Live, the daemon freezes in the batch that ends them.
        # `freezer`: the replay worker's, in a process of its own (`FreezerProcess`).
        self.history = history
        self.settings = config.incidents
        self.zone = config.station.zone
        self.store = store if store is not None else IncidentStore(config.state_dir)
        self._freezer: Freezing | None = None
        if background:
            self._freezer = (
                freezer
                if freezer is not None
                else Freezer(self.store.dir, self.figures, self.settings.evidence_before)
            )
        self.watch = watches(config)
        longest = max(
            [r.slug.duration for r in config.rules.values() if r.slug is not None]
            + [r.limits.on_delay for r in config.rules.values() if r.limits is not None]
            + [0.0]
        )
        # How far back an incident looks when it opens: its evidence and a limit's baseline.
        self.look_back = max(self.settings.evidence_before, BASELINE_WINDOW) + longest + 3600.0
        # With a series store to read that day back from, memory holds only the qualifying
        # run (the longest rule delay, gaps and a margin); without one (replay), the day.
        keep = self.look_back if history is None else longest + SHORT_KEEP
        kept = kept_sensors(config, self.watch)
        self.recent = {s: Recent(keep) for s in self.watch if s in kept}
        self._keep = keep
        self._trimmed = -math.inf
        self.latest = -math.inf
        # Incidents still taking evidence (open, or settling after the end), by id; a restart
        # restores them from the store.
        self.live: dict[str, Incident] = {}
        for inc in self.store.incidents(unfrozen_only=True):
            self.live[inc.id] = inc
        # The history already on record, by sensor and rule (`_OnRecord`): read once here, as
        # nothing but this tracker's own freezing adds to it while it runs (`_recorded_now`).
        self._recorded: dict[tuple[str, Rule], _OnRecord] = {}
        for iid, sensor, rule, start, last in self.store.frozen_spans():
            self._record_span(iid, sensor, rule, start, last)
        for inc in self.live.values():
            # restored: continued, but what it has taken in already is not taken in twice --
            # an open one's evidence so far, or further its own sensor's when a paired flow
            # lagged (its clear time is an earlier clear's, if any)
            if inc.end is None:
                last = max(inc.evidence_until, inc.judged_until)
            else:
                last = max(inc.end, inc.clear_time or inc.end)
            if last >= inc.start:
                self._record_span(inc.id, inc.sensor, inc.rule, inc.start, last)
        self.met_again: dict[str, int] = {}  # incident id -> transitions on record already, skipped
        self._dirty: set[str] = set()
        self._closed: dict[str, bool] = {}  # within one `apply`: incident id -> closed by an operator
        # Within one `apply`: each sensor and rule's clear times, the ends found for them by
        # incident, the newest incident of each sensor and rule, and the drafts.
        self._clears: dict[tuple[str, str], list[float]] = {}
        self._ends: dict[str, dict[float, float]] = {}
        self._newest: dict[tuple[str, str], Incident | None] = {}
        self._drafts: dict[str, _Draft] = {}
        self._writers: ThreadPoolExecutor | None = None  # evidence files of incidents final together
        self._refreshed: dict[str, float] = {}
        self._changed: dict[str, Incident] = {}
        self._marked: set[str] = set()  # marked (or found damaged again) in this `advance`
        # Incidents on record marked for a damaged evidence block (health, /metrics): those a
        # run before this one marked, read here, and each this one marks. The figure an operator
        # needs is how many records are not whole (a store to restore), which a restart does not
        # change; a mark is never taken off (a restored store starts the count again).
        self.evidence_incomplete = self.store.marked_count()

    def _record_span(self, iid: str, sensor: str, rule: str, start: float, last: float) -> None:
        if rule not in INCIDENT_RULES:
            return
        key = (sensor, Rule(rule))
        spans = self._recorded.get(key)
        if spans is None:
            spans = self._recorded[key] = _OnRecord()
        spans.add(iid, start, last)

    def _recorded_now(self, inc: Incident) -> None:
        """An incident this run froze (or handed to its freezer) is on record from now on."""
        ends = [x for x in (inc.end, inc.clear_time) if x is not None]
        self._record_span(inc.id, inc.sensor, inc.rule, inc.start, max(ends, default=inc.start))

    def _met_again(self, iid: str) -> None:
        """A transition of history on record already; said once per incident, not per
        transition (a chattering alarm replayed again meets hundreds)."""
        seen = self.met_again.get(iid, 0)
        self.met_again[iid] = seen + 1
        if not seen:
            log.info("incident %s is on record already (history replayed again); not recorded twice", iid)

    @property
    def path(self) -> Path:
        """The incident store's file."""
        return self.store.path

    def close(self) -> None:
        """Frozen incidents still on the worker are finished first (nothing is lost); a
        failure there was raised by `advance` already, and what was queued after it is dropped."""
        if self._writers is not None:
            self._writers.shutdown()
            self._writers = None
        if self._freezer is not None:
            self._freezer.close()
        self.store.close()

    # --- input ----------------------------------------------------------------------------

    def add_samples(self, samples: Sequence[Sample]) -> None:
        """Live form: samples as validated by the engine (quality after validation)."""
        self._trim()
        recent = self.recent
        latest = self.latest
        for s in samples:
            buf = recent.get(s.sensor)
            if buf is not None:
                buf.push(s.time, s.value, int(s.quality))
                latest = max(latest, s.time)
        self.latest = latest

    def add_columns(
        self,
        names: tuple[str, ...],
        sensor: npt.NDArray[np.integer],
        time: npt.NDArray[np.float64],
        value: npt.NDArray[np.float64],
        quality: npt.NDArray[np.integer],
        accepted: npt.NDArray[np.bool_],
    ) -> None:
        """Replay form: one replay step's columns (`sensor` indexes `names`)."""
        if not time.size:
            return
        self._trim()
        wanted = np.fromiter((n in self.recent for n in names), bool, len(names))
        ok = accepted & (sensor >= 0)
        if not wanted.all():
            ok &= wanted[sensor.clip(0)]
        if ok.all():
            idx, t, v, q = sensor, time, value, quality
        else:
            idx, t, v, q = sensor[ok], time[ok], value[ok], quality[ok]
        # a stable sort of 16-bit keys is a radix sort: O(n), four times faster than int64's
        order = np.argsort(idx.astype(np.int16) if len(names) < 2**15 else idx, kind="stable")
        idx, t, v, q = idx[order], t[order], v[order], q[order].astype(np.int8)
        bounds = np.flatnonzero(np.diff(idx)) + 1
        for a, b in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [idx.size])), strict=True):
            if a == b:
                continue
            name = names[int(idx[a])]
            recent = self.recent.get(name)
            if recent is not None:
                recent.extend(t[a:b], v[a:b], q[a:b])
        if t.size:
            self.latest = max(self.latest, float(t.max()))

    def add_admitted(
        self,
        names: tuple[str, ...],
        by_sensor: Sequence[Part | None],
        quality: npt.NDArray[np.integer],
    ) -> None:
        """Replay form with the engine's own split of a non-empty step by sensor (its
        `by_sensor`): what `add_columns` keeps, without sorting the step again."""
        self.add_series(kept_series(self.recent, names, by_sensor, quality))

    def add_series(self, series: Sequence[Series_]) -> None:
        """Replay form: each kept sensor's samples of one step, (name, time, value, quality)."""
        self._trim()
        latest = self.latest
        for name, t, v, q in series:
            recent = self.recent.get(name)
            if recent is None or not t.size:
                continue
            recent.extend(t, v, q)
            latest = max(latest, float(t[-1]))
        self.latest = latest

    def _trim(self) -> None:
        """Between batches: drop what no incident can need any more (at most every quarter
        of the kept span, so the cost stays O(1) a sample)."""
        if not math.isfinite(self.latest) or self.latest - self._trimmed < self._keep / 4:
            return
        self._trimmed = self.latest
        pins: dict[str, float] = {}
        for inc in self.live.values():
            for sensor in self._sources(inc):
                pins[sensor] = min(pins.get(sensor, math.inf), inc.evidence_until)
        for sensor, recent in self.recent.items():
            recent.trim(min(self.latest - recent.keep, pins.get(sensor, math.inf)))

    def apply(self, conditions: Sequence[Condition] | ConditionColumns) -> None:
        """One batch's conditions, in order (`apply_transitions` of those it watches)."""
        if not isinstance(conditions, ConditionColumns):  # live; replay's config never changes
            self._end_unwatched(conditions)
        self.apply_transitions(transitions(conditions, self.watch))

    def _end_unwatched(self, conditions: Sequence[Condition]) -> None:
        """The open incident of a sensor the config no longer has ends with its alarm,
        which the reconciler retires (monitor/reconcile.py): nothing else would end it, and
        it stood open for ever, never frozen. Its end is what is known, its own sensor's
        last reading taken in (else its start); its clear time, the retirement's."""
        for cond in conditions:
            if (
                cond.sensor in self.watch
                or cond.rule not in INCIDENT_RULES
                or cond.state is not ConditionState.CLEARED
            ):
                continue
            for iid, inc in list(self.live.items()):
                if inc.sensor != cond.sensor or inc.rule != cond.rule or inc.end is not None:
                    continue
                last = max(inc.judged_until, inc.evidence_until)
                end = max(inc.start, last) if math.isfinite(last) else inc.start
                self.live[iid] = inc.with_(end=end, clear_time=cond.time)
                self._touch(iid)
                log.warning(
                    "incident %s ended at %s: %s is no longer in the config", iid, iso(end), inc.sensor
                )

    def apply_transitions(self, mine: Transitions) -> None:
        """One batch's transitions of incident rules on watched sensors, in order (the
        replay worker's columns, no `Condition` each). A chattering alarm re-activates and
        clears thousands of times in a replay step: the ends of all its clears are found in
        one pass (`run_ends`), and an incident's end, clear time and activations are kept in
        a draft while the batch lasts and put into its record once, at the end."""
        # Whether an operator closed an incident, asked once a batch (a query each otherwise).
        self._closed = {}
        if not mine.time:
            return
        self._clears = {}
        names = {r: str(r) for r in INCIDENT_RULES}
        for sensor, rule, t, on in zip(mine.sensor, mine.rule, mine.time, mine.active, strict=True):
            if not on:
                self._clears.setdefault((sensor, names[rule]), []).append(t)
        self._ends = {}
        self._newest = {}
        self._drafts = {}
        try:
            self._transitions(mine)
        finally:
            for iid, d in self._drafts.items():
                if d.changed:
                    self.live[iid] = d.inc.with_(
                        end=d.end, clear_time=d.clear_time, activations=d.activations
                    )
            self._drafts = {}
            self._ends = {}

    def _transitions(self, mine: Transitions) -> None:
        """`_activate` or `_clear` for each transition, in order, with their two commonest
        cases inline (a chattering alarm's re-activation within the merge window and its
        clear): the draft of each sensor and rule is looked up once, not a few calls deep
        for each of thousands of transitions. The drafts are looked up again after an
        `_activate` that went further (it may have opened an incident). Whether DEBUG is on
        is asked once, and a closed case looked up in place (26,000 calls each in a 10 M-row
        replay). The columns are read in place: a `Condition` is built only for `_activate`
        and `_clear`."""
        merge = self.settings.merge_window
        drafts: dict[tuple[str, Rule], _Draft] = {}
        dirty = self._dirty
        closed = self._closed
        recorded = self._recorded
        debug = log.isEnabledFor(logging.DEBUG)
        rows = zip(mine.time, mine.sensor, mine.rule, mine.active, strict=True)
        for i, (time, sensor, rule, active) in enumerate(rows):
            key = (sensor, rule)
            spans = recorded.get(key)
            if spans is not None and time <= spans.latest:
                # within an incident on record already: the same history again, judged before
                held = spans.holding(time)
                if held is not None:
                    self._met_again(held)
                    continue
            d = drafts.get(key)
            if d is None:
                d = self._draft_of(sensor, rule)  # as `_activate` and `_clear` begin
                if d is not None:
                    drafts[key] = d
            if active:
                if d is not None:
                    if d.end is None:
                        continue  # already open (a restart replayed the ACTIVE)
                    iid = d.inc.id
                    within = time - d.end <= merge
                    shut = closed.get(iid) if within else None
                    if within and shut is None:
                        shut = self._is_closed(iid)
                    if within and not shut:
                        d.end = None
                        d.activations += 1
                        d.changed = True
                        dirty.add(iid)
                        if debug:
                            log.debug(
                                "incident %s extended: %s active again within the merge window",
                                iid,
                                sensor,
                            )
                        continue
                self._activate(mine.condition(i))
                drafts.clear()
            elif d is not None and d.end is None:
                ends = self._ends.get(d.inc.id)
                if ends is None:
                    self._clear(mine.condition(i))  # finds the ends of the batch's clears
                    continue
                d.end = max(ends[time], d.inc.start)
                d.clear_time = time
                d.changed = True
                dirty.add(d.inc.id)

    def observe(self, samples: Sequence[Sample], conditions: Sequence[Condition]) -> list[Incident]:
        """One live batch, after the engine judged it; returns incidents that changed."""
        self.add_samples(samples)
        self.apply(conditions)
        return self.advance()

    # --- transitions ----------------------------------------------------------------------

    def _threshold(self, w: Watch, cond: Condition) -> float | None:
        if cond.limit is None or not math.isfinite(cond.limit):
            return None
        if cond.rule is Rule.SLUG or w.limit_unit is None:
            return cond.limit
        scale, offset = conversion(w.limit_unit, w.unit)
        return cond.limit * scale + offset

    def _activate(self, cond: Condition) -> None:
        w = self.watch[cond.sensor]
        last = self._draft_of(cond.sensor, cond.rule)
        if last is not None and last.end is None:
            return  # already open (a restart replayed the ACTIVE)
        if (
            last is not None
            and last.end is not None
            and cond.time - last.end <= self.settings.merge_window
            and not self._is_closed(last.inc.id)
        ):
            last.end = None
            last.activations += 1
            last.changed = True
            self._touch(last.inc.id)
            # DEBUG: a chattering condition extends an incident thousands of times in a
            # replay; the "final" line counts the activations once per incident.
            log.debug(
                "incident %s extended: %s active again within the merge window", last.inc.id, cond.sensor
            )
            return
        # An earlier incident still settling (its hour of evidence after the end) freezes in
        # `advance` on event time, as it would have without this new one.
        threshold = self._threshold(w, cond)
        if threshold is None:
            log.warning("%s/%s active without a finite limit; no incident opened", cond.sensor, cond.rule)
            return
        high = cond.rule is not Rule.LOW
        for sensor in [cond.sensor] + ([w.flow_sensor] if w.flow_sensor else []):
            self._backfill(sensor, cond.time)
        recent = self.recent[cond.sensor]
        t, v, q = recent.window(-math.inf, cond.time)  # views: `Series` keeps copies
        # the buffer is in time order (a backfill is put before its first sample): no sort
        series = Series.of_sorted(t, v, q) if (t[1:] >= t[:-1]).all() else Series.of(t, v, q)
        gap = w.slug_gap if cond.rule is Rule.SLUG else w.stale_after
        start = run_start(series, cond.time, threshold, high, gap)
        if cond.rule is Rule.SLUG and w.factor is not None:
            baseline: float | None = threshold / w.factor
        else:
            baseline = mean_before(series, start, BASELINE_WINDOW)
        iid = incident_id(start, cond.sensor, str(cond.rule))
        existing = self.store.get(iid)
        freezing = self._freezer is not None and iid in self._freezer
        if freezing or (existing is not None and existing.frozen):
            self._met_again(iid)
            return
        inc = Incident(
            id=iid,
            station=self.config.station.id,
            sensor=cond.sensor,
            rule=str(cond.rule),
            method=w.slug_method if cond.rule is Rule.SLUG else w.limit_method,
            citation=cond.citation,
            discharger=w.discharger,
            unit=w.unit,
            threshold=threshold,
            factor=w.factor if cond.rule is Rule.SLUG else None,
            alarm_time=cond.time,
            end=None,
            figures=Figures(start=start, baseline=baseline),
            statement_due=statement_due(start, self.zone, self.settings.statement_days),
            flow_sensor=w.flow_sensor if w.kind is Kind.CONCENTRATION else None,
            evidence_until=start - self.settings.evidence_before - 1e-6,
        )
        self.live[iid] = inc
        self._drafts.pop(iid, None)  # a record of the same id replaced: its draft goes with it
        self._ends.pop(iid, None)
        key = (cond.sensor, str(cond.rule))
        newest = self._newest.get(key)
        if newest is None or inc.start >= newest.start:
            self._newest[key] = inc
        self._touch(iid)
        log.warning(
            "incident %s opened: %s %s since %s (%s)", iid, cond.sensor, cond.rule, iso(start), cond.citation
        )

    def _is_closed(self, iid: str) -> bool:
        closed = self._closed.get(iid)
        if closed is None:
            closed = self._closed[iid] = self.store.closed(iid)
        return closed

    def _backfill(self, sensor: str, now: float) -> None:
        recent = self.recent.get(sensor)
        if self.history is None or recent is None:
            return
        since = now - self.look_back
        if recent.first <= since + 60.0:
            return
        older = [s for s in self.history(sensor, since, min(recent.first, now)) if s.time < recent.first]
        if older:
            self._ends = {}  # ends found before this backfill looked at less
            recent.prepend(
                np.array([s.time for s in older], np.float64),
                np.array([s.value for s in older], np.float64),
                np.array([int(s.quality) for s in older], np.int8),
            )

    def _clear(self, cond: Condition) -> None:
        d = self._draft_of(cond.sensor, cond.rule)
        if d is None or d.end is not None:
            return
        inc = d.inc
        ends = self._ends.get(inc.id)
        if ends is None:
            # The ends of every clear of this sensor and rule in the batch, for this incident
            # (its start and threshold); the recent buffer does not change within a batch.
            times = self._clears[(cond.sensor, str(cond.rule))]
            t, v, q = self.recent[cond.sensor].window(-math.inf, math.inf)
            found = run_ends(t, v, q, inc.start - 1.0, np.array(times), inc.threshold, inc.rule != Rule.LOW)
            ends = self._ends[inc.id] = dict(zip(times, found.tolist(), strict=True))
        d.end = max(ends[cond.time], inc.start)
        d.clear_time = cond.time
        d.changed = True
        self._touch(inc.id)

    def _latest_of(self, sensor: str, rule: Rule) -> Incident | None:
        """The newest incident still taking evidence for the sensor and rule (found once a
        batch; `_activate` keeps it up to date as it opens incidents)."""
        key = (sensor, str(rule))
        if key in self._newest:
            return self._newest[key]
        found = [i for i in self.live.values() if i.sensor == sensor and i.rule == rule]
        newest = self._newest[key] = max(found, key=lambda i: i.start) if found else None
        return newest

    def _draft_of(self, sensor: str, rule: Rule) -> _Draft | None:
        inc = self._latest_of(sensor, rule)
        if inc is None:
            return None
        d = self._drafts.get(inc.id)
        if d is None:
            d = self._drafts[inc.id] = _Draft(inc, inc.end, inc.clear_time, inc.activations)
        return d

    def _touch(self, iid: str) -> None:
        self._dirty.add(iid)

    # --- evidence, figures, freezing -------------------------------------------------------

    def advance(self, final: bool = False) -> list[Incident]:
        """Copy new evidence, refresh figures, freeze what is final; returns what changed.

        `final` (end of a replay): the data ends here, so ended incidents are final now.
        """
        finals: list[Incident] = []
        # The step's evidence copies are one transaction (`store.batch`): a COMMIT per
        # incident and sensor was a third of the replay's tracker thread. `live` takes the
        # copies once they are committed; a failure rolls them all back, and the next call
        # copies the same samples again. Figures and records are saved after it, one by one
        # as before: the transaction stays short, as the freezer's saves wait for its lock.
        ordered = sorted(self.live.items(), key=lambda kv: kv[1].start)
        with self.store.batch():
            collected = [(key, self._collect_apart(was)) for key, was in ordered]
        for key, inc in collected:
            self.live[key] = inc
            if inc.end is not None and (final or self._final(inc, inc.end)):
                finals.append(inc)
                self._changed[inc.id] = inc  # its place in the order; the frozen form replaces it
                continue
            stale = inc.end is None and self.latest - self._refreshed.get(inc.id, -math.inf) >= REFRESH
            if inc.id in self._dirty or stale or inc.id in self._marked:
                self._refresh(inc)
        if self._freezer is not None:
            self._freeze_later(self._freezer, finals)
            self._harvest(self._freezer, wait=final)
        else:
            for a in range(0, len(finals), FREEZE_TOGETHER):
                self._freeze(finals[a : a + FREEZE_TOGETHER])
        self._dirty.clear()
        self._marked.clear()
        out = list(self._changed.values())
        self._changed.clear()
        return out

    def _final(self, inc: Incident, end: float) -> bool:
        """Past the merge window and the evidence window, with every source's samples
        up to the end of the evidence in (or silent for longer than its stale time)."""
        settled = end + max(self.settings.evidence_after, self.settings.merge_window)
        if self.latest < settled:
            return False
        limit = end + self.settings.evidence_after
        for sensor in self._sources(inc):
            recent, w = self.recent.get(sensor), self.watch.get(sensor)
            if recent is None or w is None:
                continue
            if recent.last < limit and self.latest < settled + w.stale_after:
                return False
        return True

    def _sources(self, inc: Incident) -> list[str]:
        return [inc.sensor] + ([inc.flow_sensor] if inc.flow_sensor else [])

    def _collect_apart(self, inc: Incident) -> Incident:
        """`_collect` with its copies undone alone when its evidence is damaged, the incident
        marked (`_mark`); the others' copies in the same transaction stay."""
        for _ in range(2):  # found damaged: marked, then once more past the damaged block
            was = inc.evidence_broken
            try:
                with self.store.savepoint():
                    return self._collect(inc)
            except DamagedEvidenceError as exc:
                inc = self._mark(inc, exc)
            if was is not None:
                break
        return self._collect(inc, skip=True)

    def _mark(self, inc: Incident, exc: DamagedEvidenceError) -> Incident:
        """The incident's evidence is not whole from here (the damaged block's first time, or
        the first sample not copied, whichever is earlier): said once, kept on its record."""
        self.evidence_incomplete += inc.evidence_broken is None
        self._marked.add(inc.id)
        if inc.evidence_broken is not None:
            log.debug("incident %s: evidence still not copied: %s", inc.id, exc)
            return inc
        since = incomplete_since(inc, exc.since, self.settings.evidence_before)
        log.error(
            "incident %s: evidence incomplete from %s, the other incidents go on (its figures stay"
            " those of before; it will not be frozen until the store is restored): %s",
            inc.id,
            iso(since),
            exc,
        )
        mark = {"evidence_broken_at": since, "evidence_broken": str(exc)}
        held = self.live.get(inc.id)
        if held is not None:  # kept should the batch roll back (a full disk too): said once
            self.live[inc.id] = held.with_(**mark)
        return inc.with_(**mark)

    def _collect(self, inc: Incident, skip: bool = False) -> Incident:
        """Copy the incident's new samples from the recent buffer into its evidence. `skip`:
        its evidence is damaged where these would go (a marked incident's samples the store
        cannot place without reading the damaged block): they are passed over, not copied, so
        the buffer does not hold them for ever; the mark says the evidence is not whole."""
        limit = math.inf if inc.end is None else inc.end + self.settings.evidence_after
        until = limit
        rows = 0
        marked = inc.evidence_broken is not None
        for sensor in self._sources(inc):
            recent = self.recent.get(sensor)
            if recent is None:
                continue
            if not skip:
                t, v, q = recent.since(inc.evidence_until, limit)
                rows += self.store.add_evidence(inc.id, sensor, t, v, q, past_damage=marked)
            until = min(until, recent.last)
        own = self.recent.get(inc.sensor)
        if own is not None and own.last > inc.judged_until:
            # Its own sensor's transitions are applied up to its last sample, whatever the
            # paired flow's lag: a restored open incident holds history up to here.
            inc = inc.with_(judged_until=own.last)
        if not math.isfinite(until) or until <= inc.evidence_until:
            return inc
        return inc.with_(evidence_until=until, evidence_rows=inc.evidence_rows + rows)

    def _refresh(self, inc: Incident) -> Incident:
        """New figures from the evidence rows, saved; a marked incident keeps the figures it
        had (numbers from part of its evidence would be other numbers), its record is saved."""
        if inc.evidence_broken is None:
            try:
                inc = inc.with_(figures=self.figures(inc))
            except DamagedEvidenceError as exc:
                inc = self._mark(inc, exc)
        self.store.save(inc)
        self.live[inc.id] = inc
        self._refreshed[inc.id] = self.latest
        self._changed[inc.id] = inc
        return inc

    def figures(
        self, inc: Incident, store: IncidentStore | None = None, columns: dict[str, Columns] | None = None
    ) -> Figures:
        """The incident's figures from its evidence rows (what survives a restart);
        `columns`: all of them (`store.columns(inc.id)`), when the caller has read them."""
        return figures_of(self.watch, inc, self.store if store is None else store, columns)

    def _freeze(self, incidents: list[Incident]) -> None:
        """Final figures and evidence files of incidents final in the same step. Each file
        is durable (written, fsynced, renamed) before its incident is saved as frozen, as
        one at a time; the files' writes overlap in threads (fsync waits on the disk,
        4 ms a file here), their CSV is formatted here, where the database is."""
        pending: list[tuple[Incident, Future[tuple[str, int]]]] = []
        try:
            for ended in incidents:
                if ended.evidence_broken is not None:
                    self._unfrozen(self._collect_apart(ended))
                    continue
                collected = ended
                try:
                    collected = self._collect(ended)
                    columns = self.store.columns(collected.id)  # read once, for the figures and the file
                except DamagedEvidenceError as exc:
                    marked = self._mark(collected, exc)
                    self._unfrozen(self._collect_apart(marked) if collected is ended else marked)
                    continue
                inc = collected.with_(figures=self.figures(collected, columns=columns))
                data = self.store.evidence_parts(inc.id, columns)
                if self._writers is None:
                    self._writers = ThreadPoolExecutor(FREEZE_TOGETHER, thread_name_prefix="evidence")
                lines = csv_lines(columns)
                pending.append((inc, self._writers.submit(self.store.write_evidence, inc.id, data, lines)))
        finally:
            wait([f for _, f in pending])
        for final, done in pending:
            sha, rows = done.result()
            inc = final.with_(frozen=True, evidence_sha256=sha, evidence_rows=rows)
            self.store.save(inc)
            self.live.pop(inc.id, None)
            self._recorded_now(inc)
            self._changed[inc.id] = inc
            log.info(
                "incident %s final: %d activation(s), %d evidence row(s), sha256 %s",
                inc.id,
                inc.activations,
                rows,
                sha,
            )

    def _unfrozen(self, inc: Incident) -> None:
        """A marked incident that is final: its record saved as it stands, not frozen (a hash
        would vouch for evidence that is not all there), no longer taking evidence or memory.
        A restart tries again (restored as unfrozen): a store restored from a backup freezes it."""
        self.store.save(inc)
        self.live.pop(inc.id, None)
        self._recorded_now(inc)
        self._changed[inc.id] = inc
        log.error("incident %s ended; not frozen: %s", inc.id, inc.evidence_note)

    def _freeze_later(self, freezer: Freezing, finals: list[Incident]) -> None:
        """`_freeze` on the worker (`freezer.py`): the last evidence is copied in here, on
        this connection, and the ended record saved, so a failure there loses nothing."""
        for ended in finals:
            inc = self._collect_apart(ended)
            if inc.evidence_broken is not None:
                self._unfrozen(inc)  # not for the freezer: its evidence does not read whole
                continue
            self.store.save(inc)
            self.live.pop(inc.id, None)
            self._changed.pop(inc.id, None)  # its frozen form comes with a later `advance`
            freezer.submit(inc)
            self._recorded_now(inc)

    def _harvest(self, freezer: Freezing, wait: bool) -> None:
        for inc in freezer.take(wait):
            self._changed[inc.id] = inc
            if inc.evidence_broken is not None:  # the freezer met a damaged block: marked, not frozen
                self.evidence_incomplete += 1
                log.error("incident %s ended; not frozen: %s", inc.id, inc.evidence_note)
                continue
            log.info(
                "incident %s final: %d activation(s), %d evidence row(s), sha256 %s",
                inc.id,
                inc.activations,
                inc.evidence_rows,
                inc.evidence_sha256,
            )

    def incidents(self) -> list[Incident]:
        if self._freezer is not None:
            self._harvest(self._freezer, wait=True)
        return self.store.incidents()
