"""The `notify:` section: callout channels, people, rosters, schedules, pipelines, heartbeat.

Validated like every other section (exit 2 naming the key): references between
people, channels, rosters, schedules and pipelines are checked here, and the
placeholders of an HTTP request template are checked against the ones a message
fills in, so a typo fails at start, not at 3 a.m. on the first page.
"""

import re
from datetime import date, time
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from monitor.config.sensors import key_error
from monitor.config.types import Duration, Secret, Section, all_defaults
from monitor.model import Priority, Rule

NAME = r"^[A-Za-z0-9_.-]+$"
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun", "holiday"]
PLACEHOLDER = re.compile(r"\{([A-Za-z_]+)\}")
FIELDS = frozenset({"to", "subject", "text", "station", "link", "priority"})
"""What an HTTP template may say: `{to}` is the person's address on that channel."""


class EmailChannel(Section):
    """SMTP submission: `starttls` (port 587), `tls` (implicit, port 465) or `none` (a relay on
    the gateway's own network only)."""

    type: Literal["email"]
    host: str
    port: int | None = Field(None, ge=1, lt=65536, description="default 587, 465 for tls, 25 for none")
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: Secret | None = None
    sender: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", description="the From address")
    ca_file: Path | None = None
    timeout: Duration = Field(15.0, gt=0)

    @model_validator(mode="after")
    def _auth_pair(self) -> "EmailChannel":
        if (self.username is None) != (self.password is None):
            raise key_error("password", "username and password go together")
        return self

    @property
    def effective_port(self) -> int:
        return self.port or {"starttls": 587, "tls": 465, "none": 25}[self.security]


class HttpChannel(Section):
    """SMS, voice or push through an HTTP provider, described by a request template.

    `{to}`, `{subject}`, `{text}`, `{station}`, `{link}`, `{priority}` are filled in
    the URL (URL-encoded), the `form`/`json` fields, the headers and `body`."""

    type: Literal["http"]
    url: str = Field(pattern=r"^https?://")
    method: Literal["POST", "PUT", "GET"] = "POST"
    form: dict[str, str] | None = Field(None, description="a form POST (Twilio)")
    json_body: dict[str, str] | None = Field(None, alias="json", description="a JSON object")
    body: str | None = Field(None, description="a plain text body (ntfy)")
    headers: dict[str, str] = {}
    username: str | None = Field(None, description="HTTP basic auth (Twilio: the account SID)")
    password: Secret | None = None
    token: Secret | None = Field(None, description="sent as Authorization: Bearer")
    timeout: Duration = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _template(self) -> "HttpChannel":
        if sum(x is not None for x in (self.form, self.json_body, self.body)) > 1:
            raise key_error("body", "give one of form, json or body")
        if (self.username is None) != (self.password is None):
            raise key_error("password", "username and password go together")
        parts: list[tuple[str, str]] = [("url", self.url)]
        parts += [(f"form.{k}", v) for k, v in (self.form or {}).items()]
        parts += [(f"json.{k}", v) for k, v in (self.json_body or {}).items()]
        parts += [(f"headers.{k}", v) for k, v in self.headers.items()]
        if self.body is not None:
            parts.append(("body", self.body))
        for where, text in parts:
            unknown = set(PLACEHOLDER.findall(text)) - FIELDS
            if unknown:
                raise key_error(
                    where, f"unknown placeholder {{{sorted(unknown)[0]}}}; one of {sorted(FIELDS)}"
                )
        return self


Channel = Annotated[EmailChannel | HttpChannel, Field(discriminator="type")]


class Person(Section):
    """Someone who can be called out; `contacts` maps a channel name to their address there."""

    name: str = Field(min_length=1, max_length=100, description="as recorded in the journal")
    contacts: dict[str, str] = Field(min_length=1)


def _clock_time(value: object) -> object:
    if isinstance(value, str) and value.strip() == "24:00":
        return time.max
    return value


class Schedule(Section):
    """When a pipeline is in force, in station local time. `to` before `from` runs over midnight;
    the day is the one the period starts on. On a date in `notify.holidays` the day is `holiday`,
    not its weekday, so a weekday schedule is off on holidays unless it lists `holiday`."""

    days: list[Day] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    from_: time = Field(time(0, 0), alias="from")
    to: time = time.max

    @field_validator("from_", "to", mode="before")
    @classmethod
    def _hhmm(cls, value: object) -> object:
        return _clock_time(value)


class Match(Section):
    """Which alarms a pipeline takes; an empty list matches everything."""

    priorities: list[Priority] = []
    rules: list[Rule] = []
    sensors: list[str] = []
    dischargers: list[str] = []
    schedule: str | None = None


class EscalationPipeline(Section):
    """A roster notified in order: first person, then after `delay` without acknowledgement
    the next; `repeat` more rounds after the last; `stop_on_clear` ends it at return to normal."""

    name: str = Field(pattern=NAME)
    match: Match = all_defaults(Match)
    roster: str
    channels: list[str] = Field([], description="default: every channel the person has")
    delay: Duration = Field(300.0, gt=0)
    repeat: int = Field(0, ge=0, le=100)
    stop_on_clear: bool = True


class Heartbeat(Section):
    """A dead-man URL (healthchecks.io style) called every `interval` while /readyz is happy."""

    url: str = Field(pattern=r"^https?://")
    interval: Duration = Field(60.0, gt=0)
    timeout: Duration = Field(10.0, gt=0)


class Notify(Section):
    channels: dict[Annotated[str, Field(pattern=NAME)], Channel] = {}
    people: dict[Annotated[str, Field(pattern=NAME)], Person] = {}
    rosters: dict[Annotated[str, Field(pattern=NAME)], list[str]] = {}
    schedules: dict[Annotated[str, Field(pattern=NAME)], Schedule] = {}
    holidays: list[date] = []
    pipelines: list[EscalationPipeline] = []
    link_base: str | None = Field(
        None, pattern=r"^https?://", description="the console's URL as a phone reaches it"
    )
    link_secret: Secret | None = Field(None, description="HMAC key that signs acknowledge links")
    link_ttl: Duration = Field(4 * 3600.0, gt=0)
    retry_initial: Duration = Field(5.0, gt=0)
    retry_max: Duration = Field(300.0, gt=0)
    heartbeat: Heartbeat | None = None

    @model_validator(mode="after")
    def _references(self) -> "Notify":
        for pid, person in self.people.items():
            for channel in person.contacts:
                if channel not in self.channels:
                    raise key_error(f"people.{pid}.contacts.{channel}", "unknown channel (notify.channels)")
        for rid, roster in self.rosters.items():
            if not roster:
                raise key_error(f"rosters.{rid}", "must name at least one person")
            for who in roster:
                if who not in self.people:
                    raise key_error(f"rosters.{rid}", f"unknown person {who!r} (notify.people)")
        for i, p in enumerate(self.pipelines):
            if p.roster not in self.rosters:
                raise key_error(f"pipelines[{i}].roster", f"unknown roster {p.roster!r} (notify.rosters)")
            for channel in p.channels:
                if channel not in self.channels:
                    raise key_error(f"pipelines[{i}].channels", f"unknown channel {channel!r}")
            for who in self.rosters[p.roster]:
                person = self.people[who]
                if p.channels and not set(p.channels) & set(person.contacts):
                    raise key_error(f"pipelines[{i}].channels", f"{who} has none of these channels")
            if p.match.schedule is not None and p.match.schedule not in self.schedules:
                raise key_error(f"pipelines[{i}].match.schedule", f"unknown schedule {p.match.schedule!r}")
        if self.pipelines and (self.link_base is None) != (self.link_secret is None):
            raise key_error("link_secret", "link_base and link_secret go together")
        return self
