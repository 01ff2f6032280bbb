"""`DeviceWatch` (monitor/engine/arrival.py): when a device-stamped reading was taken,
on the gateway clock, over weeks of a PLC's crystal drifting and a link's delay varying.
Pure arithmetic on event time: the daemon-level cases are in tests/test_stale_two_clocks.py."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from monitor.engine.arrival import DeviceWatch
from monitor.engine.checkpoint import restore_checkpoint, save_checkpoint
from monitor.engine.engine import Engine
from monitor.model import ManualClock, Sample
from tests.engine_helpers import T0, station

DAY = 86400.0


@pytest.mark.parametrize("ppm", [-100.0, 100.0, 500.0])
def test_a_drifting_plc_clock_is_followed_for_thirty_days(ppm: float) -> None:
    """A PLC's clock gaining or losing `ppm` (a crystal; 500: NTP slewing it), a reading every
    10 s delivered in 0.2 s to 1.2 s: every reading is taken within 1.2 s of its arrival
    for 30 days (the least delivery grows up to 1 ms a second, faster than the drift)."""
    watch = DeviceWatch()
    worst = 0.0
    for i in range(int(30 * DAY / 10)):
        true = 10.0 * i
        stamp = 1.8e9 + true * (1 + ppm * 1e-6)
        arrived = 1.8e9 + 3600.0 + true + 0.2 + (i * 7919 % 11) / 10  # gateway an hour ahead
        worst = max(worst, arrived - watch.taken(stamp, arrived))
    assert worst <= 1.2


def test_a_backlog_is_taken_when_it_was_taken_and_a_step_back_is_learnt_again() -> None:
    """An hour-old reading after a week of prompt ones is taken an hour (less 0.6 s of allowed
    drift) before its arrival; after a stamp earlier than the last (the PLC's clock stepped
    back an hour), its next readings are taken at their arrival again."""
    watch = DeviceWatch()
    for i in range(int(7 * DAY / 10)):
        watch.taken(10.0 * i, 10.0 * i + 0.5)
    now = 7 * DAY
    assert watch.taken(now - 3600.0, now + 0.5) == pytest.approx(now + 0.5 - 3600.0, abs=1.0)
    watch.refused(now - 3600.0, now - 10.0, now + 1.0)
    assert watch.taken(now + 20.0 - 3600.0, now + 20.5) == now + 20.5
    assert watch.taken(now + 30.0 - 3600.0, now + 30.5) == now + 30.5


def test_one_repeated_stamp_keeps_the_delivery_and_is_no_stopped_clock_two_are() -> None:
    """A retained message or a QoS 1 duplicate (the last stamp again) forgets nothing and is
    not a stopped clock; two in one window are."""
    watch = DeviceWatch()
    watch.taken(100.0, 100.5)
    watch.refused(100.0, 100.0, 130.0)
    assert not watch.frozen(161.0, 60.0)
    taken = watch.taken(50.0 + 100.0, 3700.0)  # the delivery still known: an hour-old reading
    assert taken == pytest.approx(150.5 + 1e-3 * 3599.5)  # (with the drift allowed meanwhile)
    watch.refused(150.0, 150.0, 3710.0)
    assert not watch.frozen(3720.0, 60.0)  # the one before, at +130 s, is out of the window
    watch.refused(150.0, 150.0, 3720.0)
    assert watch.frozen(3730.0, 60.0)


def test_a_gateway_step_moves_the_delivery_with_it() -> None:
    """The gateway stepped back an hour: the next prompt reading is taken at its arrival, an
    hour-old one an hour before it."""
    watch = DeviceWatch()
    watch.taken(0.0, 3600.5)
    watch.shift(-3600.0)
    assert watch.taken(10.0, 10.5) == 10.5
    assert watch.taken(20.0 - 3600.0, 20.5) == pytest.approx(20.5 - 3600.0, abs=0.1)


def test_a_restored_delivery_keeps_a_backlog_old_but_gives_way_to_readings_at_the_clocks_pace() -> None:
    """A delivery restored from the checkpoint (0.5 s, learnt before a restart): a backlog
    arriving at once, or one a second with stamps 10 s apart, is taken as old as it is. But
    the gateway clock may have been stepped forward an hour while the daemon was down (NTP
    at boot after a run on a clock behind), which no watch saw: every live reading then looks
    an hour late against the restored delivery. Readings whose stamps advance as their
    arrivals do (none 2 s quicker than the one measured from), for 20 s, are a live device:
    the delivery is learnt again, and they are taken at their arrival. Before the restored
    delivery existed, the first backlog after a restart was taken at its arrival (a dead PLC
    looked alive)."""
    watch = DeviceWatch()
    watch.restore(0.5, 1000.0)
    backlog = [watch.taken(s, 4600.0) for s in range(110, 601, 10)]
    assert max(backlog) == pytest.approx(600.5 + 1e-3 * 3600, abs=1e-6)
    slow = [watch.taken(610.0 + 10 * i, 4601.0 + i) for i in range(30)]
    assert max(slow) < 1000.0
    jumped = DeviceWatch()
    jumped.restore(0.5, 1000.0)
    taken = [jumped.taken(2000.0 + 10 * i, 2000.5 + 3600.0 + 10 * i + (i % 2) * 0.3) for i in range(4)]
    assert max(taken[:2]) < 2100.0 and taken[2] == 2020.5 + 3600.0, taken
    assert taken[3] == pytest.approx(2030.5 + 3600.0, abs=0.02)  # learnt again: 0.3 s late


def _kept_with(path: Path, device: object) -> None:
    """Rewrite the checkpoint at `path` with `device` as its one sensor's `device` entry (a
    hand edit, a bit flipped on disk, a hostile file: nothing the daemon writes)."""
    with np.load(path, allow_pickle=False) as z:
        doc, sums, counts = json.loads(str(z["meta"])), z["sums"], z["counts"]
    doc["state"][0]["device"] = device
    with path.open("wb") as f:
        np.savez(f, meta=np.array(json.dumps(doc)), sums=sums, counts=counts)


@pytest.mark.parametrize(
    "device",
    [
        {"lag": math.nan, "lag_at": T0},
        {"lag": -math.inf, "lag_at": T0},
        {"lag": math.inf, "lag_at": math.inf},
        {"lag": 0.5, "lag_at": math.nan},
        {"lag": "soon", "lag_at": T0},
        {"lag": 0.5},
        [0.5, T0],
    ],
    ids=["nan", "minus-inf", "inf-at-inf", "at-nan", "string", "half", "list"],
)
def test_a_hostile_device_entry_in_the_checkpoint_is_learnt_again_and_keeps_the_rest(
    tmp_path: Path, device: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A level reporting every 10 s, 0.5 s late; the checkpoint saved, its `device` entry
    rewritten with something no watch can hold, restored at a restart (+100 s). The PLC is
    silent until +300 s, then reports promptly: stale raised at +161 s and cleared at the
    first reading's arrival, the baselines and rule state restored, a warning naming the
    sensor. Before: NaN or -inf took every reading at NaN or -inf (a restored stale alarm never
    cleared, or one raised at the first reading and never cleared: a false alarm for good),
    and a string or a missing key refused the whole checkpoint (every baseline warmed up again)."""
    rules = station({"id": "lvl", "kind": "level", "unit": "ft", "stale_after": "60s"}).rules
    clock = ManualClock(T0)
    engine = Engine(rules, clock)
    engine.stamped_by_device({"lvl"})
    for k in range(0, 100, 10):
        clock.set(T0 + k + 0.5)
        engine.tick()
        engine.process(Sample("lvl", T0 + k, 4.2))
    path = tmp_path / "engine-checkpoint.npz"
    save_checkpoint(engine, path)
    _kept_with(path, device)
    again = Engine(rules, clock)
    again.stamped_by_device({"lvl"})
    caplog.set_level(logging.WARNING, logger="monitor.engine.checkpoint")
    assert restore_checkpoint(again, path, restart_watch=True, partial=True) == ["lvl"]
    out = []
    for k in range(100, 400):
        clock.set(T0 + k + (0.5 if k % 10 == 0 and k >= 300 else 0.0))
        out += [(c.state.value, c.time - T0) for c in again.tick()]
        if k % 10 == 0 and k >= 300:
            out += [(c.state.value, c.time - T0) for c in again.process(Sample("lvl", T0 + k, 4.2))]
    assert out == [("active", 161.0), ("cleared", 300.5)], out
    assert [r.getMessage() for r in caplog.records if "'lvl'" in r.getMessage()], caplog.records


@pytest.mark.parametrize("step", [3600.0, 300.0])
def test_a_gateway_clock_stepped_forward_while_down_raises_no_stale_on_a_live_device(
    tmp_path: Path, step: float
) -> None:
    """A level reporting every 10 s, 0.5 s late; the checkpoint saved at +95 s and the daemon
    stopped; the gateway clock stepped forward `step` while it was down (NTP at boot), which
    no watch saw. After the restart every reading looks `step` late against the restored
    delivery until the readings' pace shows a live device (20 s): no stale alarm meanwhile,
    as none is due (the PLC never stopped). Before: the first reading, taken `step` before
    its arrival, put the restarted stale watch back a step: stale raised at the next tick and
    cleared at a reading 10 s later (a false page)."""
    rules = station({"id": "lvl", "kind": "level", "unit": "ft", "stale_after": "60s"}).rules
    clock = ManualClock(T0)
    engine = Engine(rules, clock)
    engine.stamped_by_device({"lvl"})
    for k in range(0, 100):
        clock.set(T0 + k + (0.5 if k % 10 == 0 else 0.0))
        engine.tick()
        if k % 10 == 0:
            engine.process(Sample("lvl", T0 + k, 4.2))
    path = tmp_path / "engine-checkpoint.npz"
    save_checkpoint(engine, path)
    again = Engine(rules, clock)
    again.stamped_by_device({"lvl"})
    restore_checkpoint(again, path, restart_watch=True, partial=True)
    out = []
    for k in range(120, 400):
        clock.set(T0 + step + k + (0.5 if k % 10 == 0 else 0.0))
        out += [(c.state.value, c.time - T0) for c in again.tick()]
        if k % 10 == 0:
            out += [(c.state.value, c.time - T0) for c in again.process(Sample("lvl", T0 + k, 4.2))]
    assert out == [], out


@pytest.mark.parametrize("rate", [1.8, 1.5, 1.25])
def test_a_restored_delivery_keeps_a_backlog_drained_a_little_faster_than_taken_old(rate: float) -> None:
    """A delivery restored from the checkpoint (0.5 s); the PLC's uplink comes back with an
    hour's buffer (a reading every 10 s of its clock) that it drains `rate` times faster than
    it was taken (a store-and-forward queue with a send rate, as PLCs' MQTT modules have):
    every reading of it is taken as old as it is (its stamp plus the delivery), never at its
    arrival, until it has caught up. Before: stamps advancing less than twice as fast as their
    arrivals passed for a live device after 10 s (the rule was PACE = 2): the buffer's
    readings, still up to an hour old, were taken at their arrival (a restored stale alarm
    cleared, a derived sensor made from an hour-old input)."""
    watch = DeviceWatch()
    watch.restore(0.5, 1000.0)
    back = 4600.0  # the uplink back: the buffer starts with the reading taken at +1000 s
    for i in range(0, 400):
        stamp = 1000.0 + 10.0 * i
        arrived = back + 10.0 * i / rate
        taken = watch.taken(stamp, arrived)
        if arrived - stamp > 60.0:  # still more than stale_after behind
            assert taken < arrived - 60.0, (i, stamp, arrived, taken)
