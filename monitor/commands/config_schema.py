"""`monitor config-schema`: the JSON Schema of the station config, for editors."""

from __future__ import annotations

import argparse
import json

from monitor.config import Config

HELP = "print the JSON Schema of the station config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    schema = Config.model_json_schema(by_alias=True)
    # `profile` is a path in the YAML; the loader replaces it with the parsed profile.
    schema["properties"]["profile"] = {
        "type": "string",
        "description": "path of an ordinance profile (default: the bundled chapter 139 profile)",
    }
    schema.setdefault("required", [])
    schema["required"] = [r for r in schema["required"] if r != "profile"]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "station-monitor config"
    print(json.dumps(schema, indent=2, ensure_ascii=False))
    return 0
