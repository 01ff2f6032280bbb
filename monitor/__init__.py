"""station-monitor: a monitoring daemon for a wastewater pumping-station gateway.

The public surface is deliberately small; everything else is internal and may move.
"""

from monitor.config import Config, load_config
from monitor.errors import ConfigError, MonitorError
from monitor.model import Condition, Quality, Rule, Sample

__version__ = "0.1.0"

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
