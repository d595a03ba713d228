"""The scheduler's ports: what the pure core needs from the world, as small Protocols.

Adapters come with the rest of the Scheduler issue — a Kafka event sink and balance feed, the
local executor (process groups pinned with `CUDA_VISIBLE_DEVICES`) and the Slurm executor —
each with an in-memory fake beside it and one contract test run against both.

Contract of an executor: `start` after the job's `GpuAssigned` events are applied; `stop`
must have ended every process of the job before its GPUs are handed to another job (a cycle
that preempts emits the victims' `GpuReleased` before the preemptor's `GpuAssigned`); what it
observes (started, finished, failed) comes back through `poll` as events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ledger.job_events import JobEvent
from scheduler.model import Balance, RunningJob


class Clock(Protocol):
    def now_us(self) -> int: ...


class EventSink(Protocol):
    """Publishes decisions on the `jobs` topic, keyed by job id or GPU UUID."""

    def publish(self, events: Sequence[JobEvent]) -> None: ...


class BalanceFeed(Protocol):
    """The latest balance per team, from the compacted `balances` topic."""

    def balances(self) -> Mapping[str, Balance]: ...


class UsageFeed(Protocol):
    """Metered GPU-ms per team since the last call, from the ledger (for fair share)."""

    def metered_since_last(self) -> Mapping[str, int]: ...


class Executor(Protocol):
    def start(self, job: RunningJob) -> None: ...

    def stop(self, job_id: str, reason: str) -> None: ...

    def poll(self) -> Sequence[JobEvent]: ...
