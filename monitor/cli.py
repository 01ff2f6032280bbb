"""The `monitor` command: one subcommand per module in `monitor.commands`.

Each command module provides `HELP`, `add_arguments(parser)` and `run(args) -> int`.
A module that is not there yet simply is not offered, so features land independently.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from monitor import __version__
from monitor.commands import setup_logging

COMMANDS: dict[str, str] = {
    "run": "monitor.commands.run",
    "demo": "monitor.commands.demo",
    "check-config": "monitor.commands.check_config",
    "config-schema": "monitor.commands.config_schema",
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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """All subcommands, or just `only` (the one being run: importing every command
    module, the daemon and the web app with it, costs a second at each start)."""
    parser = argparse.ArgumentParser(
        prog="monitor",
        description="Pumping-station monitor: Modbus/MQTT in, chapter 139 alarms, InfluxDB and billing out.",
    )
    parser.add_argument("--version", action="version", version=f"station-monitor {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    parser.add_argument("--log-json", action="store_true", help="one JSON object per log line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args = parser.parse_args(words)
    setup_logging(args.log_level, args.log_json)
    try:
        code: int = args._run(args)
    except KeyboardInterrupt:
        return 130
    return code


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
