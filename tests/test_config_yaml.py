"""The config's YAML is parsed once, by libyaml, with the pure-Python parser's errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monitor.config.load import _FAST, DEFAULT_PROFILE, duplicate_keys, load_config, parse_yaml
from monitor.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _where(text: str, loader: type) -> str:
    """The error as `_read_yaml` words it, from the given parser."""
    with pytest.raises(yaml.YAMLError) as info:
        yaml.load(text, Loader=loader)
    mark = info.value.problem_mark  # type: ignore[attr-defined]
    return f"line {mark.line + 1}, column {mark.column + 1}: {info.value.problem}"  # type: ignore[attr-defined]


def test_libyaml_does_the_parsing() -> None:
    assert yaml.__with_libyaml__ and _FAST is yaml.CSafeLoader


@pytest.mark.parametrize(
    "path", [DEFAULT_PROFILE, *sorted((ROOT / "config").glob("*.yaml"))], ids=lambda p: p.name
)
def test_documents_read_as_safe_load_reads_them(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert parse_yaml(text) == yaml.safe_load(text)


def test_scalars_resolve_as_safe_load_resolves_them() -> None:
    text = "a: 0x10\nb: 1_000\nc: 010\nd: 1:30\ne: yes\nf: 2024-01-01\ng: .inf\nh: ~\ni: '5'\n"
    assert parse_yaml(text) == yaml.safe_load(text)
    assert parse_yaml("") is None and parse_yaml("# nothing\n") is None


def test_duplicate_keys_name_both_lines() -> None:
    text = "station:\n  id: ps-1\nsensors:\n  - id: a\n    kind: flow\n    kind: level\nstation: {}\n"
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "s.yaml")
    assert info.value.problems == [
        "sensors[0].kind: duplicate key on line 6 (first on line 5)",
        "station: duplicate key on line 7 (first on line 1)",
    ]
    assert info.value.problems == duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))


@pytest.mark.parametrize(
    "text",
    [
        "station: {id: ps-1\nsensors: [\n",
        "sensors:\n\t- id: a\n",  # a tab: the message names it (libyaml's does not)
        "a: &x 1\nb: *y\n",
        "station:\n  id: ps-1\n   name: x\n",
    ],
)
def test_syntax_errors_read_as_the_pure_python_parser_words_them(text: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        _where(text, yaml.SafeLoader).replace(": ", ": invalid YAML: ", 1),
    ]
    assert _where(text, yaml.SafeLoader).split(":")[0] == _where(text, yaml.CSafeLoader).split(":")[0]


@pytest.mark.parametrize(
    "text",
    [
        "station:\n  id:\tps-1\n",  # a tab after the colon
        "sensors: [a,\tb]\n",  # in a flow sequence
        "station:\n  id: ps-1\t# the old one\n",  # before a comment
        "station:\n  id: ps-1\t\n",  # trailing
    ],
)
def test_tabs_libyaml_accepts_are_refused_as_before(text: str, tmp_path: Path) -> None:
    """libyaml takes a tab as a separator where the pure-Python parser (which read configs
    before libyaml did) refuses the file: such a file must still be refused, not read."""
    assert yaml.load(text, Loader=yaml.CSafeLoader) is not None  # libyaml alone reads it
    path = tmp_path / "tab.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [_where(text, yaml.SafeLoader).replace(": ", ": invalid YAML: ", 1)]
