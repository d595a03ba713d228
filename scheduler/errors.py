"""The scheduler's exception tree: every error `scheduler` raises is a `SchedulerError`.

    SchedulerError
    ├── ConfigError      a queue, team, quota, node or policy that is not valid configuration
    ├── StateError       an event that contradicts the scheduler's state (a GPU assigned twice,
    │                    released by a job that does not hold it, a job admitted twice)
    ├── ExecutorError    an executor could not do what it was told (`scheduler.executors.errors`:
    │                    InvalidWork, JobAlreadyStarted, ExecutorUnavailable, StopTimeout,
    │                    SlurmError and its kinds)
    ├── ServiceError     the running service (`scheduler.service`): BrokerUnavailable
    ├── Rejected         a request the service refuses (unknown queue or team, a cancelled job)
    └── ApiError         an HTTP request answered with a 4xx/5xx (`scheduler.api`)

Decisions are values, not exceptions: a job that cannot be admitted gets a `JobWaiting` with its
reason. These exceptions are for callers that built an invalid configuration or fed the state
an impossible event sequence.
"""

from __future__ import annotations


class SchedulerError(Exception):
    """Base class of every error raised by `scheduler`."""


class ConfigError(SchedulerError):
    """Invalid scheduler configuration: queues, teams, quotas, nodes or policy."""


class StateError(SchedulerError):
    """An event that cannot be applied to the scheduler's state without breaking an invariant."""
