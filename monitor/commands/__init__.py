"""Subcommands of `monitor`; this package sits on top and may import everything."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from monitor.config import Config, load_config
from monitor.errors import ConfigError

EXIT_CONFIG = 2


def load_config_or_exit(path: str | Path) -> Config:
    """Load a config, or print one line per problem and exit 2 (never a traceback)."""
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
