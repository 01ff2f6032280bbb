"""Which clock stamps a sensor's readings, checked at load: one sensor, one clock.

A sensor's history cannot follow two clocks when the gateway's steps: moved with the step,
the device's readings look a step old (an on-delay or a slug run taken for one a step long:
a false alarm); left, the gateway's are a step out of order (dropped). The gateway clock
stamps what is polled over Modbus and what a subscription without a `time_path` names (at
receipt); a device's clock what a subscription with one names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from monitor.config.sensors import Sensor
from monitor.model import Kind

if TYPE_CHECKING:  # the models are imported only for a config that has the sections (`LazySection`)
    from monitor.config.sources import Modbus, Mqtt, Subscription

_SHOWN = 3  # sensors named in one error at most; the rest counted


def two_clocks(modbus: Modbus | None, mqtt: Mqtt | None, sensors: Sequence[Sensor]) -> list[str]:
    """Every sensor the config puts on two clocks, as key-path errors."""
    subs = mqtt.subscriptions if mqtt else []
    return _named_both_ways(modbus, subs) + _could_be_named_both_ways(modbus, subs, sensors)


def _named_both_ways(modbus: Modbus | None, subs: Sequence[Subscription]) -> list[str]:
    """A sensor named by a subscription that takes its time from the payload and also
    polled over Modbus or named literally by a subscription without a `time_path`. A
    templated `time_path` subscription that binds such a sensor is refused per message
    (`MqttSource`, `gateway_fed`): the literal name says the sensor is the gateway's."""
    gateway: dict[str, list[str]] = {}
    for d, device in enumerate(modbus.devices if modbus else []):
        for f, field in enumerate(device.fields):
            gateway.setdefault(field.sensor, []).append(f"polled by modbus.devices[{d}].fields[{f}].sensor")
    for i, sub in enumerate(subs):
        if sub.time_path is None and "{" not in sub.sensor:
            gateway.setdefault(sub.sensor, []).append(f"fed by mqtt.subscriptions[{i}].sensor")
    return [
        f"mqtt.subscriptions[{i}].sensor: sensor {sub.sensor!r} is {' and '.join(gateway[sub.sensor])}"
        " (stamped by the gateway clock) and takes its time from the payload here (the device's"
        " clock): one sensor cannot be judged on two clocks across a gateway clock step; feed it"
        " one way, or give these readings a sensor id of their own"
        for i, sub in enumerate(subs)
        if sub.time_path is not None and sub.sensor in gateway
    ]


def _could_be_named_both_ways(
    modbus: Modbus | None, subs: Sequence[Subscription], sensors: Sequence[Sensor]
) -> list[str]:
    """A configured sensor that a template with a `time_path` and a template without could
    both name, and that nothing names literally: nothing says which clock is its, and each
    message would be taken on its own. A literal name decides (`reconcile.gateway_fed`,
    `reconcile.device_named`): polled or named without a `time_path`, the gateway's; named
    with one, the device's; the other template's messages for it are refused one by one.
    One error per pair of subscriptions, naming the sensors they share."""
    named = {f.sensor for d in (modbus.devices if modbus else []) for f in d.fields}
    named |= {s.sensor for s in subs if "{" not in s.sensor}
    ids = [s.id for s in sensors if s.kind is not Kind.DERIVED and s.id not in named]
    device = [
        (i, sensor_pattern(s.sensor))
        for i, s in enumerate(subs)
        if s.time_path is not None and "{" in s.sensor
    ]
    plain = [
        (j, sensor_pattern(s.sensor)) for j, s in enumerate(subs) if s.time_path is None and "{" in s.sensor
    ]
    out = []
    for i, stamped in device:
        for j, also in plain:
            shared = [sid for sid in ids if stamped.fullmatch(sid) and also.fullmatch(sid)]
            if not shared:
                continue
            which = ", ".join(repr(s) for s in shared[:_SHOWN])
            more = f" and {len(shared) - _SHOWN} more" if len(shared) > _SHOWN else ""
            out.append(
                f"mqtt.subscriptions[{i}].sensor: takes its time from the payload (the device's clock),"
                f" and mqtt.subscriptions[{j}].sensor ({subs[j].sensor!r}, no time_path: the gateway"
                f" clock at receipt) could name the same sensor{'s' if len(shared) > 1 else ''}"
                f" {which}{more}: one sensor cannot be judged on two clocks across a gateway clock"
                " step; name it literally in the subscription whose clock is its, or give the"
                " templates sensor ids that cannot meet"
            )
    return out


def sensor_pattern(template: str) -> re.Pattern[str]:
    """The sensor ids a subscription's `sensor` can name (`{n}`: the n-th `+` level, one topic
    level, the same one wherever it stands: `"{1}.{1}"` names `north.north`, never `north.ph`).
    The config's clock check, the daemon's device-stamped set and comm-loss all ask this."""
    out, seen = [], set()
    for i, part in enumerate(re.split(r"\{(\d+)\}", template)):
        if i % 2 == 0:
            out.append(re.escape(part))
        elif part in seen:
            out.append(f"(?P=level{part})")
        else:
            seen.add(part)
            out.append(f"(?P<level{part}>[^/]+)")
    return re.compile("".join(out))
