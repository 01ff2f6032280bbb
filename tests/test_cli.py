"""The command line: one way to name the config, help on every option, a light start."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.cli import COMMANDS, build_parser, chosen_command
from tests.cli import run_monitor

ROOT = Path(__file__).resolve().parent.parent

# Commands that read no station config (everything else takes --config FILE).
NO_CONFIG = {"demo", "config-schema", "profile", "import-telegraf", "billing rate"}
# The positional form kept for these (it was the only form before --config).
POSITIONAL = {"check-config", "modbus plan", "modbus read"}
# Modules no command needs just to start: `monitor --version` must not load them.
HEAVY = ("pydantic", "yaml", "numpy", "fastapi", "uvicorn", "pymodbus", "paho", "influxdb_client",
         "httpx", "simulators", "monitor.daemon", "monitor.web", "monitor.config")  # fmt: skip


def leaves(parser: argparse.ArgumentParser, name: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command a user can run, e.g. ("meters replace", parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield name, parser
        return
    for action in subs:
        for sub_name, sub in action.choices.items():
            yield from leaves(sub, f"{name} {sub_name}".strip())


def test_every_option_of_every_command_has_help_text() -> None:
    missing = [
        f"{cmd}: {'/'.join(a.option_strings) or a.dest}"
        for cmd, parser in [("", build_parser()), *leaves(build_parser())]
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
    ]
    assert missing == []


def test_every_command_that_reads_a_config_takes_dash_dash_config() -> None:
    commands = dict(leaves(build_parser()))
    assert {name.split()[0] for name in commands} == set(COMMANDS)
    for name, parser in commands.items():
        options = {s for a in parser._actions for s in a.option_strings}
        assert ("--config" in options) == (name not in NO_CONFIG), name
        positional = any(a.dest == "config_file" for a in parser._actions)
        assert positional == (name in POSITIONAL), name
        # Secrets resolve from the unit's secrets.env the same way on every station command.
        if "--config" in options and not name.startswith("fleet"):
            assert "--env-file" in options, name


def test_env_file_resolves_the_secrets_as_systemd_would(tmp_path: Path) -> None:
    env = tmp_path / "secrets.env"
    env.write_text(
        "# secrets\nMQTT_PASSWORD=pw\nexport INFLUX_TOKEN='tok'\n\nCONSOLE_TOKEN=\"a console token, 16+\"\n"
    )
    unset: dict[str, str | None] = dict.fromkeys(("MQTT_PASSWORD", "INFLUX_TOKEN", "CONSOLE_TOKEN"))
    example = "config/station.example.yaml"
    result = run_monitor("check-config", "--env-file", str(env), example, cwd=ROOT, env=unset)
    assert result.returncode == 0, result.stderr
    env.write_text("MQTT_PASSWORD pw\n")
    result = run_monitor("check-config", "--env-file", str(env), "config/minimal.yaml", cwd=ROOT)
    assert result.returncode == 2 and "line 1: not NAME=value" in result.stderr


@pytest.mark.parametrize("form", [["--config", "config/minimal.yaml"], ["config/minimal.yaml"]])
def test_check_config_and_modbus_plan_take_the_config_either_way(form: list[str]) -> None:
    for command in (["check-config"], ["modbus", "plan"]):
        result = run_monitor(*command, *form, cwd=ROOT)
        assert result.returncode == 0, (command, form, result.stderr)


def test_naming_the_config_twice_or_not_at_all_exits_2() -> None:
    for extra in ([], ["config/minimal.yaml", "--config", "config/minimal.yaml"]):
        result = run_monitor("check-config", *extra, cwd=ROOT)
        assert result.returncode == 2 and "--config FILE" in result.stderr, result.stderr


def fresh_python(probe: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`probe` run by a fresh interpreter from the repository root, so what is imported is
    what it imported; its exit 0 asserted."""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result


def modules_after(code: str) -> tuple[str, set[str]]:
    """`code` run by a fresh interpreter: what it printed, and every module loaded by then."""
    out = fresh_python(f"import sys\n{code}import json; print(json.dumps(sorted(sys.modules)))\n").stdout
    return out, set(json.loads(out.splitlines()[-1]))


def test_version_loads_no_heavy_module() -> None:
    """`monitor --version` under 150 ms (bench/cli.py measures it) rests on this.

    This and the next two need a fresh interpreter, to see what it imports: subprocesses."""
    said, loaded = modules_after(
        "from monitor.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
    )
    assert said.startswith("station-monitor ")
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
    assert heavy == []


def test_a_command_imports_only_its_own_module() -> None:
    said, loaded = modules_after(
        "from monitor.cli import main\n"
        "main(['billing', 'rate', '--budget', '1000', '--prior-year-kcf', '100'])\n"
    )
    assert "rate_per_kcf: 10.00" in said
    assert not {"monitor.commands.demo", "monitor.daemon", "fastapi", "simulators"} & loaded
    # The export's historian (pyarrow), ledger (NumPy) and spreadsheet writer load with the export.
    assert not {"pyarrow", "numpy", "openpyxl", "monitor.commands.billing_historian"} & loaded


def test_monitor_run_loads_no_replay_reader_and_no_unconfigured_http_client() -> None:
    """What `monitor run` imports before it is ready: the replay input (pyarrow) is for
    `monitor replay`, httpx for a configured webhook or heartbeat only."""
    _, loaded = modules_after("import monitor.commands.run, monitor.web.station\n")
    assert {"monitor.daemon", "fastapi", "uvicorn"} <= loaded  # the probe did load the daemon
    assert not {"pyarrow", "monitor.sources.replay", "httpx", "openpyxl"} & loaded


def test_demo_module_does_not_import_the_simulators() -> None:
    result = fresh_python(
        "import sys, monitor.commands.demo\nprint([m for m in sys.modules if m.startswith('simulators')])"
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "chosen"),
    [
        (["--version"], None),
        (["--help"], None),
        (["--log-level", "debug", "run", "--config", "x"], "run"),
        (["--log-json", "meters", "list"], "meters"),
        (["nonsense", "run"], None),
    ],
)
def test_the_chosen_command_is_found_before_parsing(argv: list[str], chosen: str | None) -> None:
    assert chosen_command(argv) == chosen


def test_help_lists_every_command() -> None:
    """`monitor --help` in a real process: the entry point imports every command to list it."""
    result = subprocess.run(
        [sys.executable, "-m", "monitor", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0
    for name in COMMANDS:
        assert name in result.stdout


def test_one_name_per_class() -> None:
    """`Hub`, `Counters` and `Problem` each named two different classes; never again."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "monitor").rglob("*.py")):
        for name in re.findall(r"^class (\w+)", path.read_text(encoding="utf-8"), flags=re.M):
            names.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {n: where for n, where in names.items() if len(where) > 1} == {}


# Notes the thread count OpenBLAS would read when NumPy is imported, then what is left after.
_BLAS_PROBE = """
import json, os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))
        return None
sys.meta_path.insert(0, Spy())
from monitor.cli import main
try:
    main(["replay", "--help"])
except SystemExit:
    pass
print(json.dumps([seen, os.environ.get("OPENBLAS_NUM_THREADS")]))
"""


@pytest.mark.parametrize(("user", "expected"), [(None, [["1"], None]), ("3", [["3"], "3"])])
def test_numpy_is_imported_with_one_blas_thread_unless_the_user_says(
    user: str | None, expected: list[object]
) -> None:
    """No command does linear algebra: OpenBLAS's spinning threads were 50 ms of every start.
    The variable is there for the import only (no child inherits it), a user's own is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user is not None:
        env["OPENBLAS_NUM_THREADS"] = user
    result = fresh_python(_BLAS_PROBE, env)
    assert json.loads(result.stdout.splitlines()[-1]) == expected
