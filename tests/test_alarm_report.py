"""`monitor alarms report|list|journal` on a journal written by the real manager."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from monitor.alarms import AlarmManager, Journal
from monitor.config import Alarms
from monitor.model import Condition, ConditionState, ManualClock, Rule, parse_time
from tests import cli

ROOT = Path(__file__).resolve().parent.parent
PH = "outfall.ph"


def at(text: str) -> float:
    return parse_time(f"2026-{text}Z")


def write_history(state_dir: Path) -> None:
    clock = ManualClock(at("01-15T00:00:00"))
    manager = AlarmManager(Alarms(), Journal(state_dir / "journal.sqlite"), clock)

    def cond(t: float, sensor: str, rule: Rule, active: bool, cite: str = "§139-15 C(3)") -> None:
        clock.set(t)
        state = ConditionState.ACTIVE if active else ConditionState.CLEARED
        manager.apply(Condition(t, sensor, rule, state, 1.0, 0.5, cite))

    flood = at("01-20T10:00:00")
    for i in range(12):  # a flood: 12 alarms inside one 10-minute window
        cond(flood + 30 * i, f"pump{i}.flow", Rule.HIGH, True, "§139-11")
    chatter = at("01-22T08:00:00")
    for i in range(6):  # 6 activations in 6 minutes: chattering (more than 5 in 10 min)
        cond(chatter + 60 * i, "outfall.oil", Rule.HIGH, True, "§139-15 D(2)")
        cond(chatter + 60 * i + 30, "outfall.oil", Rule.HIGH, False)
    cond(at("01-25T00:00:00"), "outfall.flow", Rule.SLUG, True, "§139-11")
    cond(at("01-26T06:00:00"), "outfall.flow", Rule.SLUG, False)  # standing 30 h
    cond(at("01-31T23:00:00"), PH, Rule.HIGH, True)  # 60 min in January ...
    cond(at("02-01T01:30:00"), PH, Rule.HIGH, False)  # ... and 90 min in February
    cond(at("02-05T12:00:00"), PH, Rule.LOW, True)
    cond(at("02-05T12:30:00"), PH, Rule.LOW, False)  # + 30 min
    clock.set(at("02-06T10:00:00"))
    manager.shelve(PH, Rule.HIGH, "dana", "probe cleaning")
    cond(at("02-06T10:10:00"), PH, Rule.HIGH, True)  # not annunciated, still an excursion
    cond(at("02-06T10:20:00"), PH, Rule.HIGH, False)  # + 10 min
    clock.set(at("02-06T10:25:00"))
    manager.unshelve(PH, Rule.HIGH, "dana")
    cond(at("02-13T23:50:00"), PH, Rule.LOW, True)  # + 10 min to the end of the period
    manager.close()


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    """`monitor *args` from the repository root, in this process (tests/cli.py)."""
    return cli.run_monitor(*args, cwd=ROOT)


def station(tmp_path: Path) -> Path:
    config = tmp_path / "station.yaml"
    config.write_text(
        f"station: {{id: ps-1}}\nstate_dir: {tmp_path / 'state'}\nsensors:\n"
        "  - {id: outfall.ph, kind: ph}\n"
        "  - {id: outfall.flow, kind: flow, unit: gpm}\n"
        "  - {id: outfall.oil, kind: concentration, unit: mg/L, substance: oil}\n",
        encoding="utf-8",
    )
    return config


def test_report_figures(tmp_path: Path) -> None:
    config = station(tmp_path)
    write_history(tmp_path / "state")
    period = ["--since", "2026-01-15T00:00:00Z", "--until", "2026-02-14T00:00:00Z"]
    out = monitor("alarms", "report", "--config", str(config), *period, "--json")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["alarms"] == 22  # the activation while shelved was not annunciated
    assert rep["per_day"] == {"average": round(22 / 30, 2), "peak": 12}
    assert rep["per_10min"]["peak"] == 12
    assert rep["flood"] == {"windows": 1, "of": 4320, "percent": round(100 / 4320, 2)}
    top = rep["top10"]
    assert len(top) == 10
    assert top[0] == {"sensor": "outfall.oil", "rule": "high", "count": 6, "citation": "§139-15 D(2)"}
    assert rep["chattering"] == [{"sensor": "outfall.oil", "rule": "high", "episodes": 1}]
    stale = {(s["sensor"], s["rule"]): s for s in rep["stale"]}
    assert stale[("outfall.flow", "slug")] == {
        "sensor": "outfall.flow",
        "rule": "slug",
        "hours": 30.0,
        "still_active": False,
    }
    assert stale[("pump0.flow", "high")]["still_active"] is True  # never cleared: a standing alarm
    assert rep["ph_excursion_minutes"] == {"2026-01": {PH: 60.0}, "2026-02": {PH: 140.0}}
    assert rep["shelve_actions"] == 1

    text = monitor("alarms", "report", "--config", str(config), *period)
    assert text.returncode == 0, text.stderr
    assert "10-min windows in flood 0.02 %" in text.stdout
    assert "2026-02  outfall.ph: 2 h 20 min" in text.stdout
    assert "outfall.flow/slug: 30.0 h" in text.stdout


def test_list_and_journal(tmp_path: Path) -> None:
    config = station(tmp_path)
    write_history(tmp_path / "state")
    listing = monitor("alarms", "list", "--config", str(config))
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    # 12 flood alarms and the pH low still active; oil and the slug returned unacknowledged
    assert len(lines) == 15
    assert sum("returned_unacknowledged" in line for line in lines) == 2
    assert any("outfall.ph/low" in line and "active_unacknowledged" in line for line in lines)
    # value and limit, each in its unit (it said "value 1": no limit, no unit)
    assert any("outfall.ph/low" in line and "value 1 pH, limit 0.5 pH [" in line for line in lines), lines
    journal = monitor(
        "alarms", "journal", "--config", str(config), "--since", "2026-02-06T00:00:00Z",
        "--until", "2026-02-07T00:00:00Z", "--sensor", PH,
    )  # fmt: skip
    assert journal.returncode == 0, journal.stderr
    assert "outfall.ph/high  shelved by dana: probe cleaning -> shelved" in journal.stdout
    assert len(journal.stdout.splitlines()) == 4


def test_missing_journal_and_bad_period(tmp_path: Path) -> None:
    config = station(tmp_path)
    none = monitor("alarms", "list", "--config", str(config))
    assert none.returncode == 1 and "no alarm journal" in none.stderr
    write_history(tmp_path / "state")
    bad = monitor("alarms", "report", "--config", str(config), "--since", "lots")
    assert bad.returncode == 2 and "lots" in bad.stderr
