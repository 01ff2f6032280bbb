"""A `doubt` record in clock.json that no daemon of this boot could have written (a hand edit,
a file copied from another gateway, a bit flip, a boot id identical across reboots): it must
never settle a clock in doubt, shorten its 7 steady days, nor fail the start.

See `monitor.clockfile` ("Kept across a restart") and `monitor.clockkept`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from monitor.clockfile import CLOCK_FILE, STEADY
from tests.test_clock_doubt_restart import doubt_left
from tests.test_clock_heartbeat import WEEK, Kernel, KernelGateway, a_week_on_a_clock_a_month_ahead
from tests.test_clock_unset import DAY, TR, errors
from tests.test_pipeline import close

NOW = TR + WEEK + 3600  # the restart's wall clock, a month behind the heartbeat
BOOT = 1000.0  # the restart's CLOCK_BOOTTIME (and awake clock): `Kernel`'s default


def keep(state: Path, **doubt: object) -> None:
    """The heartbeat file with `doubt` written over its own (a hand edit): the boot is this
    one unless `doubt` says otherwise."""
    path = state / CLOCK_FILE
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["doubt"] = {"boot_id": "boot-now", "steady_since": None, "settled": None} | doubt
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")


# Each a record consistent with the clock now (the wall clock and CLOCK_BOOTTIME moved alike
# since it), with a number no daemon of this boot writes.
FORGED: dict[str, dict[str, object]] = {
    # A steady run begun before the boot (CLOCK_MONOTONIC starts at 0): 6 days counted at once.
    "a steady run before the boot": {"since_boot": BOOT - 10, "wall": NOW - 10, "steady_since": -6 * DAY},
    # A steady run so far back that the WARNING's date could not be written: every start failed.
    "a steady run of 1e300 s": {"since_boot": BOOT - 10, "wall": NOW - 10, "steady_since": -1e300},
    # A steady run begun after the record was kept.
    "a steady run after its record": {"since_boot": BOOT - 10, "wall": NOW - 10, "steady_since": BOOT - 5},
    # Settled later in this boot than now: a clock in the future wrote it (or another boot did,
    # whose boot id is the same: a container's fixed one).
    "settled later in this boot": {"since_boot": BOOT + 86_400, "wall": NOW + 86_400, "settled": "kernel"},
    # Settled before the boot began.
    "settled before the boot": {"since_boot": -5000.0, "wall": NOW - BOOT - 5000, "settled": "kernel"},
    # Settled at a wall clock no date can name: every start failed writing the WARNING.
    "settled in the year 1e300": {"since_boot": 1e300, "wall": 1e300, "settled": "kernel"},
    # A number written as words: not a record at all.
    "a steady run in words": {"since_boot": BOOT - 10, "wall": NOW - 10, "steady_since": "-6 days"},
    # Settled on a line that forges the log (and the meter's audit) with a second line.
    "settled with a forged log line": {
        "since_boot": BOOT - 10,
        "wall": NOW - 10,
        "settled": "ok\nERROR monitor.meters: all clear",
    },
}


@pytest.mark.parametrize("forged", sorted(FORGED))
def test_a_forged_doubt_record_neither_settles_nor_shortens_the_doubt_nor_fails_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, forged: str
) -> None:
    """The clock is a month behind the heartbeat, nothing says which is right: 7 steady days.
    The file's `doubt` names this boot and moved with the clock, but holds a number no daemon
    of this boot wrote. Before, a run before the boot counted its days (a forged -6 days: the
    clock taken as right a day later, the meter's 57 readings moved), a record from later in
    the boot or before it settled the clock at start, and a huge one failed every start
    (OverflowError writing its date). Now such a record is damage: said once, the 7 days
    start again, and nothing moves until they pass."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    keep(config.state_dir, **FORGED[forged])
    kernel = Kernel(False)
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, NOW, kernel)
    try:
        assert doubt_left(gw) == STEADY
        gw.tick(NOW + 2 * 86_400, 2 * 86_400)
        assert gw.daemon.meters.ledger.clock_steps() == []
        (said,) = [e for e in errors(caplog, logging.WARNING) if "doubt" in e and "damaged" in e]
        assert "7 days" in said, said
        assert not [r for r in caplog.records if "all clear" in r.getMessage()]
    finally:
        close(gw.daemon)


def test_a_record_from_another_boot_is_not_damage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A record of an earlier boot (the gateway rebooted) is not damage: no doubt is kept across
    a reboot, and nothing is said of it beyond the doubt's own WARNING. It can fail: a record
    of another boot said 'damaged' would be noise at every reboot."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    keep(config.state_dir, boot_id="boot-before", since_boot=BOOT + 86_400, wall=NOW, steady_since=5.0)
    with caplog.at_level(logging.INFO):
        gw = KernelGateway(config, NOW, Kernel(False))
    try:
        assert doubt_left(gw) == STEADY
        assert not [e for e in errors(caplog, logging.INFO) if "damaged" in e]
    finally:
        close(gw.daemon)


class NoBootId(Kernel):
    """A container without /proc/sys/kernel/random/boot_id (or one that cannot read it)."""

    def boot_id(self) -> str | None:
        return None


def test_without_a_boot_id_nothing_is_kept_and_a_restart_counts_the_7_days_again(tmp_path: Path) -> None:
    """No boot id: nothing tells the next start's clock from another boot's, so no doubt is
    kept (the file holds none) and a restart 6 days in counts 7 days again; no failure."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    kernel = NoBootId(False)
    gw = KernelGateway(config, NOW, kernel)
    try:
        gw.tick(NOW + 6 * DAY, 6 * DAY)
    finally:
        close(gw.daemon)
    assert "doubt" not in json.loads((config.state_dir / CLOCK_FILE).read_text(encoding="utf-8"))
    kernel.mono.advance(30)
    gw = KernelGateway(config, NOW + 6 * DAY + 30, kernel)
    try:
        assert doubt_left(gw) == STEADY
    finally:
        close(gw.daemon)


@pytest.mark.parametrize(("stepped", "left"), [(1.5, DAY - 30), (2.5, STEADY)])
def test_a_step_while_down_counts_as_the_clock_watch_counts_one(
    tmp_path: Path, stepped: float, left: float
) -> None:
    """The clock moved `stepped` s unlike CLOCK_BOOTTIME while the daemon was down (a leap
    second, a small correction): under the clock watch's tolerance (2 s) it is no step, running
    or not, and the restart counts on; over it, the 7 days start again."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    kernel = Kernel(False)
    gw = KernelGateway(config, NOW, kernel)
    try:
        gw.tick(NOW + 6 * DAY, 6 * DAY)
    finally:
        close(gw.daemon)
    kernel.mono.advance(30)
    gw = KernelGateway(config, NOW + 6 * DAY + 30 + stepped, kernel)
    try:
        assert doubt_left(gw) == left
    finally:
        close(gw.daemon)


def test_a_doubt_nested_1900_deep_is_damage_not_a_failed_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A clock.json under its 4096 bytes whose `doubt` is 1900 nested lists (a garbled or
    hostile file): Python's JSON parser gave up with RecursionError, not a ValueError, and
    every start failed. It is damage like any other: taken as missing, said once."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    path = config.state_dir / CLOCK_FILE
    doc = path.read_text(encoding="utf-8").rstrip().removesuffix("}")
    path.write_text(doc + ', "doubt": ' + "[" * 1900 + "]" * 1900 + "}\n", encoding="utf-8")
    assert path.stat().st_size <= 4096
    with caplog.at_level(logging.WARNING):
        gw = KernelGateway(config, NOW, Kernel(False))
    try:
        (said,) = [e for e in errors(caplog, logging.WARNING) if "heartbeat is damaged" in e]
        assert "taken as missing" in said, said
    finally:
        close(gw.daemon)
