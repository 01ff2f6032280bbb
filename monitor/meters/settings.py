"""A meter's settings periods, mixed into `Ledger`: a changed unit, register_digits,
multiplier or max_rate takes effect from a time, not retroactively.

The periods are held in table `settings` (`rows.SETTINGS`), append-only. A change takes
effect from `settings_since` in the config, else from the gateway's time when the ledger is
first opened with it (or just after the latest reading held, if that is later): readings
before it keep the settings of their time, a reading at or after it is judged with the new
ones, and the first such reading is a new baseline unless only max_rate changed. The rows a
change re-judges are marked for InfluxDB in the same transaction (`rows.UNSENT`), so they
are sent again whoever recorded the change.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import sqlite3
from collections.abc import Mapping
from contextlib import AbstractContextManager
from decimal import Decimal
from typing import TYPE_CHECKING

from monitor.errors import MeterError
from monitor.meters.amend import when
from monitor.meters.rows import FIRST_MS, OLD_FINAL, READING, Row, to_ms
from monitor.meters.totalizer import RULES, MeterSpec

log = logging.getLogger("monitor.meters.ledger")  # the name operators' log filters know


def settings_text(spec: MeterSpec) -> str:
    """The settings a meter's rows are judged with, as the ledger keeps them."""
    return f"{spec.unit}|{spec.digits}|{spec.multiplier}|{spec.max_rate}"


def _from_text(current: MeterSpec, text: str) -> MeterSpec:
    """The spec of a held period: its settings, the meter's current account."""
    unit, digits, multiplier, max_rate = text.split("|")
    return dataclasses.replace(
        current,
        unit=unit,
        digits=None if digits == "None" else int(digits),
        multiplier=Decimal(multiplier),
        max_rate=None if max_rate == "None" else Decimal(max_rate),
        since=None,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Period:
    """One settings period of a meter: in force for readings at or after `since_ms`
    (the first period: `FIRST_MS`, from the first reading) until the next period."""

    meter: str
    since_ms: int
    spec: MeterSpec
    source: str
    recorded_at_ms: int
    superseded: bool = False  # a first period corrected later (kept for `meters show`)

    @property
    def first(self) -> bool:
        return self.since_ms == FIRST_MS

    def describe(self) -> str:
        s = self.spec
        start = "from the first reading" if self.first else f"from {when(self.since_ms)}"
        by = {
            "migrated": "held before settings periods",
            "config": "config without settings_since, from when it was first opened",
            "settings_since": "config settings_since",
            "corrected": "config, corrected from the first reading",
        }
        # A new meter's first settings were recorded whenever it was first configured: not news.
        plain = self.first and self.source in ("config", "migrated")
        recorded = "" if plain else f", recorded {when(self.recorded_at_ms)}"
        head = "superseded: " if self.superseded else ""
        return (f"{head}{start}: unit {s.unit}, register_digits {s.digits}, multiplier {s.multiplier},"
                f" max_rate {s.max_rate} ({by.get(self.source, self.source)}{recorded})")  # fmt: skip


def change(old: MeterSpec, new: MeterSpec) -> str:
    """What changed between two settings, in the config's words: `multiplier 1 -> 10`."""
    names = (("unit", "unit"), ("register_digits", "digits"), ("multiplier", "multiplier"),
             ("max_rate", "max_rate"))  # fmt: skip
    parts = [
        f"{key} {getattr(old, attr)} -> {getattr(new, attr)}"
        for key, attr in names
        if getattr(old, attr) != getattr(new, attr)
    ]
    return ", ".join(parts).replace("None", "none")


class SettingsPeriods:
    """Mixed into `Ledger`: the settings periods of its meters."""

    if TYPE_CHECKING:
        specs: dict[str, MeterSpec]
        _db: sqlite3.Connection
        _periods: dict[str, tuple[list[int], list[Period]]]

        def spec(self, meter: str) -> MeterSpec: ...
        def refresh(self) -> None: ...
        def _tx(self) -> AbstractContextManager[None]: ...
        def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]: ...
        def _rejudge(self, meter: str, start: tuple[int, int]) -> list[Row]: ...

    def _check_spec(self, meter: str, spec: MeterSpec, now_ms: int) -> None:
        """Bring the meter's settings periods in line with its config. Changed settings take
        effect from `settings_since` (else `now_ms`) and re-judge the rows from there; at or
        before the first reading they correct the whole history. Changed checks
        (`totalizer.RULES`) re-judge every row: rows are a function of both."""
        config = settings_text(spec)
        text = f"{config}|rules {RULES}"
        got = self._db.execute("SELECT spec FROM meters WHERE meter=?", (meter,)).fetchone()
        periods = self.periods(meter)
        start: tuple[int, int] | None = None
        if not periods:  # a new meter (or one configured before any reading was held)
            self._add_period(meter, FIRST_MS, config, "config", now_ms)
        elif settings_text(periods[-1].spec) != config:
            since = self._settings_start(meter, spec, periods, now_ms)
            old = periods[-1].spec
            if since is None:
                # "corrected" re-judged rows (their quarters are flagged); with none held yet, the
                # settings are simply replaced before any figure was made with them.
                held = self._db.execute("SELECT 1 FROM readings WHERE meter=? LIMIT 1", (meter,)).fetchone()
                self._add_period(meter, FIRST_MS, config, "corrected" if held else "config", now_ms)
                start = (FIRST_MS, 0)
                log.warning(
                    "meter %s: settings corrected from its first reading (%s); re-judging its whole history",
                    meter, change(old, spec),
                )  # fmt: skip
            else:
                source = "config" if spec.since is None else "settings_since"
                self._add_period(meter, since, config, source, now_ms)
                start = (since, READING)
                log.warning(
                    "meter %s: settings changed (%s) from %s%s; readings from then on are re-judged,"
                    " earlier ones keep the settings of their time",
                    meter, change(old, spec), when(since),
                    " (settings_since)" if spec.since is not None
                    else " (the time the ledger was opened)" if since == now_ms
                    else " (just after the latest reading held: the clock is behind it)",
                )  # fmt: skip
        if got is not None and str(got[0]).partition("|rules ")[2] != str(RULES):
            log.warning(
                "meter %s: the meter checks changed since its rows were judged; re-judging them", meter
            )
            start = (FIRST_MS, 0)
        if got is None or got[0] != text:
            self._db.execute("INSERT OR REPLACE INTO meters VALUES (?, ?)", (meter, text))
        if start is not None:
            self._rejudge(meter, start)  # the changed rows are marked for InfluxDB

    def _settings_start(self, meter: str, spec: MeterSpec, periods: list[Period], now_ms: int) -> int | None:
        """When changed settings take effect; None: from the first reading (the whole history)."""
        key = "settings_since"
        if spec.since is None:
            since, what = now_ms, f"the time the ledger is opened ({when(now_ms)})"
            latest = self._db.execute("SELECT max(time_ms) FROM readings WHERE meter=?", (meter,)).fetchone()
            if latest and isinstance(latest[0], int) and latest[0] >= now_ms:
                # The gateway's clock is behind readings held already (set back, or a replay of
                # later history): those were recorded under the old settings and keep them.
                since = latest[0] + 1
                what = f"just after the latest reading held ({when(latest[0])}; the clock: {when(now_ms)})"
        else:
            since, what = to_ms(spec.since), f"{key} {when(to_ms(spec.since))}"
            if since > now_ms:
                raise MeterError(f"meter {meter}: {what} is in the future (now {when(now_ms)})")
        got = self._db.execute(
            "SELECT min(time_ms) FROM readings WHERE meter=? AND seq=?", (meter, READING)
        ).fetchone()
        first_ms = got[0] if got and isinstance(got[0], int) else None
        if len(periods) == 1 and (first_ms is None or since <= first_ms):
            return None
        if since <= periods[-1].since_ms:
            raise MeterError(
                f"meter {meter}: settings changed ({change(periods[-1].spec, spec)}) from {what}, which is"
                f" not after the settings in force since {when(periods[-1].since_ms)}; give {key} after it"
                " (periods already recorded are not moved: `monitor meters show` lists them)"
            )
        return since

    def data_version(self) -> int:
        """Changes when another connection commits (a `monitor meters` command)."""
        return int(str(self._query("PRAGMA data_version")[0][0]))

    def settings_refusals(self, specs: Mapping[str, MeterSpec], now: float) -> list[str]:
        """What opening the ledger with `specs` would refuse (a settings_since in the future or
        not after the latest period), writing nothing: a reload checks it before it stops the
        running daemon, so a refused change leaves that daemon running. It reads the periods
        the ledger holds: those of a meter the running config dropped (added back now), and
        those another process (`monitor meters` with an edited config) recorded meanwhile."""
        out = []
        self.refresh()
        for meter, spec in specs.items():
            periods = self.periods(meter)
            if periods and settings_text(periods[-1].spec) != settings_text(spec):
                try:
                    self._settings_start(meter, spec, periods, to_ms(now))
                except MeterError as exc:
                    out.append(str(exc))
        return out

    def _add_period(self, meter: str, since_ms: int, text: str, source: str, now_ms: int) -> None:
        self._db.execute(
            "INSERT INTO settings (meter, since_ms, spec, source, recorded_at) VALUES (?, ?, ?, ?, ?)",
            (meter, since_ms, text, source, now_ms),
        )
        self._periods.pop(meter, None)

    def periods(self, meter: str, superseded: bool = False) -> list[Period]:
        """The meter's settings periods in force, oldest first (with `superseded`, the
        corrected ones too, in the order they were recorded)."""
        if not superseded and meter in self._periods:
            return self._periods[meter][1]
        current = self.spec(meter) if meter in self.specs else None
        rows = self._query(
            "SELECT id, since_ms, spec, source, recorded_at FROM settings WHERE meter=?"
            " ORDER BY since_ms, id",
            (meter,),
        )
        latest: dict[int, int] = {}
        for ident, since, *_ in rows:
            latest[int(str(since))] = int(str(ident))
        out = []
        for ident, since, text, source, at in rows:
            gone = latest[int(str(since))] != ident
            if gone and not superseded:
                continue
            base = current or MeterSpec(meter, "ft3", None, Decimal(1), None)
            out.append(
                Period(meter, int(str(since)), _from_text(base, str(text)), str(source), int(str(at)), gone)
            )
        if not superseded:
            self._periods[meter] = ([p.since_ms for p in out], out)
        return out

    def period_at(self, meter: str, time_ms: int, seq: int = READING) -> Period:
        """The settings period a row is judged by: the period in force at its time; an old
        meter's final reading at a change's very time belongs to the settings before it."""
        if meter not in self._periods:
            self.periods(meter)
        starts, periods = self._periods[meter]
        at = time_ms - 1 if seq == OLD_FINAL else time_ms
        i = bisect.bisect_right(starts, at) - 1
        return periods[max(i, 0)]

    def old_side(self, meter: str, time_ms: int) -> tuple[int, int]:
        """Where the old meter's final reading of a swap at `time_ms` is judged from: after
        a reading at the same time, unless the settings change at that very time (a reading
        stamped at a change belongs to the new settings, so it is no base for the old meter)."""
        changes = self.period_at(meter, time_ms).since_ms == time_ms
        return (time_ms, READING) if changes else (time_ms, OLD_FINAL)

    def spec_at(self, meter: str, time_ms: int, seq: int = READING) -> MeterSpec:
        return self.period_at(meter, time_ms, seq).spec

    def settings_changes(self, meter: str, after_ms: int, until_ms: int) -> list[tuple[Period, Period]]:
        """(before, after) for each change that took effect in after_ms < time <= until_ms."""
        periods = self.periods(meter)
        return [(a, b) for a, b in itertools.pairwise(periods) if after_ms < b.since_ms <= until_ms]

    def _counts_changed(self, meter: str, base: Row, period: Period) -> bool:
        """Whether what a count is worth (unit, register_digits, multiplier) changed in any
        period from the base's to `period`: a change of max_rate alone is a new bound for the
        checks, not a new register, so the movement across it is billed as ever."""
        periods = self._periods[meter][1]
        lo = self.period_at(meter, base.time_ms, base.seq)
        between = periods[periods.index(lo) : periods.index(period) + 1]
        return len({(p.spec.unit, p.spec.digits, p.spec.multiplier) for p in between}) > 1
