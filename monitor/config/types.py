"""Field types shared by every config section: durations, secrets, the frozen base."""

import datetime
import importlib
import math
import os
import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    SecretStr,
    WithJsonSchema,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema


class Section(BaseModel):
    """Frozen and strict about keys, finite in every number: a typo, a NaN or an
    infinity must never silently disable an alarm (`high: .nan` compares false with
    everything, `on_delay: .inf` never elapses).

    Validators are built on first use (`defer_build`), not at import: built per class,
    each section was compiled once for itself and again inside `Config`, and sections a
    station does not use (notify, modbus) cost every command's start-up ~80 ms."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


S = TypeVar("S", bound=Section)


def all_defaults(cls: type[S]) -> S:
    """`cls()` for a field's default, made without building `cls`'s validator.

    `store: Store = Store()` validated an empty mapping at import, which built Store's
    validator (and at the first one pydantic's plugin scan) for a value that is only its
    defaults: seven sections did, ~20 ms of every command's start-up. The instance is the
    same (fields at their defaults, none set; defaults are never validated, and no
    section's after-validator changes a default one: tests/test_config.py checks)."""
    return cast(S, cls.model_construct())  # mypy binds its Self to Section, not S


class LazySection:
    """An optional section (`notify`, `modbus`, `mqtt`, `influx`, `billing`, `wet_well`)
    whose model is imported and compiled only when a config has it: `Annotated[Any,
    LazySection(module, name)]` on a field of `Config`.

    As `Notify | None` the field had Config's validator import and compile the section's
    models at every start, for a station that has none (a replay never reads notify,
    modbus or mqtt): 4.6% of a 100-row replay's instructions, 1.3% more for the other
    three. A section that is there is validated by its own model as before: the same
    rules, and its errors keep their place (`notify.people[0].name`) because pydantic
    nests a ValidationError raised in a field's validator. `null` is no section, as
    before; the JSON Schema (`config-schema`, the "did you mean" hints) imports the model
    and shows the section as `Notify | None` showed it.
    """

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def model(self) -> type[BaseModel]:
        found: type[BaseModel] = getattr(importlib.import_module(self.module), self.name)
        return found

    def validate(self, value: Any) -> BaseModel | None:
        return None if value is None else self.model().model_validate(value)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate, metadata={_LAZY: self.name})

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        model = self.model()
        model.model_rebuild()  # built on first use (defer_build): now
        return handler(core_schema.nullable_schema(model.__pydantic_core_schema__))


_LAZY = "monitor_lazy_section"


class SectionsJsonSchema(GenerateJsonSchema):
    """The JSON Schema generator for `Config`: a lazy section's property gets no title of
    its own, as a model-typed field (`Notify | None`) gets none (its `$ref` names it)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        inner = schema
        while isinstance(inner, dict) and inner.get("type") in ("model-field", "default"):
            inner = inner["schema"]
        if isinstance(inner, dict) and _LAZY in (inner.get("metadata") or {}):
            return False
        return super().field_title_should_be_set(schema)


_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """`90`, `"90s"`, `"15m"`, `"1h30m"`, `"500ms"` -> seconds (float)."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30s, 15m or 24h")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        try:
            return parse_duration(float(text))
        except ValueError:
            pass
        parts = _PART.findall(text)
        if not text or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{value!r} is not a duration such as 30s, 15m or 24h")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    else:
        raise ValueError("must be a duration such as 30s, 15m or 24h")
    if not math.isfinite(seconds):
        raise ValueError("must be a finite duration")
    if seconds < 0:
        raise ValueError("must not be negative")
    return seconds


def parse_instant(value: Any) -> float:
    """An instant (ISO 8601 with `Z` or an offset; YAML reads an unquoted one as a datetime)
    -> epoch seconds. A time without a zone, a date alone or a bare number is refused:
    guessing the zone, the hour or the unit would move a billing boundary."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value.isoformat()} has no zone; add Z or an offset")
        return value.timestamp()
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            dt = None
        if dt is not None and ("T" in text.upper() or " " in text):  # a date alone is no instant
            return parse_instant(dt)
    raise ValueError(f"{value!r} is not a time such as 2026-10-01T00:00:00Z (ISO 8601 with Z or an offset)")


Instant = Annotated[
    float,
    BeforeValidator(parse_instant),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]

Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "description": "seconds"},
                {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|min|s|m|h|d))+$"},
            ]
        }
    ),
]

_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def resolve_secret(value: Any) -> Any:
    """Read a secret from `${ENV_VAR}`, `{env: NAME}` or `{file: PATH}`.

    A literal is refused: secrets live in the environment or in files with
    their own permissions, never in the YAML. Error texts never echo the value.
    """
    if isinstance(value, SecretStr):
        return value
    if isinstance(value, str):
        match = _ENV_REF.match(value.strip())
        if not match:
            raise ValueError(
                "secrets are not stored in the YAML; write ${ENV_VAR} or {file: /path/to/secret}"
            )
        return _from_env(match.group(1))
    if isinstance(value, dict) and len(value) == 1:
        ((key, ref),) = value.items()
        if key == "env" and isinstance(ref, str):
            return _from_env(ref)
        if key == "file" and isinstance(ref, str):
            try:
                return Path(ref).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"cannot read secret file {ref}: {exc.strerror}") from None
    raise ValueError("must be ${ENV_VAR}, {env: NAME} or {file: /path/to/secret}")


def _from_env(name: str) -> str:
    text = os.environ.get(name)
    if text is None:
        raise ValueError(f"environment variable {name} is not set")
    return text


Secret = Annotated[
    SecretStr,
    BeforeValidator(resolve_secret),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$"},
                {
                    "type": "object",
                    "properties": {"env": {"type": "string"}, "file": {"type": "string"}},
                    "additionalProperties": False,
                    "minProperties": 1,
                    "maxProperties": 1,
                },
            ]
        }
    ),
]

SensorId = Annotated[str, WithJsonSchema({"type": "string", "pattern": r"^[A-Za-z0-9_.:-]+$"})]


_SECRET_PARAM = re.compile(r"token|key|pass|secret|auth|sig|credential", re.I)


def redact_url(url: str) -> str:
    """A URL fit for logs and output: a password in it and secret-looking query values
    (`token`, `key`, `password`, ...) become `***`. Every printed URL goes through this."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(unparsable URL)"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
    query = "&".join(
        f"{k}=***" if _SECRET_PARAM.search(k) else (f"{k}={v}" if v or "=" in item else k)
        for item in parts.query.split("&")
        if item
        for k, _, v in [item.partition("=")]
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
