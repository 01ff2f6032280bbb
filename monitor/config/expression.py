"""Expressions of derived sensors: parsed into a whitelisted tree, units checked at load.

Why our own parser on Python's `ast` and not `simpleeval`/`asteval`: the units of
an expression must be checked when the config loads (ft2 x ft/min -> gpm is
converted, gpm + mg/L is refused naming the key), which needs a walk over the
tree with our unit table anyway; and the live path evaluates each derived sensor
per sample, where closures compiled once (monitor/station/derive.py) cost a few
hundred nanoseconds while a tree-walking evaluator costs tens of microseconds.
Nothing is ever passed to `eval`: `ast.parse` only builds the tree, and any node
outside the whitelist below is a config error.

Grammar (Python syntax): numbers; sensor ids (`ps.level`, or `sensor("ps-1:flow")`
for ids that are not dotted names); named constants with units from the sensor's
`constants:`; `+ - * /`, unary minus, parentheses; `min(a, b)`, `max(a, b)`;
`rate(s[, window])` (time derivative, per second, over `window`, default 60 s);
`sum(s, window)`, `mean(s, window)` (samples of `s` within the window);
`running(pump)` (1 while the pump runs, else 0); `a if running(p) else b`.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from monitor.config.types import parse_duration
from monitor.model import Kind
from monitor.units import NONE, Dim, dim, dim_mul, dimension

DEFAULT_RATE_WINDOW = 60.0
MAX_WINDOW = 3600.0  # "a short window": state per window is kept in memory per sample


class ExpressionError(ValueError):
    """Why an expression cannot be used, in words for the operator."""


@dataclass(frozen=True, slots=True)
class Num:
    value: float


@dataclass(frozen=True, slots=True)
class Ref:
    sensor: str


@dataclass(frozen=True, slots=True)
class Window:
    fn: str  # rate | sum | mean
    sensor: str
    seconds: float


@dataclass(frozen=True, slots=True)
class Running:
    sensor: str


@dataclass(frozen=True, slots=True)
class Unary:
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / min max
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Choice:
    test: Node
    then: Node
    otherwise: Node


Node = Num | Ref | Window | Running | Unary | Binary | Choice


@dataclass(frozen=True, slots=True)
class Compiled:
    """A checked expression: the tree (values in SI), the sensors it reads, its dimension."""

    tree: Node
    inputs: tuple[str, ...]
    dim: Dim


def parse_quantity(text: str | float | int) -> tuple[float, str]:
    """`"80 ft2"` -> (80.0, "ft2"); a bare number has no unit ("1")."""
    if isinstance(text, bool):
        raise ValueError("must be a number with a unit, such as 80 ft2")
    if isinstance(text, (int, float)):
        return float(text), "1"
    parts = str(text).split(None, 1)
    try:
        value = float(parts[0])
    except (ValueError, IndexError):
        raise ValueError(f"{text!r} is not a number with a unit, such as 80 ft2") from None
    unit = parts[1].strip() if len(parts) > 1 else "1"
    dimension(unit)  # raises ValueError for an unknown unit
    return value, unit


def compile_expression(
    text: str,
    sensors: Mapping[str, tuple[Kind, str]],
    constants: Mapping[str, tuple[float, str]],
) -> Compiled:
    """Parse and unit-check `text`; `sensors` maps id -> (kind, unit). Raises ExpressionError."""
    try:
        tree = ast.parse(_DURATION.sub(r"'\1\2'", text.strip()), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not a valid expression ({exc.msg})") from None
    builder = _Builder(sensors, constants)
    node, d, _ = builder.build(tree.body)
    return Compiled(node, tuple(dict.fromkeys(builder.inputs)), d)


# `rate(ps.level, 60s)`: a bare duration becomes a string literal before parsing.
_DURATION = re.compile(r"(?<![\w.'\"])(\d+(?:\.\d+)?)(ms|min|s|m|h)\b")
_FUNCS = ("rate", "sum", "mean", "running", "min", "max", "sensor")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class _Builder:
    def __init__(
        self, sensors: Mapping[str, tuple[Kind, str]], constants: Mapping[str, tuple[float, str]]
    ) -> None:
        self.sensors = sensors
        self.constants = constants
        self.inputs: list[str] = []

    def build(self, n: ast.expr) -> tuple[Node, Dim, bool]:
        """(node, dimension, is a bare literal that takes any dimension: `0`)."""
        if (
            isinstance(n, ast.Constant)
            and isinstance(n.value, (int, float))
            and not isinstance(n.value, bool)
        ):
            return Num(float(n.value)), NONE, float(n.value) == 0.0
        if isinstance(n, (ast.Name, ast.Attribute)):
            name = _dotted(n)
            if name in self.constants:
                value, unit = self.constants[name]
                d, scale, offset = dimension(unit)
                return Num(value * scale + offset), d, False
            return self._ref(name)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            node, d, wild = self.build(n.operand)
            return (Unary(node) if isinstance(n.op, ast.USub) else node), d, wild
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            op = _OPS[type(n.op)]
            left, dl, wl = self.build(n.left)
            right, dr, wr = self.build(n.right)
            if op in "+-":
                return Binary(op, left, right), self._same(dl, wl, dr, wr, op), wl and wr
            if op == "/" and isinstance(right, Num) and right.value == 0.0:
                raise ExpressionError("division by the constant 0")
            return Binary(op, left, right), dim_mul(dl, dr, 1 if op == "*" else -1), False
        if isinstance(n, ast.IfExp):
            test, _, _ = self.build(n.test)
            then, dt, wt = self.build(n.body)
            other, do, wo = self.build(n.orelse)
            return Choice(test, then, other), self._same(dt, wt, do, wo, "if/else"), wt and wo
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and not n.keywords:
            return self._call(n.func.id, n.args)
        raise ExpressionError(f"{ast.unparse(n)!r} is not allowed (see the derived sensor grammar)")

    def _call(self, fn: str, args: list[ast.expr]) -> tuple[Node, Dim, bool]:
        if fn not in _FUNCS:
            raise ExpressionError(f"unknown function {fn!r}; known: {', '.join(_FUNCS)}")
        if fn in ("min", "max"):
            if len(args) != 2:
                raise ExpressionError(f"{fn}() takes two arguments")
            left, dl, wl = self.build(args[0])
            right, dr, wr = self.build(args[1])
            return Binary(fn, left, right), self._same(dl, wl, dr, wr, f"{fn}()"), wl and wr
        if not args or len(args) > 2:
            raise ExpressionError(f"{fn}() takes a sensor" + (" and a window" if fn != "running" else ""))
        sensor = self._sensor_arg(args[0], fn)
        if fn == "sensor":
            if len(args) != 1:
                raise ExpressionError("sensor() takes one sensor id")
            return self._ref(sensor)
        kind, unit = self._lookup(sensor)
        if fn == "running":
            if len(args) != 1:
                raise ExpressionError("running() takes one pump")
            if kind not in (Kind.PUMP, Kind.STATUS):
                raise ExpressionError(f"running({sensor}): {sensor!r} is a {kind} sensor, not a pump")
            self.inputs.append(sensor)
            return Running(sensor), NONE, False
        if len(args) == 2:
            window = _window(args[1], fn)
        elif fn == "rate":
            window = DEFAULT_RATE_WINDOW
        else:
            raise ExpressionError(f"{fn}() needs a window, such as {fn}({sensor}, '15m')")
        d, _, _ = dimension(unit, kind)
        self.inputs.append(sensor)
        if fn == "rate":
            return Window(fn, sensor, window), dim_mul(d, dim(T=1), -1), False
        return Window(fn, sensor, window), d, False

    def _sensor_arg(self, n: ast.expr, fn: str) -> str:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return n.value
        if isinstance(n, (ast.Name, ast.Attribute)):
            return _dotted(n)
        raise ExpressionError(f"{fn}() takes a sensor id, not {ast.unparse(n)!r}")

    def _lookup(self, sensor: str) -> tuple[Kind, str]:
        found = self.sensors.get(sensor)
        if found is None:
            close = difflib.get_close_matches(sensor, sorted(self.sensors), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ExpressionError(f"unknown sensor {sensor!r}{hint}")
        return found

    def _ref(self, sensor: str) -> tuple[Node, Dim, bool]:
        kind, unit = self._lookup(sensor)
        self.inputs.append(sensor)
        return Ref(sensor), dimension(unit, kind)[0], False

    @staticmethod
    def _same(a: Dim, wild_a: bool, b: Dim, wild_b: bool, op: str) -> Dim:
        if a == b or wild_b:
            return a
        if wild_a:
            return b
        verb = {"+": "add", "-": "subtract", "if/else": "choose between"}.get(op, f"take {op} of")
        raise ExpressionError(f"mixed units: cannot {verb} {_show(a)} and {_show(b)}")


def _dotted(n: ast.expr) -> str:
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        return f"{_dotted(n.value)}.{n.attr}"
    raise ExpressionError(f"{ast.unparse(n)!r} is not a sensor id")


def _window(n: ast.expr, fn: str) -> float:
    if (
        isinstance(n, ast.Constant)
        and isinstance(n.value, (str, int, float))
        and not isinstance(n.value, bool)
    ):
        try:
            seconds = parse_duration(n.value)
        except ValueError as exc:
            raise ExpressionError(f"{fn}() window: {exc}") from None
        if not 0 < seconds <= MAX_WINDOW:
            raise ExpressionError(f"{fn}() window must be more than 0 and at most 1h")
        return seconds
    raise ExpressionError(f"{fn}() window must be a duration such as '5m'")


_BASES = {"L": "m", "M": "kg", "T": "s", "K": "K"}
_NAMES = {
    dim(L=3, T=-1): "a flow",
    dim(M=1, L=-3): "a concentration",
    dim(L=1): "a length",
    dim(L=1, T=-1): "a rate of level",
    dim(L=2): "an area",
    dim(L=3): "a volume",
    dim(M=1, T=-1): "a mass loading",
    dim(K=1): "a temperature",
    dim(pH=1): "a pH",
}


def _show(d: Dim) -> str:
    if not d:
        return "a plain number"
    if d in _NAMES:
        return _NAMES[d]
    return " ".join(f"{_BASES.get(k, k)}^{v}" if v != 1 else _BASES.get(k, k) for k, v in d)


__all__ = ["Compiled", "ExpressionError", "compile_expression", "parse_quantity"]
