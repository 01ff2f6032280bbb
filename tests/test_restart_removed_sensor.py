"""A restored alarm whose sensor the config no longer has: nothing judges that sensor
again, so the restart clears it, saying why, instead of leaving it active for ever.

In process, with the daemon's real parts, as tests/test_restart_reconcile.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.model import ManualClock, Rule, Sample
from tests.test_pipeline import close

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
OUTFALL = {"id": "outfall.ph", "kind": "ph", "stale_after": "1h"}
INLET = {"id": "inlet.ph", "kind": "ph", "stale_after": "1h"}


def station(state: Path, *sensors: dict[str, Any]) -> Config:
    return build_config(
        {
            "station": {"id": "ps-rm"},
            "state_dir": str(state),
            "sensors": list(sensors),
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )


def raise_bad_value(state: Path, clock: ManualClock) -> None:
    first = Daemon(station(state, OUTFALL, INLET), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 99.0) for k in range(0, 61, 10)])
    first.pipeline.process([Sample("inlet.ph", T0 + 60, 11.0)])  # high pH: stays configured
    first.checkpoint()
    close(first)


def restarted_without_outfall(state: Path, at: float) -> tuple[Daemon, ManualClock]:
    """outfall.ph's bad-value alarm raised and checkpointed at +300 s, then the daemon started
    again on a clock reading `at` with the probe removed from the config (inlet.ph kept)."""
    clock = ManualClock(T0 + 300)
    raise_bad_value(state, clock)
    clock.set(at)
    return Daemon(station(state, INLET), clock), clock


def test_an_alarm_of_a_sensor_removed_from_the_config_is_cleared_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """outfall.ph's bad-value alarm is active when the probe is taken out of service and
    removed from the config. Before, nothing could end it after the restart (the engine and
    the reconciler know only configured sensors): it stood active and unacknowledged on the
    console, in callouts and on MQTT, a day of good inlet readings later. Now the first
    batch clears it at the clock's time, once, and the still-configured inlet's alarm is
    left to its readings."""
    again, clock = restarted_without_outfall(tmp_path / "state", T0 + 3600)
    try:
        with caplog.at_level(logging.WARNING, logger="monitor.reconcile"):
            again.pipeline.process([Sample("inlet.ph", T0 + 3600, 10.5)])
            clock.set(T0 + 7200)
            again.pipeline.process([Sample("inlet.ph", T0 + 7200, 10.5)])
        alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is not None and not alarm.active
        assert alarm.cleared_at == T0 + 3600
        assert alarm.message == "sensor removed from the configuration"
        inlet = again.alarms.get("inlet.ph", Rule.HIGH)
        assert inlet is not None and inlet.active  # judged as ever, not retired
        said = [r.getMessage() for r in caplog.records if "no longer in the config" in r.getMessage()]
        assert said == [
            "alarm outfall.ph/bad_value was active and 'outfall.ph' is no longer in the config: cleared"
        ]
    finally:
        close(again)
    journal = Daemon(station(tmp_path / "state", INLET), clock)  # the clear was journaled
    try:
        alarm = journal.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 3600
    finally:
        close(journal)


def test_a_removed_sensors_alarm_is_cleared_on_the_first_tick_when_nothing_arrives(tmp_path: Path) -> None:
    """A station whose other probes are silent too: the timer clears it, not a reading."""
    again, clock = restarted_without_outfall(tmp_path / "state", T0 + 900)
    try:
        again.pipeline.tick(clock.now())
        alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 900
    finally:
        close(again)


def test_a_removed_sensors_alarm_after_a_clock_step_back_is_cleared_at_its_activation(tmp_path: Path) -> None:
    """The gateway clock stepped back an hour while the daemon was down: the retirement's
    time, the clock's, is before the activation (+60 s). The clear is stamped at the
    activation, so no record shows a negative duration, and it is no early clear (the
    retirement is not a reading from before the alarm)."""
    again, clock = restarted_without_outfall(tmp_path / "state", T0 - 3600)
    try:
        again.pipeline.tick(clock.now())
        alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 60
        assert again.alarms.early_clears == 0
    finally:
        close(again)


def test_a_retirement_the_journal_refuses_is_counted_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal refuses the clear (injected, `PRAGMA query_only` on the journal alone, as
    tests/test_pipeline.py does: a real full disk refuses the series store first). It is
    counted as unjournaled, never a crash, and the alarm still active is cleared at the
    next tick once the journal takes writes again; the log says it once."""
    again, clock = restarted_without_outfall(tmp_path / "state", T0 + 900)
    try:
        with caplog.at_level(logging.WARNING, logger="monitor.reconcile"):
            again.alarms.journal._db.execute("PRAGMA query_only=ON")
            again.pipeline.tick(clock.now())
            again.alarms.journal._db.execute("PRAGMA query_only=OFF")
            assert again.pipeline.stats.unjournaled == 1
            alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
            assert alarm is not None and alarm.active
            clock.set(T0 + 901)
            again.pipeline.tick(clock.now())
            again.pipeline.tick(clock.now())
        alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 901
        assert again.pipeline.stats.unjournaled == 1  # cleared once, not again
        said = [r for r in caplog.records if "no longer in the config" in r.getMessage()]
        assert len(said) == 1
    finally:
        close(again)


def test_an_alarm_of_a_sensor_removed_does_not_stand_for_ever_on_good_readings(tmp_path: Path) -> None:
    """outfall.ph's bad-value alarm is active when the probe is taken out of service and
    removed from the config. After the restart nothing can end it (the engine and the
    reconciler know only configured sensors): it stood active and unacknowledged on the
    console, in callouts and on MQTT, a day of good inlet readings later."""
    again, clock = restarted_without_outfall(tmp_path / "state", T0 + 300)
    try:
        for k in range(3600, 86400, 3600):
            clock.set(T0 + k)
            again.pipeline.process([Sample("inlet.ph", T0 + k, 7.0)])
        alarm = again.alarms.get("outfall.ph", Rule.BAD_VALUE)
        assert alarm is None or not alarm.active
    finally:
        close(again)


def test_the_open_incident_of_a_removed_sensor_ends_with_its_retired_alarm(tmp_path: Path) -> None:
    """outfall.ph at pH 11 from +0 s: high alarm and an open incident; the probe is removed
    and the daemon restarted. The alarm is retired at the first batch (+60 s); its incident
    stood open for ever (the tracker takes transitions of watched sensors only), never
    frozen, four hours of inlet readings later. Now it ends at its own sensor's last
    reading taken in (+60 s), clear time the retirement's, and is frozen once the evidence
    and merge windows are over, like any other."""
    clock = ManualClock(T0 + 60)
    first = Daemon(station(tmp_path / "s", OUTFALL, INLET), clock)
    first.pipeline.process([Sample("outfall.ph", T0 + k, 11.0) for k in range(0, 61, 10)])
    first.checkpoint()
    close(first)
    again = Daemon(station(tmp_path / "s", INLET), clock)
    try:
        for k in range(60, 4 * 3600, 60):
            clock.set(T0 + k)
            again.pipeline.process([Sample("inlet.ph", T0 + k, 7.0)])
        assert again.incidents is not None
        [inc] = again.incidents.store.incidents()
        assert (inc.sensor, inc.rule, inc.start) == ("outfall.ph", "high", T0)
        assert (inc.end, inc.clear_time, inc.frozen) == (T0 + 60, T0 + 60, True)
        assert again.pipeline.stats.listener_errors == 0
    finally:
        close(again)
