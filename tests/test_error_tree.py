"""The error tree drawn in monitor/errors.py's docstring is the map a reader goes by (house
style): an error class raised somewhere but missing from it (`UnsoundEntryError`, the
checkpoint's, was) is one nobody knows to catch. Every package module is imported."""

from __future__ import annotations

import importlib
import pkgutil

import monitor
import monitor.errors
from monitor.errors import MonitorError


def _all(cls: type[MonitorError]) -> set[type[MonitorError]]:
    out = set(cls.__subclasses__())
    for sub in list(out):
        out |= _all(sub)
    return out


def test_every_monitor_error_is_drawn_in_the_error_tree() -> None:
    for info in pkgutil.walk_packages(monitor.__path__, "monitor."):
        if not info.name.endswith("__main__"):  # parses the command line on import
            importlib.import_module(info.name)
    tree = monitor.errors.__doc__ or ""
    missing = sorted(c.__name__ for c in _all(MonitorError) if c.__module__.startswith("monitor."))
    missing = [name for name in missing if f" {name} " not in tree and f" {name}\n" not in tree]
    assert not missing, missing
