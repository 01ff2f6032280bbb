"""The callout: alarms in, escalations along a roster out, durable and exactly once.

How it runs::

    callout = Callout(config, manager, clock)   # listens to the manager's transitions
    callout.resume()                            # alarms the store missed (kill -9 between the two)
    asyncio.create_task(callout.run())          # delivers due messages, retries with back-off
    callout.tick()                              # from the daemon's timer: due escalation steps

An activation that a pipeline takes starts an escalation at step 0 (the roster's first
person, now); each `delay` without acknowledgement takes the next step, through the
roster `repeat + 1` times. An acknowledgement from anywhere (console, API, MQTT, a
reply link: they all end in `AlarmManager.acknowledge`) ends it at once and cancels
what was not sent yet; return to normal ends it when the pipeline says
`stop_on_clear`; shelving, suppression or removal from service end it too.

Floods (EEMUA 191, the `alarms.flood_count` / `flood_window` the dispatcher uses):
once more than `flood_count` alarms were raised within the window, the escalations of
that window and every alarm after it are folded into one flood escalation per
pipeline, whose steps send one summary per person instead of a page per alarm.

A channel that fails is retried with doubling back-off (`retry_initial` .. `retry_max`)
and raises the diagnostic alarm `notify.<channel>/notify`, cleared by its next success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from monitor.alarms.journal import Entry
from monitor.alarms.manager import CONTINUES, AlarmManager, continues_from
from monitor.callout.message import LinkSigner, alarm_message, flood_message, local_time, nonce_of
from monitor.callout.rules import Matcher
from monitor.callout.store import CalloutStore, Escalation, Message
from monitor.callout.unset_starts import UnsetStarts
from monitor.config import Config
from monitor.config.notify import EscalationPipeline, Notify
from monitor.errors import AlarmError, MonitorError, StateError
from monitor.model import Alarm, AlarmState, Clock, Condition, ConditionState, Priority, Rule, iso, step_text

log = logging.getLogger(__name__)

STORE_FILE = "callout.sqlite"
CITATION = "station-monitor callout channel"
_UNACK = (AlarmState.UNACK, AlarmState.RTN_UNACK)
_ENDING = {"shelved": "shelved", "removed_from_service": "out of service", "suppressed": "suppressed"}
# Seconds of run time between writes of the time the running steps have waited: what a kill -9
# (or a watchdog's hard reset) can lose of it, at most, per kill.
SERVED_PERSIST = 10.0


class Sender(Protocol):
    name: str

    async def send(
        self, address: str, subject: str, text: str, link: str | None = None, priority: str = ""
    ) -> None: ...

    async def aclose(self) -> None: ...


class LinkError(MonitorError):
    """An acknowledge link that is unknown, forged, spent or expired (the text says which)."""


def build_senders(notify: Notify, station: str) -> dict[str, Sender]:
    from monitor.callout.email import EmailSender
    from monitor.callout.http import HttpSender

    out: dict[str, Sender] = {}
    for name, channel in notify.channels.items():
        if channel.type == "email":
            out[name] = EmailSender(name, channel)
        else:
            out[name] = HttpSender(name, channel, station)
    return out


class Callout:
    """See the module docstring. Call from the daemon's event loop only."""

    def __init__(
        self,
        config: Config,
        manager: AlarmManager,
        clock: Clock,
        senders: Mapping[str, Sender] | None = None,
        on_condition: Callable[[Condition], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock_set: Callable[[float], bool] | None = None,
    ) -> None:
        assert config.notify is not None
        self.config = config
        self.notify = config.notify
        self.manager = manager
        self.clock = clock
        self.station = config.station.name or config.station.id
        self.zone = config.station.zone
        self.matcher = Matcher(config)
        self.store = CalloutStore(config.state_dir / STORE_FILE)
        self.senders: Mapping[str, Sender] = senders or build_senders(self.notify, self.station)
        self.on_condition = on_condition or self._apply
        secret = self.notify.link_secret
        self.signer = None if secret is None else LinkSigner(secret.get_secret_value().encode())
        self._units = {s.id: s.effective_unit for s in config.sensors}
        self._raised: deque[float] = deque()
        self._floods: dict[str, int] = {}  # pipeline -> its running flood escalation
        # Steps the start's rule moved (a clock behind the store): escalation -> (its step,
        # when it was due before), for the clock's step forward (`clock_step`).
        self._before: dict[int, tuple[int, float]] = {}
        # Escalations that took a step in this run: their due time is this run's
        # clock's, never a right clock's from before a restart (`_behind`).
        self._stepped: set[int] = set()
        # Alarm starts stamped by a clock judged not set, kept in the store: paged after NTP
        # set it (in this run or after a restart), such an alarm has no start on this clock.
        self.unset_starts = UnsetStarts(self.store)
        # The time the running steps have waited, by the monotonic clock (a step of the
        # gateway clock does not touch it): counted since `_mark`, written every
        # SERVED_PERSIST (`_serve`); a restart on an unset clock counts it (`resume`).
        self._monotonic = monotonic
        self._mark = monotonic()
        self._unserved = 0.0
        self._serve_failing = False
        # Whether the gateway clock is set (the daemon's verdict on its heartbeat); None: taken
        # as set. A link signed on a clock not set moves with its step forward (`clock_step`).
        self.clock_set = clock_set
        self._wake = asyncio.Event()
        self.sent = 0
        self.failed = 0
        manager.listen(self.on_transition)

    def use_monotonic(self, monotonic: Callable[[], float]) -> None:
        """Measure run time by `monotonic` from now (the daemon's clock watch's: a test's
        injected one); what was counted by the old one stays counted."""
        self._serve(force=False)
        self._monotonic = monotonic
        self._mark = monotonic()

    def _serve(self, force: bool) -> None:
        """Count the run time since the last call as waited by every running step; write it
        when `SERVED_PERSIST` has gathered or `force` (a step taken, an escalation started, a
        stop). A store that refuses keeps it counted here for the next try."""
        mark = self._monotonic()
        self._unserved += max(0.0, mark - self._mark)
        self._mark = mark
        if self._unserved <= 0.0 or not (force or self._unserved >= SERVED_PERSIST):
            return
        try:
            self.store.serve(self._unserved, self.notify.link_ttl)
        except StateError as exc:  # a full disk: once per episode, not every tick
            if not self._serve_failing:
                log.error("callout: the time waited is kept and written when the store takes it: %s", exc)
            self._serve_failing = True
            return
        if self._serve_failing:
            log.info("callout: the time waited written again (%s)", step_text(self._unserved))
            self._serve_failing = False
        self._unserved = 0.0

    def _apply(self, condition: Condition) -> None:
        self.manager.apply(condition)

    # --- alarms in -------------------------------------------------------------------

    def on_transition(self, entry: Entry, alarm: Alarm) -> None:
        if entry.event == "activated" and alarm.state is AlarmState.UNACK:
            if entry.note and entry.note.startswith(CONTINUES):
                self._continued(alarm, entry.note, self.clock.now())
            else:
                self._activated(alarm, self.clock.now())
        elif entry.event == "acknowledged":
            self._end_alarm(alarm, "acknowledged", entry.actor)
            if alarm.activated_at is not None:  # acked after the clear ended its escalation
                self.store.acknowledged_after_clear(
                    alarm.sensor, str(alarm.rule), alarm.activated_at, entry.actor
                )
        elif entry.event == "cleared":
            self._end_alarm(alarm, "cleared", None, only_if_stop_on_clear=True)
        elif entry.event in _ENDING:
            self._end_alarm(alarm, _ENDING[entry.event], entry.actor)

    def resume(self) -> None:
        """After a restart: an alarm waiting for acknowledgement whose activation the store
        never saw (killed between the journal's commit and ours) starts its escalation now."""
        now = self.clock.now()
        on_call = ", ".join(f"{o['name']} ({o['pipeline']})" for o in self.matcher.on_call(now)) or "nobody"
        log.info(
            "callout: %d pipeline(s), %d people, channels %s; on call now: %s",
            len(self.notify.pipelines),
            len(self.notify.people),
            ", ".join(self.notify.channels) or "none",
            on_call,
        )
        self._behind(now, "not set yet, or stepped back while stopped")
        for alarm in self.manager.active():
            if alarm.state is AlarmState.UNACK and alarm.active:
                note = self._continues(alarm)
                if note is not None and not self.store.known(
                    alarm.sensor, str(alarm.rule), alarm.activated_at or now
                ):
                    self._continued(alarm, note, now)  # walks the event's escalation on, no new one
                else:
                    self._activated(alarm, now, counted=False)
        for esc in self.store.running("flood"):
            self._floods[esc.pipeline] = esc.id

    def _continues(self, alarm: Alarm) -> str | None:
        """The journal's note of `alarm`'s activation if it continues an earlier event: killed
        between the journal's commit and ours, `resume` took such an activation for a new
        alarm (Alice paged again, the next step put back by the time already waited)."""
        if alarm.activated_at is None:
            return None
        try:
            entries = self.manager.journal.entries(
                since=alarm.activated_at, until=alarm.activated_at + 0.001, sensor=alarm.sensor
            )
            for entry in entries:
                if entry.rule == alarm.rule and entry.event == "activated" and continues_from(entry.note):
                    return entry.note
        except StateError as exc:  # unreadable: paged as a new alarm, never silence
            log.error("callout: %s", exc)
        return None

    def _behind(self, now: float, why: str) -> None:
        """Steps and retries scheduled by a clock ahead of this one are due from now, a step
        its delay less the time it has waited (`CalloutStore.behind`), logged when there were
        any."""
        self._serve(force=True)
        try:
            steps, retries = self.store.behind(now, self.notify.retry_max)
        except StateError as exc:  # a full disk: the steps stay where they were
            log.error("callout: %s", exc)
            return
        for escalation, at_step, due, ahead in steps:
            # The first move's, and only from a clock ahead of this one (the right clock it
            # was due on): a reboot loop's next start moves it again on the unset clock. Not a
            # due time this run wrote, nor one on a clock judged not set (a reboot loop wholly
            # on the unset clock): NTP's step would page at once from an hour of last year.
            if ahead and escalation not in self._stepped and self._clock_is_set(due):
                self._before.setdefault(escalation, (at_step, due))
        moved = len(steps) + retries
        if moved:
            log.warning(
                "callout: %d escalation step(s) or message retries were due further ahead than their"
                " delay less the time they had waited on a clock ahead of this one (%s: %s); due from"
                " now instead", moved, iso(now), why,
            )  # fmt: skip

    def clock_step(self, step: float) -> None:
        """The gateway clock stepped (the daemon's clock watch; `step` < 0 back). Forward: the
        schedule moves with it (a restart on an unset clock moved Bob's step to its delay from
        then; NTP a minute later found it a year overdue and paged him at once, 14 minutes
        early), and a step the start's rule moved is due at the earlier of that and when it was
        due before (on the clock it is back on: a 30 s reboot keeps the schedule, a 2 h power
        cut pages at once, as the step was overdue). Back: the start's rule (`_behind`): a bad
        NTP server's day back left the next step due a day on, nobody after the first person
        paged. The step a restart finds in the restored history comes here too; the start's
        rule twice changes nothing. Links signed on the unset clock move with it, back or
        forward (`CalloutStore.rebase`): moved by the forward step only, a day back then NTP
        left a link valid a day late on the real clock."""
        now = self.clock.now()
        if step < 0:
            self._behind(now, f"stepped back by {step_text(step)}")
        elif not self._clock_is_set(now - step) and self._clock_is_set(now):
            self.unset_starts.clock_set()
        try:
            moved = self.store.forward(step, self._before) if step > 0 else 0
            self.store.shift_kept(step)
            links = self.store.rebase(step, now - step, not self._clock_is_set(now))
        except StateError as exc:  # a full disk: the steps stay where they were (due early)
            log.error("callout: %s", exc)
            return
        if moved:
            log.info("callout: %d escalation step(s) moved forward %s with the gateway clock", moved,
                     step_text(step))  # fmt: skip
        if links:
            log.info("callout: %d acknowledge link(s) signed on the unset clock moved %s %s with it",
                     links, "back" if step < 0 else "forward", step_text(step))  # fmt: skip

    def _clock_is_set(self, t: float) -> bool:
        """Whether a gateway clock reading `t` is judged set (`clock_set`; none: taken as set)."""
        return self.clock_set is None or self.clock_set(t)

    def _began_set(self, alarm: Alarm) -> bool:
        """Whether the alarm's start is a time of the clock as set now: not one an unset clock
        stamped before NTP set it, in this run or before a restart (a page after it said
        "since" a day of last year; `UnsetStarts`). Not judged by the time alone: an alarm on
        for months is older than the start's evidence, and its day is right."""
        began = alarm.activated_at or alarm.updated_at
        return self._clock_is_set(began) or not self.unset_starts.unset(began)

    def _activated(self, alarm: Alarm, now: float, counted: bool = True) -> None:
        pipeline = self.matcher.pipeline(alarm, now)
        if pipeline is None:
            return
        if counted:
            self._raised.append(now)
        flooding = self._flooding(now)
        activated = alarm.activated_at or now
        if self.store.known(alarm.sensor, str(alarm.rule), activated):
            return  # this activation has its escalation already (a restart's resume)
        if not self._clock_is_set(now) and not self._clock_is_set(activated) and activated <= now:
            # Stamped by this unset clock: a start from a set clock (an alarm on since before a
            # restart) is later than an unset clock reads.
            self.unset_starts.began(activated)
        esc = self._start("alarm", alarm.sensor, str(alarm.rule), activated, pipeline, now)
        if esc is None:
            return
        if flooding:
            # The summary goes out at the next tick, so the alarms of one burst share it.
            self.store.fold(esc.id, self._flood_for(pipeline, now))
        else:
            self.tick(now)

    def _continued(self, alarm: Alarm, note: str, now: float) -> None:
        """An activation that continues an earlier one's event (an overflow continuing its
        spill): one event, one escalation walked on, not a page per activation. The event's
        latest escalation (`CalloutStore.event`) decides. Ended by a return to normal, nobody
        having acknowledged: it resumes (`CalloutStore.resume`), its next step due when it was
        (at once if overdue): a float bouncing at the crest whose first clear ended Alice's
        escalation pages Bob at the delay, as one long alarm would; before, nobody after Alice
        was told while the well spilled for hours. Acknowledged (the person knows), still
        running (no `stop_on_clear`), the roster exhausted, shelved: this one pages nobody,
        its escalation stored ended ("continues"), so a restart's `resume` does not take it
        for one the store never saw. None of the event known (the store was lost, or the
        pipeline matched none of it before): paged as a new alarm, never silence."""
        activated = alarm.activated_at or now
        since = continues_from(note)
        # To the millisecond in the note; the event's first activation is at its start or later.
        chain = [] if since is None else self.store.event(alarm.sensor, str(alarm.rule), since - 0.001)
        lead = next((e for e in chain if e.status != "continues"), None)
        if lead is None:
            log.warning("callout for %s/%s: it %s, but no escalation of that event is known; paged as new",
                        alarm.sensor, alarm.rule, note)  # fmt: skip
            self._activated(alarm, now)
            return
        flood = None if lead.flood is None else self.store.get(lead.flood)
        if flood is not None and flood.status == "running":
            # Its event is in a running flood summary (one per person): it joins it, as one long
            # alarm stays in it. Resumed alone, the next person was paged for it at once.
            pipeline = self.matcher.pipeline(alarm, now)
            esc = (
                None
                if pipeline is None
                else self._start("alarm", alarm.sensor, str(alarm.rule), activated, pipeline, now)
            )
            if esc is not None:
                self.store.fold(esc.id, flood.id)
                log.info("callout for %s/%s: it %s, in the flood summary", alarm.sensor, alarm.rule, note)
            return
        if lead.status == "cleared" and lead.next_step < lead.steps:
            esc = self.store.resume(lead, activated, now)
            if esc is not None:
                log.warning(
                    "callout for %s/%s: it %s, whose escalation returned to normal unacknowledged;"
                    " resumed at step %d (%s), due %s", alarm.sensor, alarm.rule, note, esc.next_step + 1,
                    esc.next_person, iso(esc.next_at or now),
                )  # fmt: skip
                self.tick(now)
            return
        pipeline = self.matcher.pipeline(alarm, now)
        if pipeline is None:
            return
        esc = self._start("alarm", alarm.sensor, str(alarm.rule), activated, pipeline, now)
        if esc is not None:
            self.store.end(esc.id, "continues", None, now)
            log.info("callout for %s/%s: no page, it %s (%s)", alarm.sensor, alarm.rule, note, lead.status)

    def _start(
        self, kind: str, sensor: str, rule: str, activated: float, p: EscalationPipeline, now: float
    ) -> Escalation | None:
        roster = self.notify.rosters[p.roster]
        steps = len(roster) * (p.repeat + 1)
        self._serve(force=True)  # the time waited so far is the running steps', not this one's
        return self.store.start(
            kind, sensor, rule, activated, p.name, roster, steps, p.delay, p.stop_on_clear, now
        )

    def _flooding(self, now: float) -> bool:
        window = self.config.alarms.flood_window
        while self._raised and self._raised[0] <= now - window:
            self._raised.popleft()
        return len(self._raised) > self.config.alarms.flood_count

    def _flood_for(self, pipeline: EscalationPipeline, now: float) -> int:
        """The pipeline's running flood escalation, started (and the window's escalations
        folded into it) when there is none."""
        known = self._floods.get(pipeline.name)
        if known is not None:
            esc = self.store.get(known)
            if esc is not None and esc.status == "running":
                return known
        flood = self._start("flood", "(flood)", "flood", now, pipeline, now)
        assert flood is not None
        self._floods[pipeline.name] = flood.id
        window_start = now - self.config.alarms.flood_window
        for esc in self.store.running("alarm"):
            if esc.pipeline == pipeline.name and esc.started > window_start:
                self.store.fold(esc.id, flood.id)
        log.warning("alarm flood: pipeline %s sends one summary per person", pipeline.name)
        return flood.id

    def _end_alarm(
        self, alarm: Alarm, status: str, by: str | None, only_if_stop_on_clear: bool = False
    ) -> None:
        now = self.clock.now()
        floods: set[int] = set()
        for esc in self.store.find(alarm.sensor, str(alarm.rule)):
            if only_if_stop_on_clear and not esc.stop_on_clear:
                continue
            if self.store.end(esc.id, status, by, now):
                log.info(
                    "callout for %s/%s ended: %s%s",
                    alarm.sensor,
                    alarm.rule,
                    status,
                    f" by {by}" if by else "",
                )
            if esc.flood is not None:
                floods.add(esc.flood)
        for flood in floods:
            if not any(m.status in ("running", "flood") for m in self.store.members(flood)):
                self.store.end(flood, "acknowledged" if status == "acknowledged" else "cleared", by, now)

    # --- steps -----------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Take every escalation step that is due (the daemon calls this every second)."""
        now = self.clock.now() if now is None else now
        self._flooding(now)
        try:
            due = self.store.due(now)
            self._serve(force=bool(due))  # before a step starts its own count from 0
            for esc in due:
                self._step(esc, now)
        except StateError as exc:  # a full disk: the step stays due and is taken next tick
            log.error("callout: %s", exc)

    def _step(self, esc: Escalation, now: float) -> None:
        person_id = esc.roster[esc.next_step % len(esc.roster)]
        person = self.notify.people.get(person_id)
        pipeline = next((p for p in self.notify.pipelines if p.name == esc.pipeline), None)
        link: tuple[str, float, bool] | None = None
        url = None
        expires = None
        valid_for = None
        unset = not self._clock_is_set(now)
        if self.signer is not None and self.notify.link_base is not None:
            expires = now + self.notify.link_ttl
            nonce, token = self.signer.make(esc.id, person_id, expires)
            link = (nonce, expires, unset)
            url = f"{self.notify.link_base.rstrip('/')}/callout/ack/{token}"
            if unset:  # an expiry on this clock names a wrong day: say how long instead
                valid_for = self.notify.link_ttl
        if esc.kind == "flood":
            waiting = [a for a in self._flood_alarms(esc.id) if a.state in _UNACK]
            subject, text = flood_message(
                waiting, self.station, self.zone, now, url, expires, valid_for, clock_set=not unset
            )
        else:
            alarm = self.manager.get(esc.sensor, esc.rule)
            if alarm is None:
                self.store.end(esc.id, "stopped", None, now)
                return
            unit = self._units.get(alarm.sensor, "")
            subject, text = alarm_message(
                alarm,
                self.station,
                unit,
                self.zone,
                url,
                expires,
                valid_for,
                unset_now=now if unset else None,
                began_set=self._began_set(alarm),
                began_here=not unset or self.unset_starts.noted(alarm.activated_at or alarm.updated_at),
            )
        messages = []
        if person is not None:
            wanted = (
                pipeline.channels if pipeline is not None and pipeline.channels else list(person.contacts)
            )
            messages = [(ch, person.contacts[ch], subject, text) for ch in wanted if ch in person.contacts]
        if not messages:
            log.error(
                "callout %s step %d: %s has no channel of this pipeline", esc.id, esc.next_step, person_id
            )
        if self.store.step(esc, messages, person_id, link, now):
            self._stepped.add(esc.id)
            self._wake.set()

    def _flood_alarms(self, flood: int) -> list[Alarm]:
        out = []
        for m in self.store.members(flood):
            alarm = self.manager.get(m.sensor, m.rule)
            if alarm is not None:
                out.append(alarm)
        return out

    # --- delivery --------------------------------------------------------------------

    async def deliver_due(self) -> int:
        """Send every message that is due; returns how many were sent."""
        count = 0
        for m in self.store.pending(self.clock.now()):
            sender = self.senders.get(m.channel)
            if sender is None:
                continue
            try:
                link = _link_of(m.text)
                await sender.send(m.address, m.subject, m.text, link, self._priority(m.escalation))
            except MonitorError as exc:
                self._failed(m, str(exc))
                continue
            now = self.clock.now()
            self.store.sent(m, now)
            count += 1
            self.sent += 1
            log.info("callout %s step %d: %s told by %s", m.escalation, m.step, m.person, m.channel)
            self._channel_ok(m.channel, now)
        return count

    def _priority(self, escalation: int) -> str:
        """The `{priority}` an HTTP template asks for: the alarm's, a flood's highest."""
        esc = self.store.get(escalation)
        if esc is None:
            return ""
        if esc.kind == "flood":
            alarms = self._flood_alarms(esc.id)
        else:
            alarm = self.manager.get(esc.sensor, esc.rule)
            alarms = [] if alarm is None else [alarm]
        order = list(Priority)
        return str(min((a.priority for a in alarms), key=order.index, default=""))

    def _failed(self, m: Message, error: str) -> None:
        self.failed += 1
        now = self.clock.now()
        backoff = min(self.notify.retry_initial * 2**m.attempts, self.notify.retry_max)
        self.store.failed(m, error, now + backoff)
        sensor = f"notify.{m.channel}"
        existing = self.manager.get(sensor, Rule.NOTIFY)
        if existing is None or not existing.active:
            log.error("callout channel %s failing (retry in %gs): %s", m.channel, backoff, error)
            self.on_condition(
                Condition(
                    now,
                    sensor,
                    Rule.NOTIFY,
                    ConditionState.ACTIVE,
                    float(m.attempts + 1),
                    None,
                    CITATION,
                    f"channel {m.channel} failing: {error}"[:300],
                )
            )
        else:
            log.debug("callout channel %s still failing: %s", m.channel, error)

    def _channel_ok(self, channel: str, now: float) -> None:
        existing = self.manager.get(f"notify.{channel}", Rule.NOTIFY)
        if existing is not None and existing.active:
            log.info("callout channel %s recovered", channel)
            self.on_condition(
                Condition(
                    now,
                    f"notify.{channel}",
                    Rule.NOTIFY,
                    ConditionState.CLEARED,
                    0.0,
                    None,
                    CITATION,
                    f"channel {channel} delivering again",
                )
            )

    async def run(self, poll: float = 1.0) -> None:
        """Deliver until cancelled: woken by a new step, or every `poll` seconds for retries."""
        while True:
            self._wake.clear()
            try:
                await self.deliver_due()
            except MonitorError as exc:
                log.error("callout delivery: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=poll)

    # --- acknowledge links -----------------------------------------------------------

    def check_link(self, token: str) -> tuple[Escalation, str]:
        """(escalation, person id) of a valid, unspent, unexpired link; LinkError otherwise."""
        nonce = nonce_of(token)
        found = None if nonce is None else self.store.link(nonce)
        if found is None or self.signer is None:
            raise LinkError("this link is not valid")
        if not self.signer.check(token, found.escalation, found.person, found.expires):
            raise LinkError("this link is not valid")
        if found.used_at is not None:
            raise LinkError(f"this link was used already ({local_time(found.used_at, self.zone)})")
        # By two clocks: the gateway's (its expiry moved with the step that set the clock when
        # signed on it unset), and the daemon's run time since signing (an unset clock that
        # reads before a link's expiry, NTP never answering, does not keep it valid for ever).
        if self.clock.now() >= found.expires_at or found.age >= self.notify.link_ttl:
            raise LinkError("this link has expired; acknowledge on the console")
        esc = self.store.get(found.escalation)
        if esc is None:
            raise LinkError("this link is not valid")
        return esc, found.person

    def acknowledge_link(self, token: str) -> list[Alarm]:
        """Spend a link and acknowledge its alarm(s) in the person's name (the journal records
        it); a flood link acknowledges every alarm of the flood still waiting."""
        esc, person_id = self.check_link(token)
        person = self.notify.people.get(person_id)
        name = person.name if person is not None else person_id
        nonce = nonce_of(token)
        assert nonce is not None
        if not self.store.use_link(nonce, name, self.clock.now()):
            raise LinkError("this link was used already")
        keys = (
            [(m.sensor, m.rule) for m in self.store.members(esc.id)]
            if esc.kind == "flood"
            else [(esc.sensor, esc.rule)]
        )
        done = []
        for sensor, rule in keys:
            alarm = self.manager.get(sensor, rule)
            if alarm is None or alarm.state not in _UNACK:
                continue
            try:
                done.append(self.manager.acknowledge(sensor, rule, name, note="acknowledged by callout link"))
            except AlarmError as exc:
                log.info("callout link: %s", exc)
        if esc.kind == "flood":
            self.store.end(esc.id, "acknowledged", name, self.clock.now())
        return done

    # --- console ---------------------------------------------------------------------

    def status(self, limit: int = 50) -> dict[str, object]:
        """Escalations (who was told when, who is next) and who is on call now (the console)."""
        from monitor.callout.status import describe

        return describe(self, limit)

    async def aclose(self) -> None:
        self._serve(force=True)
        for sender in self.senders.values():
            await sender.aclose()
        self.store.close()


def _link_of(text: str) -> str | None:
    for word in text.split():
        if "/callout/ack/" in word:
            return word
    return None
