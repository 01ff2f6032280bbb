"""The v2 writer's credentials: `username`/`password` go as HTTP basic auth (a vmauth in front of
VictoriaMetrics, InfluxDB 1.8's v2 API), `token` as `Token`; both at once cannot travel in
one Authorization header, so that config is refused naming the key, never half ignored."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import yaml

from monitor.model import Sample
from monitor.sinks.pipeline import open_sink
from tests.cli import run_monitor
from tests.services import VictoriaMetrics, VMAuth
from tests.sink_config import write_config

T0 = 1_700_000_000.0


def test_v2_with_username_and_password_writes_through_vmauth(
    tmp_path: Path,
    victoria: VictoriaMetrics,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """vmauth answers 401 to a write without the user's basic auth: the writer used to send
    none (the password was read and dropped), so nothing ever left the outbox."""
    proxy = VMAuth(tmp_path / "vmauth", victoria.url, username="station", password="pw-9f3k2")
    proxy.start()
    caplog.set_level(logging.DEBUG)
    try:
        monkeypatch.setenv("INFLUX_PW", "pw-9f3k2")
        influx = {"url": proxy.url, "org": "barton", "bucket": "b", "username": "station"}
        _, config = write_config(tmp_path / "ok", {**influx, "password": "${INFLUX_PW}"}, station="auth-v2")
        before = victoria.lines_taken()
        sink = open_sink(config)
        sink.write_samples([Sample("outfall.ph", T0, 7.25)])
        assert asyncio.run(sink.drain(10)) == 0, sink.drainer.stats.last_error if sink.drainer else None
        sink.close()
        assert sink.drainer is not None
        assert "pw-9f3k2" not in sink.drainer.writer.target
        victoria.wait_for_lines(before + sink.drainer.stats.written)
        (series,) = victoria.export('{__name__="sensor_value",station="auth-v2"}')
        assert series["values"] == [7.25]

        monkeypatch.setenv("INFLUX_PW", "wrong")
        _, config = write_config(
            tmp_path / "wrong", {**influx, "password": "${INFLUX_PW}"}, station="auth-v2"
        )
        sink = open_sink(config)
        sink.write_samples([Sample("outfall.ph", T0 + 1, 7.5)])
        # vmauth 1.79 answers wrong credentials 400, echoing them: read as a refusal (retried,
        # never dead-lettered as bad points) and the echo cut out
        assert asyncio.run(sink.drain(0.5)) == 1
        assert sink.outbox is not None and sink.outbox.stats().dead_letters == 0
        assert sink.drainer is not None
        error = sink.drainer.stats.last_error or ""
        assert "wrong username or password" in error and "c3RhdGlvbjp3cm9uZw" not in error, error
        sink.close()
    finally:
        proxy.stop()
    # influxdb-client logs an answer it cannot parse at DEBUG, on the root logger: that too
    assert "pw-9f3k2" not in caplog.text
    assert "c3RhdGlvbjp" not in caplog.text  # base64 of "station:"


@pytest.mark.parametrize(
    ("influx", "expected"),
    [
        (
            {"org": "o", "bucket": "b", "token": "${T}", "username": "u", "password": "${PW}"},
            "influx.token: set token or username and password, not both",
        ),
        ({"org": "o", "bucket": "b", "password": "${PW}"}, "influx.password: needs username"),
        ({"api": "v1", "database": "d", "password": "${PW}"}, "influx.password: needs username"),
    ],
    ids=["token-and-username", "v2-password-alone", "v1-password-alone"],
)
def test_credentials_that_cannot_all_be_sent_exit_2_naming_the_key(
    tmp_path: Path, influx: dict[str, str], expected: str
) -> None:
    """A secret the writer would drop is refused at start, never silently ignored."""
    path = tmp_path / "station.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "station": {"id": "ps-1", "name": "x"},
                "sensors": [{"id": "outfall.ph", "kind": "ph"}],
                "influx": {"url": "http://127.0.0.1:9", **influx},
            }
        )
    )
    result = run_monitor("check-config", str(path), env={"T": "t0ken-t0ken-t0ken", "PW": "hunter2"})
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr and "t0ken" not in result.stderr
