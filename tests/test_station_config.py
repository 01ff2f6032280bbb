"""The station's config: new kinds and units, setpoints, pumps, the wet well, derived sensors.

Every mistake is a config error naming the key (exit 2 from the CLI); the ordinance
profile is untouched by the new kinds.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config import build_config, load_config
from monitor.errors import ConfigError
from monitor.model import Kind
from monitor.units import convert, physical_range
from tests.cli import run_monitor

ROOT = Path(__file__).resolve().parent.parent

BASE: dict[str, Any] = {
    "station": {"id": "ps-9"},
    "sensors": [
        {
            "id": "ps.level",
            "kind": "level",
            "unit": "ft",
            "setpoints": {"off": 2, "lead_on": 5, "lag_on": 6, "high": 8, "overflow": 9},
        },
        {"id": "ps.pump1", "kind": "pump", "pump": {"capacity": "600 gpm", "max_starts_per_hour": 6}},
        {"id": "ps.flow", "kind": "flow", "unit": "gpm"},
        {"id": "ps.oil", "kind": "concentration", "unit": "mg/L"},
        {
            "id": "ps.inflow",
            "kind": "derived",
            "unit": "gpm",
            "expression": "ps.flow + area * rate(ps.level, 60s)",
            "constants": {"area": "80 ft2"},
        },
    ],
    "wet_well": {"level": "ps.level", "inflow": "ps.inflow"},
}


def with_changes(**sensor_changes: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    for sid, change in sensor_changes.items():
        for s in raw["sensors"]:
            if s["id"] == sid.replace("_", "."):
                s.update(change)
    return raw


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_config(raw)
    return info.value.problems


def add(raw: dict[str, Any], sensor: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    raw["sensors"].append(sensor)
    return raw


def test_a_station_loads_and_derived_sensors_are_judged_as_their_unit() -> None:
    config = build_config(BASE)
    inflow = config.sensor("ps.inflow")
    assert inflow.judged_as is Kind.FLOW
    # A derived flow takes the slug rule of a flow from the profile, like a measured one.
    assert config.rules["ps.inflow"].slug is not None
    raw = with_changes(ps_inflow={"slug": False})
    assert build_config(raw).rules["ps.inflow"].slug is None
    plan = config.derived["ps.inflow"]
    assert plan.compiled.inputs == ("ps.flow", "ps.level")
    # SI (m3/s) -> gpm
    assert plan.scale == pytest.approx(convert(1.0, "m3/h", "gpm") * 3600.0)


def test_the_example_station_config_loads() -> None:
    config = load_config(ROOT / "config" / "pump-station.yaml")
    assert config.wet_well is not None
    assert [s.id for s in config.sensors if s.kind is Kind.PUMP] == ["ps.pump1", "ps.pump2"]
    assert "ps.inflow" in config.derived
    assert config.rules["ps.inflow"].slug is not None


def test_missing_setpoints_name_the_key() -> None:
    raw = with_changes(ps_level={"setpoints": None})
    assert problems(raw) == [
        "sensors[0].setpoints: required for the wet well's level sensor (off, lead_on, overflow;"
        " lag_on and high optional)"
    ]
    raw = with_changes(ps_level={"setpoints": {"off": 2, "overflow": 9}})
    assert problems(raw) == ["sensors[0].setpoints.lead_on: required"]


def test_setpoints_out_of_order_name_the_key() -> None:
    raw = with_changes(ps_level={"setpoints": {"off": 2, "lead_on": 5, "lag_on": 4, "overflow": 9}})
    assert problems(raw) == ["sensors[0].setpoints.lag_on: must be above lead_on (5.0)"]


def test_yaml_off_key_is_the_setpoint(tmp_path: Path) -> None:
    # YAML 1.1 reads a bare `off:` as false; the loader takes it as the `off` setpoint.
    path = tmp_path / "c.yaml"
    path.write_text(
        "station: {id: s}\nsensors:\n  - id: l\n    kind: level\n"
        "    setpoints: {off: 1, lead_on: 2, overflow: 4}\n",
        encoding="utf-8",
    )
    setpoints = load_config(path).sensor("l").setpoints
    assert setpoints is not None and setpoints.off == 1.0


def test_expression_with_mixed_units_is_refused() -> None:
    raw = add(BASE, {"id": "x", "kind": "derived", "unit": "gpm", "expression": "ps.flow + ps.oil"})
    assert problems(raw) == ["sensors[5].expression: mixed units: cannot add a flow and a concentration"]


def test_expression_that_does_not_give_its_unit_is_refused() -> None:
    raw = add(BASE, {"id": "x", "kind": "derived", "unit": "gpm", "expression": "ps.level * 2"})
    assert problems(raw) == ["sensors[5].expression: gives a length which cannot be expressed in gpm"]


def test_mass_loading_converts_mg_per_l_times_mgd_to_lb_per_day() -> None:
    raw = add(BASE, {"id": "load", "kind": "derived", "unit": "lb/d", "expression": "ps.oil * ps.flow"})
    plan = build_config(raw).derived["load"]
    # 1 mg/L x 1 MGD = 8.345 lb/d: the 8.34 of the operator's formula is the unit conversion.
    si = convert(1.0, "mg/L", "ppm") * 1e-3 * convert(1.0, "MGD", "gpm") * convert(1.0, "gpm", "m3/h") / 3600
    assert si * plan.scale == pytest.approx(8.345, rel=1e-3)


def test_unknown_sensor_in_an_expression_is_refused_with_a_suggestion() -> None:
    raw = add(BASE, {"id": "x", "kind": "derived", "unit": "gpm", "expression": "ps.flw * 1"})
    assert problems(raw) == ["sensors[5].expression: unknown sensor 'ps.flw' (did you mean 'ps.flow'?)"]


def test_circular_derivation_is_refused() -> None:
    raw = add(BASE, {"id": "a", "kind": "derived", "unit": "gpm", "expression": "b + ps.flow"})
    raw = add(raw, {"id": "b", "kind": "derived", "unit": "gpm", "expression": "a * 2"})
    assert problems(raw) == ["sensors[5].expression: circular derivation: a -> b -> a"]
    raw = add(BASE, {"id": "c", "kind": "derived", "unit": "gpm", "expression": "c + ps.flow"})
    assert problems(raw) == ["sensors[5].expression: circular derivation: c reads itself"]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('id')", "is not allowed"),
        ("__import__('os')", "unknown function '__import__'"),
        ("ps.flow.__class__", "unknown sensor 'ps.flow.__class__'"),
        ("[ps.flow][0]", "is not allowed"),
        ("ps.flow ** 2", "is not allowed"),
        ("mean(ps.flow)", "mean() needs a window"),
        ("rate(ps.level, 5h)", "window must be more than 0 and at most 1h"),
        ("running(ps.flow) * ps.flow", "is a flow sensor, not a pump"),
        ("ps.flow +", "not a valid expression"),
        ("ps.flow / 0", "division by the constant 0"),
    ],
)
def test_expressions_outside_the_grammar_are_refused(expression: str, message: str) -> None:
    raw = add(BASE, {"id": "x", "kind": "derived", "unit": "gpm", "expression": expression})
    found = problems(raw)
    assert len(found) == 1 and found[0].startswith("sensors[5].expression: ") and message in found[0], found


def test_derived_sensor_needs_an_expression_and_a_unit() -> None:
    assert problems(add(BASE, {"id": "x", "kind": "derived", "unit": "gpm"})) == [
        "sensors[5].expression: required for a derived sensor (kind: derived)"
    ]
    assert problems(add(BASE, {"id": "x", "kind": "derived", "expression": "ps.flow"})) == [
        "sensors[5].unit: required for a derived sensor: the unit its expression gives"
    ]


def test_station_keys_on_the_wrong_kind_are_refused() -> None:
    raw = with_changes(ps_flow={"setpoints": {"off": 1, "lead_on": 2, "overflow": 3}})
    assert problems(raw) == ["sensors[2].setpoints: only level sensors (kind: level) have setpoints"]
    raw = with_changes(ps_flow={"pump": {"max_run": "1h"}})
    assert problems(raw) == ["sensors[2].pump: only pumps (kind: pump) have pump settings"]
    raw = with_changes(ps_flow={"expression": "ps.oil"})
    assert problems(raw) == ["sensors[2].expression: only derived sensors (kind: derived) have an expression"]


def test_wet_well_references_are_checked() -> None:
    raw = copy.deepcopy(BASE)
    raw["wet_well"] = {
        "level": "ps.flow",
        "pumps": ["ps.pump2"],
        "inflow": "ps.oil",
        "overflow_switch": "ps.level",
    }
    assert problems(raw) == [
        "wet_well.level: 'ps.flow' is a flow sensor, not level",
        "wet_well.pumps[0]: unknown sensor 'ps.pump2'",
        "wet_well.inflow: 'ps.oil' is a concentration sensor, not flow or derived",
        "wet_well.overflow_switch: 'ps.level' is a level sensor, not status",
    ]
    raw = with_changes(ps_pump1={"pump": {"capacity": "600 parsecs"}})
    assert problems(raw) == ["sensors[1].pump.capacity: unknown unit 'parsecs'"]


@pytest.mark.parametrize(
    ("kind", "unit", "bad"),
    [
        ("level", "in", 20000.0),
        ("pump", "on/off", 2.0),
        ("status", None, -1.0),
        ("rain", "mm", 600.0),
        ("conductivity", "µS/cm", -5.0),
        ("turbidity", "NTU", 20000.0),
        ("gas", "%LEL", 101.0),
        ("gas", "ppm", -1.0),
        ("flow", "MGD", -0.1),
        ("concentration", "µg/L", -1.0),
        ("concentration", "ppm", 2e6),
    ],
)
def test_each_new_kind_and_unit_loads_with_a_plausible_range(kind: str, unit: str | None, bad: float) -> None:
    raw = add(BASE, {"id": "x", "kind": kind, **({"unit": unit} if unit else {})})
    config = build_config(raw)
    lo, hi = config.rules["x"].valid_range
    assert not lo <= bad <= hi
    assert physical_range(Kind(kind), config.rules["x"].unit) == (lo, hi)


def test_gas_ppm_and_percent_lel_do_not_convert() -> None:
    raw = add(BASE, {"id": "x", "kind": "gas", "unit": "ppm", "limits": {"high": 10, "unit": "%LEL"}})
    assert problems(raw) == ["sensors[5].limits.unit: cannot compare ppm with %LEL"]


def test_a_unit_that_does_not_fit_the_kind_is_refused() -> None:
    raw = add(BASE, {"id": "x", "kind": "turbidity", "unit": "mg/L"})
    assert problems(raw) == ["sensors[5].unit: must be one of NTU for a turbidity sensor"]


def test_check_config_explains_the_station(tmp_path: Path) -> None:
    out = run_monitor("check-config", str(ROOT / "config" / "pump-station.yaml"), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "wet well ps.level: pumps stop at 2 ft, lead on 5 ft, lag on 6.5 ft" in text
    assert "pump 500 gpm, alarm > 8 starts/h, run > 2h" in text
    assert "derived = ps.flow + area * rate(ps.level, 60s)" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "station: {id: s}\nsensors:\n  - {id: a, kind: derived, unit: gpm, expression: b + 1}\n",
        encoding="utf-8",
    )
    out = run_monitor("check-config", str(bad))
    assert out.returncode == 2
    assert "sensors[0].expression: unknown sensor 'b'" in out.stderr


def test_the_docs_quote_the_example_station_config() -> None:
    section = (ROOT / "docs" / "station.md").read_text(encoding="utf-8")
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "config" / "pump-station.yaml").read_text(encoding="utf-8")
    snippet = section.split("```yaml\n")[2].split("```", 1)[0]
    sensors = yaml.safe_load(snippet)
    raw = add(BASE, {"id": "mill.oil", "kind": "concentration"})
    raw = add(raw, {"id": "mill.flow", "kind": "flow"})
    raw["sensors"] = [s for s in raw["sensors"] if s["id"] != "ps.inflow"] + sensors
    assert set(build_config(raw).derived) == {"ps.inflow", "mill.oil_load", "ps.lead_flow"}


def test_pumps_report_refuses_bad_times_and_says_when_there_is_no_state(tmp_path: Path) -> None:
    raw = copy.deepcopy(BASE)
    raw["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")

    def report(*args: str) -> subprocess.CompletedProcess[str]:
        return run_monitor("pumps", "report", "--config", str(path), *args, cwd=ROOT)

    out = report("--start", "2026-01-01T00:00:00Z", "--end", "2026-01-02T00:00:00Z", "--format", "json")
    assert out.returncode == 1 and "no station state" in out.stderr and "monitor replay" in out.stderr
    out = report("--start", "2026-01-01T00:00:00", "--end", "2026-01-02T00:00:00Z")
    assert out.returncode == 2 and "has no zone" in out.stderr
    out = report("--start", "2026-01-02T00:00:00Z", "--end", "2026-01-01T00:00:00Z")
    assert out.returncode == 2 and "--end must be after --start" in out.stderr


def test_no_source_may_feed_a_derived_sensor() -> None:
    raw = copy.deepcopy(BASE)
    field = {"sensor": "ps.inflow", "register": "holding", "address": 0, "type": "FLOAT32"}
    raw["modbus"] = {"devices": [{"name": "plc", "host": "127.0.0.1", "fields": [field]}]}
    raw["mqtt"] = {"host": "127.0.0.1", "subscriptions": [{"topic": "x/inflow", "sensor": "ps.inflow"}]}
    assert problems(raw) == [
        "modbus.devices[0].fields[0].sensor: 'ps.inflow' is derived (computed from its expression);"
        " no source may feed it",
        "mqtt.subscriptions[0].sensor: 'ps.inflow' is derived (computed from its expression);"
        " no source may feed it",
    ]
