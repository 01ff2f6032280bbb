"""An incident store that fails, in the running station (issue 16 records are what the
Superintendent acts on): one incident's damaged evidence marks that incident and the
others go on; a store that fails as a whole raises the `incident_store` diagnostic alarm,
cleared when recording works again. Faults are real: a block's bytes changed in the file
by another connection, a real full file system (tmpfs) under the store."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import html
import json
import logging
import os
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from monitor.daemon import Daemon, store_condition
from monitor.errors import StateError
from monitor.incidents import IncidentStore
from monitor.incidents.store import DamagedEvidenceError
from monitor.model import ConditionState, Rule, Sample, iso, parse_time
from monitor.web.service import StationCollector
from monitor.web.station import StationAdapter
from tests.conftest import fill_disk, tmpfs_disk
from tests.daemon_process import running_daemon
from tests.incident_helpers import close_daemon, feed, incidents_json, load, monitor, run_live
from tests.mqtt_tools import Peer
from tests.services import InfluxDB1, Mosquitto, free_port, wait_until

T0 = 1_780_000_000.0


def two_oil_sensors(tmp_path: Path, state: Path | None = None) -> Path:
    """Two oil sensors judged by their limit only, each its own incidents."""
    raw = tmp_path / "station.yaml"
    raw.write_text(
        f"station: {{id: ps-1}}\nstate_dir: {state or tmp_path / 'state'}\nconsole: {{enabled: false}}\n"
        "sensors:\n"
        "  - {id: a.oil, kind: concentration, substance: oil, slug: false, stale_after: 10m}\n"
        "  - {id: b.oil, kind: concentration, substance: oil, slug: false, stale_after: 10m}\n",
        encoding="utf-8",
    )
    return raw


def readings(minutes: range) -> list[Sample]:
    """a.oil over its limit in minutes 60-69, b.oil in minutes 120-129, 20 mg/L otherwise."""
    out = []
    for m in minutes:
        out.append(Sample("a.oil", T0 + 60 * m, 150.0 if 60 <= m < 70 else 20.0))
        out.append(Sample("b.oil", T0 + 60 * m, 150.0 if 120 <= m < 130 else 20.0))
    return out


def blocks(state: Path, iid: str) -> list[tuple[int, float, float, int]]:
    """(rowid, first, last, bytes of t) of each of the incident's blocks, read by a connection
    of the test's own."""
    db = sqlite3.connect(state / "incidents.sqlite")
    try:
        rows = db.execute(
            "SELECT rowid, first, last, length(t) FROM evidence_block WHERE incident = ? ORDER BY rowid",
            (iid,),
        ).fetchall()
    finally:
        db.close()
    return [(int(r), float(f), float(la), int(n)) for r, f, la, n in rows]


def test_a_damaged_evidence_block_marks_its_incident_and_the_others_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """a.oil's incident is open when its evidence block is damaged in the file (its grid of
    times cut to 15 bytes, as a bad disk or a bad restore would): the next batches still record
    b.oil's incident to the end (frozen, its figures whole), a.oil's is marked "evidence
    incomplete from T" (logged once) with the figures it had, its later samples in a new block
    of their own (the damaged one left as it is), ended and not frozen; after a restart the
    same, no crash, and `incidents show` prints the mark. Before, every batch failed as a
    whole: b.oil's incident was never recorded."""
    config = load(two_oil_sensors(tmp_path))
    state = tmp_path / "state"
    data = readings(range(0, 300))
    daemon = run_live(config, data[: 2 * 66])  # a.oil's incident open since minute 60
    try:
        assert daemon.incidents is not None
        (a,) = daemon.incidents.incidents()
        assert a.sensor == "a.oil" and a.end is None
        (damaged, first, last, _) = blocks(state, a.id)[-1]
        db = sqlite3.connect(state / "incidents.sqlite")
        db.execute("UPDATE evidence_block SET t = substr(t, 1, 15) WHERE rowid = ?", (damaged,))
        db.commit()
        db.close()
        before = daemon.incidents.store.get(a.id)
        assert before is not None

        with caplog.at_level(logging.ERROR):
            feed(daemon, data[2 * 66 :])
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not [e for e in errors if e.startswith("incidents not recorded")], errors
        marked = [e for e in errors if "evidence incomplete" in e and "ended" not in e]
        assert len(marked) == 1 and a.id in marked[0] and "a grid of times is 16 bytes, not 15" in marked[0]

        got = {i.sensor: i for i in daemon.incidents.incidents()}
        b = got["b.oil"]
        assert b.frozen and b.evidence_broken is None and b.end == T0 + 60 * 130
        assert b.figures.samples == 11 and b.figures.peak_value == 150.0
        a = got["a.oil"]
        assert a.end == T0 + 60 * 70 and not a.frozen and a.evidence_sha256 is None
        assert a.evidence_broken_at == first == T0  # the damaged block's first sample
        assert a.evidence_note is not None and a.evidence_note.startswith(
            "evidence incomplete from 2026-05-28T20:26:40Z: incident store"
        )
        assert a.figures == before.figures  # never numbers from part of the evidence
        assert a.id not in daemon.incidents.live  # no longer holding the buffer
        after = blocks(state, a.id)
        assert after[0] == (damaged, first, last, 15)  # left as it was
        assert len(after) == 2 and after[1][2] == T0 + 60 * 130  # the rest, to 1 h past the end
        assert daemon.incidents.evidence_incomplete == 1
        health = daemon.health().to_json()["incidents"]
        assert isinstance(health, dict) and health["evidence_incomplete"] == 1
    finally:
        close_daemon(daemon)

    again = Daemon(config, daemon.clock)  # restored: tried once more, still not frozen, no crash
    try:
        # The figure is the incidents on record marked, read from the store at the start (an
        # operator's "is a restore owed?"), not the marks made this run: 1 after the restart
        # too, and the marked one tried again is not counted twice. Before: 0 after a restart.
        for when in ("at the start", "after a batch"):
            health = again.health().to_json()["incidents"]
            assert isinstance(health, dict) and health["evidence_incomplete"] == 1, when
            registry = CollectorRegistry()
            registry.register(StationCollector(StationAdapter(again)))  # what /metrics serves
            scraped = generate_latest(registry).decode()
            assert 'station_monitor_incident_evidence_incomplete{station="ps-1"} 1.0' in scraped, when
            assert "station_monitor_incident_evidence_incomplete_total" not in scraped  # a gauge now
            feed(again, readings(range(300, 320)))
        assert again.incidents is not None
        (a2,) = [i for i in again.incidents.incidents() if i.sensor == "a.oil"]
        assert not a2.frozen and a2.evidence_broken_at == T0
    finally:
        close_daemon(again)
    shown = monitor("incidents", "show", "--config", str(tmp_path / "station.yaml"), "--id", a.id)
    assert "EVIDENCE     evidence incomplete from" in shown.stdout, shown.stdout + shown.stderr
    assert "Traceback" not in shown.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MB tmpfs (needs root, as tests/test_disk_full.py)."""
    with tmpfs_disk(tmp_path, "size=4m,mode=0700") as mount:
        yield mount


def get_json(console: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{console}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def store_alarm(console: int) -> dict[str, Any] | None:
    try:
        found = get_json(console, "/api/alarms?all=true")
    except OSError:
        return None
    return next((a for a in found if a["sensor"] == "incident_store" and a["rule"] == "incidents"), None)


def metrics(console: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{console}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_a_full_incident_store_raises_an_alarm_until_it_records_again(
    tmp_path: Path, small_disk: Path, broker: Mosquitto
) -> None:
    """`monitor run` with its incident store (alone: `incidents.sqlite` a link to it) on a real
    tmpfs filled to the last byte while an oil excursion opens an incident: the readings are
    stored and judged as before, the high-priority `incident_store/incidents` alarm is raised
    (console, retained MQTT topic), /api/health names the error and /metrics counts it; once
    space is freed the next batch records the incident and clears the alarm, and the record is
    whole (nothing lost meanwhile). Before, only a log line said so."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "incidents.sqlite").symlink_to(small_disk / "incidents.sqlite")
    console = free_port()
    config = tmp_path / "station.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "ps-inc"},
                "state_dir": str(state),
                "sensors": [{"id": "a.oil", "kind": "concentration", "substance": "oil", "slug": False,
                             "stale_after": "10m"}],
                "mqtt": {
                    "host": "127.0.0.1",
                    "port": broker.port,
                    "client_id": "inc-station",
                    "max_skew": "2d",
                    "subscriptions": [
                        {"topic": "inc/+/v", "sensor": "{1}", "format": "json", "value_path": "v",
                         "time_path": "t"}
                    ],
                },
                "console": {"host": "127.0.0.1", "port": console},
            }
        )
    )  # fmt: skip
    base = time.time() - 6 * 3600
    topic = "station-monitor/ps-inc/alarms/incident_store/incidents"

    def minutes(ms: range) -> list[tuple[str, bytes]]:
        return [
            ("inc/a.oil/v", json.dumps({"v": 150.0 if 60 <= m < 70 else 20.0, "t": base + 60 * m}).encode())
            for m in ms
        ]

    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon, closing(Peer(broker.port, "inc-field")) as peer:
        wait_until(lambda: "connected as" in log.read_text(), timeout=90, what="the daemon's MQTT session")
        assert (small_disk / "incidents.sqlite-wal").exists()  # the WAL beside the file, on the tmpfs
        peer.subscribe(topic)
        peer.publish_many(minutes(range(0, 60)))
        ballast = fill_disk(small_disk)  # to the last byte
        peer.publish_many(minutes(range(60, 70)))
        wait_until(
            lambda: (store_alarm(console) or {}).get("active") is True,
            timeout=60,
            what=f"the incident store alarm; log:\n{log.read_text()[-2000:]}",
        )
        raised = store_alarm(console)
        assert raised is not None and raised["priority"] == "high"
        assert "incidents not recorded" in raised["message"] and "full" in raised["message"]
        health = get_json(console, "/api/health")["incidents"]
        assert "database or disk is full" in health["failing"] and health["failures"] >= 1
        assert 'station_monitor_incident_store_failing{station="ps-inc"} 1.0' in metrics(console)
        wait_until(
            lambda: any(t == topic and json.loads(p)["active"] for t, p, _ in peer.received()),
            timeout=30,
            what="the alarm on MQTT",
        )
        # the readings went on being judged: the oil alarm itself is up
        assert any(a["sensor"] == "a.oil" and a["rule"] == "high" for a in get_json(console, "/api/alarms"))

        ballast.unlink()  # an operator frees space; the next batch records
        peer.publish_many(minutes(range(70, 200)))
        wait_until(
            lambda: (store_alarm(console) or {}).get("active") is False,
            timeout=60,
            what=f"the incident store alarm clearing; log:\n{log.read_text()[-2000:]}",
        )
        wait_until(
            lambda: [i["evidence"]["frozen"] for i in get_json(console, "/api/incidents")] == [True],
            timeout=60,
            what="the incident frozen",
        )
        (inc,) = get_json(console, "/api/incidents")
        assert inc["samples"] == 11 and inc["peak_value"] == 150.0  # nothing lost meanwhile
        assert inc["evidence"]["incomplete"] is None
        assert get_json(console, "/api/health")["incidents"]["failing"] is None
        text = metrics(console)
        assert 'station_monitor_incident_store_failing{station="ps-inc"} 0.0' in text
        assert 'station_monitor_incident_record_failures_total{station="ps-inc"}' in text
        wait_until(
            lambda: not json.loads([p for t, p, _ in peer.received() if t == topic][-1])["active"],
            timeout=30,
            what="the clear on MQTT",
        )
        daemon.stop(timeout=60)

    text = log.read_text()
    assert text.count("incidents not recorded") == 1, text[-3000:]
    assert "incidents recorded again" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("enabled", [True, False])
def test_the_alarm_a_restart_restores_is_cleared_by_the_first_batch_recorded(
    tmp_path: Path, enabled: bool
) -> None:
    """The journal holds `incident_store/incidents` active from before a restart (raised as
    the daemon raises it, then stopped): the first batch the store records clears it; with
    incidents turned off meanwhile, the start clears it (nothing else would)."""
    config = load(two_oil_sensors(tmp_path))
    first = run_live(config, readings(range(0, 3)))
    try:
        first.pipeline.submit([store_condition(T0, ConditionState.ACTIVE, "incidents not recorded: x")])
        alarm = first.alarms.get("incident_store", Rule.INCIDENTS)
        assert alarm is not None and alarm.active
    finally:
        close_daemon(first)
    if not enabled:
        raw = tmp_path / "station.yaml"
        raw.write_text(raw.read_text(encoding="utf-8") + "incidents: {enabled: false}\n", encoding="utf-8")
        config = load(raw)
    again = Daemon(config, first.clock)
    try:
        if enabled:
            assert again.incident_feed is not None and again.incident_feed.failing is not None
        feed(again, readings(range(3, 5)))
        again.pipeline.process_queued()
        alarm = again.alarms.get("incident_store", Rule.INCIDENTS)
        assert alarm is not None and not alarm.active
        if enabled:
            assert again.incident_feed is not None and again.incident_feed.failing is None
    finally:
        close_daemon(again)


def test_a_block_found_damaged_only_when_the_incident_is_frozen_leaves_it_marked_not_frozen(
    tmp_path: Path,
) -> None:
    """The damage (a block's checksum off by one) is met only when a.oil's incident is final
    and its evidence read whole for the file and the hash, no reading left to append: it is
    marked, saved unfrozen with the figures it had, and no evidence file is written; b.oil's
    incident, final in the same batches, is frozen."""
    config = load(two_oil_sensors(tmp_path))
    state = tmp_path / "state"
    data = readings(range(0, 130))
    daemon = run_live(config, data)  # a.oil's evidence copied to minute 129, not final yet
    try:
        assert daemon.incidents is not None
        (a,) = [i for i in daemon.incidents.incidents() if i.sensor == "a.oil"]
        assert not a.frozen
        db = sqlite3.connect(state / "incidents.sqlite")
        db.execute("UPDATE evidence_block SET crc = crc + 1 WHERE incident = ?", (a.id,))
        db.commit()
        db.close()
        before = daemon.incidents.store.get(a.id)
        assert before is not None
        # b.oil alone from here: a.oil's incident is final once its source is silent past stale_after
        feed(daemon, [s for s in readings(range(130, 200)) if s.sensor == "b.oil"])
        got = {i.sensor: i for i in daemon.incidents.incidents()}
        assert got["b.oil"].frozen and got["b.oil"].figures.samples == 11
        a = got["a.oil"]
        assert not a.frozen and a.evidence_sha256 is None and a.figures == before.figures
        assert a.evidence_note is not None and "written as" in a.evidence_note  # the checksum's error
        assert not daemon.incidents.store.evidence_path(a.id).exists()
        assert a.id not in daemon.incidents.live
    finally:
        close_daemon(daemon)


def _ten_second_readings(path: Path, until: float) -> Path:
    """a.oil and b.oil every 10 s from T0 up to (not including) `until`: a.oil over its limit
    from hour 12 to 14, b.oil from hour 16 for 10 min, 20 mg/L otherwise (a.oil's evidence from
    T0: more readings than a block joins, so a later replay starts a block of its own)."""
    with path.open("w", encoding="utf-8") as f:
        f.write("time,sensor,value\n")
        for k in range(int((until - T0) // 10)):
            t = T0 + 10 * k
            f.write(f"{t:.0f},a.oil,{150.0 if 12 * 3600 <= t - T0 < 14 * 3600 else 20.0}\n")
            f.write(f"{t:.0f},b.oil,{150.0 if 16 * 3600 <= t - T0 < 16 * 3600 + 600 else 20.0}\n")
    return path


def _replay(config: Path, csv: Path) -> subprocess.CompletedProcess[str]:
    return monitor(
        "replay", "--config", str(config), "--input", str(csv), "--events", str(csv.with_suffix(".jsonl"))
    )


@pytest.mark.parametrize("where", ["freezer process", "freezer thread"])
def test_a_block_the_replays_freezer_finds_damaged_marks_its_incident_and_the_replay_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A first replay ends with a.oil's incident open (its readings since T0 in a first block);
    that block's checksum is then off by one (as a bad disk or a bad restore would leave it).
    A longer replay continues the incident into a block of its own and ends it: the damage is
    met only by the replay's freezer process, reading the evidence whole for the file. The
    replay goes on (exit 0, no traceback): a.oil's incident is marked "evidence incomplete
    from T0" with the figures it had, not frozen, no evidence file; b.oil's incident, final in
    the same replay, is frozen and its evidence byte for byte that of the same replays over
    an undamaged store. Before, the replay failed (exit 1, a traceback) and froze neither.
    "freezer thread": a gateway at its process limit refuses the fork (faked: tests run as
    root, which RLIMIT_NPROC does not bind; as tests/test_incidents_worker.py does), the
    replay records and freezes in its own process, on a thread, and marks the same."""
    if where == "freezer thread":

        def refuse() -> int:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

        monkeypatch.setattr(os, "fork", refuse)
    runs = {}
    for name in ("undamaged", "damaged"):
        run = tmp_path / name
        run.mkdir()
        config = two_oil_sensors(run, run / "state")
        short = _ten_second_readings(run / "short.csv", T0 + 13 * 3600)  # a.oil's incident open
        full = _ten_second_readings(run / "full.csv", T0 + 20 * 3600)
        first = _replay(config, short)
        assert first.returncode == 0, first.stderr
        if name == "damaged":
            (damaged, since, _, _), *later = blocks(run / "state", incidents_json(config)[0]["id"])
            assert later, "a.oil's evidence in one block: the later replay would read it to join it"
            db = sqlite3.connect(run / "state" / "incidents.sqlite")
            db.execute("UPDATE evidence_block SET crc = crc + 1 WHERE rowid = ?", (damaged,))
            db.commit()
            db.close()
            before = incidents_json(config)[0]
        second = _replay(config, full)
        assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
        runs[name] = (config, second.stderr)

    config, stderr = runs["damaged"]
    got = {i["sensor"]: i for i in incidents_json(config)}
    a, b = got["a.oil"], got["b.oil"]
    assert since == T0
    assert a["evidence"]["incomplete"].startswith(f"evidence incomplete from {iso(T0)}: incident store"), a[
        "evidence"
    ]
    assert "written as" in a["evidence"]["incomplete"]  # the checksum's error, naming the block
    assert not a["evidence"]["frozen"] and a["evidence"]["sha256"] is None
    assert a["end"] == iso(T0 + 14 * 3600)
    figures = ("baseline", "peak_value", "peak_time", "peak_multiple", "mean_multiple", "coverage", "samples")
    assert {k: a[k] for k in figures} == {k: before[k] for k in figures}  # never from part of it
    with IncidentStore(tmp_path / "damaged" / "state") as store:
        assert not store.evidence_path(a["id"]).exists()
    said = [line for line in stderr.splitlines() if a["id"] in line and "not frozen" in line]
    assert len(said) == 1 and "evidence incomplete from" in said[0], stderr

    whole = {i["sensor"]: i for i in incidents_json(runs["undamaged"][0])}["b.oil"]
    assert b["evidence"]["frozen"] and b == whole
    files = [
        tmp_path / run / "state" / "incidents" / b["id"] / "evidence.csv" for run in ("undamaged", "damaged")
    ]
    assert files[0].read_bytes() == files[1].read_bytes()
    shown = monitor("incidents", "show", "--config", str(config), "--id", b["id"])
    assert "evidence verifies" in shown.stdout, shown.stdout + shown.stderr


def test_export_of_a_marked_incident_packs_the_evidence_up_to_the_damage_and_says_so(
    tmp_path: Path,
) -> None:
    """a.oil's last block is damaged (its checksum off by one) between a shorter and a longer
    replay: the longer one marks the incident "evidence incomplete from T" (T: where its
    evidence stops being whole) and writes its later readings to a block of their own.
    `monitor incidents export` of it writes the package all the same, with the readings before
    T, exactly those of the same replays over an undamaged store, none from the damaged block
    or after it; its manifest and report say "evidence incomplete from T: block N of sensor
    a.oil damaged; samples at or after T are not in this package", and so does stderr, with
    exit 3 (documented, distinct from 1: no package). b.oil's package has no such key.
    Before: exit 1 at the damaged block, no package at all."""
    for name in ("undamaged", "damaged"):
        run = tmp_path / name
        run.mkdir()
        config = two_oil_sensors(run, run / "state")
        short = _ten_second_readings(run / "short.csv", T0 + 13 * 3600)  # a.oil's incident open
        assert _replay(config, short).returncode == 0
        iid = incidents_json(config)[0]["id"]
        if name == "damaged":
            *whole, (damaged, _, _, _) = blocks(run / "state", iid)
            assert whole, "a.oil's evidence in one block: nothing before the damage to export"
            db = sqlite3.connect(run / "state" / "incidents.sqlite")
            db.execute("UPDATE evidence_block SET crc = crc + 1 WHERE rowid = ?", (damaged,))
            db.commit()
            db.close()
        second = _replay(config, _ten_second_readings(run / "full.csv", T0 + 20 * 3600))
        assert second.returncode == 0, second.stderr
    undamaged = (tmp_path / "undamaged" / "state" / "incidents" / iid / "evidence.csv").read_bytes()

    a = {i["sensor"]: i for i in incidents_json(config)}["a.oil"]
    assert a["evidence"]["incomplete"] is not None and not a["evidence"]["frozen"]
    since = a["evidence"]["incomplete"].split("evidence incomplete from ", 1)[1].split(": ", 1)[0]
    statement = (
        f"evidence incomplete from {since}: block {damaged} of sensor a.oil damaged;"
        f" samples at or after {since} are not in this package"
    )
    out = tmp_path / "package"
    got = monitor("incidents", "export", "--config", str(config), "--id", a["id"], "--out", str(out))
    assert got.returncode == 3 and "Traceback" not in got.stderr, got.stderr
    assert statement in got.stderr, got.stderr

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["evidence_incomplete"]["from"] == since
    assert manifest["evidence_incomplete"]["statement"] == statement
    (block,) = manifest["evidence_incomplete"]["damaged_blocks"]
    assert block["sensor"] == "a.oil" and block["block"] == damaged and "written as" in block["error"]
    for f in manifest["files"]:
        assert hashlib.sha256((out / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    header, *rows = undamaged.decode().splitlines(keepends=True)
    before = [r for r in rows if r.split(",", 1)[0] < since]
    assert before and len(before) < len(rows)
    assert (out / f"{a['id']}-evidence.csv").read_text(encoding="utf-8") == header + "".join(before)
    report = (out / f"{a['id']}.html").read_text(encoding="utf-8")
    assert statement in report
    assert json.loads((out / f"{a['id']}.json").read_text(encoding="utf-8"))["evidence"] == a["evidence"]

    b = {i["sensor"]: i for i in incidents_json(config)}["b.oil"]
    whole_out = tmp_path / "whole"
    got = monitor("incidents", "export", "--config", str(config), "--id", b["id"], "--out", str(whole_out))
    assert got.returncode == 0 and "evidence incomplete" not in got.stderr, got.stderr
    manifest = json.loads((whole_out / "manifest.json").read_text(encoding="utf-8"))
    assert set(manifest) == {"incident", "generated", "evidence_sha256_recorded", "files"}
    frozen = tmp_path / "damaged" / "state" / "incidents" / b["id"] / "evidence.csv"
    assert (whole_out / f"{b['id']}-evidence.csv").read_bytes() == frozen.read_bytes()


def test_incidents_list_flags_a_marked_incident_on_its_line(tmp_path: Path) -> None:
    """`monitor incidents list` (text) says "EVIDENCE INCOMPLETE from T" on a marked incident's
    line, as it says OVERDUE, and nothing on a whole one's: the list is where a Superintendent
    picks the incident to report on. Before, only `show` and the JSON said it."""
    from tests.incident_helpers import replay_case

    cfg = replay_case("slug-and-oil", tmp_path)
    slug, oil = incidents_json(cfg)
    with IncidentStore(tmp_path / "state") as store:
        inc = store.get(slug["id"])
        assert inc is not None
        store.save(
            inc.with_(frozen=False, evidence_broken_at=inc.start + 600, evidence_broken="block 3 damaged")
        )
    listed = monitor("incidents", "list", "--config", str(cfg))
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert lines[slug["id"]].endswith(f"  EVIDENCE INCOMPLETE from {iso(inc.start + 600)}"), lines
    assert "EVIDENCE" not in lines[oil["id"]]


def _frozen_a_oil(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Two replays (the second continues the first's open incident): a.oil's incident
    final and frozen, its evidence in more than one block; (config, its JSON)."""
    config = two_oil_sensors(tmp_path)
    assert _replay(config, _ten_second_readings(tmp_path / "short.csv", T0 + 13 * 3600)).returncode == 0
    assert _replay(config, _ten_second_readings(tmp_path / "full.csv", T0 + 20 * 3600)).returncode == 0
    a = {i["sensor"]: i for i in incidents_json(config)}["a.oil"]
    assert a["evidence"]["frozen"] and a["evidence"]["incomplete"] is None
    return config, a


def _polyline(report: str) -> str:
    """The report's plotted readings (`<polyline id="readings" points=...>`)."""
    return report.split('<polyline id="readings" points="', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("frozen_file", ["whole", "altered", "missing"])
def test_export_of_a_frozen_incident_whose_store_was_damaged_after_the_freeze(
    tmp_path: Path, frozen_file: str
) -> None:
    """a.oil's incident is final and frozen (its evidence file written, its SHA-256 recorded)
    when the last of its evidence blocks is damaged on disk (its checksum off by one).
    With the frozen file still whole, `monitor incidents export` builds the package from that
    file (it is the evidence the hash vouches for): the CSV byte for byte the file, the plot
    the one an undamaged store gives, and the manifest, the report and stderr say the store's
    block is damaged and the package was built from the verified frozen file; exit 0 (the
    package is whole). With the file altered or missing too, nothing vouches for the rest:
    the package holds the readings before the damaged block, as a marked incident's does,
    said in the manifest, the report and stderr, exit 3. Before: exit 1, no package at all."""
    config, a = _frozen_a_oil(tmp_path)
    undamaged = tmp_path / "undamaged"
    got = monitor("incidents", "export", "--config", str(config), "--id", a["id"], "--out", str(undamaged))
    assert got.returncode == 0, got.stderr

    state = tmp_path / "state"
    *intact, (damaged, first, _, _) = blocks(state, a["id"])
    assert intact, "a.oil's evidence in one block: nothing before the damage"
    db = sqlite3.connect(state / "incidents.sqlite")
    db.execute("UPDATE evidence_block SET crc = crc + 1 WHERE rowid = ?", (damaged,))
    db.commit()
    db.close()
    frozen = state / "incidents" / a["id"] / "evidence.csv"
    recorded = frozen.read_bytes()
    assert hashlib.sha256(recorded).hexdigest() == a["evidence"]["sha256"]
    if frozen_file == "altered":
        frozen.write_bytes(recorded.replace(b",a.oil,150.0,", b",a.oil,15.0,", 1))
    elif frozen_file == "missing":
        frozen.unlink()

    out = tmp_path / "package"
    got = monitor("incidents", "export", "--config", str(config), "--id", a["id"], "--out", str(out))
    assert "Traceback" not in got.stderr, got.stderr
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    for f in manifest["files"]:
        assert hashlib.sha256((out / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    csv = (out / f"{a['id']}-evidence.csv").read_bytes()
    report = (out / f"{a['id']}.html").read_text(encoding="utf-8")
    said = f"block {damaged} of sensor a.oil damaged"
    if frozen_file == "whole":
        assert got.returncode == 0, got.stderr
        assert csv == recorded
        assert manifest["evidence_sha256_recorded"] == hashlib.sha256(csv).hexdigest()
        assert "evidence_incomplete" not in manifest
        store = manifest["evidence_store_damaged"]
        assert said in store["statement"] and "built from the frozen evidence file" in store["statement"]
        assert store["built_from"] == "frozen evidence file"
        (block,) = store["damaged_blocks"]
        assert block["sensor"] == "a.oil" and block["block"] == damaged and "written as" in block["error"]
        assert store["statement"] in got.stderr.splitlines()[-1], got.stderr
        assert html.escape(store["statement"]) in report
        before = (undamaged / f"{a['id']}.html").read_text(encoding="utf-8")
        assert _polyline(report) == _polyline(before)  # the file read back: the same readings
        return
    assert got.returncode == 3, got.stderr
    assert "evidence_store_damaged" not in manifest
    why = "does not verify" if frozen_file == "altered" else "is missing"
    statement = (
        f"evidence incomplete from {iso(first)}: {said}, and the frozen evidence file {why};"
        f" samples at or after {iso(first)} are not in this package"
    )
    assert manifest["evidence_incomplete"]["from"] == iso(first)
    assert manifest["evidence_incomplete"]["statement"] == statement
    assert statement in got.stderr.splitlines()[-1], got.stderr
    assert html.escape(statement) in report
    header, *rows = recorded.decode().splitlines(keepends=True)
    kept = [r for r in rows if r.split(",", 1)[0] < iso(first)]
    assert kept and len(kept) < len(rows)
    assert csv.decode() == header + "".join(kept)


def test_export_of_a_frozen_incident_whose_store_pages_are_damaged_is_its_verified_file(
    tmp_path: Path,
) -> None:
    """A page of incidents.sqlite damaged (its first bytes, as a bad sector would) so that a
    frozen incident's record reads but its evidence does not read at all (SQLite: "database
    disk image is malformed", no block to name): `export` builds the package from the frozen
    file, which verifies, says the store's evidence cannot be read (manifest, report,
    stderr) and exits 0. Before: exit 1, no package."""
    config, a = _frozen_a_oil(tmp_path)
    iid = a["id"]
    store_file = tmp_path / "state" / "incidents.sqlite"
    wal = store_file.with_name("incidents.sqlite-wal")
    assert not wal.exists() or not wal.stat().st_size  # every page in the file
    sound = store_file.read_bytes()
    for page in range(2, len(sound) // 4096 + 1):
        damaged = bytearray(sound)
        damaged[(page - 1) * 4096 : (page - 1) * 4096 + 6] = b"\xff\xff\xff\xf0\xff\xff"
        store_file.write_bytes(damaged)
        with IncidentStore(tmp_path / "state") as store:
            try:
                if store.get(iid) is None:
                    continue
            except StateError:  # the record's own page: nothing to export
                continue
            try:
                store.intact_columns(iid)
            except DamagedEvidenceError:  # a block's bytes: the test above
                continue
            except StateError as exc:
                error = str(exc)
                break
    else:
        pytest.fail("no page whose damage leaves the record readable and the evidence not")
    assert "malformed" in error and iid in error, error
    out = tmp_path / "package"
    got = monitor("incidents", "export", "--config", str(config), "--id", iid, "--out", str(out))
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    said = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["evidence_store_damaged"]
    assert said["damaged_blocks"] == [] and said["error"] == error
    assert f"its evidence cannot be read: {error}" in said["statement"]
    assert (
        said["statement"] in got.stderr
        and html.escape(said["statement"]) in (out / f"{iid}.html").read_text()
    )
    frozen = tmp_path / "state" / "incidents" / iid / "evidence.csv"
    assert (out / f"{iid}-evidence.csv").read_bytes() == frozen.read_bytes()


@pytest.mark.parametrize("frozen_file", ["altered", "swapped", "missing"])
def test_export_of_a_frozen_incident_packs_the_store_and_says_the_file_does_not_verify(
    tmp_path: Path, frozen_file: str
) -> None:
    """The store whole, the frozen evidence file not what was frozen: a reading changed in
    it, swapped for the other incident's frozen file (whole and valid, another hash), or
    missing. The package is the store's evidence, which hashes to the SHA-256 recorded at
    the freeze (exit 0: the package is whole), and the manifest
    (`evidence_file_not_verified`), the report and stderr say the file on disk does not
    verify: the Superintendent must know the frozen copy was tampered with. Before, the
    package said nothing of it (an empty stderr, no key in the manifest)."""
    from tests.incident_helpers import replay_case

    cfg = replay_case("slug-and-oil", tmp_path)
    slug, other, *_ = incidents_json(cfg)
    frozen = tmp_path / "state" / "incidents" / slug["id"] / "evidence.csv"
    recorded = frozen.read_bytes()
    if frozen_file == "altered":
        altered = recorded.replace(b",outfall.flow,", b",outfall.flow,9", 1)
        assert altered != recorded
        frozen.write_bytes(altered)
    elif frozen_file == "swapped":
        theirs = tmp_path / "state" / "incidents" / other["id"] / "evidence.csv"
        assert hashlib.sha256(theirs.read_bytes()).hexdigest() == other["evidence"]["sha256"]
        frozen.write_bytes(theirs.read_bytes())
    else:
        frozen.unlink()
    out = tmp_path / "package"
    got = monitor("incidents", "export", "--config", str(cfg), "--id", slug["id"], "--out", str(out))
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    csv = (out / f"{slug['id']}-evidence.csv").read_bytes()
    assert csv == recorded and hashlib.sha256(csv).hexdigest() == slug["evidence"]["sha256"]
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert "evidence_incomplete" not in manifest and "evidence_store_damaged" not in manifest
    said = manifest["evidence_file_not_verified"]
    why = "is missing" if frozen_file == "missing" else "does not verify"
    assert f"the frozen evidence file {frozen} {why}" in said["statement"], said
    assert "the incident store's evidence, which hashes to the SHA-256 recorded" in said["statement"]
    assert said["built_from"] == "incident store"
    assert said["file_sha256"] == (
        None if frozen_file == "missing" else hashlib.sha256(frozen.read_bytes()).hexdigest()
    )
    assert said["statement"] in got.stderr.splitlines()[-1], got.stderr
    report = (out / f"{slug['id']}.html").read_text(encoding="utf-8")
    assert html.escape(said["statement"]) in report
    assert "(as recorded when the incident was frozen)" in report


def test_export_refuses_a_frozen_incident_whose_file_and_store_both_differ_from_the_freeze(
    tmp_path: Path,
) -> None:
    """The frozen evidence file altered, and the store's evidence altered too while reading
    whole (a row added to the schema 1 `evidence` table, which carries no checksum): nothing
    on disk is what was frozen, so no package at all (exit 1), stderr says why. Before: a
    package of the store's rows, exit 0, holding a reading that is not the frozen evidence
    and saying nothing."""
    from tests.incident_helpers import replay_case

    cfg = replay_case("slug-and-oil", tmp_path)
    slug = incidents_json(cfg)[0]
    state = tmp_path / "state"
    frozen = state / "incidents" / slug["id"] / "evidence.csv"
    recorded = frozen.read_bytes()
    frozen.write_bytes(recorded.replace(b",outfall.flow,", b",outfall.flow,9", 1))
    db = sqlite3.connect(state / "incidents.sqlite")
    db.execute(
        "INSERT INTO evidence (incident, sensor, t, value, quality) VALUES (?, 'outfall.flow', ?, 999.0, 0)",
        (slug["id"], parse_time(slug["start"]) + 0.5),
    )
    db.commit()
    db.close()
    out = tmp_path / "package"
    got = monitor("incidents", "export", "--config", str(cfg), "--id", slug["id"], "--out", str(out))
    assert got.returncode == 1 and "Traceback" not in got.stderr, (got.returncode, got.stderr)
    assert not out.exists() or not list(out.iterdir())
    assert f"incident {slug['id']}" in got.stderr and "the frozen evidence file" in got.stderr, got.stderr
    assert "does not hash to the SHA-256 recorded" in got.stderr, got.stderr


def test_the_incident_measurement_carries_the_evidence_incomplete_mark(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    """The `incident` point of an incident marked "evidence incomplete from T" (a.oil's, its
    block damaged while it was open) carries `evidence_incomplete` 1 and
    `evidence_incomplete_from` T (epoch seconds, as `alarm_time`), in a real InfluxDB 1.x;
    a whole incident's (b.oil's) `evidence_incomplete` 0 and no T. Before, nothing in the
    measurement told a marked incident from a whole one."""
    influxdb1.query("CREATE DATABASE marked")
    raw = two_oil_sensors(tmp_path)
    raw.write_text(
        raw.read_text(encoding="utf-8") + f"influx: {{url: '{influxdb1.url}', api: v1, database: marked}}\n",
        encoding="utf-8",
    )
    config = load(raw)
    data = readings(range(0, 300))
    daemon = run_live(config, data[: 2 * 66])  # a.oil's incident open since minute 60
    try:
        assert daemon.incidents is not None
        (a,) = daemon.incidents.incidents()
        (damaged, first, _, _) = blocks(tmp_path / "state", a.id)[-1]
        db = sqlite3.connect(tmp_path / "state" / "incidents.sqlite")
        db.execute("UPDATE evidence_block SET t = substr(t, 1, 15) WHERE rowid = ?", (damaged,))
        db.commit()
        db.close()
        feed(daemon, data[2 * 66 :])
        assert asyncio.run(daemon.sink.drain(60)) == 0
    finally:
        close_daemon(daemon)
    got = influxdb1.query(
        'SELECT "open", evidence_incomplete, evidence_incomplete_from, peak_value FROM incident'
        " GROUP BY sensor",
        db="marked",
    )
    series = {s["tags"]["sensor"]: s for s in got["results"][0]["series"]}
    rows = {}
    for sensor, s in series.items():
        (row,) = s["values"]  # one point per incident, rewritten
        rows[sensor] = dict(zip(s["columns"], row, strict=True))
    marked, whole = rows["a.oil"], rows["b.oil"]
    assert marked["evidence_incomplete"] == 1 and marked["evidence_incomplete_from"] == first == T0
    assert whole["evidence_incomplete"] == 0 and whole["evidence_incomplete_from"] is None
    assert marked["open"] == 0 and marked["peak_value"] == 150.0  # the other fields as before


def test_export_and_show_do_not_hang_on_a_fifo_in_place_of_the_frozen_file(tmp_path: Path) -> None:
    """A FIFO where the frozen evidence file was (nothing ever writes to it; a link to
    /dev/zero is the same kind of trap, a read that never ends, not tried here: it eats
    memory): `export` and `show` in a subprocess, so a hang fails on its timeout, not the
    run. The file is not a regular file: not verified, the package the store's evidence
    (which hashes to the recorded SHA-256) with the file's state said; `show` says the
    evidence does not verify (exit 0, as for an altered file). Before: both blocked for ever
    in open()."""
    import sys

    from tests.incident_helpers import replay_case

    cfg = replay_case("slug-and-oil", tmp_path)
    slug = incidents_json(cfg)[0]
    frozen = tmp_path / "state" / "incidents" / slug["id"] / "evidence.csv"
    recorded = frozen.read_bytes()
    frozen.unlink()
    os.mkfifo(frozen)
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "package"
    run = [sys.executable, "-m", "monitor", "incidents"]
    try:
        got = subprocess.run(
            [*run, "export", "--config", str(cfg), "--id", slug["id"], "--out", str(out)],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=120,
        )
        shown = subprocess.run(
            [*run, "show", "--config", str(cfg), "--id", slug["id"]],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=120,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{exc.cmd[4]} blocked on the FIFO: {exc}")
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    assert (out / f"{slug['id']}-evidence.csv").read_bytes() == recorded
    said = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["evidence_file_not_verified"]
    assert f"the frozen evidence file {frozen} is not a regular file" in said["statement"], said
    assert said["file_sha256"] is None
    assert shown.returncode == 0 and "evidence DOES NOT VERIFY" in shown.stdout, (shown.stdout, shown.stderr)


def test_export_of_a_frozen_incident_never_holds_a_huge_file_in_place_of_its_evidence(tmp_path: Path) -> None:
    """A 2 GiB file (sparse: no disk taken) where the frozen evidence file was, `export` in a
    subprocess whose address space is capped at 1.5 GiB (more than an export of this incident
    takes, less than the file): the file is hashed a chunk at a time and, as it does not
    verify, never read whole; the package is the store's evidence, the file said not to
    verify (with its own SHA-256). Before: Path.read_bytes of the whole file, a MemoryError
    and a traceback (on a station without the cap, the OOM killer's pick)."""
    import resource
    import sys

    from tests.incident_helpers import replay_case

    cfg = replay_case("slug-and-oil", tmp_path)
    slug = incidents_json(cfg)[0]
    frozen = tmp_path / "state" / "incidents" / slug["id"] / "evidence.csv"
    recorded = frozen.read_bytes()
    size = 2 << 30
    with frozen.open("r+b") as fh:
        fh.truncate(size)
    cap = 3 << 29

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    out = tmp_path / "package"
    export = ["incidents", "export", "--config", str(cfg), "--id", slug["id"], "--out", str(out)]
    got = subprocess.run(
        [sys.executable, "-m", "monitor", *export],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=300,
        preexec_fn=capped,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr[-3000:]
    assert (out / f"{slug['id']}-evidence.csv").read_bytes() == recorded
    said = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["evidence_file_not_verified"]
    zeros = hashlib.sha256(recorded)
    zeros.update(bytes(size - len(recorded)))
    assert f"the frozen evidence file {frozen} does not verify" in said["statement"], said
    assert said["file_sha256"] == zeros.hexdigest()


def test_show_of_a_frozen_incident_whose_file_is_gone_says_why_and_that_the_rows_verify(
    tmp_path: Path,
) -> None:
    """What a power cut before the directory fsync left (or a file deleted by hand): the
    record frozen, its evidence.csv gone. `show` said only `evidence DOES NOT VERIFY`, the
    same words as for rows tampered with, while `export` builds the whole package from the
    store's rows, which hash to the recorded SHA-256. Now it says which half is wrong."""
    from tests.incident_helpers import replay_case

    cfg = replay_case("slug-and-oil", tmp_path)
    slug = incidents_json(cfg)[0]
    frozen = tmp_path / "state" / "incidents" / slug["id"] / "evidence.csv"
    frozen.unlink()
    shown = monitor("incidents", "show", "--config", str(cfg), "--id", slug["id"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == (
        "  evidence DOES NOT VERIFY: the frozen evidence file is missing; the store's rows verify"
        " (`monitor incidents export` builds the package from them)"
    )
