"""A config cannot silence an alarm (issue 12, item 6): NaN or infinity in any number or
duration, a negative duration, a duplicate key at any level exit 2 with one line per
problem naming the key (and the lines of a duplicate); reload refuses such a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import load_config
from monitor.errors import ConfigError
from tests.test_config import run_monitor

HEAD = "station: {id: ps-1}\nsensors:\n"

FINITE, FINITE_DURATION = "must be a finite number", "must be a finite duration"
# (name, the sensor as YAML, the key under sensors[0], the message)
CASES = [
    ("limit NaN", "{id: ph, kind: ph, limits: {high: .nan}}", "limits.high", FINITE),
    ("limit inf", "{id: ph, kind: ph, limits: {low: -.inf}}", "limits.low", FINITE),
    ("on_delay inf", "{id: ph, kind: ph, limits: {on_delay: .inf}}", "limits.on_delay", FINITE_DURATION),
    ("off_delay 'inf'", "{id: ph, kind: ph, limits: {off_delay: inf}}", "limits.off_delay", "'inf' is not a"),
    ("deadband inf", "{id: ph, kind: ph, limits: {deadband: .inf}}", "limits.deadband", FINITE),
    ("slug factor inf", "{id: f, kind: flow, slug: {factor: .inf}}", "slug.factor", FINITE),
    ("slug factor NaN", "{id: f, kind: flow, slug: {factor: .nan}}", "slug.factor", FINITE),
    ("slug duration NaN", "{id: f, kind: flow, slug: {duration: .nan}}", "slug.duration", FINITE_DURATION),
    (
        "negative duration",
        "{id: f, kind: flow, slug: {duration: -5}}",
        "slug.duration",
        "must not be negative",
    ),
    ("min_baseline NaN", "{id: f, kind: flow, slug: {min_baseline: .nan}}", "slug.min_baseline", FINITE),
    ("range inf", "{id: f, kind: flow, valid_range: {max: .inf}}", "valid_range.max", FINITE),
    ("stale_after inf", "{id: f, kind: flow, stale_after: .inf}", "stale_after", FINITE_DURATION),
    (
        "unknown method",
        "{id: f, kind: flow, slug: {method: average}}",
        "slug.method",
        "must be 'sustained' or",
    ),
]


@pytest.mark.parametrize(("name", "sensor", "key", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_number_that_would_silence_an_alarm_exits_2_naming_the_key(
    tmp_path: Path, name: str, sensor: str, key: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"{HEAD}  - {sensor}\n")
    expected = f"sensors[0].{key}: {message}"
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, (name, result.stdout)
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "nan" not in result.stdout


DUPLICATES = [
    (
        "second sensors block",
        HEAD + "  - {id: ph, kind: ph}\nsensors:\n  - {id: f, kind: flow}\n",
        ["sensors: duplicate key on line 4 (first on line 2)"],
    ),
    (
        "kind twice in one sensor",
        HEAD + "  - id: ph\n    kind: ph\n    kind: flow\n",
        ["sensors[0].kind: duplicate key on line 5 (first on line 4)"],
    ),
    (
        "two at different levels",
        "station: {id: ps-1, id: ps-2}\n"
        + "sensors:\n  - id: f\n    kind: flow\n    slug: {factor: 6, factor: 9}\n",
        [
            "station.id: duplicate key on line 1 (first on line 1)",
            "sensors[0].slug.factor: duplicate key on line 5",
        ],
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), DUPLICATES, ids=[d[0] for d in DUPLICATES])
def test_a_duplicate_key_exits_2_naming_the_key_and_lines(
    tmp_path: Path, name: str, text: str, expected: list[str]
) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, (name, result.stdout)
    for line in expected:
        assert line in result.stderr, result.stderr
    problems = [ln for ln in result.stderr.splitlines() if "duplicate key" in ln]
    assert len(problems) == len(expected)


def test_every_problem_is_reported_once_per_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + "  - {id: ph, kind: ph, limits: {high: .nan, on_delay: .inf, deadband: .inf}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    keys = sorted(p.split(":")[0] for p in info.value.problems)
    assert keys == ["sensors[0].limits.deadband", "sensors[0].limits.high", "sensors[0].limits.on_delay"]


def test_the_profile_cannot_silence_an_alarm_either(tmp_path: Path) -> None:
    profile = Path(__file__).resolve().parent.parent / "config" / "ordinance-139.yaml"
    text = profile.read_text(encoding="utf-8").replace("factor: 5.0", "factor: .inf")
    (tmp_path / "profile.yaml").write_text(text)
    path = tmp_path / "station.yaml"
    path.write_text("profile: profile.yaml\n" + HEAD + "  - {id: f, kind: flow}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == ["profile.slug.factor: must be a finite number"]


RANGE_CASES = [
    (
        "pH range below the §139-15 C(3) high limit",
        "{id: ph, kind: ph, valid_range: {min: 4.0, max: 8.5}}",
        "sensors[0].valid_range.max: 8.5 pH is not above the high limit 9 pH (§139-15 C(3))",
    ),
    (
        "pH range above the low limit",
        "{id: ph, kind: ph, valid_range: {min: 5.0}}",
        "sensors[0].valid_range.min: 5 pH is not below the low limit 5 pH (§139-15 C(3))",
    ),
    (
        "influent temperature in degF, the limit in degC",
        "{id: t, kind: temperature, unit: degF, influent: true, valid_range: {max: 100}}",
        "sensors[0].valid_range.max: 100 degF is not above the high limit 104 degF (§139-15 D(1))",
    ),
]


@pytest.mark.parametrize(("name", "sensor", "message"), RANGE_CASES, ids=[c[0] for c in RANGE_CASES])
def test_a_plausible_range_that_excludes_a_limit_exits_2(
    tmp_path: Path, name: str, sensor: str, message: str
) -> None:
    """A reading outside `valid_range` is bad data and never reaches a limit rule: a range
    that stops at (or short of) a limit silences that limit for good."""
    path = tmp_path / "bad.yaml"
    path.write_text(f"{HEAD}  - {sensor}\n")
    result = run_monitor("check-config", str(path))
    assert result.returncode == 2, (name, result.stdout)
    assert message in result.stderr, result.stderr


def test_a_plausible_range_around_the_limits_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(HEAD + "  - {id: ph, kind: ph, valid_range: {min: 4.5, max: 9.5}}\n")
    load_config(path)
