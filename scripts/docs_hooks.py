"""MkDocs hooks: pages whose content comes from the code, so they cannot drift.

`<!-- config-reference -->` becomes the key-by-key reference generated from the
config schema and the commented example (`monitor config-schema --markdown`);
`<!-- command-reference -->` the `--help` of every command, from the real parser.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = "<!-- config-reference -->"
COMMANDS = "<!-- command-reference -->"


def command_reference() -> str:
    """Every `monitor` command's help, as `monitor COMMAND [ACTION] --help` prints it."""
    import argparse
    import os

    from monitor.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; the page is fixed width
    out: list[str] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        out.extend([f"## `{name}`", "", "```", parser.format_help().rstrip(), "```", ""])
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    walk(build_parser(), "monitor")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill in the generated configuration reference where a page asks for it."""
    del page, config, files
    if COMMANDS in markdown:
        markdown = markdown.replace(COMMANDS, command_reference())
    if MARKER not in markdown:
        return markdown
    from monitor.commands.config_reference import config_schema, example_comments, reference_markdown

    example = (ROOT / "config" / "station.example.yaml").read_text(encoding="utf-8")
    return markdown.replace(MARKER, reference_markdown(config_schema(), example_comments(example)))
