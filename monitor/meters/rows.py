"""Ledger rows and the SQLite schema that holds them."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from monitor import writeonce
from monitor.model import iso, step_text

READING, OLD_FINAL, NEW_INITIAL = 0, 1, 2  # `seq` of rows at the same time, in this order
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meters (meter TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS readings (
    meter    TEXT    NOT NULL,
    time_ms  INTEGER NOT NULL,
    seq      INTEGER NOT NULL,   -- 0 reading, 1 old meter's final, 2 new meter's initial
    reading  TEXT    NOT NULL,   -- register counts, exact decimal text
    accepted INTEGER NOT NULL,
    counts   TEXT    NOT NULL,   -- register delta after rollover
    volume   TEXT    NOT NULL,   -- counts x multiplier, in the meter's unit
    flags    TEXT    NOT NULL,   -- comma-separated: first, rollover, replacement, backwards, ...
    message  TEXT    NOT NULL,
    lim      TEXT    NOT NULL,   -- the most max_rate allowed, for a jump or drop ('' if none)
    PRIMARY KEY (meter, time_ms, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replacements (
    meter       TEXT    NOT NULL,
    time_ms     INTEGER NOT NULL,
    old_final   TEXT    NOT NULL,
    new_initial TEXT    NOT NULL,
    recorded_by TEXT    NOT NULL,
    note        TEXT    NOT NULL,
    PRIMARY KEY (meter, time_ms)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS amendments (  -- append-only; added in place to older ledgers
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    meter       TEXT    NOT NULL,
    time_ms     INTEGER NOT NULL,   -- the reading or replacement it amends
    action      TEXT    NOT NULL,   -- replacement (re-recorded), void-replacement, correction
    old_final   TEXT    NOT NULL,   -- replacement figures ('' for a correction)
    new_initial TEXT    NOT NULL,
    original    TEXT    NOT NULL,   -- correction: the reading it replaced, and the corrected one
    reading     TEXT    NOT NULL,
    recorded_by TEXT    NOT NULL,
    why         TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL    -- ms, when the operator recorded it
);
CREATE INDEX IF NOT EXISTS amendments_by_meter ON amendments (meter, time_ms);
CREATE TABLE IF NOT EXISTS conflicts (
    meter   TEXT    NOT NULL,
    time_ms INTEGER NOT NULL,
    held    TEXT    NOT NULL,
    offered TEXT    NOT NULL,
    PRIMARY KEY (meter, time_ms, offered)
) WITHOUT ROWID;
"""
# Schema 2: each meter's settings (unit, register_digits, multiplier, max_rate) as periods
# in force from a time on. Append-only: a period corrected from the first reading is a
# newer row at the same `since_ms`; the latest row (highest id) per (meter, since_ms) is in
# force. A ledger from before keeps the settings it was judged with as its first period.
FIRST_MS = -(2**62)  # the first period's start: from the meter's first reading, whenever
SETTINGS = f"""
CREATE TABLE IF NOT EXISTS settings (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    meter       TEXT    NOT NULL,
    since_ms    INTEGER NOT NULL,   -- readings at or after this time use it; {FIRST_MS}: the first
    spec        TEXT    NOT NULL,   -- unit|register_digits|multiplier|max_rate
    source      TEXT    NOT NULL,   -- migrated, config (the time it was opened), settings_since, corrected
    recorded_at INTEGER NOT NULL    -- ms, the gateway's time when the ledger took it (0: migrated)
);
CREATE INDEX IF NOT EXISTS settings_by_meter ON settings (meter, since_ms);
INSERT INTO settings (meter, since_ms, spec, source, recorded_at)
    SELECT meter, {FIRST_MS},
           CASE WHEN instr(spec, '|rules ') > 0
                THEN substr(spec, 1, instr(spec, '|rules ') - 1) ELSE spec END,
           'migrated', 0
    FROM meters ORDER BY meter;
UPDATE meta SET value = '2' WHERE key = 'schema';
"""
# Schema 3: the ledger points the InfluxDB copy may not hold as they are now (`unsent`). Every
# row written (a reading, a re-judged row, a replacement, a correction) and every voided swap
# marks its point (meter, time) in the same transaction as the row; the mark is cleared only
# once the outbox holds the point (`MeterBook.send`), so whichever process amends the ledger
# and wherever a crash falls, the daemon sends it. A point is the meter's series at a time
# (both sides of a swap are one point). The marks of the settings follow-cursor that came
# before (`meta` "influx copy settings id: <meter>") become marks of the rows it had not sent.
UNSENT = """
CREATE TABLE IF NOT EXISTS unsent (
    meter   TEXT    NOT NULL,
    time_ms INTEGER NOT NULL,
    PRIMARY KEY (meter, time_ms)
) WITHOUT ROWID;
INSERT OR IGNORE INTO unsent (meter, time_ms)
    SELECT r.meter, r.time_ms FROM readings r
    JOIN (SELECT s.meter AS meter, min(s.since_ms) AS since FROM settings s
          JOIN meta m ON m.key = 'influx copy settings id: ' || s.meter
          WHERE s.id > CAST(m.value AS INTEGER) GROUP BY s.meter) c
      ON c.meter = r.meter AND r.time_ms >= c.since;
DELETE FROM meta WHERE key LIKE 'influx copy settings id: %';
UPDATE meta SET value = '3' WHERE key = 'schema';
"""
# Schema 4: the gateway clock's steps back the ledger moved its rows across (audit record;
# `Ledger.clock_step`): one row per meter and step, shown in `meters show` and the export.
CLOCK_STEPS = """
CREATE TABLE IF NOT EXISTS clock_steps (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    meter      TEXT    NOT NULL,
    noticed_ms INTEGER NOT NULL,   -- the new clock's time when the step was noticed
    step_ms    INTEGER NOT NULL,   -- < 0: back
    rows       INTEGER NOT NULL,   -- rows moved by the step
    first_ms   INTEGER NOT NULL,   -- the first and last moved row's original (old clock's) stamp
    last_ms    INTEGER NOT NULL,
    spread     INTEGER NOT NULL    -- 1: no gap of the step within `REACH`: spread, not moved alike
);
CREATE INDEX IF NOT EXISTS clock_steps_by_meter ON clock_steps (meter, noticed_ms);
UPDATE meta SET value = '4' WHERE key = 'schema';
"""
# Schema 5: a step found at start (`Ledger.clock_step(found=True)`): the ledger's rows were
# ahead of the clock when the daemon started (a move lost to a restart, a ledger from before).
CLOCK_STEPS_FOUND = """
ALTER TABLE clock_steps ADD COLUMN found INTEGER NOT NULL DEFAULT 0;  -- 1: found at start
UPDATE meta SET value = '5' WHERE key = 'schema';
"""
# Schema 6: the steps by their moved rows' last old stamp: a take finds the steps whose old
# stamps its rows may share (`Ledger.stepped_spans`) without reading every step of the meter.
CLOCK_STEPS_BY_LAST = """
CREATE INDEX IF NOT EXISTS clock_steps_by_last ON clock_steps (meter, last_ms);
UPDATE meta SET value = '6' WHERE key = 'schema';
"""
# Schema 7: the console's request ids (`monitor/writeonce.py`), kept in the transaction of
# the replacement each records (`POST /api/meters/{meter}/replacements`).
CONSOLE_WRITES = (
    writeonce.TABLE
    + """
UPDATE meta SET value = '7' WHERE key = 'schema';
"""
)
SCHEMA_VERSION = "7"


def to_ms(t: float) -> int:
    return round(t * 1000)


@dataclass(frozen=True, slots=True)
class Row:
    """One ledger row; `volume` is the billed delta (0 when rejected) in `unit`."""

    meter: str
    time_ms: int
    seq: int
    reading: Decimal
    accepted: bool
    counts: Decimal
    volume: Decimal
    flags: tuple[str, ...]
    message: str
    limit: Decimal | None = None

    @property
    def time(self) -> float:
        return self.time_ms / 1000

    @property
    def key(self) -> tuple[int, int]:
        return (self.time_ms, self.seq)

    def describe(self) -> str:
        what = {READING: "reading", OLD_FINAL: "old final", NEW_INITIAL: "new initial"}[self.seq]
        verdict = "accepted" if self.accepted else "REJECTED"
        flags = f" [{','.join(self.flags)}]" if self.flags else ""
        return f"{iso(self.time)}  {what:<11} {self.reading:>14}  +{self.volume:<12} {verdict}{flags}"


@dataclass(frozen=True, slots=True)
class ClockStep:
    """One step back of the gateway clock across which a meter's rows were moved (audit)."""

    meter: str
    noticed_ms: int  # the new clock's time when the step was noticed
    step_ms: int
    rows: int
    first_ms: int  # the moved rows' first and last original stamps
    last_ms: int
    spread: bool = False  # spread over the reach (no gap of the step in it), not each moved by the step
    # Found at start: the meter's rows were ahead of the clock when the daemon started; the step
    # is measured from its newest row (the real one, and how long the daemon was down, unknown).
    found: bool = False

    def describe(self) -> str:
        """What the export's flags and `meters show` say."""
        by, at, s = step_text(self.step_ms / 1000), iso(self.noticed_ms / 1000), "s" * (self.rows != 1)
        over = step_text((self.last_ms - self.first_ms) / 1000)
        spread = f" (spread over the {over} before: no gap of the step in it)" if self.spread else ""
        if self.found:
            when = f"by at least {by} (found at start {at}: the ledger's rows were ahead of the clock)"
        else:
            when = f"by {by} at {at}"
        return f"gateway clock stepped back {when}: {self.rows} reading{s} re-stamped{spread}"


def steps_summary(steps: list[ClockStep]) -> str:
    """One note for many steps (a time source stepping the clock back every minute): the
    export's flags cell says how many, when, by how much and how many readings, once."""
    sizes = sorted({abs(cs.step_ms) for cs in steps})
    by = (
        f"{step_text(sizes[0] / 1000)} each"
        if len(sizes) == 1
        else (f"{step_text(sizes[0] / 1000)} to {step_text(sizes[-1] / 1000)}")
    )
    first, last = iso(steps[0].noticed_ms / 1000), iso(steps[-1].noticed_ms / 1000)
    rows = sum(cs.rows for cs in steps)
    return (
        f"gateway clock stepped back {len(steps)} times from {first} to {last} (by {by}): {rows}"
        " readings re-stamped (each listed by `monitor meters show`)"
    )


@dataclass(frozen=True, slots=True)
class Replacement:
    meter: str
    time_ms: int
    old_final: Decimal
    new_initial: Decimal
    recorded_by: str = ""
    note: str = ""
