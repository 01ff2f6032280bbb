"""`monitor check-config [--config] FILE`: validate, then show what the daemon will enforce."""

from __future__ import annotations

import argparse

from monitor.commands import add_config_argument, config_path, load_config_or_exit
from monitor.config import Config, Store, redact_url
from monitor.config.sensors import Sensor, SensorRules
from monitor.config.station import pump_ids
from monitor.model import Kind

HELP = "validate a station config and print the effective rules (exit 2 on errors)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser, positional=True)


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(config_path(args), args.env_file)
    print(summary(config))
    return 0


def _num(x: float) -> str:
    return f"{x:g}"


def _dur(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def describe_limits(rules: SensorRules) -> str:
    lim = rules.limits
    if lim is None:
        return "no limits"
    unit = "" if lim.unit == "pH" else f" {lim.unit}"
    if lim.low is not None and lim.high is not None:
        text = f"{_num(lim.low)}–{_num(lim.high)}{unit}"
    elif lim.high is not None:
        text = f"> {_num(lim.high)}{unit}"
    else:
        assert lim.low is not None
        text = f"< {_num(lim.low)}{unit}"
    extras = []
    if lim.deadband:
        extras.append(f"deadband {_num(lim.deadband)}")
    if lim.on_delay:
        extras.append(f"on-delay {_dur(lim.on_delay)}")
    if lim.off_delay:
        extras.append(f"off-delay {_dur(lim.off_delay)}")
    more = f", {', '.join(extras)}" if extras else ""
    return f"alarm {text}{more} [{lim.citation}]"


def describe_slug(rules: SensorRules) -> str:
    slug = rules.slug
    if slug is None:
        return "no slug rule"
    what = "every sample" if slug.method == "sustained" else "the mean"
    return (
        f"slug > {_num(slug.factor)}x {_dur(slug.window)} average for > {_dur(slug.duration)}"
        f" ({slug.method}: {what}; warm-up {_dur(slug.warmup)};"
        f" not judged below {_num(slug.min_baseline)} {rules.unit}) [{slug.citation}]"
    )


def describe_station(sensor: Sensor) -> str | None:
    """The pumping-station kinds, in the words of a lift-station operator."""
    u = sensor.effective_unit
    if sensor.kind is Kind.LEVEL:
        sp = sensor.setpoints
        if sp is None:
            return "level, no setpoints"
        parts = [f"pumps stop at {_num(sp.off)} {u}", f"lead on {_num(sp.lead_on)} {u}"]
        if sp.lag_on is not None:
            parts.append(f"lag on {_num(sp.lag_on)} {u}")
        if sp.high is not None:
            parts.append(f"high level alarm {_num(sp.high)} {u}")
        parts.append(f"overflow (critical) {_num(sp.overflow)} {u}")
        return f"wet well {sensor.id}: " + ", ".join(parts)
    if sensor.kind is Kind.PUMP:
        p = sensor.pump
        if p is None:
            return "pump run feedback (0/1); no duty alarms"
        parts = []
        if p.capacity is not None:
            parts.append(f"pump {_num(p.capacity.value)} {p.capacity.unit}")
        if p.max_starts_per_hour is not None:
            parts.append(f"alarm > {p.max_starts_per_hour} starts/h")
        if p.max_run is not None:
            parts.append(f"run > {_dur(p.max_run)}")
        for key in ("speed", "amps"):
            if getattr(p, key):
                parts.append(f"{key} from {getattr(p, key)}")
        return ", ".join(parts) or "pump run feedback (0/1)"
    if sensor.kind is Kind.STATUS:
        return "on/off signal (0/1)"
    if sensor.kind is Kind.RAIN:
        return f"rain in {u} per interval"
    return None


def describe_wet_well(config: Config) -> list[str]:
    well = config.wet_well
    if well is None:
        return []
    pumps = ", ".join(pump_ids(well, config.sensors)) or "none"
    if well.weir is not None:
        volume = (
            f"weir {_num(well.weir.length.value)} {well.weir.length.unit}, C {_num(well.weir.coefficient)}"
        )
    elif well.inflow is not None:
        volume = f"inflow {well.inflow} above the running pumps' capacity"
    else:
        volume = "no estimate (configure a weir or an inflow)"
    return [
        f"wet well: level {well.level}, pumps {pumps}; fail to start after {_dur(well.fail_to_start_delay)}"
        f" above lead_on with no pump running; overflow report within {_dur(well.report_within)}"
        f" ({config.station.timezone}); volume from {volume}"
    ]


def summary(config: Config) -> str:
    lines = [
        f"station {config.station.id}" + (f" ({config.station.name})" if config.station.name else ""),
        f"profile {config.profile.name}",
        f"state   {config.state_dir}",
        f"{len(config.sensors)} sensor(s):",
    ]
    width = max(len(s.id) for s in config.sensors)
    for sensor in config.sensors:
        rules = config.rules[sensor.id]
        unit = "" if rules.unit == "pH" else rules.unit
        head = f"  {sensor.id:<{width}}  {sensor.kind:<13} {unit:<5}"
        if sensor.kind == "meter":
            digits = f"{sensor.register_digits} digits" if sensor.register_digits else "no rollover"
            lines.append(f"{head} meter x{_num(sensor.multiplier)}, {digits}, account {sensor.account}")
            continue
        stale = f"stale after {_dur(rules.stale_after)}"
        station = describe_station(sensor)
        if station is not None:
            lines.append(f"{head} {station}; {stale}")
            continue
        lines.append(f"{head} {describe_limits(rules)}; {describe_slug(rules)}; {stale}")
        if sensor.expression:
            lines.append(f"  {'':<{width}}  derived = {sensor.expression}")
    lines.extend(describe_wet_well(config))
    lines.append("sources:")
    if config.modbus and config.modbus.devices:
        for dev in config.modbus.devices:
            where = f"{dev.host}:{dev.port}" if dev.transport == "tcp" else f"{dev.port} @ {dev.baudrate}"
            lines.append(
                f"  modbus {dev.name} {dev.transport} {where} unit {dev.device_id}: "
                f"{len(dev.fields)} field(s) every {_dur(dev.poll_interval)}"
            )
    if config.mqtt and config.mqtt.subscriptions:
        m = config.mqtt
        for sub in m.subscriptions:
            lines.append(f"  mqtt {m.host}:{m.port} {sub.topic} -> {sub.sensor} ({sub.format})")
    if not (config.modbus and config.modbus.devices) and not (config.mqtt and config.mqtt.subscriptions):
        lines.append("  none (replay only)")
    if config.influx:
        target = config.influx.bucket if config.influx.api == "v2" else config.influx.database
        lines.append(f"influx  {config.influx.api} {redact_url(config.influx.url)} -> {target}")
    else:
        lines.append("influx  not configured: series go to the local store only")
    if config.store.lock_wait != Store().lock_wait:
        wait = _dur(config.store.lock_wait)
        lines.append(f"state   waits {wait} for a locked state file, then refuses to start")
    if config.console.enabled:
        write = "token set" if config.console.token else "no token: read-only"
        lines.append(f"console http://{config.console.host}:{config.console.port}/ ({write})")
        if config.console.host in ("0.0.0.0", "::") and not config.console.allowed_hosts:
            lines.append(
                "        answers only for localhost: list the names operators type in console.allowed_hosts"
            )
    if config.billing:
        lines.append(
            f"billing ${config.billing.rate_per_kcf} per 1,000 ft3, {len(config.billing.accounts)} account(s)"
        )
    return "\n".join(lines)
