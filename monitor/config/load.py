"""YAML -> validated `Config`, with every problem reported as `path.to.key: message`."""

import difflib
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import Field, ValidationError, field_validator

from monitor.config.clocks import two_clocks
from monitor.config.incidents import Incidents, check_pairings
from monitor.config.outputs import Alarms, Console, Store
from monitor.config.sensors import Profile, Sensor, SensorRules, key_error, profile_limit, resolve_rules
from monitor.config.station import DerivedPlan, check_fed, check_wet_well, derived_plans
from monitor.config.types import LazySection, Section, SectionsJsonSchema, all_defaults
from monitor.errors import ConfigError
from monitor.model import Kind
from monitor.units import conversion, convert

if TYPE_CHECKING:  # what the lazy sections hold, for the type checker
    from monitor.config.notify import Notify
    from monitor.config.outputs import Billing, Influx
    from monitor.config.sources import Modbus, Mqtt
    from monitor.config.station_models import WetWell

    ModbusSection = Modbus | None
    MqttSection = Mqtt | None
    InfluxSection = Influx | None
    BillingSection = Billing | None
    NotifySection = Notify | None
    WetWellSection = WetWell | None
else:  # imported and compiled only for a config that has them (types.LazySection)
    ModbusSection = Annotated[Any, LazySection("monitor.config.sources", "Modbus")]
    MqttSection = Annotated[Any, LazySection("monitor.config.sources", "Mqtt")]
    InfluxSection = Annotated[Any, LazySection("monitor.config.outputs", "Influx")]
    BillingSection = Annotated[Any, LazySection("monitor.config.outputs", "Billing")]
    NotifySection = Annotated[Any, LazySection("monitor.config.notify", "Notify")]
    WetWellSection = Annotated[Any, LazySection("monitor.config.station_models", "WetWell")]

DEFAULT_PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "barton-139.yaml"


class Station(Section):
    id: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    name: str = ""
    # The Town's clock: every human-facing date (billing quarters, incident due dates,
    # callout schedules, reports) is cut in this IANA zone; event times stay UTC.
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{value!r} is not an IANA time zone such as America/New_York") from exc
        return value

    @property
    def zone(self) -> ZoneInfo:
        """The station's local time zone."""
        return ZoneInfo(self.timezone)


class Config(Section):
    """One station's config, validated and frozen; `rules` holds each sensor's effective rules."""

    station: Station
    profile: Profile
    state_dir: Path = Path("state")
    sensors: list[Sensor] = Field(min_length=1)
    modbus: ModbusSection = None
    mqtt: MqttSection = None
    influx: InfluxSection = None
    store: Store = all_defaults(Store)
    console: Console = all_defaults(Console)
    alarms: Alarms = all_defaults(Alarms)
    billing: BillingSection = None
    incidents: Incidents = all_defaults(Incidents)
    notify: NotifySection = None  # callout: people, rosters, pipelines (monitor/callout)
    wet_well: WetWellSection = None  # the pumping station (monitor/station)

    @cached_property
    def rules(self) -> dict[str, SensorRules]:
        return {s.id: resolve_rules(s, self.profile) for s in self.sensors}

    @cached_property
    def derived(self) -> dict[str, DerivedPlan]:
        """Derived sensors, compiled and in dependency order (checked when loading)."""
        return derived_plans(self.sensors)[0]

    @property
    def has_station(self) -> bool:
        """Whether the pumping station's parts (monitor/station) have anything to do: derived
        sensors, a wet well or pumps. Here so a replay without them never imports them."""
        pumps = any(s.kind is Kind.PUMP for s in self.sensors)
        return bool(self.derived) or self.wet_well is not None or pumps

    def sensor(self, sensor_id: str) -> Sensor:
        for s in self.sensors:
            if s.id == sensor_id:
                return s
        raise KeyError(sensor_id)


def config_json_schema() -> dict[str, Any]:
    """`Config`'s JSON Schema, its lazy sections shown as their models (types.LazySection)."""
    return Config.model_json_schema(by_alias=True, schema_generator=SectionsJsonSchema)


def load_config(path: str | Path) -> Config:
    """Read, validate and cross-check a station config; raises ConfigError listing every problem."""
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(["(top level): must be a mapping with station and sensors"], str(path))
    return build_config(raw, base_dir=path.parent, source=str(path))


def build_config(raw: dict[str, Any], base_dir: Path = Path("."), source: str = "") -> Config:
    """Validate an already-parsed mapping (the demo builds its config this way)."""
    data = dict(raw)
    problems: list[str] = []
    profile_ref = data.get("profile")
    profile_path = DEFAULT_PROFILE
    if isinstance(profile_ref, str):
        profile_path = (base_dir / profile_ref).resolve()
    elif profile_ref is not None:
        problems.append("profile: must be the path of an ordinance profile file")
    try:
        profile_raw = _read_yaml(profile_path)
        data["profile"] = Profile.model_validate(profile_raw)
    except ConfigError as exc:
        problems.extend(f"profile: {p}" for p in exc.problems)
    except ValidationError as exc:
        problems.extend(f"profile.{p}" for p in _format_errors(exc))
    if isinstance(data.get("state_dir"), str) and not Path(data["state_dir"]).is_absolute():
        data["state_dir"] = str((base_dir / data["state_dir"]).resolve())
    config: Config | None = None
    if not problems:
        try:
            config = Config.model_validate(data)
        except ValidationError as exc:
            problems.extend(_format_errors(exc))
    problems.extend(_cross_check(raw))
    if config is not None and not problems:
        problems.extend(_check_rules(config))
        problems.extend(derived_plans(config.sensors)[1])
        problems.extend(check_wet_well(config.wet_well, config.sensors))
        derived = {s.id for s in config.sensors if s.kind is Kind.DERIVED}
        fed = [
            (f"modbus.devices[{d}].fields[{f}].sensor", field.sensor)
            for d, device in enumerate(config.modbus.devices if config.modbus else [])
            for f, field in enumerate(device.fields)
        ] + [
            (f"mqtt.subscriptions[{s}].sensor", sub.sensor)
            for s, sub in enumerate(config.mqtt.subscriptions if config.mqtt else [])
        ]
        problems.extend(check_fed(derived, fed))
        problems.extend(two_clocks(config.modbus, config.mqtt, config.sensors))
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)), source)
    assert config is not None
    return config


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"(file): cannot read {path}: {exc.strerror}"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"(file): {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8"], str(path)
        ) from None
    try:
        return parse_yaml(text, str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{where}: invalid YAML: {problem}"], str(path)) from None


# libyaml's parser when PyYAML was built with it (the wheels are): the same documents, nodes
# and marks as the pure-Python one at a fraction of the CPU. Its error messages say less
# ("found character that cannot start any token", not which: a tab), so a file it refuses
# is parsed again by the pure-Python one, whose message the user gets. It is not the same
# about tabs: libyaml takes one as a separator (`high:\t80`, before a comment, in a flow
# list) where the pure-Python parser, which read configs before, refuses the file; a text
# with a tab anywhere is left to the pure-Python parser (rare, and then as before).
_FAST: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str, source: str = "", loader: Any = _FAST) -> Any:
    """`yaml.safe_load`, parsed once: the node tree is checked for duplicate keys, then
    turned into Python objects (composing and loading separately parsed the text twice)."""
    if loader is not yaml.SafeLoader and "\t" in text:
        loader = yaml.SafeLoader  # libyaml would accept tabs the pure-Python parser refuses
    parser = loader(text)
    try:
        node = parser.get_single_node()
        duplicates = duplicate_keys(node)
        if duplicates:
            raise ConfigError(duplicates, source)
        return None if node is None else parser.construct_document(node)
    except yaml.YAMLError:
        if loader is yaml.SafeLoader:
            raise
    finally:
        parser.dispose()
    return parse_yaml(text, source, yaml.SafeLoader)


def duplicate_keys(node: yaml.Node | None, path: str = "") -> list[str]:
    """Every key written twice in one mapping, at any level: YAML keeps the last one
    silently, so a second `sensors:` block or `kind:` twice would replace the first."""
    problems: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            here = f"{path}.{name}" if path else name
            line = key.start_mark.line + 1
            if name in seen and name != "<<":
                problems.append(f"{here}: duplicate key on line {line} (first on line {seen[name]})")
            else:
                seen[name] = line
            problems.extend(duplicate_keys(value, here))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems.extend(duplicate_keys(item, f"{path}[{i}]"))
    return problems


def _path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(top level)"


def _format_errors(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        msg = err["msg"]
        kind = err["type"]
        if kind == "key_error":
            ctx = err.get("ctx") or {}
            loc = [*loc, *str(ctx["key"]).split(".")]
            msg = str(ctx["message"])
        elif kind == "extra_forbidden":
            msg = "unknown key" + _suggest(exc, loc)
        elif kind == "missing":
            msg = "required"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        msg = msg.replace("Input should be", "must be")
        lines.append(f"{_path(loc)}: {msg}")
    return lines


# Keys that were renamed or removed: an old file fails with the new name, never silently.
# (the mapping the key sits in, old key) -> hint.
RETIRED_KEYS: dict[tuple[str, str], str] = {
    ("slug", "max_gap"): "renamed: did you mean 'max_sample_gap'?",
    ("devices", "max_gap"): "renamed: did you mean 'max_register_gap'?",
    ("billing", "max_gap"): "renamed: did you mean 'max_reading_gap'?",
    ("devices", "stale_after"): "removed, it never did anything: set stale_after on each sensor",
    ("mqtt", "stale_after"): "removed, it never did anything: set stale_after on each sensor",
}


def _suggest(exc: ValidationError, loc: list[int | str]) -> str:
    """`did you mean 'limits'?` for a misspelt key, from the model's own field names."""
    key = loc[-1] if loc else ""
    if not isinstance(key, str):
        return ""
    parent = next((p for p in reversed(loc[:-1]) if isinstance(p, str)), "")
    retired = RETIRED_KEYS.get((parent, key))
    if retired is not None:
        return f" ({retired})"
    # The keys of the mapping the misspelt one sits in; where the schema cannot tell (a
    # union it cannot resolve), any key of the file's schema but the misspelt key itself: a
    # key valid elsewhere (`kind` under `wet_well.weir`) must not be offered back as its fix.
    names = _keys_at(loc[:-1]) or [k for k in _known_keys() if k != key]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _keys_at(path: list[int | str]) -> list[str]:
    """The keys the schema allows at `path` (e.g. ['wet_well', 'weir']), [] if unknown."""
    schema = config_json_schema()
    defs: dict[str, Any] = schema.get("$defs", {})

    def expand(node: Any) -> list[dict[str, Any]]:
        if not isinstance(node, dict):
            return []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return expand(defs.get(ref.removeprefix("#/$defs/")))
        out = [node]
        for combinator in ("anyOf", "oneOf", "allOf"):
            for option in node.get(combinator, []):
                out.extend(expand(option))
        return out

    nodes = expand(schema)
    for part in path:
        following: list[dict[str, Any]] = []
        for node in nodes:
            if isinstance(part, int):
                following.extend(expand(node.get("items")))
            elif part in node.get("properties", {}):
                following.extend(expand(node["properties"][part]))
            elif isinstance(node.get("additionalProperties"), dict):
                following.extend(expand(node["additionalProperties"]))
        nodes = following
    return sorted({k for node in nodes for k in node.get("properties", {})})


def _known_keys() -> list[str]:
    names: set[str] = set()

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            props = schema.get("properties")
            if isinstance(props, dict):
                names.update(props)
            for value in schema.values():
                walk(value)
        elif isinstance(schema, list):
            for value in schema:
                walk(value)

    walk(config_json_schema())
    return sorted(names)


def _items(raw: dict[str, Any], key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    value = raw.get(key)
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict):
                yield i, item


def _cross_check(raw: dict[str, Any]) -> list[str]:
    """References between sections, checked on the raw mapping so they report
    even when another part of the file failed validation."""
    problems: list[str] = []
    ids = [s.get("id") for _, s in _items(raw, "sensors")]
    counts = Counter(i for i in ids if isinstance(i, str))
    seen: set[str] = set()
    for i, sensor in _items(raw, "sensors"):
        sid = sensor.get("id")
        if isinstance(sid, str) and counts[sid] > 1:
            if sid in seen:
                problems.append(f"sensors[{i}].id: duplicate sensor id {sid!r}")
            seen.add(sid)
    known = set(counts)
    modbus = raw.get("modbus")
    if isinstance(modbus, dict):
        names: Counter[str] = Counter()
        for d, device in _items(modbus, "devices"):
            name = device.get("name")
            if isinstance(name, str):
                names[name] += 1
                if names[name] == 2:
                    problems.append(f"modbus.devices[{d}].name: duplicate device name {name!r}")
            for f, field in _items(device, "fields"):
                sid = field.get("sensor")
                if isinstance(sid, str) and sid not in known:
                    problems.append(
                        f"modbus.devices[{d}].fields[{f}].sensor: unknown sensor {sid!r}" + _close(sid, known)
                    )
    mqtt = raw.get("mqtt")
    if isinstance(mqtt, dict):
        for s, sub in _items(mqtt, "subscriptions"):
            sid = sub.get("sensor")
            if isinstance(sid, str) and "{" not in sid and sid not in known:
                problems.append(
                    f"mqtt.subscriptions[{s}].sensor: unknown sensor {sid!r}" + _close(sid, known)
                )
    billing = raw.get("billing")
    accounts = {a.get("id") for _, a in _items(billing, "accounts")} if isinstance(billing, dict) else set()
    for i, sensor in _items(raw, "sensors"):
        account = sensor.get("account")
        if isinstance(account, str) and isinstance(billing, dict) and account not in accounts:
            problems.append(f"sensors[{i}].account: unknown account {account!r} (billing.accounts)")
    return problems


def _close(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_rules(config: Config) -> list[str]:
    """Effective rules after merging the profile: limits in a convertible unit, low < high."""
    problems: list[str] = []
    for i, sensor in enumerate(config.sensors):
        rules = config.rules[sensor.id]
        lim = rules.limits
        if lim is not None:
            try:
                conversion(rules.unit, lim.unit)
            except ValueError:
                problems.append(f"sensors[{i}].limits.unit: cannot compare {rules.unit} with {lim.unit}")
            problems.extend(_range_silences(i, sensor, rules))
            if lim.low is not None and lim.high is not None and lim.low >= lim.high:
                base = profile_limit(sensor, config.profile)
                side = "low" if "low" in sensor.limits.model_fields_set else "high"
                problems.append(
                    f"sensors[{i}].limits.{side}: effective limits low {lim.low} >= high {lim.high}"
                    + (f" (the other side comes from the profile, {base.citation})" if base else "")
                )
        problems.extend(_wide_band(i, rules))
        if rules.slug is not None and rules.slug.warmup > rules.slug.window:
            problems.append(f"sensors[{i}].slug.warmup: must not exceed slug.window")
        billing = config.billing
        # The plant influent meter (billing.system_meter) is measured, not billed.
        billed = billing is not None and sensor.id != billing.system_meter
        if billed and sensor.kind is Kind.METER and sensor.account is None:
            problems.append(f"sensors[{i}].account: required for a meter when billing is configured")
    problems.extend(_frozen_polls(config))
    system = config.billing.system_meter if config.billing is not None else None
    if system is not None and system not in {s.id for s in config.sensors if s.kind is Kind.METER}:
        problems.append(f"billing.system_meter: {system!r} is not a sensor of kind: meter")
    # The two keys it reads, not `model_dump()`: that built Sensor's serializer (and its
    # validator) just for this, ~2.5 ms of every load.
    pairs: list[tuple[int, dict[str, Any], Kind | None]] = [
        (i, {"id": s.id, "flow_sensor": s.flow_sensor}, s.kind) for i, s in enumerate(config.sensors)
    ]
    problems.extend(check_pairings(pairs))
    return problems


def _frozen_polls(config: Config) -> list[str]:
    """`frozen_after` no longer than the poll interval of the Modbus device that feeds the
    sensor: the second poll reading the same as the first is "unchanged for longer" and
    raises it, on a steady healthy instrument."""
    index = {s.id: i for i, s in enumerate(config.sensors)}
    out = []
    for device in config.modbus.devices if config.modbus else []:
        for field in device.fields:
            i = index.get(field.sensor)
            after = None if i is None else config.sensors[i].frozen_after
            if after is not None and after <= device.poll_interval:
                out.append(
                    f"sensors[{i}].frozen_after: {after:g} s is not longer than the poll interval"
                    f" ({device.poll_interval:g} s) of modbus device {device.name}: a few polls"
                    " reading the same would raise it; set hours, as long as the instrument"
                    " can honestly hold one value"
                )
    return out


def _wide_band(i: int, rules: SensorRules) -> list[str]:
    """A `frozen_band` as wide as the span between the limits (or, without both, the valid
    range): a reading could cross from one limit to the other and count as unchanged, so a
    healthy instrument is "frozen" and a frozen alarm says "unchanged" through a violation."""
    band, unit = rules.frozen_band, rules.unit
    if band <= 0:
        return []
    lim = rules.limits
    if lim is not None and lim.low is not None and lim.high is not None:
        try:
            low, high = convert(lim.low, lim.unit, unit), convert(lim.high, lim.unit, unit)
        except ValueError:
            return []  # not comparable: reported above
        if band >= high - low:
            return [
                f"sensors[{i}].frozen_band: {band:g} {unit} is as wide as (or wider than) the low"
                f" limit {low:g} to the high limit {high:g} {unit}; a reading crossing both would"
                " count as unchanged"
            ]
        return []
    lo, hi = rules.valid_range
    if band >= hi - lo:
        return [
            f"sensors[{i}].frozen_band: {band:g} {unit} is as wide as (or wider than) the valid"
            f" range {lo:g}..{hi:g} {unit}; every reading would count as unchanged"
        ]
    return []


def _range_silences(i: int, sensor: Sensor, rules: SensorRules) -> list[str]:
    """A reading outside `valid_range` is bad data and never reaches a limit rule, so a
    range that stops at or short of a limit silences that side for good."""
    lim = rules.limits
    if lim is None or sensor.valid_range is None:
        return []
    try:
        low, high = (None if x is None else convert(x, lim.unit, rules.unit) for x in (lim.low, lim.high))
    except ValueError:
        return []  # not comparable: reported above
    vlo, vhi = rules.valid_range
    unit = rules.unit
    out = []
    if high is not None and sensor.valid_range.max is not None and vhi <= high:
        out.append(
            f"sensors[{i}].valid_range.max: {vhi:g} {unit} is not above the high limit {high:g} {unit}"
            f" ({lim.citation}); readings over it would be bad data and never alarm"
        )
    if low is not None and sensor.valid_range.min is not None and vlo >= low:
        out.append(
            f"sensors[{i}].valid_range.min: {vlo:g} {unit} is not below the low limit {low:g} {unit}"
            f" ({lim.citation}); readings under it would be bad data and never alarm"
        )
    return out


__all__ = ["Config", "Station", "build_config", "key_error", "load_config"]
