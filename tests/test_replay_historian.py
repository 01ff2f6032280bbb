"""`monitor replay --from-influx`: the golden case written to the real InfluxDB 1.6 and
VictoriaMetrics by `monitor replay`, read back in chunks, gives the same events."""

from __future__ import annotations

import json
import math
import re
import select
import socket
import subprocess
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from monitor.config import Config, load_config
from monitor.engine import Engine, replay_steps
from monitor.errors import SourceError
from monitor.model import ManualClock, parse_time
from monitor.sinks.lineproto import ns
from monitor.sources import historian
from monitor.sources.replay import ReadReport, Samples, merge, read_csv
from tests import cli
from tests.services import InfluxDB1, VictoriaMetrics, http

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "replay" / "station-day"
START, END = "2026-06-03T00:00:00Z", "2026-06-04T00:00:00Z"
T0 = 1780444800  # START in epoch seconds


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor replay *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor("replay", *args, cwd=ROOT)


def events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def station_config(tmp_path: Path, influx: dict[str, Any]) -> tuple[Path, Config]:
    raw: dict[str, Any] = yaml.safe_load((CASE / "config.yaml").read_text())
    raw["station"]["id"] = f"ps-{uuid.uuid4().hex[:8]}"  # the servers are shared by the session
    raw["state_dir"] = str(tmp_path / "state")
    raw["influx"] = influx
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def own_database(influxdb1: InfluxDB1) -> str:
    """A database of this test's own on the session's InfluxDB 1.x."""
    db = f"h{uuid.uuid4().hex[:8]}"
    influxdb1.query(f"CREATE DATABASE {db}")
    return db


def from_influx(config_path: Path, start: str = START, end: str = END) -> list[str]:
    """The arguments of `monitor replay` reading the config's historian over a range."""
    return ["--config", str(config_path), "--from-influx", "--start", start, "--end", end]


TEMP_TAGS = ",kind=temperature,unit=degF"


def temp_line(config: Config, t: float, value: float, tags: str = TEMP_TAGS) -> str:
    """A point of outfall.temp at `t` as the daemon stores it (quality GOOD), with `tags`
    after its station and sensor tags."""
    return f"sensor,station={config.station.id},sensor=outfall.temp{tags} value={value},quality=0i {ns(t)}"


def write_influxdb1(influxdb1: InfluxDB1, lines: list[str], **params: str) -> None:
    """`lines` written to InfluxDB 1.x (`params`: its database, retention policy)."""
    query = urllib.parse.urlencode({**params, "precision": "ns"})
    status, answer = http("POST", f"{influxdb1.url}/write?{query}", "\n".join(lines).encode())
    assert status == 204, answer


def read_back(
    config: Config, kind: str, start: float = T0, end: float = T0 + 86400
) -> tuple[Samples, ReadReport]:
    """What the historian `kind` gives of the config's station over a range, and what its
    reading counted."""
    history = historian.open_history(config, start, end, kind)
    return Samples.concat(list(merge([history]))), history.report


def stored(config: Config) -> Samples:
    """What `monitor replay` accepted from the golden input: what the historian holds."""
    engine = Engine(config.rules, ManualClock())
    samples, _ = read_csv(CASE / "input.csv", engine.sensors)
    parts = []
    for step in replay_steps(engine, samples.sensor, samples.time, samples.value, samples.quality):
        ok = step.accepted
        parts.append(
            Samples(step.sensor[ok].astype(np.int32), step.time[ok], step.value[ok], step.quality[ok])
        )
    return Samples.concat(parts)


def replay_into(config_path: Path, victoria: VictoriaMetrics | None = None) -> None:
    """`monitor replay` of the golden input, its outbox drained into the config's historian;
    with `victoria` (the historian), until the server has parsed every point delivered."""
    before = victoria.lines_taken() if victoria is not None else 0
    written = replay(
        "--config", str(config_path), "--input", str(CASE / "input.csv"), "--events", "/dev/null"
    )
    assert written.returncode == 0, written.stderr
    drained = re.search(r"outbox drained, (\d+) point\(s\) written", written.stdout)
    assert drained is not None, written.stdout
    if victoria is not None:
        victoria.wait_for_lines(before + int(drained[1]))
        victoria.flush()


def write_then_read_back(tmp_path: Path, config_path: Path, victoria: VictoriaMetrics | None = None) -> None:
    replay_into(config_path, victoria)
    out = tmp_path / "events.jsonl"
    back = replay(*from_influx(config_path), "--events", str(out))
    assert back.returncode == 0, back.stderr
    assert events(out) == events(CASE / "events.jsonl")
    assert "replay: 592 samples, 3 sensors, 8 events" in back.stdout
    assert "outbox" not in back.stdout  # nothing written back to the historian


def test_influxdb_1_history_replays_to_the_golden_events(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    db = own_database(influxdb1)
    config_path, _ = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
    write_then_read_back(tmp_path, config_path)
    whatif = ROOT / "tests" / "cases" / "whatif" / "station-day"
    args = from_influx(config_path)
    result = replay(*args, "--what-if", str(whatif / "candidate.yaml"), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rules"] == json.loads((whatif / "expected.json").read_text())


def test_victoriametrics_history_replays_to_the_golden_events(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    influx = {"url": victoria.url, "org": "barton", "bucket": "replay"}
    config_path, _ = station_config(tmp_path, influx)
    write_then_read_back(tmp_path, config_path, victoria)


@pytest.mark.parametrize("kind", ["influxql", "victoriametrics"])
def test_history_read_in_small_chunks_is_the_stored_samples(
    tmp_path: Path,
    influxdb1: InfluxDB1,
    victoria: VictoriaMetrics,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    config_path, config, _ = station_on(kind, tmp_path, influxdb1, victoria)
    replay_into(config_path, victoria if kind == "victoriametrics" else None)
    monkeypatch.setattr(historian, "CHUNK_POINTS", 37)
    monkeypatch.setattr(historian, "WINDOW_S", 1800.0)
    history = historian.open_history(config, 1780444800.0, 1780531200.0, kind)
    batches = list(merge([history]))
    assert len(batches) > 5
    got, want = Samples.concat(batches), stored(config)
    order_got = np.lexsort((got.sensor, got.time))
    order_want = np.lexsort((want.sensor, want.time))
    assert got.time[order_got].tolist() == want.time[order_want].tolist()
    assert got.sensor[order_got].tolist() == want.sensor[order_want].tolist()
    # InfluxDB holds a reading that is not GOOD without its value (issue 12), so NaN comes back.
    want_value = np.where(want.quality == 0, want.value, np.nan)
    np.testing.assert_array_equal(got.value[order_got], want_value[order_want])
    assert got.quality[order_got].tolist() == want.quality[order_want].tolist()


def test_from_influx_without_an_influx_section_or_range_says_so(tmp_path: Path) -> None:
    no_range = replay("--config", str(CASE / "config.yaml"), "--from-influx", "--events", "/dev/null")
    assert no_range.returncode == 2 and "--from-influx needs --start and a later --end" in no_range.stderr
    args = ["--config", str(CASE / "config.yaml"), "--from-influx", "--start", START, "--end", END]
    no_influx = replay(*args, "--events", "/dev/null")
    assert no_influx.returncode == 1
    assert "needs an `influx` section" in no_influx.stderr and "Traceback" not in no_influx.stderr


def test_an_unreachable_historian_exits_1_with_a_line(tmp_path: Path) -> None:
    config_path, _ = station_config(tmp_path, {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"})
    result = replay(*from_influx(config_path), "--events", "/dev/null")
    assert result.returncode == 1
    assert "cannot read the history" in result.stderr and "Traceback" not in result.stderr


class FluxAnswers:
    """InfluxDB 2's query API as far as FluxHistory uses it: POST /api/v2/query answered
    in annotated CSV (the dialect influxdb-client asks for) from the stored samples, for
    the `range()` each query names. No InfluxDB 2 runs on this machine, so this
    stand-in answers in its recorded wire format; InfluxQL and VictoriaMetrics above
    are the real servers."""

    HEAD = (
        "#datatype,string,long,dateTime:RFC3339,string,double,long\r\n"
        "#group,false,false,false,false,false,false\r\n"
        "#default,_result,,,,,\r\n"
        ",result,table,_time,sensor,value,quality\r\n"
    )

    def __init__(self, samples: Samples, names: list[str]) -> None:
        self.samples, self.names = samples, names
        self.queries: list[str] = []
        self.tokens: set[str] = set()
        self.accept: str | None = None  # the one Authorization InfluxDB 2 accepts, if set

    def answer(self, flux: str) -> str:
        self.queries.append(flux)
        found = re.search(r"range\(start: (\S+), stop: (\S+)\)", flux)
        assert found is not None, flux
        a, b = (parse_time(x) for x in found.groups())
        s = self.samples
        rows = []
        for i in np.flatnonzero((s.time >= a) & (s.time < b)).tolist():
            when = datetime.fromtimestamp(float(s.time[i]), UTC).isoformat().replace("+00:00", "Z")
            v = "" if math.isnan(s.value[i]) else repr(float(s.value[i]))
            rows.append(f",,0,{when},{self.names[int(s.sensor[i])]},{v},{int(s.quality[i])}\r\n")
        return self.HEAD + "".join(rows) + "\r\n" if rows else "\r\n"

    @contextmanager
    def serve(self) -> Iterator[str]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                owner.tokens.add(self.headers.get("Authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if owner.accept is not None and self.headers.get("Authorization") != owner.accept:
                    refused = b'{"code":"unauthorized","message":"unauthorized access"}'  # InfluxDB 2's
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(refused)))
                    self.end_headers()
                    self.wfile.write(refused)
                    return
                text = owner.answer(body["query"]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/csv; charset=utf-8")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


def test_flux_history_replays_to_the_golden_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, config = station_config(tmp_path, {"url": "http://127.0.0.1:9", "org": "barton", "bucket": "b"})
    answers = FluxAnswers(stored(config), list(config.rules))
    with answers.serve() as url:
        monkeypatch.setenv("REPLAY_TEST_TOKEN", "secret-token-0123456789")
        influx = {"url": url, "org": "barton", "bucket": "b", "token": "${REPLAY_TEST_TOKEN}"}
        config_path, config = station_config(tmp_path, influx)
        out = tmp_path / "events.jsonl"
        args = from_influx(config_path)
        result = replay(*args, "--historian", "flux", "--events", str(out))
        assert result.returncode == 0, result.stderr
        assert events(out) == events(CASE / "events.jsonl")
        assert "replay: 592 samples, 3 sensors, 8 events" in result.stdout
        assert len(answers.queries) == 4  # a day in 6 h windows
        assert answers.tokens == {"Token secret-token-0123456789"}
        assert "secret-token" not in result.stdout + result.stderr
        assert f'r.station == "{config.station.id}"' in answers.queries[0]
        assert 'from(bucket: "b")' in answers.queries[0]
        monkeypatch.setattr(historian, "WINDOW_S", 1800.0)
        history = historian.open_history(config, 1780444800.0, 1780531200.0, "flux")
        got = Samples.concat(list(merge([history])))
        want = stored(config)
        assert sorted(zip(got.time.tolist(), got.sensor.tolist(), strict=True)) == sorted(
            zip(want.time.tolist(), want.sensor.tolist(), strict=True)
        )


def _vm_write(victoria: VictoriaMetrics, lines: list[str]) -> None:
    victoria.write(lines, "barton", "replay")
    victoria.flush()


def station_on(
    kind: str, tmp_path: Path, influxdb1: InfluxDB1, victoria: VictoriaMetrics
) -> tuple[Path, Config, Callable[[list[str]], None]]:
    """A station config whose historian is `kind` ("influxql": a database of its own on
    InfluxDB 1.x; "victoriametrics"), and how to store line-protocol points in it."""
    if kind == "influxql":
        db = own_database(influxdb1)
        path, config = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
        return path, config, lambda lines: write_influxdb1(influxdb1, lines, db=db)
    path, config = station_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "replay"})
    return path, config, lambda lines: _vm_write(victoria, lines)


def assert_ramp(got: Samples, minutes: int) -> None:
    """`got` is outfall.temp's ramp (100 + k at T0 + k minutes) for `minutes`, each time once."""
    assert got.time.tolist() == [float(T0 + 60 * k) for k in range(minutes)]
    assert got.value.tolist() == [100.0 + k for k in range(minutes)]


def assert_replay_skips_repeats(tmp_path: Path, config_path: Path, repeats: int, first: int) -> None:
    """`monitor replay --from-influx` of the 30-minute ramp: each reading judged once, the
    `repeats` counted and skipped as a file's repeated rows are, the `first` named."""
    result = replay(*from_influx(config_path), "--events", str(tmp_path / "events.jsonl"))
    assert result.returncode == 0, result.stderr
    assert f"{repeats} row(s) with out of order or duplicate time (skipped), first at line" in result.stderr
    assert f"outfall.temp at {first}.000 stored twice" in result.stderr
    assert "replay: 30 samples, 1 sensors" in result.stdout


def test_victoriametrics_sensor_stored_in_two_series_comes_back_whole(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    """A sensor whose tags changed (here: stored first without its kind and unit tags, then
    with them) has two series in VictoriaMetrics; every point of both comes back, each with
    its own value (one series used to replace the other, its values read as NaN)."""
    _, config = station_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "replay"})
    lines = [temp_line(config, T0 + 60 * k, 100.0 + k, tags="") for k in range(30)]
    lines += [temp_line(config, T0 + 60 * k, 100.0 + k) for k in range(30, 60)]
    _vm_write(victoria, lines)
    got, _ = read_back(config, "victoriametrics")
    assert_ramp(got, 60)


def test_victoriametrics_points_stored_twice_replay_once_and_are_counted(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    """VictoriaMetrics without `-dedup.minScrapeInterval` keeps both copies of a batch the
    outbox sent again (delivery is at least once), and a sensor whose tags changed can hold
    one time in two series: each time comes back once, the repeats counted and skipped as a
    file's repeated rows are, never judged twice."""
    config_path, config = station_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "replay"})
    lines = [temp_line(config, T0 + 60 * k, 100.0 + k) for k in range(30)]
    _vm_write(victoria, lines)
    _vm_write(victoria, lines[10:20])  # a batch sent again after a crash
    # the same sensor and times under its old tags (without kind and unit)
    _vm_write(victoria, [line.replace(TEMP_TAGS, "") for line in lines[25:]])
    held = victoria.export(f'{{__name__="sensor_value",station="{config.station.id}"}}')
    assert sorted(len(series["timestamps"]) for series in held) == [5, 40]  # the server keeps repeats

    got, report = read_back(config, "victoriametrics")
    assert_ramp(got, 30)
    assert report.out_of_order.count == 15
    assert_replay_skips_repeats(tmp_path, config_path, repeats=15, first=T0 + 600)


@pytest.mark.parametrize("chunk", [50_000, 7, 2])
def test_influxdb_1_a_sensor_time_held_in_two_series_replays_once_and_is_counted(
    tmp_path: Path, influxdb1: InfluxDB1, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """InfluxDB 1.x overwrites a point written twice to one series, but a sensor whose tags
    changed (written first with its kind and unit tags, then without them: an older writer,
    or a tag renamed) holds one time in two series, and the InfluxQL answer, which merges
    the series, gives that time twice. Each time comes back once, the first kept and the
    repeats counted and skipped as a file's repeated rows are, also when the two copies fall
    in two chunks of the streamed answer (chunk 7 and 2: the pairs straddle chunk ends).
    Before: every repeat came back, and `replay` counted 35 samples of 30 readings."""
    monkeypatch.setattr(historian, "CHUNK_POINTS", chunk)
    db = own_database(influxdb1)
    config_path, config = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
    lines = [temp_line(config, T0 + 60 * k, 100.0 + k) for k in range(30)]
    lines += [line.replace(TEMP_TAGS, "") for line in lines[25:]]  # its old tags
    write_influxdb1(influxdb1, lines, db=db)

    got, report = read_back(config, "influxql")
    assert_ramp(got, 30)
    assert report.out_of_order.count == 5
    assert_replay_skips_repeats(tmp_path, config_path, repeats=5, first=T0 + 25 * 60)


def test_influxdb_1_millisecond_times_come_back_as_written(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    """Times with milliseconds (a PLC's 250 ms samples) are the same floats a file with those
    times gives: nanoseconds read back as microseconds / 1e6, exactly rounded (`ns * 1e-9`
    was one unit in the last place off for about half of them)."""
    db = own_database(influxdb1)
    _, config = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
    ms = [1780444800000 + 60_000 * k + 7 * k % 1000 for k in range(200)]
    write_influxdb1(influxdb1, [temp_line(config, m / 1000, 100.0) for m in ms], db=db)
    got, _ = read_back(config, "influxql")
    assert got.time.tolist() == [m / 1000 for m in ms]


def test_start_and_end_outside_1970_to_2100_exit_2_naming_the_flag(tmp_path: Path) -> None:
    """Epoch milliseconds (what a Grafana URL carries) are refused before any query, with what
    to type instead; they used to reach InfluxDB as an unparsable integer (exit 1)."""
    config_path, _ = station_config(tmp_path, {"url": "http://127.0.0.1:9", "api": "v1", "database": "x"})
    args = ["--config", str(config_path), "--from-influx", "--events", "/dev/null"]
    ms = replay(*args, "--start", "1780444800000", "--end", "1780531200000")
    assert ms.returncode == 2
    assert "argument --start: time 1780444800000 is after 2100 as epoch seconds" in ms.stderr
    assert "epoch milliseconds? 1780444800 is 2026-06-03T00:00:00Z" in ms.stderr
    early = replay(*args, "--start", "1900-01-01T00:00:00Z", "--end", END)
    assert early.returncode == 2
    assert "argument --start: time 1900-01-01T00:00:00Z is before 1970" in early.stderr
    late = replay(*args, "--start", START, "--end", "2100-01-01T00:00:01Z")
    assert late.returncode == 2 and "argument --end: time 2100-01-01T00:00:01Z is after 2100" in late.stderr


def test_start_and_end_with_input_files_exit_2_rather_than_replay_everything(tmp_path: Path) -> None:
    """`--start`/`--end` choose the historian's range; with `--input` they would be ignored and
    the whole file replayed, so they are refused, naming them."""
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv"), "--no-incidents"]
    result = replay(*args, "--start", START, "--end", END, "--events", str(tmp_path / "e.jsonl"))
    assert result.returncode == 2
    assert "replay: --start and --end only go with --from-influx" in result.stderr
    assert not (tmp_path / "e.jsonl").exists()


def test_a_range_with_no_stored_samples_says_so(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    """A range before the station was recorded (or a station id the historian does not know)
    replays nothing; stderr names the station, the historian and the range, and the what-if
    report does not read as "no alarms" over samples it never had."""
    db = own_database(influxdb1)
    config_path, config = station_config(tmp_path, {"url": influxdb1.url, "api": "v1", "database": db})
    write_then_read_back(tmp_path, config_path)  # the station-day is stored ...
    args = from_influx(config_path, "2026-05-01T00:00:00Z", START)
    result = replay(*args, "--events", str(tmp_path / "before.jsonl"))  # ... the month before is not
    assert result.returncode == 0, result.stderr
    note = (
        f"no samples of station {config.station.id} from 2026-05-01T00:00:00Z to 2026-06-03T00:00:00Z"
        " (end exclusive): check --start/--end, station.id and the influx section"
    )
    assert note in result.stderr
    assert "replay: 0 samples, 0 sensors, 0 events" in result.stdout
    whatif = replay(*args, "--what-if", str(CASE / "config.yaml"))
    assert whatif.returncode == 0, whatif.stderr
    assert note in whatif.stderr
    assert "no samples to judge" in whatif.stdout and "neither config raised" not in whatif.stdout
    doc = json.loads(replay(*args, "--what-if", str(CASE / "config.yaml"), "--format", "json").stdout)
    assert doc["samples"] == 0 and doc["rules"] == []
    stored_day = replay("--config", str(config_path), "--from-influx", "--start", START, "--end", END,
                        "--what-if", str(CASE / "config.yaml"), "--format", "json")  # fmt: skip
    assert json.loads(stored_day.stdout)["samples"] == 592 and "no samples" not in stored_day.stderr


@pytest.mark.parametrize("kind", ["influxql", "victoriametrics"])
def test_points_stored_in_another_unit_come_back_in_the_configs_unit(
    tmp_path: Path, influxdb1: InfluxDB1, victoria: VictoriaMetrics, kind: str
) -> None:
    """The `unit` tag says what unit a stored value is in. Readings stored while the config
    said degC (the transmitter since re-ranged to degF, the config with it) come back
    converted to the config's degF, and stderr says how many: 70 degC is 158 degF, over the
    65 degC (149 degF) limit; read as 70 degF that high alarm was missed. A unit that does
    not convert is said so and kept."""
    config_path, config, store = station_on(kind, tmp_path, influxdb1, victoria)
    lines = [temp_line(config, T0 + 60 * k, 70.0, ",kind=temperature,unit=degC") for k in range(10)]
    lines += [temp_line(config, T0 + 60 * k, 140.0) for k in range(10, 20)]
    # no unit tag
    lines += [temp_line(config, T0 + 60 * k, 140.0, ",kind=temperature") for k in range(20, 25)]
    flow = f"sensor,station={config.station.id},sensor=outfall.flow,kind=flow,unit=ft"  # a level's unit
    lines += [f"{flow} value=3.0,quality=0i {ns(T0 + 60 * k)}" for k in range(3)]
    store(lines)
    got, report = read_back(config, kind)
    temp = got.sensor == list(config.rules).index("outfall.temp")
    assert got.value[temp].tolist() == [158.0] * 10 + [140.0] * 15
    assert got.value[~temp].tolist() == [3.0] * 3
    lines_out = report.lines()
    assert any(
        "10 point(s) of outfall.temp stored in degC, converted to degF (the config's unit)" in x
        for x in lines_out
    )
    assert any(
        "3 point(s) of outfall.flow stored in ft, which does not convert to gpm: judged as stored" in x
        for x in lines_out
    )
    out = tmp_path / "events.jsonl"
    result = replay(*from_influx(config_path), "--historian", kind, "--events", str(out))
    assert result.returncode == 0, result.stderr
    assert "replay: " in result.stderr and "converted to degF (the config's unit)" in result.stderr
    high = [e for e in events(out) if e["sensor"] == "outfall.temp" and e["rule"] == "high"]
    assert high and high[0]["state"] == "active"  # 70 degF (21 degC) raised none
    assert high[0]["value"] == pytest.approx(70.0) and high[0]["limit"] == 65.0  # the limit's degC


def test_wrong_credentials_exit_1_saying_which_and_never_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real InfluxDB 1.6 with auth on and a wrong password: one line naming the server, the
    401 and what to check; the password (right or wrong) appears nowhere."""
    server = InfluxDB1(tmp_path / "influx-auth", auth=True)
    server.start()
    try:
        server.query("CREATE USER admin WITH PASSWORD 'right-0451' WITH ALL PRIVILEGES")
        server.query("CREATE DATABASE secured", auth=("admin", "right-0451"))
        monkeypatch.setenv("HISTORIAN_PW", "wrong-7719")
        influx = {"url": server.url, "api": "v1", "database": "secured", "username": "admin"}
        config_path, _ = station_config(tmp_path, {**influx, "password": "${HISTORIAN_PW}"})
        args = from_influx(config_path)
        result = replay(*args, "--events", "/dev/null")
        assert result.returncode == 1
        assert f"replay: {server.url}/query: HTTP 401" in result.stderr
        assert "check the influx section's username and password" in result.stderr
        assert "Traceback" not in result.stderr
        assert "wrong-7719" not in result.stdout + result.stderr and "right-0451" not in result.stderr
        monkeypatch.setenv("HISTORIAN_PW", "right-0451")
        right = replay(*args, "--events", "/dev/null")
        assert right.returncode == 0, right.stderr
        assert "no samples of station" in right.stderr
    finally:
        server.stop()


def test_flux_wrong_token_is_one_line_without_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InfluxDB 2 refusing the token (its recorded 401 answer): one stderr line with the status,
    the server's message and what to check, not influxdb-client's multi-line dump of the
    response headers; the token appears nowhere."""
    _, config = station_config(tmp_path, {"url": "http://127.0.0.1:9", "org": "barton", "bucket": "b"})
    answers = FluxAnswers(stored(config), list(config.rules))
    answers.accept = "Token the-right-one"
    with answers.serve() as url:
        monkeypatch.setenv("REPLAY_TEST_TOKEN", "stale-token-2468")
        influx = {"url": url, "org": "barton", "bucket": "b", "token": "${REPLAY_TEST_TOKEN}"}
        config_path, _ = station_config(tmp_path, influx)
        args = from_influx(config_path)
        result = replay(*args, "--historian", "flux", "--events", "/dev/null")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "HTTP 401 Unauthorized: unauthorized access (check the influx section's token)" in result.stderr
    assert "stale-token-2468" not in result.stdout + result.stderr


def test_a_retention_policy_name_with_quotes_is_quoted_not_injected(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    """`influx.retention_policy` goes into the InfluxQL text as a quoted identifier; a name with
    a double quote used to end the identifier early (a parse error at best)."""
    db = own_database(influxdb1)
    rp = 'raw "14d" station'  # InfluxDB refuses a backslash in the name; a quote it takes
    quoted = rp.replace('"', '\\"')
    influxdb1.query(f'CREATE RETENTION POLICY "{quoted}" ON {db} DURATION 100000h REPLICATION 1')
    influx = {"url": influxdb1.url, "api": "v1", "database": db, "retention_policy": rp}
    _, config = station_config(tmp_path, influx)
    write_influxdb1(influxdb1, [temp_line(config, T0 + 60 * k, 100.0) for k in range(5)], db=db, rp=rp)
    got, _ = read_back(config, "influxql")
    assert got.time.tolist() == [1780444800.0 + 60 * k for k in range(5)]


Cut = int | Callable[[bytes], int | None]


@contextmanager
def cut_after(port: int, limit: Cut) -> Iterator[int]:
    """A TCP relay to the real server that passes the first `limit` bytes of its answer and
    then closes both sides: a connection dropped mid-answer (a VPN or a proxy restarting),
    which the real server cannot be made to do on demand. `limit` may be a function of the
    answer received so far (None: not yet known), to cut at a place in the real answer.
    Only the first connection is cut; later ones pass whole, so a reader that goes on
    past the cut gets its next windows and exits 0, which the tests catch. Yields the
    relay's port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def where(answer: bytes) -> int | None:
        if isinstance(limit, int):
            return limit
        return limit(answer)

    def cut(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", port)) as server:
            server.sendall(client.recv(65536))  # the GET fits one read
            answer = b""
            while ((at := where(answer)) is None or len(answer) < at) and (data := server.recv(65536)):
                answer += data
            client.sendall(answer[: where(answer)])
            client.shutdown(socket.SHUT_RDWR)

    def whole(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", port)) as server:
            ends = [client, server]
            while True:  # until either side closes
                for end in select.select(ends, [], [])[0]:
                    data = end.recv(65536)
                    if not data:
                        return
                    (server if end is client else client).sendall(data)

    def relay() -> None:
        first = True
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener shut down: the test is over
                return
            if first:
                cut(client)
                first = False
            else:
                threading.Thread(target=whole, args=(client,), daemon=True).start()

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        thread.join(timeout=10)
        listener.close()


@pytest.mark.parametrize("limit", [100, 30_000])
def test_an_answer_cut_short_exits_1_not_a_quiet_day(
    tmp_path: Path, influxdb1: InfluxDB1, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """InfluxDB 1.x's answer cut inside its headers (100 bytes) or between chunks: exit 1 with
    one line, never a replay of what arrived as if it were the whole range (the cut inside
    the headers used to read as an empty answer: exit 0, 0 samples)."""
    db = own_database(influxdb1)
    monkeypatch.setattr(historian, "CHUNK_POINTS", 1000)
    with cut_after(int(influxdb1.url.rsplit(":", 1)[1]), limit) as port:
        influx = {"url": f"http://127.0.0.1:{port}", "api": "v1", "database": db}
        config_path, config = station_config(tmp_path, influx)
        write_influxdb1(influxdb1, [temp_line(config, T0 + k, 100.0) for k in range(5000)], db=db)
        result = replay(*from_influx(config_path), "--events", str(tmp_path / "events.jsonl"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot read the history" in result.stderr and "Traceback" not in result.stderr
    assert "samples/s" not in result.stdout


def test_config_sensors_without_a_stored_sample_are_named(tmp_path: Path, victoria: VictoriaMetrics) -> None:
    """A sensor renamed in the config since the history was written (or never recorded) has
    no samples under its id: the replay names it instead of judging it silently quiet."""
    config_path, config = station_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "replay"})
    old = f"sensor,station={config.station.id},sensor=outfall.pH,kind=ph,unit=pH"  # the ph probe's old id
    _vm_write(
        victoria,
        [
            line
            for k in range(10)
            for line in (temp_line(config, T0 + 60 * k, 7.0), f"{old} value=7.0,quality=0i {ns(T0 + 60 * k)}")
        ],
    )
    args = from_influx(config_path)
    result = replay(*args, "--events", str(tmp_path / "events.jsonl"))
    assert result.returncode == 0, result.stderr
    assert "10 row(s) for unknown sensor 'outfall.pH'" in result.stderr
    assert (
        "replay: 2 sensor(s) of the config without a sample in this range: outfall.flow, outfall.ph"
        in result.stderr
    )
    assert "replay: 10 samples, 1 sensors" in result.stdout


def _headers_end(answer: bytes) -> int | None:
    """Where the blank line after the headers starts (None: not received yet)."""
    at = answer.find(b"\r\n\r\n")
    return None if at < 0 else at


def _first_line_end(answer: bytes) -> int | None:
    """Just after the first JSON line's newline: the answer cut between two series."""
    head = answer.find(b"\r\n\r\n")
    at = -1 if head < 0 else answer.find(b"\n", head + 4)
    return None if at < 0 else at + 1


def _mid_first_line(answer: bytes) -> int | None:
    """In the middle of the first JSON line: a series cut in two."""
    head = answer.find(b"\r\n\r\n")
    at = -1 if head < 0 else answer.find(b"\n", head + 4)
    return None if at < 0 else (head + 4 + at) // 2


@pytest.mark.parametrize(
    ("points", "limit"),
    [
        (5, 40),  # inside the headers: Content-Length not yet sent
        (5, _headers_end),  # every header but the blank line after them
        (5, _first_line_end),  # one whole series of two, then the end
        (5, _mid_first_line),
        (5000, 40),  # a chunked answer (transfer-encoding) cut in its headers
        (5000, 30_000),  # ... and in its body
    ],
    ids=["headers", "blank-line", "between-series", "mid-series", "chunked-headers", "chunked-body"],
)
def test_a_victoriametrics_answer_cut_short_exits_1_naming_the_window(
    tmp_path: Path, victoria: VictoriaMetrics, points: int, limit: Cut
) -> None:
    """VictoriaMetrics frames a small export with Content-Length and a large one with
    chunks; an answer cut anywhere (in its headers, between two JSON lines, in a line) is
    exit 1 with one line naming the server and the window, never an empty or partial
    window replayed as if whole (a cut in the headers or between lines used to: exit 0,
    the window's alarms missing)."""
    _, config = station_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "replay"})
    _vm_write(victoria, [temp_line(config, T0 + k, 100.5) for k in range(points)])
    with cut_after(int(victoria.url.rsplit(":", 1)[1]), limit) as port:
        influx = {"url": f"http://127.0.0.1:{port}", "org": "barton", "bucket": "replay"}
        config_path, _ = station_config(tmp_path, influx)
        raw = yaml.safe_load(config_path.read_text())
        raw["station"]["id"] = config.station.id
        config_path.write_text(yaml.safe_dump(raw))
        args = from_influx(config_path)
        result = replay(*args, "--historian", "victoriametrics", "--events", str(tmp_path / "events.jsonl"))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"http://127.0.0.1:{port}" in lines[0] and "cannot read the history" in lines[0]
    assert "from 2026-06-03T00:00:00Z to 2026-06-03T06:00:00Z" in lines[0]
    assert "samples/s" not in result.stdout


def test_a_victoriametrics_range_without_samples_stays_empty(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    """The other side of the cut: a real empty export (`Content-Length: 0`, every window) is
    an empty range, exit 0 with the line that says so, not an error."""
    config_path, config = station_config(tmp_path, {"url": victoria.url, "org": "barton", "bucket": "replay"})
    args = from_influx(config_path)
    result = replay(*args, "--historian", "victoriametrics", "--events", str(tmp_path / "events.jsonl"))
    assert result.returncode == 0, result.stderr
    assert f"no samples of station {config.station.id} from {START} to {END}" in result.stderr


@pytest.mark.parametrize(
    "line",
    [
        b'{"metric":{"__name__":"sensor_value"},"values":[1.0]}',  # no timestamps
        b'{"metric":{"__name__":"sensor_value"},"values":[1.0,2.0],"timestamps":[1]}',
        b'{"metric":{"__name__":"sensor_value"},"values":["high"],"timestamps":[1]}',
        b'{"metric":"sensor_value","values":[1.0],"timestamps":[1]}',
        b'{"metric":{"__name__":"sensor_value"},"values":[1.0],"timestamps":[1]',  # cut in two
    ],
)
def test_an_export_line_that_is_not_one_series_is_an_error_naming_the_window(line: bytes) -> None:
    """What VictoriaMetrics itself never sends (a proxy's page, a line cut in two that
    still framed whole): one clear error naming where, not a KeyError or a series left out."""
    where = "http://vm:8428: the history from 2026-06-03T00:00:00Z to 2026-06-03T06:00:00Z"
    with pytest.raises(SourceError, match=re.escape(where)):
        historian._export_line(line, where)
