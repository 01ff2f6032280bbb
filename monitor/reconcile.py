"""Alarms across a restart: what the journal holds as active stays so until the
engine has judged that sensor again.

After a crash the engine may restart from an older checkpoint (or none), while the
alarm journal is exact. An alarm the journal holds as active, acknowledged or not,
must neither be reported "cleared" because the engine has not seen a breach yet,
nor activated a second time (a second activation would count twice in the KPIs).

- A limit alarm (high, low) is handed to the engine as its own active state
  (`Engine.restore_active`, with its activation): it ends by the rule's deadband and
  off-delay, a reading still beyond the limit raises nothing new, and a reading from
  before the activation neither starts the off-delay nor ends it (the rule below).
- Slug, stale and comm-loss alarms wait here until a good reading of the sensor has
  been judged: a slug is kept while the baseline warms up and while an over-run is
  in progress; it clears when the reading is back within the factor, stale and
  comm-loss clear on the first good reading (data flows again).

Stale and comm-loss were raised on the clock because nothing arrived; as in the engine's
live path, the reading that ends one ends it when it is judged (the later of its own time
and the daemon's clock), so the alarm covers the downtime instead of ending at a backlog
reading's earlier stamp, before the raise.

Slug, bad-value and limit alarms were raised by readings, so only a reading stamped after
the activation can end one (monitor/engine/restored.py, the one definition the engine's
limit rules share): an older one (a device's buffer replayed, a queued or retained
MQTT message, a checkpoint from before the raise) is evidence from before the alarm
began. It neither clears the alarm nor raises it again (the journal has it active); the
engine judges it as usual (baseline, its own rules), and the alarm waits, as journaled,
for a reading after its activation. (One exception: an activation in the daemon's
future means the gateway clock stepped back since, while the daemon was down, and every
new reading is stamped "before" it; the first good one ends the alarm, journaled at the
activation and counted as an early clear, rather than the alarm standing on good readings
until the clock comes round again. "In the future" allows for a device's clock: an MQTT
payload time may run up to `mqtt.max_skew` ahead of the gateway's, and an activation so
stamped is no clock step.) Nor does a reading the engine refused (not later than
the sensor's previous one) end anything: the engine's verdict is still about an earlier
reading, so the pipeline hands the reconciler only the readings the engine took.

An alarm active for a sensor the config no longer has (a probe taken out of service and
removed, then a restart or a SIGHUP reload) could never end: nothing judges that sensor.
It is cleared at the first batch or tick, at the clock's time, with the message "sensor
removed from the configuration", and logged once. Only the sensor rules above; a pump's,
the wet well's or the gateway's alarms are not sensors' and are left to their owners.
So is a frozen alarm of a sensor whose `frozen_after` was taken off (a reload changing the
rule, not the sensor): "frozen_after removed from the configuration". Before, it stood
until the sensor's next good reading, and for ever while the sensor was silent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection

from monitor.alarms import AlarmManager
from monitor.config import Config
from monitor.config.clocks import sensor_pattern
from monitor.engine import Engine
from monitor.engine.restored import after_activation
from monitor.model import Condition, ConditionState, Kind, Quality, Rule, Sample

ENGINE_RULES = frozenset(
    {Rule.SLUG, Rule.HIGH, Rule.LOW, Rule.STALE, Rule.COMM_LOSS, Rule.BAD_VALUE, Rule.FROZEN}
)
# Raised on the clock (nothing arrived), not by a reading: ended when a reading is judged.
CLOCK_RULES = frozenset({Rule.STALE, Rule.COMM_LOSS})
# What the engine's checkpoint holds (`Engine.forget_active`); comm-loss is the sources'.
FORGETTABLE = frozenset({Rule.SLUG, Rule.HIGH, Rule.LOW, Rule.STALE, Rule.BAD_VALUE, Rule.FROZEN})

REMOVED = "sensor removed from the configuration"
FROZEN_OFF = "frozen_after removed from the configuration"

log = logging.getLogger(__name__)


def device_skew(config: Config) -> float:
    """How far ahead of the gateway clock a reading may be stamped: `mqtt.max_skew` when a
    subscription takes the time from the payload (a device's clock), else 0 (the gateway
    stamps every reading)."""
    mqtt = config.mqtt
    if mqtt is None or not any(s.time_path is not None for s in mqtt.subscriptions):
        return 0.0
    return float(mqtt.max_skew)


def device_stamped(config: Config) -> frozenset[str]:
    """The sensors whose readings carry their device's own time: fed only by MQTT
    subscriptions with a `time_path` (a templated `sensor: "plant.{1}"` matched against the
    configured ids), and the derived sensors made only of those. A gateway clock step never
    moved their stamps (engine/clock_step.py)."""
    mqtt = config.mqtt
    if mqtt is None:
        return frozenset()

    device = [sensor_pattern(s.sensor) for s in mqtt.subscriptions if s.time_path is not None]
    gateway = [sensor_pattern(s.sensor) for s in mqtt.subscriptions if s.time_path is None]
    polled = {f.sensor for d in (config.modbus.devices if config.modbus else []) for f in d.fields}
    named = device_named(config)  # a literal name decides: a template's message for it is refused
    fed = {
        s.id
        for s in config.sensors
        if s.id not in polled
        and s.kind is not Kind.DERIVED  # made by the station from its inputs, never fed
        and any(p.fullmatch(s.id) for p in device)
        and (s.id in named or not any(p.fullmatch(s.id) for p in gateway))
    }
    # A derived sample carries its inputs' time: of device-stamped inputs only, the device's
    # (config.derived is in dependency order, so a derived input is decided before).
    for sid, plan in config.derived.items():
        inputs = plan.compiled.inputs
        if inputs and all(i in fed for i in inputs):
            fed.add(sid)
    return frozenset(fed)


def device_named(config: Config) -> frozenset[str]:
    """The sensors a subscription with a `time_path` names literally (the device's clock for
    certain; one also polled or named without a `time_path` is a config error). A message
    of a template without a `time_path` that binds one is refused (`MqttSource`): one
    sensor's history cannot follow two clocks."""
    subs = config.mqtt.subscriptions if config.mqtt else []
    return frozenset(s.sensor for s in subs if s.time_path is not None and "{" not in s.sensor)


def gateway_fed(config: Config) -> frozenset[str]:
    """The sensors the gateway clock stamps for certain: polled over Modbus, or named by a
    subscription without a `time_path` (stamped at receipt). A message with a payload time
    for one of them is refused (`MqttSource`; one named so literally is a config error):
    a sensor's history cannot follow the gateway's clock and a device's across a step."""
    polled = {f.sensor for d in (config.modbus.devices if config.modbus else []) for f in d.fields}
    plain = {
        s.sensor
        for s in (config.mqtt.subscriptions if config.mqtt else [])
        if s.time_path is None and "{" not in s.sensor
    }
    return frozenset(polled | plain)


class Reconciler:
    """Holds the journal's active alarms the engine does not know yet."""

    def __init__(
        self, engine: Engine, alarms: AlarmManager, sensors: Collection[str], skew: float = 0.0
    ) -> None:
        """`skew`: `device_skew(config)`."""
        self.engine = engine
        self.alarms = alarms
        self.skew = skew
        self.unconfirmed: set[tuple[str, Rule]] = set()
        # Active, of a sensor the config no longer has (or of a rule it no longer has): why.
        self.retired: list[tuple[str, Rule, str]] = []
        self._retiring: set[tuple[str, Rule]] = set()  # said so in the log already
        for sensor, rule in alarms.active_conditions():
            if rule not in ENGINE_RULES:
                continue
            if sensor not in sensors:
                self.retired.append((sensor, rule, REMOVED))
                continue
            if rule is Rule.FROZEN and not engine.judges_frozen(sensor):
                self.retired.append((sensor, rule, FROZEN_OFF))
                continue
            alarm = alarms.get(sensor, rule)
            raised = None if alarm is None else alarm.activated_at
            # A limit alarm the engine holds (a checkpoint saved while it was active) is
            # held all the same: readings from before its activation do not end it.
            if engine.restore_active(sensor, rule, raised, skew) or rule in engine.status(sensor).active:
                continue
            self.unconfirmed.add((sensor, rule))
        self._forget_cleared(engine, set(alarms.active_conditions()))

    @staticmethod
    def _forget_cleared(engine: Engine, journaled: set[tuple[str, Rule]]) -> None:
        """The other way round: what the checkpoint holds active and the journal normal
        (cleared after the checkpoint, then a crash) is judged afresh, so a new breach is
        raised (`Engine.forget_active`); logged once each, at the restart."""
        for sensor in engine.sensors:
            for rule in engine.status(sensor).active:
                if rule not in FORGETTABLE or (sensor, rule) in journaled:
                    continue
                if engine.forget_active(sensor, rule):
                    log.warning(
                        "%s/%s: the checkpoint held it active, the alarm journal has it normal:"
                        " judged afresh from the next reading",
                        sensor,
                        rule,
                    )

    def judged(self, sample: Sample) -> list[Condition]:
        """After the engine judged `sample`: the restored alarms its verdict ends.

        Call it only for a sample the engine took: one it refused (not later than the
        sensor's previous reading) left the engine's verdict as it was, about another
        reading, and ends nothing."""
        if not self.unconfirmed or sample.quality is not Quality.GOOD:
            return []
        status = self.engine.status(sample.sensor)
        if status.quality is not Quality.GOOD:
            return []
        pending = self.engine.pending(sample.sensor)
        out = []
        for key in [k for k in self.unconfirmed if k[0] == sample.sensor]:
            rule = key[1]
            alarm = self.alarms.get(*key)
            if rule in status.active or alarm is None:
                self.unconfirmed.discard(key)  # the engine holds it now (or there is none)
                continue
            if rule is Rule.SLUG and (status.warming_up or Rule.SLUG in pending):
                continue  # cannot judge the slug yet, or the over-run goes on: stays as journaled
            if rule not in CLOCK_RULES and not self._evidence(sample.time, alarm.activated_at):
                continue  # from before the alarm began: stays as journaled
            self.unconfirmed.discard(key)
            out.append(
                Condition(
                    time=self._judged_at(sample.time) if rule in CLOCK_RULES else sample.time,
                    sensor=sample.sensor,
                    rule=rule,
                    state=ConditionState.CLEARED,
                    value=sample.value,
                    limit=alarm.limit,
                    citation=alarm.citation,
                    message="not active after restart",
                )
            )
        return out

    def retire(self, now: float) -> list[Condition]:
        """At the first batch or tick: clear the restored alarms of sensors the config no
        longer has (a probe taken out of service and removed). Nothing else could end them
        -- the engine and this reconciler judge configured sensors only -- so they stood
        active for ever on the console, in callouts and on MQTT. Cleared at the clock's
        time, saying why, and logged once each. One the journal refused to clear (a full
        disk: counted as unjournaled) is cleared again at the next batch or tick."""
        out = []
        left = []
        for sensor, rule, why in self.retired:
            alarm = self.alarms.get(sensor, rule)
            if alarm is None or not alarm.active:
                continue
            left.append((sensor, rule, why))
            if (sensor, rule) not in self._retiring:
                self._retiring.add((sensor, rule))
                if why == REMOVED:
                    log.warning(
                        "alarm %s/%s was active and %r is no longer in the config: cleared",
                        sensor,
                        rule,
                        sensor,
                    )
                else:
                    log.warning(
                        "alarm %s/%s was active and its rule is off now (%s): cleared", sensor, rule, why
                    )
            out.append(
                Condition(
                    time=max(now, alarm.activated_at or now),
                    sensor=sensor,
                    rule=rule,
                    state=ConditionState.CLEARED,
                    value=math.nan if alarm.value is None else alarm.value,
                    limit=alarm.limit,
                    citation=alarm.citation,
                    message=why,
                )
            )
        self.retired = left
        return out

    def _evidence(self, t: float, activated_at: float | None) -> bool:
        """Whether a reading stamped `t` can end an alarm raised at `activated_at`: one
        stamped after it, or any after the gateway clock stepped back (the rule, shared
        with the engine's restored limit alarms: monitor/engine/restored.py)."""
        return after_activation(t, activated_at, self.engine.clock.now(), self.skew)

    def _judged_at(self, t: float) -> float:
        """When the daemon judged a reading stamped `t`: the later of `t`, the engine's last
        tick and its clock. After a restart the engine has not ticked yet (its tick is
        -inf until the first one), so the clock is what dates the verdict."""
        return max(t, self.engine.last_tick, self.engine.clock.now())
