"""MeterBook: where meter samples enter the ledger and meter alarms come out.

The daemon and `monitor replay` hand it every `Sample` of a `kind: meter` sensor
(value = register counts, as polled); it returns the meter `Condition`s for the
alarm system. The meter alarm of a meter is active exactly while its latest reading
is rejected, so a register reset is one alarm that stays up until an operator
records the replacement, not one alarm per poll.

What InfluxDB gets is kept in the ledger, not in memory: every point a transaction wrote,
re-judged or voided is marked `unsent` in that transaction, by whichever process made it
(the daemon, `monitor meters replace|correct|void-replacement|ingest`, a settings change at
an open, `monitor replay`). `send(write)` hands the marked points to the outbox
(`meter_records`) and unmarks them only once `write` returned, and only those it took (at
its cap the outbox takes meter points only as far as they fit; while it is there, an offer
reads only as many as its room holds, `room`), so after a crash anywhere,
or an amendment made while the daemon runs or is down, the next `send` has them: the
InfluxDB copy follows the ledger, at least once per point (InfluxDB overwrites a point).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import numpy.typing as npt

from monitor.config import Config
from monitor.errors import MeterError, StateError
from monitor.meters.amend import CORRECTION, VOID
from monitor.meters.ledger import OLD_FINAL, READING, Ledger, Replacement, Row, to_ms
from monitor.meters.totalizer import ANOMALIES, ZERO, MeterSpec, Step, condition, dec, from_ft3, to_ft3
from monitor.model import Clock, Condition, Kind, Quality, Sample, WallClock, iso
from monitor.writeonce import WriteKey

log = logging.getLogger(__name__)
# At start, a clock behind the station's evidence by more than this is not set yet; without
# evidence, more than one row of a meter ahead of it by more than this is taken for that, not
# for a step back the ledger missed (`found_at_start`).
UNSYNCED_AT_START = 86_400.0

LEDGER_FILE = "ledger.sqlite"
TAKE = 5000  # marked points the daemon hands to the outbox at a time (a batch, a tick)
SpecAt = Callable[[str, int, int], MeterSpec]  # (meter, time_ms, seq) -> the settings of the row's time


def _ms(time: float) -> int:
    """Epoch seconds from an operator; a time no calendar holds is refused, not stored."""
    if not math.isfinite(time) or not -(2**53) < time * 1000 < 2**53:
        raise MeterError(f"time {time!r} is out of range")
    return to_ms(time)


def _figure(value: Decimal | float | str) -> Decimal:
    out = dec(value.strip().replace(",", "") if isinstance(value, str) else value)
    if not out.is_finite():
        raise MeterError(f"{value!r} is not a number")
    return out


def meter_specs(config: Config) -> dict[str, MeterSpec]:
    return {s.id: MeterSpec.from_sensor(s) for s in config.sensors if s.kind is Kind.METER}


def ledger_path(config: Config) -> Path:
    return config.state_dir / LEDGER_FILE


def open_ledger(config: Config, now: float | None = None) -> Ledger:
    """The station's ledger under `state_dir`, judging with the configured meters; a
    changed meter setting without `settings_since` takes effect from `now` (the gateway's
    clock, the wall clock when not given): every opening checks, the daemon's start and
    reload, `monitor meters`, `monitor billing export`, `monitor replay`."""
    return Ledger(ledger_path(config), meter_specs(config), now)


@dataclass(frozen=True, slots=True)
class MeterRecord:
    """One ledger row as a point for InfluxDB (measurement `meter`, see docs/outputs.md).

    `reading` and `consumption` are in the meter's unit; `consumption_ft3` is the
    billed delta in ft3 (0 for a rejected reading), so summing it over a quarter
    gives the export's `consumption_ft3`.
    """

    meter: str
    account: str
    unit: str
    time: float
    reading: float
    consumption: float
    consumption_ft3: float
    accepted: bool
    flags: str
    # The InfluxDB field `restamped`: the id N of the ledger's clock step (ids only grow) on
    # the point it moved a reading away from (overwritten rejected); -N on a row at a time step
    # N (the latest) moved readings from: VictoriaMetrics keeps every value written at a time,
    # and the larger id says which came last (`sources.meter_history`); None: no field.
    restamped: int | None = None
    # The InfluxDB field `corrected` (1): a point a correction sent again, from the corrected
    # reading to the first accepted one after it. A VictoriaMetrics run with dedup keeps one of
    # its writes per field, the misread's possibly, and nothing else would say so (`meters.dedup`).
    corrected: bool = False


def meter_records(
    rows: Iterable[Row], specs: Mapping[str, MeterSpec], spec_at: SpecAt | None = None
) -> list[MeterRecord]:
    """Ledger rows -> points for the outbox. Replacement rows at the same time are
    merged (an InfluxDB point is one per series and timestamp). `spec_at` (the ledger's)
    gives each row the settings of its time: the old meter's final delta of a swap at a
    unit change is converted from the old unit, not read as if it were in the new one."""
    merged: dict[tuple[str, int], list[tuple[Row, MeterSpec | None]]] = {}
    for row in rows:
        spec = specs.get(row.meter)
        if spec is not None and spec_at is not None:
            spec = spec_at(row.meter, row.time_ms, row.seq)
        merged.setdefault((row.meter, row.time_ms), []).append((row, spec))
    out = []
    for parts in merged.values():
        row, spec = parts[-1]  # the point shows the last side: a swap's new meter
        unit = spec.unit if spec else "ft3"
        ft3 = sum((to_ft3(r.volume, s.unit if s else "ft3") for r, s in parts), Fraction(0))
        flags: list[str] = []
        for r, _ in parts:
            flags += [f for f in r.flags if f not in flags]
        out.append(
            MeterRecord(
                meter=row.meter,
                account=(spec.account or "") if spec else "",
                unit=unit,
                time=row.time,
                reading=float(row.reading * (spec.multiplier if spec else 1)),
                consumption=float(from_ft3(ft3, unit)),
                consumption_ft3=float(ft3),
                accepted=all(r.accepted for r, _ in parts),
                flags=",".join(flags),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Evidence:
    """A time the station wrote something at, from outside a meter's own rows (the daemon's
    heartbeat file, the engine checkpoint's last tick, the alarm journal's last gateway-stamped
    entry; another meter's newest row): at start, a gateway clock more than a day behind it is
    not set yet.
    `good`: written only by a clock believed set (the heartbeat, `monitor.clockfile`), so a
    clock not behind it is set: one meter's rows far ahead of it are that meter's bad stamps."""

    what: str
    time: float
    good: bool = False
    # The clock is known set at `time` (the kernel says NTP keeps it synchronised; it ran a
    # week without a step): the records ahead of it were a clock wrong in the future's.
    sure: bool = False


@dataclass(slots=True)
class _PendingStep:
    """A clock step back not yet moved in the ledger, with the notice time it had."""

    step: float
    now: float
    keep: frozenset[str]
    failed: bool = False
    meter: str | None = None  # found at start: this meter's rows alone (`found_at_start`)


class MeterBook:
    """The ledger plus per-meter alarm state; one per daemon (or replay run)."""

    def __init__(self, ledger: Ledger, records: bool = True, clock: Clock | None = None) -> None:
        """`records=False` when this process hands nothing to an outbox (a replay without
        InfluxDB, `monitor meters`): what it writes stays marked in the ledger for the daemon.
        `clock` says what "in the future" means for an operator's replacement time."""
        self.ledger = ledger
        self.records = records
        self.clock: Clock = clock if clock is not None else WallClock()
        self.skipped = 0  # samples that were not readings: bad quality, NaN
        self._alarm: dict[str, bool] = {}
        self._seen: dict[str, tuple[int, int]] = {}
        for meter in ledger.specs:
            last = ledger.last(meter)
            if last is not None:
                self._alarm[meter] = not last.accepted
                self._seen[meter] = last.key
        # The points the last `take_records` read, and the ledger's state then (`sent`).
        self._taken: list[tuple[str, int]] = []
        self._records: list[MeterRecord] = []  # ... as the records it returned
        # The outbox is at its cap with meter points alone: an offer it did not take in full
        # (logged once an episode). Until an offer leaves nothing behind the room cut, the marked
        # points stay in the ledger (`held_back`) and each offer reads only what fits (`send`).
        self.at_cap = False
        self._cut = False  # the last offer read fewer than asked: the outbox's room said so
        self._held_back = 0  # the last count (`held_back`)
        self._taken_at: tuple[int, int] = (-1, -1)
        self.backlog = True  # marked points may be left (another process's, more than TAKE)
        # Clock steps whose move the ledger refused (a full or read-only disk), oldest first:
        # made before anything else is written to it, so they land as if made at once.
        self._steps: list[_PendingStep] = []
        self._step_conditions: list[Condition] = []  # from moves made, not yet returned
        self.clock_step_failures = 0  # steps whose move the ledger refused (once per step)
        # Meters whose rows ahead were taken for an unset clock at start, and their newest stamp.
        self.unset_at_start: dict[str, float] = {}
        # And how many of each meter's rows stood ahead (the console's clock fault counts them).
        self.unset_rows: dict[str, int] = {}
        # Points of meters no longer configured the InfluxDB copy lacks (`unconfigured`).
        self.unsent_unconfigured = 0
        self._said_unconfigured: set[str] = set()

    @classmethod
    def open(cls, config: Config, records: bool = True, clock: Clock | None = None) -> MeterBook:
        """`clock` is the gateway's: a changed meter setting takes effect from its time now."""
        return cls(open_ledger(config, None if clock is None else clock.now()), records, clock)

    def close(self) -> None:
        self.ledger.close()

    def unconfigured(self) -> int:
        """The points of meters no longer configured still marked for InfluxDB (a gauge, in
        /api/health): they stay marked (no settings to write them with) until the meter is
        configured again. Said once per meter (the daemon's start, a clock step that moved its
        rows): before, a removed meter's lag of the InfluxDB copy was nowhere to be seen."""
        held = self.ledger.unsent_unconfigured()
        for meter in sorted(set(held) - self._said_unconfigured):
            self._said_unconfigured.add(meter)
            log.warning(
                "meter %s is no longer configured: %d point(s) of it the InfluxDB copy lacks stay marked in"
                " the ledger until it is configured again (its rows and export are kept)", meter, held[meter],
            )  # fmt: skip
        self.unsent_unconfigured = sum(held.values())
        return self.unsent_unconfigured

    def is_meter(self, sensor: str) -> bool:
        return sensor in self.ledger.specs

    def ingest(self, samples: Iterable[Sample]) -> list[Condition]:
        """Add the meter readings among `samples` (others are ignored) in one transaction."""
        readings: list[tuple[str, float, Decimal]] = []
        for s in samples:
            if s.sensor not in self.ledger.specs:
                continue
            if s.quality is not Quality.GOOD or not math.isfinite(s.value):
                self.skipped += 1
                log.debug("meter %s at %s: skipped %s sample", s.sensor, s.time, s.quality.name)
                continue
            readings.append((s.sensor, s.time, dec(s.value)))
        if not readings:
            return []
        self._move_steps()  # raises while the ledger refuses: the batch waits
        rows = self.ledger.add_many(readings)
        self.backlog = True
        return self._take_moved() + self._conditions(rows)

    def ingest_arrays(
        self,
        names: Sequence[str],
        sensor: npt.NDArray[np.integer],
        time: npt.NDArray[np.floating],
        value: npt.NDArray[np.floating],
        quality: npt.NDArray[np.integer] | None = None,
        accepted: npt.NDArray[np.bool_] | None = None,
    ) -> list[Condition]:
        """The replay path: a batch as column arrays (`sensor` indexes `names`, as the
        engine's replay steps carry it); only the meter rows are turned into samples."""
        wanted = [i for i, name in enumerate(names) if name in self.ledger.specs]
        if not wanted or sensor.size == 0:
            return []
        mask = np.isin(sensor, wanted)
        if accepted is not None:
            mask &= accepted
        rows = np.flatnonzero(mask)
        q = np.zeros(rows.size, dtype=np.int64) if quality is None else quality[rows]
        return self.ingest(
            Sample(names[int(s)], float(t), float(v), Quality(int(k)))
            for s, t, v, k in zip(sensor[rows], time[rows], value[rows], q, strict=True)
        )

    def record_replacement(
        self,
        meter: str,
        time: float,
        old_final: Decimal | float | str,
        new_initial: Decimal | float | str,
        recorded_by: str = "",
        note: str = "",
        key: WriteKey | None = None,
    ) -> list[Condition]:
        """Record an operator's meter swap (CLI and console API); re-judges later readings.

        Checked before anything is written (see `amend.py`). Returns the meter alarm
        transitions it causes (usually the `backwards` alarm clearing): hand them to the
        alarm manager like any other condition. `key`: the console's request id, kept in
        the swap's transaction."""
        self.ledger.spec(meter)
        rep = Replacement(meter, _ms(time), _figure(old_final), _figure(new_initial), recorded_by, note)
        self._move_steps()
        rows = self.ledger.record_replacement(rep, self.clock.now(), key=key)
        log.info(
            "meter %s replaced at %s: old final %s, new initial %s%s",
            meter, iso(time), rep.old_final, rep.new_initial, f" (by {recorded_by})" if recorded_by else "",
        )  # fmt: skip
        return self._take_moved() + self._amended(rows)

    def void_replacement(self, meter: str, time: float, by: str, why: str) -> list[Condition]:
        """Void a wrongly recorded replacement (appended, with who and why); the readings
        after it are judged again as if it had never been recorded."""
        self.ledger.spec(meter)
        time_ms = _ms(time)
        self._move_steps()
        rows = self.ledger.void_replacement(meter, time_ms, by, why, self.clock.now())
        log.info("meter %s: replacement at %s voided by %s: %s", meter, iso(time), by, why)
        return self._take_moved() + self._amended(rows)

    def correct(
        self, meter: str, time: float, reading: Decimal | float | str, by: str, why: str
    ) -> list[Condition]:
        """Correct a misread reading (appended with the original, who and why)."""
        self.ledger.spec(meter)
        value = _figure(reading)
        self._move_steps()
        rows = self.ledger.correct(meter, _ms(time), value, by, why, self.clock.now())
        log.info("meter %s: reading at %s corrected to %s by %s: %s", meter, iso(time), value, by, why)
        return self._take_moved() + self._amended(rows)

    def clock_step(self, step: float, now: float, keep: Collection[str] = ()) -> list[Condition]:
        """The gateway clock stepped back (`Ledger.clock_step`; the daemon calls it on the
        clock watch's `on_step`): the rows it stamped ahead of the new clock move with the
        step. Returns the meter alarm transitions a re-judged row causes (usually none).

        A ledger that refuses the move (one transaction: nothing moved) raises `StateError`;
        the step is kept with its notice time `now` and moved by `move_pending` before the
        next write (a reading, an amendment), so the ledger ends as if it had moved at once:
        left unmoved, the new clock's readings were judged `backwards` against its rows."""
        if step >= 0:
            return []
        self._steps.append(_PendingStep(step, now, frozenset(keep)))
        return self.move_pending()

    def found_at_start(
        self,
        now: float,
        tolerance: float,
        keep: Collection[str] = (),
        evidence: Sequence[Evidence] = (),
        floor: float = -math.inf,
    ) -> list[Condition]:
        """At the daemon's start: a meter whose newest rows are ahead of the gateway clock `now`
        by more than `tolerance` had a step back the ledger did not follow (a move the disk
        refused before a restart, a ledger written before this check, the clock stepped while
        the daemon was down); left there, each reading of the new clock was judged
        `backwards` against them. Its rows are moved as for a step noticed now, audited
        `found`, made (or kept, counted and logged) like any step's move. The step is each
        meter's own, measured from its newest row (the daemon's down time, and so the real
        step, is unknown: at least this much): one meter's far-future reading (a bad stamp, not
        the clock) then moves that meter's rows only, and of those only the rows down to a gap
        of its step, which such a row alone is. Returns the meter alarm transitions.

        Rows more than a day ahead are either a clock not set yet or bad stamps; `evidence`
        (the daemon's: times the gateway clock stamped outside this ledger) tells which
        (`_unset`): a clock behind any of it by more than a day is not set, and nothing of that
        meter moves; a clock not behind a `good` one (the heartbeat) is set, and the rows ahead
        are bad stamps, moved. Without a `good` one the other meters' newest rows count too
        (with it they do not: the same typo'd file may hold them); and, nothing known, more
        than one row ahead is taken for an unset clock (moving would send the history back by
        the clock's error), one row for a bad stamp. A clock before `floor` (the date this
        release was cut, `clockfile.RELEASE_FLOOR`) is not set whatever else is known: a first
        boot's 1970 clock with no heartbeat yet moved a single-row meter back to 1970."""
        ahead = self.ledger.ahead(now, tolerance, keep)
        newest = self.ledger.newest(keep) if ahead and not any(e.good for e in evidence) else {}
        for meter, newest_ms in ahead.items():
            step = now - newest_ms / 1000 - 1.0  # the newest row lands a second before now
            if -step > UNSYNCED_AT_START:
                others = [Evidence(f"meter {m}'s newest reading ({iso(t / 1000)})", t / 1000)
                          for m, t in newest.items() if m != meter]  # fmt: skip
                if self._unset(meter, now, step, tolerance, [*evidence, *others], floor):
                    self.unset_at_start[meter] = newest_ms / 1000
                    continue
            # Logged once, by the move (`Ledger._move`: "found at start"), or its refusal.
            self._steps.append(_PendingStep(step, now, frozenset(keep), meter=meter))
        return self.move_pending()

    def held_back(self) -> int:
        """The points the ledger holds marked while the outbox is at its cap with meter points
        alone (/api/health `meters.held_back`, a gauge; 0 otherwise): none dropped, each goes to
        the outbox once deliveries make room. Counted when asked (a health request, not each
        offer); a ledger that cannot be read gives its last count."""
        if not self.at_cap:
            self._held_back = 0
            return 0
        with contextlib.suppress(StateError):
            self._held_back = self.ledger.unsent_count()
        return self._held_back

    def _unset(
        self,
        meter: str,
        now: float,
        step: float,
        tolerance: float,
        evidence: Sequence[Evidence],
        floor: float = -math.inf,
    ) -> bool:
        """Whether `meter`'s rows, the newest `-step` s ahead of `now` (more than a day), are
        a clock not set yet (logged once, an ERROR naming the evidence: nothing is moved; a
        reading of this clock is judged `backwards` against them, a meter alarm, until the
        clock is right, and the register keeps the volume for the next accepted reading) or
        bad stamps (False: moved, and logged why)."""
        rows = self.ledger.count_ahead(meter, now, tolerance)
        behind = [e for e in evidence if e.time - now > UNSYNCED_AT_START]
        sure = [e for e in evidence if e.sure]
        good = [e for e in evidence if e.good]
        unset = bool(behind) or now < floor
        if behind:
            newest = max(behind, key=lambda e: e.time)
            why = f"and the clock is {(newest.time - now) / 86400:.1f} days behind {newest.what}"
        elif now < floor:
            why = f"and the clock is before this release's date ({iso(floor)})"
        elif sure:
            why = f"and the clock is set ({sure[0].what}): they were stamped by a clock wrong in the future"
        elif good:
            why = f"but the clock is not behind {good[0].what}: they are bad stamps, not an unset clock"
        elif rows > 1:
            # Nothing outside the ledger says whether the clock is set (no heartbeat yet: a
            # first start, a damaged or unwritable file). Many rows more than a day ahead: the
            # clock, not a row (a gateway without a battery-backed clock started before NTP
            # answered reads its build date, and every row of the ledger is "ahead"). Moving
            # them would send the meter's whole history back by the clock's error. One
            # far-future row (a bad stamp) is still moved: it alone is ahead.
            unset, why = True, "and no heartbeat says the clock is set"
        else:
            return False
        said = (
            "meter %s: %d reading(s) are stamped ahead of the gateway clock (%s), the newest by %.1f days, %s"
        )
        if unset:
            self.unset_rows[meter] = rows
            log.error(
                said + ": the clock is not synchronised, not a step back; nothing is moved (its"
                " readings are judged against the ledger until the clock is set)",
                meter, rows, iso(now), -step / 86400, why,
            )  # fmt: skip
        else:
            log.warning(said + ", and are moved below it", meter, rows, iso(now), -step / 86400, why)
        return unset

    @property
    def clock_steps_pending(self) -> int:
        """Clock steps whose move waits for a ledger that takes writes (/api/health)."""
        return len(self._steps)

    def move_pending(self) -> list[Condition]:
        """Make the clock step moves the ledger refused, oldest first, each with its own
        notice time; raises `StateError` while it still refuses (counted and logged once
        per step). Returns the meter alarm transitions the moves cause."""
        self._move_steps()
        return self._take_moved()

    def _move_steps(self) -> None:
        """`move_pending`, keeping the transitions (`_take_moved`) until the write that
        follows it succeeded: a reading the ledger then refuses does not lose them."""
        while self._steps:
            pending = self._steps[0]
            try:
                only = pending.meter  # a step found at start: that meter's alone
                moved = self.ledger.clock_step(
                    pending.step,
                    pending.now,
                    pending.keep,
                    tolerance=0.0 if only is not None else 2.0,  # found: land at or before now
                    only=only,
                    found=only is not None,
                )
            except StateError as exc:
                if not pending.failed:
                    self.clock_step_failures += 1
                if not isinstance(exc.__cause__, sqlite3.OperationalError):
                    # Not a disk that may take writes again (a constraint, a damaged file):
                    # kept, the move would hold every reading of the station back for ever.
                    self._steps.pop(0)
                    log.error(
                        "gateway clock stepped back by %.0f s: the meter ledger's rows were not moved"
                        " with it (not tried again): %s", -pending.step, exc,
                    )  # fmt: skip
                    continue
                if not pending.failed:
                    pending.failed = True
                    log.error(
                        "gateway clock stepped back by %.0f s: the meter ledger's rows were not moved"
                        " with it (moved before its next write, once it takes writes): %s",
                        -pending.step, exc,
                    )  # fmt: skip
                raise
            self._steps.pop(0)
            if pending.failed:
                log.warning(
                    "gateway clock step back of %.0f s noticed at %s: the meter ledger's rows moved now",
                    -pending.step, iso(pending.now),
                )  # fmt: skip
            self._step_conditions += self._moved(moved)

    def _take_moved(self) -> list[Condition]:
        out, self._step_conditions = self._step_conditions, []
        return out

    def _moved(self, moved: Mapping[str, list[Row]]) -> list[Condition]:
        if not moved:
            return []
        self.backlog = True
        if set(moved) - set(self.ledger.specs):  # a removed meter's rows moved: marked again
            self.unconfigured()
        for meter in moved:
            last = self.ledger.last(meter)
            if last is not None and meter in self._seen:
                self._seen[meter] = min(self._seen[meter], last.key)  # the latest row moved back
        return self._conditions([row for rows in moved.values() for row in rows])

    def _amended(self, rows: list[Row]) -> list[Condition]:
        self.backlog = True
        return self._conditions(rows)

    def take_records(self, limit: int | None = None) -> list[MeterRecord]:
        """The points the ledger holds marked for InfluxDB (up to `limit`), as outbox points.
        Nothing is unmarked: call `sent()` once the outbox holds them (or use `send`)."""
        ledger = self.ledger
        ledger.refresh()
        version = ledger.data_version()
        marked = ledger.marked
        keys, rows = ledger.unsent(limit)
        self._cut = False
        self._taken = keys
        self._taken_at = (version, marked)
        self.backlog = limit is not None and len(keys) >= limit
        held = {(r.meter, r.time_ms) for r in rows}
        overwritten: dict[tuple[str, int], int] = {}  # the step that moved each away
        for meter, time_ms in keys:
            if (meter, time_ms) not in held:  # a voided swap and no reading there: blank its point
                voids = [a for a in ledger.amendments(meter, time_ms - 1, time_ms) if a.action == VOID]
                if voids:
                    # InfluxDB cannot be told to forget a point (line protocol), so it is
                    # overwritten with one that says nothing happened: the register where the
                    # last accepted reading left it, nothing billed (so the historian finds it
                    # reconciled: its rise is its consumption, 0).
                    base = ledger.accepted_at_or_before(meter, time_ms)
                    at = base.reading if base is not None else Decimal(voids[-1].old_final)
                    rows.append(Row(meter, time_ms, OLD_FINAL, at, True, ZERO, ZERO, ("voided",), "voided"))
                elif (moved := ledger.restamped_reading(meter, time_ms)) is not None:
                    # A reading a clock step moved away: its point at the old time is overwritten
                    # as rejected and billing nothing, so the historian neither bills it twice
                    # nor takes it for a register that went back (its quarter shows `anomaly`).
                    cs, at, overwritten[(meter, time_ms)] = moved
                    why = f"re-stamped to {iso((time_ms + cs.step_ms) / 1000)}: {cs.describe()}"
                    rows.append(Row(meter, time_ms, READING, at, False, ZERO, ZERO, ("restamped",), why))
        rows.sort(key=lambda r: (r.time_ms, r.meter, r.seq))
        records = meter_records(rows, ledger.specs, ledger.spec_at)
        corrected = self.corrected(records)
        for i, rec in enumerate(records):
            key = (rec.meter, to_ms(rec.time))
            step_id = overwritten.get(key)
            if step_id is not None or key in corrected:
                records[i] = replace(rec, restamped=rec.restamped if step_id is None else step_id,
                                     corrected=key in corrected)  # fmt: skip
        self._records = self.stepped(records)
        return list(self._records)

    def corrected(self, records: Sequence[MeterRecord]) -> set[tuple[str, int]]:
        """The points of `records` a correction re-judged: from the corrected reading to the
        first accepted one after it (whose rise it changed; the rows between are those it made
        rejected or accepted). Sent again, each is marked `corrected` on every send."""
        times: dict[str, list[int]] = {}
        for rec in records:
            times.setdefault(rec.meter, []).append(to_ms(rec.time))
        out: set[tuple[str, int]] = set()
        for meter, held in times.items():
            for a in self.ledger.amendments(meter, None, max(held)):
                if a.action == CORRECTION:
                    nxt = self.ledger.accepted_after(meter, a.time_ms)
                    end = 2**62 if nxt is None else nxt.time_ms
                    out.update((meter, t) for t in held if a.time_ms <= t <= end)
        return out

    def stepped(self, records: list[MeterRecord]) -> list[MeterRecord]:
        """`records` with `restamped` -N on the rows at a time recorded clock step N (the
        latest) moved readings from. VictoriaMetrics keeps every value written at a time:
        without it, a reading of the new clock landing on a point overwritten `restamped`
        (the same register, an idle meter) was read back as the overwrite, rejected, and a
        spread step's overwrites (their reading not the one moved) could not be told from
        such a landing (`sources.meter_history`)."""
        by_meter: dict[str, list[int]] = {}
        for i, rec in enumerate(records):
            if rec.restamped is None:
                by_meter.setdefault(rec.meter, []).append(i)
        for meter, at in by_meter.items():
            times = [to_ms(records[i].time) for i in at]
            spans = self.ledger.stepped_spans(meter, min(times), max(times))
            for i, t in zip(at, times, strict=True):
                latest = max((n for n, a, b in spans if a <= t <= b), default=None)
                if latest is not None:
                    records[i] = replace(records[i], restamped=-latest)
        return records

    def sent(self, taken: int | None = None) -> None:
        """The outbox holds what the last `take_records` returned (`taken`: only the first
        that many, the outbox at its cap): unmark those points, unless the ledger changed since
        they were read (then they go out again next time). The rest stay marked, offered again."""
        keys, records = self._taken, self._records
        held = 0 if taken is None else max(0, len(records) - taken)
        if held:
            took = {(r.meter, to_ms(r.time)) for r in records[:taken]}
            offered = {(r.meter, to_ms(r.time)) for r in records}
            keys = [k for k in keys if k in took or k not in offered]
            self.backlog = True
            if not self.at_cap:
                log.warning(
                    "the outbox is at its cap with meter points alone: the meter points it cannot take"
                    " (%d of this offer, and those read after it) stay marked in the ledger and go to it"
                    " once deliveries to InfluxDB make room (none dropped)", held,
                )  # fmt: skip
            self.at_cap = True
        elif self.at_cap and not (self._cut and self.backlog):  # the room cut nothing left behind
            self.at_cap = False
            log.info("the outbox has room again: the meter points the ledger held back are all handed over")
        version, marked = self._taken_at
        if not self.ledger.clear_unsent(keys, version, marked):
            self.backlog = True
        self._taken, self._records = [], []

    def due(self) -> bool:
        """Marked points may be waiting: some were left (more than a take, a failed clear), this
        book wrote, or another process committed to the ledger (a `monitor meters` command)."""
        return self.backlog or self.ledger.data_version() != self._taken_at[0]

    def send(
        self,
        write: Callable[[list[MeterRecord]], object],
        limit: int | None = TAKE,
        room: Callable[[], int] | None = None,
    ) -> int:
        """Hand the marked points to `write` (the outbox's append) and unmark them once it
        returned; a `write` or ledger that fails leaves them marked. A `write` that returns
        an int took only that many of the first (the outbox at its cap): the rest stay
        marked. Returns how many were taken.

        `room` (asked only while `at_cap`): how many points the outbox has room for now. The
        offer reads only that many (none, and nothing is read, at 0): reading 5,000 marked
        points to take the few a slow delivery made room for cost ~300 ms an offer. Fewer read
        are the first of the same order, so nothing is reordered; the rest stay marked."""
        cut = False
        if self.at_cap and room is not None:
            fit = room()
            if fit <= 0:
                return 0
            cut = limit is None or fit < limit
            limit = fit if cut else limit
        records = self.take_records(limit)
        self._cut = cut
        taken = len(records)
        if records:
            got = write(records)
            if isinstance(got, int):
                taken = min(got, taken)
        self.sent(taken)
        return taken

    def reconcile(self, journal_active: Mapping[str, bool]) -> list[Condition]:
        """The meter alarm transitions that bring the alarm journal in line with the ledger,
        whose latest row per meter decides (a crash fell between the ledger's commit and
        the journal's). `journal_active`: meter -> its alarm is active in the journal."""
        out: list[Condition] = []
        for meter, spec in self.ledger.specs.items():
            last = self.ledger.last(meter)
            active = last is not None and not last.accepted
            if last is None or active == journal_active.get(meter, False):
                continue
            flags = frozenset(last.flags) & frozenset(ANOMALIES)
            step = Step(False, last.counts, last.volume, flags, last.message, last.limit)
            out.append(condition(spec, last.time, last.reading, step if active else None))
        return out

    def _conditions(self, rows: list[Row]) -> list[Condition]:
        """Alarm transitions: active when a meter's latest row is rejected, cleared when a
        later one is accepted. New rows are judged in order, so each transition keeps its
        time; re-judged rows in the past only matter through the latest row."""
        out: list[Condition] = []
        for row in rows:
            seen = self._seen.get(row.meter)
            if seen is not None and row.key < seen:
                continue
            self._seen[row.meter] = row.key
            active = not row.accepted
            if active == self._alarm.get(row.meter, False):
                continue
            self._alarm[row.meter] = active
            spec = self.ledger.specs[row.meter]
            flags = frozenset(row.flags) & frozenset(ANOMALIES)
            step = Step(False, row.counts, row.volume, flags, row.message, row.limit)
            out.append(condition(spec, row.time, row.reading, step if active else None))
        return out
