"""Sensors, their limits and slug rules, and the ordinance profile they default from."""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from monitor.config.station_models import PumpSettings, Setpoints, check_sensor
from monitor.config.types import Duration, Instant, Section, all_defaults
from monitor.model import Kind
from monitor.units import DEFAULT_UNIT, JUDGED_KINDS, UNITS, convert, physical_range

ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"
SlugMethod = Literal["sustained", "period_mean"]


def key_error(key: str, message: str) -> PydanticCustomError:
    """An error naming a key below the model that raised it (`load._format_errors` puts it in the path)."""
    return PydanticCustomError("key_error", "{key}: {message}", {"key": key, "message": message})


def _switch(value: Any) -> Any:
    """`slug: false` / `limits: false` switch a rule off; `true` keeps the defaults."""
    if value is False:
        return {"enabled": False}
    if value is True:
        return {}
    return value


class LimitsOverride(Section):
    """Per-sensor limit settings; unset fields come from the ordinance profile."""

    enabled: bool = True
    low: float | None = None
    high: float | None = None
    unit: str | None = Field(None, description="unit the limits are written in")
    deadband: float = Field(0.0, ge=0)
    on_delay: Duration = 0.0
    off_delay: Duration = 0.0
    citation: str | None = None

    @model_validator(mode="after")
    def _low_below_high(self) -> "LimitsOverride":
        if self.low is not None and self.high is not None and self.low >= self.high:
            raise key_error("high", "must be greater than limits.low")
        return self


class SlugOverride(Section):
    """Per-sensor slug settings; unset fields come from the ordinance profile."""

    enabled: bool = True
    factor: float | None = Field(None, gt=1)
    duration: Duration | None = None
    window: Duration | None = Field(None, gt=0, le=7 * 86400)
    max_sample_gap: Duration | None = Field(
        None, gt=0, description="longest silence between good samples that keeps an over run going"
    )
    warmup: Duration | None = None
    method: SlugMethod | None = Field(None, description="sustained (default) or period_mean")
    min_baseline: float | None = Field(None, gt=0, description="below this mean, not judged")
    citation: str | None = None


class ValidRange(Section):
    """What the instrument can physically report, in the sensor's unit."""

    min: float | None = None
    max: float | None = None


class Sensor(Section):
    id: str = Field(pattern=ID_PATTERN)
    kind: Kind
    unit: str | None = None
    name: str = ""
    influent: bool = Field(False, description="temperature of the treatment-works influent (40 °C)")
    substance: str | None = Field(None, description="for concentration sensors, e.g. oil")
    # Incidents (issue 16): who discharges here, and the flow that carries a concentration.
    discharger: str | None = Field(None, max_length=200, description="the discharger or account monitored")
    flow_sensor: str | None = Field(None, description="flow sensor paired with a concentration (excess mass)")
    limits: Annotated[LimitsOverride, BeforeValidator(_switch)] = all_defaults(LimitsOverride)
    slug: Annotated[SlugOverride, BeforeValidator(_switch)] = all_defaults(SlugOverride)
    stale_after: Duration | None = Field(None, gt=0)
    # A stuck instrument (fouled probe, latched input card, a PLC holding its last value):
    # good readings unchanged for longer than this raise a frozen alarm. Off unless set.
    frozen_after: Duration | None = Field(
        None, gt=0, description="good readings unchanged this long: a frozen-value alarm (off unless set)"
    )
    frozen_band: float | None = Field(
        None, ge=0, description="readings this close to a run's first count as unchanged (default 0: equal)"
    )
    valid_range: ValidRange | None = None
    # Values the device sends to mean "no reading" (e.g. -9999, 32767): bad data.
    bad_values: list[float] = Field(default_factory=list)
    # Meters (kind: meter): the totalizer register and the account it bills to.
    register_digits: int | None = Field(None, ge=1, le=18)
    multiplier: float = Field(1.0, gt=0)
    account: str | None = None
    max_rate: float | None = Field(None, gt=0, description="meter units per hour")
    settings_since: Instant | None = Field(
        None,
        description="meters: when a changed unit, register_digits, multiplier or max_rate took effect"
        " (ISO 8601 with Z or an offset); without it, the time the ledger is first opened with the change",
    )
    # The pumping station (config/station.py): a wet well's level, a pump, a derived sensor.
    setpoints: Setpoints | None = None
    pump: PumpSettings | None = None
    expression: str | None = Field(None, description="derived sensors: e.g. ps.flow + area * rate(ps.level)")
    constants: dict[str, str | float] = Field(default_factory=dict, description="e.g. {area: 80 ft2}")
    max_input_age: Duration = Field(300.0, gt=0, description="derived: inputs older than this stop it")

    @model_validator(mode="after")
    def _unit_fits_kind(self) -> "Sensor":
        for key, message in check_sensor(self):
            raise key_error(key, message)
        allowed = UNITS[self.kind]
        if self.unit is not None and self.unit not in allowed:
            if self.kind is Kind.PH:
                raise key_error("unit", "a pH sensor has no unit; remove the key")
            raise key_error("unit", f"must be one of {', '.join(allowed)} for a {self.kind} sensor")
        if self.limits.unit is not None and self.limits.unit not in allowed:
            raise key_error("limits.unit", f"must be one of {', '.join(allowed)}")
        if self.kind is not Kind.METER:
            for key in ("register_digits", "account", "max_rate", "settings_since"):
                if getattr(self, key) is not None:
                    raise key_error(key, "only meters (kind: meter) have this key")
        if self.frozen_band is not None and self.frozen_after is None:
            raise key_error("frozen_band", "needs frozen_after (the rule is off without it)")
        if self.frozen_after is not None and self.kind is Kind.METER:
            raise key_error("frozen_after", "a meter's total is judged by billing, not by this rule")
        if self.frozen_after is not None and self.kind in (Kind.PUMP, Kind.STATUS):
            raise key_error(
                "frozen_after",
                "an on/off signal holds for days by nature (a standby pump, a shut door);"
                " the pump alarms judge a pump",
            )
        if self.influent and self.kind is not Kind.TEMPERATURE:
            raise key_error("influent", "only temperature sensors can be marked influent")
        return self

    @property
    def effective_unit(self) -> str:
        return self.unit or DEFAULT_UNIT[self.kind]

    @property
    def judged_as(self) -> Kind:
        """The kind whose ordinance defaults apply: a derived sensor in gpm is judged as a flow."""
        if self.kind is not Kind.DERIVED:
            return self.kind
        unit = self.effective_unit
        for kind in JUDGED_KINDS:
            if unit in UNITS[kind]:
                return kind
        return Kind.DERIVED


class ProfileLimit(Section):
    low: float | None = None
    high: float | None = None
    unit: str | None = None
    citation: str


class ProfileSlug(Section):
    kinds: list[Kind]
    factor: float = Field(gt=1)
    duration: Duration
    window: Duration = Field(gt=0)
    max_sample_gap: Duration = Field(gt=0)
    warmup: Duration
    method: SlugMethod = "sustained"
    # Per kind, in the kind's default unit: a mean below it is not judged.
    min_baseline: dict[Kind, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    citation: str


class Profile(Section):
    """The ordinance as the software enforces it (the bundled monitor/profiles/barton-139.yaml)."""

    name: str
    limits: dict[str, ProfileLimit]
    slug: ProfileSlug
    stale_after: Duration = 300.0


FALLBACK_MIN_BASELINE = 1e-9  # a kind the profile gives no floor: only an empty baseline is not judged


@dataclass(frozen=True, slots=True)
class LimitRule:
    """Effective limits of one sensor, in `unit`; None disables that side."""

    low: float | None
    high: float | None
    unit: str
    deadband: float
    on_delay: float
    off_delay: float
    citation: str


@dataclass(frozen=True, slots=True)
class SlugRule:
    factor: float
    duration: float
    window: float
    max_sample_gap: float
    warmup: float
    citation: str
    method: SlugMethod = "sustained"
    min_baseline: float = FALLBACK_MIN_BASELINE


@dataclass(frozen=True, slots=True)
class SensorRules:
    """Everything the engine needs to judge one sensor, resolved from config and profile."""

    sensor: str
    kind: Kind
    unit: str
    limits: LimitRule | None
    slug: SlugRule | None
    stale_after: float
    valid_range: tuple[float, float]
    bad_values: tuple[float, ...] = ()
    frozen_after: float | None = None  # None: the frozen-value rule is off
    frozen_band: float = 0.0


def profile_limit(sensor: Sensor, profile: Profile) -> ProfileLimit | None:
    """The profile entry for this sensor: `kind.substance` / `kind.influent`, then `kind`."""
    qualifier = "influent" if sensor.influent else sensor.substance
    kind = sensor.judged_as
    if qualifier:
        found = profile.limits.get(f"{kind}.{qualifier}")
        if found is not None:
            return found
    return profile.limits.get(str(kind))


def _from_profile(value: float | None, given: bool, profile_unit: str, unit: str) -> float | None:
    if value is None or given or profile_unit == unit:
        return value
    try:
        return convert(value, profile_unit, unit)
    except ValueError:
        return value  # not comparable: reported by the config checks


def resolve_rules(sensor: Sensor, profile: Profile) -> SensorRules:
    """Merge a sensor's overrides onto the profile defaults for its kind."""
    given = sensor.limits.model_fields_set
    base = profile_limit(sensor, profile)
    limits: LimitRule | None = None
    if sensor.limits.enabled:
        low = sensor.limits.low if "low" in given or base is None else base.low
        high = sensor.limits.high if "high" in given or base is None else base.high
        unit = sensor.limits.unit or (base.unit if base and base.unit else None)
        if base is not None:
            # A profile figure keeps its meaning when the sensor writes its limits in
            # another unit (65 degC stays 65 degC under `limits: {unit: degF}`).
            low, high = (
                _from_profile(
                    x,
                    side in given,
                    base.unit or DEFAULT_UNIT[sensor.judged_as],
                    unit or sensor.effective_unit,
                )
                for x, side in ((low, "low"), (high, "high"))
            )
        citation = sensor.limits.citation or (base.citation if base else "station config")
        if low is not None or high is not None:
            limits = LimitRule(
                low=low,
                high=high,
                unit=unit or sensor.effective_unit,
                deadband=sensor.limits.deadband,
                on_delay=sensor.limits.on_delay,
                off_delay=sensor.limits.off_delay,
                citation=citation,
            )
    slug: SlugRule | None = None
    ps, so = profile.slug, sensor.slug
    slug_by_default = sensor.judged_as in ps.kinds
    if so.enabled and (slug_by_default or so.model_fields_set - {"enabled"}):
        slug = SlugRule(
            factor=so.factor if so.factor is not None else ps.factor,
            duration=so.duration if so.duration is not None else ps.duration,
            window=so.window if so.window is not None else ps.window,
            max_sample_gap=so.max_sample_gap if so.max_sample_gap is not None else ps.max_sample_gap,
            warmup=so.warmup if so.warmup is not None else min(ps.warmup, so.window or ps.window),
            citation=so.citation or ps.citation,
            method=so.method or ps.method,
            min_baseline=so.min_baseline if so.min_baseline is not None else _min_baseline(sensor, ps),
        )
    # The physical range is tabled in the kind's default unit; judge in the sensor's.
    lo, hi = physical_range(sensor.kind, sensor.effective_unit)
    if sensor.valid_range is not None:
        lo = sensor.valid_range.min if sensor.valid_range.min is not None else lo
        hi = sensor.valid_range.max if sensor.valid_range.max is not None else hi
    return SensorRules(
        sensor=sensor.id,
        kind=sensor.kind,
        unit=sensor.effective_unit,
        limits=limits,
        slug=slug,
        stale_after=sensor.stale_after if sensor.stale_after is not None else profile.stale_after,
        valid_range=(lo, hi),
        bad_values=tuple(sensor.bad_values),
        frozen_after=sensor.frozen_after,
        frozen_band=sensor.frozen_band or 0.0,
    )


def _min_baseline(sensor: Sensor, ps: ProfileSlug) -> float:
    """The profile's floor for the kind, converted from the kind's default unit."""
    kind = sensor.judged_as  # a derived flow takes the flow's floor
    floor = ps.min_baseline.get(kind)
    if floor is None:
        return FALLBACK_MIN_BASELINE
    return convert(floor, DEFAULT_UNIT[kind], sensor.effective_unit)
