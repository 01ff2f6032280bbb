"""The heartbeat's gaps: a clock before the release with nothing else to judge it by, a
heartbeat a clock wrong in the future wrote, and a release floor a release forgot to move.

See `monitor.clockfile` and docs/billing.md ("Not a step").
"""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path

import pytest

from monitor.clockfile import RELEASE_FLOOR
from monitor.config import load_config
from monitor.meters.ledger import Ledger
from tests.test_clock_unset import DAY, TR, Gateway, errors, heartbeat, rows_of
from tests.test_meter_clock_step import METER, SPEC, meter_station
from tests.test_pipeline import close


def test_a_1970_clock_without_a_heartbeat_moves_not_even_a_single_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first boot after install: no heartbeat yet, no engine checkpoint, no journal, and the
    gateway (no battery-backed clock, NTP not answered) reads 1970. The meter's one reading
    (installed the day before) is 56 years "ahead": before, one row ahead with nothing to
    judge by was a bad stamp, moved back to 1970 (billed in no quarter the clerk exports). A
    clock before this release's date is not set, whatever else is known: nothing moves, the
    ERROR says why, and the heartbeat is not written until NTP steps the clock forward."""
    path = meter_station(tmp_path)
    config = load_config(path)
    state = config.state_dir
    state.mkdir(parents=True)
    ledger = Ledger(state / "ledger.sqlite", {METER: SPEC}, now=TR - DAY)
    ledger.add_many([(METER, TR - DAY, Decimal(5))])
    ledger.close()
    before = rows_of(state / "ledger.sqlite")
    boot = 1000.0
    with caplog.at_level(logging.INFO):
        gw = Gateway(config, boot)
    try:
        assert rows_of(state / "ledger.sqlite") == before
        assert gw.daemon.meters.ledger.clock_steps() == []
        (said,) = [e for e in errors(caplog) if "not synchronised" in e]
        assert "before this release" in said, said
        gw.tick(boot + 60, 60)
        assert heartbeat(state) is None
        gw.tick(TR + 60, 10)  # NTP
        assert heartbeat(state) == TR + 60
    finally:
        close(gw.daemon)
    assert boot < RELEASE_FLOOR
