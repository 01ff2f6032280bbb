"""The frozen-value rule at its edges, as the field and a damaged state file give them: a
band set to the instrument's last digit, a checkpoint entry that makes no sense, a kind
whose reading holds by nature, the page a person reads at night."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, expect

from monitor.config import Config, build_config
from monitor.daemon import Daemon
from monitor.engine import Engine, load_checkpoint_or_start_fresh, restore_checkpoint, save_checkpoint
from monitor.model import Condition, ConditionState, ManualClock, Rule, Sample
from tests.console import T0 as CONSOLE_T0
from tests.console import LiveConsole, TableView, fill_day
from tests.engine_helpers import T0, canon, every, live, run_live, station
from tests.mqtt_tools import make_ca
from tests.smtp import MailServer
from tests.test_callout import ALICE, TR, Station, raw_config, write_heartbeat
from tests.test_pipeline import close as close_daemon

ACTIVE = ConditionState.ACTIVE
HOUR = 3600.0

TEMP = station(
    {"id": "temp", "kind": "temperature", "unit": "degC", "frozen_after": "1h", "frozen_band": 0.1}
)


@pytest.mark.parametrize(
    "pair",
    [
        (21.5, 21.6),  # 21.6 - 21.5 is 0.10000000000000142 in binary floating point
        (1.0, 1.1),  # 0.10000000000000009
        (7.0, 7.1),  # 0.09999999999999964: was the only kind that alarmed
        (215 * 0.1, 216 * 0.1),  # an INT16 register x 0.1 (scale) toggling its last bit
        (float(np.float32(21.5)), float(np.float32(21.6))),  # a FLOAT32 register pair
    ],
)
def test_a_band_of_the_last_digit_holds_a_toggle_of_that_digit_whatever_the_value(
    pair: tuple[float, float],
) -> None:
    """`frozen_band: 0.1` on an instrument of 0.1 resolution whose last digit toggles: the
    docs say the band is for exactly that. Compared in binary floating point, 21.5 and 21.6
    are 0.10000000000000142 apart and counted a change, so a stuck 21.5/21.6 transmitter
    never alarmed, while 7.0/7.1 did: whether a stuck instrument alarmed depended on the
    value it stuck at."""
    points = every(10.0, list(pair) * 200)  # 4000 s of the toggle
    engine, out = run_live(TEMP, "temp", points)
    raised = [c for c in out if c.rule is Rule.FROZEN]
    assert [c.state for c in raised] == [ACTIVE], pair
    assert raised[0].time == T0 + 3610.0
    # The replay path gives the same (one definition).
    batch = Engine(TEMP.rules, ManualClock())
    times, values = np.array([t for t, _ in points]), np.array([v for _, v in points])
    got = batch.replay(np.zeros(len(points), np.int32), times, values)
    assert canon([c for c in got.conditions if c.rule is Rule.FROZEN]) == canon(raised)
    # A real step of two digits is still a change.
    more = live(engine, [Sample("temp", points[-1][0] + 10.0, pair[0] + 0.2)])
    assert [c.state for c in more if c.rule is Rule.FROZEN] == [ConditionState.CLEARED]


# --- the page a person reads at night ------------------------------------------------


@pytest.fixture
def smtp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MailServer]:
    """A real SMTP server with STARTTLS and a login, as tests/test_callout.py's."""
    certs = make_ca(tmp_path / "ca")
    monkeypatch.setenv("CALLOUT_SMTP_PASSWORD", "mail-pw")
    monkeypatch.setenv("CALLOUT_LINK_SECRET", "link-secret-for-tests")
    monkeypatch.setenv("CALLOUT_CA", str(certs["ca"]))
    with MailServer(users={"monitor": "mail-pw"}, certs=certs) as server:
        yield server


def test_a_frozen_page_gives_its_limit_as_a_time(tmp_path: Path, smtp: MailServer) -> None:
    """The page's figures line printed every limit in the sensor's unit: a frozen outfall
    temperature paged "value 68 degF, limit 3600 degF" (frozen_after in seconds, as a
    temperature), and a stale one "limit 300 degF". It says how long now."""
    raw = raw_config(tmp_path, smtp.port)
    raw["sensors"].append({"id": "outfall.temp", "kind": "temperature", "unit": "degF", "frozen_after": "1h"})
    raw["notify"]["pipelines"][0]["match"] = {"rules": ["frozen", "stale"], "sensors": ["outfall.temp"]}
    config = build_config(raw)
    write_heartbeat(config.state_dir, TR - 3 * 3600)
    now = TR

    async def pages(st: Station) -> int:
        """Two timer ticks 10 s apart (the pipeline's delay is 5 s): the messages they sent."""
        sent = await st.tick(st.wall.now() + 10.0, 10.0)
        return sent + await st.tick(st.wall.now() + 10.0, 10.0)

    async def go() -> None:
        st = Station(config, now - 3700.0)
        try:
            for i in range(63):  # 68.0 degF every minute: frozen past 1 h
                if i:
                    await st.tick(now - 3700.0 + 60.0 * i, 60.0)
                st.daemon.pipeline.process([Sample("outfall.temp", st.wall.now(), 68.0)])
            alarm = st.daemon.alarms.get("outfall.temp", Rule.FROZEN)
            assert alarm is not None and alarm.active
            await pages(st)
            [page] = smtp.to(ALICE)
            assert "outfall.temp frozen" in page.subject
            assert "degF, limit 3600" not in page.body and "3600 degF" not in page.body, page.body
            assert "value 68 degF, unchanged for longer than 1 h" in page.body, page.body
            # Stale: the limit is stale_after, a time too.
            st.daemon.alarms.apply(
                Condition(st.wall.now(), "outfall.temp", Rule.STALE, ConditionState.ACTIVE, 68.0, 300.0, "")
            )
            assert await pages(st) >= 1
            page = smtp.to(ALICE)[-1]
            assert "outfall.temp stale" in page.subject
            assert "300 degF" not in page.body, page.body
            assert "last value 68 degF, no reading for longer than 5 min" in page.body, page.body
        finally:
            await st.close()

    asyncio.run(go())


def test_a_stale_page_of_a_sensor_never_read_names_no_value() -> None:
    """Stale since the start (no good reading yet): "last value nan gpm" said nothing."""
    from monitor.callout.message import figures
    from monitor.model import Alarm, AlarmState, Priority

    never = Alarm("flow", Rule.STALE, AlarmState.UNACK, Priority.MEDIUM, float("nan"), 300.0, "")
    assert figures(never, "gpm") == "no reading for longer than 5 min"


# --- a checkpoint entry that makes no sense --------------------------------------------

PH = station({"id": "ph", "kind": "ph", "frozen_after": "6h", "stale_after": "5m"})


def _tamper(path: Path, **frozen: object) -> None:
    """Rewrite the checkpoint's `frozen` entry of the one sensor (a damaged or edited file)."""
    with np.load(path, allow_pickle=False) as z:
        doc = json.loads(str(z["meta"]))
        sums, counts = z["sums"], z["counts"]
    doc["state"][0]["frozen"].update(frozen)
    with path.open("wb") as f:
        np.savez(f, meta=np.array(json.dumps(doc)), sums=sums, counts=counts)


@pytest.mark.parametrize(
    "entry",
    [
        {"since": 1e308},  # later than its own last reading: t - since never passes 6 h
        {"since": float("nan")},  # the age is NaN: never more than 6 h
        {"last": float("inf"), "since": float("inf")},
        {"ref": float("inf")},
        {"ref": "7.0 pH"},  # not a number: the whole file was refused (baselines warm up again)
        {"since": None},
        {"active": "false"},  # bool("false") is True: an alarm held that was never raised
        {"active": 1},
    ],
)
def test_a_checkpoint_frozen_entry_that_makes_no_sense_starts_the_run_afresh(
    tmp_path: Path, entry: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    """The run starts at the next reading, as from a file without the entry, and the rest of
    the checkpoint (baselines, limits) is restored; logged once, naming the sensor. Before,
    `since` later than the run's last reading (or NaN) silenced the rule until the value
    changed, which a held value never does; garbage threw the whole checkpoint away."""
    engine = Engine(PH.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * 1800)])  # 5 h of 7.00
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    _tamper(path, **entry)
    again = Engine(PH.rules, ManualClock())
    with caplog.at_level(logging.WARNING):
        assert restore_checkpoint(again, path) == ["ph"]
    assert "ph" in caplog.text and "frozen" in caplog.text
    assert again.status("ph").active == ()
    start = T0 + 5 * HOUR
    out = live(again, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * (6 * 360 + 2), start=start)])
    raised = [c for c in out if c.rule is Rule.FROZEN]
    assert [c.state for c in raised] == [ACTIVE]
    assert raised[0].time == start + 6 * HOUR + 10.0  # counted from the first reading after the restart


def test_a_sound_checkpoint_frozen_entry_is_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The check refuses only nonsense: a run restored whole raises at its own 6 h."""
    engine = Engine(PH.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * 1800)])
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    again = Engine(PH.rules, ManualClock())
    with caplog.at_level(logging.WARNING):
        restore_checkpoint(again, path)
    assert "frozen" not in caplog.text
    out = live(again, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * 400, start=T0 + 5 * HOUR)])
    assert [c.time for c in out if c.rule is Rule.FROZEN] == [T0 + 6 * HOUR + 10.0]


# --- kinds whose reading holds by nature -------------------------------------------------


@pytest.mark.parametrize("kind", ["pump", "status"])
def test_an_on_off_signal_has_no_frozen_rule(kind: str) -> None:
    """A pump's run feedback or a status contact (0 or 1) holds for days by nature: a standby
    pump off all week, a wet-well door shut. `frozen_after` there pages someone about a
    healthy signal at night, and cannot see a stuck one (pump alarms judge a pump:
    fail_to_start, long_run). Refused at load, naming the key, as on a meter."""
    from monitor.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        station({"id": "p1", "kind": kind, "frozen_after": "6h"})
    assert "sensors[0].frozen_after:" in str(err.value) and "on/off" in str(err.value)


@pytest.mark.parametrize(
    "sensor",
    [
        {"id": "well", "kind": "level", "unit": "ft"},  # a stuck level transducer: the classic overflow
        {
            "id": "rise",
            "kind": "derived",
            "unit": "gpm",
            "expression": "area * rate(well, 60s)",
            "constants": {"area": "80 ft2"},
        },
    ],
)
def test_a_level_or_a_derived_sensor_may_have_the_rule(sensor: dict[str, object]) -> None:
    extra = [] if sensor["id"] == "well" else [{"id": "well", "kind": "level", "unit": "ft"}]
    config = station({**sensor, "frozen_after": "2h"}, *extra)
    assert config.rules[str(sensor["id"])].frozen_after == 7200.0


# --- a reload (SIGHUP) or restart that changes frozen_after -----------------------------


def _daemon_config(state: Path, **frozen: object) -> Config:
    sensor = {"id": "ph", "kind": "ph", "stale_after": "5m", **frozen}
    return build_config(
        {
            "station": {"id": "ps-frozen"},
            "state_dir": str(state),
            "sensors": [sensor, {"id": "flow", "kind": "flow", "unit": "gpm"}],
            "console": {"enabled": False},
            "store": {"free_space_floor": 0},
        }
    )


def _raise_frozen(state: Path, clock: ManualClock) -> None:
    first = Daemon(_daemon_config(state, frozen_after="1h"), clock)
    try:
        first.pipeline.process([Sample("ph", T0 + 60.0 * i, 7.0) for i in range(62)])
        alarm = first.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and alarm.active
        first.checkpoint()
    finally:
        close_daemon(first)


def test_frozen_after_removed_while_active_clears_the_alarm_at_once_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reload (a new daemon in the process, as SIGHUP starts it) with `frozen_after` taken
    off a sensor whose frozen alarm is active: nothing judges that rule any more. Before, it
    stood until the sensor's next good reading ended it as "not active after restart", and
    for ever while the sensor was silent; now the first tick clears it, saying why."""
    clock = ManualClock(T0 + 3720.0)
    _raise_frozen(tmp_path / "state", clock)
    clock.set(T0 + 3800.0)
    again = Daemon(_daemon_config(tmp_path / "state"), clock)
    try:
        with caplog.at_level(logging.WARNING, logger="monitor.reconcile"):
            again.pipeline.tick(clock.now())
        alarm = again.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 3800.0
        assert alarm.message == "frozen_after removed from the configuration"
        assert "ph/frozen" in caplog.text and "frozen_after" in caplog.text
    finally:
        close_daemon(again)


def test_frozen_after_changed_while_active_keeps_the_alarm_until_a_change(tmp_path: Path) -> None:
    """Lengthened from 1 h to 12 h while active: the alarm stands (the reading has not
    changed), neither cleared by the reload nor raised twice; the first change clears it."""
    clock = ManualClock(T0 + 3720.0)
    _raise_frozen(tmp_path / "state", clock)
    clock.set(T0 + 3800.0)
    again = Daemon(_daemon_config(tmp_path / "state", frozen_after="12h"), clock)
    try:
        again.pipeline.tick(clock.now())
        again.pipeline.process([Sample("ph", T0 + 3800.0 + i, 7.0) for i in range(3)])
        alarm = again.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and alarm.active
        again.pipeline.process([Sample("ph", T0 + 3810.0, 7.2)])
        alarm = again.alarms.get("ph", Rule.FROZEN)
        assert alarm is not None and not alarm.active and alarm.cleared_at == T0 + 3810.0
    finally:
        close_daemon(again)


# --- the console -------------------------------------------------------------------------


def test_the_console_gives_a_frozen_or_stale_limit_as_a_time(browser: Browser, tmp_path: Path) -> None:
    """The alarm card read "7.2 (limit 21600)" for a frozen pH and "412 gpm (limit 300)" for a
    stale flow: a time in seconds shown as a threshold of the reading. Real Chromium."""
    view = TableView(tmp_path / "journal.sqlite", ManualClock(CONSOLE_T0))
    fill_day(view, CONSOLE_T0 - 86400)
    with LiveConsole(view, refresh=0.3) as console:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(console.url)
        expect(page.locator("#live")).to_have_text("live")
        t = CONSOLE_T0 + 60
        frozen = Condition(t, "outfall.ph", Rule.FROZEN, ACTIVE, 7.2, 21600.0, "station config: frozen_after")
        stale = Condition(t, "outfall.flow", Rule.STALE, ACTIVE, 412.0, 300.0, "station config: stale_after")
        console.call(lambda: view.alarms.apply(frozen))
        console.call(lambda: view.alarms.apply(stale))
        ph = page.locator('article.alarm[data-key="outfall.ph/frozen"]')
        expect(ph).to_contain_text("7.2 (unchanged for longer than 6 h)")
        expect(ph).not_to_contain_text("21600")
        flow = page.locator('article.alarm[data-key="outfall.flow/stale"]')
        expect(flow).to_contain_text("412 gpm (no reading for longer than 5 min)")
        expect(flow).not_to_contain_text("limit 300")
        page.close()


# --- what the clear says -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "sensor", "held", "changed", "message"),
    [
        (PH, "ph", 7.0, 7.004, "pH reading changed: 7.004 (was 7.000)"),
        (
            station({"id": "t", "kind": "temperature", "unit": "degF", "frozen_after": "1h"}),
            "t",
            121.55,
            121.56,
            "temperature reading changed: 121.56 degF (was 121.55 degF)",
        ),
        (PH, "ph", 7.0, 7.04, "pH reading changed: 7.04 (was 7.00)"),  # as before when it shows
    ],
)
def test_the_clear_shows_the_change_it_saw(
    config: Config, sensor: str, held: float, changed: float, message: str
) -> None:
    """A probe of three decimals (or a reading of five figures) cleared saying "pH reading
    changed: 7.00 (was 7.00)": the digits shown hid the change that ended the alarm."""
    points = every(60.0, [held] * (6 * 60 + 2))
    engine, out = run_live(config, sensor, points)
    assert [c.state for c in out if c.rule is Rule.FROZEN] == [ACTIVE]
    (cleared,) = [
        c for c in live(engine, [Sample(sensor, points[-1][0] + 60.0, changed)]) if c.rule is Rule.FROZEN
    ]
    assert cleared.message == message


# --- frozen_after against the poll that feeds it -----------------------------------------


def _polled(frozen_after: str, poll_interval: str) -> dict[str, object]:
    return {
        "station": {"id": "ps"},
        "sensors": [{"id": "ph", "kind": "ph", "frozen_after": frozen_after}],
        "modbus": {
            "devices": [
                {
                    "name": "plc",
                    "host": "127.0.0.1",
                    "poll_interval": poll_interval,
                    "fields": [{"sensor": "ph", "address": 2, "type": "FLOAT32"}],
                }
            ]
        },
    }


@pytest.mark.parametrize(("frozen_after", "poll"), [("10s", "10s"), ("30s", "1m"), ("1m", "1m")])
def test_frozen_after_no_longer_than_the_poll_interval_is_refused(frozen_after: str, poll: str) -> None:
    """Polled every minute with `frozen_after: 30s`: the second poll that reads the same as
    the first is "unchanged for 1 min" and raises it; a steady, healthy pH paged at night.
    Refused at load, naming the key and the device."""
    from monitor.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        build_config(_polled(frozen_after, poll))
    text = str(err.value)
    assert "sensors[0].frozen_after:" in text and "modbus device plc" in text and "poll" in text, text


def test_frozen_after_longer_than_the_poll_interval_loads() -> None:
    assert build_config(_polled("6h", "1m")).rules["ph"].frozen_after == 6 * HOUR


# --- a band wider than what the sensor can tell apart ------------------------------------


@pytest.mark.parametrize(
    ("sensor", "words"),
    [
        (
            {"id": "ph", "kind": "ph", "frozen_after": "6h", "frozen_band": 4},
            "limit 5 to the high limit 9",
        ),
        (
            {"id": "t", "kind": "temperature", "unit": "degC", "frozen_after": "6h", "frozen_band": 5000},
            "valid range",
        ),
    ],
)
def test_a_band_as_wide_as_the_limits_is_refused(sensor: dict[str, object], words: str) -> None:
    """`frozen_band: 4` on pH (a percentage meant?): a reading could go from the low limit
    to the high limit and count as unchanged, so a healthy probe in a steady stream is
    "frozen" and a frozen alarm says "unchanged" through a violation. Refused at load."""
    from monitor.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        station(sensor)
    text = str(err.value)
    assert "sensors[0].frozen_band:" in text and words in text, text


def test_a_band_narrower_than_the_limits_loads() -> None:
    assert (
        station({"id": "ph", "kind": "ph", "frozen_after": "6h", "frozen_band": 0.05}).rules["ph"].frozen_band
    )


# --- kill -9 between two checkpoints ---------------------------------------------------


def _killed_after_checkpoint(tmp_path: Path, down: float) -> list[Condition]:
    """5 h of 7.00 every 10 s, a checkpoint, 4.5 min more 7.00 (lost: kill -9), the daemon
    back `down` seconds after the kill, 7.00 going on. The conditions after the restart
    (the replay path from the same restored state gives the same)."""
    engine = Engine(PH.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * 1800)])
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    saved = T0 + 1799 * 10.0
    killed = saved + 270.0
    back = killed + down
    after = every(10.0, [7.0] * (3 * 360), start=back)
    again = Engine(PH.rules, ManualClock(back))
    assert load_checkpoint_or_start_fresh(again, path, unsaved=300.0)
    out = live(again, [Sample("ph", t, v) for t, v in after])
    batch = Engine(PH.rules, ManualClock(back))
    assert load_checkpoint_or_start_fresh(batch, path, unsaved=300.0)
    times, values = np.array([t for t, _ in after]), np.array([v for _, v in after])
    got = batch.replay(np.zeros(len(after), np.int32), times, values).conditions
    assert canon(sorted(got, key=batch.sort_key)) == canon(out)
    return out


def test_a_kill_between_checkpoints_keeps_the_unchanged_run(tmp_path: Path) -> None:
    """Killed 4.5 min after the last checkpoint (every 5 min), back 40 s later: the first
    reading after the restart is 5 min 10 s after the last one the checkpoint holds, more
    than `stale_after` (5 min), so the run began again and the held probe's alarm came 6 h
    late. The daemon saw readings until the kill; only the time it was down is a silence."""
    out = _killed_after_checkpoint(tmp_path, down=40.0)
    assert [c.time for c in out if c.rule is Rule.FROZEN] == [T0 + 6 * HOUR + 10.0]


def test_a_long_downtime_still_restarts_the_count(tmp_path: Path) -> None:
    """Down 2 h: two readings hours apart are no evidence of a held signal, as for a comms
    outage; the count starts again at the first reading after the restart."""
    out = _killed_after_checkpoint(tmp_path, down=2 * HOUR)
    assert [c.rule for c in out if c.rule is Rule.FROZEN] == []


# --- the journal's alarm and the checkpoint's run ---------------------------------------


def test_a_probe_cleaned_while_the_daemon_was_down_clears_the_alarm_at_its_first_reading(
    tmp_path: Path,
) -> None:
    """The checkpoint was saved 2 min before the frozen alarm rose, then kill -9; the probe
    is cleaned while the daemon is down. The journal holds the alarm active, the checkpoint
    the run (7.00 since T0) but not the alarm. Before, the first reading after the restart
    (7.35) became the reference, so the alarm stood on a healthy probe until it moved beyond
    7.35 ± band; the checkpoint's run began more than `frozen_after` before the activation,
    so it is the alarm's own run and the changed reading ends it."""
    banded = station(
        {"id": "ph", "kind": "ph", "frozen_after": "6h", "stale_after": "5m", "frozen_band": 0.05}
    )
    engine = Engine(banded.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * (6 * 360 - 12))])  # to 5 h 58 min
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    out = live(
        engine, [Sample("ph", t, 7.0) for t, _ in every(10.0, [7.0] * 14, start=T0 + 6 * HOUR - 110.0)]
    )
    (raised,) = [c for c in out if c.rule is Rule.FROZEN]
    again = Engine(banded.rules, ManualClock(T0 + 7 * HOUR))
    assert load_checkpoint_or_start_fresh(again, path, unsaved=300.0)
    assert again.restore_active("ph", Rule.FROZEN, raised.time)
    after = live(again, [Sample("ph", T0 + 7 * HOUR + 10.0 * i, 7.35 + 0.01 * (i % 2)) for i in range(30)])
    (cleared,) = [c for c in after if c.rule is Rule.FROZEN]
    assert cleared.state is ConditionState.CLEARED and cleared.time == T0 + 7 * HOUR
    assert cleared.message == "pH reading changed: 7.35 (was 7.00)"


def test_a_checkpoint_run_begun_after_the_alarm_is_not_its_reference(tmp_path: Path) -> None:
    """The run the checkpoint holds began too late to have raised the journal's alarm (the
    value changed after the alarm and the clear was lost): it is not the alarm's run, so the
    first reading after the restart is the reference, as without a checkpoint."""
    engine = Engine(PH.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.2] * 360)])  # a run from T0, 1 h
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    again = Engine(PH.rules, ManualClock(T0 + 2 * HOUR))
    assert load_checkpoint_or_start_fresh(again, path, unsaved=300.0)
    assert again.restore_active("ph", Rule.FROZEN, T0 + 3000.0)  # raised 50 min after the run began
    after = live(again, [Sample("ph", T0 + 2 * HOUR + 10.0 * i, 7.0) for i in range(30)])
    assert [c for c in after if c.rule is Rule.FROZEN] == []  # 7.00 held: not a change from 7.2
    assert again.status("ph").active == (Rule.FROZEN,)


def test_an_alarm_the_journal_lost_is_raised_again_at_the_next_reading_not_6_h_later(tmp_path: Path) -> None:
    """The checkpoint holds the frozen alarm active, the journal has it normal (its
    activation refused on a full disk, then a crash; or the sensor removed, its alarm
    retired, and added back): the reconciler has the engine forget it. The run is evidence
    the checkpoint kept: still unchanged, the next reading raises it again. Before, the run
    was dropped too and the held probe alarmed again only 6 h later."""
    engine = Engine(PH.rules, ManualClock())
    live(engine, [Sample("ph", t, v) for t, v in every(10.0, [7.0] * (6 * 360 + 5))])
    path = tmp_path / "engine.npz"
    save_checkpoint(engine, path)
    again = Engine(PH.rules, ManualClock(T0 + 6 * HOUR + 120.0))
    assert load_checkpoint_or_start_fresh(again, path, unsaved=300.0)
    assert again.forget_active("ph", Rule.FROZEN)
    after = live(again, [Sample("ph", T0 + 6 * HOUR + 120.0 + 10.0 * i, 7.0) for i in range(5)])
    assert [(c.time, c.state) for c in after if c.rule is Rule.FROZEN] == [(T0 + 6 * HOUR + 120.0, ACTIVE)]
    # Changed meanwhile (it cleared after the checkpoint): the first reading is a new run.
    fresh = Engine(PH.rules, ManualClock(T0 + 6 * HOUR + 120.0))
    assert load_checkpoint_or_start_fresh(fresh, path, unsaved=300.0)
    assert fresh.forget_active("ph", Rule.FROZEN)
    changed = live(fresh, [Sample("ph", T0 + 6 * HOUR + 120.0 + 10.0 * i, 7.3) for i in range(5)])
    assert [c for c in changed if c.rule is Rule.FROZEN] == []
