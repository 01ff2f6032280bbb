"""What a page says, and the acknowledge link it carries.

Every message names station, sensor, value and limit, the ordinance section and the
time in station local time, so a person can judge it from a phone at night. The link
is `<link_base>/callout/ack/<nonce>.<signature>`: the nonce is random and stored with
its escalation, person and expiry; the signature (HMAC-SHA256 under `link_secret`)
binds those, so a guessed or altered link fails before any state is touched. The
expiry it binds is the signing clock's; one signed on an unset clock is moved in the store
(`shift`), never re-signed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

from monitor.alarms.figures import figures, lasting
from monitor.model import Alarm, number


def local_time(t: float, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %H:%M %Z")


def one_line(text: str) -> str:
    """`text` with every run of whitespace (line breaks included) as one space: a subject
    is a mail header, and a line break in a header is refused (or, unchecked, injected)."""
    return " ".join(text.split())


def alarm_message(
    alarm: Alarm,
    station: str,
    unit: str,
    zone: ZoneInfo,
    link: str | None,
    expires: float | None,
    valid_for: float | None = None,
    unset_now: float | None = None,
    began_set: bool = True,
    began_here: bool = True,
) -> tuple[str, str]:
    """(subject, text) for one alarm; short enough for one or two SMS segments before the link.
    `valid_for` instead of `expires`: the clock is not set, its expiry would name a wrong day.
    `unset_now`: the time of a gateway clock judged not set; the page says how long the alarm
    has been on instead of "since" a day of that clock (last year, 1970). `began_set` false:
    the alarm began on such a clock, since set (its start names a wrong day, and how long
    before the step is not known). `began_here` false: not begun on this run's clock (an
    earlier boot's unset clock, which a reboot reset): its length on this one is not known."""
    what = f"{alarm.sensor} {alarm.rule}"
    subject = one_line(f"[{one_line(station)}] {str(alarm.priority).upper()} {what}")
    began = alarm.activated_at or alarm.updated_at
    if unset_now is None and not began_set:
        when = "in alarm since before the gateway clock was set (since when is not known)"
    elif unset_now is None:
        when = f"since {local_time(began, zone)}"
    elif unset_now >= began and began_here:
        when = f"in alarm for {lasting(unset_now - began)} (the gateway clock is not set)"
    else:  # stamped by another clock (a device's, or before a step): no length to tell
        when = "in alarm (the gateway clock is not set: since when is not known)"
    lines = [
        f"{station}: {str(alarm.priority).upper()} alarm {what}",
        figures(alarm, unit),
        f"rule {alarm.citation}" if alarm.citation else "",
        when,
        alarm.message,
    ]
    lines.append(_ack_line(link, expires, zone, valid_for=valid_for))
    return subject, "\n".join(x for x in lines if x)


def flood_message(
    alarms: Sequence[Alarm],
    station: str,
    zone: ZoneInfo,
    now: float,
    link: str | None,
    expires: float | None,
    valid_for: float | None = None,
    clock_set: bool = True,
) -> tuple[str, str]:
    """One summary for a flood (EEMUA 191): the count and the first alarms, not one page each.
    On a gateway clock judged not set (`clock_set` false) no time of it: a wrong day."""
    subject = f"[{one_line(station)}] ALARM FLOOD: {len(alarms)} alarms"
    at = f"at {local_time(now, zone)}" if clock_set else "now (the gateway clock is not set)"
    lines = [f"{station}: alarm flood, {len(alarms)} alarms unacknowledged {at}"]
    for a in alarms[:10]:
        value = number(a.value)
        lines.append(f"- {a.sensor} {a.rule} {value} ({a.citation})")
    if len(alarms) > 10:
        lines.append(f"- and {len(alarms) - 10} more")
    lines.append(_ack_line(link, expires, zone, every=True, valid_for=valid_for))
    return subject, "\n".join(lines)


def _ack_line(
    link: str | None,
    expires: float | None,
    zone: ZoneInfo,
    every: bool = False,
    valid_for: float | None = None,
) -> str:
    what = "all" if every else "it"
    if link is not None and valid_for is not None:
        return f"Acknowledge {what}: {link} (once, for {lasting(valid_for)})"
    if link is None or expires is None:
        return "Acknowledge on the station console."
    return f"Acknowledge {what}: {link} (once, until {local_time(expires, zone)})"


class LinkSigner:
    """Makes and checks `<nonce>.<signature>` tokens."""

    def __init__(self, secret: bytes) -> None:
        self._key = secret

    def make(self, escalation: int, person: str, expires: float) -> tuple[str, str]:
        """(nonce, token)."""
        nonce = secrets.token_urlsafe(18)
        return nonce, f"{nonce}.{self._sign(nonce, escalation, person, expires)}"

    def _sign(self, nonce: str, escalation: int, person: str, expires: float) -> str:
        text = f"{nonce}|{escalation}|{person}|{expires!r}".encode()
        digest = hmac.new(self._key, text, hashlib.sha256).digest()[:18]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def check(self, token: str, escalation: int, person: str, expires: float) -> bool:
        nonce, _, sig = token.partition(".")
        return hmac.compare_digest(sig.encode(), self._sign(nonce, escalation, person, expires).encode())


def nonce_of(token: str) -> str | None:
    """The nonce part of a well-formed token; None for anything else (never an exception)."""
    nonce, dot, sig = token.partition(".")
    if not dot or not (10 <= len(nonce) <= 64) or not (10 <= len(sig) <= 64):
        return None
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    if not set(nonce) <= allowed or not set(sig) <= allowed:
        return None
    return nonce


__all__ = [
    "LinkSigner",
    "alarm_message",
    "figures",
    "flood_message",
    "lasting",
    "local_time",
    "nonce_of",
    "one_line",
]
