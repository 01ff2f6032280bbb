"""The acknowledgement of the state disk's own alarm while that disk is full: the journal
cannot take it, so the manager shows it from memory and journals it once the disk takes
writes (`monitor/alarms/late.py`). Its `Idempotency-Key` goes with it: the page's repeat
gets the first answer, not "already acknowledged" (409), and the journal ends with one
acknowledgement and the key. A real tmpfs filled to its last byte, the real server."""

from __future__ import annotations

import math
from pathlib import Path

import httpx

from monitor.alarms.journal import Journal
from monitor.alarms.late import LATE_ACTIONS_MAX
from monitor.diskspace import CITATION, SENSOR
from monitor.model import Condition, ConditionState, ManualClock, Rule
from tests.conftest import fill_disk
from tests.console import T0, TOKEN, LiveConsole, TableView

KEY = "9b1c3e55-7a0d-4f21-8c6e-2d4b5a6f7e80"
ACK, SHELVE, UNSHELVE = (
    f"/api/alarms/{SENSOR}/{Rule.DISK_FULL.value}/{a}" for a in ("ack", "shelve", "unshelve")
)


def disk_condition(state: ConditionState, time: float) -> Condition:
    """The pipeline's `disk_full` condition (`Pipeline._disk_condition`)."""
    return Condition(time, SENSOR, Rule.DISK_FULL, state, math.nan, math.nan, CITATION, "state disk: full")


def post(base: str, url: str, body: dict[str, object], key: str = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": key}
    return httpx.post(f"{base}{url}", json={"by": "R. Alvarez", **body}, headers=headers)


def test_a_queued_acknowledgement_keeps_its_key_and_its_repeat_gets_the_first_answer(
    tiny_disk: Path,
) -> None:
    """Before: the ack was queued without its key, so the page's retry (same key, answer
    lost) found no key and was judged again: 409 "already acknowledged" for an ack that
    was done. Now the repeat gets the first answer byte for byte, before and after the disk
    is freed, and the journal holds one acknowledgement and the key, written together."""
    view = TableView(tiny_disk / "journal.sqlite", ManualClock(T0))
    with LiveConsole(view) as live:
        ballast = fill_disk(tiny_disk)
        live.call(lambda: view.alarms.apply(disk_condition(ConditionState.ACTIVE, T0)))
        first = post(live.url, ACK, {"note": "freeing space"})
        assert first.status_code == 200, first.text
        assert first.json()["state"] == "active_acknowledged"
        again = post(live.url, ACK, {"note": "freeing space"})
        assert again.status_code == 200, again.text
        assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
        other = post(live.url, ACK, {"note": "another text"})
        assert other.status_code == 422  # the key with another request, as for any write

        ballast.unlink()
        view.clock.set(T0 + 60)
        live.call(lambda: view.alarms.apply(disk_condition(ConditionState.CLEARED, T0 + 60)))
        after = post(live.url, ACK, {"note": "freeing space"})
        assert after.content == first.content and after.headers["idempotent-replayed"] == "true"
        journal = view.alarms.journal
        events = live.call(lambda: [e.event for e in journal.entries(sensor=SENSOR)])
        kept = live.call(lambda: journal._db.execute("SELECT key, answer FROM console_write").fetchall())
    assert events == ["activated", "acknowledged", "cleared"]
    assert kept == [(KEY, first.text)]


def test_a_repeat_after_the_queue_is_written_still_gets_the_first_answer(tiny_disk: Path) -> None:
    """The queue written (the disk freed, another transition) between the first ack and its
    repeat: the key is in the journal by then, with the first answer."""
    view = TableView(tiny_disk / "journal.sqlite", ManualClock(T0))
    with LiveConsole(view) as live:
        ballast = fill_disk(tiny_disk)
        live.call(lambda: view.alarms.apply(disk_condition(ConditionState.ACTIVE, T0)))
        first = post(live.url, ACK, {"note": "freeing space"})
        ballast.unlink()
        shelve = post(live.url, SHELVE, {"reason": "cleanup", "minutes": 5}, "shelve-0001")
        assert shelve.status_code == 200 and "idempotent-replayed" not in shelve.headers, shelve.text
        again = post(live.url, ACK, {"note": "freeing space"})
        assert (first.status_code, again.status_code) == (200, 200), again.text
        assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
        events = live.call(lambda: [e.event for e in view.alarms.journal.entries(sensor=SENSOR)])
    assert events == ["activated", "acknowledged", "shelved"]


def test_operator_actions_queued_on_a_full_disk_are_bounded(tiny_disk: Path) -> None:
    """A client with the token shelving and unshelving the disk alarm while the disk stays
    full queued an entry (and now its key and answer) in memory for each: without a bound,
    memory grew without end. Past `LATE_ACTIONS_MAX` actions an action is refused, 503 `not
    done` (nothing shown that the journal will not get); the alarm's own transitions are
    still queued."""
    view = TableView(tiny_disk / "journal.sqlite", ManualClock(T0))
    with LiveConsole(view) as live:
        ballast = fill_disk(tiny_disk)
        live.call(lambda: view.alarms.apply(disk_condition(ConditionState.ACTIVE, T0)))
        answers = []
        for i in range(LATE_ACTIONS_MAX // 2 + 1):
            answers.append(
                post(live.url, SHELVE, {"reason": "r", "minutes": 5}, f"shelve-{i:06d}").status_code
            )
            answers.append(post(live.url, UNSHELVE, {}, f"unshelve-{i:06d}").status_code)
        assert answers[:LATE_ACTIONS_MAX] == [200] * LATE_ACTIONS_MAX
        refused = post(live.url, SHELVE, {"reason": "r", "minutes": 5}, "one-too-many")
        assert refused.status_code == 503 and refused.json()["detail"].startswith("not done"), refused.text
        ballast.unlink()
        live.call(lambda: view.alarms.apply(disk_condition(ConditionState.CLEARED, T0)))
        events = live.call(lambda: [e.event for e in view.alarms.journal.entries(sensor=SENSOR)])
    assert events[0] == "activated" and events[-1] == "cleared"
    assert len(events) == LATE_ACTIONS_MAX + 2


def test_a_clean_stop_once_the_disk_takes_writes_journals_what_waits(tiny_disk: Path) -> None:
    """The operator frees space and stops the daemon (`systemctl restart`) before any alarm
    transition came to write the queue: the pipeline's held batch is not tried again at the
    stop within its 2 s retry pause, so nothing else writes it. Before, the manager closed
    the journal with the disk alarm's activation and the operator's acknowledgement (and its
    key) still in memory: the journal never showed the episode nor the ack, on a disk that
    took writes. Now closing writes what waits first."""
    journal = tiny_disk / "journal.sqlite"
    view = TableView(journal, ManualClock(T0))
    with LiveConsole(view) as live:
        ballast = fill_disk(tiny_disk)
        live.call(lambda: view.alarms.apply(disk_condition(ConditionState.ACTIVE, T0)))
        first = post(live.url, ACK, {"note": "freeing space"})
        assert first.status_code == 200, first.text
        ballast.unlink()
    view.alarms.close()
    again = Journal(journal)
    try:
        events = [e.event for e in again.entries(sensor=SENSOR)]
        kept = again._db.execute("SELECT key, answer FROM console_write").fetchall()
    finally:
        again.close()
    assert events == ["activated", "acknowledged"]
    assert kept == [(KEY, first.text)]
