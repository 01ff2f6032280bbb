"""The configuration reference as Markdown, generated from the config schema.

`monitor config-schema --markdown` prints it and the docs site builds its
"Configuration reference" page from it, so the reference can never name a key
the loader does not accept, or miss one it does.
"""

from __future__ import annotations

import json
import re
from typing import Any

Schema = dict[str, Any]


def _resolve(node: Schema, defs: Schema) -> Schema:
    ref = node.get("$ref")
    if isinstance(ref, str):
        return dict(defs[ref.rsplit("/", 1)[1]])
    return node


def _variants(node: Schema, defs: Schema) -> list[Schema]:
    options = node.get("anyOf") or node.get("oneOf")
    if isinstance(options, list):
        return [v for o in options if o.get("type") != "null" for v in _variants(o, defs)]
    return [_resolve(node, defs)]


def example_comments(text: str) -> dict[str, str]:
    """`path -> comment` from a commented example config (`sensors[].unit -> gpm, gpd, ...`).

    Reads block-style keys (`key: value  # comment`), also commented-out ones
    (`# pause: 0s  # why`); a comment alone on the lines above a key counts for it."""
    key_line = re.compile(r"^(\s*)(- )?([A-Za-z_]\w*):(?:\s+([^#]*?))?\s*(?:#\s*(.*))?$")
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, path) of the open mappings
    above: list[str] = []
    for raw in text.splitlines():
        line = raw
        commented = re.match(r"^(\s*)#\s?(\s*[A-Za-z_]\w*:\s+[^#]*#.*)$", raw)
        if commented:
            line = commented.group(1) + commented.group(2)
        elif raw.strip().startswith("#"):
            note = raw.strip().lstrip("#").strip()
            # A commented-out key without a comment of its own explains nothing below it.
            above = [] if re.match(r"^[A-Za-z_]\w*:\s", note) else [*above, note]
            continue
        match = key_line.match(line)
        if not match:
            above = []
            continue
        item = bool(match.group(2))
        indent = len(match.group(1)) + (2 if item else 0)
        while stack and stack[-1][0] >= (indent - 1 if item else indent):
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if item:
            parent += "[]"
            stack.append((indent - 1, parent))
        path = f"{parent}.{match.group(3)}" if parent else match.group(3)
        comment = match.group(5) or " ".join(above)
        if comment and path not in out:
            out[path] = comment.strip()
        above = []
        if not commented and not (match.group(4) or "").strip():
            stack.append((indent, path))
    return out


def _type(node: Schema, defs: Schema) -> str:
    names = []
    for v in _variants(node, defs):
        if "enum" in v:
            names.append(" \\| ".join(f"`{e}`" for e in v["enum"]))
        elif "const" in v:
            names.append(f"`{v['const']}`")
        elif v.get("pattern", "").startswith("^(\\d+"):
            names.append("duration")
        elif v.get("pattern", "").startswith("^\\$\\{"):
            names.append("secret")
        elif v.get("type") == "array":
            names.append(f"list of {_type(v.get('items', {}), defs)}")
        elif "properties" in v:
            names.append(str(v.get("title", "mapping")) if "title" in v else "mapping")
        elif v.get("type") == "object":
            names.append("mapping")
        else:
            names.append(str(v.get("type", "any")))
    seen = list(dict.fromkeys(names))
    if "secret" in seen:
        return "secret (`${ENV}`, `{env: NAME}` or `{file: PATH}`)"
    if "duration" in seen:
        return "duration (`30s`, `15m`, `24h` or seconds)"
    return " or ".join(seen)


def _default(node: Schema, required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in node:
        return ""
    value = node["default"]
    if isinstance(value, dict | list) and value:
        return "see below" if isinstance(value, dict) else f"`{json.dumps(value)}`"
    return f"`{json.dumps(value)}`" if value is not None else "none"


def _describe(node: Schema, defs: Schema) -> str:
    text = node.get("description") or ""
    if not text:
        for v in _variants(node, defs):
            if v.get("description") and v.get("description") != "seconds" and "properties" not in v:
                text = v["description"]
    bounds = []
    for v in _variants(node, defs):
        for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                          ("exclusiveMaximum", "<"), ("minItems", "items >=")):  # fmt: skip
            if key in v and not (key == "minimum" and v.get("description") == "seconds"):
                bounds.append(f"{sign} {v[key]}")
    extra = f" ({', '.join(dict.fromkeys(bounds))})" if bounds else ""
    return (str(text).replace("\n", " ").replace("|", "\\|") + extra).strip()


def _models(node: Schema, defs: Schema) -> list[tuple[str, str, Schema]]:
    """The mappings a key holds: (path suffix, how it holds them, model) for the key
    itself, the items of a list, or the values of a name -> mapping table."""
    out: list[tuple[str, str, Schema]] = []
    variants = _variants(node, defs)
    if any(str(v.get("pattern", "")).startswith("^\\$\\{") for v in variants):
        return out  # a secret: its {env: ...} / {file: ...} form is told in the type column
    for v in variants:
        tables = [*v.get("patternProperties", {}).values(), v.get("additionalProperties")]
        if "properties" in v:
            out.append(("", "mapping", v))
        elif v.get("type") == "array":
            items = _variants(v.get("items", {}), defs)
            out += [("[]", "list of mappings", m) for m in items if "properties" in m]
        for table in tables:
            if isinstance(table, dict):
                values = _variants(table, defs)
                out += [(".<name>", "name -> mapping", m) for m in values if "properties" in m]
    return out


def reference_markdown(schema: Schema, comments: dict[str, str] | None = None, heading: str = "##") -> str:
    """One table per mapping of the config, named by its path (`modbus.devices[]`);
    `comments` (from `example_comments`) fill in what the schema does not describe."""
    comments = comments or {}
    defs = schema.get("$defs", {})
    out: list[str] = []
    queue: list[tuple[str, Schema]] = [("(top level)", schema)]
    while queue:
        path, model = queue.pop(0)
        required = set(model.get("required", []))
        rows = []
        for key, node in model.get("properties", {}).items():
            where = key if path == "(top level)" else f"{path}.{key}"
            meaning = _describe(node, defs)
            example = comments.get(where, "").replace("|", "\\|")
            if example and example not in meaning:
                meaning = f"{meaning}; {example}" if meaning else example
            kind, default = _type(node, defs), _default(node, key in required)
            subs = _models(node, defs)
            for suffix, _, sub in subs:
                variant = f" ({sub['title']})" if len(subs) > 1 and "title" in sub else ""
                queue.append((where + suffix + variant, sub))
            if subs:
                children = ", ".join(dict.fromkeys(f"`{where}{s}`" for s, _, _ in subs))
                kind = f"{subs[0][1]}: {children} below"
                default = "its defaults" if default == "see below" else default
            rows.append(f"| `{key}` | {kind} | {default} | {meaning} |")
        if model.get("additionalProperties") and not model.get("properties"):
            continue
        out += [f"{heading} `{path}`" if path != "(top level)" else f"{heading} Top level", ""]
        if model.get("description"):
            out += [str(model["description"]).strip(), ""]
        out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |", *rows, ""]
    return "\n".join(out)


def config_schema() -> Schema:
    """The JSON Schema of a station config file (what `monitor config-schema` prints)."""
    from monitor.config.load import config_json_schema

    schema = config_json_schema()
    # `profile` is a path in the YAML; the loader replaces it with the parsed profile.
    schema["properties"]["profile"] = {
        "type": "string",
        "description": "path of an ordinance profile, relative to the config file "
        "(default: the bundled chapter 139 profile, `monitor profile` prints it)",
    }
    schema.setdefault("required", [])
    schema["required"] = [r for r in schema["required"] if r != "profile"]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "station-monitor config"
    return schema
