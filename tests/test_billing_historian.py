"""`monitor billing export --from-influx`: the utility's quarter from the central historian.

Two stations, each with its own config (accounts, rate, minimum, timezone), build their
ledgers from the golden case's readings and send the meter records through their
outboxes to one real InfluxDB 1.6 and one real VictoriaMetrics. The export read back
from either server equals, row for row and to the cent, each station's own export from
its ledger, apart from what the historian cannot know, which its flags say.
"""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import openpyxl
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from monitor.config import Config, Influx, load_config
from monitor.meters.billing import export_rows, quarter
from monitor.meters.book import MeterBook, MeterRecord
from monitor.meters.historian import exact, sample_usage
from monitor.meters.totalizer import MeterSpec
from monitor.model import Sample, parse_time
from monitor.sinks.lineproto import meter_point_line
from monitor.sinks.pipeline import open_sink
from monitor.sources.meter_history import MeterSample as StoredSample
from monitor.sources.meter_history import open_history
from tests.cli import run_monitor
from tests.services import InfluxDB1, VictoriaMetrics, http

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "billing" / "quarter"


def write_yaml(path: Path, raw: dict[str, Any]) -> Config:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return load_config(path)


def case_raw() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((CASE / "config.yaml").read_text(encoding="utf-8"))
    return raw


def station_b(raw: dict[str, Any]) -> dict[str, Any]:
    """Another station: its own id, rate, minimum, timezone (quarters cut at London's
    midnight), and its own accounts (the home meter bills `jones`, no bakery meter)."""
    raw["station"] = {"id": "ps-2", "name": "Barton PS 2", "timezone": "Europe/London"}
    raw["sensors"] = [s for s in raw["sensors"] if s["id"] != "bakery.meter"]
    for s in raw["sensors"]:
        if s["id"] == "home.meter":
            s["account"] = "jones"
    billing = raw["billing"]
    billing["rate_per_kcf"] = "3.17"
    billing["minimum_charge"] = "40.00"
    billing["accounts"] = [a for a in billing["accounts"] if a["id"] not in ("bakery", "smith")]
    billing["accounts"].append({"id": "jones", "name": "R. Jones", "class": "residential"})
    return raw


@dataclass
class Station:
    """A station's ledger config and its two outbox configs (one per server)."""

    config: Config
    to_influx: Path
    to_victoria: Path
    lines_to_victoria: int = 0  # delivered, for VictoriaMetrics.wait_for_lines


def samples() -> list[Sample]:
    with (CASE / "readings.csv").open(encoding="utf-8") as fh:
        return [Sample(r["sensor"], parse_time(r["time"]), float(r["value"])) for r in csv.DictReader(fh)]


def build_station(
    root: Path,
    raw: dict[str, Any],
    influx: dict[str, Any],
    victoria: dict[str, Any],
    until: float | None = None,
    drain: tuple[str, ...] = ("influx", "victoria"),
    repeat: bool = False,
) -> Station:
    """The ledger from the case's readings and replacement, forwarded to both servers as
    the daemon does (each poll-sized batch, then the re-judged rows after the swap is
    recorded). With `until`, only records up to then leave (an outbox not yet drained).
    `drain`: the servers the outboxes are drained to (the others are left to hold them);
    `repeat`: every batch is delivered twice (a re-send after a crash: at least once)."""
    config = write_yaml(root / "station.yaml", {**raw, "state_dir": str(root / "state")})
    paths = []
    for name, section in (("influx", influx), ("victoria", victoria)):
        path = root / f"{name}.yaml"
        write_yaml(path, {**raw, "state_dir": str(root / f"outbox-{name}"), "influx": section})
        paths.append(path)
    sinks = [open_sink(load_config(p)) for p in paths]
    book = MeterBook.open(config)

    def forward() -> None:
        records = [r for r in book.take_records() if until is None or r.time <= until]
        for sink in sinks:
            for _ in range(2 if repeat else 1):
                sink.write_meter_records(records)
        book.sent()  # those after `until` are not sent, as if lost in an outbox not drained

    readings = samples()
    for i in range(0, len(readings), 1000):
        book.ingest(readings[i : i + 1000])
        forward()
    with (CASE / "replacements.csv").open(encoding="utf-8") as fh:
        for rep in csv.DictReader(fh):
            book.record_replacement(
                rep["meter"], parse_time(rep["time"]), rep["old_final"], rep["new_initial"]
            )
    forward()
    for name, sink in zip(("influx", "victoria"), sinks, strict=True):
        if name in drain:
            assert asyncio.run(sink.drain(60)) == 0
        sink.close()
    book.close()
    assert sinks[1].drainer is not None
    return Station(config, paths[0], paths[1], sinks[1].drainer.stats.written)


def own_export(station: Station, text: str = "2026Q3") -> list[dict[str, str]]:
    config = station.config
    assert config.billing is not None
    book = MeterBook.open(config, records=False)
    try:
        return export_rows(
            config, book.ledger, quarter(text, config.billing.year_start_month, config.station.zone)
        )
    finally:
        book.close()


def historian_export(*configs: Path, quarter_text: str = "2026Q3") -> tuple[list[dict[str, str]], str]:
    args = [a for c in configs for a in ("--config", str(c))]
    done = run_monitor(
        "billing", "export", "--from-influx", *args, "--quarter", quarter_text, "--out", "-", cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return list(csv.DictReader(io.StringIO(done.stdout))), done.stderr


def by_station(rows: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        out.setdefault(row["station"], []).append({k: v for k, v in row.items() if k != "station"})
    return out


@pytest.fixture(scope="module")
def stations(
    tmp_path_factory: pytest.TempPathFactory, influxdb1: InfluxDB1, victoria: VictoriaMetrics
) -> Iterator[tuple[Station, Station]]:
    influxdb1.query("CREATE DATABASE utility")
    influx = {"url": influxdb1.url, "api": "v1", "database": "utility"}
    vm = {"url": victoria.url, "org": "barton", "bucket": "utility"}
    root = tmp_path_factory.mktemp("utility")
    before = victoria.lines_taken()
    a = build_station(root / "ps-1", case_raw(), influx, vm)
    b = build_station(root / "ps-2", station_b(case_raw()), influx, vm)
    victoria.settle(before + a.lines_to_victoria + b.lines_to_victoria)
    yield a, b


def test_the_influxdb_export_equals_the_stations_own_exports(stations: tuple[Station, Station]) -> None:
    a, b = stations
    rows, _ = historian_export(a.to_influx, b.to_influx)
    assert [r["station"] for r in rows] == ["ps-1"] * 5 + ["ps-2"] * 4
    got = by_station(rows)
    assert got["ps-1"] == own_export(a)
    assert got["ps-2"] == own_export(b)
    # The golden figures, so "equal" is not "equally empty", and the two stations differ.
    expected = list(csv.DictReader((CASE / "expected.csv").read_text(encoding="utf-8").splitlines()))
    assert got["ps-1"] == expected
    # By hand: kcf x $3.17 (1,104 / 44.16 / 12,397 kcf), and jones's $40 minimum.
    assert {r["account"]: r["charge"] for r in got["ps-2"]} == {
        "acme-mill": "3499.68", "corner-shop": "139.99", "jones": "40.00", "village": "39298.49",
    }  # fmt: skip
    assert got["ps-2"][0]["period_start_utc"] == "2026-06-30T23:00:00Z"  # London's midnight


def test_the_historian_export_as_xlsx_with_bill_dates(
    stations: tuple[Station, Station], tmp_path: Path
) -> None:
    a, b = stations
    out = tmp_path / "utility.xlsx"
    args = ["--config", str(a.to_influx), "--config", str(b.to_influx), "--presented", "2026-10-05"]
    done = run_monitor(
        "billing", "export", "--from-influx", *args, "--quarter", "2026Q3", "--format", "xlsx",
        "--out", str(out), cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "9 row(s) from the historian" in done.stderr
    sheet = openpyxl.load_workbook(out).active
    assert sheet is not None and sheet.title == "2026Q3"
    header = [c.value for c in sheet[1]]
    assert header[:3] == ["station", "account", "meter"] and "penalty_from_60" in header
    stations_col = [row[0].value for row in sheet.iter_rows(min_row=2)]
    assert stations_col[:9] == ["ps-1"] * 5 + ["ps-2"] * 4


def test_victoriametrics_keeps_both_values_of_a_rejudged_row_and_the_export_says_so(
    stations: tuple[Station, Station],
) -> None:
    a, b = stations
    rows, _ = historian_export(a.to_victoria, b.to_victoria)
    got = by_station(rows)
    for station in (a, b):
        own = own_export(station)
        mine = got[station.config.station.id]
        assert len(mine) == len(own)
        for h, o in zip(mine, own, strict=True):
            # The shop meter's readings after the swap went out rejected, then accepted once
            # the replacement was recorded; VictoriaMetrics holds both: flagged, not guessed.
            extra = ";rewritten" if o["meter"] == "shop.meter" else ""
            assert h == {**o, "flags": o["flags"] + extra}


def test_a_station_whose_outbox_has_not_drained_is_flagged_incomplete(
    tmp_path: Path, influxdb1: InfluxDB1, victoria: VictoriaMetrics
) -> None:
    influxdb1.query("CREATE DATABASE partial")
    influx = {"url": influxdb1.url, "api": "v1", "database": "partial"}
    vm = {"url": victoria.url, "org": "barton", "bucket": "partial"}
    raw = case_raw()
    raw["station"] = {"id": "ps-late", "name": "late"}
    before = victoria.lines_taken()
    late = build_station(tmp_path, raw, influx, vm, until=parse_time("2026-09-20T00:00:00Z"))
    victoria.wait_for_lines(before + late.lines_to_victoria)
    victoria.flush()
    own = own_export(late)
    for path in (late.to_influx, late.to_victoria):
        rows, err = historian_export(path)
        assert "station ps-late" in err and "flagged incomplete" in err
        for h, o in zip(by_station(rows)["ps-late"], own, strict=True):
            assert "incomplete" in h["flags"].split(";")
            assert Decimal(h["consumption_ft3"]) < Decimal(o["consumption_ft3"])  # short, and says so


def test_a_correction_reaches_influxdb_but_not_its_flag(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    """InfluxDB overwrites the corrected point, so the figures follow the ledger; that
    it was corrected lives only in the ledger's amendments (docs/fleet.md says so)."""
    influxdb1.query("CREATE DATABASE corrected")
    config = write_yaml(
        tmp_path / "c.yaml",
        {
            **case_raw(),
            "state_dir": str(tmp_path / "state"),
            "influx": {"url": influxdb1.url, "api": "v1", "database": "corrected"},
        },
    )
    book = MeterBook.open(config)
    sink = open_sink(config)
    book.ingest(samples())
    book.send(sink.write_meter_records, limit=None)
    book.correct("home.meter", parse_time("2026-08-01T00:00:00Z"), "130000", "clerk", "misread")
    book.send(sink.write_meter_records, limit=None)
    assert asyncio.run(sink.drain(60)) == 0
    sink.close()
    book.close()
    own = own_export(Station(config, tmp_path, tmp_path))
    rows, _ = historian_export(tmp_path / "c.yaml")
    for h, o in zip(by_station(rows)["ps-1"], own, strict=True):
        flags = o["flags"].split(";")
        if o["meter"] == "home.meter":
            assert "corrected" in flags and "corrected" not in h["flags"]
        assert h == {**o, "flags": ";".join(f for f in flags if f != "corrected")}


@pytest.mark.parametrize("server", ["victoria", "victoria_dedup"])
def test_voids_and_corrections_reach_the_historian_as_figures_and_flags(
    tmp_path: Path, influxdb1: InfluxDB1, server: str, request: pytest.FixtureRequest
) -> None:
    """The new-york golden case (a replacement, its void and re-record at the same time,
    a corrected misread), forwarded after every step as the daemon does. InfluxDB ends
    with the ledger's figures, without the amendment flags; VictoriaMetrics holds both
    values of every rewritten point, and those rows say `rewritten`. Started with
    `-dedup.minScrapeInterval=1ms` it holds one value per field, from either write, and
    nothing says which points were written twice: the amended meters' rows say `deduplicated`
    (a rejected reading, or one not following from the one before, is kept of either write),
    the others are the ledger's, unflagged (before: every row flagged; before that, the voided
    swap's meter was read with neither `rewritten` nor any other word of it)."""
    victoria: VictoriaMetrics = request.getfixturevalue(server)
    ny = ROOT / "tests" / "cases" / "billing" / "new-york"
    raw: dict[str, Any] = yaml.safe_load((ny / "config.yaml").read_text(encoding="utf-8"))
    raw["station"]["id"] = "ps-ny"
    influxdb1.query(f"CREATE DATABASE amended_{server}")
    sections = {
        "influx": {"url": influxdb1.url, "api": "v1", "database": f"amended_{server}"},
        "vm": {"url": victoria.url, "org": "o", "bucket": "amended"},
    }
    config = write_yaml(tmp_path / "station.yaml", {**raw, "state_dir": str(tmp_path / "state")})
    for name, section in sections.items():
        write_yaml(tmp_path / f"{name}.yaml", {**raw, "state_dir": str(tmp_path / name), "influx": section})
    before = victoria.lines_taken()
    sinks = [open_sink(load_config(tmp_path / f"{name}.yaml")) for name in sections]
    book = MeterBook.open(config)

    def forward() -> None:
        records = book.take_records()
        for sink in sinks:
            sink.write_meter_records(records)
        book.sent()

    with (ny / "readings.csv").open(encoding="utf-8") as fh:
        readings = [Sample(r["sensor"], parse_time(r["time"]), float(r["value"])) for r in csv.DictReader(fh)]
    for i in range(0, len(readings), 1000):
        book.ingest(readings[i : i + 1000])
        forward()
    with (ny / "amendments.csv").open(encoding="utf-8") as fh:
        for a in csv.DictReader(fh):
            t = parse_time(a["time"])
            if a["action"] == "replace":
                book.record_replacement(a["meter"], t, a["old_final"], a["new_initial"], "clerk", a["why"])
            elif a["action"] == "void-replacement":
                book.void_replacement(a["meter"], t, "clerk", a["why"])
            else:
                book.correct(a["meter"], t, a["reading"], "clerk", a["why"])
            forward()
    for sink in sinks:
        assert asyncio.run(sink.drain(60)) == 0
        sink.close()
    book.close()
    assert sinks[1].drainer is not None
    victoria.settle(before + sinks[1].drainer.stats.written)
    own = own_export(Station(config, tmp_path, tmp_path), "2025Q4")
    amended = {"shop.meter": {"voided replacement"}, "apartments.meter": {"corrected"}}
    assert {o["meter"]: set(o["flags"].split(";")) & {"voided replacement", "corrected"} for o in own} == {
        "plant.meter": set(), "school.meter": set(), **amended,
    }  # fmt: skip

    rows, _ = historian_export(tmp_path / "influx.yaml", quarter_text="2025Q4")
    for h, o in zip(by_station(rows)["ps-ny"], own, strict=True):
        flags = [f for f in o["flags"].split(";") if f and f not in amended.get(o["meter"], set())]
        assert h == {**o, "flags": ";".join(flags)}, o["meter"]

    rows, _ = historian_export(tmp_path / "vm.yaml", quarter_text="2025Q4")
    for h, o in zip(by_station(rows)["ps-ny"], own, strict=True):
        if o["meter"] in amended:  # written twice: both values held, or one per field from either
            want = "deduplicated" if server == "victoria_dedup" else "rewritten"
            assert want in h["flags"].split(";"), o["meter"]
        else:  # written once: the ledger's row, unflagged, whether the server deduplicates or not
            assert h == o, o["meter"]


@given(
    st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
        lambda d: len(d.normalize().as_tuple().digits) <= 15 and abs(d.adjusted()) < 300
    )
)
def test_repr_of_a_float_gives_back_a_decimal_of_up_to_15_digits(d: Decimal) -> None:
    assert exact(float(d), "x") == d


def test_stored_values_come_back_as_the_decimals_they_were_written_from(
    influxdb1: InfluxDB1, victoria: VictoriaMetrics
) -> None:
    """Through the real servers, not only through `float`. InfluxDB keeps the double, so
    15 digits come back. VictoriaMetrics stores a block of a series as decimals at one
    scale with a bounded mantissa: 12 significant digits at the series' scale come back
    exact, 15 need not (999999999.999999 can read back as 1e9, and a tiny fraction
    beside a 15-digit integer as 0, depending on how the blocks fell). The ledger's
    series have one scale (the multiplier's places); `unreconciled` catches the rest."""
    series = {
        "d15.meter": ["123456789.123456", "999999999.999999", "500000000.000001"],
        "d12.meter": ["123456789.123", "999999999.999", "0.001", "1.1", "500084000"],
        "mixed.meter": ["999999999999999", "0.000123456789012345"],
    }
    lines = []
    for meter, values in series.items():
        for i, v in enumerate(values):
            x = float(v)
            rec = MeterRecord(meter, "", "ft3", 1_700_000_000.0 + i, x, x, x, True, "")
            lines.append(meter_point_line("ps-digits", rec))
    body = "\n".join(lines).encode()
    influxdb1.query("CREATE DATABASE digits")
    assert http("POST", f"{influxdb1.url}/write?db=digits&precision=ns", body)[0] == 204
    victoria.write(lines, "o", "b")
    victoria.flush()
    servers = {
        "influxdb": {"url": influxdb1.url, "api": "v1", "database": "digits"},
        "victoria": {"url": victoria.url, "org": "o", "bucket": "b"},
    }
    for name, section in servers.items():
        got = open_history(Influx.model_validate(section)).records("ps-digits", 0, 2_000_000_000_000)
        back = {m: [exact(s.consumption, "c") for s in got if s.meter == m] for m in series}
        assert back["d12.meter"] == [Decimal(v) for v in series["d12.meter"]]
        if name == "influxdb":
            assert back == {m: [Decimal(v) for v in vs] for m, vs in series.items()}
        else:  # 15 digits are kept to about 12 (999999999.999999 can read back as 1E+9)
            for held, v in zip(back["d15.meter"], series["d15.meter"], strict=True):
                assert abs(held - Decimal(v)) <= Decimal(v) * Decimal("1e-11"), (held, v)


def test_victoriametrics_reads_a_restamped_point_as_its_overwrite_and_guesses_no_more(
    victoria: VictoriaMetrics,
) -> None:
    """A real VictoriaMetrics keeps every value written at a time. A point a clock step moved
    its reading away from was written accepted (10 ft3 billed), then overwritten rejected with
    0 billed and `restamped` 1 (`MeterBook.take_records`): read back, it is the overwrite, not
    `rewritten` (before: the accepted values, the largest, billing the reading twice). When a
    reading of the new clock later lands at that very time (written with `restamped` -1, the
    step's id negated, as `MeterBook.stepped` marks it), which value is the last is not known: the largest,
    `rewritten`, as for any re-written point; also when it holds the same register (an idle
    meter: before, read as the overwrite, a real reading rejected and nothing flagged)."""
    t0, t1, t2 = 1_700_000_000.0, 1_700_000_060.0, 1_700_000_120.0
    lines = [
        meter_point_line("ps-moved", MeterRecord("m", "a", "ft3", t, 110.0, 10.0, 10.0, True, ""))
        for t in (t0, t1, t2)
    ]
    lines += [
        meter_point_line("ps-moved", MeterRecord("m", "a", "ft3", t, 110.0, 0.0, 0.0, False, "", 1))
        for t in (t0, t1, t2)
    ]
    assert lines[-1].split(" ")[1].endswith(",restamped=1i")
    landing = [(t1, 170.0, 60.0), (t2, 110.0, 0.0)]  # a reading of the new clock; an idle one
    lines += [
        meter_point_line("ps-moved", MeterRecord("m", "a", "ft3", t, r, c, c, True, "", -1))
        for t, r, c in landing
    ]
    assert lines[-1].split(" ")[1].endswith(",restamped=-1i")
    victoria.write(lines, "o", "moved")
    victoria.flush()
    history = open_history(Influx.model_validate({"url": victoria.url, "org": "o", "bucket": "moved"}))
    moved, landed, idle = history.records("ps-moved", 0, 2_000_000_000_000)
    assert (idle.reading, idle.consumption_ft3, idle.accepted, idle.rewritten) == (110.0, 10.0, 1.0, True)
    assert (moved.reading, moved.consumption_ft3, moved.accepted, moved.rewritten) == (110.0, 0.0, 0.0, False)
    assert (landed.reading, landed.consumption_ft3, landed.accepted, landed.rewritten) == (
        170.0,
        60.0,
        1.0,
        True,
    )
    assert history.last_accepted("ps-moved", "m", round(t0 * 1000) + 1) is None  # the moved one is not


def test_a_missing_record_or_lost_digits_leave_the_quarter_unreconciled() -> None:
    """Pure: one meter's stored records with one taken out, a wrap, a swap, a rejection."""
    spec = MeterSpec("m", "ft3", 6, Decimal(1), None, "a")
    q = quarter("2026Q3")

    def rec(i: int, reading: float, consumption: float, accepted: float = 1.0) -> StoredSample:
        t = q.start_ms + i * 43_200_000  # every 12 hours
        return StoredSample("m", "a", "ft3", t, reading, consumption, consumption, accepted)

    before = rec(0, 100.0, 0.0)
    whole = [rec(i, 100.0 + 10 * i, 10.0) for i in range(1, 185)]
    assert sample_usage("m", spec, before, whole, q, 86_400).flags == frozenset()
    gap = whole[:50] + whole[51:]
    assert sample_usage("m", spec, before, gap, q, 86_400).flags == {"unreconciled"}
    after = rec(185, 100.0 + 5 * 185 * 2, 10.0)  # the first reading past the quarter's end
    assert whole[-1].time_ms == q.end_ms and after.time_ms > q.end_ms
    assert sample_usage("m", spec, before, whole, q, 86_400, after).flags == frozenset()
    tail = whole[:-1]  # the quarter's last record never arrived; the next quarter's did
    assert sample_usage("m", spec, before, tail, q, 86_400, after).flags == {"unreconciled"}
    assert sample_usage("m", spec, before, tail, q, 86_400).flags == frozenset()  # why `after` is read
    lost = [*whole[:50], rec(51, 0.0, 0.0), *whole[51:]]  # a value that lost its digits
    assert "unreconciled" in sample_usage("m", spec, before, lost, q, 86_400).flags
    wrap = [rec(1, 999_990.0, 10.0), rec(2, 5.0, 15.0)]  # 6 digits: 999,990 -> 5 is 15 ft3
    assert sample_usage("m", spec, rec(0, 999_980.0, 0), wrap, q, 10**9).flags == {"rollover"}
    assert sample_usage("m", spec, before, [rec(1, 3.0, 7.0)], q, 10**9).flags == {"replacement"}
    rejected = [rec(1, 5.0, 0.0, accepted=0.0), rec(2, 120.0, 20.0)]
    assert sample_usage("m", spec, before, rejected, q, 10**9).flags == {"anomaly"}


def test_records_without_numbers_and_unknown_meters_are_said_not_billed(
    tmp_path: Path, influxdb1: InfluxDB1, victoria: VictoriaMetrics
) -> None:
    """Hand-written points a station never sent (another program, a clerk with curl): an
    accepted point with no reading or consumption, and a meter the config does not name."""
    day = 86_400
    t0 = parse_time("2026-07-01T00:00:00Z")
    good = [(t0 - day, 100.0, 0.0), *((t0 + i * day / 2, 100.0 + 5 * i, 5.0) for i in range(1, 186))]
    lines = [
        meter_point_line("ps-odd", MeterRecord("h.meter", "a", "ft3", t, r, c, c, True, ""))
        for t, r, c in good
    ]
    lines.append(
        f"meter,account=a,meter=h.meter,station=ps-odd,unit=ft3 accepted=1i {int((t0 + 3600) * 1e9)}"
    )
    lines.append(
        meter_point_line("ps-odd", MeterRecord("x.meter", "", "ft3", t0 + 60, 1.0, 1.0, 1.0, True, ""))
    )
    body = "\n".join(lines).encode()
    influxdb1.query("CREATE DATABASE odd")
    assert http("POST", f"{influxdb1.url}/write?db=odd&precision=ns", body)[0] == 204
    victoria.write(lines, "o", "odd")
    victoria.flush()
    raw = {
        "station": {"id": "ps-odd"},
        "state_dir": str(tmp_path / "s"),
        "sensors": [{"id": "h.meter", "kind": "meter", "unit": "ft3", "register_digits": 6, "account": "a"}],
        "billing": {
            "rate_per_kcf": "2.00",
            "max_reading_gap": "1d",
            "accounts": [{"id": "a", "class": "commercial"}],
        },
    }
    for name, section in (
        ("influx", {"url": influxdb1.url, "api": "v1", "database": "odd"}),
        ("vm", {"url": victoria.url, "org": "o", "bucket": "odd"}),
    ):
        write_yaml(tmp_path / f"{name}.yaml", {**raw, "influx": section})
        rows, err = historian_export(tmp_path / f"{name}.yaml")
        assert len(rows) == 1, name
        assert rows[0]["consumption_ft3"] == "920.000" and rows[0]["first_read"] == "100"  # 184 x 5
        assert rows[0]["flags"] == "unreconciled" and rows[0]["charge"] == "1.84"
        assert "1 accepted meter record(s)" in err and "meter h.meter at 2026-07-01T01:00:00Z" in err
        assert "not billed: x.meter" in err


def test_bad_invocations_give_one_line(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    no_influx = write_yaml(tmp_path / "a.yaml", {**case_raw(), "state_dir": str(tmp_path / "s")})
    assert no_influx.influx is None
    away = {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"}
    write_yaml(tmp_path / "b.yaml", {**case_raw(), "state_dir": str(tmp_path / "s"), "influx": away})
    for configs, message in (
        (["a.yaml"], "a.yaml has no influx section"),
        (["b.yaml", "b.yaml"], "station 'ps-1' is in both"),
        (["b.yaml"], "cannot read the history"),
    ):
        args = [a for c in configs for a in ("--config", str(tmp_path / c))]
        done = run_monitor(
            "billing", "export", "--from-influx", *args, "--quarter", "2026Q3", "--out", "-", cwd=ROOT
        )
        assert done.returncode == 1, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    two = [
        "billing",
        "export",
        "--config",
        str(tmp_path / "a.yaml"),
        "--config",
        str(tmp_path / "a.yaml"),
    ]
    done = run_monitor(*two, "--quarter", "2026Q3", "--out", "-", cwd=ROOT)
    assert done.returncode == 1 and "several stations need --from-influx" in done.stderr
