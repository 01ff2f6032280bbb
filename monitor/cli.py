"""The `monitor` command: one subcommand per module in `monitor.commands`.

Each command module provides `HELP`, `add_arguments(parser)` and `run(args) -> int`.
A module that is not there yet simply is not offered, so features land independently.

Only the chosen command's module is imported, so `monitor --version` and
`monitor billing rate` never load the daemon, the console (FastAPI, uvicorn) or
the simulators; `monitor --help` imports them all to list their help lines.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

from monitor import __version__

COMMANDS: dict[str, str] = {
    "run": "monitor.commands.run",
    "demo": "monitor.commands.demo",
    "check-config": "monitor.commands.check_config",
    "config-schema": "monitor.commands.config_schema",
    "profile": "monitor.commands.profile",
    "replay": "monitor.commands.replay",
    "modbus": "monitor.commands.modbus",
    "import-telegraf": "monitor.commands.import_telegraf",
    "outbox": "monitor.commands.outbox",
    "series": "monitor.commands.series",
    "alarms": "monitor.commands.alarms",
    "meters": "monitor.commands.meters",
    "billing": "monitor.commands.billing",
    "incidents": "monitor.commands.incidents",
    "notify": "monitor.commands.notify",
    "fleet": "monitor.commands.fleet",
    "pumps": "monitor.commands.pumps",
}


def _available() -> list[str]:
    return [name for name, module in COMMANDS.items() if importlib.util.find_spec(module) is not None]


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def build_parser(load: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; `load` names the commands whose modules are imported (default all).

    A command not loaded is still a valid choice (so a typo is reported with the
    list of commands), it just has no options until it is chosen."""
    parser = argparse.ArgumentParser(
        prog="monitor",
        description="Pumping-station monitor: Modbus/MQTT in, chapter 139 alarms, InfluxDB and billing out.",
    )
    parser.add_argument("--version", action="version", version=f"station-monitor {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        type=str.upper,
        help="least severe log level written to stderr (default INFO)",
    )
    parser.add_argument("--log-json", action="store_true", help="one JSON object per log line (for journald)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = _available()
    wanted = set(names if load is None else load)
    for name in names:
        if name not in wanted:
            sub.add_parser(name)
            continue
        module = _load(name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, before parsing (None for --help, --version)."""
    for arg in argv:
        if arg in COMMANDS:
            return arg
        if arg in ("-h", "--help") or (not arg.startswith("-") and arg not in _LEVELS):
            return None
    return None


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    chosen = chosen_command(args_list)
    wants_help = any(a in ("-h", "--help") for a in args_list)
    without_pydantic_plugins()
    with single_threaded_blas(), imports_without_gc():
        parser = build_parser(load=[chosen] if chosen else (None if wants_help else []))
    args = parser.parse_args(args_list)
    from monitor.commands import setup_logging

    setup_logging(args.log_level, args.log_json)
    try:
        code: int = args._run(args)
    except KeyboardInterrupt:
        return 130
    return code


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """The chosen command's imports (NumPy, pyarrow, pydantic, the config's models) with the
    cyclic garbage collector off, and what they made then put in its oldest generation.

    Those imports make ~45,000 objects that live as long as the process and almost no
    garbage (a collection right after finds ~20 objects), yet they set off ~80 young and
    ~8 middle-generation collections that walked them again and again, and the first
    ones after would walk them twice more: 2.4% of a 100-row replay's instructions.
    `gc.freeze()` then `gc.unfreeze()` moves them to the oldest generation at once, where
    only a full collection looks at them, as it would have after those collections.
    Nothing stays frozen: a freeze kept past start-up made a 10 M-row replay 0.15-0.2 s
    slower (`replay_steps` freezes what it needs itself). A caller that turned the
    collector off, or froze objects of its own, is left as it chose.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()  # into the oldest generation
        gc.enable()


PYDANTIC_PLUGINS = "PYDANTIC_DISABLE_PLUGINS"


def without_pydantic_plugins() -> None:
    """pydantic does not look for plugins: the monitor uses none.

    The first time it builds a validator (loading the config) pydantic reads the metadata
    of every installed distribution for entry points of its `pydantic` group: 5-7 ms of
    CPU, 1.7% of a 100-row replay's instructions, to find nothing. Its documented
    variable stops that for this process (and the incident worker forked from it; the
    monitor starts no other program). A user's own value is kept: an empty one loads
    every plugin installed, a list of names all but those. (pydantic imports
    importlib.metadata, ~20 ms, either way.)
    """
    os.environ.setdefault(PYDANTIC_PLUGINS, "__all__")


BLAS_THREADS = "OPENBLAS_NUM_THREADS"


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """NumPy imported here (by the chosen command's module) loads OpenBLAS with one thread.

    At load OpenBLAS starts a thread per core that spins waiting for work: about 50 ms
    of CPU and of wall time on every command that imports NumPy (`python -c "import numpy"`
    0.13 -> 0.07 s user on the 2-core machine), for nothing: no command does linear
    algebra (no matmul, dot or linalg). The variable is set only for the import and
    only if the user has not set it, then removed, so no child process inherits it.
    """
    if BLAS_THREADS in os.environ or "numpy" in sys.modules:
        yield
        return
    os.environ[BLAS_THREADS] = "1"
    try:
        yield
    finally:
        os.environ.pop(BLAS_THREADS, None)


def entry() -> None:
    """`monitor` as a program: `main()`, then an exit that skips the interpreter's last
    garbage collections.

    At exit every object is either still referenced or garbage the process takes with
    it. Frozen (`gc.freeze`), the final collections no longer walk the hundreds of
    thousands that pydantic, FastAPI and NumPy leave: that was most of `monitor run`'s
    SIGTERM-to-exit time and a sixth of `check-config`'s CPU. Objects freed by their
    reference count are still finalised; every store is closed explicitly before this.
    """
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
