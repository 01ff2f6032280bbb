"""Restored alarms (`monitor.reconcile`) and the readings that may end them after a restart.

In process, with the daemon's real parts (engine, checkpoint, journal, series store);
"a crash" closes the stores without the shutdown's checkpoint, as kill -9 leaves them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from tests.test_pipeline import close as crash  # the stores closed, no checkpoint: as kill -9 leaves them

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def station(state: Path, device_time: bool = False, off_delay: str | None = None) -> Config:
    """`device_time`: the pH probe reports over MQTT with its own timestamps; `off_delay`:
    the pH limits' (none by default)."""
    ph: dict[str, object] = {"id": "outfall.ph", "kind": "ph", "stale_after": "1h"}
    if off_delay is not None:
        ph["limits"] = {"off_delay": off_delay}
    probe = {"topic": "probe/ph", "sensor": "outfall.ph", "format": "json", "time_path": "t"}
    mqtt = {"subscriptions": [probe]}
    return build_config(
        {
            "station": {"id": "ps-rec"},
            **({"mqtt": mqtt} if device_time else {}),
            "state_dir": str(state),
            "sensors": [
                ph,
                {
                    "id": "outfall.flow",
                    "kind": "flow",
                    "unit": "gpm",
                    "stale_after": "1h",
                    # seconds, not the ordinance's hours, so a test warms the baseline at once
                    "slug": {"window": "1h", "warmup": "4s", "duration": "3s", "max_sample_gap": "1m"},
                },
            ],
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )


def journal(daemon: Daemon, sensor: str) -> list[tuple[str, str, float]]:
    return [(e.event, e.rule, e.time - T0) for e in daemon.alarms.journal.entries(sensor=sensor)]


def test_a_reading_older_than_a_restored_bad_value_alarm_neither_clears_nor_raises_it(tmp_path: Path) -> None:
    """The probe read nothing believable from +0 s, so the bad-value alarm was raised at +60 s;
    after a crash (no checkpoint) a good reading stamped +30 s arrives (a device's buffer
    replayed, a queued MQTT message): it is evidence from before the alarm began, so the
    alarm stays as journaled (no clear at +30 s, none "journaled at the activation"); the
    first good reading after the activation, +90 s, ends it at +90 s."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state"), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)])
    assert journal(first, "outfall.ph") == [("activated", "bad_value", 60.0)]
    crash(first)

    again = Daemon(station(tmp_path / "state"), clock)
    try:
        again.pipeline.process([Sample("outfall.ph", T0 + 30, 7.0)])
        assert journal(again, "outfall.ph") == [("activated", "bad_value", 60.0)]
        alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is not None and alarm.active
        again.pipeline.process([Sample("outfall.ph", T0 + 90, 7.0)])
        cleared = [("activated", "bad_value", 60.0), ("cleared", "bad_value", 90.0)]
        assert journal(again, "outfall.ph") == cleared
        assert again.alarms.early_clears == 0
    finally:
        crash(again)


def test_a_reading_older_than_a_restored_slug_neither_clears_nor_raises_it(tmp_path: Path) -> None:
    """A warm baseline of 100 gpm (three minute buckets) is checkpointed at +180 s; a slug of
    1,000 gpm from +190 s is raised and journaled; then a crash, so the restarted engine holds
    the checkpoint, from before the slug. A backlog reading of 100 gpm stamped +192 s, inside
    the over-run and before the activation, is judged by the engine as usual (it is later
    than the checkpoint's last reading) but does not end the restored slug; 100 gpm at +240 s
    does."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state"), clock)
    first.pipeline.process([Sample("outfall.flow", T0 + k, 100.0) for k in range(0, 181, 10)])
    first.checkpoint()
    first.pipeline.process([Sample("outfall.flow", T0 + k, 1000.0) for k in range(190, 231, 5)])
    [(event, rule, raised)] = journal(first, "outfall.flow")
    assert (event, rule) == ("activated", "slug") and 192.0 < raised <= 200.0
    crash(first)

    again = Daemon(station(tmp_path / "state"), clock)
    try:
        assert again.restored and not again.engine.warming_up("outfall.flow")
        judged = again.engine.counters.samples
        again.pipeline.process([Sample("outfall.flow", T0 + 192, 100.0)])
        assert again.engine.counters.samples == judged + 1  # the engine took it
        assert journal(again, "outfall.flow") == [("activated", "slug", raised)]
        alarm = again.alarms.get("outfall.flow", Rule.SLUG)
        assert alarm is not None and alarm.active
        again.pipeline.process([Sample("outfall.flow", T0 + 240, 100.0)])
        assert journal(again, "outfall.flow") == [("activated", "slug", raised), ("cleared", "slug", 240.0)]
        assert again.alarms.early_clears == 0
    finally:
        crash(again)


@pytest.mark.parametrize("off_delay", [None, "30s"])
def test_a_backlog_older_than_a_restored_high_alarm_neither_starts_its_off_delay_nor_clears_it(
    tmp_path: Path, off_delay: str | None
) -> None:
    """pH 12 at +60 s raised the high alarm; after a crash (no checkpoint) the probe's buffer
    replays pH 7 stamped +0 s to +50 s, before the activation. The restarted engine holds the
    alarm as its own (`Engine.restore_active`), but those readings are evidence from before
    it began: they neither start the off-delay nor end it (the rule ended it at +0 s, or at
    +30 s after a 30 s off-delay, journaled at the activation and counted as an early
    clear). Good readings after the activation end it as the rule says: at +70 s without an
    off-delay, at +100 s (30 s after +70 s) with one."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state", off_delay=off_delay), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + 60, 12.0)])
    assert journal(first, "outfall.ph") == [("activated", "high", 60.0)]
    crash(first)

    again = Daemon(station(tmp_path / "state", off_delay=off_delay), clock)
    try:
        judged = again.engine.counters.samples
        again.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in range(0, 51, 10)])
        assert again.engine.counters.samples == judged + 6  # the engine took them all
        assert journal(again, "outfall.ph") == [("activated", "high", 60.0)]
        assert Rule.HIGH in again.engine.status("outfall.ph").active
        assert again.alarms.early_clears == 0
        again.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in range(70, 101, 10)])
        ended = 100.0 if off_delay else 70.0
        assert journal(again, "outfall.ph") == [("activated", "high", 60.0), ("cleared", "high", ended)]
        assert again.alarms.early_clears == 0
    finally:
        crash(again)


def test_an_off_delay_a_checkpoint_saved_after_the_activation_goes_on_after_a_restart(tmp_path: Path) -> None:
    """The hold above drops only an off-delay that began at or before the activation: pH 12
    at +60 s raised the high alarm, pH 7 from +70 s started the 30 s off-delay, and the
    checkpoint saved at +80 s holds both. After a crash the off-delay goes on: pH 7 at +100 s
    ends the alarm at +100 s, not 30 s after the first reading of the restarted daemon."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state", off_delay="30s"), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + 60, 12.0)])
    first.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in (70, 80)])
    first.checkpoint()
    crash(first)

    again = Daemon(station(tmp_path / "state", off_delay="30s"), clock)
    try:
        assert again.restored
        again.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in (90, 100)])
        assert journal(again, "outfall.ph") == [("activated", "high", 60.0), ("cleared", "high", 100.0)]
    finally:
        crash(again)


def test_a_checkpoint_from_an_earlier_episode_does_not_let_a_backlog_end_the_restored_alarm(
    tmp_path: Path,
) -> None:
    """The checkpoint saved at +65 s holds the high alarm active, but from an earlier episode:
    raised at +60 s, cleared at +70 s, raised again at +100 s, then a crash. The restarted
    engine has the alarm active from the checkpoint, so the journal's activation (+100 s) is
    what holds it: a backlog of pH 7 stamped +80 s and +90 s neither ends it (it did, at +80
    s, journaled at +100 s and counted as an early clear); pH 7 at +110 s does."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state"), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + 60, 12.0)])
    first.checkpoint()
    first.pipeline.process([Sample("outfall.ph", T0 + 70, 7.0), Sample("outfall.ph", T0 + 100, 12.0)])
    crash(first)

    again = Daemon(station(tmp_path / "state"), clock)
    try:
        assert again.restored
        episodes = [("activated", "high", 60.0), ("cleared", "high", 70.0), ("activated", "high", 100.0)]
        again.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in (80, 90)])
        assert journal(again, "outfall.ph") == episodes
        assert again.alarms.early_clears == 0
        again.pipeline.process([Sample("outfall.ph", T0 + 110, 7.0)])
        assert journal(again, "outfall.ph") == [*episodes, ("cleared", "high", 110.0)]
    finally:
        crash(again)


def test_a_reading_the_engine_refused_as_out_of_order_does_not_end_a_restored_alarm(tmp_path: Path) -> None:
    """The journal holds the bad-value alarm raised at +60 s as active, the checkpoint has the
    engine past it: the engine's clear at +70 s could not be journaled (the journal alone
    refused writes; injected with `PRAGMA query_only`, see tests/test_readonly_disk.py for
    why), and the checkpoint was saved at +100 s. After the crash a reading stamped +80 s
    comes again (an MQTT redelivery): the engine refuses it, not later than +100 s, so it
    ends nothing; the next reading the engine judges, +110 s, ends the alarm at +110 s."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state"), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)])
    first.alarms.journal._db.execute("PRAGMA query_only=ON")
    first.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in range(70, 101, 10)])
    first.alarms.journal._db.execute("PRAGMA query_only=OFF")
    assert first.pipeline.stats.unjournaled == 1
    assert journal(first, "outfall.ph") == [("activated", "bad_value", 60.0)]
    first.checkpoint()
    crash(first)

    again = Daemon(station(tmp_path / "state"), clock)
    try:
        assert again.restored
        refused = again.engine.counters.out_of_order
        again.pipeline.process([Sample("outfall.ph", T0 + 80, 7.0)])
        assert again.engine.counters.out_of_order == refused + 1
        assert journal(again, "outfall.ph") == [("activated", "bad_value", 60.0)]
        again.pipeline.process([Sample("outfall.ph", T0 + 110, 7.0)])
        cleared = [("activated", "bad_value", 60.0), ("cleared", "bad_value", 110.0)]
        assert journal(again, "outfall.ph") == cleared
    finally:
        crash(again)


@pytest.mark.parametrize("device_time", [False, True])
def test_after_the_clock_stepped_back_a_restored_alarm_is_ended_by_a_reading_of_now(
    tmp_path: Path, device_time: bool
) -> None:
    """The bad-value alarm was raised at +60 s; while the daemon was down the gateway clock
    stepped back an hour (an RTC without its battery, then no NTP), so every new reading is
    stamped before the activation. The activation is in the clock's future: stamps cannot
    tell what came first, and holding the alarm until the clock comes round again would
    keep it an hour on good readings. The first good reading ends it, journaled at the
    activation (a clear never precedes its activation), counted as an early clear. The same
    with the probe on MQTT stamping its own readings: an hour is beyond `mqtt.max_skew`."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state", device_time), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)])
    crash(first)

    clock.set(T0 - 3600)
    again = Daemon(station(tmp_path / "state", device_time), clock)
    try:
        again.pipeline.process([Sample("outfall.ph", T0 - 3600, 7.0)])
        assert journal(again, "outfall.ph") == [
            ("activated", "bad_value", 60.0),
            ("cleared", "bad_value", 60.0),
        ]
        assert again.alarms.early_clears == 1
    finally:
        crash(again)


def test_after_the_clock_stepped_back_a_restored_high_alarm_ends_by_its_off_delay(tmp_path: Path) -> None:
    """The limit rule's side of the clock-step exception (one definition with the bad-value
    case above: monitor/engine/restored.py): pH 12 at +60 s raised the high alarm; the clock
    stepped back an hour while the daemon was down. pH 7 from -3600 s starts the 30 s
    off-delay although stamped before the activation, and -3570 s ends it, journaled at the
    activation and counted as an early clear, instead of the alarm standing an hour."""
    clock = ManualClock(T0 + 300)
    first = Daemon(station(tmp_path / "state", off_delay="30s"), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + 60, 12.0)])
    crash(first)

    clock.set(T0 - 3600)
    again = Daemon(station(tmp_path / "state", off_delay="30s"), clock)
    try:
        again.pipeline.process([Sample("outfall.ph", T0 + k, 7.0) for k in (-3600, -3590, -3580)])
        assert journal(again, "outfall.ph") == [("activated", "high", 60.0)]
        again.pipeline.process([Sample("outfall.ph", T0 - 3570, 7.0)])
        assert journal(again, "outfall.ph") == [("activated", "high", 60.0), ("cleared", "high", 60.0)]
        assert again.alarms.early_clears == 1
    finally:
        crash(again)


def test_a_device_clock_ahead_of_the_gateway_is_no_clock_step_back(tmp_path: Path) -> None:
    """An MQTT probe stamps its own readings, its clock 60 s ahead of the gateway's (within
    `mqtt.max_skew`, 300 s by default, as `ClockWatch.check_restored` allows for): the
    bad-value alarm was raised at the probe's +60 s when the gateway clock read +0 s. The
    daemon crashes and is back 5 s later; a good reading from the probe's buffer, stamped
    -30 s (before the bad run began), arrives first. The activation is in the gateway
    clock's future only by the probe's skew, not because the clock stepped back: the
    reading is evidence from before the alarm, so the alarm stays as journaled (it was
    cleared, journaled at the activation, and counted as an early clear); the first reading
    after the activation ends it. Samples go in through the pipeline as the MQTT source
    hands them over (tests/test_mqtt_source.py covers the broker and the payload times)."""
    clock = ManualClock(T0)
    first = Daemon(station(tmp_path / "state", device_time=True), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)])
    assert journal(first, "outfall.ph") == [("activated", "bad_value", 60.0)]
    crash(first)

    clock.set(T0 + 5)
    again = Daemon(station(tmp_path / "state", device_time=True), clock)
    try:
        again.pipeline.process([Sample("outfall.ph", T0 - 30, 7.0)])
        assert journal(again, "outfall.ph") == [("activated", "bad_value", 60.0)]
        assert again.alarms.early_clears == 0
        clock.set(T0 + 10)
        again.pipeline.process([Sample("outfall.ph", T0 + 70, 7.0)])
        cleared = [("activated", "bad_value", 60.0), ("cleared", "bad_value", 70.0)]
        assert journal(again, "outfall.ph") == cleared
    finally:
        crash(again)
