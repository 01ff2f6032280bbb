"""Source sections: Modbus devices with their register maps, MQTT broker and subscriptions."""

import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from monitor.config.sensors import key_error
from monitor.config.types import Duration, Secret, Section

RegisterKind = Literal["coil", "discrete", "holding", "input"]
ValueType = Literal[
    "INT8L", "INT8H", "UINT8L", "UINT8H", "INT16", "UINT16", "INT32", "UINT32",
    "INT64", "UINT64", "FLOAT16", "FLOAT32", "FLOAT64", "STRING", "BIT",
]  # fmt: skip
ByteOrder = Literal["ABCD", "DCBA", "BADC", "CDAB"]
# registers per value type (STRING: its `length`); the decoder has the full table
_WIDTH = {"INT32": 2, "UINT32": 2, "FLOAT32": 2, "INT64": 4, "UINT64": 4, "FLOAT64": 4}


class ModbusField(Section):
    """One value on a device, feeding one sensor (Telegraf request-style names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    sensor: str
    # `register` would shadow BaseModel.register; the YAML key stays `register`.
    register_type: RegisterKind = Field("holding", alias="register")
    address: int = Field(ge=0, le=65535, description="protocol address (0-based unless address_base: 1)")
    type: ValueType = "UINT16"
    byte_order: ByteOrder | None = None
    scale: float | None = Field(None, gt=0)
    offset: float = 0.0
    bit: int | None = Field(None, ge=0, le=15)
    length: int | None = Field(None, ge=1, le=125, description="registers, for STRING")
    # The device's own error values, as the register holds them (before scale and
    # offset), e.g. [-9999, 32767]: such a reading is stored as BAD_DATA.
    bad_values: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _type_fits(self) -> "ModbusField":
        if self.type == "BIT" and self.bit is None and self.register_type in ("holding", "input"):
            raise key_error("bit", "required for type BIT on a holding or input register")
        if self.type != "BIT" and self.bit is not None:
            raise key_error("bit", "only for type BIT")
        if self.type == "STRING" and self.length is None:
            raise key_error("length", "required for type STRING")
        if self.register_type in ("coil", "discrete") and self.type not in ("BIT", "UINT16"):
            raise key_error("type", "coils and discrete inputs hold single bits; use BIT")
        return self


class ModbusDevice(Section):
    """One Modbus endpoint (TCP host or serial line) and the unit id behind it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    transport: Literal["tcp", "rtu"] = "tcp"
    host: str | None = None
    port: int | str = 502
    baudrate: int = 9600
    parity: Literal["N", "E", "O"] = "N"
    stopbits: Literal[1, 2] = 1
    bytesize: Literal[7, 8] = 8
    device_id: int = Field(1, ge=0, le=247)
    poll_interval: Duration = Field(1.0, gt=0)
    timeout: Duration = Field(1.0, gt=0)
    byte_order: ByteOrder = "ABCD"
    address_base: Literal[0, 1] = 0
    max_register_gap: int = Field(
        10, ge=0, le=124, description="unused registers read through to merge two requests into one"
    )
    close_after_cycle: bool = False
    comm_loss_after: int = Field(3, ge=1, description="failed polls in a row before comm-loss")
    busy_retries: int = Field(2, ge=0)
    busy_pause: Duration = 0.2
    pause: Duration = Field(0.0, description="pause between requests on this connection")
    fields: list[ModbusField] = Field(min_length=1)

    @model_validator(mode="after")
    def _endpoint(self) -> "ModbusDevice":
        if self.transport == "tcp":
            if not self.host:
                raise key_error("host", "required for a TCP device")
            if not isinstance(self.port, int) or not 0 < self.port < 65536:
                raise key_error("port", "must be a TCP port number for a TCP device")
        elif not isinstance(self.port, str):
            raise key_error("port", "must be a serial device path (e.g. /dev/ttyUSB0) for RTU")
        for i, f in enumerate(self.fields):
            if f.address < self.address_base:
                raise key_error(f"fields[{i}].address", "must be >= 1 with address_base: 1")
            width = 1 if f.register_type in ("coil", "discrete") else _WIDTH.get(f.type, f.length or 1)
            if f.address - self.address_base + width > 65536:
                raise key_error(f"fields[{i}].address", f"{f.type} at {f.address} runs past register 65535")
        return self


class Modbus(Section):
    devices: list[ModbusDevice] = []

    @model_validator(mode="after")
    def _one_line_one_setting(self) -> "Modbus":
        """Units on one serial line share its baud rate and framing (one connection owner)."""
        seen: dict[str, tuple[int, tuple[object, ...]]] = {}
        for i, d in enumerate(self.devices):
            if d.transport != "rtu":
                continue
            line = (d.baudrate, d.parity, d.stopbits, d.bytesize)
            first = seen.setdefault(str(d.port), (i, line))
            if first[1] != line:
                raise key_error(
                    f"devices[{i}].baudrate",
                    f"{d.port} is also used by devices[{first[0]}] with other line settings"
                    " (baudrate, parity, stopbits, bytesize)",
                )
        return self


class Tls(Section):
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    verify: bool = True


class Subscription(Section):
    """Topic filter -> sensor. `sensor: "{1}.ph"` takes the 1st `+` level of the topic."""

    topic: str = Field(min_length=1)
    sensor: str = Field(min_length=1)
    format: Literal["number", "json"] = "number"
    value_path: str = "value"
    time_path: str | None = None
    qos: Literal[0, 1, 2] | None = None

    @model_validator(mode="after")
    def _filter_and_template(self) -> "Subscription":
        try:
            check_topic_filter(self.topic)
        except ValueError as exc:
            raise key_error("topic", str(exc)) from None
        wild = sum(1 for level in self.topic.split("/") if level == "+")
        for n in re.findall(r"\{(\d+)\}", self.sensor):
            if not 1 <= int(n) <= wild:
                raise key_error("sensor", f"{{{n}}} names a '+' level, but the topic has {wild}")
        for key in ("value_path", "time_path"):
            path = getattr(self, key)
            if path is not None and (not path or "" in path.split(".")):
                raise key_error(key, "must be dot-separated names such as reading.value")
        return self


def check_topic_filter(topic: str) -> None:
    """Raise ValueError unless `topic` is a valid MQTT topic filter."""
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if level == "#" and i != len(levels) - 1:
            raise ValueError("'#' must be the last topic level")
        if level not in ("+", "#") and ("+" in level or "#" in level):
            raise ValueError(f"wildcard inside topic level {level!r}; '+' and '#' fill a whole level")


class Mqtt(Section):
    host: str = "127.0.0.1"
    port: int = Field(1883, gt=0, lt=65536)
    tls: Tls | None = None
    username: str | None = None
    password: Secret | None = None
    client_id: str | None = None
    protocol: Literal["3.1.1", "5"] = "5"
    qos: Literal[0, 1, 2] = 1
    keepalive: Duration = Field(30.0, gt=0)
    session_expiry: Duration = 86400.0
    topic_prefix: str = "station-monitor"
    subscriptions: list[Subscription] = []
    max_skew: Duration = 300.0
    max_payload: int = Field(65536, gt=0)
    comm_loss_after: Duration = Field(
        30.0, gt=0, description="broker unreachable this long: comm-loss on every sensor MQTT feeds"
    )
    publish_alarms: bool = True
    command_users: list[str] = []
    command_max_age: Duration = Field(
        300.0, gt=0, description="commands older than this (by their `sent` time) are refused"
    )
