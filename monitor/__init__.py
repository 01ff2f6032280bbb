"""station-monitor: a monitoring daemon for a wastewater pumping-station gateway.

The public surface is deliberately small; everything else is internal and may move.
The names are resolved on first use (PEP 562), so `monitor --version` does not pay
for pydantic, YAML and NumPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from monitor.config import Config, load_config
    from monitor.errors import ConfigError, MonitorError
    from monitor.model import Condition, Quality, Rule, Sample

_HOME = {
    "Config": "monitor.config",
    "load_config": "monitor.config",
    "ConfigError": "monitor.errors",
    "MonitorError": "monitor.errors",
    "Condition": "monitor.model",
    "Quality": "monitor.model",
    "Rule": "monitor.model",
    "Sample": "monitor.model",
}

__all__ = [
    "Condition",
    "Config",
    "ConfigError",
    "MonitorError",
    "Quality",
    "Rule",
    "Sample",
    "__version__",
    "load_config",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'monitor' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
