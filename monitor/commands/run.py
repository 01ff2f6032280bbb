"""`monitor run --config CONFIG`: the daemon, until SIGTERM or SIGINT; SIGHUP reloads.

It holds the state dir's lock (monitor/statelock.py) for its whole life, reloads included:
a second daemon on the same state dir exits 75 before it opens anything."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time
from pathlib import Path

from monitor.commands import EXIT_CONFIG, add_config_argument, load_config_or_exit, run_bounded
from monitor.config import Config, load_config
from monitor.daemon import Daemon
from monitor.errors import ConfigError, MonitorError, StateError
from monitor.meters.book import meter_specs
from monitor.model import Clock, Condition, ScaledClock
from monitor.state_check import check_state, require_sound_records, set_aside_alarms
from monitor.statelock import EXIT_IN_USE, StateDirInUseError, hold_state_dir

HELP = "run the station monitor (SIGTERM/SIGINT stop it, SIGHUP reloads the config)"
log = logging.getLogger("monitor.run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    test = parser.add_argument_group("accelerated clock (tests and simulations, never a real station)")
    test.add_argument(
        "--clock-speed", type=float, default=1.0, metavar="N",
        help="station seconds per wall second, so a test sees minutes of baseline in seconds (default 1)",
    )  # fmt: skip
    test.add_argument(
        "--clock-start", type=float, default=None, metavar="EPOCH",
        help="the wall time the accelerated clock runs from (default: now); keep it across restarts",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    config = load_config_or_exit(args.config, args.env_file)
    os.umask(0o077)  # state files are the daemon's alone, with or without systemd's UMask
    try:  # before the start-up check: it may set a running daemon's damaged copies aside
        lock = hold_state_dir(config.state_dir, "monitor run")
    except StateDirInUseError as exc:
        log.error("station %s cannot start: %s", config.station.id, exc)
        return EXIT_IN_USE
    with lock:  # held across reloads, until the process ends
        verdicts = check_state(config, busy_wait=config.store.lock_wait)
        try:
            require_sound_records(verdicts)
        except StateError as exc:
            log.error("station %s cannot start: %s", config.station.id, exc)
            return EXIT_CONFIG
        try:
            clock = ScaledClock(args.clock_speed, args.clock_start) if args.clock_speed != 1.0 else None
            run_bounded(serve(Path(args.config), config, set_aside_alarms(verdicts, time.time()), clock))
        except MonitorError as exc:
            log.error("station %s cannot run: %s", config.station.id, exc)
            return 1
    return 0


async def serve(
    path: Path, config: Config, startup: list[Condition] | None = None, clock: Clock | None = None
) -> None:
    """Run daemons one after another: a reload stops the running one cleanly and
    starts one on the new config, so there is only ever one code path for start-up.
    The signal handlers stay installed across a reload, so a stop that arrives in
    between is never the default action (an abrupt exit)."""
    from monitor.web.station import console_for  # the console sits on top of the daemon

    loop = asyncio.get_running_loop()
    daemon = Daemon(config, clock)
    daemon.pipeline.emit(startup or [])  # `state` alarms for damaged files set aside (state_check)
    reload: list[Config] = []

    def on_reload() -> None:
        if reload or daemon.stopping:  # a second stop() would exit at once
            log.info("already stopping: the reload of %s is not done", path)
            return
        try:
            new = load_config(path)
        except ConfigError as exc:
            log.error("reload of %s refused, the running config stays: %s", path, "; ".join(exc.problems))
            return
        if new.state_dir != daemon.config.state_dir:  # its lock, and the start-up check, are the old one's
            log.error(
                "reload of %s refused, the running config stays: state_dir changed (%s -> %s); "
                "a daemon keeps the state dir it started on: restart it to move",
                path,
                daemon.config.state_dir,
                new.state_dir,
            )
            return
        refused = daemon.meters.ledger.settings_refusals(meter_specs(new), time.time())
        if refused:  # the new daemon could not open the ledger: keep this one running
            log.error("reload of %s refused, the running config stays: %s", path, "; ".join(refused))
            return
        log.info("reloading %s", path)
        reload.append(new)
        daemon.reloading = True
        daemon.stop()

    def on_stop() -> None:
        if reload:  # stopping for a reload already: just do not start the next daemon
            log.info("stop requested during the reload: not starting again")
            reload.clear()
            return
        daemon.stop()

    for sig, handler in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop), (signal.SIGHUP, on_reload)):
        loop.add_signal_handler(sig, handler)
    try:
        while True:
            await daemon.run(console_for(daemon))
            if not reload:
                return
            # a clock in doubt goes on counting its steady days (`ClockFile.judge`)
            daemon = Daemon(reload.pop(), clock, steady_since=daemon.clock_file.steady_since)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
