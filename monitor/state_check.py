"""The start-up verdict on the state directory: every SQLite file gets `PRAGMA quick_check`.

Two kinds of file, two answers:

- Records (the meter ledger, the alarm journal) hold money and compliance history
  that exists nowhere else. A damaged one stops the daemon (exit 2) with a line naming
  the file and what to do: restore it from the backup (docs/operator-guide.md, State files). Writing
  on into a damaged ledger would bill from it.
- Copies (the outbox, the series store) hold data that is also elsewhere or can be
  lost without harm to the record: the outbox's pending points (a gap in InfluxDB),
  the console's sparklines. A damaged one is renamed aside (`<name>.damaged-<UTC time>`,
  with its -wal and -shm) for inspection, a fresh one is started, and a `state` alarm
  (activated and returned at once, so it waits for an acknowledgement) tells the operator.

A file another process holds locked past the busy wait (`monitor outbox drain`, a
backup tool) is neither: it is sound as far as anyone knows, so it is never moved
aside; the daemon refuses to start (exit 2) with a line naming the file and the
process holding the lock.

Called by `monitor run` before the daemon opens anything; `meters list` uses
`quick_check` too, so it never reports "ok" for a damaged ledger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from monitor.alarms.manager import journal_path
from monitor.config import Config
from monitor.errors import StateError
from monitor.meters.book import ledger_path
from monitor.model import Condition, ConditionState, Rule
from monitor.sinks.pipeline import outbox_path, store_path
from monitor.sqlite import StateLockedError, quick_check, secure

log = logging.getLogger(__name__)

STATE_CITATION = "station-monitor state directory"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One file's start-up check: `problem` None means sound (or not created yet)."""

    name: str
    path: Path
    record: bool  # True: ledger or journal (stop when damaged); False: set aside
    problem: str | None = None
    moved_to: Path | None = None
    locked: str | None = None  # held locked by another process: not checked, not moved

    @property
    def sensor(self) -> str:
        """The pseudo-sensor a `state` alarm names: `state.outbox`, `state.series`."""
        return "state." + self.path.name.split(".")[0]


def state_files(config: Config) -> list[tuple[str, Path, bool]]:
    return [
        ("meter ledger", ledger_path(config), True),
        ("alarm journal", journal_path(config), True),
        ("outbox", outbox_path(config), False),
        ("series store", store_path(config), False),
    ]


def check_state(config: Config, now: float | None = None, busy_wait: float = 30.0) -> list[Verdict]:
    """Check every state file; set damaged copies aside. Never raises for damage or a lock;
    a file locked longer than `busy_wait` seconds is left alone with `locked` set."""
    state = config.state_dir
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    for existing in state.iterdir():  # checkpoint and databases: the daemon's user only
        with contextlib.suppress(OSError):
            secure(existing)
    verdicts = []
    for name, path, record in state_files(config):
        try:
            problem = quick_check(path, timeout=busy_wait)
        except StateLockedError as exc:
            verdicts.append(Verdict(name, path, record, locked=str(exc)))
            continue
        moved = None
        if problem is not None and not record:
            moved = set_aside(path, now if now is not None else time.time())
            log.error("%s %s is damaged (%s); moved to %s and started afresh", name, path, problem, moved)
        verdicts.append(Verdict(name, path, record, problem, moved))
    return verdicts


def set_aside(path: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path.with_name(path.name + suffix), target.with_name(target.name + suffix))
    return target


def require_sound_records(verdicts: list[Verdict]) -> None:
    """StateError naming each damaged record, or any file another process holds locked,
    and what to do; the daemon must not start."""
    bad = [
        f"{v.name} {v.path} is damaged ({v.problem}): stop here, restore it from the backup "
        f"(docs/operator-guide.md, State files) and start again; the daemon does not write into it"
        for v in verdicts
        if v.record and v.problem is not None
    ]
    bad += [f"{v.name} {v.locked}" for v in verdicts if v.locked is not None]
    if bad:
        raise StateError("; ".join(bad))


def set_aside_alarms(verdicts: list[Verdict], now: float) -> list[Condition]:
    """A `state` alarm per copy set aside: raised and returned at once, left for acknowledgement."""
    out: list[Condition] = []
    for v in verdicts:
        if v.moved_to is None:
            continue
        message = f"{v.name} {v.path} was damaged ({v.problem}); moved to {v.moved_to.name}, started afresh"
        for state in (ConditionState.ACTIVE, ConditionState.CLEARED):
            out.append(
                Condition(
                    time=now,
                    sensor=v.sensor,
                    rule=Rule.STATE,
                    state=state,
                    value=1.0 if state is ConditionState.ACTIVE else 0.0,
                    limit=None,
                    citation=STATE_CITATION,
                    message=message,
                    extra={"file": str(v.path), "moved_to": str(v.moved_to)},
                )
            )
    return out


__all__ = ["Verdict", "check_state", "require_sound_records", "set_aside", "set_aside_alarms", "state_files"]
