"""The fold of job events into one `JobRow` per job (state, queue, GPUs, times, the current wait
and its reason, preemptions, attempts), following the scheduler's state machine
(`scheduler.state`), and `select_jobs` over those rows. Pure: plain values in, frozen values out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from ledger.job_events import (
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
)
from ledger.periods import Period


class JobState(StrEnum):
    """Where a job stands after its latest event."""

    WAITING = "waiting"  # in its queue (never admitted, or back after a preemption or failure)
    STARTING = "starting"  # admitted to GPUs; its processes have not started yet
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"  # stopped because its GPUs sat allocated but idle; not requeued

    @property
    def active(self) -> bool:
        """Holds GPUs now."""
        return self in (JobState.STARTING, JobState.RUNNING)

    @property
    def ended(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED, JobState.RECLAIMED)


@dataclass(frozen=True, slots=True)
class Preemption:
    """One time the job was stopped to make room for job `by`."""

    time_us: int
    by: str
    reason: PreemptReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as its events describe it.

    `model` and `pool` are those of the latest admission, else what the job asked for (None:
    any). `waiting_since_us` is the start of the current wait (submission, preemption or
    retry); `wait_reason` the latest reason given in it, given at `wait_reason_since_us`.
    `waited_us` and `ran_us` add up the waits and runs that are over; `attempts` counts
    admissions. Team, project and user are None only for a job whose submission the archive
    does not hold.
    """

    job_id: str
    team: str | None
    project: str | None
    user: str | None
    queue: str | None
    gpus: int
    model: str | None
    pool: str | None
    state: JobState
    submitted_us: int | None
    first_event_us: int
    last_event_us: int
    waiting_since_us: int | None = None
    wait_reason: WaitReason | None = None
    wait_reason_since_us: int | None = None
    wait_detail: str = ""
    admitted_us: int | None = None
    started_us: int | None = None
    first_started_us: int | None = None
    ended_us: int | None = None
    attempts: int = 0
    gpu_uuids: tuple[str, ...] = ()
    borrowed_gpus: int = 0
    over_budget: bool = False
    preemptions: tuple[Preemption, ...] = ()
    gpu_share: int | None = None  # per-mille of one GPU, for a GPU share (`JobSpec.gpu_share`)
    fail_reason: FailReason | None = None
    exit_code: int | None = None
    estimated_runtime_us: int | None = None
    waited_us: int = 0
    ran_us: int = 0

    @property
    def since_us(self) -> int:
        """When the job entered its current state."""
        if self.state is JobState.WAITING:
            return self.waiting_since_us or self.first_event_us
        if self.state is JobState.RUNNING:
            return self.started_us or self.admitted_us or self.first_event_us
        if self.state is JobState.STARTING:
            return self.admitted_us or self.first_event_us
        return self.ended_us or self.last_event_us

    def waited_total_us(self, as_of_us: int) -> int:
        """All the time the job spent waiting, up to `as_of_us` if it waits now."""
        if self.state is JobState.WAITING:
            return self.waited_us + max(0, as_of_us - self.since_us)
        return self.waited_us

    def runtime_us(self, as_of_us: int) -> int:
        """All the time the job held GPUs, up to `as_of_us` if it holds them now."""
        if self.state.active:
            return self.ran_us + max(0, as_of_us - (self.admitted_us or self.since_us))
        return self.ran_us

    @property
    def first_wait_us(self) -> int | None:
        """Queueing delay from submission to the first start (None: not started, or no
        submission in the archive)."""
        if self.submitted_us is None or self.first_started_us is None:
            return None
        return max(0, self.first_started_us - self.submitted_us)


@dataclass(slots=True)
class _Acc:
    """A job being folded (mutable; frozen into a `JobRow`)."""

    job_id: str
    first_event_us: int
    team: str | None = None
    project: str | None = None
    user: str | None = None
    queue: str | None = None
    gpus: int = 0
    model: str | None = None
    pool: str | None = None
    state: JobState = JobState.WAITING
    submitted_us: int | None = None
    last_event_us: int = 0
    waiting_since_us: int | None = None
    wait_reason: WaitReason | None = None
    wait_reason_since_us: int | None = None
    wait_detail: str = ""
    admitted_us: int | None = None
    started_us: int | None = None
    first_started_us: int | None = None
    ended_us: int | None = None
    attempts: int = 0
    gpu_uuids: tuple[str, ...] = ()
    borrowed_gpus: int = 0
    over_budget: bool = False
    preemptions: list[Preemption] = field(default_factory=list)
    gpu_share: int | None = None
    fail_reason: FailReason | None = None
    exit_code: int | None = None
    estimated_runtime_us: int | None = None
    waited_us: int = 0
    ran_us: int = 0

    def end_wait(self, at_us: int) -> None:
        if self.state is JobState.WAITING:
            since = self.waiting_since_us
            if since is None:
                since = self.submitted_us if self.submitted_us is not None else at_us
            self.waited_us += max(0, at_us - since)
        self.waiting_since_us = None
        self.wait_reason = None
        self.wait_reason_since_us = None
        self.wait_detail = ""

    def end_run(self, at_us: int) -> None:
        if self.state.active and self.admitted_us is not None:
            self.ran_us += max(0, at_us - self.admitted_us)

    def requeue(self, at_us: int, reason: WaitReason) -> None:
        self.state = JobState.WAITING
        self.waiting_since_us = at_us
        self.wait_reason = reason
        self.wait_reason_since_us = at_us
        self.wait_detail = ""

    def freeze(self) -> JobRow:
        return JobRow(
            job_id=self.job_id,
            team=self.team,
            project=self.project,
            user=self.user,
            queue=self.queue,
            gpus=self.gpus,
            model=self.model,
            pool=self.pool,
            state=self.state,
            submitted_us=self.submitted_us,
            first_event_us=self.first_event_us,
            last_event_us=self.last_event_us,
            waiting_since_us=self.waiting_since_us,
            wait_reason=self.wait_reason,
            wait_reason_since_us=self.wait_reason_since_us,
            wait_detail=self.wait_detail,
            admitted_us=self.admitted_us,
            started_us=self.started_us,
            first_started_us=self.first_started_us,
            ended_us=self.ended_us,
            attempts=self.attempts,
            gpu_uuids=self.gpu_uuids,
            borrowed_gpus=self.borrowed_gpus,
            over_budget=self.over_budget,
            preemptions=tuple(self.preemptions),
            gpu_share=self.gpu_share,
            fail_reason=self.fail_reason,
            exit_code=self.exit_code,
            estimated_runtime_us=self.estimated_runtime_us,
            waited_us=self.waited_us,
            ran_us=self.ran_us,
        )


def _apply(acc: _Acc, event: JobEvent) -> None:
    at = event.time_us
    acc.last_event_us = max(acc.last_event_us, at)
    if isinstance(event, JobSubmitted):
        if acc.submitted_us is not None:
            return  # a job is submitted once
        spec = event.spec
        acc.team, acc.project, acc.user, acc.queue = spec.team, spec.project, spec.user, spec.queue
        acc.gpus, acc.estimated_runtime_us = spec.gpus, spec.estimated_runtime_us
        acc.gpu_share = spec.gpu_share
        acc.model = acc.model or spec.model
        acc.pool = acc.pool or spec.pool
        acc.submitted_us = at
        if acc.state is JobState.WAITING and acc.waiting_since_us is None:
            acc.waiting_since_us = at
    elif isinstance(event, JobWaiting):
        if acc.state is not JobState.WAITING:
            return  # a late verdict on a job that has moved on
        if acc.waiting_since_us is None:
            acc.waiting_since_us = at
        acc.wait_reason, acc.wait_reason_since_us, acc.wait_detail = event.reason, at, event.detail
    elif isinstance(event, JobAdmitted):
        acc.end_wait(at)
        acc.state = JobState.STARTING
        acc.team = acc.team or event.team
        acc.queue = acc.queue or event.queue
        acc.pool, acc.model, acc.gpu_uuids = event.pool, event.model, event.gpu_uuids
        acc.gpus = acc.gpus or len(event.gpu_uuids)
        acc.borrowed_gpus, acc.over_budget = event.borrowed_gpus, event.over_budget
        acc.admitted_us, acc.started_us = at, None
        acc.attempts = max(acc.attempts + 1, event.attempt)
    elif isinstance(event, JobStarted):
        if acc.state.active:
            acc.state = JobState.RUNNING
            acc.started_us = at
            if acc.first_started_us is None:
                acc.first_started_us = at
    elif isinstance(event, JobPreempted):
        acc.preemptions.append(Preemption(at, event.by, event.reason, event.detail))
        acc.end_run(at)
        acc.requeue(at, WaitReason.PREEMPTED)
    elif isinstance(event, JobReclaimed | JobFinished):
        acc.end_run(at)
        acc.end_wait(at)
        acc.state = JobState.RECLAIMED if isinstance(event, JobReclaimed) else JobState.FINISHED
        acc.ended_us = at
    elif isinstance(event, JobFailed):
        acc.end_run(at)
        acc.fail_reason, acc.exit_code = event.reason, event.exit_code
        acc.attempts = max(acc.attempts, event.attempt)
        if event.retry:
            if acc.state is not JobState.WAITING:
                acc.requeue(at, WaitReason.RETRYING)
            return
        acc.end_wait(at)
        cancelled = event.reason is FailReason.CANCELLED
        acc.state = JobState.CANCELLED if cancelled else JobState.FAILED
        acc.ended_us = at


def fold_jobs(events: Iterable[JobEvent]) -> tuple[JobRow, ...]:
    """One row per job from job events in publication order, in order of first appearance.

    `GpuAssigned` only fills in a job's project and user when its submission is missing;
    `GpuReleased` changes nothing (the job events say when GPUs are given back).
    """
    jobs: dict[str, _Acc] = {}
    for event in events:
        if isinstance(event, GpuReleased):
            continue
        acc = jobs.get(event.job_id)
        if acc is None:
            acc = jobs[event.job_id] = _Acc(event.job_id, event.time_us)
        if isinstance(event, GpuAssigned):
            acc.team = acc.team or event.team
            acc.project = acc.project or event.project
            acc.user = acc.user or event.user
            continue
        _apply(acc, event)
    return tuple(acc.freeze() for acc in jobs.values())


def job_teams(rows: Iterable[JobRow]) -> dict[str, str]:
    """Job id → team, for the jobs whose team is known."""
    return {r.job_id: r.team for r in rows if r.team is not None}


# ---------------------------------------------------------------------------- selecting


def select_jobs(
    rows: Iterable[JobRow],
    team: str | None = None,
    period: Period | None = None,
    pool: str | None = None,
) -> tuple[JobRow, ...]:
    """The rows of `team`, active in `period` and on `pool` (None: no condition).

    Active in a period: submitted (or first seen) before its end and not ended before its
    start. On a pool: admitted to it, or asked for it; a job that asked for any pool and was
    never admitted is on no pool.
    """
    chosen = []
    for r in rows:
        if team is not None and r.team != team:
            continue
        if pool is not None and r.pool != pool:
            continue
        if period is not None:
            began = r.submitted_us if r.submitted_us is not None else r.first_event_us
            if began >= period.end_us or (r.ended_us is not None and r.ended_us < period.start_us):
                continue
        chosen.append(r)
    return tuple(chosen)
