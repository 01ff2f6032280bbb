"""Output sections: InfluxDB writer and outbox, local series store, console, alarms, billing."""

import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from monitor.config.sensors import key_error
from monitor.config.types import Duration, Secret, Section
from monitor.model import Priority, Rule


class Influx(Section):
    """InfluxDB 2.x/3.x (`api: v2`: org, bucket, token) or 1.x (`api: v1`: database).

    `username`/`password` are HTTP basic auth with either API (InfluxDB 1.x, a vmauth or
    reverse proxy in front of a v2 endpoint); `token` is `Authorization: Token`."""

    url: str = Field(pattern=r"^https?://")
    api: Literal["v2", "v1"] = "v2"
    org: str | None = None
    bucket: str | None = None
    token: Secret | None = None
    database: str | None = None
    retention_policy: str | None = None
    username: str | None = None
    password: Secret | None = None
    verify_tls: bool = True
    ca_file: Path | None = None
    timeout: Duration = Field(10.0, gt=0)
    batch_size: int = Field(5000, ge=1, le=100_000)
    flush_interval: Duration = Field(1.0, gt=0)
    outbox_max_bytes: int = Field(1 << 30, ge=1 << 16)
    max_backoff: Duration = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _api_keys(self) -> "Influx":
        # neither writer sends userinfo, and a URL is printed in many places: say where they go
        if "@" in urllib.parse.urlsplit(self.url).netloc:
            raise key_error(
                "url", "credentials in the URL are never sent: set username and password (or token)"
            )
        if self.api == "v2":
            for key in ("org", "bucket"):
                if getattr(self, key) is None:
                    raise key_error(key, "required for api: v2")
        elif self.database is None:
            raise key_error("database", "required for api: v1")
        # one Authorization header carries one of them: the other would be dropped unseen
        if self.password is not None and self.username is None:
            raise key_error("password", "needs username (HTTP basic auth)")
        if self.token is not None and self.username is not None:
            raise key_error(
                "token", "set token or username and password, not both (one Authorization header)"
            )
        return self


class Store(Section):
    """The local series store the console reads (and the only store without InfluxDB)."""

    retention: Duration = Field(30 * 86400.0, gt=0)
    free_space_floor: int = Field(
        256 << 20,
        ge=0,
        description="bytes free on the state disk below which a low-space alarm warns (0: off)",
    )
    lock_wait: Duration = Field(
        30.0,
        gt=0,
        le=3600,
        description="how long the start-up check (and `monitor meters`) waits for a state file another"
        " process holds locked (a backup, `monitor outbox drain`) before refusing: exit 2, nothing moved",
    )


MIN_TOKEN = 16  # characters; a short bearer token can be guessed over the network


class Console(Section):
    host: str = Field("127.0.0.1", description="127.0.0.1 keeps the console on the gateway")
    port: int = Field(8080, ge=0, lt=65536)
    token: Secret | None = Field(
        None, description=f"bearer token for ack, shelve, return to service (at least {MIN_TOKEN} characters)"
    )
    enabled: bool = True
    allowed_hosts: list[str] = Field(
        [], description="Host header names the console answers besides localhost and `host` (DNS rebinding)"
    )
    max_body: int = Field(64 * 1024, ge=1024, le=16 << 20, description="largest request body, bytes")
    max_live_clients: int = Field(16, ge=1, le=1000, description="open live-update streams; more get 503")

    @model_validator(mode="after")
    def _token_length(self) -> "Console":
        if self.token is not None and len(self.token.get_secret_value()) < MIN_TOKEN:
            raise key_error("token", f"must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 16`)")
        return self


class Webhook(Section):
    url: str = Field(pattern=r"^https?://")
    timeout: Duration = Field(5.0, gt=0)
    retries: int = Field(3, ge=0)
    token: Secret | None = None


class PriorityOverride(Section):
    sensor: str
    rule: Rule
    priority: Priority


class Alarms(Section):
    priorities: dict[Rule, Priority] = {
        Rule.SLUG: Priority.HIGH,
        Rule.HIGH: Priority.HIGH,
        Rule.LOW: Priority.HIGH,
        Rule.STALE: Priority.MEDIUM,
        Rule.FROZEN: Priority.MEDIUM,  # an instrument alarm, as stale
        Rule.COMM_LOSS: Priority.MEDIUM,
        Rule.METER: Priority.MEDIUM,
        Rule.OUTBOX: Priority.HIGH,
        Rule.DISK_FULL: Priority.CRITICAL,
        Rule.DISK_LOW: Priority.MEDIUM,
        Rule.NOTIFY: Priority.HIGH,
        Rule.STATE: Priority.HIGH,
        Rule.INCIDENTS: Priority.HIGH,  # records a notice of violation rests on are not kept
        Rule.OVERFLOW: Priority.CRITICAL,  # a discharge the Town must report
        Rule.FAIL_TO_START: Priority.CRITICAL,
        Rule.HIGH_LEVEL: Priority.HIGH,
        Rule.PUMP_STARTS: Priority.MEDIUM,
        Rule.LONG_RUN: Priority.MEDIUM,
    }
    overrides: list[PriorityOverride] = []
    shelve_default: Duration = Field(3600.0, gt=0)
    shelve_max: Duration = Field(8 * 3600.0, gt=0)
    chatter_count: int = Field(5, ge=2)
    chatter_window: Duration = Field(600.0, gt=0)
    renotify_interval: Duration = Field(900.0, ge=0, description="0 turns re-notification off")
    flood_count: int = Field(10, ge=1)
    flood_window: Duration = Field(600.0, gt=0)
    webhook: Webhook | None = None

    def priority_of(self, sensor: str, rule: Rule) -> Priority:
        """A per-sensor override, else the rule's priority, else medium."""
        for o in self.overrides:
            if o.sensor == sensor and o.rule == rule:
                return o.priority
        return self.priorities.get(rule, Priority.MEDIUM)

    @model_validator(mode="after")
    def _shelve(self) -> "Alarms":
        if self.shelve_default > self.shelve_max:
            raise key_error("shelve_default", "must not exceed shelve_max")
        return self


class Designation(Section):
    """The Superintendent's determination, which overrides the flow-based classification:
    the BOD/SS equivalence of §139-16 H(1)(b), toxic wastes (H(2)), the §139-15 toxic,
    21-category and SPDES prongs, none of which a water meter can judge."""

    classification: Literal["industrial user", "major contributing industry", "not industrial"]
    reason: str = Field(min_length=1, max_length=500, description="kept in the export")


class Account(Section):
    id: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    name: str = ""
    class_: str = Field("residential", alias="class")
    billing_units: int = Field(1, ge=1)
    workdays_per_week: int = Field(5, ge=1, le=7)
    residential: bool | None = Field(None, description="default: class == residential")
    governmental: bool = Field(False, description="§139-16 H(1): never an industrial user by flow")
    sic_division: Literal["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"] | None = Field(
        None, description="SIC Manual division; §139-16 H(1) names A, B, D, E and I"
    )
    designation: Designation | None = None


class Billing(Section):
    rate_per_kcf: Decimal = Field(ge=0, description="dollars per 1,000 ft3 (§139-3)")
    minimum_charge: Decimal | None = Field(None, ge=0, description="per billing unit per quarter")
    year_start_month: int = Field(1, ge=1, le=12)
    max_reading_gap: Duration = Field(
        86400.0, gt=0, description="a longer gap between accepted meter readings marks a quarter estimated"
    )
    system_flow_gpd: Decimal | None = Field(
        None, gt=0, description="§139-15 5 % prong: the municipal system's average daily flow, gal/day"
    )
    system_meter: str | None = Field(
        None, description="§139-15 5 % prong: a kind: meter sensor on the plant influent (not billed)"
    )
    accounts: list[Account] = []

    @model_validator(mode="after")
    def _one_system_flow(self) -> "Billing":
        if self.system_flow_gpd is not None and self.system_meter is not None:
            raise key_error("system_meter", "set system_flow_gpd or system_meter, not both")
        return self
