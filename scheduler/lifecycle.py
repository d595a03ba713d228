"""Decisions about a job's end: finishing, failing and retrying, cancelling, and stopping jobs
past their maximum runtime.

Rules:
- a failed job is retried (requeued with its original submit time, attempt + 1) when the
  failure is retryable — a non-zero exit or a lost executor — and its attempt number is at most
  its queue's `max_retries`; a job past its maximum runtime or cancelled is never retried;
- a job's runtime limit is the smaller of its own and its queue's maximum runtime; it counts
  from when the job started (or was admitted, until the executor reports the start);
- every decision that ends a running job releases all its GPUs.
"""

from __future__ import annotations

from ledger.job_events import FailReason, JobEvent, JobFailed, JobFinished
from scheduler.decisions import release_events
from scheduler.model import PendingJob, Queue, RunningJob
from scheduler.snapshot import ClusterSnapshot

RETRYABLE = frozenset((FailReason.EXIT_NONZERO, FailReason.EXECUTOR_LOST))


def may_retry(reason: FailReason, attempt: int, queue: Queue | None) -> bool:
    return queue is not None and reason in RETRYABLE and attempt <= queue.max_retries


def finish(job: RunningJob, now_us: int) -> tuple[JobEvent, ...]:
    return (JobFinished(job_id=job.job_id, time_us=now_us), *release_events(job, now_us))


def fail(
    job: RunningJob,
    queue: Queue | None,
    reason: FailReason,
    now_us: int,
    exit_code: int | None = None,
    detail: str = "",
) -> tuple[JobEvent, ...]:
    """The job failed; it is retried if its queue allows (see module rules)."""
    failed = JobFailed(
        job_id=job.job_id,
        reason=reason,
        attempt=job.attempt,
        retry=may_retry(reason, job.attempt, queue),
        time_us=now_us,
        exit_code=exit_code,
        detail=detail,
    )
    return (failed, *release_events(job, now_us))


def cancel(job: PendingJob | RunningJob, now_us: int, detail: str = "") -> tuple[JobEvent, ...]:
    """Cancel a pending or running job (never retried)."""
    failed = JobFailed(
        job_id=job.spec.job_id,
        reason=FailReason.CANCELLED,
        attempt=job.attempt,
        retry=False,
        time_us=now_us,
        detail=detail,
    )
    if isinstance(job, RunningJob):
        return (failed, *release_events(job, now_us))
    return (failed,)


def runtime_limit(job: RunningJob, queue: Queue | None) -> int | None:
    limits = [
        limit
        for limit in (job.spec.max_runtime_us, None if queue is None else queue.max_runtime_us)
        if limit is not None
    ]
    return min(limits) if limits else None


def overdue(snap: ClusterSnapshot) -> tuple[JobEvent, ...]:
    """Stop every running job past its maximum runtime (a failure that is never retried)."""
    events: list[JobEvent] = []
    for job in snap.running_jobs():
        queue = snap.queues.get(job.spec.queue)
        limit = runtime_limit(job, queue)
        if limit is None:
            continue
        ran = snap.now_us - job.since_us
        if ran >= limit:
            events.extend(
                fail(
                    job,
                    queue,
                    FailReason.MAX_RUNTIME,
                    snap.now_us,
                    detail=f"ran {ran} µs, limit {limit} µs",
                )
            )
    return tuple(events)
