"""Console writes sent again (the `Idempotency-Key` header, monitor/web/once.py): a repeat
is answered with the first answer and recorded once; the key with another request is
refused in words; keys are bounded and per token; the table of keys is bounded; and a
daemon killed with SIGKILL between the commit and the answer still records the repeat
once after its restart. Plain HTTP clients against the real console server and stores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from monitor.incidents import IncidentStore
from monitor.incidents.model import Note
from monitor.model import ManualClock, Sample
from monitor.web.once import KEY_REUSED
from monitor.writeonce import ANSWER_MAX, ANSWERS_MAX, KEEP_ROWS, write_key
from tests.conftest import fill_disk
from tests.console import T0, TOKEN, LiveConsole, TableView
from tests.daemon_process import ROOT, running_daemon
from tests.incident_helpers import StationWithIncidents, golden_station, incidents_json, replay_case
from tests.services import free_port, port_open
from tests.waiting import wait_until

NOW = 1781913600.0  # 2026-06-20T00:00Z, after the case's incidents
KEY = "5f0e8a2c-31b4-4d6e-9a7b-0c1d2e3f4a5b"
MIB = 1024 * 1024
NOTICE = {"kind": "notice", "text": "§139-21 A notice of violation, served", "due": "2026-07-01"}


@pytest.fixture
def case(tmp_path: Path) -> Iterator[tuple[StationWithIncidents, dict[str, Any]]]:
    """The station with the golden case's incidents: (view, the slug incident)."""
    with golden_station(tmp_path, NOW) as (view, slug, _):
        yield view, slug


def keyed(
    base: str, url: str, body: dict[str, Any], key: str | None = KEY, token: str = TOKEN
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(f"{base}{url}", json={"by": "R. Alvarez", **body}, headers=headers)


def test_a_notice_sent_twice_with_one_key_is_recorded_once(
    case: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """The page's retry after a lost answer: the second POST gets the first answer, byte
    for byte, marked replayed, and the Superintendent's record has one notice. Before:
    two notices of violation. Without the header every POST is a write, as before."""
    view, slug = case
    url = f"/api/incidents/{slug['id']}/notes"
    with LiveConsole(view) as live:
        first = keyed(live.url, url, NOTICE)
        again = keyed(live.url, url, NOTICE)
        assert first.status_code == again.status_code == 200, again.text
        assert again.content == first.content
        assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
        assert len(first.json()["notes"]) == 1
        stored = view.incidents.store.get(slug["id"])
        assert stored is not None and [n.text for n in stored.notes] == [NOTICE["text"]]
        assert keyed(live.url, url, {"text": "a"}, key=None).status_code == 200
        assert keyed(live.url, url, {"text": "a"}, key=None).status_code == 200
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and len(stored.notes) == 3


def test_a_close_sent_twice_is_one_close_answered_twice_not_a_409(
    case: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """The repeat of a close whose answer was lost said "closed already" (409): the page
    showed "Not done" for a case it had closed. Now it gets the first answer."""
    view, slug = case
    url = f"/api/incidents/{slug['id']}/close"
    with LiveConsole(view) as live:
        first = keyed(live.url, url, {"reason": "statement received"})
        again = keyed(live.url, url, {"reason": "statement received"})
        assert (first.status_code, again.status_code) == (200, 200), again.text
        assert again.content == first.content
        other = keyed(live.url, url, {"reason": "statement received"}, key="another-key-0001")
        assert other.status_code == 409  # another write: refused as before, and not kept
        assert (
            keyed(live.url, url, {"reason": "statement received"}, key="another-key-0001").status_code == 409
        )


def test_an_acknowledgement_sent_twice_is_journaled_once(tmp_path: Path) -> None:
    """An alarm acknowledged, the answer lost, sent again: one `acknowledged` row in the
    journal and the first answer (not "already acknowledged", 409); shelve likewise."""
    view = TableView(tmp_path / "journal.sqlite", ManualClock(T0))
    view.inject(Sample("outfall.ph", T0, 9.6), limit=9.0, citation="§139-15 C(3)")
    with LiveConsole(view) as live:
        url = "/api/alarms/outfall.ph/high/ack"
        first = keyed(live.url, url, {"note": "on it"})
        again = keyed(live.url, url, {"note": "on it"})
        assert (first.status_code, again.status_code) == (200, 200), again.text
        assert again.content == first.content and first.json()["state"] == "active_acknowledged"
        shelve = "/api/alarms/outfall.ph/high/shelve"
        once = keyed(live.url, shelve, {"reason": "probe cleaning", "minutes": 30}, key="shelve-key-0001")
        twice = keyed(live.url, shelve, {"reason": "probe cleaning", "minutes": 30}, key="shelve-key-0001")
        assert (once.status_code, twice.status_code, twice.content) == (200, 200, once.content)
        events = [e.event for e in live.call(lambda: list(view.alarms.journal.entries(sensor="outfall.ph")))]
    assert events.count("acknowledged") == 1 and events.count("shelved") == 1


def test_a_full_disk_refuses_the_write_and_its_key_together(tiny_disk: Path) -> None:
    """The state disk full (a real tmpfs filled to its last byte) when an acknowledgement
    and its key are committed: 503 `not done`, neither journaled, the alarm still waiting;
    space freed, the page's same request (same key) is then done once, not replayed."""
    view = TableView(tiny_disk / "journal.sqlite", ManualClock(T0))
    view.inject(Sample("outfall.ph", T0, 9.6), limit=9.0, citation="§139-15 C(3)")
    url = "/api/alarms/outfall.ph/high/ack"
    with LiveConsole(view) as live:
        ballast = fill_disk(tiny_disk)
        full = keyed(live.url, url, {"note": "on it"})
        assert full.status_code == 503 and full.json()["detail"].startswith("not done"), full.text
        keys = "SELECT count(*) FROM console_write"
        assert live.call(lambda: view.alarms.journal._db.execute(keys).fetchone()) == (0,)
        ballast.unlink()
        done = keyed(live.url, url, {"note": "on it"})
        again = keyed(live.url, url, {"note": "on it"})
        assert done.status_code == 200 and "idempotent-replayed" not in done.headers, done.text
        assert again.content == done.content and again.headers["idempotent-replayed"] == "true"
        events = [e.event for e in live.call(lambda: list(view.alarms.journal.entries(sensor="outfall.ph")))]
    assert events.count("acknowledged") == 1


def test_the_key_with_another_request_is_refused_in_words_and_nothing_is_written(
    case: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """A draft edited after a lost answer, or a client that reuses its keys: the same key
    with another text, another incident or another action is a 422 that says so; the
    first write stands alone."""
    view, slug = case
    url = f"/api/incidents/{slug['id']}/notes"
    with LiveConsole(view) as live:
        assert keyed(live.url, url, NOTICE).status_code == 200
        for other_url, body in (
            (url, {**NOTICE, "text": "another text"}),
            (url, {"text": NOTICE["text"]}),
            (f"/api/incidents/{slug['id']}/close", {"reason": "done"}),
            ("/api/incidents/no-such/notes", NOTICE),
        ):
            got = keyed(live.url, other_url, body)
            if other_url.startswith("/api/incidents/no-such"):
                assert got.status_code == 404  # no such incident comes first
                continue
            assert (got.status_code, got.json()) == (422, {"detail": KEY_REUSED}), other_url
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and len(stored.notes) == 1 and stored.closed_at is None


@pytest.mark.parametrize(
    "key",
    ["short", "x" * 65, "spaces are not ok", "ключ-ключ-ключ", "a/b/c/d/e/f", "key\twith-tab", ""],
)
def test_a_key_outside_its_bounds_is_refused_in_words(
    case: tuple[StationWithIncidents, dict[str, Any]], key: str
) -> None:
    """8 to 64 characters of A-Z a-z 0-9 . _ : - (a UUID, a hex id); anything else is a 400
    naming the rule, and nothing is written."""
    view, slug = case
    with LiveConsole(view) as live:
        headers = [(b"Authorization", f"Bearer {TOKEN}".encode()), (b"Idempotency-Key", key.encode("utf-8"))]
        got = httpx.post(
            f"{live.url}/api/incidents/{slug['id']}/notes", json={"by": "a", "text": "t"}, headers=headers
        )
        assert got.status_code == 400, got.text
        assert got.json()["detail"] == "Idempotency-Key must be 8 to 64 characters of A-Z a-z 0-9 . _ : -"
        two = httpx.post(
            f"{live.url}/api/incidents/{slug['id']}/notes",
            json={"by": "a", "text": "t"},
            headers=[
                ("Authorization", f"Bearer {TOKEN}"),
                ("Idempotency-Key", KEY),
                ("Idempotency-Key", KEY),
            ],
        )
        assert (two.status_code, two.json()) == (
            400,
            {"detail": "one Idempotency-Key header per request, not 2"},
        )
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and stored.notes == ()


def test_keys_are_per_token(case: tuple[StationWithIncidents, dict[str, Any]]) -> None:
    """The gateway restarted with a new token (the old one leaked): a key sent with the old
    one is not the new token's. The same key and body with the new token is a new write,
    and the old answer is not handed to the new token's holder."""
    view, slug = case
    url = f"/api/incidents/{slug['id']}/notes"
    with LiveConsole(view) as live:
        assert keyed(live.url, url, NOTICE).status_code == 200
        port = live.console.port
    new = "an-entirely-new-token-0123"
    with LiveConsole(view, token=new, port=port) as live:
        got = keyed(live.url, url, NOTICE, token=new)
        assert got.status_code == 200 and "idempotent-replayed" not in got.headers
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and len(stored.notes) == 2
    a, b = (write_key(KEY, t.encode(), "POST", url, b"{}") for t in (TOKEN, new))
    assert a.owner != b.owner and TOKEN not in a.owner


def test_a_key_belongs_to_the_token_not_to_how_its_header_is_spelt(
    case: tuple[StationWithIncidents, dict[str, Any]],
) -> None:
    """The guard accepts `bearer` in any case and blanks around the token; the key's owner
    was a digest of the header's text after the first blank, so the same token spelt
    `Bearer  <token>` (a client or proxy that rewrites the header on its retry) was another
    owner and the notice was recorded twice. Before: two notices."""
    view, slug = case
    url = f"/api/incidents/{slug['id']}/notes"
    body = {"by": "R. Alvarez", **NOTICE}
    with LiveConsole(view) as live:
        answers = [
            httpx.post(f"{live.url}{url}", json=body, headers={"Authorization": auth, "Idempotency-Key": KEY})
            for auth in (f"Bearer {TOKEN}", f"bearer  {TOKEN}")
        ]
        assert [a.status_code for a in answers] == [200, 200], answers[1].text
        assert answers[1].content == answers[0].content
        assert answers[1].headers["idempotent-replayed"] == "true"
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and [n.text for n in stored.notes] == [NOTICE["text"]]


def test_the_table_of_keys_is_bounded_in_rows(tmp_path: Path) -> None:
    """A client with the token sending a fresh key with every write (or a script gone
    wrong) never grows the table past `KEEP_ROWS`: the oldest go first. Not by age (a
    clock step, the next test)."""
    with IncidentStore(tmp_path) as store:
        for i in range(KEEP_ROWS + 25):
            store.add_note(
                "i1",
                Note(time=NOW + i, by="bot", text="x"),
                key=write_key(f"key-{i:08d}", TOKEN.encode(), "POST", "/", b""),
            )
        count, oldest = store._db.execute("SELECT count(*), min(key) FROM console_write").fetchone()
        assert (count, oldest) == (KEEP_ROWS, f"key-{25:08d}")


@pytest.mark.parametrize("step", [3 * 86400.0, -3 * 86400.0], ids=["forward", "back"])
def test_a_clock_step_does_not_forget_a_key_its_retry_still_needs(
    case: tuple[StationWithIncidents, dict[str, Any]], step: float
) -> None:
    """A gateway whose clock steps by days (NTP fixing a dead RTC battery at boot, or a bad
    server) while an operator's answer is lost: another operator's note, written after the
    step, made every key look a day old (or a day ahead) and dropped them all, so the first
    operator's 'Saving again is safe' recorded the notice of violation twice. Before: two
    notices. A clock cannot tell a step from a quiet weekend: keys go by count alone."""
    view, slug = case
    url = f"/api/incidents/{slug['id']}/notes"
    with LiveConsole(view) as live:
        first = keyed(live.url, url, NOTICE)
        view.clock.set(NOW + step)
        other = keyed(live.url, url, {"text": "pump 2 pulled"}, key="another-operator-0001")
        again = keyed(live.url, url, NOTICE)
        assert first.status_code == other.status_code == again.status_code == 200, again.text
        assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and [n.text for n in stored.notes].count(NOTICE["text"]) == 1


# A daemon that dies with SIGKILL right after the write and its key are committed, before
# the answer is kept or sent: `writeonce.answer` replaced in that process alone (a real
# kill -9 cannot be aimed at that instruction otherwise).
KILLED_AFTER_COMMIT = (
    "import os, signal\n"
    "import monitor.writeonce as w\n"
    "w.answer = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
    "from monitor.cli import entry\n"
    "entry()\n"
)


def test_a_daemon_killed_between_commit_and_answer_records_the_repeat_once(tmp_path: Path) -> None:
    """The real daemon takes a §139-21 notice and is killed with SIGKILL after the commit,
    before its answer: the client sees the connection drop. After the restart the same
    request with the same key is answered (what is on record) and the record has one
    notice: the key was committed in the note's transaction."""
    cfg = replay_case("slug-and-oil", tmp_path)
    slug, _ = incidents_json(cfg)
    port = free_port()
    raw = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    raw["console"] = {"host": "127.0.0.1", "port": port, "token": "${CONSOLE_TOKEN}"}
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "CONSOLE_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    base, url = f"http://127.0.0.1:{port}", f"/api/incidents/{slug['id']}/notes"
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_AFTER_COMMIT, "run", "--config", str(cfg)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        wait_until(lambda: port_open(port) or proc.poll() is not None, timeout=60, what="console")
        assert proc.poll() is None, log.read_text()
        with pytest.raises(httpx.TransportError):  # the answer never comes
            keyed(base, url, NOTICE)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    with running_daemon(cfg, tmp_path / "daemon2.log", env={"CONSOLE_TOKEN": TOKEN}) as daemon:
        wait_until(lambda: port_open(port), timeout=60, what="console after the restart")
        again = keyed(base, url, NOTICE)
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert [n["text"] for n in again.json()["notes"]] == [NOTICE["text"]]
        daemon.stop()
    with IncidentStore(tmp_path / "state") as store:
        after = store.get(slug["id"])
    assert after is not None and [n.text for n in after.notes] == [NOTICE["text"]]


def test_the_cli_writes_without_a_key_as_before(case: tuple[StationWithIncidents, dict[str, Any]]) -> None:
    """`monitor incidents note` and scripts send no key: the store takes a note without one."""
    view, slug = case
    view.incidents.store.add_note(slug["id"], Note(time=NOW, by="cli", text="by hand"))
    stored = view.incidents.store.get(slug["id"])
    assert stored is not None and [n.text for n in stored.notes] == ["by hand"]
    assert view.incidents.store._db.execute("SELECT count(*) FROM console_write").fetchone() == (0,)


def test_an_answer_is_bounded_in_bytes_not_characters(tmp_path: Path) -> None:
    """`ANSWER_MAX` is 64 KiB; it was compared with the answer's length in characters, so an
    answer of notes in Greek or with `§` (two bytes each in UTF-8, up to four for others) was
    kept at up to four times the bound. Before: 40,000 `§` (80,000 bytes) were kept."""
    key = write_key("bound-key-0001", TOKEN.encode(), "POST", "/", b"")
    with IncidentStore(tmp_path) as store:
        store.add_note("i1", Note(time=NOW, by="bot", text="x"), key=key)
        store.keys.keep_answer(key, "§" * 40_000)
        prior = store.keys.prior_write(key)
        assert prior is not None and prior.answer is None
        store.keys.keep_answer(key, "§" * (ANSWER_MAX // 2))
        prior = store.keys.prior_write(key)
        assert prior is not None and prior.answer == "§" * (ANSWER_MAX // 2)


def _file_bytes(store: IncidentStore) -> int:
    """The store's file on disk, its write-ahead log folded in first (as at a clean stop)."""
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in store.path.parent.glob(f"{store.path.name}*"))


def test_a_client_with_the_token_cannot_grow_a_file_past_the_bound_on_kept_answers(tmp_path: Path) -> None:
    """A client with the token writing under a fresh key each time, every answer as large as
    one may be kept (`ANSWER_MAX`): the file kept every one, up to 1,000 x 64 KiB = 64 MiB
    a file. Now the answers a file keeps are `ANSWERS_MAX` bytes all told (the oldest
    answers give way; their keys stay, so a late repeat is still one record, answered with
    the record as it stands). Measured on the real file against the same writes with no
    answers kept: what the answers add stays within the bound. Driven at the store: no
    console answer is 64 KiB on a client's cue (an incident's grows with its notes), so
    this is the most a hostile client could make it keep. Before: 200 answers grew it by
    12.5 MiB."""
    writes = 200
    answer = "§" * (ANSWER_MAX // 2)  # 64 KiB in UTF-8, the most one answer may be
    keys = [write_key(f"key-{i:08d}", TOKEN.encode(), "POST", "/", b"") for i in range(writes)]
    sizes = []
    for kept in (False, True):
        with IncidentStore(tmp_path / str(kept)) as store:
            for i, key in enumerate(keys):
                store.add_note("i1", Note(time=NOW + i, by="bot", text="x"), key=key)
                if kept:
                    store.keys.keep_answer(key, answer)
            sizes.append(_file_bytes(store))
            held, answered = store._db.execute("SELECT count(*), count(answer) FROM console_write").fetchone()
            newest, oldest = (store.keys.prior_write(k) for k in (keys[-1], keys[0]))
        assert held == writes  # every key kept: a repeat of any is still one record
    without, with_answers = sizes
    assert with_answers - without <= MIB + 2 * ANSWER_MAX, sizes  # 1 MiB, as docs/alarms.md says
    assert answered == ANSWERS_MAX // ANSWER_MAX  # the newest answers, as many as fit
    assert newest is not None and newest.answer == answer
    assert oldest is not None and oldest.answer is None


def _key_table_bytes(store: IncidentStore) -> int:
    """The pages the request ids and their answers take (table and its key index, `dbstat`)."""
    got = store._db.execute(
        "SELECT sum(pgsize) FROM dbstat WHERE name IN ('console_write', 'sqlite_autoindex_console_write_1')"
    ).fetchone()
    return int(got[0])


@pytest.mark.parametrize("size", [1_900, 16_000])
def test_answers_of_any_size_keep_the_request_ids_within_the_bound(tmp_path: Path, size: int) -> None:
    """The bound held for answers of 64 KiB (a few bytes in the row, the rest in overflow
    pages) but not for others: an answer of 1.9 KiB (an alarm's with a long note in
    non-ASCII letters, an incident's after a few notes) or of 16 KiB fills most of a page
    in its row, and a row whose answer gave way stayed alone on its page (SQLite does not
    merge pages when an update shrinks a row): 1,000 ids on a page each, 4 MiB, plus the
    answers kept. Measured: 4.0 MiB (1.9 KiB) and 4.75 MiB (16 KiB) where docs/alarms.md
    said about 1.5 MiB. Now a row whose answer gives way is written anew (deleted and
    inserted: SQLite merges the emptied pages), so the ids stay packed; 1 MiB of answers of
    just under half a page each still take a page each, so the bound is 2.5 MiB a file.
    Driven at the store for more writes than it keeps."""
    writes = KEEP_ROWS + KEEP_ROWS // 4
    answer = "x" * size
    keys = [write_key(f"key-{i:08d}", TOKEN.encode(), "POST", "/", b"") for i in range(writes)]
    with IncidentStore(tmp_path) as store:
        for i, key in enumerate(keys):
            store.add_note("i1", Note(time=NOW + i, by="bot", text="x"), key=key)
            store.keys.keep_answer(key, answer)
        held = _key_table_bytes(store)
        kept, answered = store._db.execute("SELECT count(*), count(answer) FROM console_write").fetchone()
        newest, oldest = (store.keys.prior_write(k) for k in (keys[-1], keys[-KEEP_ROWS]))
    assert kept == KEEP_ROWS and answered == ANSWERS_MAX // size
    assert newest is not None and newest.answer == answer
    assert oldest is not None and oldest.answer is None and oldest.request == keys[-KEEP_ROWS].request
    assert held <= 2.5 * MIB, f"{held / MIB:.2f} MiB"  # docs/alarms.md, monitor/writeonce.py
