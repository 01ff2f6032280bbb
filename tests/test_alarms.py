"""ISA-18.2 state machine: every transition, each refused action, restart in each state."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies

from monitor.alarms import AlarmManager, Entry, Journal
from monitor.config import Alarms
from monitor.config.outputs import PriorityOverride
from monitor.errors import AlarmError
from monitor.model import Alarm, AlarmState, Condition, ConditionState, ManualClock, Priority, Rule
from tests.examples import examples

T0 = 1_780_000_000.0
PH = "outfall.ph"
CITE = "§139-15 C(3)"


def cond(
    clock: ManualClock, active: bool, rule: Rule = Rule.HIGH, sensor: str = PH, value: float = 9.6
) -> Condition:
    state = ConditionState.ACTIVE if active else ConditionState.CLEARED
    return Condition(clock.now(), sensor, rule, state, value, 9.0, CITE, message="pH above 9.0")


class Station:
    """A manager on a journal file, reopenable like a daemon restart."""

    def __init__(self, path: Path, config: Alarms | None = None) -> None:
        self.path = path
        self.config = config or Alarms()
        self.clock = ManualClock(T0)
        self.events: list[tuple[str, AlarmState]] = []
        self.manager = self._open()

    def _open(self) -> AlarmManager:
        manager = AlarmManager(self.config, Journal(self.path), self.clock)
        manager.listen(self._heard)
        return manager

    def _heard(self, entry: Entry, alarm: Alarm) -> None:
        self.events.append((entry.event, alarm.state))

    def restart(self) -> AlarmManager:
        self.manager.close()
        self.manager = self._open()
        return self.manager

    def apply(self, active: bool, rule: Rule = Rule.HIGH, value: float = 9.6) -> list[Alarm]:
        return self.manager.apply(cond(self.clock, active, rule, value=value))

    def state(self, rule: Rule = Rule.HIGH) -> AlarmState:
        alarm = self.manager.get(PH, rule)
        assert alarm is not None
        return alarm.state


@pytest.fixture
def st(tmp_path: Path) -> Iterator[Station]:
    station = Station(tmp_path / "journal.sqlite")
    yield station
    station.manager.close()


def test_activation_creates_unacknowledged_alarm_with_citation_and_priority(st: Station) -> None:
    (alarm,) = st.apply(True)
    assert alarm.state is AlarmState.UNACK
    assert alarm.priority is Priority.HIGH
    assert alarm.citation == CITE and alarm.value == 9.6 and alarm.limit == 9.0
    assert alarm.activated_at == T0 and alarm.active and not alarm.acknowledged
    # a repeated active condition is no transition; the alarm keeps the value that tripped it
    assert st.apply(True, value=9.8) == []
    got = st.manager.get(PH, Rule.HIGH)
    assert got is not None and got.value == 9.6
    assert st.events == [("activated", AlarmState.UNACK)]


def test_cleared_condition_for_unknown_alarm_is_ignored(st: Station) -> None:
    assert st.apply(False) == []
    assert st.manager.alarms() == []


def test_unack_ack_then_clear_returns_to_normal(st: Station) -> None:
    st.apply(True)
    st.clock.advance(30)
    acked = st.manager.acknowledge(PH, "high", "dana", note="checking dosing pump")
    assert acked.state is AlarmState.ACKED
    assert (acked.acked_by, acked.acked_at, acked.ack_note) == ("dana", T0 + 30, "checking dosing pump")
    st.clock.advance(60)
    (cleared,) = st.apply(False, value=8.7)
    assert cleared.state is AlarmState.NORMAL and cleared.cleared_at == T0 + 90


def test_unack_clears_to_returned_unack_then_ack_to_normal(st: Station) -> None:
    st.apply(True)
    st.clock.advance(10)
    (rtn,) = st.apply(False)
    assert rtn.state is AlarmState.RTN_UNACK and not rtn.active
    assert st.manager.acknowledge(PH, Rule.HIGH, "dana").state is AlarmState.NORMAL
    assert st.manager.active() == []


def test_returned_unack_reactivates_to_unack(st: Station) -> None:
    st.apply(True)
    st.apply(False)
    st.clock.advance(5)
    (again,) = st.apply(True)
    assert again.state is AlarmState.UNACK and again.activated_at == T0 + 5


def test_reactivation_after_ack_needs_a_new_ack(st: Station) -> None:
    st.apply(True)
    st.manager.acknowledge(PH, Rule.HIGH, "dana")
    st.apply(False)
    (again,) = st.apply(True)
    assert again.state is AlarmState.UNACK and again.acked_by is None


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda s: None, "no alarm outfall.ph/high"),
        (lambda s: (s.apply(True), s.apply(False), s.manager.acknowledge(PH, "high", "a")), "is normal"),
        (lambda s: (s.apply(True), s.manager.acknowledge(PH, "high", "a")), "already acknowledged by a"),
        (lambda s: (s.apply(True), s.manager.shelve(PH, "high", "a", "nuisance")), "is shelved"),
        (lambda s: (s.apply(True), s.manager.remove_from_service(PH, "high", "a", "x")), "out of service"),
    ],
)
def test_acknowledge_refused_with_reason(
    st: Station, setup: Callable[[Station], object], message: str
) -> None:
    setup(st)
    with pytest.raises(AlarmError, match=message):
        st.manager.acknowledge(PH, Rule.HIGH, "dana")


def test_bad_operator_input_is_refused(st: Station) -> None:
    st.apply(True)
    with pytest.raises(AlarmError, match="say who you are"):
        st.manager.acknowledge(PH, Rule.HIGH, "  ")
    with pytest.raises(AlarmError, match="unknown rule 'hgih'"):
        st.manager.acknowledge(PH, "hgih", "dana")
    with pytest.raises(AlarmError, match="needs a reason"):
        st.manager.shelve(PH, Rule.HIGH, "dana", " ")
    with pytest.raises(AlarmError, match="in the future"):
        st.manager.shelve(PH, Rule.HIGH, "dana", "nuisance", until=T0 - 1)
    with pytest.raises(AlarmError, match="positive number"):
        st.manager.shelve(PH, Rule.HIGH, "dana", "nuisance", duration=float("nan"))
    with pytest.raises(AlarmError, match="not shelved"):
        st.manager.unshelve(PH, Rule.HIGH, "dana")
    with pytest.raises(AlarmError, match="is in service"):
        st.manager.return_to_service(PH, Rule.HIGH, "dana")
    with pytest.raises(AlarmError, match="not suppressed"):
        st.manager.unsuppress(PH, Rule.HIGH)
    assert st.state() is AlarmState.UNACK  # nothing refused left a trace
    assert [e.event for e in st.manager.journal.entries()] == ["activated"]


def test_shelve_default_cap_and_expiry_by_clock(st: Station) -> None:
    st.apply(True)
    shelved = st.manager.shelve(PH, Rule.HIGH, "dana", "probe being cleaned")
    assert shelved.state is AlarmState.SHELVED
    assert shelved.shelved_until == T0 + 3600  # shelve_default
    assert (shelved.shelved_by, shelved.shelve_reason) == ("dana", "probe being cleaned")
    capped = st.manager.shelve(PH, Rule.HIGH, "dana", "all weekend", duration=3 * 86400)
    assert capped.shelved_until == T0 + 8 * 3600  # shelve_max
    st.clock.advance(8 * 3600 - 1)
    assert st.manager.tick() == []
    st.clock.advance(1)
    (expired,) = st.manager.tick()
    assert expired.state is AlarmState.UNACK  # still active: the operator must see it again
    assert expired.shelved_until is None


def test_shelve_expiry_after_condition_cleared_returns_to_normal(st: Station) -> None:
    st.apply(True)
    st.manager.shelve(PH, Rule.HIGH, "dana", "nuisance", duration=600)
    (during,) = st.apply(False)
    assert during.state is AlarmState.SHELVED and not during.active
    (again,) = st.apply(True)
    assert again.state is AlarmState.SHELVED and again.active  # shelved hides, journal still records
    st.apply(False)
    st.clock.advance(600)
    (expired,) = st.manager.tick()
    assert expired.state is AlarmState.NORMAL
    events = [e.event for e in st.manager.journal.entries()]
    assert events == ["activated", "shelved", "cleared", "activated", "cleared", "shelve_expired"]


def test_unshelve_by_operator(st: Station) -> None:
    st.apply(True)
    st.manager.acknowledge(PH, Rule.HIGH, "dana")
    st.manager.shelve(PH, Rule.HIGH, "dana", "nuisance")
    (back,) = [st.manager.unshelve(PH, Rule.HIGH, "lee")]
    assert back.state is AlarmState.UNACK
    # return_to_service also ends a shelve
    st.manager.shelve(PH, Rule.HIGH, "dana", "nuisance")
    assert st.manager.return_to_service(PH, Rule.HIGH, "lee").state is AlarmState.UNACK


def test_out_of_service_and_return(st: Station) -> None:
    st.apply(True)
    oos = st.manager.remove_from_service(PH, Rule.HIGH, "dana", "probe replaced")
    assert oos.state is AlarmState.OUT_OF_SERVICE
    with pytest.raises(AlarmError, match="already out of service"):
        st.manager.remove_from_service(PH, Rule.HIGH, "dana", "again")
    with pytest.raises(AlarmError, match="return it to service before shelving"):
        st.manager.shelve(PH, Rule.HIGH, "dana", "x")
    (cleared,) = st.apply(False)
    assert cleared.state is AlarmState.OUT_OF_SERVICE
    assert st.manager.return_to_service(PH, Rule.HIGH, "dana").state is AlarmState.NORMAL
    st.manager.remove_from_service(PH, Rule.HIGH, "dana", "probe replaced")
    st.apply(True)
    assert st.manager.return_to_service(PH, Rule.HIGH, "dana").state is AlarmState.UNACK


def test_stale_is_suppressed_while_comm_loss_is_active(st: Station) -> None:
    st.apply(True, rule=Rule.STALE)
    st.apply(True, rule=Rule.COMM_LOSS)
    assert st.state(Rule.STALE) is AlarmState.SUPPRESSED
    assert st.state(Rule.COMM_LOSS) is AlarmState.UNACK
    st.apply(False, rule=Rule.COMM_LOSS)
    assert st.state(Rule.STALE) is AlarmState.UNACK
    st.manager.suppress(PH, Rule.STALE, "pump station bypassed")
    assert st.state(Rule.STALE) is AlarmState.SUPPRESSED
    assert st.manager.unsuppress(PH, Rule.STALE).state is AlarmState.UNACK


def test_priority_per_rule_and_sensor_override(tmp_path: Path) -> None:
    config = Alarms(overrides=[PriorityOverride(sensor=PH, rule=Rule.STALE, priority=Priority.LOW)])
    st = Station(tmp_path / "j.sqlite", config)
    st.apply(True, rule=Rule.STALE)
    st.apply(True, rule=Rule.COMM_LOSS)
    st.apply(True, rule=Rule.LOW)
    prio = {a.rule: a.priority for a in st.manager.alarms()}
    assert prio == {Rule.STALE: Priority.LOW, Rule.COMM_LOSS: Priority.MEDIUM, Rule.LOW: Priority.HIGH}
    assert st.manager.active()[0].rule is Rule.LOW  # highest priority first
    st.manager.close()


def test_chattering_flagged_and_ended(tmp_path: Path) -> None:
    st = Station(tmp_path / "j.sqlite", Alarms(chatter_count=3, chatter_window=60))
    for _ in range(3):
        st.apply(True)
        st.clock.advance(5)
        st.apply(False)
        st.clock.advance(5)
    assert not st.manager.alarms()[0].chattering
    out = st.apply(True)  # the 4th activation inside 60 s
    assert [a.chattering for a in out] == [False, True]
    st.apply(False)
    st.clock.advance(61)
    (calm,) = st.manager.tick()
    assert not calm.chattering
    st.manager.close()


def test_journal_is_append_only(st: Station) -> None:
    st.apply(True)
    db = sqlite3.connect(st.path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE journal SET actor = 'mallory'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM journal")
    db.close()


def _to_normal(s: Station) -> None:
    s.apply(True)
    s.manager.acknowledge(PH, Rule.HIGH, "dana")
    s.apply(False)


def _to_unack(s: Station) -> None:
    s.apply(True)


def _to_acked(s: Station) -> None:
    s.apply(True)
    s.manager.acknowledge(PH, Rule.HIGH, "dana", "on it")


def _to_rtn(s: Station) -> None:
    s.apply(True)
    s.apply(False)


def _to_shelved(s: Station) -> None:
    s.apply(True)
    s.manager.shelve(PH, Rule.HIGH, "dana", "probe cleaning", duration=1800)


def _to_suppressed(s: Station) -> None:
    s.apply(True)
    s.manager.suppress(PH, Rule.HIGH, "unit shut down")


def _to_oos(s: Station) -> None:
    s.apply(True)
    s.manager.remove_from_service(PH, Rule.HIGH, "dana", "probe replaced")


RESTART_CASES = {
    AlarmState.NORMAL: _to_normal,
    AlarmState.UNACK: _to_unack,
    AlarmState.ACKED: _to_acked,
    AlarmState.RTN_UNACK: _to_rtn,
    AlarmState.SHELVED: _to_shelved,
    AlarmState.SUPPRESSED: _to_suppressed,
    AlarmState.OUT_OF_SERVICE: _to_oos,
}


@pytest.mark.parametrize("state", list(RESTART_CASES))
def test_restart_restores_each_state(st: Station, state: AlarmState) -> None:
    RESTART_CASES[state](st)
    st.clock.advance(7)
    before = st.manager.alarms()
    assert before[0].state is state
    after = st.restart().alarms()
    assert after == before  # every field: who acked, note, shelve expiry, times, value
    # and it carries on from there: the restored alarm still obeys the machine
    if state is AlarmState.UNACK:
        assert st.manager.acknowledge(PH, Rule.HIGH, "lee").state is AlarmState.ACKED
    elif state is AlarmState.ACKED:
        assert st.apply(False)[0].state is AlarmState.NORMAL
    elif state is AlarmState.RTN_UNACK:
        assert st.manager.acknowledge(PH, Rule.HIGH, "lee").state is AlarmState.NORMAL
    elif state is AlarmState.SHELVED:
        st.clock.advance(1800)
        assert st.manager.tick()[0].state is AlarmState.UNACK
    elif state is AlarmState.SUPPRESSED:
        assert st.manager.unsuppress(PH, Rule.HIGH).state is AlarmState.UNACK
    elif state is AlarmState.OUT_OF_SERVICE:
        assert st.manager.return_to_service(PH, Rule.HIGH, "lee").state is AlarmState.UNACK
    else:
        assert st.apply(True)[0].state is AlarmState.UNACK


def test_active_conditions_for_seeding_the_engine_after_restart(st: Station) -> None:
    st.apply(True)
    st.apply(True, rule=Rule.STALE)
    st.apply(False, rule=Rule.STALE)
    st.manager.shelve(PH, Rule.HIGH, "dana", "probe cleaning")
    assert st.restart().active_conditions() == [(PH, Rule.HIGH)]


def test_shelve_that_expired_while_the_daemon_was_down(st: Station) -> None:
    _to_shelved(st)
    st.manager.close()
    st.clock.advance(2 * 3600)
    manager = st.restart()
    assert st.state() is AlarmState.SHELVED  # restored as it was ...
    (expired,) = manager.tick()  # ... and the first tick expires it
    assert expired.state is AlarmState.UNACK
    assert [e.event for e in manager.journal.entries()][-1] == "shelve_expired"


def test_journal_open_failure_is_a_state_error(tmp_path: Path) -> None:
    from monitor.errors import StateError

    (tmp_path / "dir.sqlite").mkdir()
    with pytest.raises(StateError, match="cannot open"):
        Journal(tmp_path / "dir.sqlite")


OPS = ["on", "off", "ack", "shelve", "unshelve", "remove", "return", "suppress", "unsuppress", "wait"]


@settings(max_examples=examples(60), deadline=None)
@given(
    st_ops=strategies.lists(
        strategies.tuples(strategies.sampled_from(OPS), strategies.booleans()), max_size=30
    )
)
def test_any_sequence_survives_a_restart(st_ops: list[tuple[str, bool]]) -> None:
    """Whatever operators and the engine do, the replayed journal gives the same alarms,
    and every state agrees with the flags beneath it."""
    with tempfile.TemporaryDirectory() as tmp:
        s = Station(Path(tmp) / "journal.sqlite", Alarms(chatter_count=3, chatter_window=120))
        for op, low in st_ops:
            rule = Rule.LOW if low else Rule.HIGH
            m = s.manager
            try:
                if op in ("on", "off"):
                    s.apply(op == "on", rule=rule)
                elif op == "ack":
                    m.acknowledge(PH, rule, "dana")
                elif op == "shelve":
                    m.shelve(PH, rule, "dana", "test", duration=300)
                elif op == "unshelve":
                    m.unshelve(PH, rule, "dana")
                elif op == "remove":
                    m.remove_from_service(PH, rule, "dana", "test")
                elif op == "return":
                    m.return_to_service(PH, rule, "dana")
                elif op == "suppress":
                    m.suppress(PH, rule, "test")
                elif op == "unsuppress":
                    m.unsuppress(PH, rule)
                else:
                    s.clock.advance(200)
                    m.tick()
            except AlarmError:
                pass
            s.clock.advance(1)
        before = s.manager.alarms()
        for a in before:
            if a.state is AlarmState.UNACK:
                assert a.active and not a.acknowledged
            elif a.state is AlarmState.ACKED:
                assert a.active and a.acknowledged
            elif a.state is AlarmState.RTN_UNACK:
                assert not a.active and not a.acknowledged
            elif a.state is AlarmState.NORMAL:
                assert not a.active and a.acknowledged
            elif a.state is AlarmState.SHELVED:
                assert a.shelved_until is not None
        assert s.restart().alarms() == before
        s.manager.close()


def test_a_clear_stamped_before_the_activation_is_journaled_at_the_activation(
    st: Station, caplog: pytest.LogCaptureFixture
) -> None:
    """A last defence, whichever rule and whoever stamps it (after a restart the reconciler
    ends a restored bad-value or slug alarm with the first good reading, which may be
    stamped earlier: the engine lost the sensor's order). The journal never holds a clear
    before its activation (a negative duration); the clear is stamped at the activation,
    counted, and logged once per alarm with its times."""
    st.clock.set(T0 + 100)
    st.apply(True, rule=Rule.STALE)
    manager = st.restart()
    st.clock.set(T0 + 50)  # the reading's own time, as the reconciler stamps its clear
    (cleared,) = st.apply(False, rule=Rule.STALE)
    assert (cleared.activated_at, cleared.cleared_at) == (T0 + 100, T0 + 100)
    rows = [(e.event, e.time - T0) for e in manager.journal.entries()]
    assert rows == [("activated", 100.0), ("cleared", 100.0)]
    assert manager.early_clears == 1
    warnings = [r.getMessage() for r in caplog.records if "before its activation" in r.getMessage()]
    assert len(warnings) == 1 and f"{PH}/stale" in warnings[0], warnings
    st.clock.set(T0 + 200)
    st.apply(True, rule=Rule.STALE)
    st.clock.set(T0 + 150)
    st.apply(False, rule=Rule.STALE)
    assert manager.early_clears == 2
    assert [(e.event, e.time - T0) for e in manager.journal.entries()][-1] == ("cleared", 200.0)
    assert sum("before its activation" in r.getMessage() for r in caplog.records) == 1
