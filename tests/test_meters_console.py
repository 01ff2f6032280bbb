"""Recording a meter replacement through the console API: the ledger re-judges, the meter
alarm (a real AlarmManager) clears, and inconsistent figures are refused with the reason."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from monitor.config import Console, build_config
from monitor.daemon import Daemon
from monitor.meters.book import MeterBook
from monitor.model import Alarm, Condition, ManualClock, Rule, Sample, iso
from monitor.web import create_app
from monitor.web.station import StationAdapter
from tests.console import T0, TOKEN, TableView, call

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class MeterView(TableView):
    """The console's test station plus the daemon's meter book."""

    def __init__(self, tmp_path: Path, clock: ManualClock) -> None:
        super().__init__(tmp_path / "journal.sqlite", clock)
        config = build_config(
            {
                "station": {"id": "ps-1"},
                "state_dir": str(tmp_path / "state"),
                "sensors": [{"id": "shop.meter", "kind": "meter", "register_digits": 5, "max_rate": 100}],
            }
        )
        self.meter_book = MeterBook.open(config)


@pytest.fixture
def view(tmp_path: Path) -> Iterator[MeterView]:
    v = MeterView(tmp_path, ManualClock(T0))
    yield v
    v.meter_book.close()
    v.alarms.close()


def test_replacement_through_the_console_clears_the_meter_alarm(view: MeterView) -> None:
    old = [Sample("shop.meter", T0 + h * 3600, 33_800 + 20 * h) for h in range(5)]  # 33,880 at hour 4
    new = [Sample("shop.meter", T0 + (5 + h) * 3600, 15 + 20 * h) for h in range(3)]
    for c in view.meter_book.ingest([*old, *new]):
        view.alarms.apply(c)
    alarm = view.alarms.get("shop.meter", Rule.METER)
    assert alarm is not None and alarm.active and alarm.citation == "§139-3"
    (meter,) = call(view, "GET", "/api/meters").json()
    assert meter["alarm"] is True and meter["last_reading"] == "33880"
    assert "went backwards" in meter["message"]

    body = {"by": "J. Operator", "time": "2026-06-01T00:00:00Z", "old_final": 33_890, "new_initial": "5"}
    assert call(view, "POST", "/api/meters/shop.meter/replacements", token=None, json=body).status_code == 403
    wrong = call(view, "POST", "/api/meters/shop.meter/replacements", token="nope-not-the-token", json=body)
    assert wrong.status_code == 401
    assert call(view, "POST", "/api/meters/nope/replacements", headers=AUTH, json=body).status_code == 404
    swap = T0 + 4.5 * 3600
    body["time"] = iso(swap)
    refused = call(
        view, "POST", "/api/meters/shop.meter/replacements", headers=AUTH, json={**body, "old_final": 1}
    )
    assert refused.status_code == 409 and "does not follow the last accepted reading 33880" in refused.text

    done = call(view, "POST", "/api/meters/shop.meter/replacements", headers=AUTH, json=body)
    assert done.status_code == 200, done.text
    want = {"meter": "shop.meter", "time": iso(swap), "old_final": "33890", "new_initial": "5"}
    assert done.json() == {**want, "alarm_cleared": True}
    alarm = view.alarms.get("shop.meter", Rule.METER)
    assert alarm is not None and not alarm.active
    (meter,) = call(view, "GET", "/api/meters").json()
    assert meter["alarm"] is False and meter["last_reading"] == "55"
    rows = view.meter_book.ledger.rows("shop.meter")
    assert sum(r.volume for r in rows) == 4 * 20 + 10 + 10 + 2 * 20
    assert view.meter_book.ledger.replacements("shop.meter")[0].recorded_by == "J. Operator"
    assert "/api/meters/{meter}/replacements" in call(view, "GET", "/openapi.json").json()["paths"]


def test_the_daemon_offers_its_meter_book_to_the_console(tmp_path: Path) -> None:
    config = build_config(
        {
            "station": {"id": "ps-1"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "shop.meter", "kind": "meter", "register_digits": 5}],
        }
    )
    daemon = Daemon(config, ManualClock(T0))
    try:
        app = create_app(StationAdapter(daemon), Console(token=SecretStr(TOKEN)))

        async def go() -> list[httpx.Response]:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
                body = {"by": "op", "time": iso(T0), "old_final": 10, "new_initial": 0}
                return [
                    await client.get("/api/meters"),
                    await client.post("/api/meters/shop.meter/replacements", headers=AUTH, json=body),
                ]

        listed, replaced = asyncio.run(go())
        assert [m["meter"] for m in listed.json()] == ["shop.meter"]
        assert replaced.status_code == 200 and daemon.meters.ledger.replacements("shop.meter")
    finally:
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()


def test_a_replacement_through_the_console_clears_the_alarm_through_the_pipeline(tmp_path: Path) -> None:
    """Regression: the route applied the conditions to the alarm manager itself, around the
    pipeline, so nothing that follows the pipeline (incidents, callout, the outbox) saw them."""
    config = build_config(
        {
            "station": {"id": "ps-1"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "shop.meter", "kind": "meter", "register_digits": 5}],
        }
    )
    daemon = Daemon(config, ManualClock(T0 + 86400))
    seen: list[tuple[str, str]] = []

    class Listener:
        def judged(
            self, samples: Sequence[Sample], conditions: Sequence[Condition], alarms: Sequence[Alarm]
        ) -> None:
            seen.extend((a.sensor, str(a.state)) for a in alarms)

    daemon.pipeline.listen(Listener())
    try:
        daemon.pipeline.process([Sample("shop.meter", T0 + 3600 * h, 33_800 + 20 * h) for h in range(3)])
        daemon.pipeline.process([Sample("shop.meter", T0 + 4 * 3600, 15.0)])  # swapped, not recorded
        alarm = daemon.alarms.get("shop.meter", Rule.METER)
        assert alarm is not None and alarm.active
        app = create_app(StationAdapter(daemon), Console(token=SecretStr(TOKEN)))

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
                body = {"by": "op", "time": iso(T0 + 3.5 * 3600), "old_final": 33_850, "new_initial": 5}
                return await client.post("/api/meters/shop.meter/replacements", headers=AUTH, json=body)

        replaced = asyncio.run(go())
        assert replaced.status_code == 200 and replaced.json()["alarm_cleared"] is True
        assert seen[-1] == ("shop.meter", "returned_unacknowledged")  # the listener saw it
        conditions = daemon.pipeline.stats.conditions
        assert conditions == 2  # activated by the reading, cleared by the replacement: both counted
    finally:
        daemon.meters.close()
        daemon.alarms.close()
        daemon.sink.close()


KEY = "0d9f6a1e-meter-swap-7c2b"
SWAP = T0 + 4.5 * 3600
SWAP_BODY = {"by": "J. Operator", "time": iso(SWAP), "old_final": 33_890, "new_initial": "5"}


def swapped_meter(view: MeterView) -> None:
    """The meter swapped after 33,880 and not recorded: the new meter's readings are
    rejected as `backwards` and the meter alarm is up."""
    old = [Sample("shop.meter", T0 + h * 3600, 33_800 + 20 * h) for h in range(5)]
    new = [Sample("shop.meter", T0 + (5 + h) * 3600, 15 + 20 * h) for h in range(3)]
    for c in view.meter_book.ingest([*old, *new]):
        view.alarms.apply(c)


def replace(view: MeterView, body: dict[str, object], key: str | None = KEY) -> httpx.Response:
    headers = {**AUTH, **({} if key is None else {"Idempotency-Key": key})}
    return call(view, "POST", "/api/meters/shop.meter/replacements", headers=headers, json=body)


def test_a_replacement_sent_twice_with_one_key_gets_the_first_answer(view: MeterView) -> None:
    """The billing clerk's answer lost and the swap sent again: the repeat is the first
    answer byte for byte (the alarm it cleared), marked replayed. Before: no key taken, the
    repeat answered `alarm_cleared: false` for the swap that had cleared it."""
    swapped_meter(view)
    first = replace(view, SWAP_BODY)
    again = replace(view, SWAP_BODY)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert first.json()["alarm_cleared"] is True
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    other = replace(view, {**SWAP_BODY, "new_initial": "6"})
    assert other.status_code == 422 and other.json()["detail"].startswith("this Idempotency-Key")
    assert replace(view, {**SWAP_BODY, "time": iso(SWAP + 1)}, key="x" * 7).status_code == 400
    assert len(view.meter_book.ledger.replacements("shop.meter")) == 1


def test_a_replacement_retried_after_it_was_voided_is_not_recorded_again(view: MeterView) -> None:
    """The clerk's answer lost; meanwhile the supervisor voids the swap (wrong figures,
    re-entered by hand later); then the clerk's retry arrives. Before: the retry recorded
    the voided swap again (`re-recorded`) and the bill was cut across a swap that is not
    there. Now it is answered from the first and the ledger keeps the void."""
    swapped_meter(view)
    first = replace(view, SWAP_BODY)
    assert first.status_code == 200, first.text
    view.meter_book.void_replacement("shop.meter", SWAP, by="supervisor", why="wrong meter")
    again = replace(view, SWAP_BODY)
    assert view.meter_book.ledger.replacements("shop.meter") == []
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true", again.text
    kept = view.meter_book.ledger._db.execute("SELECT key, answer FROM console_write").fetchall()
    assert kept == [(KEY, first.text)]


def test_a_replacement_refused_is_not_kept_and_without_a_key_it_is_done_as_before(view: MeterView) -> None:
    """A 409 (figures that contradict the ledger) keeps no key: the corrected request with
    the same key is a new write. `monitor meters replace` and curl send no key."""
    swapped_meter(view)
    refused = replace(view, {**SWAP_BODY, "old_final": 1})
    assert refused.status_code == 409
    assert replace(view, {**SWAP_BODY, "old_final": 1}).status_code == 409  # judged again
    assert view.meter_book.ledger._db.execute("SELECT count(*) FROM console_write").fetchone() == (0,)
    assert replace(view, SWAP_BODY, key=None).status_code == 200
    assert view.meter_book.ledger._db.execute("SELECT count(*) FROM console_write").fetchone() == (0,)


def test_a_replacement_the_ledger_cannot_write_is_503_not_done_and_the_openapi_page_says_so(
    view: MeterView,
) -> None:
    """The ledger refusing the write (a full or read-only state disk; here the ledger's own
    connection set `query_only`, a fake: the journal shares that disk in a real one) is the app's
    503 `not done: meter ledger ...`, and a retry with the same key is judged again (the
    key went with the rolled-back swap). Before, the route's OpenAPI responses listed 400
    to 409 only: a client generated from it had no 503 to handle."""
    swapped_meter(view)
    paths = call(view, "GET", "/openapi.json").json()["paths"]
    assert "503" in paths["/api/meters/{meter}/replacements"]["post"]["responses"]
    ledger = view.meter_book.ledger
    ledger._db.execute("PRAGMA query_only = ON")  # refuses every write, as a read-only file does
    refused = replace(view, SWAP_BODY)
    assert refused.status_code == 503, refused.text
    assert refused.json()["detail"].startswith(f"not done: meter ledger {ledger.path}")
    ledger._db.execute("PRAGMA query_only = OFF")
    done = replace(view, SWAP_BODY)
    assert done.status_code == 200 and "idempotent-replayed" not in done.headers, done.text
