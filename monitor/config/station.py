"""The pumping station in the config: wet-well setpoints, pumps, the wet well, derived sensors.

Kept apart from `sensors.py` so the station's keys stay together; `Sensor` carries
`setpoints`, `pump`, `expression` and `constants`, and `check_station` cross-checks
them once every sensor is known (unknown ids, circular derivations, mixed units).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from monitor.config.expression import Compiled, ExpressionError, compile_expression, parse_quantity
from monitor.config.types import Duration, Section
from monitor.model import Kind
from monitor.units import conversion, dimension

if TYPE_CHECKING:
    from monitor.config.sensors import Sensor
    from monitor.config.sources import Modbus, Mqtt


def _quantity(value: Any) -> Any:
    if isinstance(value, dict):
        return value
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
    def _ordered(self) -> Setpoints:
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


@dataclass(frozen=True, slots=True)
class DerivedPlan:
    """A derived sensor ready to evaluate: checked tree, SI -> its unit."""

    sensor: str
    compiled: Compiled
    scale: float
    offset: float
    max_input_age: float


def check_sensor(sensor: Sensor) -> list[tuple[str, str]]:
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


def derived_plans(sensors: Sequence[Sensor]) -> tuple[dict[str, DerivedPlan], list[str]]:
    """Compile every derived sensor in dependency order; problems name the key."""
    index = {s.id: i for i, s in enumerate(sensors)}
    units = {s.id: (s.kind, s.effective_unit) for s in sensors}
    problems: list[str] = []
    compiled: dict[str, DerivedPlan] = {}
    for i, s in enumerate(sensors):
        if s.kind is not Kind.DERIVED or not s.expression or s.unit is None:
            continue
        consts: dict[str, tuple[float, str]] = {}
        for name, text in s.constants.items():
            try:
                consts[name] = parse_quantity(text)
            except ValueError as exc:
                problems.append(f"sensors[{i}].constants.{name}: {exc}")
        try:
            c = compile_expression(s.expression, units, consts)
        except ExpressionError as exc:
            problems.append(f"sensors[{i}].expression: {exc}")
            continue
        if s.id in c.inputs:
            problems.append(f"sensors[{i}].expression: circular derivation: {s.id} reads itself")
            continue
        declared, scale, offset = dimension(s.unit)
        if declared != c.dim:
            problems.append(
                f"sensors[{i}].expression: gives {_unit_words(c)} which cannot be expressed in {s.unit}"
            )
            continue
        compiled[s.id] = DerivedPlan(s.id, c, 1.0 / scale, -offset / scale, s.max_input_age)
    for sid in _cycle(compiled):
        problems.append(
            f"sensors[{index[sid]}].expression: circular derivation: " + " -> ".join(_path_of(sid, compiled))
        )
        break
    return ({k: compiled[k] for k in _topological(compiled)} if not problems else compiled), problems


def _unit_words(c: Compiled) -> str:
    from monitor.config.expression import _show

    return _show(c.dim)


def _cycle(plans: Mapping[str, DerivedPlan]) -> list[str]:
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(n: str) -> bool:
        state[n] = 1
        for m in plans[n].compiled.inputs:
            if m in plans and (state.get(m) == 1 or (state.get(m) is None and visit(m))):
                found.append(n)
                return True
        state[n] = 2
        return False

    for n in plans:
        if state.get(n) is None and visit(n):
            break
    return found[-1:] if found else []


def _path_of(start: str, plans: Mapping[str, DerivedPlan]) -> list[str]:
    path = [start]
    seen = {start}
    n = start
    while True:
        nxt = next((m for m in plans[n].compiled.inputs if m in plans), None)
        if nxt is None:
            return path
        path.append(nxt)
        if nxt in seen:
            return path
        seen.add(nxt)
        n = nxt


def _topological(plans: Mapping[str, DerivedPlan]) -> list[str]:
    order: list[str] = []
    done: set[str] = set()

    def visit(n: str) -> None:
        if n in done:
            return
        done.add(n)
        for m in plans[n].compiled.inputs:
            if m in plans:
                visit(m)
        order.append(n)

    for n in plans:
        visit(n)
    return order


def check_wet_well(well: WetWell | None, sensors: Sequence[Sensor]) -> list[str]:
    """References of the `wet_well` section: the right kind of sensor for each key."""
    by_id = {s.id: (i, s) for i, s in enumerate(sensors)}
    problems: list[str] = []
    for i, s in enumerate(sensors):
        if s.pump is None:
            continue
        for key in ("speed", "amps"):
            ref = getattr(s.pump, key)
            want = Kind.SPEED if key == "speed" else Kind.CURRENT
            if ref is not None and (ref not in by_id or by_id[ref][1].kind is not want):
                problems.append(f"sensors[{i}].pump.{key}: must name a sensor of kind {want}")
    if well is None:
        return problems

    def need(key: str, ref: str, kinds: tuple[Kind, ...]) -> Sensor | None:
        found = by_id.get(ref)
        if found is None:
            problems.append(f"wet_well.{key}: unknown sensor {ref!r}")
            return None
        if found[1].kind not in kinds:
            problems.append(f"wet_well.{key}: {ref!r} is a {found[1].kind} sensor, not {' or '.join(kinds)}")
            return None
        return found[1]

    level = need("level", well.level, (Kind.LEVEL,))
    if level is not None and level.setpoints is None:
        problems.append(
            f"sensors[{by_id[well.level][0]}].setpoints: required for the wet well's level sensor"
            " (off, lead_on, overflow; lag_on and high optional)"
        )
    for j, p in enumerate(well.pumps):
        need(f"pumps[{j}]", p, (Kind.PUMP,))
    if well.inflow is not None:
        found = need("inflow", well.inflow, (Kind.FLOW, Kind.DERIVED))
        if found is not None and dimension(found.effective_unit, found.kind)[0] != dimension("gpm")[0]:
            problems.append(f"wet_well.inflow: {well.inflow!r} is in {found.effective_unit}, not a flow")
    if well.overflow_switch is not None:
        need("overflow_switch", well.overflow_switch, (Kind.STATUS,))
    if well.weir is not None:
        try:
            well.weir.length.to("ft")
        except ValueError:
            problems.append("wet_well.weir.length: must be a length such as 4 ft")
    return problems


def check_fed(derived: set[str], modbus: Modbus | None, mqtt: Mqtt | None) -> list[str]:
    """A derived sensor is computed; a source that also feeds it would make two series of one."""
    problems: list[str] = []
    if not derived:
        return problems
    for d, device in enumerate(modbus.devices if modbus is not None else []):
        for f, field in enumerate(device.fields):
            if field.sensor in derived:
                problems.append(
                    f"modbus.devices[{d}].fields[{f}].sensor: {field.sensor!r} is derived (computed from"
                    " its expression); no source may feed it"
                )
    for s, sub in enumerate(mqtt.subscriptions if mqtt is not None else []):
        if sub.sensor in derived:
            problems.append(
                f"mqtt.subscriptions[{s}].sensor: {sub.sensor!r} is derived (computed from its expression);"
                " no source may feed it"
            )
    return problems


def pump_ids(well: WetWell, sensors: Sequence[Sensor]) -> list[str]:
    """The wet well's pumps: as listed, or every pump sensor."""
    return list(well.pumps) or [s.id for s in sensors if s.kind is Kind.PUMP]


__all__ = [
    "DerivedPlan",
    "PumpSettings",
    "Quantity",
    "Setpoints",
    "Weir",
    "WetWell",
    "check_sensor",
    "check_wet_well",
    "derived_plans",
    "pump_ids",
]
