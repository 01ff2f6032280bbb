"""Subcommands of `monitor`; this package sits on top and may import everything.

It is imported to list the commands, so it imports nothing heavy itself: each
command module imports what it needs, and only the chosen one is loaded.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from monitor.config import Config
    from monitor.errors import ConfigError

EXIT_CONFIG = 2
T = TypeVar("T")
log = logging.getLogger("monitor")


def add_config_argument(parser: argparse.ArgumentParser, positional: bool = False) -> None:
    """`--config FILE`, the same on every command that reads a station config.

    With `positional`, `monitor check-config FILE` keeps working as well."""
    help_text = "station config YAML (e.g. /etc/station-monitor/station.yaml)"
    parser.add_argument(
        "--env-file",
        metavar="FILE",
        help="read NAME=value lines (the systemd unit's secrets.env) into the environment first, "
        "so ${NAME} secrets resolve as they do for the service",
    )
    if not positional:
        parser.add_argument("--config", required=True, metavar="FILE", help=help_text)
        return
    parser.add_argument("--config", metavar="FILE", help=help_text)
    parser.add_argument("config_file", nargs="?", metavar="FILE", help="the same, given without --config")


def read_env_file(path: str | Path) -> dict[str, str]:
    """`NAME=value` lines as systemd's EnvironmentFile= reads them (comments, blank
    lines, `export`, single or double quotes); exit 2 naming the line otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"--env-file: cannot read {path}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier():
            print(f"--env-file: {path} line {number}: not NAME=value", file=sys.stderr)
            raise SystemExit(EXIT_CONFIG)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
    return out


def config_path(args: argparse.Namespace) -> str:
    """The config file named either way (exactly one of `--config FILE` or `FILE`); exit 2 otherwise."""
    given = [p for p in (args.config, getattr(args, "config_file", None)) if p]
    if len(given) != 1:
        print(f"monitor {args.command}: name the station config once: --config FILE", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    path: str = given[0]
    return path


def run_bounded(main: Coroutine[Any, Any, T], grace: float = 5.0) -> T:
    """`asyncio.run`, except that tasks left behind get `grace` seconds to end.

    asyncio.run waits without limit for leftover tasks; one that swallows its
    cancellation inside a library would keep a stopped daemon from ever exiting.
    """
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(main)
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=grace))
            if stuck:
                log.warning(
                    "exiting with %d task(s) that did not stop: %s",
                    len(stuck),
                    ", ".join(sorted(t.get_name() for t in stuck)),
                )
        loop.run_until_complete(loop.shutdown_asyncgens())
        return result
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def load_config_or_exit(path: str | Path, env_file: str | None = None) -> Config:
    """Load a config, or print one line per problem and exit 2 (never a traceback)."""
    import os

    from monitor.config import load_config
    from monitor.errors import ConfigError

    if env_file:
        os.environ.update(read_env_file(env_file))

    try:
        return load_config(path)
    except ConfigError as exc:
        print_config_error(exc)
        raise SystemExit(EXIT_CONFIG) from None


def print_config_error(exc: ConfigError) -> None:
    print(f"config error in {exc.source or 'config'}:", file=sys.stderr)
    for problem in exc.problems:
        print(f"  {problem}", file=sys.stderr)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str = "INFO", as_json: bool = False) -> None:
    """Log to stderr for journald: plain `level logger: message`, or one JSON object a line."""
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
