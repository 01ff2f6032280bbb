"""`monitor replay --what-if`: the current and a candidate config over the same samples
in one pass; the golden case lists exactly the alarms that differ."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC
from pathlib import Path

from monitor.commands.replay_whatif import Episode, Side, chattering, compare, only
from monitor.model import Condition, ConditionState, Rule
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "tests" / "cases" / "replay" / "station-day"
WHATIF = ROOT / "tests" / "cases" / "whatif" / "station-day"


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor replay *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor("replay", *args, cwd=ROOT)


def test_golden_what_if_lists_exactly_the_alarms_that_differ() -> None:
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv")]
    result = replay(*args, "--what-if", str(WHATIF / "candidate.yaml"), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["rules"] == json.loads((WHATIF / "expected.json").read_text())
    assert list(doc) == ["station", "current", "candidate", "samples", "rules"]  # docs/engine.md
    assert doc["samples"] == 592
    for r in doc["rules"]:  # one JSON type per key, alarms or none
        for side in ("current", "candidate"):
            assert [type(r[side][k]) for k in ("count", "total_s", "longest_s", "chattering")] == [
                int, float, float, int,
            ]  # fmt: skip
    differ = {
        (r["sensor"], r["rule"], side, s["start"])
        for r in doc["rules"]
        for side in ("only_current", "only_candidate")
        for s in r[side]
    }
    assert differ == {
        ("outfall.ph", "high", "only_current", "2026-06-03T07:32:00+00:00"),
        ("outfall.ph", "stale", "only_current", "2026-06-03T07:05:00+00:00"),
    }
    text = replay(*args, "--what-if", str(WHATIF / "candidate.yaml"))
    assert text.returncode == 0, text.stderr
    assert "outfall.ph high: 1 -> 0 alarm(s)" in text.stdout
    assert "only current: 2026-06-03T07:32:00+00:00 .. 2026-06-03T07:41:00+00:00" in text.stdout
    assert "outfall.temp high: 1 -> 1 alarm(s), in alarm 0h10m00s -> 3h19m00s" in text.stdout


def test_the_same_config_twice_differs_nowhere() -> None:
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv")]
    result = replay(*args, "--what-if", str(CASE / "config.yaml"), "--format", "json")
    assert result.returncode == 0, result.stderr
    rules = json.loads(result.stdout)["rules"]
    assert len(rules) == 4
    assert all(
        r["current"] == r["candidate"] and not r["only_current"] and not r["only_candidate"] for r in rules
    )


def cond(t: float, state: ConditionState) -> Condition:
    return Condition(t, "s", Rule.HIGH, state, 1.0, 0.5, "")


def test_episodes_chattering_and_an_alarm_still_active_at_the_end() -> None:
    side = Side(chatter_count=2, chatter_window=60.0)
    on, off = ConditionState.ACTIVE, ConditionState.CLEARED
    side.add(
        [cond(t, s) for t, s in [(0, on), (10, off), (30, on), (40, off), (70, on), (75, off), (500, on)]]
    )
    side.close(800.0)
    episodes = side.episodes[("s", "high")]
    assert episodes[-1] == Episode(500.0, 800.0, True)
    assert chattering([e.start for e in episodes], 2, 60.0) == 0  # 0, 30, 70: never 3 in a minute
    assert chattering([0, 20, 40, 50, 1000, 1010, 1020], 2, 60.0) == 2  # 3+ in a minute, twice
    assert chattering([0, 20, 40, 50, 60, 70], 2, 60.0) == 1  # one episode while it lasts
    assert chattering([0, 61, 122], 2, 60.0) == 0
    assert only(episodes, [Episode(35, 36, False)]) == [episodes[0], episodes[2], episodes[3]]
    rows = compare(side, Side(), UTC)
    assert rows[0]["current"] == {"count": 4, "total_s": 325.0, "longest_s": 300.0, "chattering": 0}
    assert rows[0]["only_current"] == [
        {"start": f"1970-01-01T00:{a}+00:00", "end": f"1970-01-01T00:{b}+00:00", "still_active": a == "08:20"}
        for a, b in [("00:00", "00:10"), ("00:30", "00:40"), ("01:10", "01:15"), ("08:20", "13:20")]
    ]


def test_a_candidate_with_another_unit_judges_the_history_converted(tmp_path: Path) -> None:
    """The history is in the current config's units. A candidate that reads the temperature
    in degC (the transmitter re-ranged) judges those readings converted: 140 degF is 60 degC,
    not 140 degC, so its alarms are the current config's (the 65 degC limit is 149 degF).
    Read unconverted, it raised a 3 h high alarm and a stale one that never were."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text((CASE / "config.yaml").read_text().replace("unit: degF", "unit: degC"))
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv")]
    result = replay(*args, "--what-if", str(candidate), "--format", "json")
    assert result.returncode == 0, result.stderr
    rules = json.loads(result.stdout)["rules"]
    assert [(r["sensor"], r["rule"]) for r in rules] == [
        ("outfall.flow", "slug"), ("outfall.ph", "high"), ("outfall.ph", "stale"), ("outfall.temp", "high"),
    ]  # fmt: skip
    assert all(r["current"] == r["candidate"] and not r["only_current"] + r["only_candidate"] for r in rules)
    assert "replay: what-if: outfall.temp is degF in the history, degC in the candidate:" in result.stderr
    assert "converted for the candidate" in result.stderr


def test_a_sensor_renamed_in_the_candidate_is_said_to_have_no_samples(tmp_path: Path) -> None:
    """The history keeps the old id: the renamed sensor has no samples, so its alarms show
    as the current config's only; stderr says why, so nobody reads it as the candidate's fix."""
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text((CASE / "config.yaml").read_text().replace("id: outfall.ph", "id: outfall.ph2"))
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv")]
    result = replay(*args, "--what-if", str(candidate), "--format", "json")
    assert result.returncode == 0, result.stderr
    rules = {(r["sensor"], r["rule"]): r for r in json.loads(result.stdout)["rules"]}
    assert rules["outfall.ph", "high"]["candidate"]["count"] == 0
    assert ("outfall.ph2", "high") not in rules
    note = "what-if: no samples of outfall.ph2 (the candidate's only) in the history: it raises nothing"
    assert f"replay: {note}" in result.stderr
    assert result.stderr.count("no samples of") == 1


def test_pump_and_wet_well_alarms_are_compared_as_replay_raises_them(tmp_path: Path) -> None:
    """Two simulated days of the two-pump lift station (pump 1 fails to start on day 2): the
    what-if of the config against itself counts every alarm the replay's events hold, pump
    and wet-well rules (fail_to_start, high_level, ...) included; a candidate with a longer
    fail-to-start delay raises fewer of them. The station's rules used to be left out."""
    import yaml

    from simulators.lift_station import LiftStation

    raw = yaml.safe_load((ROOT / "config" / "pump-station.yaml").read_text(encoding="utf-8"))
    raw["state_dir"] = str(tmp_path / "state")
    raw["profile"] = str(ROOT / "monitor" / "profiles" / "barton-139.yaml")
    config = tmp_path / "station.yaml"
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    raw["wet_well"]["fail_to_start_delay"] = "10m"
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    csv = tmp_path / "station.csv"
    LiftStation(1_767_225_600.0, days=2.0).run().write_csv(csv, 10.0)
    args = ["--config", str(config), "--input", str(csv)]
    done = replay(*args, "--no-incidents", "--events", str(tmp_path / "events.jsonl"))
    assert done.returncode == 0, done.stderr
    raised: dict[tuple[str, str], int] = {}
    for line in (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        if e["state"] == "active" and e["rule"] != "bad_value":
            raised[e["sensor"], e["rule"]] = raised.get((e["sensor"], e["rule"]), 0) + 1
    assert raised.get(("ps.level", "fail_to_start"), 0) >= 5
    same = replay(*args, "--what-if", str(config), "--format", "json")
    assert same.returncode == 0, same.stderr
    rows = json.loads(same.stdout)["rules"]
    assert {(r["sensor"], r["rule"]): r["current"]["count"] for r in rows} == raised
    assert all(r["current"] == r["candidate"] for r in rows)
    longer = replay(*args, "--what-if", str(candidate), "--format", "json")
    assert longer.returncode == 0, longer.stderr
    rules = {(r["sensor"], r["rule"]): r for r in json.loads(longer.stdout)["rules"]}
    fail = rules["ps.level", "fail_to_start"]
    assert fail["candidate"]["count"] < fail["current"]["count"]


def test_what_if_with_events_exits_2_rather_than_leave_no_events_file(tmp_path: Path) -> None:
    """`--what-if` prints a comparison and writes no events; asked for both, it used to exit 0
    without the events file the Superintendent asked for."""
    args = ["--config", str(CASE / "config.yaml"), "--input", str(CASE / "input.csv")]
    result = replay(*args, "--what-if", str(WHATIF / "candidate.yaml"), "--events", str(tmp_path / "e.jsonl"))
    assert result.returncode == 2
    assert "replay: --what-if writes no events; run without --what-if for --events" in result.stderr
    assert not (tmp_path / "e.jsonl").exists()
    json_events = replay(*args, "--format", "json", "--events", str(tmp_path / "e.jsonl"))
    assert json_events.returncode == 2 and "--format is the --what-if report's" in json_events.stderr


def test_what_if_compares_the_rules_replay_writes_as_events_but_bad_value() -> None:
    """The two lists are spelled apart (replay imports the what-if module lazily; the other
    way round would be an import cycle); this keeps them the same."""
    from monitor.commands import replay as replay_command
    from monitor.commands import replay_whatif

    assert replay_command.EVENT_RULES - {Rule.BAD_VALUE} == replay_whatif.EVENT_RULES
