"""A float bouncing at the spill crest while the level transmitter reads live just under
`overflow` (crest): one spill, not a record, a page and an SSO report per bounce."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from monitor.alarms import AlarmManager
from monitor.config import Config, build_config, load_config
from monitor.model import ConditionState, ManualClock, Rule, Sample, iso
from monitor.station import StationStore, StationTracker
from monitor.station.report import overflow_figures
from tests import cli
from tests.smtp import MailServer
from tests.test_callout import ALICE, BOB, Rig, certs, raw_config, smtp
from tests.test_station_tracker import T0, feed, station

__all__ = ["certs", "smtp"]  # the call-out tests' fixtures: a real SMTP server

BOUNCES = 8
ON_POLLS = 24  # the float on 4 min (24 polls of 10 s), then off for one poll
CYCLE = ON_POLLS + 1


def crest(level: float = 8.95, falls: float = 8.0) -> list[Sample]:
    """The level live at `level` (under the 9 ft setpoint) every 10 s, the float on 4 min then
    off for one poll, eight times; then off, and the level falls to `falls`."""
    samples = [Sample("p1", T0 - 1, 0.0), Sample("p2", T0 - 1, 0.0)]
    for k in range(BOUNCES * CYCLE + 30):
        t = T0 + 10 * k
        on = k < BOUNCES * CYCLE and k % CYCLE != ON_POLLS
        lvl = level if k < BOUNCES * CYCLE + 3 else falls
        samples += [
            Sample("lvl", t, lvl),
            Sample("switch", t, 1.0 if on else 0.0),
            Sample("inflow", t, 600.0),
        ]
    return samples


def starts() -> list[float]:
    return [T0 + 10 * CYCLE * b for b in range(BOUNCES)]


def ends() -> list[float]:
    return [T0 + 10 * (CYCLE * b + ON_POLLS) for b in range(BOUNCES)]


def test_a_float_bouncing_at_the_crest_is_one_spill(tmp_path: Path) -> None:
    """Before: eight records, eight `overflow` ACTIVEs (eight pages), nothing linking them:
    eight SSO reports of 0 gal for one event. Now each stretch is its own record with its
    real start and end (the alarm still returns to normal at each off: an ordinary spill's
    end is not held back), and each after the first continues the first."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    conds = [c for c in feed(tracker, crest()) if c.rule is Rule.OVERFLOW]
    recs = store.overflows(T0 - 60, T0 + 86_400)
    assert [(r.start, r.end) for r in recs] == list(zip(starts(), ends(), strict=True))
    assert [r.continues for r in recs] == [None] + [T0] * (BOUNCES - 1)
    assert [r.gap_from for r in recs[1:]] == ends()[:-1]
    actives = [c for c in conds if c.state is ConditionState.ACTIVE]
    assert [c.extra.get("continues") for c in actives] == [None] + [T0] * (BOUNCES - 1)
    assert "continues the overflow from" in actives[1].message
    # The volume: the level read under the setpoint throughout, so the weir or inflow method
    # gives 0 gal; the record says that rests on the level, the switch alone said it spilled.
    for r in recs:
        assert r.volume_gal == 0.0
        assert r.volume_note.startswith("partial: ") and "overflow switch alone" in r.volume_note
    store.close()


def test_a_level_clearly_below_the_setpoint_between_bounces_parts_the_spills(tmp_path: Path) -> None:
    """The level read 8.5 ft (clearly under 9) in the float's off poll: the well fell away from
    the crest, the next on is another spill, as before."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = crest()
    off = {T0 + 10 * (CYCLE * b + ON_POLLS) for b in range(BOUNCES)}
    samples = [Sample("lvl", s.time, 8.5) if s.sensor == "lvl" and s.time in off else s for s in samples]
    feed(tracker, samples)
    assert [r.continues for r in store.overflows(T0 - 60, T0 + 86_400)] == [None] * BOUNCES
    store.close()


def test_an_ordinary_spill_end_is_not_held_back(tmp_path: Path) -> None:
    """The level over the setpoint, then under it, then the float off: the record and the
    alarm end at the float's off, not a window later (the reviewer's off-delay did)."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = [Sample("p1", T0 - 1, 0.0), Sample("p2", T0 - 1, 0.0)]
    for k in range(60):
        t = T0 + 10 * k
        lvl = 9.3 if k < 20 else 8.95 if k < 25 else 8.0
        samples += [Sample("lvl", t, lvl), Sample("switch", t, 1.0 if k < 22 else 0.0)]
    conds = [c for c in feed(tracker, samples) if c.rule is Rule.OVERFLOW]
    assert [(c.time - T0, c.state) for c in conds] == [
        (0.0, ConditionState.ACTIVE),
        (220.0, ConditionState.CLEARED),
    ]
    (rec,) = store.overflows(T0 - 60, T0 + 3600)
    assert rec.end == T0 + 220
    store.close()


@pytest.mark.parametrize("saved", [True, False], ids=["stopped", "killed"])
def test_a_restart_in_the_chatter_keeps_one_spill(tmp_path: Path, saved: bool) -> None:
    """The daemon restarts in the float's off poll of the third bounce (stopped, or killed -9
    with no save): the bounces after it still continue the first record."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = crest()
    cut = T0 + 10 * (CYCLE * 2 + ON_POLLS)
    feed(tracker, [s for s in samples if s.time <= cut])
    if saved:
        tracker.save()
    store.close()
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store, resume=True)
    feed(tracker, [s for s in samples if s.time > cut])
    recs = store.overflows(T0 - 60, T0 + 86_400)
    assert [(r.start, r.end) for r in recs] == list(zip(starts(), ends(), strict=True))
    assert [r.continues for r in recs] == [None] + [T0] * (BOUNCES - 1)
    store.close()


@pytest.mark.parametrize("delta", [-3600.0, 3600.0], ids=["stepped-back", "stepped-forward"])
def test_a_clock_step_in_the_chatter_keeps_one_spill(tmp_path: Path, delta: float) -> None:
    """NTP steps the gateway clock an hour in the float's off poll of the third bounce; the
    readings after it are stamped on the new clock. The next on is 10 s later in real time:
    it continues the spill, its gap measured on the new clock."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = crest()
    cut = T0 + 10 * (CYCLE * 2 + ON_POLLS)
    feed(tracker, [s for s in samples if s.time <= cut])
    tracker.shift(delta)
    feed(tracker, [Sample(s.sensor, s.time + delta, s.value, s.quality) for s in samples if s.time > cut])
    recs = store.overflows(T0 - 7200, T0 + 86_400)
    assert len(recs) == BOUNCES
    (head,) = [r for r in recs if r.start == T0]  # stepped back: the later records sort first
    assert head.continues is None
    assert [r.continues for r in recs if r is not head] == [T0] * (BOUNCES - 1)
    third_on = [r for r in recs if r.start == starts()[3] + delta]
    assert third_on and third_on[0].gap_from == cut + delta
    store.close()


def _paging_config(tmp_path: Path, port: int, delay: str = "1h") -> Config:
    """The station above with a call-out pipeline for `overflow` (a real SMTP server)."""
    raw = raw_config(tmp_path, port, delay=delay, match={"rules": ["overflow"]})
    well = station(tmp_path)
    raw["sensors"] = [s.model_dump(mode="json", exclude_none=True) for s in well.sensors]
    raw["wet_well"] = well.wet_well.model_dump(mode="json", exclude_none=True) if well.wet_well else None
    return build_config(raw)


@pytest.mark.parametrize("restart", [False, True], ids=["live", "restarted"])
def test_one_page_for_a_float_bouncing_at_the_crest(tmp_path: Path, smtp: MailServer, restart: bool) -> None:
    """The tracker's conditions into the alarm manager and the call-out, mails to a real SMTP
    server. Before: eight `overflow` activations, eight pages to the person on call (each
    clear ended the escalation, each on started one). Now the activations that continue the
    spill are journaled but page nobody: one page. `restarted`: the daemon's alarms and
    call-out restart in the fourth stretch (the continuing alarm active, unacknowledged):
    the resumed call-out does not page for it either."""
    config = _paging_config(tmp_path, smtp.port)

    async def go() -> None:
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store)
        rig = Rig(config, ManualClock(T0 - 1))
        try:
            for s in crest():
                if s.time > rig.clock.now():
                    rig.clock.set(s.time)
                for c in tracker.feed(s):
                    rig.manager.apply(c)
                await rig.step()
                if restart and s.time == starts()[3] + 60 and s.sensor == "inflow":
                    await rig.close()
                    rig = Rig(config, ManualClock(s.time))
                    rig.callout.resume()
            assert len(store.overflows(T0 - 60, T0 + 86_400)) == BOUNCES
            [page] = smtp.to(ALICE)
            assert "overflow" in page.subject
        finally:
            await rig.close()
            store.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    "restart", [None, starts()[3] + 60, ends()[2]], ids=["live", "restarted", "restarted-in-the-off"]
)
@pytest.mark.parametrize(
    "ack", [None, T0 + 30, ends()[0]], ids=["unacknowledged", "acknowledged", "acked-cleared"]
)
def test_the_chatter_walks_the_roster_as_one_long_alarm(
    tmp_path: Path, smtp: MailServer, ack: float | None, restart: float | None
) -> None:
    """Alice paged at the first on, a 15-min step delay, the float bouncing 8 times in 4-min
    stretches (32 min), mails to a real SMTP server. Before: the first clear (stop_on_clear)
    ended the escalation and every continuation paged nobody: Alice asleep, Bob never told
    while the well spilled for half an hour. Now a continuation of a spill whose escalation a
    clear ended unacknowledged resumes it: Bob paged at 15 min (the time waited counted), as
    for one long alarm. `acknowledged`: Alice acks the first page; nobody else is paged.
    `acked-cleared`: she acks it in the first off (the alarm returned to normal, its
    escalation ended by the clear): nobody else either.
    `restarted`: alarms and call-out restart in the fourth stretch (12 min, before Bob's
    step): the resumed escalation still pages Bob at 15 min, once. `restarted-in-the-off`:
    in the third bounce's off poll (the alarm returned to normal, its escalation ended by
    the clear): the next on resumes it from the store."""
    config = _paging_config(tmp_path, smtp.port, delay="15m")
    bob_at: list[float] = []

    async def go() -> None:
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store)
        rig = Rig(config, ManualClock(T0 - 1))
        try:
            for s in crest():
                if s.time > rig.clock.now():
                    rig.clock.set(s.time)
                for c in tracker.feed(s):
                    rig.manager.apply(c)
                await rig.step()
                if s.time == ack and s.sensor == "inflow":
                    assert len(smtp.to(ALICE)) == 1
                    rig.manager.acknowledge("lvl", Rule.OVERFLOW, "Alice Smith")
                if not bob_at and smtp.to(BOB):
                    bob_at.append(rig.clock.now())
                if s.time == restart and s.sensor == "inflow":
                    await rig.close()
                    rig = Rig(config, ManualClock(s.time))
                    rig.callout.resume()
            for _ in range(12):  # an hour after the spill: nothing more due
                await rig.step(300)
            assert len(store.overflows(T0 - 60, T0 + 86_400)) == BOUNCES
            assert len(smtp.to(ALICE)) == 1
            if ack is not None:
                assert smtp.to(BOB) == []
            else:
                [bob] = smtp.to(BOB)
                assert T0 + 900 <= bob_at[0] <= T0 + 900 + 10
                assert f"continues the overflow from {iso(T0)}" in bob.body  # not "since" a bounce alone
        finally:
            await rig.close()
            store.close()

    asyncio.run(go())


def test_killed_between_the_journal_and_the_callout_at_a_bounce_pages_no_one_again(
    tmp_path: Path, smtp: MailServer
) -> None:
    """The daemon killed at the second stretch's on, after the journal committed the
    continuing `overflow` activation and before the call-out stored it (the manager alone
    applies it here: the call-out's listener is what the kill cut off). Before: the restart's
    `resume` took it for an alarm the store never saw and started a new escalation: Alice
    paged again at 4 min, Bob's step put back to 19 min. Now `resume` reads the activation's
    journal note and walks the spill's escalation on: one page to Alice, Bob at 15 min."""
    config = _paging_config(tmp_path, smtp.port, delay="15m")
    bob_at: list[float] = []

    async def go() -> None:
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store)
        rig = Rig(config, ManualClock(T0 - 1))
        try:
            for s in crest():
                if s.time > rig.clock.now():
                    rig.clock.set(s.time)
                conds = tracker.feed(s)
                if s.time == starts()[1] and any(c.rule is Rule.OVERFLOW for c in conds):
                    await rig.close()
                    alone = AlarmManager.open(config, ManualClock(s.time))
                    for c in conds:
                        alone.apply(c)
                    alone.close()
                    rig = Rig(config, ManualClock(s.time))
                    rig.callout.resume()
                else:
                    for c in conds:
                        rig.manager.apply(c)
                await rig.step()
                if not bob_at and smtp.to(BOB):
                    bob_at.append(rig.clock.now())
            assert len(smtp.to(ALICE)) == 1
            assert len(smtp.to(BOB)) == 1
            assert T0 + 900 <= bob_at[0] <= T0 + 900 + 10
        finally:
            await rig.close()
            store.close()

    asyncio.run(go())


@pytest.mark.parametrize("delta", [-86_400.0, 3600.0], ids=["stepped-back-a-day", "stepped-forward"])
def test_a_clock_step_between_bounces_keeps_bob_s_step_on_the_new_clock(
    tmp_path: Path, smtp: MailServer, delta: float
) -> None:
    """Alice paged at the first on (15-min delay), NTP steps the gateway clock in the first
    off poll (the clear ended her escalation, its next step kept due T0 + 15 min on the old
    clock); the readings after it are stamped on the new clock. Before: the continuation
    resumed the step due at that old time: a day back, Bob due a day on (never told while
    the well spilled); an hour forward, overdue, Bob paged at once, 11 min early. Now the
    kept due time moves with the clock as a running step does: Bob at 15 min real time."""
    config = _paging_config(tmp_path, smtp.port, delay="15m")
    bob_at: list[float] = []

    async def go() -> None:
        store = StationStore.open(config.state_dir)
        tracker = StationTracker(config, store)
        rig = Rig(config, ManualClock(T0 - 1))
        cut = ends()[0]
        shift = 0.0
        try:
            for s in crest():
                if s.time > cut and not shift:
                    shift = delta
                    tracker.shift(delta)
                    rig.clock.set(cut + delta)
                    rig.callout.clock_step(delta)
                t = s.time + shift
                if t > rig.clock.now():
                    rig.clock.set(t)
                for c in tracker.feed(Sample(s.sensor, t, s.value, s.quality)):
                    rig.manager.apply(c)
                await rig.step()
                if not bob_at and smtp.to(BOB):
                    bob_at.append(rig.clock.now() - shift)
            for _ in range(12):
                await rig.step(300)
            assert len(smtp.to(ALICE)) == 1
            assert len(smtp.to(BOB)) == 1
            assert T0 + 900 <= bob_at[0] <= T0 + 900 + 10
        finally:
            await rig.close()
            store.close()

    asyncio.run(go())


def test_a_full_disk_in_the_chatter_still_links_and_the_store_takes_writes_again(tiny_disk: Path) -> None:
    """The state disk (a real 3 MB tmpfs) fills in the third stretch: the crest candidate's
    write (one transaction, `StationStore.save_spill`) fails, logged and counted, never a
    crash; the link held in memory still continues the spill, and once there is room the
    store takes writes again: the records refused are written, the chain whole."""
    config = station(tiny_disk)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    samples = crest()
    cut = starts()[2] + 60
    feed(tracker, [s for s in samples if s.time <= cut])
    st = os.statvfs(tiny_disk)
    ballast = tiny_disk / "ballast"
    with ballast.open("wb", buffering=0) as f:
        try:
            for _ in range(st.f_blocks):
                f.write(b"\0" * st.f_frsize)
        except OSError:
            pass  # full: the disk's last block taken
    later = [s for s in samples if s.time > cut]
    conds = feed(tracker, [s for s in later if s.time <= starts()[3] + 60])
    assert tracker.store_errors > 0
    assert [c.extra.get("continues") for c in conds if c.state is ConditionState.ACTIVE] == [T0]
    ballast.unlink()
    feed(tracker, [s for s in later if s.time > starts()[3] + 60])
    tracker.save()
    recs = store.overflows(T0 - 60, T0 + 86_400)
    assert [r.continues for r in recs] == [None] + [T0] * (BOUNCES - 1)
    store.close()


def test_the_text_report_says_the_level_was_read_in_a_crest_gap(tmp_path: Path) -> None:
    """`monitor pumps report --format text` on the crest's eight records. Before: each
    continuing line said "(not measured from its end, T, to this start)", the dead-level
    chain's words: an inspector read a gap in the measurement where the level was read every
    10 s, just under the setpoint. Now it says the float was off and what the level read;
    the JSON carries that level (`continues_gap_level`). The dead-level chain keeps its words
    (tests/test_station_overflow_link.py)."""
    raw = {
        "station": {"id": "t", "timezone": "America/New_York"},
        "state_dir": str(tmp_path / "state"),
        "sensors": [
            {"id": "lvl", "kind": "level", "unit": "ft",
             "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}},
            {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
            {"id": "inflow", "kind": "flow", "unit": "gpm"},
            {"id": "switch", "kind": "status"},
        ],
        "wet_well": {"level": "lvl", "inflow": "inflow", "overflow_switch": "switch"},
    }  # fmt: skip
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = load_config(path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, crest())
    tracker.save()
    figures = overflow_figures(store, T0 - 60, T0 + 3600, config.station.zone)
    store.close()
    assert [o["continues_gap_level"] for o in figures] == [None] + [8.95] * (BOUNCES - 1)
    start, end = iso(T0 - 60), iso(T0 + 3600)
    out = cli.run_monitor(
        "pumps", "report", "--config", str(path), "--start", start, "--end", end, "--format", "text"
    )
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if "overflow lvl" in x]
    assert len(lines) == BOUNCES
    for line in lines[1:]:
        assert "not measured" not in line
        assert "(the overflow switch off for 10 s, the level read 8.95, under overflow)" in line


def test_every_record_of_the_chatter_is_due_when_the_spill_is(tmp_path: Path) -> None:
    """One spill, one SSO report, due `report_within` after the spill's first start. Before:
    each continuing record was due 2 h after its own start, the last bounce's at 2 h 28 min:
    the console showed the live record's report not yet overdue while the spill's was, and
    `monitor pumps report` gave eight due times for one report."""
    config = station(tmp_path)
    store = StationStore.open(config.state_dir)
    tracker = StationTracker(config, store)
    feed(tracker, crest())
    recs = store.overflows(T0 - 60, T0 + 86_400)
    assert [r.due for r in recs] == [T0 + 7200.0] * BOUNCES
    store.close()


@pytest.mark.parametrize(("unit", "per_ft"), [("m", 0.3048), ("in", 12.0)])
def test_the_crest_margin_is_taken_in_the_level_s_own_unit(tmp_path: Path, unit: str, per_ft: float) -> None:
    """The level and its setpoints in metres or inches: the 2 % margin is of the span in that
    unit, so the chatter 0.05 ft under the setpoint is one spill and the level 1 ft under
    (well past the margin) parts it, as in feet (a margin taken in feet on a level in inches
    parted every bounce; one in inches on a level in metres never would)."""

    def cfg(sub: str) -> Config:
        sp = {
            k: v * per_ft for k, v in {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9}.items()
        }
        return build_config({
            "station": {"id": "t", "timezone": "America/New_York"},
            "state_dir": str(tmp_path / sub),
            "sensors": [
                {"id": "lvl", "kind": "level", "unit": unit, "setpoints": sp},
                {"id": "p1", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                {"id": "p2", "kind": "pump", "pump": {"capacity": "500 gpm"}},
                {"id": "inflow", "kind": "flow", "unit": "gpm"},
                {"id": "switch", "kind": "status"},
            ],
            "wet_well": {"level": "lvl", "inflow": "inflow", "overflow_switch": "switch"},
        })  # fmt: skip

    for level, linked in ((8.95, BOUNCES - 1), (8.0, 0)):
        config = cfg(f"state-{level}")
        store = StationStore.open(config.state_dir)
        samples = [
            Sample(s.sensor, s.time, s.value * per_ft) if s.sensor == "lvl" else s for s in crest(level)
        ]
        feed(StationTracker(config, store), samples)
        recs = store.overflows(T0 - 60, T0 + 86_400)
        assert len(recs) == BOUNCES
        assert sum(r.continues is not None for r in recs) == linked
        store.close()
