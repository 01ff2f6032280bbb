"""`clockfile.RELEASE_FLOOR` is moved by hand at each release; a release that forgets it fails
here. Tested, not derived: the floor must be a constant inside the installed package (a
gateway has no CHANGELOG.md and a build from a tarball no git date), and a test in `make
test`, which a release runs, is where a forgotten step is caught.

The rule: the newest release dated in CHANGELOG.md (`## [1.2.0] - 2027-03-01`, Keep a
Changelog) is at most `MARGIN` after the floor (the floor is the day the release was cut;
it is dated when published, after its candidate ran on a gateway), and the floor is not in
the future (a floor after today makes every right clock "not set": nothing moved, no
heartbeat written, for as long as it is ahead).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, date, datetime

import pytest

from monitor.clockfile import RELEASE_FLOOR
from tests.daemon_process import ROOT

MARGIN = 14 * 86_400.0  # seconds a release's date may follow its floor
HEADING = re.compile(r"^## (?!Unreleased\b)(.*)$", re.MULTILINE)
DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def newest_release(changelog: str) -> float | None:
    """The newest release date (epoch s, midnight UTC) in a Keep a Changelog text; None
    when only `Unreleased` is there. A release heading without a date is an error."""
    dates = []
    for heading in HEADING.findall(changelog):
        found = DATE.search(heading)
        if found is None:
            raise ValueError(f"release heading without a date: ## {heading}")
        day = date.fromisoformat(found.group(1))
        dates.append(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    return max(dates, default=None)


def floor_problem(changelog: str, floor: float, now: float) -> str | None:
    """What is wrong with `floor` for this changelog, or None."""
    if floor > now:
        return f"RELEASE_FLOOR {floor} is in the future: every right clock would be taken for unset"
    newest = newest_release(changelog)
    if newest is not None and newest - floor > MARGIN:
        return (
            f"RELEASE_FLOOR {floor} is {(newest - floor) / 86_400:.0f} days before the newest release"
            f" in CHANGELOG.md: move it to the day this release was cut (monitor/clockfile.py)"
        )
    return None


def test_the_release_floor_is_not_left_behind_by_the_newest_release() -> None:
    """CHANGELOG.md as it stands and the floor this code carries."""
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert floor_problem(changelog, RELEASE_FLOOR, time.time()) is None


FLOOR = 1_793_491_200.0  # 2026-11-01
NOW = 1_800_000_000.0  # 2027-01-15


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("# Changelog\n\n## Unreleased\n\n### Added\n", None),
        ("## Unreleased\n\n## [0.1.0] - 2026-11-10\n", None),
        ("## Unreleased\n\n## [0.1.0] - 2026-11-15\n", None),  # the margin, exactly
        ("## Unreleased\n\n## [0.2.0] - 2027-01-10\n\n## [0.1.0] - 2026-11-10\n", "days before"),
        ("## [0.2.0] - 2026-11-16\n", "days before"),
        ("## 0.2.0 (2027-01-02)\n", "days before"),
    ],
)
def test_the_rule_fails_a_release_that_forgot_the_floor(text: str, problem: str | None) -> None:
    """The check itself, on changelogs a release might leave: a release dated more than
    `MARGIN` after the floor fails, at or within it passes."""
    got = floor_problem(text, FLOOR, NOW)
    assert (got is None) if problem is None else (got is not None and problem in got), got


def test_a_floor_in_the_future_and_an_undated_release_fail() -> None:
    assert "in the future" in (floor_problem("## Unreleased\n", NOW + 1, NOW) or "")
    with pytest.raises(ValueError, match="without a date"):
        newest_release("## Unreleased\n\n## [0.1.0]\n")
