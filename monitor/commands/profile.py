"""`monitor profile`: print the bundled chapter 139 ordinance profile.

There is one profile file, inside the package; a station that needs other figures
saves this output beside its config and names it with `profile:`.
"""

from __future__ import annotations

import argparse
import sys

HELP = "print the bundled ordinance profile (chapter 139) to copy and adapt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    from monitor.config.load import DEFAULT_PROFILE

    sys.stdout.write(DEFAULT_PROFILE.read_text(encoding="utf-8"))
    return 0
