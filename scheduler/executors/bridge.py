"""Between the pure core and an executor: which decisions become `start`/`stop` calls, and which
`jobs` events an executor's statuses become. The translations are pure; `enact` and `observe`
only add the calls to the executor.

Decisions → orders (`stop_orders`, `admitted`), applied in this order by `enact`:
    JobPreempted                 stop PREEMPTED    (Slurm requeues and holds it)
    JobReclaimed                 stop RECLAIMED
    JobFailed cancelled          stop CANCELLED    (a pending job too: Slurm may hold it parked)
    JobFailed max_runtime        stop MAX_RUNTIME
    JobAdmitted                  start, after every stop of the same batch, so the GPUs a
                                 preemption frees are free before the preemptor starts
    JobFailed exit_nonzero/executor_lost come from the executor's own reports: nothing to stop.

Statuses → events (`status_events`), for a job the core still holds as running; a status for
any other job (it ended in the core first, e.g. preempted while exiting) changes nothing:
    RUNNING      JobStarted, the first time the core hears the run started (with the
                 executor's own id of the run: Slurm's `slurm:<id>`)
    FINISHED     JobFinished + GpuReleased                    (`lifecycle.finish`)
    FAILED       JobFailed exit_nonzero (retried per queue)   (`lifecycle.fail`)
    TIMED_OUT    JobFailed max_runtime_exceeded (never retried)
    LOST         JobFailed executor_lost (retried per queue)
    CANCELLED    JobFailed cancelled (never retried)          (`lifecycle.cancel`)
    STOPPED      JobFailed executor_lost: a stop the core did not decide
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobPreempted,
    JobReclaimed,
    JobStarted,
)
from scheduler.lifecycle import cancel, fail, finish, runtime_limit
from scheduler.model import Queue, RunningJob
from scheduler.ports import Executor, JobStatus, RunState, StopReason, Work
from scheduler.state import SchedulerState

_STOP_ON_FAIL = {
    FailReason.CANCELLED: StopReason.CANCELLED,
    FailReason.MAX_RUNTIME: StopReason.MAX_RUNTIME,
}
_FAIL_REASON = {
    RunState.FAILED: FailReason.EXIT_NONZERO,
    RunState.TIMED_OUT: FailReason.MAX_RUNTIME,
    RunState.LOST: FailReason.EXECUTOR_LOST,
    RunState.STOPPED: FailReason.EXECUTOR_LOST,
}


def stop_order(event: JobEvent) -> StopReason | None:
    if isinstance(event, JobPreempted):
        return StopReason.PREEMPTED
    if isinstance(event, JobReclaimed):
        return StopReason.RECLAIMED
    if isinstance(event, JobFailed):
        return _STOP_ON_FAIL.get(event.reason)
    return None


def stop_orders(events: Iterable[JobEvent]) -> tuple[tuple[StopReason, tuple[str, ...]], ...]:
    """The jobs `events` end, grouped by reason in the order each reason first appears."""
    grouped: dict[StopReason, dict[str, None]] = {}
    for event in events:
        reason = stop_order(event)
        if reason is not None:
            grouped.setdefault(reason, {})[event.job_id] = None
    return tuple((reason, tuple(ids)) for reason, ids in grouped.items())


def admitted(events: Iterable[JobEvent]) -> tuple[str, ...]:
    return tuple(e.job_id for e in events if isinstance(e, JobAdmitted))


def status_events(
    status: JobStatus, job: RunningJob | None, queue: Queue | None
) -> tuple[JobEvent, ...]:
    """The events one observed status stands for (see the module's table)."""
    if job is None or status.state is RunState.PENDING:
        return ()
    now = status.time_us
    if status.state is RunState.RUNNING:
        if job.started_us is None:
            return (JobStarted(job.job_id, now, status.executor_id or None),)
        return ()
    if status.state is RunState.FINISHED:
        return finish(job, now)
    if status.state is RunState.CANCELLED:
        return cancel(job, now, detail=status.detail)
    detail = status.detail
    if status.state is RunState.STOPPED:
        detail = f"stopped without a decision: {detail}"
    return fail(job, queue, _FAIL_REASON[status.state], now, status.exit_code, detail)


def enact(
    events: Sequence[JobEvent],
    state: SchedulerState,
    executor: Executor,
    work_for: Callable[[str], Work],
) -> tuple[JobStatus, ...]:
    """Carry out decisions already applied to `state`: every stop first, then every start.

    Returns what the stops reported. Each admitted job starts with its runtime limit (the
    smaller of its own and its queue's) as the executor's backstop.
    """
    stopped: list[JobStatus] = []
    for reason, job_ids in stop_orders(events):
        stopped.extend(executor.stop(job_ids, reason))
    for job_id in admitted(events):
        job = state.running_job(job_id)
        if job is None:
            continue  # admitted and ended within the same batch: nothing to start
        limit = runtime_limit(job, state.queues.get(job.spec.queue))
        executor.start(job, work_for(job_id), time_limit_us=limit)
    return tuple(stopped)


def observe(executor: Executor, state: SchedulerState) -> tuple[JobEvent, ...]:
    """Poll `executor` and return the events its statuses stand for (not applied)."""
    events: list[JobEvent] = []
    for status in executor.poll():
        job = state.running_job(status.job_id)
        queue = None if job is None else state.queues.get(job.spec.queue)
        events.extend(status_events(status, job, queue))
    return tuple(events)
