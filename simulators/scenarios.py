"""A pumping station as a pure model: what its instruments read at any moment.

No I/O and no hidden state: `Station(seed, speed).values(t)` is a pure function of
the seed, the injected scenarios and `t`, so the Modbus server, the MQTT publisher
and tests all see the same station, and a test can ask for any moment in any order.

Clock
    `t` is real (wall) seconds, e.g. `time.time()` or seconds since a test began.
    Station time runs `speed` times faster from `start`:
    ``station_time(t) = origin + (t - start) * speed`` (`origin` defaults to
    `start`), so at `speed=60` a day of station life passes in 24 minutes.
    The diurnal profile follows the UTC hour of day of station time.

Values (keys of `values(t)`, see `SENSORS` for units)
    flow        outfall flow, gpm: a diurnal profile (night low ~40 %, morning and
                evening peaks) around `mean_flow`, slow wander and white noise
    ph          around 7.2 with slow wander
    temperature around 18 degC with a small afternoon peak; degF if `temp_unit="degF"`
    oil         oil analyser, mg/L, around 12 with wander; never negative
    meter       station water-meter totalizer, whole ft3 counts of the flow
                profile, wrapping at 10**meter_digits (the register's digits)
    mill_meter  an industrial user's totalizer, `mill_share` of the flow

Scenarios (`inject(name, start, duration, **params)`; `start` and `duration`
are station seconds after the run began, so `slug@10m` starts 10 station minutes in)
    slug                  sensor ("flow" or "oil") x factor (default 8)
    ph_excursion          pH ramps to `value` (default 3.5) within `ramp` (60 s)
    temperature_excursion temperature ramps to `value` degC (default 70)
    frozen_sensor         `sensor` (default "ph") holds its value from `start`
    device_offline        `online(t)` is False: servers stop answering
    meter_rollover        `meter` (default "meter") reads modulus - `before`
                          (default 50 ft3) at `start`, so it wraps soon after;
                          applied from the beginning, so there is no jump
    meter_replacement     `meter` restarts from `reading` (default 0) at `start`
    error_value           `sensor` (default "flow") reads the device error value `value`
                          (default 3.4028235e38, FLOAT32's largest) in its own unit

Scenarios come by name (`inject`), from a spec string (`parse_spec("slug@10m+30m")`,
`"ph_excursion@1h+20m:value=3.2"`) or from a YAML/JSON file (`load_scenarios`),
a list of mappings ``{name, start, duration, ...params}`` with durations as
``90``, ``"15m"``, ``"1h30m"``.

Noise is derived by hashing (seed, sensor, station second), so it is realistic
(slow wander plus white noise) yet reproducible from the seed alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SENSORS: dict[str, str] = {
    "flow": "gpm",
    "ph": "pH",
    "temperature": "degC",
    "oil": "mg/L",
    "meter": "ft3",
    "mill_meter": "ft3",
}
SCENARIOS = (
    "slug",
    "ph_excursion",
    "temperature_excursion",
    "frozen_sensor",
    "device_offline",
    "meter_rollover",
    "meter_replacement",
    "error_value",
)
METERS = ("meter", "mill_meter")
GALLONS_PER_FT3 = 7.480519480519481
_DAY = 86400.0
# Diurnal flow: 1 + sum(a * cos(2 pi k (h - peak) / 24)); night minimum ~0.4, morning peak ~1.5.
_HARMONICS: tuple[tuple[int, float, float], ...] = ((1, 0.38, 13.0), (2, 0.22, 9.0))

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|min|s|m|h|d)")


def seconds(value: float | int | str) -> float:
    """`90`, `"90s"`, `"15m"`, `"1h30m"` -> seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip().replace(" ", "")
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration such as 90s, 15m or 1h")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One injected event, timed in station seconds after the run began."""

    name: str
    start: float
    duration: float
    params: dict[str, Any] = field(default_factory=dict)

    def active(self, elapsed: float) -> bool:
        return self.start <= elapsed < self.start + self.duration


def parse_spec(text: str) -> Scenario:
    """`name@start[+duration][:key=value,...]`, e.g. `slug@10m+30m:factor=6`."""
    match = re.fullmatch(r"\s*([a-z_]+)@([^+:]+)(?:\+([^:]+))?(?::(.*))?\s*", text)
    if not match:
        raise ValueError(f"scenario {text!r}: write name@start[+duration][:key=value,...]")
    name, start, duration, rest = match.groups()
    params: dict[str, Any] = {}
    for item in filter(None, (rest or "").split(",")):
        key, _, raw = item.partition("=")
        params[key.strip()] = _scalar(raw.strip())
    return _make(name, seconds(start), seconds(duration) if duration else None, params)


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Read a YAML or JSON list of `{name, start, duration, ...params}`."""
    text = Path(path).read_text(encoding="utf-8")
    data: Any
    if str(path).endswith(".json"):
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if isinstance(data, dict):
        data = data.get("scenarios", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of scenarios")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "name" not in item or "start" not in item:
            raise ValueError(f"{path}: scenario [{i}] needs name and start")
        rest = {k: v for k, v in item.items() if k not in ("name", "start", "duration")}
        dur = item.get("duration")
        out.append(
            _make(str(item["name"]), seconds(item["start"]), None if dur is None else seconds(dur), rest)
        )
    return out


_DEFAULT_DURATION = {
    "slug": 1800.0,
    "ph_excursion": 1200.0,
    "temperature_excursion": 1200.0,
    "frozen_sensor": 3600.0,
    "device_offline": 300.0,
    "meter_rollover": math.inf,
    "meter_replacement": math.inf,
    "error_value": 600.0,
}


def _make(name: str, start: float, duration: float | None, params: dict[str, Any]) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")
    return Scenario(name, start, _DEFAULT_DURATION[name] if duration is None else duration, params)


def _scalar(raw: str) -> Any:
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


class Station:
    """The station's instruments at any moment; see the module docstring."""

    def __init__(
        self,
        seed: int = 0,
        speed: float = 1.0,
        *,
        start: float = 0.0,
        origin: float | None = None,
        temp_unit: str = "degC",
        meter_digits: int = 8,
        mean_flow: float = 350.0,
        mill_share: float = 0.25,
        scenarios: Iterable[Scenario] = (),
    ) -> None:
        if temp_unit not in ("degC", "degF"):
            raise ValueError("temp_unit must be degC or degF")
        if not 1 <= meter_digits <= 9:
            raise ValueError("meter_digits must be 1..9 (a UINT32 register)")
        self.seed = seed
        self.speed = speed
        self.start = start
        self.origin = start if origin is None else origin
        self.temp_unit = temp_unit
        self.meter_digits = meter_digits
        self.modulus: int = 10**meter_digits
        self.mean_flow = mean_flow
        self.mill_share = mill_share
        self.scenarios: list[Scenario] = []
        for s in scenarios:
            self.add(s)

    # -- scenarios ------------------------------------------------------------

    def inject(
        self, name: str, start: float | str, duration: float | str | None = None, **params: Any
    ) -> Scenario:
        """Schedule scenario `name` at `start` station seconds (or "10m") after the run began."""
        scenario = _make(name, seconds(start), None if duration is None else seconds(duration), params)
        return self.add(scenario)

    def add(self, scenario: Scenario) -> Scenario:
        self.scenarios.append(scenario)
        return scenario

    def active(self, t: float) -> list[str]:
        """Names of scenarios in force at real time `t`."""
        el = self.elapsed(t)
        return [s.name for s in self.scenarios if s.active(el)]

    # -- clock ----------------------------------------------------------------

    def elapsed(self, t: float) -> float:
        """Station seconds since the run began."""
        return (t - self.start) * self.speed

    def station_time(self, t: float) -> float:
        return self.origin + self.elapsed(t)

    def online(self, t: float) -> bool:
        """False while a device_offline scenario is in force: servers must not answer."""
        el = self.elapsed(t)
        return not any(s.name == "device_offline" and s.active(el) for s in self.scenarios)

    # -- values ---------------------------------------------------------------

    def values(self, t: float) -> dict[str, float]:
        """Every instrument's reading at real time `t` (units in `SENSORS`)."""
        el = self.elapsed(t)
        out = {name: self._analog(name, el) for name in ("flow", "ph", "temperature", "oil")}
        for s in self.scenarios:
            if s.name == "frozen_sensor" and s.active(el):
                sensor = str(s.params.get("sensor", "ph"))
                if sensor in out:
                    out[sensor] = self._analog(sensor, s.start)
        if self.temp_unit == "degF":
            out["temperature"] = out["temperature"] * 9.0 / 5.0 + 32.0
        for s in self.scenarios:
            if s.name == "error_value" and s.active(el):
                out[str(s.params.get("sensor", "flow"))] = float(s.params.get("value", 3.4028235e38))
        out["meter"] = float(self._meter("meter", el, 1.0))
        out["mill_meter"] = float(self._meter("mill_meter", el, self.mill_share))
        return out

    def _analog(self, name: str, el: float) -> float:
        """A reading in degC for temperature, with slugs and excursions applied."""
        st = self.origin + el
        if name == "flow":
            value = self.mean_flow * self._profile(st) * (1 + 0.04 * self._wander(name, st))
            value += self.mean_flow * 0.01 * self._white(name, st)
        elif name == "ph":
            value = 7.2 + 0.15 * self._wander(name, st) + 0.02 * self._white(name, st)
        elif name == "temperature":
            hour = (st % _DAY) / 3600.0
            value = 18.0 + 1.5 * math.cos(2 * math.pi * (hour - 16.0) / 24.0)
            value += 0.4 * self._wander(name, st) + 0.05 * self._white(name, st)
        else:
            value = 12.0 + 3.0 * self._wander(name, st) + 0.5 * self._white(name, st)
        for s in self.scenarios:
            if not s.active(el):
                continue
            if s.name == "slug" and s.params.get("sensor", "flow") == name:
                value *= float(s.params.get("factor", 8.0))
            elif (s.name, name) in (("ph_excursion", "ph"), ("temperature_excursion", "temperature")):
                target = float(s.params.get("value", 3.5 if name == "ph" else 70.0))
                ramp = max(seconds(s.params.get("ramp", 60)), 1e-9)
                w = min(1.0, (el - s.start) / ramp)
                value = value + w * (target - value)
        if name == "oil":
            value = max(value, 0.0)
        return value

    def _meter(self, name: str, el: float, share: float) -> int:
        """Whole ft3 on the register: integral of the flow profile (slugs included), wrapped."""
        base = self._meter_plain(name, el, share)
        count = base
        for s in self.scenarios:
            if s.params.get("meter", "meter") != name:
                continue
            if s.name == "meter_rollover":
                at_start = self._meter_plain(name, s.start, share)
                count += (self.modulus - float(s.params.get("before", 50)) - at_start) % self.modulus
            elif s.name == "meter_replacement" and el >= s.start:
                count = base - self._meter_plain(name, s.start, share) + float(s.params.get("reading", 0))
        return math.floor(count) % self.modulus

    def _meter_plain(self, name: str, el: float, share: float) -> float:
        """The meter's volume at `el` with slugs but without meter scenarios."""
        base = self._volume(0.0, el) * share
        for s in self.scenarios:
            if s.name == "slug" and s.params.get("sensor", "flow") == "flow" and el > s.start:
                extra = float(s.params.get("factor", 8.0)) - 1.0
                base += extra * share * self._volume(s.start, min(el, s.start + s.duration))
        return base

    def _volume(self, el0: float, el1: float) -> float:
        """ft3 through the outfall between two elapsed station times (noise-free profile)."""
        if el1 <= el0:
            return 0.0
        return (self._profile_integral(self.origin + el1) - self._profile_integral(self.origin + el0)) * (
            self.mean_flow / GALLONS_PER_FT3 / 60.0
        )

    def relative_flow(self, el: float) -> float:
        """The diurnal flow profile at `el` station seconds (1.0 is the daily mean), noise-free."""
        return self._profile(self.origin + el)

    @staticmethod
    def _profile(st: float) -> float:
        hour = (st % _DAY) / 3600.0
        return 1.0 + sum(a * math.cos(2 * math.pi * k * (hour - peak) / 24.0) for k, a, peak in _HARMONICS)

    @staticmethod
    def _profile_integral(st: float) -> float:
        """Integral of `_profile` over station seconds, from 0 to `st`."""
        total = st
        for k, a, peak in _HARMONICS:
            w = 2 * math.pi * k / _DAY
            total += a / w * (math.sin(w * (st - peak * 3600.0)) - math.sin(w * (-peak * 3600.0)))
        return total

    # -- noise ----------------------------------------------------------------

    def _uniforms(self, name: str, step: int) -> tuple[float, float]:
        digest = hashlib.blake2b(f"{self.seed}:{name}:{step}".encode(), digest_size=8).digest()
        a, b = struct.unpack("<II", digest)
        return (a + 0.5) / 2**32, (b + 0.5) / 2**32

    def _white(self, name: str, st: float) -> float:
        """Standard normal noise, one draw per station second."""
        u1, u2 = self._uniforms(name, math.floor(st))
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2)

    def _wander(self, name: str, st: float, period: float = 600.0) -> float:
        """Slow drift in about [-1, 1]: smooth interpolation between 10-minute knots."""
        pos = st / period
        k = math.floor(pos)
        frac = pos - k
        a = self._uniforms(name + "~", k)[0] * 2 - 1
        b = self._uniforms(name + "~", k + 1)[0] * 2 - 1
        s = frac * frac * (3 - 2 * frac)
        return a + (b - a) * s


__all__ = ["METERS", "SCENARIOS", "SENSORS", "Scenario", "Station", "load_scenarios", "parse_spec", "seconds"]


def add_station_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every simulator front end (Modbus server, MQTT publisher) shares."""
    parser.add_argument(
        "--speed", type=float, default=1.0, help="station seconds per real second (60: a day in 24 min)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--temp-unit", choices=("degC", "degF"), default="degC")
    parser.add_argument("--meter-digits", type=int, default=8, help="meters roll over at 10^N ft3")
    parser.add_argument(
        "--scenario", action="append", default=[], help="e.g. slug@10m+30m or ph_excursion@1h:value=3"
    )
    parser.add_argument("--scenario-file", help="YAML/JSON list of {name, start, duration, ...}")


def station_from_args(args: argparse.Namespace, start: float, seed: int | None = None) -> Station:
    """The station `add_station_arguments` describes; `seed` overrides `--seed`."""
    scenarios: list[Scenario] = [parse_spec(s) for s in args.scenario]
    if args.scenario_file:
        scenarios.extend(load_scenarios(args.scenario_file))
    return Station(
        seed=args.seed if seed is None else seed,
        speed=args.speed,
        start=start,
        temp_unit=args.temp_unit,
        meter_digits=args.meter_digits,
        scenarios=scenarios,
    )
