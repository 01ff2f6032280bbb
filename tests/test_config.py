"""Config loading: the examples pass, each kind of mistake exits 2 naming the key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import monitor
from monitor.config import build_config, load_config, parse_duration
from monitor.config.types import Section
from monitor.errors import ConfigError
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ENV = {"MQTT_PASSWORD": "pw", "INFLUX_TOKEN": "tok", "CONSOLE_TOKEN": "console-secret-0123"}


def run_monitor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, env=env, cwd=ROOT)


def test_public_surface_is_small() -> None:
    assert sorted(monitor.__all__) == sorted(
        ["Condition", "Config", "ConfigError", "MonitorError", "Quality", "Rule", "Sample",
         "__version__", "load_config"]
    )  # fmt: skip
    for name in monitor.__all__:
        assert hasattr(monitor, name)


@pytest.mark.parametrize("name", ["minimal.yaml", "station.example.yaml"])
def test_examples_pass_check_config(name: str) -> None:
    result = run_monitor("check-config", f"config/{name}", env=EXAMPLE_ENV)
    assert result.returncode == 0, result.stderr
    assert "station ps-1" in result.stdout
    assert "§139-15 C(3)" in result.stdout


def test_effective_rules_come_from_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in EXAMPLE_ENV.items():
        monkeypatch.setenv(key, value)
    config = load_config(ROOT / "config" / "station.example.yaml")
    ph = config.rules["outfall.ph"].limits
    assert ph is not None and (ph.low, ph.high, ph.citation) == (5.0, 9.0, "§139-15 C(3)")
    assert (ph.deadband, ph.on_delay, ph.off_delay) == (0.1, 30.0, 60.0)
    temp = config.rules["outfall.temp"]
    assert temp.unit == "degF" and temp.limits is not None
    assert (temp.limits.high, temp.limits.unit) == (65.0, "degC")
    assert config.rules["influent.temp"].limits.high == 40.0  # type: ignore[union-attr]
    oil = config.rules["outfall.oil"]
    assert oil.limits is not None and oil.limits.high == 100.0 and oil.slug is None
    slug = config.rules["outfall.flow"].slug
    assert slug is not None
    assert (slug.factor, slug.duration, slug.window, slug.citation) == (5.0, 900.0, 86400.0, "§139-11")
    assert config.mqtt is not None and config.mqtt.password is not None
    assert "pw" not in repr(config.mqtt) and config.mqtt.password.get_secret_value() == "pw"


def base() -> dict[str, object]:
    return {"station": {"id": "ps-1"}, "sensors": [{"id": "f", "kind": "flow", "unit": "gpm"}]}


def with_sensors(*sensors: dict[str, object], **sections: object) -> dict[str, object]:
    return {"station": {"id": "ps-1"}, "sensors": list(sensors), **sections}


PLC = {"name": "plc", "host": "127.0.0.1", "port": 502}

BROKEN: list[tuple[str, dict[str, object], str]] = [
    ("typo in a key", with_sensors({"id": "a", "kind": "ph", "limts": {"low": 4}}),
     "sensors[0].limts: unknown key (did you mean 'limits'?)"),
    ("typo in a nested section's key",
     with_sensors({"id": "lvl", "kind": "level", "unit": "ft",
                   "setpoints": {"off": 2, "lead_on": 4, "lag_on": 5, "high": 6, "overflow": 7}},
                  wet_well={"level": "lvl", "weir": {"lenght": "2 ft"}}),
     "wet_well.weir.lenght: unknown key (did you mean 'length'?)"),
    ("low above high", with_sensors({"id": "a", "kind": "flow"}, {"id": "b", "kind": "ph"},
                                    {"id": "c", "kind": "flow"},
                                    {"id": "d", "kind": "concentration", "limits": {"low": 9, "high": 3}}),
     "sensors[3].limits.high: must be greater than limits.low"),
    ("low above the profile's high", with_sensors({"id": "a", "kind": "ph", "limits": {"low": 9.5}}),
     "sensors[0].limits.low: effective limits low 9.5 >= high 9.0"),
    ("duplicate sensor id", with_sensors({"id": "a", "kind": "ph"}, {"id": "a", "kind": "flow"}),
     "sensors[1].id: duplicate sensor id 'a'"),
    ("unit on a pH sensor", with_sensors({"id": "a", "kind": "ph", "unit": "mg/L"}),
     "sensors[0].unit: a pH sensor has no unit"),
    ("wrong temperature unit", with_sensors({"id": "a", "kind": "temperature", "unit": "K"}),
     "sensors[0].unit: must be one of degC, degF"),
    ("unknown kind", with_sensors({"id": "a", "kind": "pressure"}), "sensors[0].kind: must be"),
    ("source feeds an unknown sensor",
     with_sensors({"id": "flow", "kind": "flow"},
                  modbus={"devices": [{**PLC, "fields": [{"sensor": "flwo", "address": 0}]}]}),
     "modbus.devices[0].fields[0].sensor: unknown sensor 'flwo' (did you mean 'flow'?)"),
    ("mqtt feeds an unknown sensor",
     with_sensors({"id": "flow", "kind": "flow"},
                  mqtt={"subscriptions": [{"topic": "a/b", "sensor": "nope"}]}),
     "mqtt.subscriptions[0].sensor: unknown sensor 'nope'"),
    ("secret written in the YAML", {**base(), "mqtt": {"password": "hunter2"}},
     "mqtt.password: secrets are not stored in the YAML"),
    ("secret from an unset variable", {**base(), "influx": {"url": "http://x", "org": "o", "bucket": "b",
                                                            "token": "${NOT_SET_ANYWHERE_42}"}},
     "influx.token: environment variable NOT_SET_ANYWHERE_42 is not set"),
    ("bad duration", with_sensors({"id": "a", "kind": "flow", "slug": {"duration": "15 parsecs"}}),
     "sensors[0].slug.duration: '15 parsecs' is not a duration"),
    ("slug factor not above 1", with_sensors({"id": "a", "kind": "flow", "slug": {"factor": 0.5}}),
     "sensors[0].slug.factor: must be greater than 1"),
    ("missing station", {"sensors": [{"id": "a", "kind": "flow"}]}, "station: required"),
    ("modbus scale zero",
     with_sensors({"id": "a", "kind": "flow"},
                  modbus={"devices": [{**PLC, "fields": [{"sensor": "a", "address": 0, "scale": 0}]}]}),
     "modbus.devices[0].fields[0].scale: must be greater than 0"),
    ("BIT without bit",
     with_sensors({"id": "a", "kind": "flow"},
                  modbus={"devices": [{**PLC, "fields": [{"sensor": "a", "address": 0, "type": "BIT"}]}]}),
     "modbus.devices[0].fields[0].bit: required for type BIT"),
    ("TCP device without host",
     with_sensors({"id": "a", "kind": "flow"},
                  modbus={"devices": [{"name": "plc", "fields": [{"sensor": "a", "address": 0}]}]}),
     "modbus.devices[0].host: required for a TCP device"),
    ("influx v2 without bucket", {**base(), "influx": {"url": "http://x", "org": "o"}},
     "influx.bucket: required for api: v2"),
    ("meter account not in billing",
     with_sensors({"id": "m", "kind": "meter", "account": "acme"},
                  billing={"rate_per_kcf": 4, "accounts": [{"id": "other"}]}),
     "sensors[0].account: unknown account 'acme'"),
    # Retired keys: an old file fails naming the new key; nothing old is accepted silently.
    ("old slug max_gap", with_sensors({"id": "a", "kind": "flow", "slug": {"max_gap": "5m"}}),
     "sensors[0].slug.max_gap: unknown key (renamed: did you mean 'max_sample_gap'?)"),
    ("old modbus max_gap",
     with_sensors({"id": "a", "kind": "flow"},
                  modbus={"devices": [{**PLC, "max_gap": 10, "fields": [{"sensor": "a", "address": 0}]}]}),
     "modbus.devices[0].max_gap: unknown key (renamed: did you mean 'max_register_gap'?)"),
    ("old billing max_gap", {**base(), "billing": {"rate_per_kcf": 4, "max_gap": "1d"}},
     "billing.max_gap: unknown key (renamed: did you mean 'max_reading_gap'?)"),
    ("stale_after on a modbus device",
     with_sensors({"id": "a", "kind": "flow"},
                  modbus={"devices": [{**PLC, "stale_after": "5m",
                                       "fields": [{"sensor": "a", "address": 0}]}]}),
     "modbus.devices[0].stale_after: unknown key (removed, it never did anything: set stale_after on each"),
    ("stale_after on mqtt", {**base(), "mqtt": {"stale_after": "5m"}},
     "mqtt.stale_after: unknown key (removed, it never did anything"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "expected"), [(r, e) for _, r, e in BROKEN], ids=[n for n, _, _ in BROKEN])
def test_broken_config_names_the_key(raw: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_config(raw)
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_a_key_valid_only_elsewhere_is_not_offered_as_its_own_fix() -> None:
    """`kind` is a sensor's key, not a weir's: the hint used to read "did you mean 'kind'?"."""
    level: dict[str, object] = {
        "id": "lvl",
        "kind": "level",
        "unit": "ft",
        "setpoints": {"off": 2, "lead_on": 4, "lag_on": 5, "high": 6, "overflow": 7},
    }
    with pytest.raises(ConfigError) as info:
        build_config(with_sensors(level, wet_well={"level": "lvl", "weir": {"kind": "v", "length": "2 ft"}}))
    assert info.value.problems == ["wet_well.weir.kind: unknown key"]


def test_every_problem_is_reported_at_once() -> None:
    raw = with_sensors(
        {"id": "a", "kind": "ph", "limts": {}},
        {"id": "b", "kind": "flowx"},
        {"id": "b", "kind": "flow"},
    )
    with pytest.raises(ConfigError) as info:
        build_config(raw)
    keys = {p.split(":")[0] for p in info.value.problems}
    assert {"sensors[0].limts", "sensors[1].kind", "sensors[2].id"} <= keys


@pytest.mark.parametrize(("name", "raw", "expected"), BROKEN[:12], ids=[n for n, _, _ in BROKEN[:12]])
def test_check_config_exits_2_without_traceback(
    tmp_path: Path, name: str, raw: dict[str, object], expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, (name, result.stdout, result.stderr)
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("station: {id: ps-1\nsensors: [\n")
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2
    assert "line " in result.stderr and "invalid YAML" in result.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = run_monitor("check-config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2 and "cannot read" in result.stderr


def test_secret_from_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-console-token\n")
    raw = {**base(), "console": {"token": {"file": str(secret)}}}
    config = build_config(raw)
    assert config.console.token is not None
    assert config.console.token.get_secret_value() == "s3cret-console-token"
    assert "s3cret-console-token" not in repr(config)


def test_config_is_frozen() -> None:
    config = build_config(base())
    with pytest.raises(Exception, match="frozen"):
        config.station.id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), (90, 90.0), ("15m", 900.0), ("1h30m", 5400.0), ("500ms", 0.5),
                          ("24h", 86400.0), ("2d", 172800.0)]
)  # fmt: skip
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_config_schema_is_json_schema() -> None:
    result = run_monitor("config-schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert {"station", "sensors", "modbus", "mqtt", "influx"} <= set(schema["properties"])
    assert schema["properties"]["profile"]["type"] == "string"


def test_station_timezone_is_an_iana_zone() -> None:
    base = {"sensors": [{"id": "a", "kind": "ph"}]}
    cfg = build_config({**base, "station": {"id": "s", "timezone": "America/New_York"}})
    assert cfg.station.zone.key == "America/New_York"
    assert build_config({**base, "station": {"id": "s"}}).station.timezone == "UTC"
    with pytest.raises(ConfigError) as err:
        build_config({**base, "station": {"id": "s", "timezone": "Mars/Olympus"}})
    assert any(p.startswith("station.timezone:") for p in err.value.problems)


def test_example_copied_alone_to_etc_passes_check_config(tmp_path: Path) -> None:
    """The operator's first step: the example copied to /etc/station-monitor/ on its own
    (its profile used to resolve beside the file, where nothing was)."""
    etc = tmp_path / "etc" / "station-monitor"
    etc.mkdir(parents=True)
    (etc / "station.yaml").write_text((ROOT / "config" / "station.example.yaml").read_text())
    result = run_monitor("check-config", str(etc / "station.yaml"), env=EXAMPLE_ENV)
    assert result.returncode == 0, result.stderr


def test_there_is_one_ordinance_profile_and_monitor_profile_prints_it(tmp_path: Path) -> None:
    from monitor.config.load import DEFAULT_PROFILE

    result = run_monitor("profile")
    assert result.returncode == 0 and result.stdout == DEFAULT_PROFILE.read_text()
    copies = [p for p in ROOT.glob("config/**/*.yaml") if "citation:" in p.read_text()]
    assert copies == [], f"a second copy of the ordinance profile: {copies}"
    # What the example config's comment tells an operator to do works as written.
    (tmp_path / "ordinance.yaml").write_text(result.stdout)
    raw = {**base(), "profile": "ordinance.yaml"}
    assert build_config(raw, base_dir=tmp_path).profile.slug.max_sample_gap == 300.0


def test_an_old_profile_key_names_the_new_one(tmp_path: Path) -> None:
    from monitor.config.load import DEFAULT_PROFILE

    text = DEFAULT_PROFILE.read_text().replace("max_sample_gap:", "max_gap:")
    (tmp_path / "old.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        build_config({**base(), "profile": "old.yaml"}, base_dir=tmp_path)
    expected = "profile.slug.max_gap: unknown key (renamed: did you mean 'max_sample_gap'?)"
    assert expected in info.value.problems


def test_config_reference_lists_every_key_of_every_section() -> None:
    from monitor.commands.config_reference import config_schema

    result = run_monitor("config-schema", "--markdown")
    assert result.returncode == 0, result.stderr
    schema = config_schema()
    # Profile* describe the profile file, not the station config (its `profile:` is a path).
    for name in ("(top level)", *(d for d in schema["$defs"] if not d.startswith("Profile"))):
        model = schema if name == "(top level)" else schema["$defs"][name]
        for key in model.get("properties", {}):
            assert f"| `{key}` |" in result.stdout, (name, key)
    assert "| `max_register_gap` | integer | `10` |" in result.stdout
    assert "`sensors[].slug` below" in result.stdout


def _sections() -> list[type[Section]]:
    found: list[type[Section]] = []
    todo: list[type[Section]] = [Section]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_a_section_default_is_what_validating_nothing_gives() -> None:
    """`all_defaults` skips validation: a default section must equal `cls()` in every way a
    caller can see (a later after-validator that filled a default in would break this)."""
    import monitor.config.fleet  # noqa: F401  (its FleetConfig has a section default)

    defaults = [
        field.default
        for cls in _sections()
        for field in cls.model_fields.values()
        if isinstance(field.default, Section)
    ]
    assert {type(d).__name__ for d in defaults} >= {"Store", "Console", "Alarms", "Incidents", "Fleet",
                                                     "LimitsOverride", "SlugOverride", "Match"}  # fmt: skip
    for default in defaults:
        validated = type(default)()
        assert default == validated
        assert repr(default) == repr(validated)
        assert default.model_fields_set == validated.model_fields_set == set()
        assert default.model_dump() == validated.model_dump()
