"""What a writer must do with its credentials beyond sending them: keep them out of error
text, and read an old vmauth's answer to wrong ones as the refusal it is.

A vmauth before 1.91 (Debian's 1.79, measured; VictoriaMetrics issue #4188, PR #4288)
answers wrong credentials with `400 cannot find the provided auth token "Basic <base64>"`:
it echoes the credentials, and a 400 would send the batch to dead letters as if the points
were bad. Here that answer becomes a 401 (retried, the points kept) with the token cut out.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import urllib.parse

from monitor.config import Influx

_UNKNOWN_TOKEN = re.compile(r"cannot find the provided auth token", re.I)
_ECHOED = re.compile(r'"(?:Basic|Token|Bearer) [^"]*"', re.I)
MIN_SCRUBBED = 4  # characters; shorter strings would cut ordinary words out of the text


def secrets_of(influx: Influx) -> tuple[str, ...]:
    """Every form in which this config's credentials can come back in an answer: as sent
    (base64 of `user:password`), plain, URL-encoded (a redirect's userinfo, a quoted request
    line) and JSON-escaped (an error body). Longest first, so a form is cut whole."""
    out: list[str] = []
    password = influx.password.get_secret_value() if influx.password else ""
    if influx.username is not None:
        pair = f"{influx.username}:{password}"
        out += [base64.b64encode(pair.encode()).decode(), *_forms(pair)]
    if password:
        out += _forms(password)
    if influx.token is not None:
        out += _forms(influx.token.get_secret_value())
    unique = {s for s in out if len(s) >= MIN_SCRUBBED}
    return tuple(sorted(unique, key=len, reverse=True))


def _forms(secret: str) -> list[str]:
    """`secret` as a proxy or server may quote it back."""
    return [
        secret,
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote(secret),
        urllib.parse.quote_plus(secret),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
    ]


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with any echoed Authorization value and every credential replaced by `***`."""
    text = _ECHOED.sub('"***"', text)
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def refusal(status: int, text: str) -> tuple[int, str]:
    """(401, text saying so) for an old vmauth's 400 to unknown credentials, else unchanged."""
    if status == 400 and _UNKNOWN_TOKEN.search(text):
        return 401, f"{text} (wrong username or password: retried as a 401, the points kept)"
    return status, text


class ScrubLibraryLog(logging.Filter):
    """Cuts credentials out of a library's own log records: influxdb-client logs an answer
    it cannot parse as JSON (vmauth's echo of the Authorization header) at DEBUG on the root
    logger, where no adapter's error handling sees it. Attached to the root logger, it
    rewrites only records from files under `library_path`."""

    def __init__(self, library_path: str, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self.library_path = library_path
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if record.pathname.startswith(self.library_path):
            record.msg, record.args = scrub(record.getMessage(), self.secrets), None
        return True
