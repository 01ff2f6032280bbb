"""How ledger.sqlite was made: with the release before settings periods (main at 9ef86b5,
ledger schema 1), as
    git archive 9ef86b5 monitor | tar -x -C /tmp/release
    cd tests/cases/ledger-schema-1 && PYTHONPATH=/tmp/release python make_ledger.py .
A x10 gallon meter read at noon every day of 2025Q2 and 2025Q3, a register-sized jump
on 1 August (rejected) and a swap on 1 September. tests/test_meter_settings.py opens it
with the current code."""

import sys
from decimal import Decimal
from pathlib import Path

from monitor.meters.ledger import Ledger, Replacement
from monitor.meters.totalizer import MeterSpec
from monitor.model import parse_time

out = Path(sys.argv[1])
spec = MeterSpec(
    meter="shop.meter", unit="gal", digits=6, multiplier=Decimal(10), max_rate=None, account="shop"
)
ledger = Ledger(out / "ledger.sqlite", {"shop.meter": spec})
start = parse_time("2025-04-01T12:00:00Z")
day = 86400.0
readings = []
for i in range(183):  # 1 April to 30 September
    t = start + i * day
    value = 1000 + 25 * i if t < parse_time("2025-09-01T00:00:00Z") else 25 * (i - 152)
    readings.append(("shop.meter", t, Decimal(value)))
readings[122] = ("shop.meter", readings[122][1], Decimal(900_000))  # 1 August: a glitch
ledger.add_many(readings)
swap = parse_time("2025-09-01T00:00:00Z")
ledger.record_replacement(
    Replacement("shop.meter", round(swap * 1000), Decimal(4800), Decimal(0), "J. Operator"),
    now=parse_time("2025-10-01T00:00:00Z"),
)
ledger.close()
