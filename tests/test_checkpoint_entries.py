"""A damaged or hand-edited sensor entry of the engine checkpoint: dropped with one warning
naming the sensor (it starts afresh), the rest restored. `bool("false")` is True: every
`active` flag written as a string held an alarm active that was never raised; a slug run
begun after the sensor's last reading held the slug off by as much; NaN or a string where a
time must be was taken as one. Real checkpoint files, their JSON rewritten.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest

from monitor.engine import Engine, load_checkpoint_or_start_fresh, restore_checkpoint, save_checkpoint
from monitor.engine.clock_step import advance_watches
from monitor.model import ManualClock, Rule, Sample
from tests.engine_helpers import T0, live
from tests.test_engine_replay import CONFIG, _rewrite_meta

DAY = 86400.0


def _readings(start: float, minutes: int, flow: float) -> list[Sample]:
    out = []
    for i in range(minutes * 6):
        t = start + 10.0 * i
        out += [Sample("flow", t, flow), Sample("ph", t, 7.0), Sample("temp", t, 60.0)]
    return out


def saved(tmp_path: Path) -> tuple[Engine, Path]:
    """Half an hour of 300 gpm, pH 7, 60 degF (baselines past warm-up), checkpointed."""
    engine = Engine(CONFIG.rules, ManualClock())
    live(engine, _readings(T0, 30, 300.0))
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    return engine, path


def entry(doc: dict[str, Any], sensor: str) -> dict[str, Any]:
    [j] = [j for j, s in enumerate(doc["sensors"]) if s[0] == sensor]
    found: dict[str, Any] = doc["state"][j]
    return found


def _set(where: str, value: object) -> Any:
    def edit(doc: dict[str, Any]) -> dict[str, Any]:
        d = entry(doc, "flow")
        *path, last = where.split(".")
        for k in path:
            d = d[k]
        d[last] = value(d) if callable(value) else value
        return doc

    return edit


LATER = DAY  # a run start a day after the last reading


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("stale_active", "false"),  # bool("false") is True: a stale alarm never raised
        ("bad_active", "false"),
        ("ooo_episode", 0),  # a number is not a flag
        ("limits.high.active", "false"),  # a high-flow alarm never raised
        ("slug.active", "false"),  # a slug alarm never raised
        ("slug.run_start", T0 + 30 * 60 + LATER),  # the slug held off a day
        ("slug.run_start", math.inf),
        ("slug.last_mean", math.inf),  # a threshold of inf: the slug never judged
        ("limits.high.a_start", T0 + 30 * 60 + LATER),
        ("bad_since", T0 + 30 * 60 + LATER),
        ("last_time", math.nan),
        ("last_time", "1800000000"),  # a string number is not a number
        ("value", True),  # a bool is an int to Python
        pytest.param("last_time", 10**400, id="last_time-10**400"),  # past a float (OverflowError)
        ("quality", 7),
        ("slug.pending", [[1, 2, "3"]]),
        ("baseline.win_count", 1.5),
    ],
)
def test_an_unsound_sensor_entry_is_dropped_with_one_warning_the_rest_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, value: object
) -> None:
    engine, path = saved(tmp_path)
    ph_mean, flow_mean = engine.baseline_mean("ph"), engine.baseline_mean("flow")
    assert ph_mean is not None and flow_mean is not None
    _rewrite_meta(path, _set(where, value))
    again = Engine(CONFIG.rules, ManualClock())
    with caplog.at_level(logging.WARNING, logger="monitor.engine.checkpoint"):
        assert load_checkpoint_or_start_fresh(again, path) is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "sensor flow" in warnings[0] and where.rsplit(".", maxsplit=1)[-1] in warnings[0], warnings[0]
    assert again.status("flow").active == ()  # no alarm that was never raised
    assert again.baseline_mean("flow") is None  # starts afresh, as a sensor new to the file
    assert again.baseline_mean("ph") == ph_mean  # the rest restored
    temp = {s.sensor: s for s in again.sensor_states()}["temp"]
    assert temp.last_time == T0 + 30 * 60 - 10.0


def test_a_sound_checkpoint_restores_every_sensor_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The check refuses only nonsense: a file the engine wrote is restored whole."""
    engine, path = saved(tmp_path)
    again = Engine(CONFIG.rules, ManualClock())
    with caplog.at_level(logging.WARNING, logger="monitor.engine.checkpoint"):
        assert load_checkpoint_or_start_fresh(again, path) is True
    assert not caplog.records
    assert again.baseline_mean("flow") == engine.baseline_mean("flow")


def test_a_slug_run_moved_by_a_clock_step_forward_is_no_run_after_the_last_reading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway clock step forward moves an over run's start (and the timer tick) with it,
    not the last reading: a checkpoint saved before the next reading holds a run that began
    after the last reading, and is sound. It is restored, not dropped."""
    engine = Engine(CONFIG.rules, ManualClock())
    live(engine, _readings(T0, 30, 300.0))
    end = T0 + 30 * 60
    live(engine, [Sample("flow", end + 10.0 * i, 3000.0) for i in range(3)])  # an over run begins
    advance_watches(engine, 45.0)  # the step: within max_sample_gap, the run goes on
    state = {s.sensor: s for s in engine.sensor_states()}["flow"]
    assert state.slug is not None and state.slug.run_start > state.last_time
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    again = Engine(CONFIG.rules, ManualClock())
    with caplog.at_level(logging.WARNING, logger="monitor.engine.checkpoint"):
        assert "flow" in restore_checkpoint(again, path)
    assert not caplog.records
    out = live(again, [Sample("flow", end + 75.0 + 10.0 * i, 3000.0) for i in range(30)])
    [slug] = [c for c in out if c.rule is Rule.SLUG]
    assert slug.time == end + 45.0 + 3 * 60 + 10.0  # the first reading past 3 min from its moved start


def test_a_run_begun_between_ticks_and_moved_by_a_step_forward_is_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon ticks once a second and judges each reading as it comes, between ticks: an
    over run (and a high-flow on-delay) that began at a reading half a second after the last
    tick, moved forward by a 45 s step, began after that tick moved by the same step. The file
    the engine itself wrote then was refused for `flow` (it started afresh: its baseline lost,
    its slug held off a day)."""
    engine = Engine(CONFIG.rules, ManualClock())
    live(engine, _readings(T0, 30, 300.0))
    end = T0 + 30 * 60
    engine.tick(end)
    engine.process(Sample("flow", end + 0.5, 3000.0))  # an over run begins between two ticks
    advance_watches(engine, 45.0)
    state = {s.sensor: s for s in engine.sensor_states()}["flow"]
    assert state.slug is not None and state.slug.run_start == end + 45.5
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    again = Engine(CONFIG.rules, ManualClock())
    with caplog.at_level(logging.WARNING, logger="monitor.engine.checkpoint"):
        assert "flow" in restore_checkpoint(again, path)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert again.baseline_mean("flow") == engine.baseline_mean("flow")
