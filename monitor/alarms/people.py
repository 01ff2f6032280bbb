"""The notifiers a station's config asks for, for the people on call.

Apart from `webhook.py` so that a station without a webhook never loads httpx
(a fifth of `monitor run`'s start-up when it is imported for nothing).
"""

from __future__ import annotations

from monitor.alarms.notify import LogNotifier, Notifier
from monitor.config import Config


def people_notifiers(config: Config) -> list[Notifier]:
    """The notifiers a station's config asks for: always the log, the webhook when set."""
    out: list[Notifier] = [LogNotifier(units={s.id: s.effective_unit for s in config.sensors})]
    if config.alarms.webhook is not None:
        from monitor.alarms.webhook import WebhookNotifier  # httpx, only when a webhook is set

        out.append(WebhookNotifier(config.alarms.webhook, config.station.id))
    return out
