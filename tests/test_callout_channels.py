"""The HTTP provider channel against a local HTTP server (a Twilio-style form POST with basic
auth, an ntfy-style plain body with a bearer token, a provider error), TLS verification of
the e-mail channel, and `monitor notify test` through every channel of a person."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import yaml

from monitor.callout.email import EmailSender
from monitor.callout.http import HttpSender
from monitor.cli import main
from monitor.config.notify import EmailChannel, HttpChannel
from monitor.errors import WriteError
from tests.mqtt_tools import make_ca
from tests.smtp import MailServer


class Provider:
    """Records each request (method, path, headers, body); answers `status`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.status = 201
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(size)
                outer.requests.append(("POST", self.path, dict(self.headers), body))
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Provider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def provider() -> Iterator[Provider]:
    with Provider() as p:
        yield p


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_ca(tmp_path_factory.mktemp("ca"))


def twilio(url: str) -> HttpChannel:
    return HttpChannel.model_validate(
        {
            "type": "http",
            "url": url + "/2010-04-01/Accounts/AC123/Messages.json",
            "form": {"To": "{to}", "From": "+15550001111", "Body": "{text}"},
            "username": "AC123",
            "password": {"env": "TWILIO_TOKEN"},
        }
    )


def test_twilio_style_form_post_with_basic_auth(provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWILIO_TOKEN", "tw-secret")
    sender = HttpSender("sms", twilio(provider.url), "Barton PS 1")

    async def go() -> None:
        await sender.send("+15550102030", "subj", "pH 3.2 & low: ack https://x/callout/ack/t", None)
        await sender.aclose()

    asyncio.run(go())
    [(method, path, headers, body)] = provider.requests
    assert (method, path) == ("POST", "/2010-04-01/Accounts/AC123/Messages.json")
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"AC123:tw-secret").decode()
    form = parse_qs(body.decode())
    assert form == {
        "To": ["+15550102030"],
        "From": ["+15550001111"],
        "Body": ["pH 3.2 & low: ack https://x/callout/ack/t"],
    }


def test_ntfy_style_push_with_a_bearer_token_and_the_topic_in_the_url(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NTFY_TOKEN", "tk_abc")
    channel = HttpChannel.model_validate(
        {
            "type": "http",
            "url": provider.url + "/{to}",
            "body": "{text}",
            "headers": {"Title": "{subject}", "Priority": "urgent", "Click": "{link}"},
            "token": "${NTFY_TOKEN}",
        }
    )
    sender = HttpSender("push", channel, "Barton PS 1")

    async def go() -> None:
        await sender.send("ops/../x y", "[PS] HIGH", "text here", "https://gw/callout/ack/abc")
        await sender.aclose()

    asyncio.run(go())
    [(_, path, headers, body)] = provider.requests
    assert path == "/ops%2F..%2Fx%20y"  # an address cannot walk out of the topic
    assert headers["Authorization"] == "Bearer tk_abc"
    assert headers["Title"] == "[PS] HIGH" and headers["Click"] == "https://gw/callout/ack/abc"
    assert body == b"text here"


def test_a_provider_error_is_a_write_error_without_the_secret(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWILIO_TOKEN", "tw-secret")
    provider.status = 500
    sender = HttpSender("sms", twilio(provider.url + "/x?key=k"), "PS")

    async def go() -> None:
        try:
            with pytest.raises(WriteError) as info:
                await sender.send("+1555", "s", "t", None)
        finally:
            await sender.aclose()
        assert "HTTP 500" in str(info.value) and "tw-secret" not in str(info.value)

    asyncio.run(go())


def test_email_refuses_a_server_certificate_from_another_ca(certs: dict[str, Path]) -> None:
    with MailServer(certs=certs) as smtp:
        channel = EmailChannel(
            type="email", host="127.0.0.1", port=smtp.port, sender="m@ps.example", ca_file=certs["other_ca"]
        )

        async def go() -> None:
            with pytest.raises(WriteError, match="certificate"):
                await EmailSender("mail", channel).send("a@b.example", "s", "t")

        asyncio.run(go())
        assert smtp.mails == []


def test_notify_test_sends_through_each_channel_of_a_person(
    tmp_path: Path,
    certs: dict[str, Path],
    provider: Provider,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TWILIO_TOKEN", "tw-secret")
    with MailServer(certs=certs) as smtp:
        config = {
            "station": {"id": "ps-1", "name": "Barton PS 1", "timezone": "America/New_York"},
            "state_dir": str(tmp_path / "state"),
            "sensors": [{"id": "outfall.ph", "kind": "ph"}],
            "notify": {
                "channels": {
                    "mail": {
                        "type": "email",
                        "host": "127.0.0.1",
                        "port": smtp.port,
                        "ca_file": str(certs["ca"]),
                        "sender": "monitor@ps-1.example",
                    },
                    "sms": twilio(provider.url).model_dump(by_alias=True, exclude={"password"})
                    | {"password": {"env": "TWILIO_TOKEN"}},
                },
                "people": {
                    "callout": {"name": "On Call", "contacts": {"mail": "oncall@example.org", "sms": "+1555"}}
                },
            },
        }
        path = tmp_path / "station.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["notify", "test", "--config", str(path), "--person", "callout"]) == 0
        out = capsys.readouterr().out
        assert "mail       oncall@example.org: sent" in out and "sms        +1555: sent" in out
        [mail] = smtp.to("oncall@example.org")
        assert "test message for On Call" in mail.body
        assert any(zone in mail.body for zone in ("EST", "EDT"))  # station local time
        assert len(provider.requests) == 1

        provider.status = 503
        assert main(["notify", "test", "--config", str(path), "--person", "callout"]) == 1
        assert "sms        +1555: FAILED" in capsys.readouterr().out
        assert main(["notify", "test", "--config", str(path), "--person", "nobody"]) == 2
        assert "notify.people: no person 'nobody'" in capsys.readouterr().err


def test_heartbeat_counts_a_refused_ping_and_withholds_while_not_ready(provider: Provider) -> None:
    from monitor.callout import Heartbeat
    from monitor.config.notify import Heartbeat as HeartbeatConfig

    problems: list[str] = []
    beat = Heartbeat(HeartbeatConfig(url=provider.url + "/ping"), lambda: problems)
    # the provider serves POST only, so the ping (a GET) is refused with 501: a failing dead-man URL

    async def go() -> None:
        await beat.beat()
        assert beat.stats() == {"state": "failing", "sent": 0, "failed": 1, "withheld": 0}
        problems.append("modbus sim not connected")
        await beat.beat()
        assert beat.stats()["state"] == "withheld" and beat.stats()["withheld"] == 1
        await beat.aclose()

    asyncio.run(go())


def test_a_header_template_carries_a_non_ascii_station_name_as_utf8(provider: Provider) -> None:
    """httpx encodes str header values as ASCII: `Title: {subject}` with a station named
    `Bärton – PS 1` raised UnicodeEncodeError (not an httpx error), which escaped the
    callout's delivery loop and stopped the daemon at the first page."""
    channel = HttpChannel.model_validate(
        {
            "type": "http",
            "url": provider.url + "/{to}",
            "body": "{text}",
            "headers": {"Title": "{subject}", "X-Station": "{station}"},
        }
    )
    sender = HttpSender("push", channel, "Bärton – PS 1")

    async def go() -> None:
        await sender.send("ops", "[Bärton – PS 1] HIGH outfall.ph low", "pH 3.2 °", None)
        await sender.aclose()

    asyncio.run(go())
    [(_, _, headers, body)] = provider.requests
    # http.server decodes header bytes as latin-1; the bytes on the wire are UTF-8
    assert headers["Title"].encode("latin-1").decode("utf-8") == "[Bärton – PS 1] HIGH outfall.ph low"
    assert headers["X-Station"].encode("latin-1").decode("utf-8") == "Bärton – PS 1"
    assert body.decode("utf-8") == "pH 3.2 °"


def test_the_priority_placeholder_is_the_alarms_priority(provider: Provider, tmp_path: Path) -> None:
    """`{priority}` is documented and accepted by the config check, but was filled with ''."""
    from monitor.alarms import AlarmManager
    from monitor.callout import Callout
    from monitor.config import build_config
    from monitor.model import Condition, ConditionState, ManualClock, Rule

    config = build_config(
        {
            "station": {"id": "ps-1"},
            "state_dir": str(tmp_path / "state"),
            "console": {"enabled": False},
            "sensors": [{"id": "outfall.ph", "kind": "ph"}],
            "notify": {
                "channels": {
                    "push": {
                        "type": "http",
                        "url": provider.url + "/{to}",
                        "body": "{text}",
                        "headers": {"Priority": "{priority}"},
                    }
                },
                "people": {"alice": {"name": "Alice", "contacts": {"push": "ops"}}},
                "rosters": {"operators": ["alice"]},
                "pipelines": [{"name": "operators", "roster": "operators"}],
            },
        }
    )
    t0 = 1_800_000_000.0

    async def go() -> None:
        clock = ManualClock(t0)
        manager = AlarmManager.open(config, clock)
        callout = Callout(config, manager, clock)
        try:
            manager.apply(
                Condition(t0, "outfall.ph", Rule.LOW, ConditionState.ACTIVE, 3.2, 5.0, "§139-15 C(3)")
            )
            callout.tick()
            assert await callout.deliver_due() == 1
        finally:
            await callout.aclose()
            manager.close()

    asyncio.run(go())
    [(_, _, headers, _)] = provider.requests
    assert headers["Priority"] == "high"


def test_a_password_in_the_channel_url_stays_out_of_the_error(provider: Provider) -> None:
    """The error becomes a log line and the notify alarm's message (console, MQTT): the URL
    in it goes through redact_url, as the webhook's does."""
    url = provider.url.replace("http://", "http://ops:pw-in-url@") + "/x"
    channel = HttpChannel.model_validate({"type": "http", "url": url, "body": "{text}"})
    provider.status = 500
    sender = HttpSender("push", channel, "PS")

    async def go() -> None:
        try:
            with pytest.raises(WriteError) as info:
                await sender.send("ops", "s", "t", None)
        finally:
            await sender.aclose()
        assert "HTTP 500" in str(info.value) and "pw-in-url" not in str(info.value)

    asyncio.run(go())
