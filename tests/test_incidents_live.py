"""Incidents in the running station: the console API (reads open, writes with the token),
the `incident` measurement in a real InfluxDB 1.6, and the merge window."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from monitor.daemon import Daemon
from monitor.errors import StateError
from monitor.model import ManualClock, Rule, Sample
from monitor.web.station import StationAdapter
from tests.console import TOKEN, call
from tests.incident_helpers import (
    CASES,
    case_config,
    close_daemon,
    feed,
    load,
    oil_station,
    read_samples,
    run_live,
)
from tests.services import InfluxDB1


def post(
    daemon: Daemon, url: str, body: dict[str, str], bearer: str | None = TOKEN, configured: bool = True
) -> Any:
    """A write through the console app (served with tests.console.TOKEN unless not `configured`)."""
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    return call(
        StationAdapter(daemon), "POST", url, token=TOKEN if configured else None, json=body, headers=headers
    )


def test_console_api_reads_without_token_and_writes_with_it(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "slug-and-oil")
    config = load(case_config(case, tmp_path / "state"))  # `call` serves it with tests.console.TOKEN
    daemon = run_live(config, read_samples(case))
    try:
        listed = call(StationAdapter(daemon), "GET", "/api/incidents", token=None)
        assert listed.status_code == 200
        ids = [i["id"] for i in listed.json()]
        assert len(ids) == 2
        one = call(StationAdapter(daemon), "GET", f"/api/incidents/{ids[0]}", token=None).json()
        assert one["rule"] == "slug" and one["statement_due"].endswith("Z")
        assert call(StationAdapter(daemon), "GET", "/api/incidents/no-such", token=None).status_code == 404
        # the daemon's clock is June 2026: the statements are not overdue yet (due June 19)
        assert call(StationAdapter(daemon), "GET", "/api/incidents/overdue", token=None).json() == []
        assert isinstance(daemon.clock, ManualClock)
        daemon.clock.set(1781913600.0)  # 2026-06-20T00:00Z, past 2026-06-19 04:00Z
        overdue = call(StationAdapter(daemon), "GET", "/api/incidents/overdue", token=None).json()
        # the slug began 2026-06-03 22:13 EDT (02:13Z on the 4th): its date of occurrence is the 3rd
        # local, so it is overdue; the oil one began on the 4th local and is due a day later
        assert [d["incident"] for d in overdue] == ids[:1] and overdue[0]["due_local"].endswith("EDT")

        body = {"by": "R. Alvarez", "text": "statement received", "kind": "statement"}
        assert post(daemon, f"/api/incidents/{ids[0]}/notes", body, configured=False).status_code == 403
        assert post(daemon, f"/api/incidents/{ids[0]}/notes", body, bearer="wrong").status_code == 401
        noted = post(daemon, f"/api/incidents/{ids[0]}/notes", body)
        assert noted.status_code == 200, noted.text
        assert noted.json()["notes"][0]["by"] == "R. Alvarez" and noted.json()["overdue"] == []
        hostile = {"by": "x" * 101, "text": "t"}
        assert post(daemon, f"/api/incidents/{ids[0]}/notes", hostile).status_code == 422
        wrong_due = {"by": "a", "text": "t", "kind": "note", "due": "2026-07-01T00:00:00Z"}
        assert post(daemon, f"/api/incidents/{ids[0]}/notes", wrong_due).status_code == 422
        # a notice whose time limit (07:00Z) passed before the oil excursion ended (07:15Z): overdue
        notice = {"by": "a", "text": "NOV 17", "kind": "notice", "due": "2026-06-04T03:00:00-04:00"}
        after = post(daemon, f"/api/incidents/{ids[1]}/notes", notice).json()
        assert after["due"][-1]["what"] == "§139-21 A correction by notice" and after["due"][-1]["overdue"]
        # one that gave until the 5th was met: the excursion ended in time, nothing more is owed
        met = {"by": "a", "text": "NOV 18", "kind": "notice", "due": "2026-06-05T00:00:00-04:00"}
        after = post(daemon, f"/api/incidents/{ids[1]}/notes", met).json()
        assert [d["due"] for d in after["due"] if d["what"].startswith("§139-21")] == ["2026-06-04T07:00:00Z"]

        close = {"by": "R. Alvarez", "reason": "penalty paid"}
        assert post(daemon, f"/api/incidents/{ids[0]}/close", close, bearer=None).status_code == 401
        closed = post(daemon, f"/api/incidents/{ids[0]}/close", close)
        assert closed.status_code == 200 and closed.json()["status"] == "closed"
        assert post(daemon, f"/api/incidents/{ids[0]}/close", close).status_code == 409
        assert [
            i["id"]
            for i in call(StationAdapter(daemon), "GET", "/api/incidents?status=closed", token=None).json()
        ] == ids[:1]
    finally:
        close_daemon(daemon)


def test_reactivation_within_the_merge_window_extends_the_incident(tmp_path: Path) -> None:
    """Two oil excursions 20 min apart are one incident (merge window 1 h); a third 3 h
    later is a new one."""
    config = oil_station(tmp_path, "merge_window: 1h")
    t0 = 1_780_000_000.0
    minutes = range(0, 8 * 60)

    def value(m: int) -> float:
        return 150.0 if 60 <= m < 70 or 90 <= m < 100 or 300 <= m < 310 else 20.0

    daemon = run_live(config, [Sample("oil", t0 + 60 * m, value(m)) for m in minutes])
    try:
        assert daemon.incidents is not None
        got = daemon.incidents.incidents()
        assert [(i.start - t0) / 60 for i in got] == [60.0, 300.0]
        first = got[0]
        assert first.activations == 2 and first.end is not None and (first.end - t0) / 60 == 100.0
        assert first.figures.samples == 41  # minutes 60..100, both ends counted
        assert first.frozen and got[1].frozen
    finally:
        close_daemon(daemon)


def test_incidents_reach_influxdb_as_their_own_measurement(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    influxdb1.query("CREATE DATABASE incidents_live")
    case = next(c for c in CASES if c.name == "slug-and-oil")
    influx = {"url": influxdb1.url, "api": "v1", "database": "incidents_live"}
    config = load(case_config(case, tmp_path / "state", influx=influx))
    daemon = run_live(config, [])
    try:
        feed(daemon, read_samples(case), batch=50)
        assert asyncio.run(daemon.sink.drain(60)) == 0
    finally:
        close_daemon(daemon)
    got = influxdb1.query(
        'SELECT "open", peak_multiple, excess_volume_gal, excess_mass_lb FROM incident GROUP BY sensor',
        db="incidents_live",
    )
    series = {s["tags"]["sensor"]: s for s in got["results"][0]["series"]}
    assert set(series) == {"outfall.flow", "outfall.oil"}
    flow = series["outfall.flow"]
    cols = flow["columns"]
    (row,) = flow["values"]  # one point per incident, rewritten as its figures changed
    assert row[cols.index("time")] == 1780539180000  # ms epoch of 2026-06-04T02:13:00Z, the start
    assert row[cols.index("open")] == 0 and abs(row[cols.index("peak_multiple")] - 6.945) < 0.01
    assert abs(row[cols.index("excess_volume_gal")] / 116226.58 - 1) < 0.005
    (oil,) = series["outfall.oil"]["values"]
    assert abs(oil[series["outfall.oil"]["columns"].index("excess_mass_lb")] / 7.4426 - 1) < 0.01


def test_a_failing_incident_store_never_stops_the_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk under the incident store: the alarms still go out, the failure is logged
    once, and the evidence catches up when the disk has room again. (A fake, to check the
    figures in process; a real full file system under `monitor run`, with the alarm it raises:
    tests/test_incidents_failing.py.)"""
    t0 = 1_780_000_000.0
    samples = [Sample("oil", t0 + 60 * m, 150.0 if 60 <= m < 70 else 20.0) for m in range(240)]
    daemon = run_live(oil_station(tmp_path), samples[:65])
    try:
        assert daemon.incidents is not None
        store = daemon.incidents.store
        real = store.add_evidence

        def disk_full(*args: object, **kw: object) -> int:
            raise StateError("incident store: database or disk is full")

        monkeypatch.setattr(store, "add_evidence", disk_full)
        with caplog.at_level(logging.ERROR):
            feed(daemon, samples[65:120])
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
            "incidents not recorded: incident store: database or disk is full"
        ]
        alarm = daemon.alarms.get("oil", Rule.HIGH)
        assert alarm is not None and not alarm.active and alarm.cleared_at == t0 + 60 * 70  # alarms went on

        monkeypatch.setattr(store, "add_evidence", real)
        feed(daemon, samples[120:])
        (inc,) = daemon.incidents.incidents()
        assert inc.frozen and inc.end == t0 + 60 * 70
        assert inc.figures.samples == 11 and inc.figures.peak_value == 150.0  # nothing lost meanwhile
    finally:
        close_daemon(daemon)
