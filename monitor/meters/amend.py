"""What an operator writes into the ledger: meter replacements, and corrections of them.

Every record is appended, never rewritten: the first replacement at a time goes into
`replacements` (as ledgers have always held it), and everything after it (a void, a
replacement re-recorded with the right figures, a corrected misread) into the
append-only `amendments` table, with who, why and when. The `readings` rows are the
derived view and are re-judged from the amended time on, so the bill follows; every point
that changes is marked for InfluxDB in the same transaction (`rows.UNSENT`), so the
historian follows too, whichever process made the amendment.

Every request is checked before anything is written (times not before the meter's
first reading and not in the future, figures that agree with the readings around
them) and written in one transaction, so a refused request leaves nothing behind.
"""

from __future__ import annotations

import sqlite3
import time as _time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from monitor import writeonce
from monitor.errors import MeterError
from monitor.meters.rows import NEW_INITIAL, OLD_FINAL, READING, Replacement, Row
from monitor.meters.totalizer import ZERO, MeterSpec, Step, judge
from monitor.model import iso
from monitor.writeonce import WriteKey

REPLACEMENT, VOID, CORRECTION = "replacement", "void-replacement", "correction"
MIN_MS = 0  # 1970-01-01: no meter reading or swap is older


def when(time_ms: int) -> str:
    """A time for a message, even one far outside any calendar a reading can have."""
    try:
        return iso(time_ms / 1000)
    except (ValueError, OverflowError, OSError):
        return f"{time_ms / 1000:g} s since 1970"


@dataclass(frozen=True, slots=True)
class Amendment:
    """One appended record, for `meters show` and the export's flags."""

    meter: str
    time_ms: int
    action: str
    old_final: str
    new_initial: str
    original: str
    reading: str
    recorded_by: str
    why: str
    recorded_at_ms: int

    def describe(self) -> str:
        head = f"{when(self.time_ms)}: "
        if self.action == CORRECTION:
            head += f"reading corrected {self.original} -> {self.reading}"
        elif self.action == VOID:
            head += f"replacement voided (old final {self.old_final}, new initial {self.new_initial})"
        else:
            head += f"replacement re-recorded: old final {self.old_final}, new initial {self.new_initial}"
        why = f": {self.why}" if self.why else ""
        return f"{head} by {self.recorded_by} on {when(self.recorded_at_ms)}{why}"


class Amendments:
    """Mixed into `Ledger`: replacements, voids and corrections."""

    if TYPE_CHECKING:
        path: Path
        specs: dict[str, MeterSpec]
        _db: sqlite3.Connection

        def spec(self, meter: str) -> MeterSpec: ...
        def _tx(self) -> AbstractContextManager[None]: ...
        def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]: ...
        def _select(self, meter: str, where: str, *params: object) -> list[Row]: ...
        def _accepted_before(self, meter: str, key: tuple[int, int]) -> Row | None: ...
        def _judge(
            self,
            meter: str,
            base: Row | None,
            time_ms: int,
            seq: int,
            reading: Decimal,
            last_raw: Decimal | None,
        ) -> Step: ...
        def spec_at(self, meter: str, time_ms: int, seq: int = READING) -> MeterSpec: ...
        def old_side(self, meter: str, time_ms: int) -> tuple[int, int]: ...
        def _write(
            self, meter: str, time_ms: int, seq: int, reading: Decimal, step: Step, mark: bool = True
        ) -> Row: ...
        def _mark(self, meter: str, time_ms: int) -> None: ...
        def _rejudge(self, meter: str, start: tuple[int, int]) -> list[Row]: ...

    # -- checks --------------------------------------------------------------------------

    def _check_time(self, meter: str, time_ms: int, now_ms: int, what: str) -> None:
        """Not in the future, not before the meter's first reading (nor 1970 without one)."""
        if time_ms > now_ms:
            raise MeterError(
                f"meter {meter}: {what} at {when(time_ms)} is in the future (now {when(now_ms)})"
            )
        first = self._query("SELECT min(time_ms) FROM readings WHERE meter=? AND seq=?", (meter, READING))
        first_ms = first[0][0] if first and isinstance(first[0][0], int) else None
        if first_ms is not None and time_ms < first_ms:
            raise MeterError(
                f"meter {meter}: {what} at {when(time_ms)} is before the meter's first reading"
                f" at {when(first_ms)}"
            )
        if time_ms < MIN_MS:
            raise MeterError(f"meter {meter}: {what} at {when(time_ms)} is before 1970")

    @staticmethod
    def _check_text(by: str, why: str) -> None:
        if not by.strip():
            raise MeterError("say who records it (--by)")
        if not why.strip():
            raise MeterError("say why (--why): it is kept in the ledger and shown with the bill")

    # -- replacements -------------------------------------------------------------------

    def active_replacement(self, meter: str, time_ms: int) -> Replacement | None:
        """The replacement in force at exactly this time: the first record, then each
        appended re-record or void in order."""
        got = self._query(
            "SELECT old_final, new_initial, recorded_by, note FROM replacements WHERE meter=? AND time_ms=?",
            (meter, time_ms),
        )
        rep = None
        if got:
            o, n, b, note = got[0]
            rep = Replacement(meter, time_ms, Decimal(str(o)), Decimal(str(n)), str(b), str(note))
        for a in self.amendments(meter, time_ms - 1, time_ms):
            if a.action == VOID:
                rep = None
            elif a.action == REPLACEMENT:
                rep = Replacement(
                    meter, time_ms, Decimal(a.old_final), Decimal(a.new_initial), a.recorded_by, a.why
                )
        return rep

    def record_replacement(
        self, rep: Replacement, now: float | None = None, key: WriteKey | None = None
    ) -> list[Row]:
        """Record a meter swap: consumption across it is (old_final - last reading) +
        (next reading - new_initial). Refuses figures that contradict the readings.
        `key`: the console's request id, kept in the swap's transaction (also when the same
        swap is on record already: that is its answer too)."""
        self.spec(rep.meter)
        now = _time.time() if now is None else now
        if rep.old_final < 0 or rep.new_initial < 0:
            raise MeterError(f"meter {rep.meter}: readings of a replacement must not be negative")
        with self._tx():
            self._check_time(rep.meter, rep.time_ms, round(now * 1000), "a replacement")
            held = self.active_replacement(rep.meter, rep.time_ms)
            if held is not None:
                if (held.old_final, held.new_initial) == (rep.old_final, rep.new_initial):
                    if key is not None:
                        writeonce.claim(self._db, key, now)
                    return []
                raise MeterError(
                    f"meter {rep.meter}: a replacement at {when(rep.time_ms)} is already recorded "
                    f"(old final {held.old_final}, new initial {held.new_initial}); void it first"
                )
            base = self._accepted_before(rep.meter, self.old_side(rep.meter, rep.time_ms))
            if base is not None:
                step = self._judge(rep.meter, base, rep.time_ms, OLD_FINAL, rep.old_final, None)
                if not step.accepted:
                    raise MeterError(
                        f"meter {rep.meter}: old final {rep.old_final} does not follow the last accepted"
                        f" reading {base.reading} at {iso(base.time)}: {step.message}"
                    )
            after = self._select(
                rep.meter, "AND time_ms > ? AND seq = 0 ORDER BY time_ms LIMIT 1", rep.time_ms
            )
            if after:
                nxt = after[0]
                spec = self.spec_at(rep.meter, nxt.time_ms)
                step = judge(spec, rep.new_initial, (nxt.time_ms - rep.time_ms) / 1000, nxt.reading)
                if not step.accepted:
                    raise MeterError(
                        f"meter {rep.meter}: new initial {rep.new_initial} does not lead to the next reading "
                        f"{nxt.reading} at {iso(nxt.time)}: {step.message}"
                    )
            first = not self._query(
                "SELECT 1 FROM replacements WHERE meter=? AND time_ms=?", (rep.meter, rep.time_ms)
            )
            if first:
                self._db.execute(
                    "INSERT INTO replacements VALUES (?, ?, ?, ?, ?, ?)",
                    (rep.meter, rep.time_ms, str(rep.old_final), str(rep.new_initial), rep.recorded_by,
                     rep.note),
                )  # fmt: skip
            else:  # the first one there was voided: this one is appended
                self._append(rep.meter, rep.time_ms, REPLACEMENT, rep.recorded_by, rep.note, now,
                             old_final=str(rep.old_final), new_initial=str(rep.new_initial))  # fmt: skip
            none = Step(True, ZERO, ZERO, frozenset())
            self._write(rep.meter, rep.time_ms, OLD_FINAL, rep.old_final, none)
            self._write(rep.meter, rep.time_ms, NEW_INITIAL, rep.new_initial, none)
            if key is not None:
                writeonce.claim(self._db, key, now)
            return self._rejudge(rep.meter, (rep.time_ms, OLD_FINAL))

    def void_replacement(self, meter: str, time_ms: int, by: str, why: str, now: float) -> list[Row]:
        """Undo a wrong replacement: appended as a void; the readings after it are judged
        as if it had never been recorded (so a real swap shows as `backwards` again)."""
        self.spec(meter)
        self._check_text(by, why)
        with self._tx():
            held = self.active_replacement(meter, time_ms)
            if held is None:
                times = ", ".join(when(r.time_ms) for r in self.replacements(meter)) or "none"
                raise MeterError(
                    f"meter {meter}: no replacement in force at {when(time_ms)} (recorded: {times})"
                )
            self._append(meter, time_ms, VOID, by, why, now,
                         old_final=str(held.old_final), new_initial=str(held.new_initial))  # fmt: skip
            self._db.execute(
                "DELETE FROM readings WHERE meter=? AND time_ms=? AND seq IN (?, ?)",
                (meter, time_ms, OLD_FINAL, NEW_INITIAL),
            )
            self._mark(meter, time_ms)  # InfluxDB holds the swap's point: overwrite it
            return self._rejudge(meter, (time_ms, OLD_FINAL))

    def replacements(self, meter: str | None = None) -> list[Replacement]:
        """The replacements in force (voided ones left out), in meter and time order."""
        keys = self._query(
            "SELECT meter, time_ms FROM replacements"
            + (" WHERE meter=?" if meter else "")
            + " UNION SELECT meter, time_ms FROM amendments WHERE action=?"
            + (" AND meter=?" if meter else "")
            + " ORDER BY 1, 2",
            (meter, REPLACEMENT, meter) if meter else (REPLACEMENT,),
        )
        out = []
        for m, t in keys:
            rep = self.active_replacement(str(m), int(str(t)))
            if rep is not None:
                out.append(rep)
        return out

    # -- corrections ---------------------------------------------------------------------

    def correct(self, meter: str, time_ms: int, reading: Decimal, by: str, why: str, now: float) -> list[Row]:
        """Correct a misread: the reading at `time_ms` becomes `reading` (appended with the
        original), and the meter is re-judged from there."""
        self.spec(meter)
        spec = self.spec_at(meter, time_ms)
        self._check_text(by, why)
        if not reading.is_finite() or reading < 0:
            raise MeterError(f"meter {meter}: corrected reading {reading} must be a number >= 0")
        if spec.digits and reading >= Decimal(10) ** spec.digits:
            raise MeterError(f"meter {meter}: corrected reading {reading} does not fit {spec.digits} digits")
        with self._tx():
            held = self._select(meter, "AND time_ms = ? AND seq = ?", time_ms, READING)
            if not held:
                raise MeterError(
                    f"meter {meter}: no reading at {when(time_ms)} to correct"
                    " (give the reading's exact time, as `monitor meters show` prints it)"
                )
            if held[0].reading == reading:
                return []
            self._append(meter, time_ms, CORRECTION, by, why, now,
                         original=str(held[0].reading), reading=str(reading))  # fmt: skip
            self._write(meter, time_ms, READING, reading, Step(True, ZERO, ZERO, frozenset()))
            changed = self._rejudge(meter, (time_ms, READING))
            if not any(r.key == (time_ms, READING) for r in changed):  # judged as the placeholder was
                changed[:0] = self._select(meter, "AND time_ms = ? AND seq = ?", time_ms, READING)
            return changed

    def corrected_originals(self, meter: str, time_ms: int) -> set[Decimal]:
        """Readings at this time that a correction replaced: offered again (a replay of
        the misread), they are duplicates, not conflicts."""
        got = self._query(
            "SELECT original FROM amendments WHERE meter=? AND time_ms=? AND action=?",
            (meter, time_ms, CORRECTION),
        )
        return {Decimal(str(o)) for (o,) in got}

    # -- the record ----------------------------------------------------------------------

    def _append(self, meter: str, time_ms: int, action: str, by: str, why: str, now: float,
                **figures: str) -> None:  # fmt: skip
        self._db.execute(
            "INSERT INTO amendments (meter, time_ms, action, old_final, new_initial, original, reading,"
            " recorded_by, why, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (meter, time_ms, action, figures.get("old_final", ""), figures.get("new_initial", ""),
             figures.get("original", ""), figures.get("reading", ""), by, why, round(now * 1000)),
        )  # fmt: skip

    def amendments(
        self, meter: str, after_ms: int | None = None, until_ms: int | None = None
    ) -> list[Amendment]:
        """Appended records with after_ms < time_ms <= until_ms, in the order they were made."""
        lo = -(2**62) if after_ms is None else after_ms
        hi = 2**62 if until_ms is None else until_ms
        got = self._query(
            "SELECT meter, time_ms, action, old_final, new_initial, original, reading, recorded_by, why,"
            " recorded_at FROM amendments WHERE meter=? AND time_ms > ? AND time_ms <= ? ORDER BY id",
            (meter, lo, hi),
        )
        return [
            Amendment(str(m), int(str(t)), str(a), str(o), str(n), str(orig), str(r), str(b), str(w),
                      int(str(at)))
            for m, t, a, o, n, orig, r, b, w, at in got
        ]  # fmt: skip

    def amendment_flags(self, meter: str, after_ms: int, until_ms: int) -> set[str]:
        """Export flags for a period: `corrected`, `voided replacement`."""
        names = {CORRECTION: "corrected", VOID: "voided replacement"}
        return {names[a.action] for a in self.amendments(meter, after_ms, until_ms) if a.action in names}


def iter_history(
    ledger: Amendments, meter: str, after_ms: int | None = None, until_ms: int | None = None
) -> Iterator[str]:
    """`meters show`'s lines for the replacements and amendments of one meter in a period."""
    lo = -(2**62) if after_ms is None else after_ms
    hi = 2**62 if until_ms is None else until_ms
    for rep in ledger.replacements(meter):
        if lo < rep.time_ms <= hi:
            who = f" by {rep.recorded_by}" if rep.recorded_by else ""
            yield (
                f"replaced at {when(rep.time_ms)}: old final {rep.old_final},"
                f" new initial {rep.new_initial}{who}"
            )
    for a in ledger.amendments(meter, after_ms, until_ms):
        yield a.describe()
