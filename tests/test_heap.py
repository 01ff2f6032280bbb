"""monitor.heap: the replay's malloc thresholds (issue 20)."""

from __future__ import annotations

import platform
import subprocess
import sys


def test_glibc_takes_the_thresholds_and_other_c_libraries_are_left_alone() -> None:
    # In a process of its own: the thresholds are process-wide and stay set.
    code = "from monitor.heap import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(platform.libc_ver()[0] == "glibc")
