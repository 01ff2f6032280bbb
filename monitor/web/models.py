"""Request and response bodies of the console API; they make the OpenAPI document."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from monitor.model import AlarmState, Priority, Rule

Who = Field(min_length=1, max_length=100, description="the operator's name, recorded in the journal")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AckRequest(_Body):
    by: str = Who
    note: str | None = Field(None, max_length=500)


class ShelveRequest(_Body):
    by: str = Who
    reason: str = Field(min_length=1, max_length=500)
    minutes: float | None = Field(None, gt=0, le=7 * 24 * 60, description="default: alarms.shelve_default")
    until: AwareDatetime | None = Field(None, description="instead of minutes; capped at alarms.shelve_max")


class RemoveRequest(_Body):
    by: str = Who
    reason: str = Field(min_length=1, max_length=500)


class ReturnRequest(_Body):
    by: str = Who


class AlarmOut(BaseModel):
    sensor: str
    rule: Rule
    state: AlarmState
    priority: Priority
    active: bool
    acknowledged: bool
    value: float | None
    limit: float | None
    citation: str
    message: str
    activated_at: datetime | None
    cleared_at: datetime | None
    acked_by: str | None
    acked_at: datetime | None
    ack_note: str | None
    shelved_by: str | None
    shelved_until: datetime | None
    shelve_reason: str | None
    chattering: bool
    updated_at: datetime | None


class EntryOut(BaseModel):
    id: int
    time: datetime
    sensor: str
    rule: Rule
    event: str
    state: str
    priority: str
    actor: str | None
    note: str | None
    until: datetime | None
    value: float | None
    limit: float | None
    citation: str
    message: str


class SensorOut(BaseModel):
    id: str
    name: str
    kind: str
    unit: str
    value: float | None
    quality: str
    time: datetime | None
    baseline: float | None
    slug: str = ""


class SeriesOut(BaseModel):
    sensor: str
    unit: str
    since: datetime
    until: datetime
    points: list[tuple[datetime, float]] = Field(description="bucket mean per time step, oldest first")


class StationOut(BaseModel):
    id: str
    name: str
    time: datetime
    writes_enabled: bool
    wet_well: bool = False  # the station has a wet well and pumps: the console links /station


class Problem(BaseModel):
    detail: str


def finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def jsonable(data: object) -> object:
    """Health data as strict JSON: NaN and infinities become null, keys strings."""
    if isinstance(data, float):
        return finite(data)
    if isinstance(data, Mapping):
        return {str(k): jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple, set)):
        return [jsonable(v) for v in data]
    if data is None or isinstance(data, (str, int, bool)):
        return data
    return str(data)
