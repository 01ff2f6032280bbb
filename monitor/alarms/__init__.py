"""Alarm management per ISA-18.2 / IEC 62682, with EEMUA 191 flood handling.

How the daemon wires it::

    manager = AlarmManager.open(config, clock)        # replays state_dir/journal.sqlite
    dispatcher = Dispatcher(config.alarms, clock,
                            notifiers=people_notifiers(config),   # log, and the webhook if configured
                            mirrors=[mqtt_alarm_publisher])
    dispatcher.attach(manager)                        # every transition reaches the dispatcher
    asyncio.create_task(dispatcher.run())
    ...
    engine.seed(manager.active_conditions())          # so a restored alarm can still clear
    manager.apply(condition)                          # each Condition from the engine
    manager.tick(); dispatcher.tick()                 # every second or so, from the Clock

The manager keeps one alarm per (sensor, rule) and hands out immutable
`monitor.model.Alarm` snapshots; every transition and operator action
(`acknowledge`, `shelve`, `unshelve`, `remove_from_service`, `return_to_service`)
is journaled before it takes effect, and an action that the state does not
allow raises `AlarmError` with a sentence an operator can read.

A consumer of alarms implements `Notifier`::

    class Notifier(Protocol):
        name: str
        async def notify(self, alarm: Alarm, reminder: bool = False) -> None: ...
        async def flood(self, flood: Flood) -> None: ...

Pass it as a *mirror* to get every transition (the MQTT publisher: retained
state must be exact), or as a *notifier* to get what a person should get
(flood summarised, chattering quietened, reminders). `AlarmManager.listen`
gives the raw (`Entry`, `Alarm`) stream synchronously (the console uses it).
"""

from typing import TYPE_CHECKING, Any

from monitor.alarms.journal import Entry, Journal
from monitor.alarms.manager import AlarmManager, journal_path
from monitor.alarms.notify import Dispatcher, Flood, LogNotifier, Notifier
from monitor.alarms.people import people_notifiers

if TYPE_CHECKING:
    from monitor.alarms.webhook import WebhookNotifier


def __getattr__(name: str) -> Any:
    """`WebhookNotifier` on first use (PEP 562): it loads httpx, which most stations never need."""
    if name == "WebhookNotifier":
        from monitor.alarms.webhook import WebhookNotifier

        return WebhookNotifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AlarmManager",
    "Dispatcher",
    "Entry",
    "Flood",
    "Journal",
    "LogNotifier",
    "Notifier",
    "WebhookNotifier",
    "journal_path",
    "people_notifiers",
]
