"""Everything station-monitor raises derives from `MonitorError`.

Third-party exceptions (pymodbus, paho, influxdb-client, sqlite3) are translated
into these at the one adapter module that imports the library, so callers only
ever catch our types:

    MonitorError
    ├── ConfigError            config file unreadable or invalid (exit code 2)
    ├── SourceError            a field source failed
    │   ├── ModbusError        a Modbus request failed (connection, exception code)
    │   │   ├── ModbusTimeoutError      no answer within the device's timeout
    │   │   └── MalformedResponseError  an answer that does not fit the request
    │   ├── PayloadError       an MQTT payload or replay row could not be parsed
    │   │   └── StampAheadError  its own time is ahead of the gateway clock by over max_skew
    │   ├── DecodeError        registers could not be decoded as the mapped type
    │   └── InputUsageError    a replay input given in a way it cannot be read (exit code 2)
    ├── SinkError              an output failed
    │   ├── WriteError         the time-series server refused or was unreachable
    │   │   └── WriteTimeoutError  no answer within the configured timeout
    │   └── OutboxError        the local outbox could not be read or written
    ├── StateError             a checkpoint, journal or ledger is unusable
    │   ├── UnsoundEntryError      one sensor's checkpoint entry makes no sense (engine/checkpoint_entry.py)
    │   ├── StateLockedError       another process holds a state file locked (sqlite.py)
    │   ├── StateDirInUseError     another live process holds the state dir (statelock.py)
    │   └── DamagedEvidenceError   one incident's evidence does not decode (incidents/store.py)
    ├── AlarmError             an operator action is not allowed in this state
    ├── MeterError             a meter operation is invalid (e.g. replacement)
    ├── LinkError              an acknowledge link unknown, forged, spent or expired (callout/service.py)
    ├── WorkerUnavailableError no incident worker process could be started (incidents/worker.py)
    └── KeyRefusedError        an Idempotency-Key that is not one (`monitor/writeonce.py`)
"""

from __future__ import annotations

from collections.abc import Sequence


class MonitorError(Exception):
    """Root of every error station-monitor raises on purpose."""


class ConfigError(MonitorError):
    """The config is invalid; `problems` holds one `path: message` line each."""

    def __init__(self, problems: Sequence[str], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


class SourceError(MonitorError):
    """A field source (Modbus device, MQTT broker, replay file) failed."""


class ModbusError(SourceError):
    """A Modbus request failed; `exception_code` is set for protocol exceptions."""

    def __init__(self, message: str, exception_code: int | None = None) -> None:
        self.exception_code = exception_code
        super().__init__(message)


class ModbusTimeoutError(ModbusError):
    """The device did not answer within its timeout (typed: never recognised by message text)."""


class MalformedResponseError(ModbusError):
    """The device answered, but not with what was asked (short, mismatched or undecodable):
    only that request's fields are invalid; the device's other requests go on."""


class PayloadError(SourceError):
    """A payload or input row could not be turned into a sample."""


class StampAheadError(PayloadError):
    """A payload's own time is further ahead of the gateway clock than `max_skew`: which
    sensor, and by how much (the gateway clock behind, or the device's ahead)."""

    def __init__(self, message: str, sensor: str, ahead: float) -> None:
        super().__init__(message)
        self.sensor = sensor
        self.ahead = ahead


class DecodeError(SourceError):
    """Registers could not be decoded as the configured type."""


class InputUsageError(SourceError):
    """A replay input that cannot be read the way it was given (Parquet from a pipe, one
    pipe named twice): the command line is at fault, not the data, so `--input` is named
    and the exit code is 2."""


class SinkError(MonitorError):
    """An output (time-series server, outbox, local store) failed."""


class WriteError(SinkError):
    """The server refused a batch or could not be reached.

    `status` is the HTTP status (None for connection errors) and `retry_after`
    the server's Retry-After in seconds, when it sent one.
    """

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


class WriteTimeoutError(WriteError):
    """The server (or webhook receiver) did not answer within the configured timeout."""


class OutboxError(SinkError):
    """The durable outbox could not be read or written."""


class StateError(MonitorError):
    """A checkpoint, journal or ledger file is corrupt or belongs elsewhere."""


class AlarmError(MonitorError):
    """An operator action is not allowed (unknown alarm, wrong state, bad token)."""


class MeterError(MonitorError):
    """A meter operation is invalid (unknown meter, inconsistent replacement)."""
