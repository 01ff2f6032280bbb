"""Typed, validated station config (pydantic) and the ordinance profile it defaults from.

Split by section so each module stays small: `types` (durations, secrets),
`sensors` (sensors, limits, slug, profile), `sources` (Modbus, MQTT),
`outputs` (InfluxDB, store, console, alarms, billing), `load` (YAML and errors).
"""

from monitor.config.load import DEFAULT_PROFILE, Config, Station, build_config, load_config
from monitor.config.notify import Notify
from monitor.config.outputs import Account, Alarms, Billing, Console, Influx, Store, Webhook
from monitor.config.sensors import LimitRule, Profile, Sensor, SensorRules, SlugRule
from monitor.config.sources import Modbus, ModbusDevice, ModbusField, Mqtt, Subscription, Tls
from monitor.config.types import Duration, Secret, parse_duration, redact_url

__all__ = [
    "DEFAULT_PROFILE",
    "Account",
    "Alarms",
    "Billing",
    "Config",
    "Console",
    "Duration",
    "Influx",
    "LimitRule",
    "Modbus",
    "ModbusDevice",
    "ModbusField",
    "Mqtt",
    "Notify",
    "Profile",
    "Secret",
    "Sensor",
    "SensorRules",
    "SlugRule",
    "Station",
    "Store",
    "Subscription",
    "Tls",
    "Webhook",
    "build_config",
    "load_config",
    "parse_duration",
    "redact_url",
]
