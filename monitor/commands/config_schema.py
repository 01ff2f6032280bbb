"""`monitor config-schema`: the JSON Schema of the station config, for editors,
or (`--markdown`) the configuration reference the docs site shows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# The commented example config: its comments explain keys the schema leaves undescribed.
EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "station.example.yaml"

HELP = "print the JSON Schema of the station config (or, with --markdown, the reference)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown", action="store_true", help="the key-by-key reference as Markdown tables instead"
    )


def run(args: argparse.Namespace) -> int:
    from monitor.commands.config_reference import config_schema, example_comments, reference_markdown

    schema = config_schema()
    if args.markdown:
        print(reference_markdown(schema, example_comments(EXAMPLE.read_text(encoding="utf-8"))))
    else:
        print(json.dumps(schema, indent=2, ensure_ascii=False))
    return 0
