"""The pumping station's config sections: setpoints, pump settings, weir, wet well.

Apart from `station.py` (which checks them against every sensor) so that `sensors.py`
can use them without an import circle.
"""

import itertools
from typing import Annotated, Any, Protocol

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from monitor.config.types import Duration, Section
from monitor.model import Kind
from monitor.units import conversion


def _quantity(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    # The expression parser (8 dataclasses, ~3 ms) is imported by a station that has
    # quantities or derived sensors, not by every config load.
    from monitor.config.expression import parse_quantity

    number, unit = parse_quantity(value)
    return {"value": number, "unit": unit}


class Quantity(Section):
    """A number with a unit, written `600 gpm` or `80 ft2`."""

    value: float
    unit: str

    def to(self, unit: str) -> float:
        scale, offset = conversion(self.unit, unit)
        return self.value * scale + offset


QuantityField = Annotated[Quantity, BeforeValidator(_quantity)]


class Setpoints(Section):
    """A wet well's elevations, in the level sensor's unit.

    `off` < `lead_on` <= `lag_on` < `high` <= `overflow`: pumps stop at `off`, the lead
    pump starts at `lead_on`, the lag pump at `lag_on`; `high` is the high-level
    alarm; `overflow` is the high-high level where the well spills (critical alarm,
    overflow record).
    """

    off: float
    lead_on: float
    lag_on: float | None = None
    high: float | None = None
    overflow: float

    @model_validator(mode="before")
    @classmethod
    def _yaml_off(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare `off:` key as the boolean false; it means the setpoint."""
        if isinstance(data, dict) and False in data:
            data = {("off" if k is False else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _ordered(self) -> "Setpoints":
        chain = [("off", self.off), ("lead_on", self.lead_on)]
        if self.lag_on is not None:
            chain.append(("lag_on", self.lag_on))
        if self.high is not None:
            chain.append(("high", self.high))
        chain.append(("overflow", self.overflow))
        for (lo_key, lo), (hi_key, hi) in itertools.pairwise(chain):
            strict = (lo_key, hi_key) not in (("lead_on", "lag_on"), ("high", "overflow"))
            if hi < lo or (strict and hi == lo):
                raise PydanticCustomError(
                    "key_error",
                    "{key}: {message}",
                    {"key": hi_key, "message": f"must be above {lo_key} ({lo})"},
                )
        return self


class PumpSettings(Section):
    """A constant-speed pump: what it moves and the limits of its duty."""

    capacity: QuantityField | None = Field(None, description="rated flow, e.g. 600 gpm")
    max_starts_per_hour: int | None = Field(None, ge=1)
    max_run: Duration | None = Field(None, gt=0, description="a run longer than this raises long_run")
    speed: str | None = Field(None, description="sensor id of the drive's speed feedback")
    amps: str | None = Field(None, description="sensor id of the motor current")


class Weir(Section):
    """An overflow weir: Q = coefficient x length x head^1.5 (cfs, ft; Francis)."""

    length: QuantityField
    coefficient: float = Field(3.33, gt=0)
    crest: float | None = Field(None, description="crest elevation in the level's unit (default: overflow)")


class WetWell(Section):
    """The station's wet well: which sensors make it up and how its events are judged."""

    level: str
    pumps: list[str] = Field(default_factory=list, description="pump sensor ids (default: all pumps)")
    inflow: str | None = Field(None, description="sensor id of the station inflow (measured or derived)")
    overflow_switch: str | None = None
    fail_to_start_delay: Duration = Field(300.0, gt=0)
    report_within: Duration = Field(7200.0, gt=0)
    weir: Weir | None = None


class StationKeys(Protocol):
    """The keys of a sensor that `check_sensor` reads (a `Sensor`)."""

    @property
    def kind(self) -> Kind: ...
    @property
    def unit(self) -> str | None: ...
    @property
    def setpoints(self) -> Setpoints | None: ...
    @property
    def pump(self) -> PumpSettings | None: ...
    @property
    def expression(self) -> str | None: ...
    @property
    def constants(self) -> dict[str, str | float]: ...


def check_sensor(sensor: StationKeys) -> list[tuple[str, str]]:
    """Per-sensor station keys: (key, message) for each problem."""
    problems: list[tuple[str, str]] = []
    kind = sensor.kind
    if sensor.setpoints is not None and kind is not Kind.LEVEL:
        problems.append(("setpoints", "only level sensors (kind: level) have setpoints"))
    if sensor.pump is not None and kind is not Kind.PUMP:
        problems.append(("pump", "only pumps (kind: pump) have pump settings"))
    if kind is Kind.DERIVED:
        if not sensor.expression:
            problems.append(("expression", "required for a derived sensor (kind: derived)"))
        if sensor.unit is None:
            problems.append(("unit", "required for a derived sensor: the unit its expression gives"))
    else:
        if sensor.expression is not None:
            problems.append(("expression", "only derived sensors (kind: derived) have an expression"))
        if sensor.constants:
            problems.append(("constants", "only derived sensors (kind: derived) have constants"))
    return problems


__all__ = ["PumpSettings", "Quantity", "Setpoints", "StationKeys", "Weir", "WetWell", "check_sensor"]
