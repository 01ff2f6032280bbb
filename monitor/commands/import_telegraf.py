"""`monitor import-telegraf FILE.conf`: a Telegraf `[[inputs.modbus]]` map -> our YAML.

Request-style configs (`configuration_type = "request"`) carry over one to one:
types, byte orders, registers, addresses (Telegraf's are 0-based protocol
addresses too), scales, bits and string lengths. Each `slave_id` becomes a device;
each field becomes a sensor `<device>.<field name>` whose kind is guessed from its
name (flow, ph, temp, oil, meter/total); a name that says nothing gets a kind with
every rule switched off and a TODO, so nothing alarms until someone decides.
Omitted fields are skipped. The result passes `monitor check-config` as printed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from monitor.errors import ConfigError

HELP = "convert a Telegraf [[inputs.modbus]] request-style config to station YAML"

_KINDS: tuple[tuple[str, str, str | None, str], ...] = (
    # (pattern in the field name, kind, unit, extra keys)
    (r"flow", "flow", "gpm", ""),
    (r"(^|[_.-])ph($|[_.-])", "ph", None, ""),
    (r"temp", "temperature", "degC", ""),
    (r"oil", "concentration", "mg/L", ", substance: oil"),
    (r"meter|total|volume|counter", "meter", "ft3", ""),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="Telegraf config (TOML) with [[inputs.modbus]] sections")
    parser.add_argument("-o", "--output", help="write the YAML here instead of stdout")
    parser.add_argument("--station-id", default="ps-1", help="station id for the generated config")


def run(args: argparse.Namespace) -> int:
    try:
        text, warnings = convert(Path(args.file).read_text(encoding="utf-8"), station_id=args.station_id)
    except OSError as exc:
        print(f"import-telegraf: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"import-telegraf: {args.file}:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"import-telegraf: {warning}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", text.strip()).strip("_") or "device"


def _guess(field_name: str) -> tuple[str, str]:
    """(kind and unit keys, trailing comment) for a sensor named like `field_name`."""
    lowered = field_name.lower()
    for pattern, kind, unit, extra in _KINDS:
        if re.search(pattern, lowered):
            unit_key = f", unit: {unit}" if unit else ""
            return f"kind: {kind}{unit_key}{extra}", "  # guessed from the name; check kind and unit"
    return (
        "kind: concentration, unit: mg/L, limits: false, slug: false",
        "  # TODO: kind unknown; no rules until you set kind, unit and limits",
    )


def _endpoint(plugin: dict[str, Any], where: str) -> list[str]:
    controller = str(plugin.get("controller", "tcp://127.0.0.1:502"))
    url = urlparse(controller)
    if url.scheme in ("tcp", ""):
        host = url.hostname or "127.0.0.1"
        return [f"host: {host}", f"port: {url.port or 502}"]
    if url.scheme == "file":
        lines = ["transport: rtu", f"port: {url.path}"]
        serial = (
            ("baud_rate", "baudrate"),
            ("parity", "parity"),
            ("stop_bits", "stopbits"),
            ("data_bits", "bytesize"),
        )
        for src, dst in serial:
            if src in plugin:
                value = plugin[src]
                lines.append(f"{dst}: {value}" if not isinstance(value, str) else f'{dst}: "{value}"')
        mode = str(plugin.get("transmission_mode", "RTU")).upper()
        if mode not in ("RTU", "AUTO"):
            raise ConfigError([f"{where}.transmission_mode: {mode} is not supported (RTU or TCP only)"])
        return lines
    raise ConfigError([f"{where}.controller: {controller!r} must be tcp://host:port or file:///dev/ttyX"])


def convert(text: str, station_id: str = "ps-1") -> tuple[str, list[str]]:
    """Telegraf TOML -> (station YAML, warnings); raises ConfigError for what cannot map."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"(file): not valid TOML: {exc}"]) from None
    plugins = data.get("inputs", {}).get("modbus", [])
    if not plugins:
        raise ConfigError(["(file): no [[inputs.modbus]] section"])
    warnings: list[str] = []
    problems: list[str] = []
    sensors: list[str] = []
    devices: list[str] = []
    seen_sensors: set[str] = set()
    for p, plugin in enumerate(plugins):
        where = f"inputs.modbus[{p}]"
        style = plugin.get("configuration_type", "register")
        if style != "request":
            problems.append(f"{where}.configuration_type: only request-style maps convert (found {style!r})")
            continue
        try:
            endpoint = _endpoint(plugin, where)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        base = _name(str(plugin.get("name", f"device{p + 1}")))
        by_unit: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        for r, request in enumerate(plugin.get("request", [])):
            unit = int(request.get("slave_id", plugin.get("slave_id", 1)))
            for f in request.get("fields", []):
                by_unit.setdefault(unit, []).append((request, f))
            if request.get("tags"):
                warnings.append(f"{where}.request[{r}].tags: tags are not carried over")
        workarounds = plugin.get("workarounds", {})
        for unit, entries in by_unit.items():
            name = base if len(by_unit) == 1 else f"{base}-{unit}"
            default_order = str(entries[0][0].get("byte_order", "ABCD"))
            lines = [f"    - name: {name}", *(f"      {x}" for x in endpoint), f"      device_id: {unit}"]
            interval = plugin.get("interval", data.get("agent", {}).get("interval"))
            if interval is not None:
                lines.append(f"      poll_interval: {interval}")
            if "timeout" in plugin:
                lines.append(f"      timeout: {plugin['timeout']}")
            lines.append(f"      byte_order: {default_order}")
            if "busy_retries" in plugin:
                lines.append(f"      busy_retries: {int(plugin['busy_retries'])}")
            if "busy_retries_wait" in plugin:
                lines.append(f"      busy_pause: {plugin['busy_retries_wait']}")
            if workarounds.get("close_connection_after_gather"):
                lines.append("      close_after_cycle: true")
            if "pause_between_requests" in workarounds:
                lines.append(f"      pause: {workarounds['pause_between_requests']}")
            lines.append("      fields:")
            for request, f in entries:
                if f.get("omit"):
                    continue
                register = str(request.get("register", "holding"))
                sensor = f"{name}.{_name(str(f.get('name', 'field')))}"
                if f.get("type") == "STRING":
                    warnings.append(f"{sensor}: STRING fields are text, not readings; skipped")
                    continue
                if sensor in seen_sensors:
                    problems.append(f"{where}: field {f.get('name')!r} appears twice for unit {unit}")
                    continue
                seen_sensors.add(sensor)
                kind, comment = _guess(str(f.get("name", "")))
                sensors.append(f"  - {{id: {sensor}, {kind}}}{comment}")
                parts = [f"sensor: {sensor}", f"register: {register}", f"address: {int(f.get('address', 0))}"]
                if register in ("holding", "input"):
                    parts.append(f"type: {f.get('type', 'UINT16')}")
                    order = str(request.get("byte_order", "ABCD"))
                    if order != default_order:
                        parts.append(f"byte_order: {order}")
                else:
                    parts.append("type: BIT")
                scale = f.get("scale")
                if scale not in (None, 0, 0.0):
                    if float(scale) < 0:
                        warnings.append(
                            f"{sensor}: negative scale {scale} kept as {abs(scale)}; add the sign back"
                        )
                    parts.append(f"scale: {abs(float(scale))!r}")
                for key in ("bit", "length"):
                    if key in f:
                        parts.append(f"{key}: {int(f[key])}")
                lines.append(f"        - {{{', '.join(parts)}}}")
            devices.append("\n".join(lines))
    if problems:
        raise ConfigError(problems)
    head = [
        "# Converted from a Telegraf [[inputs.modbus]] config by `monitor import-telegraf`.",
        "# Addresses are 0-based protocol addresses, as in Telegraf. Check every sensor's",
        "# kind and unit (guessed from the field names), then `monitor check-config`.",
        f"station: {{id: {station_id}}}",
        "sensors:",
    ]
    body = [*head, *sensors, "modbus:", "  devices:", *devices]
    return "\n".join(body) + "\n", warnings
