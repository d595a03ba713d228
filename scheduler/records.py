"""Jobs as the scheduler's API sees them: what a submission asks for (`SubmitRequest`), the
priorities a team may ask for in a queue (`PriorityBounds`) and what is shown of a job
(`JobRecord`).

A `JobRecord` is a fold of its job's events (`advance`), in the order they were applied; GPU
events do not change it. Its `state` is `PENDING` from submission, after a preemption and after
a failure that is retried (which also moves `attempt` on); `RUNNING` from admission; and one of
the ended states after that for good (`JobState.ended`), with `ended_us` set.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobStarted,
    JobWaiting,
)
from ledger.topology import TopologyNeed
from scheduler.frozen_copy import replaced
from scheduler.ports import Work


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """A validated submission (shape and ranges checked by the API, names by
    `Dispatcher.submit`). `models`: the GPU models the job accepts (empty: any); `topology`:
    what the gang requires of where its GPUs sit (`node` implies `span_nodes=False`)."""

    team: str
    project: str
    user: str
    queue: str
    gpus: int
    work: Work
    estimated_runtime_us: int | None = None
    max_runtime_us: int | None = None
    models: tuple[str, ...] = ()
    pool: str | None = None
    span_nodes: bool = True
    priority: int | None = None
    topology: TopologyNeed | None = None
    mig_profile: str | None = None  # `gpus` MIG instances of this profile (`ledger.fractional`)
    gpu_share: int | None = None  # a time-sliced share of one GPU, in per-mille
    admin: bool = False  # made with the admin's token (may exceed a queue's priority bounds)
    idempotency_key: str | None = None
    client: str | None = None  # the API caller's address: an API request says who and where
    caller: str | None = None  # the API caller's name (`ledger.roles.Caller.name`)

    @property
    def requested_by(self) -> str:
        """Whose request this is, the scope of its idempotency key: the caller's name (`admin`,
        `team:<name>`, `<role>:<token name>`); without one `admin` or `team:<name>`."""
        if self.caller is not None:
            return self.caller
        return "admin" if self.admin else f"team:{self.team}"


@dataclass(frozen=True, slots=True)
class PriorityBounds:
    """The priorities a team's token may give a job in a queue (inclusive); the admin's token
    may give any."""

    low: int = 0
    high: int = 100

    def refusal(self, request: SubmitRequest) -> str | None:
        """Why `request` may not have its priority, or None if it may."""
        priority = request.priority
        if request.admin or priority is None or self.low <= priority <= self.high:
            return None
        return (
            f"priority {priority} is outside queue {request.queue}'s bounds "
            f"[{self.low}, {self.high}] for a team's token (the admin's token may exceed them)"
        )


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"

    @property
    def ended(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the API shows of a job: a fold of its events (`advance`)."""

    spec: JobSpec
    state: JobState = JobState.PENDING
    attempt: int = 1
    reason: str = ""  # the last wait, preemption or failure reason
    detail: str = ""
    admitted_us: int | None = None
    started_us: int | None = None
    ended_us: int | None = None
    pool: str | None = None
    model: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    preemptions: int = 0
    hold_gpu_ms: int = 0
    hold_micros: int = 0
    over_budget: bool = False
    placement: str = ""  # why its GPU model was chosen, for a job that accepted several

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def team(self) -> str:
        return self.spec.team


def advance(record: JobRecord, event: JobEvent) -> JobRecord:
    """The record after one of its job's events (GPU events do not change it)."""
    if isinstance(event, JobWaiting):
        return replaced(record, reason=event.reason.value, detail=event.detail)
    if isinstance(event, JobAdmitted):
        return replaced(
            record,
            state=JobState.RUNNING,
            attempt=event.attempt,
            reason="",
            detail="",
            admitted_us=event.time_us,
            started_us=None,
            pool=event.pool,
            model=event.model,
            gpu_uuids=event.gpu_uuids,
            nodes=event.nodes,
            hold_gpu_ms=event.hold_gpu_ms,
            hold_micros=event.hold_micros,
            over_budget=event.over_budget,
            placement=event.placement,
        )
    if isinstance(event, JobStarted):
        return replaced(record, started_us=event.time_us)
    if isinstance(event, JobPreempted):
        return replaced(
            record,
            state=JobState.PENDING,
            reason=f"preempted: {event.reason.value}",
            detail=event.detail,
            gpu_uuids=(),
            nodes=(),
            preemptions=record.preemptions + 1,
        )
    if isinstance(event, JobReclaimed):
        return replaced(
            record,
            state=JobState.RECLAIMED,
            reason="reclaimed",
            detail=event.detail,
            ended_us=event.time_us,
        )
    if isinstance(event, JobFinished):
        return replaced(record, state=JobState.FINISHED, ended_us=event.time_us, exit_code=0)
    if isinstance(event, JobFailed):
        if event.retry:
            state = JobState.PENDING
        elif event.reason is FailReason.CANCELLED:
            state = JobState.CANCELLED
        else:
            state = JobState.FAILED
        return replaced(
            record,
            state=state,
            reason=event.reason.value,
            detail=event.detail,
            exit_code=event.exit_code,
            ended_us=None if event.retry else event.time_us,
            attempt=event.attempt + 1 if event.retry else event.attempt,
            gpu_uuids=() if event.retry else record.gpu_uuids,
        )
    return record
