"""MkDocs hooks: pages whose content comes from the code, so they cannot drift.

`<!-- config-reference -->` becomes the key-by-key reference generated from the
config schema and the commented example (`monitor config-schema --markdown`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = "<!-- config-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill in the generated configuration reference where a page asks for it."""
    del page, config, files
    if MARKER not in markdown:
        return markdown
    from monitor.commands.config_reference import config_schema, example_comments, reference_markdown

    example = (ROOT / "config" / "station.example.yaml").read_text(encoding="utf-8")
    return markdown.replace(MARKER, reference_markdown(config_schema(), example_comments(example)))
