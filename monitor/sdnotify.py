"""systemd notification (READY, WATCHDOG, STOPPING, STATUS) without a dependency.

The protocol is one datagram to $NOTIFY_SOCKET; outside systemd it does nothing.
"""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send `READY=1`, `WATCHDOG=1`, `STATUS=...`; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Half the watchdog timeout systemd gave us, in seconds, or None without one."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit():
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6
