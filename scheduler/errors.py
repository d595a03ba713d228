"""The scheduler's exception tree: every error `scheduler` raises is a `SchedulerError`.

    SchedulerError
    ├── ConfigError      a queue, team, quota, node or policy that is not valid configuration
    └── StateError       an event that contradicts the scheduler's state (a GPU assigned twice,
                         released by a job that does not hold it, a job admitted twice)

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
