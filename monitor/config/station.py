"""The pumping station in the config: derived sensors compiled, the wet well cross-checked.

The sections themselves (setpoints, pumps, weir, wet well) are in `station_models.py`;
`check_wet_well` and `derived_plans` check them once every sensor is known (unknown
ids, circular derivations, mixed units).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from monitor.config.sensors import Sensor
from monitor.config.station_models import PumpSettings, Quantity, Setpoints, Weir, WetWell
from monitor.model import Kind
from monitor.units import dimension

if TYPE_CHECKING:
    from monitor.config.expression import Compiled


@dataclass(frozen=True, slots=True)
class DerivedPlan:
    """A derived sensor ready to evaluate: checked tree, SI -> its unit."""

    sensor: str
    compiled: Compiled
    scale: float
    offset: float
    max_input_age: float


def derived_plans(sensors: Sequence[Sensor]) -> tuple[dict[str, DerivedPlan], list[str]]:
    """Compile every derived sensor in dependency order; problems name the key."""
    index = {s.id: i for i, s in enumerate(sensors)}
    units = {s.id: (s.kind, s.effective_unit) for s in sensors}
    problems: list[str] = []
    compiled: dict[str, DerivedPlan] = {}
    for i, s in enumerate(sensors):
        if s.kind is not Kind.DERIVED or not s.expression or s.unit is None:
            continue
        # Here, not at import: a station without derived sensors never loads the parser.
        from monitor.config.expression import ExpressionError, compile_expression, parse_quantity

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


def check_fed(derived: set[str], fed: Iterable[tuple[str, str]]) -> list[str]:
    """A derived sensor is computed; a source that also feeds it would make two series of one.
    `fed` holds (key path, sensor id) of every Modbus field and MQTT subscription."""
    return [
        f"{key}: {sensor!r} is derived (computed from its expression); no source may feed it"
        for key, sensor in fed
        if sensor in derived
    ]


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
    "check_fed",
    "check_wet_well",
    "derived_plans",
    "pump_ids",
]
