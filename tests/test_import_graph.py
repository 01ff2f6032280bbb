"""The package's import graph: no cycles (lazy imports and TYPE_CHECKING ones count),
and no import from a lower layer to a higher one.

Layers, lowest first (a module may import its own layer and the ones below):

    0  model, errors, units, config, sdnotify, sqlite, statelock, heap, durable, writeonce,
       kernelclock, clockkept
    1  sources, engine, alarms, sinks, meters, callout, incidents, station
    2  pipeline, reconcile, recovery, state_check, diskspace, clockfile, health, daemon   (wiring)
    3  web, fleet                                       (the console on top of the daemon; the fleet view)
    4  commands, cli, __main__

Read from the source with `ast`, so an import inside a function is seen too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "monitor"

LAYERS: dict[str, int] = {
    "model": 0,
    "errors": 0,
    "units": 0,
    "config": 0,
    "sdnotify": 0,
    "sqlite": 0,
    "statelock": 0,  # one daemon (or replay) per state dir: the lock on state_dir/monitor.lock
    "heap": 0,  # glibc malloc thresholds for a replay (issue 20)
    "writeonce": 0,  # the console's request ids, kept by the stores that take its writes
    "durable": 0,  # a state file replaced whole, durably (heartbeat, engine checkpoint)
    "kernelclock": 0,  # the kernel's word on the clock: NTP synchronised (adjtimex), the boot id
    "clockkept": 0,  # a clock in doubt, kept in the heartbeat file for a restart
    "sources": 1,
    "engine": 1,
    "alarms": 1,
    "sinks": 1,
    "meters": 1,
    "callout": 1,
    "incidents": 1,
    "station": 1,  # the pumping station: derived sensors, pumps, wet well (issue 15)
    "pipeline": 2,
    "reconcile": 2,
    "recovery": 2,
    "state_check": 2,
    "diskspace": 2,
    "clockfile": 2,  # the station's last known good time: state_dir/clock.json
    "health": 2,
    "daemon": 2,
    "web": 3,
    "fleet": 3,
    "commands": 4,
    "cli": 4,
    "__main__": 4,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, name: str) -> set[str]:
    """Every `monitor.*` module `path` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("monitor"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("monitor"):
                continue
            for alias in node.names:
                # `from monitor.engine import slug` imports the module `slug` (its package is
                # loaded as a parent, as for any submodule); a name comes from `target` itself.
                sub = f"{target}.{alias.name}"
                if (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists():
                    found.add(sub)
                else:
                    found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        out[name] = {t for t in imports(path, name) if t in modules and t != name}
    return out


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in graph() if m != "monitor" and layer(m) is None)
    assert unplaced == [], f"add these to LAYERS: {unplaced}"


def test_no_import_cycles_lazy_or_not() -> None:
    assert cycles(graph()) == []


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    upward = []
    for module, targets in graph().items():
        mine = layer(module)
        if mine is None:
            continue
        for target in targets:
            theirs = layer(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_the_daemon_does_not_load_the_web_layer() -> None:
    edges = graph()
    seen: set[str] = set()
    todo = ["monitor.daemon"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges[module])
    assert sorted(m for m in seen if m.startswith(("monitor.web", "monitor.commands"))) == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_lazy_and_type_checking_imports_are_seen(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from monitor.daemon import Daemon\n"
        "def f():\n    from monitor.web import app\n    import monitor.cli\n"
    )
    assert imports(source, "monitor.x") >= {"monitor.daemon", "monitor.web.app", "monitor.cli"}
