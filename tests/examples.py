"""How many examples a property test draws.

`make test` (what CI runs) draws each test's full count. `make check`, the edit-test loop,
sets MONITOR_TEST_TIER=check and draws a fifth (at least 10): a quick signal on every save,
while the rare cases are still searched on every CI run.
"""

from __future__ import annotations

import os


def examples(n: int) -> int:
    """`n` in the full suite; a fifth of it (at least 10) in the fast tier."""
    if os.environ.get("MONITOR_TEST_TIER") == "check":
        return max(10, n // 5)
    return n
