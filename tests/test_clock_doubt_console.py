"""What the console's gateway panel says of a clock in doubt: meter readings "not billed"
only where meter rows stood ahead of the clock, and how many.

See `monitor.health.attention` and docs/billing.md ("Not a step").
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from monitor.config import load_config
from monitor.health import attention
from monitor.meters.ledger import Ledger
from tests.test_clock_heartbeat import WEEK, Kernel, KernelGateway, a_week_on_a_clock_a_month_ahead
from tests.test_clock_unset import TR, write_heartbeat
from tests.test_meter_clock_step import METER, SPEC, meter_station
from tests.test_pipeline import close


def clock_fault(gw: KernelGateway) -> str:
    """The one gateway-panel fault that names the heartbeat."""
    (fault,) = [a["text"] for a in attention(gw.daemon.health().to_json()) if "heartbeat" in a["text"]]
    return fault


@pytest.mark.parametrize("rows", [True, False])
def test_the_clock_fault_says_not_billed_only_for_meter_readings_that_stood_ahead(
    tmp_path: Path, rows: bool
) -> None:
    """A clock a month behind its heartbeat, nothing saying which is right. With the meter's 57
    readings ahead of it, that meter's new readings alarm `backwards` and are not billed: the
    fault says so, with the count. With no meter reading ahead (the heartbeat alone is: a
    station whose meters were not read by the wrong clock, or that has none), nothing stands in
    a new reading's way. Before, both said 'meter readings alarm and are not billed', and an
    operator woken for it chased a billing loss that was not there."""
    if rows:
        config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    else:
        config = load_config(meter_station(tmp_path))
        write_heartbeat(config.state_dir, TR + 30 * 86_400 + WEEK)
    now = TR + WEEK + 3600
    gw = KernelGateway(config, now, Kernel(False))
    try:
        fault = clock_fault(gw)
        assert "days behind its heartbeat, taken for unset" in fault, fault
        if rows:
            assert "57 readings of 1 meter stood ahead of it at start" in fault, fault
            assert "alarm `backwards` and are not billed" in fault, fault
        else:
            assert "not billed" not in fault, fault
            assert "no meter reading stood ahead of it" in fault, fault
    finally:
        close(gw.daemon)


def test_a_removed_meters_readings_ahead_are_not_counted_as_held_back(tmp_path: Path) -> None:
    """A meter removed from the config (its readings kept in the ledger, `meters.unconfigured`)
    had 10 readings stamped by the same clock a month ahead. It gets no new readings, so none
    of its are held back: the fault counts the configured meter's 57 readings of 1 meter, as
    /api/health does. It can fail: the ledger's own list of meters holds the removed one."""
    config, _held = a_week_on_a_clock_a_month_ahead(tmp_path)
    wrong = TR + 30 * 86_400
    ledger = Ledger(config.state_dir / "ledger.sqlite", {METER: SPEC, "old.meter": SPEC}, now=wrong)
    ledger.add_many([("old.meter", wrong + 3 * 3600 * k, Decimal(10 + k)) for k in range(10)])
    ledger.close()
    gw = KernelGateway(config, TR + WEEK + 3600, Kernel(False))
    try:
        fault = clock_fault(gw)
        assert "57 readings of 1 meter stood ahead of it at start" in fault, fault
        clock = gw.daemon.health().to_json()["clock"]
        assert (clock["meter_rows_ahead"], clock["meters_ahead"]) == (57, 1)  # type: ignore[index]
    finally:
        close(gw.daemon)
