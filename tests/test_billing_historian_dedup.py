"""`billing export --from-influx` from a VictoriaMetrics started with `-dedup.minScrapeInterval=1ms`,
as our docs once told users to start it (delivery is at least once).

With it, VictoriaMetrics keeps one sample per series and millisecond, and each field of a
`meter` point is a series of its own: a point written twice with different values (a row the
ledger re-judged, a clock step's `restamped` overwrite) reads back as one value per field, each
from either write, and nothing says two were written. Measured on the 1.79 we run: the value
kept is neither the largest nor the last written, and the export of parts not yet merged is
already deduplicated (query time). The reader cannot get the ledger's figures back from that,
so it flags every row `deduplicated` and says why; a VictoriaMetrics without the flag keeps
every value and the reader drops an identical re-send itself (tested here).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from monitor.config import Config, Influx
from monitor.errors import SourceError
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook, MeterRecord
from monitor.meters.dedup import broken_link, doubt, interval_ms
from monitor.meters.historian import station_quarter
from monitor.meters.periods import Quarter
from monitor.meters.totalizer import MeterSpec
from monitor.model import Sample
from monitor.sinks.lineproto import meter_point_line
from monitor.sources.meter_history import MeterSample as StoredSample
from monitor.sources.meter_history import _dedup_flag, open_history
from tests.services import InfluxDB1, VictoriaMetrics, VMAuth, http
from tests.test_billing_historian import (
    Station,
    build_station,
    by_station,
    case_raw,
    historian_export,
    own_export,
    station_b,
    write_yaml,
)
from tests.test_meter_clock_step import export, meter_station, run_across_a_step
from tests.test_pipeline import close

DEDUP = "deduplicated"


class AuthVictoriaMetrics(VictoriaMetrics):
    """VictoriaMetrics enforcing basic auth itself (`-httpAuth.*`), as a clerk's config names it."""

    def command(self) -> list[str]:
        key = [f"-flagsAuthKey={self.flags_key}"] if self.flags_key else []
        return [*super().command(), "-httpAuth.username=clerk", "-httpAuth.password=s3cret-pw", *key]

    flags_key = ""  # -flagsAuthKey: /flags then answers 401 without it

    def ready(self) -> bool:
        """`VictoriaMetrics.ready` reads /flags, which takes the key once it is set."""
        if not self.flags_key:
            return super().ready()
        try:
            status, flags = http("GET", f"{self.url}/flags?authKey={self.flags_key}")
        except OSError:
            return False
        return status == 200 and f'-storageDataPath="{self.workdir / "data"}"' in flags.decode()


def test_the_deduplicating_server_keeps_one_value_per_field_neither_the_largest_nor_the_last(
    victoria_dedup: VictoriaMetrics,
) -> None:
    """The VictoriaMetrics docs of later releases say the largest value stays when timestamps
    are equal; the 1.79 we run keeps one that depends on how the samples fell into parts. A
    point accepted (10 ft3) then overwritten rejected (0 ft3, `restamped` 1), each write its own
    request, as the outbox sends them: one value per field is left, from either write, at once
    (dedup applies at query time, to parts not yet merged), and after a restart.
    Later releases keep the largest: the accepted reading's 10 ft3 and `accepted` 1 over the
    overwrite's 0, and the overwrite's `restamped` 1: the reader would take the point for the
    overwrite while every value it holds is the accepted reading's, billed twice. Flagged too."""
    t = 1_700_000_000.0
    first = MeterRecord("m", "a", "ft3", t, 110.0, 10.0, 10.0, True, "")
    again = MeterRecord("m", "a", "ft3", t, 100.0, 0.0, 0.0, False, "", 1)
    victoria_dedup.write([meter_point_line("ps-dedup-probe", first)], "o", "probe")
    victoria_dedup.flush()
    victoria_dedup.write([meter_point_line("ps-dedup-probe", again)], "o", "probe")
    pairs = {(5.0, 3.0), (3.0, 5.0), (1.0, 9.0), (3.0, -2.0)}
    for i, (x, y) in enumerate(sorted(pairs)):
        for v in (x, y):
            victoria_dedup.write([f"probe,pair={i} v={v} 1700000000000000000"], "o", "probe")
            victoria_dedup.flush()
    # Not `/internal/force_merge`: it returns before the merge ends, and a restart during it
    # lost every series of the partition on the 1.79 we run (4 runs in 5, also without dedup).
    for when in ("query time", "restart"):
        if when == "restart":
            victoria_dedup.restart()
        got = victoria_dedup.export('{station="ps-dedup-probe"}')
        # reading, consumption, consumption_ft3, accepted, restamped: one value each
        assert sorted(len(s["values"]) for s in got) == [1] * 5
        kept = {
            (x, y): next(s["values"][0] for s in victoria_dedup.export(f'{{__name__="probe_v",pair="{i}"}}'))
            for i, (x, y) in enumerate(sorted(pairs))
        }
        assert all(v in pair for pair, v in kept.items())
        if when == "query time":  # neither rule holds for every pair: not the largest, not the last
            assert any(v != max(pair) for pair, v in kept.items()), (when, kept)
            assert any(v != pair[1] for pair, v in kept.items()), (when, kept)
        # After the restart the parts fell otherwise: once in six runs every pair kept its largest.


def test_a_quarter_from_a_deduplicating_victoriametrics_flags_the_rows_it_may_have_changed(
    tmp_path: Path, victoria_dedup: VictoriaMetrics
) -> None:
    """The golden quarter of two stations (a swap: the shop meter's readings after it went out
    rejected, then accepted once the replacement was recorded). Without the flag the server
    holds both values and the export says `rewritten` (test_billing_historian.py). With it, one
    value per field is left: the shop meter was once billed 26,880 ft3 of the ledger's 44,160
    and nothing said so; then every row said `deduplicated`, so the flag said nothing. Now the
    rows that hold a point that may have been written twice (a rejected reading, a reading not
    following from the one before) are flagged, each with a warning that says why, and the
    rest are the ledger's rows, unflagged, to the cubic foot."""
    vm = {"url": victoria_dedup.url, "org": "barton", "bucket": "dedup-quarter"}
    influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "unused"}  # never drained
    before = victoria_dedup.lines_taken()
    a = build_one(tmp_path / "ps-1", case_raw(), influx, vm)
    b = build_one(tmp_path / "ps-2", station_b(case_raw()), influx, vm)
    victoria_dedup.wait_for_lines(before + a.lines_to_victoria + b.lines_to_victoria)
    victoria_dedup.flush()
    rows, err = historian_export(a.to_victoria, b.to_victoria)
    assert err.count(f"-dedup.minScrapeInterval=1ms: the rows it may have changed flagged {DEDUP}") == 1, err
    got = by_station(rows)
    for station in (a, b):
        own = own_export(station)
        mine = got[station.config.station.id]
        assert [h["meter"] for h in mine] == [o["meter"] for o in own]
        for h, o in zip(mine, own, strict=True):
            if o["meter"] in DOUBTED:
                assert DEDUP in h["flags"].split(";"), h
                assert f"meter {o['meter']}: 2026Q3 flagged {DEDUP}: " in err, err
            else:  # written once each, every reading accepted and following from the one before
                assert h == o, h


# The golden quarter's rows a 1 ms dedup may have changed: the swap's re-judged readings
# (rejected, then accepted: the kept value of each field from either write); the village
# meter's spike, rejected (by the ledger, never re-judged: the kept values cannot say so).
DOUBTED = ("shop.meter", "village.meter")


def build_one(root: Path, raw: dict[str, object], influx: dict[str, str], vm: dict[str, str]) -> Station:
    """`build_station` to VictoriaMetrics; the InfluxDB outbox is left undrained (nobody there)."""
    return build_station(root, dict(raw), influx, vm, drain=("victoria",))


@pytest.mark.parametrize("server", ["victoria", "victoria_dedup"])
def test_a_batch_delivered_twice_is_billed_once(
    tmp_path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    """The outbox's at-least-once delivery: every meter point reaches the server twice (a batch
    stored just before a crash is sent again). Without dedup the server holds both copies, the
    same values, and the reader takes them as one: the export is the ledger's, unflagged. With
    dedup the figures are the same; the rows flagged are those of a point that may have been
    re-judged (the swap, the rejected spike), whether or not it was sent twice."""
    vm: VictoriaMetrics = request.getfixturevalue(server)
    section = {"url": vm.url, "org": "barton", "bucket": f"twice-{server}"}
    influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "unused"}
    raw = case_raw()
    raw["station"] = {"id": f"ps-twice-{server}", "name": "twice"}
    before = vm.lines_taken()
    station = build_station(tmp_path, raw, influx, section, drain=("victoria",), repeat=True)
    vm.wait_for_lines(before + station.lines_to_victoria)
    vm.flush()
    rows, _ = historian_export(station.to_victoria)
    own = own_export(station)
    mine = by_station(rows)[raw["station"]["id"]]
    assert len(mine) == len(own)
    for h, o in zip(mine, own, strict=True):
        # shop.meter's swap re-judged its rows: two values at one time, `rewritten` as ever
        extra = [*(["rewritten"] if o["meter"] == "shop.meter" and server == "victoria" else [])]
        extra += [DEDUP] if server == "victoria_dedup" and o["meter"] in DOUBTED else []
        want = ";".join([f for f in o["flags"].split(";") if f] + extra)
        if server == "victoria_dedup" and o["meter"] == "shop.meter":
            assert DEDUP in h["flags"].split(";")
        else:
            assert h == {**o, "flags": want}, o["meter"]


@pytest.mark.parametrize("server", ["victoria", "victoria_dedup"])
def test_a_step_seen_live_exported_from_victoriametrics(
    tmp_path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    """The gateway clock steps back an hour while the daemon runs; the old clock's points
    (100 ... 150) reached VictoriaMetrics first and are overwritten `restamped`. Without dedup
    the historian bills the ledger's 100 ft3 from 100 to 200. With dedup the overwrite and the
    accepted reading it replaces leave one value per field, from either: flagged."""
    vm: VictoriaMetrics = request.getfixturevalue(server)
    path = meter_station(tmp_path, section={"url": vm.url, "org": "o", "bucket": f"live-{server}"})
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["station"]["id"] = "ps-live-step"  # a station of its own: the server is the session's
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    before = vm.lines_taken()
    _, gw = run_across_a_step(tmp_path, path, drain=True)
    daemon = gw.daemon
    try:
        daemon.pipeline.send_meter_points()
        assert asyncio.run(daemon.sink.drain(30.0)) == 0
        assert daemon.sink.drainer is not None and daemon.meters.ledger.unsent() == ([], [])
        written = daemon.sink.drainer.stats.written
    finally:
        close(daemon)
    vm.wait_for_lines(before + written)
    vm.flush()
    ledger, historian = export(path), export(path, "--from-influx")
    assert ledger["consumption_ft3"] == "100.000"
    flags = historian["flags"].split(";")
    if server == "victoria":
        assert (historian["first_read"], historian["last_read"], historian["consumption_ft3"]) == (
            "100", "200", "100.000",
        )  # fmt: skip
        assert "anomaly" in flags and "rewritten" not in flags and DEDUP not in flags
    else:
        assert DEDUP in flags


def test_the_reader_says_whether_the_server_deduplicates(
    victoria: VictoriaMetrics, victoria_dedup: VictoriaMetrics, influxdb1: InfluxDB1
) -> None:
    """From the server's own `/flags`, read once per reader. A server that does not show them
    (here an InfluxDB 1.6 named as a v2 server: 404) is taken as deduplicating: never silent."""
    for url, want in ((victoria.url, ""), (victoria_dedup.url, "1ms")):
        history = open_history(Influx.model_validate({"url": url, "org": "o", "bucket": "b"}))
        assert history.deduplication() == want
    hidden = open_history(Influx.model_validate({"url": influxdb1.url, "org": "o", "bucket": "b"}))
    assert hidden.deduplication().startswith("unknown (") and "HTTP 404" in hidden.deduplication()
    assert [_dedup_flag(f'-dedup.minScrapeInterval="{v}"') for v in ("0s", "0", "1ms", "30s")] == [
        "", "", "1ms", "30s",
    ]  # fmt: skip
    assert _dedup_flag('-retentionPeriod="100y"') == ""


def test_a_flags_answer_that_is_not_a_flags_page_reads_as_unknown() -> None:
    """A 200 that is not VictoriaMetrics' `-name="value"` lines (a proxy's login or landing
    page, another server's answer) says nothing about dedup: before, it read as off and no row
    was flagged. VictoriaMetrics lists only the flags it was started with, so an empty page, or
    one without `-dedup.minScrapeInterval`, is off (the 1.79 we run, measured: 3 lines)."""
    html = "<!doctype html>\n<html><body>Sign in</body></html>\n"
    assert _dedup_flag(html).startswith("unknown (")
    assert _dedup_flag('{"dedup.minScrapeInterval": "0s"}').startswith("unknown (")
    assert _dedup_flag("") == ""
    assert _dedup_flag('-httpListenAddr="127.0.0.1:8428"\n-loggerLevel="ERROR"\n') == ""
    shown = ("1m0s", "1.5s", "0s")  # as the 1.79 we run shows -dedup.minScrapeInterval=1m, 1.5s, 0.0s
    assert [_dedup_flag(f'-dedup.minScrapeInterval="{v}"') for v in shown] == ["1m0s", "1.5s", ""]


def test_the_flags_are_asked_with_the_exports_credentials(tmp_path: Path) -> None:
    """A VictoriaMetrics behind its own basic auth (`-httpAuth.*`): the export needs the
    credentials; /flags goes through the same `Http` (headers, TLS, path prefix). The 1.79 we
    run does not ask credentials for /flags, so this shows the export and /flags both read,
    not that /flags sent them: that follows from the one `Http` (one `headers` dict)."""
    vm = AuthVictoriaMetrics(tmp_path / "vm")
    vm.start()
    try:
        (tmp_path / "pw").write_text("s3cret-pw")
        (tmp_path / "bad").write_text("wrong")
        cfg = {"url": vm.url, "org": "o", "bucket": "b", "username": "clerk"}
        history = open_history(Influx.model_validate({**cfg, "password": {"file": str(tmp_path / "pw")}}))
        assert history.deduplication() == ""
        assert history.has_records_from("nobody", 0) is False  # the export answered (not 401)
        bad = open_history(Influx.model_validate({**cfg, "password": {"file": str(tmp_path / "bad")}}))
        with pytest.raises(SourceError, match="HTTP 401"):
            bad.has_records_from("nobody", 0)
    finally:
        vm.stop()


def test_flags_it_cannot_read_flag_every_row_and_warn_once_without_the_password(tmp_path: Path) -> None:
    """A VictoriaMetrics started with `-flagsAuthKey` answers /flags 401 (the 1.79 we run,
    measured) while the export, with basic auth, reads: whether it deduplicates is unknown, so
    every row of both stations is flagged and the export warns once for the server, saying it
    cannot tell (not that the server runs with dedup) and why, never the password."""
    vm = AuthVictoriaMetrics(tmp_path / "vm")
    vm.flags_key = "fk"
    vm.start()
    try:
        (tmp_path / "pw").write_text("s3cret-pw")
        section = {
            "url": vm.url, "org": "o", "bucket": "b", "username": "clerk",
            "password": {"file": str(tmp_path / "pw")},
        }  # fmt: skip
        influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "unused"}  # never drained
        a = build_station(tmp_path / "ps-1", case_raw(), influx, section, drain=())
        b = build_station(tmp_path / "ps-2", station_b(case_raw()), influx, section, drain=())
        rows, err = historian_export(a.to_victoria, b.to_victoria)
    finally:
        vm.stop()
    assert rows and all(DEDUP in r["flags"].split(";") for r in rows), rows
    said = [line for line in err.splitlines() if "-dedup.minScrapeInterval" in line]
    assert len(said) == 1, err
    assert "cannot tell whether" in said[0] and "HTTP 401" in said[0] and "flagsAuthKey" in said[0], said
    assert "s3cret-pw" not in err and base64.b64encode(b"clerk:s3cret-pw").decode() not in err


class PrefixedVictoriaMetrics(VictoriaMetrics):
    """A single VictoriaMetrics serving under `-http.pathPrefix=/select/0/prometheus`: the
    paths a cluster's vmselect answers the export on (no cluster binaries here; stands in for
    vmselect's export, not for its /flags)."""

    def command(self) -> list[str]:
        return [*super().command(), "-http.pathPrefix=/select/0/prometheus"]

    def ready(self) -> bool:
        try:
            return http("GET", f"{self.url}/select/0/prometheus/health")[0] == 200
        except OSError:
            return False


def test_a_cluster_select_url_flags_every_row_and_says_why(tmp_path: Path) -> None:
    """A VictoriaMetrics cluster is read at vmselect's `/select/<account>/prometheus`. Its
    deduplication is the vmstorage nodes' `-dedup.minScrapeInterval` (they merge) as well as
    vmselect's, and vmstorage's flags are not reachable through vmselect: unknown, every row
    flagged, and the warning says it is a cluster, not that /flags answered 404 (before: "HTTP
    404" and a hint about -flagsAuthKey that does not apply)."""
    vm = PrefixedVictoriaMetrics(tmp_path / "vm")
    vm.start()
    try:
        section = {"url": f"{vm.url}/select/0/prometheus", "org": "o", "bucket": "b"}
        influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "unused"}  # never drained
        a = build_station(tmp_path / "ps-1", case_raw(), influx, section, drain=())
        rows, err = historian_export(a.to_victoria)
    finally:
        vm.stop()
    assert rows and all(DEDUP in r["flags"].split(";") for r in rows), rows
    said = [line for line in err.splitlines() if "-dedup.minScrapeInterval" in line]
    assert len(said) == 1, err
    assert "cannot tell whether" in said[0] and "cluster" in said[0] and "vmstorage" in said[0], said
    assert "flagsAuthKey" not in said[0] and "404" not in said[0], said


class HourDedupVictoriaMetrics(VictoriaMetrics):
    """`-dedup.minScrapeInterval=1h`, as a utility that also stores hourly scrapes might run it:
    one sample per series and hour, the hours counted from the epoch ((k-1) h, k h]."""

    def command(self) -> list[str]:
        return [*super().command(), "-dedup.minScrapeInterval=1h"]


@pytest.fixture(scope="module")
def victoria_hourly(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    server = HourDedupVictoriaMetrics(tmp_path_factory.mktemp("victoria-hourly"))
    server.start()
    yield server
    server.stop()


def meter_config(root: Path, station: str, zone: str, meters: list[str], url: str) -> Config:
    """A station billing `meters` (ft3, 6 digits) each to an account of its own."""
    raw = {
        "station": {"id": station, "name": station, "timezone": zone},
        "state_dir": str(root / "state"),
        "sensors": [
            {
                "id": m,
                "kind": "meter",
                "unit": "ft3",
                "register_digits": 6,
                "account": m.partition(".")[0],
                "max_rate": 100000,
            }
            for m in meters
        ],
        "billing": {
            "rate_per_kcf": 4.25,
            "max_reading_gap": "2d",
            "accounts": [{"id": m.partition(".")[0], "name": m, "class": "commercial"} for m in meters],
        },
        "influx": {"url": url, "org": "o", "bucket": "hourly"},
    }
    return write_yaml(root / f"{station}.yaml", raw)


def ledger_points(station: str, meter: str, times: list[datetime]) -> tuple[list[str], list[MeterRecord]]:
    """The points a ledger writes for `meter` read at `times`: each 10 ft3 up on the one before,
    the first a baseline (consumption 0). Returns the lines and the records."""
    records = [
        MeterRecord(meter, meter.partition(".")[0], "ft3", t.timestamp(), 1000.0 + 10 * i, c, c, True, "")
        for i, t in enumerate(sorted(times))
        for c in [0.0 if i == 0 else 10.0]
    ]
    return [meter_point_line(station, r) for r in records], records


def ledger_ft3(records: list[MeterRecord], q: Quarter) -> Decimal:
    """What the ledger bills: the consumption of its accepted records in the quarter."""
    return sum(
        (Decimal(str(r.consumption)) for r in records if q.start_ms < r.time * 1000 <= q.end_ms), Decimal(0)
    )


def test_an_hourly_deduplicating_server_flags_only_the_rows_it_can_have_changed(
    tmp_path: Path, victoria_hourly: VictoriaMetrics
) -> None:
    """With `-dedup.minScrapeInterval=1h` the server keeps the last point of each hour of each
    series. A meter read daily at 08:00 loses nothing: its rows are the ledger's, unflagged
    (before: every row flagged, so the flag said nothing). A meter read four times in one hour
    keeps the last (08:00): its quarter is short by the hidden readings' rise, and says so. Where
    the quarter's end falls inside an hour (Kathmandu, +05:45: 18:15 UTC), a reading after
    the end hides the last one before it in that hour: flagged; a meter of the same station
    read at noon is not."""
    utc, ktm = tmp_path / "utc", tmp_path / "ktm"
    day = timedelta(days=1)
    dailies = [datetime(2026, 6, 29, 8, tzinfo=UTC) + i * day for i in range(96)]  # to 2 October
    busy = [*dailies, *(datetime(2026, 8, 10, 7, m, tzinfo=UTC) for m in (15, 30, 45))]
    noons = [d.replace(hour=12) for d in dailies]
    edge = [*noons, datetime(2026, 9, 30, 18, 10, tzinfo=UTC), datetime(2026, 9, 30, 18, 40, tzinfo=UTC)]
    lines: list[str] = []
    written: dict[str, list[MeterRecord]] = {}
    for station, meter, times in (
        ("ps-utc", "daily.meter", dailies),
        ("ps-utc", "busy.meter", busy),
        ("ps-ktm", "calm.meter", noons),
        ("ps-ktm", "edge.meter", edge),
    ):
        sent, written[meter] = ledger_points(station, meter, times)
        lines += sent
    victoria_hourly.write(lines, "o", "hourly")
    kept = victoria_hourly.export('{__name__="meter_reading",meter="busy.meter"}')[0]["timestamps"]
    assert len(kept) == len(dailies), "the server did not keep one point per hour"  # the fixture's premise
    kept = victoria_hourly.export('{__name__="meter_reading",meter="edge.meter"}')[0]["timestamps"]
    assert int(edge[-2].timestamp() * 1000) not in kept and int(edge[-1].timestamp() * 1000) in kept
    for root, station, zone, meters in (
        (utc, "ps-utc", "UTC", ["daily.meter", "busy.meter"]),
        (ktm, "ps-ktm", "Asia/Kathmandu", ["calm.meter", "edge.meter"]),
    ):
        config = meter_config(root, station, zone, meters, victoria_hourly.url)
        assert config.influx is not None and config.billing is not None
        q = quarter("2026Q3", config.billing.year_start_month, config.station.zone)
        got = station_quarter(config, open_history(config.influx), q)
        for meter in meters:
            usage = got.usages[meter]
            exact = Fraction(ledger_ft3(written[meter], q)) == usage.ft3
            if meter in ("daily.meter", "calm.meter"):
                assert exact and DEDUP not in usage.flags, (meter, usage)
            else:  # the server lost readings of these rows, and the rows say so
                assert not exact and DEDUP in usage.flags, (meter, usage)
        assert [m for m, _ in got.doubted] == [m for m in meters if m in ("busy.meter", "edge.meter")]


def test_the_interval_is_read_as_the_server_counts_it_and_a_rollover_link_holds() -> None:
    """`/flags` shows a Go duration; the server counts whole milliseconds. Anything else
    (`unknown (...)`) is no interval: every row flagged. A register's wrap is a link that
    holds (the mill meter's rollover in the golden quarter is not flagged); a drop that is not
    the wrap (a replacement, or a reading hidden across the wrap) is not."""
    shown = ("1ms", "30s", "1m0s", "1.5s", "1h30m0s", "500us", "2h0m0.001s")
    assert [interval_ms(v) for v in shown] == [1, 30_000, 60_000, 1_500, 5_400_000, 1, 7_200_001]
    assert [interval_ms(v) for v in ("unknown (HTTP 401)", "", "1x", "s", "1m 0s")] == [None] * 5
    spec = MeterSpec("m", "ft3", 6, Decimal(1), None)  # wraps at 1,000,000 ft3
    at = StoredSample("m", "a", "ft3", 0, 999_990.0, 10.0, 10.0, 1.0)
    wrapped = StoredSample("m", "a", "ft3", 1, 5.0, 15.0, 15.0, 1.0)
    swapped = StoredSample("m", "a", "ft3", 1, 5.0, 5.0, 5.0, 1.0)
    assert not broken_link(spec, at, wrapped) and broken_link(spec, at, swapped)
    assert broken_link(spec, None, at) and not broken_link(spec, None, replace(at, consumption=0.0))


def test_what_the_kept_points_show_of_a_hidden_or_rewritten_one() -> None:
    """`doubt` on kept points as the reader returns them: a chain that holds clears the row;
    each trace a hidden reading or a point written twice leaves flags it (a rejected reading,
    one between the opening reading and the quarter's start included; a reading not following
    from the one before, the first after the quarter included; a clock step's mark; a first
    reading that bills without one before it)."""
    spec = MeterSpec("m", "ft3", 6, Decimal(1), None)

    def point(t: int, reading: float, consumption: float, accepted: bool = True, **kw: bool) -> StoredSample:
        return StoredSample("m", "a", "ft3", t, reading, consumption, consumption, float(accepted), **kw)

    before, after = point(0, 100.0, 0.0), point(9, 150.0, 10.0)
    span = [point(3, 120.0, 20.0), point(6, 140.0, 20.0)]
    assert doubt(spec, before, span, after) == ""
    assert doubt(spec, None, [point(3, 120.0, 0.0), *span[1:]], after) == ""  # a first reading: 0 billed
    assert "rejected" in doubt(spec, before, [point(1, 90.0, 0.0, accepted=False), *span], after)
    assert "does not follow" in doubt(spec, before, [span[1]], after)  # the one at 3 hidden
    assert "does not follow" in doubt(spec, before, span, point(9, 150.0, 5.0))  # one after 6 hidden
    assert "clock step" in doubt(spec, before, [span[0], point(6, 140.0, 20.0, restamped=True)], after)
    assert "does not follow" in doubt(spec, None, span, after)  # billed 20 over a reading not there
    assert "correction" in doubt(spec, before, [span[0], point(6, 140.0, 20.0, corrected=True)], after)
    assert "correction" in doubt(spec, replace(before, corrected=True), span, after)


def test_a_vmauth_in_front_of_a_deduplicating_server_flags_every_row(
    tmp_path: Path, victoria_dedup: VictoriaMetrics
) -> None:
    """The clerk reads through a vmauth in front of a VictoriaMetrics run with
    `-dedup.minScrapeInterval=1ms`. vmauth answers `/flags` with its own flags (`-auth.config=...`,
    no dedup: measured with the real vmauth), so the reader took the server for one without
    dedup: no row flagged `deduplicated`, the swap's re-judged points read as a mix of both
    writes that shows as `unreconciled` only when the mix happens not to chain (the 1.79 keeps
    either value), else a false exact. Its `/metrics`
    shows no storage of its own (`vm_deduplicated_samples_total{type="merge"}`, a storage
    node's counter), so whose flags these are is unknown: every row flagged, said once."""
    vm = {"url": victoria_dedup.url, "org": "barton", "bucket": "vmauth-quarter"}
    influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "unused"}  # never drained
    raw = case_raw()
    raw["station"] = {"id": "ps-vmauth", "name": "behind vmauth"}
    before = victoria_dedup.lines_taken()
    a = build_station(tmp_path / "ps", raw, influx, vm, drain=("victoria",))
    victoria_dedup.wait_for_lines(before + a.lines_to_victoria)
    victoria_dedup.flush()
    proxy = VMAuth(tmp_path / "vmauth", victoria_dedup.url)
    proxy.start()
    try:  # the clerk's config: the same station, read through vmauth with its credentials
        (tmp_path / "pw").write_text("s3cret-pw")
        clerk = yaml.safe_load(a.to_victoria.read_text(encoding="utf-8"))
        clerk["influx"] = {
            **vm,
            "url": proxy.url,
            "username": "clerk",
            "password": {"file": str(tmp_path / "pw")},
        }
        write_yaml(tmp_path / "clerk.yaml", clerk)
        rows, err = historian_export(tmp_path / "clerk.yaml")
    finally:
        proxy.stop()
    got = {r["meter"]: (r["consumption_ft3"], r["flags"]) for r in rows}
    assert rows and all(DEDUP in r["flags"].split(";") for r in rows), got
    said = [line for line in err.splitlines() if "-dedup.minScrapeInterval" in line]
    assert len(said) == 1, err
    assert "cannot tell whether" in said[0] and "vmauth" in said[0], said
    assert "s3cret-pw" not in err


def test_a_server_whose_metrics_cannot_be_read_flags_every_row_and_says_which_key(tmp_path: Path) -> None:
    """A VictoriaMetrics started with `-metricsAuthKey` answers `/metrics` 401 (the 1.79 we run,
    measured) while `/flags` reads: whether `/flags` came from the storage cannot be told, so
    every row is flagged and the warning names that key, not `-flagsAuthKey`."""
    vm = MetricsKeyVictoriaMetrics(tmp_path / "vm")
    vm.start()
    try:
        section = {"url": vm.url, "org": "o", "bucket": "b"}
        influx = {"url": "http://127.0.0.1:9", "api": "v1", "database": "unused"}  # never drained
        a = build_station(tmp_path / "ps-1", case_raw(), influx, section, drain=())
        rows, err = historian_export(a.to_victoria)
    finally:
        vm.stop()
    assert rows and all(DEDUP in r["flags"].split(";") for r in rows), rows
    said = [line for line in err.splitlines() if "-dedup.minScrapeInterval" in line]
    assert len(said) == 1, err
    assert "cannot tell whether" in said[0] and "-metricsAuthKey" in said[0], said
    assert "flagsAuthKey" not in said[0], said


class MetricsKeyVictoriaMetrics(VictoriaMetrics):
    """VictoriaMetrics with `-metricsAuthKey`: /metrics answers 401 without the key."""

    def command(self) -> list[str]:
        return [*super().command(), "-metricsAuthKey=mk"]


def test_a_correction_read_back_as_the_ledger_before_it_is_flagged(
    tmp_path: Path, victoria_dedup: VictoriaMetrics
) -> None:
    """The quarter's last reading misread (10 ft3 high) and corrected while the server (a
    VictoriaMetrics run with `-dedup.minScrapeInterval=1ms`) was down: the outbox holds the
    misread's points and the correction's (the reading and the next one's rise, in Q4), and
    delivers them together. The 1.79 keeps either write per field (measured: the earlier value
    of every field in 4 points of 30); where it kept the misread's, the chain holds and the Q3
    row was unflagged with the misread's last reading and volume (a false exact). The ledger now
    marks the points a correction sends again (`corrected`), and a row whose span holds one is
    flagged. Forty stations, one correction each."""
    day = timedelta(days=1)
    times = [datetime(2026, 6, 29, 12, tzinfo=UTC) + i * day for i in range(96)]  # to 2 October
    misread = times[93]  # 30 September, the quarter's last reading: the next one is Q4's
    wrong: list[str] = []
    unflagged = 0
    for n in range(40):
        station = f"ps-fix-{n}"
        config = meter_config(tmp_path / station, station, "UTC", ["fix.meter"], victoria_dedup.url)
        book = MeterBook.open(config)
        try:
            book.ingest(Sample("fix.meter", t.timestamp(), 1000.0 + 10 * i + (10 if t == misread else 0))
                        for i, t in enumerate(times))  # fmt: skip
            first = [meter_point_line(station, r) for r in book.take_records()]
            book.sent()  # in the outbox: InfluxDB is down
            book.correct("fix.meter", misread.timestamp(), 1000 + 10 * 93, "clerk", "misread")
            again = [meter_point_line(station, r) for r in book.take_records()]
            book.sent()
            victoria_dedup.write(first + again, "o", "hourly")  # back: the outbox delivers both
            victoria_dedup.flush()
            assert config.billing is not None and config.influx is not None
            q = quarter("2026Q3", config.billing.year_start_month, config.station.zone)
            (own,) = [r for r in export_rows(config, book.ledger, q) if r["meter"] == "fix.meter"]
        finally:
            book.close()
        usage = station_quarter(config, open_history(config.influx), q).usages["fix.meter"]
        assert usage.first is not None and "no readings" not in usage.flags, usage  # the server has them
        ledger = (
            Decimal(own["first_read"]),
            Decimal(own["last_read"]),
            Fraction(Decimal(own["consumption_ft3"])),
        )
        if DEDUP not in usage.flags and (usage.first, usage.last, usage.ft3) != ledger:
            wrong.append(f"{station}: {usage.ft3} ft3 from {usage.first}, the ledger {ledger}")
        unflagged += DEDUP not in usage.flags
    assert wrong == [], wrong  # an unflagged row is the ledger's, to the cubic foot
    assert unflagged == 0  # each span holds the correction's points
