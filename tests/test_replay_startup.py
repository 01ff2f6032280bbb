"""What `monitor replay` imports: start-up is part of every replay's CPU time."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from monitor.cli import imports_without_gc
from monitor.commands.replay import HISTORIANS
from monitor.sources.columnar import write_parquet
from monitor.sources.historian import KINDS

# Reads a clean file through the replay's own reader, then lists the modules loaded.
_PROBE = """
import json, sys
from monitor.commands import replay
from monitor.sources.replay import read_csv
samples, report = read_csv(sys.argv[1], ["a", "b"])
assert len(samples) == 4 and not report.lines(), report.lines()
print(json.dumps(sorted(sys.modules)))
"""


MINIMAL = Path(__file__).resolve().parent.parent / "config" / "minimal.yaml"  # the probes' station


def _probe(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run in a fresh interpreter with the minimal station's path as its argument."""
    argv = [sys.executable, "-c", code, str(MINIMAL)]
    return subprocess.run(argv, capture_output=True, text=True, check=True)


def _loaded(path: Path) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


def test_historian_choices_are_the_historian_readers() -> None:
    assert HISTORIANS == KINDS


def test_a_clean_csv_replays_without_compute_parquet_or_historian(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("time,sensor,value\n1780000000,a,1\n1780000000,b,2\n1780000010,a,3\n1780000010,b,4\n")
    loaded = _loaded(path)
    assert "pyarrow.csv" in loaded  # the probe did read the file
    assert not {"pyarrow.compute", "pyarrow.parquet", "monitor.sources.historian"} & loaded


def test_a_clean_parquet_file_replays_without_compute(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    write_parquet(
        path, np.array([1.78e9, 1.78e9, 1.78e9 + 10, 1.78e9 + 10]), ["a", "b", "a", "b"], np.ones(4)
    )
    loaded = _loaded(path)
    assert "pyarrow.parquet" in loaded
    assert "pyarrow.compute" not in loaded


def test_config_validators_are_built_on_first_use() -> None:
    probe = (
        "import sys; from monitor import config; from monitor.config.load import load_config\n"
        "before = [m.__pydantic_complete__ for m in (config.Config, config.Sensor, config.Notify)]\n"
        "load_config(sys.argv[1])\n"
        "print(before, [m.__pydantic_complete__ for m in (config.Config, config.Sensor, config.Notify)])\n"
    )
    out = _probe(probe)
    # Sensor's own validator is not needed: Config's holds the sensors' schema.
    assert out.stdout.split("] [") == ["[False, False, False", "True, False, False]\n"]


def test_importing_the_config_builds_no_validator() -> None:
    """Field defaults such as `store: Store = Store()` are made without a validator."""
    probe = (
        "import json\nfrom pydantic import BaseModel\nfrom monitor import config\n"
        "import monitor.config.fleet\n"
        "def walk(c):\n    for s in c.__subclasses__():\n        yield s\n        yield from walk(s)\n"
        "print(json.dumps(sorted(m.__name__ for m in walk(BaseModel) if m.__pydantic_complete__)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_no_incident_worker_without_incidents(tmp_path: Path) -> None:
    """`--no-incidents` does not import the worker (multiprocessing, tracker, store)."""
    station = Path(__file__).resolve().parent.parent / "config" / "minimal.yaml"
    samples = tmp_path / "s.csv"
    samples.write_text("time,sensor,value\n")
    probe = (
        "import json, sys\nfrom monitor.cli import main\n"
        "code = main(['replay', '--config', sys.argv[1], '--input', sys.argv[2], '--no-incidents',"
        " '--events', sys.argv[3]])\n"
        "print(json.dumps([code, 'monitor.incidents.worker' in sys.modules]))\n"
    )
    args = [str(station), str(samples), str(tmp_path / "e.jsonl")]
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [0, False]


def test_a_station_without_derived_sensors_loads_no_expression_parser() -> None:
    probe = (
        "import sys; from monitor.config.load import load_config\n"
        "load_config(sys.argv[1])\n"
        "print('monitor.config.expression' in sys.modules)\n"
    )
    out = _probe(probe)
    assert out.stdout == "False\n"


# The collector's state when `monitor replay` is imported (start-up) and when `--what-if`
# imports its report inside the running command, through the program's own entry point.
_GC_PROBE = """
import atexit, gc, json, sys
seen = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in ("monitor.commands.replay", "monitor.commands.replay_whatif"):
            seen[name.rpartition(".")[2]] = [gc.isenabled(), gc.get_freeze_count() > 0]
        return None
sys.meta_path.insert(0, Spy())
atexit.register(lambda: print(json.dumps(seen)))
sys.argv = ["monitor", *sys.argv[1:]]
from monitor.cli import entry
entry()
"""


def test_the_command_is_imported_without_gc_and_runs_with_it(tmp_path: Path) -> None:
    """The start-up's objects are made with the collector off; the command itself runs with
    the collector on (a replay, a daemon make garbage cycles) and nothing frozen."""
    samples = tmp_path / "s.csv"
    samples.write_text("time,sensor,value\n1780000000,outfall.flow,1\n")
    argv = ["replay", "--config", str(MINIMAL), "--input", str(samples), "--what-if", str(MINIMAL)]
    out = subprocess.run([sys.executable, "-c", _GC_PROBE, *argv], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {
        "replay": [False, False],  # importing: collector off
        "replay_whatif": [True, False],  # running: collector on, nothing frozen
    }


_MAIN_PROBE = """
import gc, json, sys
if sys.argv[1] == "off":
    gc.disable()
from monitor.cli import main
config, samples, events = sys.argv[2:5]
code = main(["replay", "--config", config, "--input", samples, "--no-incidents", "--events", events])
print(json.dumps([code, gc.isenabled(), gc.get_freeze_count()]))
"""


def test_main_freezes_nothing_and_keeps_a_callers_choice(tmp_path: Path) -> None:
    """`main()` as a test (tests/cli.py) or a program embedding it calls it: the collector is
    on again afterwards and nothing is frozen; one the caller turned off stays off."""
    samples = tmp_path / "s.csv"
    samples.write_text("time,sensor,value\n1780000000,outfall.flow,1\n")
    args = [str(MINIMAL), str(samples), str(tmp_path / "e.jsonl")]
    for state, expected in (("on", [0, True, 0]), ("off", [0, False, 0])):
        out = subprocess.run(
            [sys.executable, "-c", _MAIN_PROBE, state, *args], capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout.splitlines()[-1]) == expected, state


def test_what_the_imports_made_goes_to_the_oldest_generation() -> None:
    """Not walked by the young collections that follow (nor by any while importing), and
    not frozen: a full collection still frees what became garbage."""
    made: list[object] = []
    assert gc.isenabled()
    with imports_without_gc():
        assert not gc.isenabled()
        made.extend([i] for i in range(1000))  # lists: tracked by the collector
        assert gc.is_tracked(made[0])
    assert gc.isenabled() and gc.get_freeze_count() == 0
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in made)
    young = {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)}
    assert not any(id(o) in young for o in made)


# The value pydantic reads when it first looks for plugins (building the config's validator).
_PLUGIN_PROBE = """
import json, os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "pydantic.plugin._loader":
            seen.append(os.environ.get("PYDANTIC_DISABLE_PLUGINS"))
        return None
sys.meta_path.insert(0, Spy())
from monitor.cli import main
code = main(["check-config", sys.argv[1]])
print(json.dumps([code, seen]))
"""


@pytest.mark.parametrize(("user", "expected"), [(None, "__all__"), ("", ""), ("logfire", "logfire")])
def test_pydantic_looks_for_no_plugins_unless_the_user_says(user: str | None, expected: str) -> None:
    """The entry-point scan of every installed distribution found nothing, 5-7 ms a start;
    a user's own PYDANTIC_DISABLE_PLUGINS (empty: load them all) is kept."""
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if user is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = user
    out = subprocess.run(
        [sys.executable, "-c", _PLUGIN_PROBE, str(MINIMAL)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [0, [expected]]


# The config sections every command that reads a station config imports (not the fleet's).
SECTIONS = ("incidents", "load", "notify", "outputs", "sensors", "sources", "station_models", "types")


def test_config_models_are_declared_with_evaluated_annotations() -> None:
    """With `from __future__ import annotations` every field's annotation is a string that
    pydantic turns into a ForwardRef (a `compile()` each, ~315 at start-up) and evaluates:
    1.5% of a 100-row replay's instructions. A model naming its own class in a validator's
    return type quotes that one instead (a return type is not a field)."""
    from monitor.config.types import Section

    for name in SECTIONS:
        importlib.import_module(f"monitor.config.{name}")

    def walk(cls: type[Section]) -> Iterator[type[Section]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    modules = {f"monitor.config.{name}" for name in SECTIONS}
    models = [m for m in walk(Section) if m.__module__ in modules]
    assert {m.__module__ for m in models} == modules - {"monitor.config.types"}  # all seen
    strings = [
        f"{m.__name__}.{field}"
        for m in models
        for field, annotation in vars(m).get("__annotations__", {}).items()
        if isinstance(annotation, str)
    ]
    assert strings == []


_SECTIONS_PROBE = """
import json, sys
from monitor.config.load import load_config
config = load_config(sys.argv[1])
print(json.dumps([type(config.modbus).__name__, "monitor.config.notify" in sys.modules,
                  "monitor.config.sources" in sys.modules]))
"""


def test_a_station_without_notify_or_sources_never_loads_their_models(tmp_path: Path) -> None:
    """`notify`, `modbus` and `mqtt` are imported and compiled only for a config that has
    them (4.6% of a 100-row replay's instructions); the minimal station has `modbus`."""
    bare = tmp_path / "bare.yaml"
    bare.write_text("station: {id: ps-1}\nsensors:\n  - {id: outfall.flow, kind: flow, unit: gpm}\n")
    for path, expected in ((bare, ["NoneType", False, False]), (MINIMAL, ["Modbus", False, True])):
        out = subprocess.run(
            [sys.executable, "-c", _SECTIONS_PROBE, str(path)], capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == expected, path


@pytest.mark.parametrize(
    ("sections", "problems"),
    [
        ("notify: 5\n", ["notify: must be a valid dictionary or instance of Notify"]),
        ("notify: null\nmodbus: null\nmqtt: null\n", []),
        (
            "modbus: []\nmqtt: 'x'\nnotify: {}\n",
            [
                "modbus: must be a valid dictionary or instance of Modbus",
                "mqtt: must be a valid dictionary or instance of Mqtt",
            ],
        ),
        (
            "notify:\n  peeple: []\n  channels: {x: {type: email, host: h, sender: a@b, prot: 5}}\n",
            [
                "notify.channels.x.email.prot: unknown key (did you mean 'port'?)",
                "notify.peeple: unknown key (did you mean 'people'?)",
            ],
        ),
        (
            "mqtt: {host: x, port: .nan, subscriptions: [{topic: a, sensr: outfall.flow}]}\n"
            "notify: {people: {bob: {email: x}}, pipelines: {p: {steps: [{to: ghost}]}}}\n",
            [
                "mqtt.port: must be a finite number",
                "mqtt.subscriptions[0].sensor: required",
                "mqtt.subscriptions[0].sensr: unknown key (did you mean 'sensor'?)",
                "notify.people.bob.name: required",
                "notify.people.bob.contacts: required",
                "notify.people.bob.email: unknown key",
                "notify.pipelines: must be a valid list",
            ],
        ),
        (
            "influx: {url: 'ftp://x', databse: y, api: 3}\nbilling: {rate: -1, acounts: []}\n"
            "wet_well: {level: outfall.flow, pumps: [], weir: {kind: v}}\n",
            [
                "influx.url: String should match pattern '^https?://'",
                "influx.api: must be 'v2' or 'v1'",
                "influx.databse: unknown key (did you mean 'database'?)",
                "billing.rate_per_kcf: required",
                "billing.rate: unknown key",
                "billing.acounts: unknown key (did you mean 'accounts'?)",
                "wet_well.weir.length: required",
                "wet_well.weir.kind: unknown key",  # no hint: weir has no such key (d23ecca)
            ],
        ),
        (
            "influx: 5\nwet_well: 7\n",
            [
                "influx: must be a valid dictionary or instance of Influx",
                "wet_well: must be a valid dictionary or instance of WetWell",
            ],
        ),
    ],
)
def test_a_lazy_section_reports_its_problems_where_they_are(sections: str, problems: list[str]) -> None:
    """Validated by its own model inside Config's: the same lines, keys and hints as when
    Config's validator held the section's schema (these lines are what main printed)."""
    from monitor.config.load import build_config
    from monitor.errors import ConfigError

    raw = yaml.safe_load(
        "station: {id: ps-1}\nsensors:\n  - {id: outfall.flow, kind: flow, unit: gpm}\n" + sections
    )
    try:
        build_config(raw)
    except ConfigError as exc:
        assert exc.problems == problems
    else:
        assert problems == []
