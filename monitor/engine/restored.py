"""Which readings may end an alarm restored across a restart: one definition for the
reconciler (slug, bad value; monitor/reconcile.py) and the engine's limit rules
(`Engine.restore_active`).

An alarm raised by a reading can be ended only by a reading stamped after its activation:
an older one (a device's buffer replayed, a queued or retained MQTT message, a checkpoint
from before the raise) is evidence from before the alarm began. The exception is an
activation in the gateway clock's future by more than the clock's tolerance and a device
clock's skew: the gateway clock stepped back while the daemon was down, stamps cannot
tell what came first, and waiting for the clock to come round again would hold the alarm
for the whole step on good readings (the alarm manager journals such a clear at the
activation, and counts it as an early clear).

A leaf module: `clock_step` imports the engine, the engine imports this.
"""

from __future__ import annotations

TOLERANCE = 2.0  # seconds the wall clock may drift from the monotonic one between checks


def after_activation(t: float, activated_at: float | None, now: float, skew: float) -> bool:
    """Whether a reading stamped `t` may end an alarm raised at `activated_at` (None:
    unknown), judged when the clock reads `now`; `skew`: how far ahead of the gateway
    clock a device may stamp a reading (`reconcile.device_skew`)."""
    if activated_at is None or t > activated_at:
        return True
    return activated_at > now + TOLERANCE + skew
