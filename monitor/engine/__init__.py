"""The detection engine: rolling baselines, chapter 139 rules, replay of history.

The public surface, for the daemon (live), the replay command and billing:

- `Engine(config.rules, clock)`: one per station.
  - `validate(sample) -> Sample`: the sample as stored (BAD_DATA if not believable).
  - `process(sample) -> list[Condition]`: the live path, one sample at a time.
  - `tick(now=None) -> list[Condition]`: stale-data conditions due (default: the clock).
  - `replay(sensor, time, value, quality=None) -> ReplayResult`: a whole batch in time
    order, vectorised; the same conditions as `tick(t)` + `process(sample)` per sample.
    `sensor` holds indices into `Engine.sensors` (`Engine.index(id)`). Its conditions are
    columns (`result.columns`, monitor/engine/columns.py); `result.conditions` builds the
    objects when asked.
  - `status(id)`, `statuses()`, `baseline_mean(id)`, `warming_up(id)`, `counters`.
- `replay_steps(engine, ...)`: a long replay cut into batches at time boundaries; each
  step carries the batch's samples and conditions (the place to write them elsewhere too).
- `save_checkpoint(engine, path)` / `restore_checkpoint(engine, path)`: baselines and rule
  state across a restart; `restore_checkpoint` raises `StateError` for a checkpoint that
  does not fit (`load_checkpoint_or_start_fresh` logs that and carries on).
  `CheckpointSchedule(engine, state_dir / CHECKPOINT_FILE).save_if_due(now)` for the daemon's
  timer, `.save(now)` at shutdown.

- `ClockWatch(engine)` / `ClockWatch.for_clock(engine, clock)`: `.check()` notices a step
  of the gateway's wall clock (against `boottime`, a monotonic clock that counts a suspend)
  and re-bases the engine;
  `.step_log` (`StepLog`, engine/clock_log.py) logs a step once an episode and counts them.

Meters (kind `meter`) pass through validation only; billing judges them.
"""

from monitor.engine.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointSchedule,
    load_checkpoint_or_start_fresh,
    restore_checkpoint,
    save_checkpoint,
)
from monitor.engine.clock_step import ClockWatch
from monitor.engine.engine import Engine
from monitor.engine.replay import ReplayStep, replay_steps
from monitor.engine.state import Counters, ReplayResult, SensorStatus, slug_status

__all__ = [
    "CHECKPOINT_FILE",
    "CheckpointSchedule",
    "ClockWatch",
    "Counters",
    "Engine",
    "ReplayResult",
    "ReplayStep",
    "SensorStatus",
    "load_checkpoint_or_start_fresh",
    "replay_steps",
    "restore_checkpoint",
    "save_checkpoint",
    "slug_status",
]
