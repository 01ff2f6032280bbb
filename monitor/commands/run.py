"""`monitor run --config CONFIG`: the daemon, until SIGTERM or SIGINT; SIGHUP reloads."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from monitor.commands import load_config_or_exit
from monitor.config import Config, load_config
from monitor.daemon import Daemon
from monitor.errors import ConfigError, MonitorError

HELP = "run the station monitor (SIGTERM/SIGINT stop it, SIGHUP reloads the config)"
log = logging.getLogger("monitor.run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="station config YAML")


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config)
    try:
        asyncio.run(serve(Path(args.config), config))
    except MonitorError as exc:
        log.error("station %s cannot run: %s", config.station.id, exc)
        return 1
    return 0


async def serve(path: Path, config: Config) -> None:
    """Run daemons one after another: a reload stops the running one cleanly and
    starts one on the new config, so there is only ever one code path for start-up."""
    loop = asyncio.get_running_loop()
    while True:
        daemon = Daemon(config)
        reload: list[Config] = []

        def on_reload(daemon: Daemon = daemon, reload: list[Config] = reload) -> None:
            if reload:
                log.info("a reload of %s is already under way", path)
                return  # a second stop() would exit at once
            try:
                new = load_config(path)
            except ConfigError as exc:
                log.error("reload of %s refused, the running config stays: %s", path, "; ".join(exc.problems))
                return
            log.info("reloading %s", path)
            reload.append(new)
            daemon.reloading = True
            daemon.stop()

        loop.add_signal_handler(signal.SIGTERM, daemon.stop)
        loop.add_signal_handler(signal.SIGINT, daemon.stop)
        loop.add_signal_handler(signal.SIGHUP, on_reload)
        try:
            await daemon.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
        if not reload:
            return
        config = reload[-1]
