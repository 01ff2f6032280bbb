"""Callout: notification pipelines, rosters with escalation, channels (e-mail, SMS/voice
through an HTTP provider, push), acknowledge links, and the gateway's dead-man heartbeat.

Sits beside `alarms/` (it listens to the `AlarmManager`); the daemon wires it, the
console mounts `monitor.web.callout` on it. See `service.py` for the flow.
"""

from monitor.callout.heartbeat import Heartbeat
from monitor.callout.service import STORE_FILE, Callout, LinkError, Sender, build_senders

__all__ = ["STORE_FILE", "Callout", "Heartbeat", "LinkError", "Sender", "build_senders"]
