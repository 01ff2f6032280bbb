"""The state disk's own alarm while that disk refuses writes: transitions shown, journaled later.

The one exception to "journal first" (`AlarmManager._append`): when the journal, on the
state disk, refuses (full, read-only, I/O errors), the `disk_full` alarm's transitions and
the operators' actions on it are shown from memory (console, MQTT) and journaled, in
order, as soon as the journal takes writes again. An action sent from the console keeps
its `Idempotency-Key` here with it (and its answer, once given): the page's repeat of a
lost answer finds it and gets the first answer, and the key is journaled in the same
transaction as its action when the queue is written, as for any other write. A clean stop
writes what waits first (`close`): the operator who frees space and restarts the daemon at
once finds the episode and the actions in the journal. Lost at a kill, or at a stop while
the disk still refuses, as the queued transitions are (the journal never had them).

Bounded: at most `LATE_ACTIONS_MAX` operator actions wait at once (a client with the token
shelving and unshelving the alarm on a disk that stays full grew memory without end); past
it an action is refused as any the journal cannot take. The alarm's own transitions
(activated, cleared, a shelve's expiry) always wait: they are a few per episode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from monitor.alarms.journal import Entry, Journal
from monitor.errors import StateError
from monitor.writeonce import Prior, WriteKey, keepable

log = logging.getLogger(__name__)
LATE_ACTIONS_MAX = 100  # an operator does a handful of actions on the disk alarm in an episode


@dataclass(slots=True)
class _Waiting:
    entry: Entry
    key: WriteKey | None
    answer: str | None = None


class LateEntries:
    """Journal entries waiting for the state disk, in order, with their console keys.

    Also what the console asks for request ids of the alarm journal (`prior_write`,
    `keep_answer`, as `writeonce.Keys`): the waiting keys first, then the journal's."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._waiting: list[_Waiting] = []
        self.store = journal.keys.store

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, entry: Entry, key: WriteKey | None) -> None:
        """Queue `entry`; `StateError` for an operator's action past `LATE_ACTIONS_MAX`."""
        actions = sum(1 for w in self._waiting if w.entry.actor is not None)
        if entry.actor is not None and actions >= LATE_ACTIONS_MAX:
            raise StateError(
                f"alarm journal {self._journal.path}: {actions} actions on {entry.sensor}/{entry.rule}"
                " wait for the state disk already; free space on it first"
            )
        self._waiting.append(_Waiting(entry, key))

    def write(self) -> None:
        """Journal what waits, oldest first, each with its key; stops at the first refusal."""
        while self._waiting:
            first = self._waiting[0]
            try:
                self._journal.append(first.entry, first.key)
            except StateError:
                return
            self._waiting.pop(0)
            if first.key is not None and first.answer is not None:
                try:
                    self._journal.keys.keep_answer(first.key, first.answer)
                except StateError as exc:  # the action and its key are journaled: a repeat
                    log.warning("%s: answer not kept for a repeat: %s", self.store, exc)

    def close(self) -> None:
        """At a clean stop: journal what waits if the disk takes writes by now (nothing
        else may come to write it: the pipeline does not retry its held batch at a stop
        within its retry pause); say what is lost if it does not."""
        self.write()
        if self._waiting:
            actions = sum(1 for w in self._waiting if w.entry.actor is not None)
            first = self._waiting[0].entry
            log.warning(
                "alarm journal %s: %d transition(s) of %s/%s (%d operator action(s)) not journaled"
                " at the stop, the state disk still refuses writes: lost",
                self._journal.path, len(self._waiting), first.sensor, first.rule, actions,
            )  # fmt: skip

    def _find(self, key: WriteKey) -> _Waiting | None:
        return next(
            (
                w
                for w in self._waiting
                if w.key is not None and (w.key.owner, w.key.key) == (key.owner, key.key)
            ),
            None,
        )

    def prior_write(self, key: WriteKey) -> Prior | None:
        """The console write first sent with `key`: waiting here, or in the journal."""
        waiting = self._find(key)
        if waiting is not None:
            assert waiting.key is not None
            return Prior(request=waiting.key.request, answer=waiting.answer)
        return self._journal.keys.prior_write(key)

    def keep_answer(self, key: WriteKey, text: str) -> None:
        """The answer to repeat for `key`: kept with its waiting action, else in the journal."""
        waiting = self._find(key)
        if waiting is None:
            self._journal.keys.keep_answer(key, text)
        elif waiting.answer is None and keepable(text):
            waiting.answer = text
