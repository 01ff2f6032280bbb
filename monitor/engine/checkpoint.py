"""Baselines and rule state on disk, so a restart does not need a new warm-up.

One `.npz` file: the ring arrays, plus a JSON document with the sensor set it
belongs to and each sensor's timers. Written to a temporary file, flushed to disk
and renamed over the old one, so a crash leaves either the old or the new
checkpoint, never half of one. On restore a file that is unreadable, corrupt, or
from another format version raises `StateError` and changes nothing; one from a
different sensor set does too, unless the caller asks for a partial restore (a
reload or restart with a changed config), which restores every sensor whose id,
kind, unit and window still match and leaves the others to warm up.
"""

from __future__ import annotations

import json
import logging
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from monitor.durable import replace_file
from monitor.engine.checkpoint_entry import UnsoundEntryError, check_entry, delivery, frozen_run
from monitor.engine.engine import Engine
from monitor.engine.state import SensorState
from monitor.errors import StateError
from monitor.model import Quality

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "engine-checkpoint.npz"  # under the config's state_dir
FORMAT = "station-monitor engine checkpoint"
# Version 2: per-bucket sums in exact quanta (version 1 kept float running totals,
# which a single absurd reading could poison for good; such a file is refused and
# the baselines warm up again).
VERSION = 2
_BASE = ("bucket", "cur_sum", "cur_count", "win_sum", "win_count")
_SENSOR = (
    "last_time",
    "value",
    "fresh",
    "stale_active",
    "last_good",
    "bad_episode",
    "ooo_episode",
    "bad_since",
    "bad_active",
)
_SLUG = ("active", "run_start", "prev_t", "warm_since", "last_mean")
# A device-stamped sensor's quickest delivery (monitor/engine/arrival.py), so a restart does
# not take the first store-and-forward backlog for fresh. Optional: a file without it (an
# older release's) learns the delivery again; an older release ignores the key.
_DEVICE = ("lag", "lag_at")
_LIMIT = ("active", "a_start", "b_start")
# The frozen-value rule's run (monitor/engine/frozen.py), for a sensor with `frozen_after`.
# A checkpoint without it (an older release's, or the rule just configured) starts the run
# at the next reading; an older release ignores the key.
_FROZEN = ("ref", "since", "last", "active")


def signature(engine: Engine) -> list[list[object]]:
    """What a checkpoint must match: each sensor's id, kind, unit and baseline geometry."""
    b = engine.baselines
    out: list[list[object]] = []
    for st in engine.sensor_states():
        geo: list[object] = [b.width[st.row], b.size[st.row], b.quantum[st.row]] if st.row >= 0 else []
        window = st.slug.window if st.slug is not None else None
        out.append([st.sensor, str(st.rules.kind), st.rules.unit, window, *geo])
    return out


def _sensor_state(engine: Engine, st: SensorState) -> dict[str, Any]:
    doc: dict[str, Any] = {k: getattr(st, k) for k in _SENSOR}
    doc["quality"] = None if st.quality is None else int(st.quality)
    if st.row >= 0:
        doc["baseline"] = {k: getattr(engine.baselines, k)[st.row] for k in _BASE}
    if st.slug is not None:
        doc["slug"] = {k: getattr(st.slug, k) for k in _SLUG}
        doc["slug"]["pending"] = [[k, q, c] for k, (q, c) in st.slug.pending.items()]
        doc["slug"]["period"] = [list(p) for p in st.slug.period]
    doc["limits"] = {str(lim.rule): {k: getattr(lim, k) for k in _LIMIT} for lim in st.limits}
    if st.device is not None:
        doc["device"] = {k: getattr(st.device, k) for k in _DEVICE}
    if st.frozen is not None:
        doc["frozen"] = {k: getattr(st.frozen, k) for k in _FROZEN}
    return doc


def save_checkpoint(engine: Engine, path: str | Path) -> None:
    """Write the checkpoint atomically (temporary file, fsync, rename); StateError on failure."""
    path = Path(path)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "sensors": signature(engine),
        "last_tick": engine.last_tick,
        "state": [_sensor_state(engine, st) for st in engine.sensor_states()],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(
            path,
            lambda f: np.savez(
                f, meta=np.array(json.dumps(doc)), sums=engine.baselines.sums, counts=engine.baselines.counts
            ),
        )
    except OSError as exc:
        raise StateError(f"checkpoint {path}: cannot write ({exc.strerror or exc})") from exc


def restore_checkpoint(
    engine: Engine,
    path: str | Path,
    restart_watch: bool = False,
    partial: bool = False,
    unsaved: float = 0.0,
    dropped: list[str] | None = None,
) -> list[str]:
    """Load a checkpoint into a fresh engine; StateError (and no change) when it does not fit.

    With `restart_watch` (what a restarting daemon wants) the stale-data watch starts
    again at the next tick instead of counting the downtime against every sensor;
    a stale condition that was active stays active until its sensor reports.

    With `partial` (a config that added or removed sensors) every sensor whose id,
    kind, unit and window match is restored and the others start fresh; a sensor
    that changed is never given its old history. Returns the ids restored.

    `unsaved` (with `restart_watch`): how long before the daemon ended the checkpoint may
    have been saved (the save interval): the frozen-value rule's next reading may follow
    the checkpoint's last one by that much more than `stale_after` and keep its run.

    A sensor whose entry makes no sense (`checkpoint_entry.check_entry`: a flag that is not
    a JSON bool, a time NaN where one must be, a run begun after the last reading) is
    dropped with one warning naming it and starts fresh; its id goes to `dropped`.
    """
    path = Path(path)
    try:
        with path.open("rb") as f, np.load(f, allow_pickle=False) as z:
            doc = json.loads(str(z["meta"]))
            sums, counts = z["sums"], z["counts"]
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        EOFError,
        RecursionError,  # JSON nested past the parser's depth: damage, not a failed start
        zipfile.BadZipFile,
    ) as exc:
        raise StateError(f"checkpoint {path}: unreadable or corrupt ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise StateError(f"checkpoint {path}: not a version {VERSION} engine checkpoint")
    mine = json.loads(json.dumps(signature(engine)))
    theirs = doc.get("sensors")
    states = doc.get("state")
    if not isinstance(theirs, list) or not isinstance(states, list) or len(theirs) != len(states):
        raise StateError(f"checkpoint {path}: inconsistent state (sensor list)")
    if theirs != mine:
        their_ids = {str(s[0]) for s in theirs if isinstance(s, list) and s}
        ours = set(engine.sensors)
        detail = f"missing {sorted(ours - their_ids)}, extra {sorted(their_ids - ours)}"
        if their_ids == ours:
            detail = "same sensors, different kind, unit or window"
        if not partial:
            raise StateError(f"checkpoint {path}: belongs to a different sensor set ({detail})")
    pairs = _matching(theirs, mine)
    if not pairs:
        raise StateError(f"checkpoint {path}: belongs to a different sensor set (no sensor matches)")
    base = engine.baselines
    if sums.ndim != 2 or sums.shape[1:] != base.sums.shape[1:] or counts.shape != sums.shape:
        raise StateError(
            f"checkpoint {path}: baseline arrays have shape {sums.shape}, expected (*, {base.sums.shape[1]})"
        )
    lost: list[str] = [] if dropped is None else dropped
    try:
        _apply(engine, doc, sums, counts, pairs, lost)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:  # 10**400: Overflow
        raise StateError(f"checkpoint {path}: inconsistent state ({exc!r})") from exc
    engine.restored_tick = engine.last_tick
    if restart_watch:
        engine.last_tick = -math.inf
        for st in engine.sensor_states():
            st.fresh = math.nan
            if st.frozen is not None:
                st.frozen.resume(unsaved)
    return [engine.sensor_states()[i].sensor for i, _ in pairs]


def _matching(theirs: list[Any], mine: list[Any]) -> list[tuple[int, int]]:
    """(our state index, their state index) of every sensor with the same signature."""
    index = {str(s[0]): j for j, s in enumerate(theirs) if isinstance(s, list) and s}
    pairs = []
    for i, sig in enumerate(mine):
        j = index.get(str(sig[0]))
        if j is not None and theirs[j] == sig:
            pairs.append((i, j))
    return pairs


def _apply(
    engine: Engine,
    doc: dict[str, Any],
    sums: npt.NDArray[Any],
    counts: npt.NDArray[Any],
    pairs: list[tuple[int, int]],
    dropped: list[str],
) -> None:
    """Restore the sound entries of `pairs` (which keeps only those); the sensors of the
    others go to `dropped`, each named in one warning."""
    states = doc["state"]
    last_tick = doc["last_tick"]
    if isinstance(last_tick, bool) or not isinstance(last_tick, int | float) or math.isnan(last_tick):
        raise ValueError(f"last_tick {last_tick!r}")
    # Their baseline rows, in order, belong to the entries that have a baseline.
    rows: dict[int, int] = {}
    for j, d in enumerate(states):
        if isinstance(d, dict) and "baseline" in d:
            rows[j] = len(rows)
    # Check every entry before changing anything; an unsound one is dropped, not the file.
    sound: list[tuple[int, int]] = []
    for i, j in pairs:
        st, d = engine.sensor_states()[i], states[j]
        try:
            check_entry(st, d, st.row >= 0, float(last_tick))
            if st.row >= 0 and rows.get(j, sums.shape[0]) >= sums.shape[0]:
                raise UnsoundEntryError(f"baseline row {rows.get(j)} of {sums.shape[0]}")
        except UnsoundEntryError as exc:
            log.warning(
                "engine checkpoint: sensor %s's entry makes no sense (%s); it starts afresh"
                " (warm-up applies), the rest restored",
                st.sensor,
                exc,
            )
            dropped.append(st.sensor)
        else:
            sound.append((i, j))
    pairs[:] = sound
    base = engine.baselines
    unusable: list[str] = []
    for i, j in pairs:
        st, d = engine.sensor_states()[i], states[j]
        st.last_time, st.value, st.fresh, st.last_good = (
            float(d["last_time"]),
            float(d["value"]),
            float(d["fresh"]),
            float(d["last_good"]),
        )
        st.stale_active, st.bad_episode, st.ooo_episode, st.bad_active = (
            bool(d["stale_active"]),
            bool(d["bad_episode"]),
            bool(d["ooo_episode"]),
            bool(d["bad_active"]),
        )
        st.bad_since = float(d["bad_since"])
        st.quality = None if d["quality"] is None else Quality(int(d["quality"]))
        if st.row >= 0:
            base.sums[st.row] = sums[rows[j]]
            base.counts[st.row] = counts[rows[j]].astype(np.int64)
            b = d["baseline"]
            for k in _BASE:
                getattr(base, k)[st.row] = int(b[k])
        if st.slug is not None:
            s = d["slug"]
            st.slug.active = s["active"]
            for k in ("run_start", "prev_t", "warm_since", "last_mean"):
                setattr(st.slug, k, float(s[k]))
            st.slug.pending = {int(k): [int(q), int(c)] for k, q, c in s["pending"]}
            st.slug.period.clear()
            st.slug.period.extend((float(pt), int(pq)) for pt, pq in s["period"])
            st.slug.period_sum = sum(pq for _, pq in st.slug.period)
        if st.frozen is not None and "frozen" in d:
            run = frozen_run(d["frozen"])
            if run is None:
                log.warning(
                    "checkpoint: sensor %s's frozen-value run makes no sense (%.200r);"
                    " its count starts at the next reading",
                    st.sensor,
                    d["frozen"],
                )
            else:
                st.frozen.ref, st.frozen.since, st.frozen.last, st.frozen.active = run
        for lim in st.limits:
            s = d["limits"].get(str(lim.rule))
            if s is None:  # a limit side this sensor did not have before starts fresh
                continue
            lim.active = s["active"]
            lim.a_start, lim.b_start = float(s["a_start"]), float(s["b_start"])
        if st.device is not None and "device" in d:  # not: learnt again from the next reading
            kept = delivery(d["device"])
            if kept is None:
                unusable.append(st.sensor)
            else:
                st.device.restore(*kept)
    engine.last_tick = float(last_tick)
    if unusable:
        log.warning(
            "engine checkpoint: the quickest delivery kept for %s is no pair of times a watch"
            " could hold; learnt again from the next reading (the rest restored)",
            ", ".join(repr(s) for s in unusable),
        )


def load_checkpoint_or_start_fresh(engine: Engine, path: str | Path, unsaved: float = 0.0) -> bool:
    """At daemon start: restore what fits (restarting the stale-data watch), otherwise
    log why and start fresh. True when every sensor was restored. `unsaved`: the save
    interval (`restore_checkpoint`)."""
    path = Path(path)
    if not path.exists():
        log.info("no baseline checkpoint at %s: baselines start empty (warm-up applies)", path)
        return False
    try:
        dropped: list[str] = []
        restored = restore_checkpoint(
            engine, path, restart_watch=True, partial=True, unsaved=unsaved, dropped=dropped
        )
    except StateError as exc:
        log.warning("%s; ignored, baselines start empty (warm-up applies)", exc)
        return False
    fresh = [s for s in engine.sensors if s not in set(restored) | set(dropped)]  # dropped: told
    if dropped and not fresh:
        return False
    if fresh:
        log.warning(
            "baselines restored from %s for %d sensor(s); %s changed or are new and start empty"
            " (warm-up applies)",
            path,
            len(restored),
            ", ".join(fresh),
        )
        return False
    log.info("baselines and rule state restored from %s", path)
    return True


class CheckpointSchedule:
    """Save every `interval` seconds of the clock the daemon passes in, and on demand
    (at shutdown). A failed save is logged once per episode and retried next time."""

    def __init__(self, engine: Engine, path: str | Path, interval: float = 300.0) -> None:
        self.engine = engine
        self.path = Path(path)
        self.interval = interval
        self.last_saved: float | None = None
        self._failing = False

    def save_if_due(self, now: float) -> bool:
        if self.last_saved is not None and now - self.last_saved < self.interval:
            return False
        return self.save(now)

    def save(self, now: float) -> bool:
        try:
            save_checkpoint(self.engine, self.path)
        except StateError as exc:
            if not self._failing:
                log.error("%s; baselines will need a new warm-up after a restart until this works", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("checkpoint %s written again", self.path)
        self._failing = False
        self.last_saved = now
        return True
