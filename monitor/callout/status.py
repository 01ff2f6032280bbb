"""The callout as the console shows it: each escalation (who was told when, by which channel,
who is next and when) and who is on call now, times in station local time as well as UTC."""

from __future__ import annotations

from typing import Protocol
from zoneinfo import ZoneInfo

from monitor.callout.message import local_time
from monitor.callout.rules import Matcher
from monitor.callout.store import CalloutStore
from monitor.config import Config
from monitor.model import Clock, iso


class Callout(Protocol):
    """What the console's view reads of `monitor.callout.service.Callout` (a protocol, so
    this module and the service do not import each other)."""

    config: Config
    clock: Clock
    zone: ZoneInfo
    matcher: Matcher
    store: CalloutStore
    sent: int
    failed: int


def describe(callout: Callout, limit: int = 50) -> dict[str, object]:
    """JSON-able state for `/api/callout`; the newest `limit` escalations first."""

    def local(t: float | None) -> str | None:
        return None if t is None else local_time(t, callout.zone)

    now = callout.clock.now()
    out = []
    for esc in callout.store.recent(limit):
        told = [
            {
                "step": m.step,
                "person": m.person,
                "channel": m.channel,
                "state": m.state,
                "sent_at": None if m.sent_at is None else iso(m.sent_at),
                "sent_local": local(m.sent_at),
                "attempts": m.attempts,
                "error": m.error,
            }
            for m in callout.store.messages(esc.id)
        ]
        nxt = esc.next_person
        out.append(
            {
                "id": esc.id,
                "kind": esc.kind,
                "sensor": esc.sensor,
                "rule": esc.rule,
                "pipeline": esc.pipeline,
                "status": esc.status,
                "started": iso(esc.started),
                "started_local": local(esc.started),
                "ended_by": esc.ended_by,
                "ended_at": None if esc.ended_at is None else iso(esc.ended_at),
                "flood": esc.flood,
                "told": told,
                "next": None
                if nxt is None or esc.next_at is None
                else {"person": nxt, "at": iso(esc.next_at), "at_local": local(esc.next_at)},
            }
        )
    return {
        "time": iso(now),
        "timezone": callout.config.station.timezone,
        "on_call": callout.matcher.on_call(now),
        "escalations": out,
        "sent": callout.sent,
        "failed": callout.failed,
    }
