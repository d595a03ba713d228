"""The scheduler's exception tree: every error `scheduler` raises is a `SchedulerError`.

    SchedulerError
    ├── ConfigError      a queue, team, quota, node or policy that is not valid configuration
    ├── StateError       an event that contradicts the scheduler's state (a GPU assigned twice,
    │                    released by a job that does not hold it, a job admitted twice)
    ├── ExecutorError    an executor could not do what it was told (`scheduler.executors.errors`:
    │                    InvalidWork, JobAlreadyStarted, ExecutorUnavailable, StopTimeout,
    │                    SlurmError and its kinds)
    ├── ServiceError     the running service could not do its work (`scheduler.service`)
    │   ├── BrokerUnavailable   Kafka could not be reached or refused a request (aiokafka's
    │   │                       errors, translated in one place: `scheduler.kafka`)
    │   └── MessageRefused      Kafka refused a message for its content (too large, corrupt):
    │                           sending it again cannot succeed
    ├── Rejected         a request the scheduler refuses; its `kind` (`RejectKind`) says why:
    │                    invalid, unknown (queue, team, project, model, pool), not found,
    │                    conflict (a job already ended), forbidden (a team's priority beyond
    │                    its queue's bounds), key reused (an Idempotency-Key already used for
    │                    a different request); the API maps it to a status
    └── ApiError         an HTTP request answered with a 4xx/5xx (`scheduler.api`)

Decisions are values, not exceptions: a job that cannot be admitted gets a `JobWaiting` with its
reason. `ConfigError` and `StateError` are for callers that built an invalid configuration or
fed the state an impossible event sequence.
"""

from __future__ import annotations

from enum import StrEnum


class SchedulerError(Exception):
    """Base class of every error raised by `scheduler`."""


class ConfigError(SchedulerError):
    """Invalid scheduler configuration: queues, teams, quotas, nodes or policy."""


class StateError(SchedulerError):
    """An event that cannot be applied to the scheduler's state without breaking an invariant."""


class ServiceError(SchedulerError):
    """The service could not do its work (see the module's error tree)."""


class BrokerUnavailable(ServiceError):
    """Kafka could not be reached or refused a request."""


class MessageRefused(ServiceError):
    """Kafka refused a message for its content (too large, corrupt): sending it again cannot
    succeed. The publisher says which message instead (`scheduler.ports.Refused`), so the
    service sets that one aside; this is raised by the other Kafka calls only."""


class RejectKind(StrEnum):
    INVALID = "invalid"  # the request is malformed
    UNKNOWN = "unknown"  # it names a queue, team, project, model or pool that is not configured
    NOT_FOUND = "not_found"  # no such job (or not one the caller may see)
    CONFLICT = "conflict"  # the job is in a state that does not allow it
    FORBIDDEN = "forbidden"  # the caller may not ask for this (a priority beyond its bounds)
    KEY_REUSED = "key_reused"  # an Idempotency-Key already used for a different request


class Rejected(SchedulerError):
    """A request the scheduler refuses; `kind` says why."""

    def __init__(self, kind: RejectKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
