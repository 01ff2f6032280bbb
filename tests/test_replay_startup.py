"""What `monitor replay` imports: start-up is part of every replay's CPU time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

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
