"""How these files were made: with the release before schema versions (main at 5936b5d), as
    git archive 5936b5d monitor | tar -x -C /tmp/release
    cd tests/cases/state-before-versions && PYTHONPATH=/tmp/release python make_state.py .
The upgrade tests (tests/test_state_files.py) open them with the current code."""

import sys
from decimal import Decimal
from pathlib import Path

from monitor.alarms.journal import Entry, Journal
from monitor.meters.ledger import Ledger
from monitor.meters.totalizer import MeterSpec
from monitor.model import Quality, Rule, Sample
from monitor.sinks.outbox import Outbox
from monitor.sinks.store import SeriesStore

out = Path(sys.argv[1])
T0 = 1_780_000_000.0
with Outbox(out / "outbox.sqlite") as box:
    box.append(
        [f"ph,station=ps-1,sensor=outfall.ph value={7 + i / 10} {int((T0 + i) * 1e9)}" for i in range(3)]
    )
with SeriesStore(out / "series.sqlite") as store:
    store.append([Sample("outfall.ph", T0 + i, 7 + i / 10, Quality.GOOD) for i in range(3)])
spec = MeterSpec(meter="shop.meter", unit="ft3", digits=6, multiplier=Decimal(1), max_rate=None)
ledger = Ledger(out / "ledger.sqlite", {"shop.meter": spec})
ledger.add_many([("shop.meter", T0 + i * 3600, Decimal(33_800 + i * 10)) for i in range(3)])
ledger.close()
j = Journal(out / "journal.sqlite")
j.append(
    Entry(
        time=T0,
        sensor="outfall.ph",
        rule=Rule.HIGH,
        event="activated",
        state="unack_active",
        priority="high",
        value=9.4,
        limit=9.0,
        citation="§139-15 C(3)",
        message="pH 9.4 > 9.0",
    )
)
j._db.close()
