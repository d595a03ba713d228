"""Carrying out published decisions: what the executor is told, in which order, and what becomes
of a start that cannot happen — split so that only the executor's own calls run off the event
loop, and the state is read and changed on the loop alone (a submit or cancel decided while an
enactment is in flight never races it).

- `plan` (on the loop): the stops, grouped by reason in the order each first appears, and the
  starts — each admitted job still running in the state (one admitted and ended before its
  enactment is not started), with its work and runtime limit; an admitted job whose work is
  missing from the work store fails at once (`executor_lost`, not retried);
- `carry_out` (in a thread): every stop, then every start (`scheduler.executors.bridge`'s
  order); a start the executor refuses comes back as a `FailedStart`; one the executor already
  runs (`JobAlreadyStarted`) is left alone;
- `failures` (on the loop): the `JobFailed` (retried per queue) of each failed start, each
  followed by its GPU releases, for the caller to apply.

Pure but for the executor's calls in `carry_out`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ledger.job_events import FailReason, GpuReleased, JobEvent, JobFailed
from scheduler.decisions import release_events
from scheduler.executors.bridge import admitted, stop_orders
from scheduler.executors.errors import ExecutorError, JobAlreadyStarted, StopTimeout
from scheduler.lifecycle import fail, runtime_limit
from scheduler.model import RunningJob
from scheduler.ports import Executor, StopReason, Work
from scheduler.state import SchedulerState

log = logging.getLogger("tally.scheduler")


@dataclass(frozen=True, slots=True)
class Start:
    job: RunningJob
    work: Work
    time_limit_us: int | None


@dataclass(frozen=True, slots=True)
class Plan:
    """The executor calls a batch of published decisions stands for."""

    stops: tuple[tuple[StopReason, tuple[str, ...]], ...]
    starts: tuple[Start, ...]
    missing_work: tuple[RunningJob, ...]  # admitted, still running, no work stored: they fail

    @property
    def job_ids(self) -> frozenset[str]:
        """Every job this plan stops or starts."""
        stopped = {j for _, ids in self.stops for j in ids}
        return frozenset(stopped | {s.job.job_id for s in self.starts})


@dataclass(frozen=True, slots=True)
class FailedStart:
    job: RunningJob
    detail: str


def plan(
    events: Sequence[JobEvent], state: SchedulerState, work_for: Callable[[str], Work | None]
) -> Plan:
    """What `events` (applied and published) ask of the executor, read from `state` now."""
    starts: list[Start] = []
    missing: list[RunningJob] = []
    for job_id in admitted(events):
        job = state.running_job(job_id)
        if job is None:
            continue  # admitted and ended before its enactment: nothing to start
        work = work_for(job_id)
        if work is None:
            missing.append(job)
            continue
        limit = runtime_limit(job, state.queues.get(job.spec.queue))
        starts.append(Start(job, work, limit))
    return Plan(stop_orders(events), tuple(starts), tuple(missing))


def carry_out(todo: Plan, executor: Executor) -> list[FailedStart]:
    """Every stop, then every start; the starts the executor could not make."""
    for reason, job_ids in todo.stops:
        try:
            executor.stop(job_ids, reason)
        except StopTimeout as exc:
            log.error("%s: their GPUs may still be busy", exc)
        except ExecutorError as exc:
            log.error("could not stop %s: %s", ", ".join(job_ids), exc)
    failed: list[FailedStart] = []
    for start in todo.starts:
        try:
            executor.start(start.job, start.work, time_limit_us=start.time_limit_us)
        except JobAlreadyStarted:
            continue
        except ExecutorError as exc:
            failed.append(FailedStart(start.job, f"cannot start: {exc}"))
    return failed


def failures(
    todo: Plan, failed: Sequence[FailedStart], state: SchedulerState, now_us: int
) -> list[JobEvent]:
    """The events of the starts that did not happen: work missing (never retried), or refused
    by the executor (retried per queue); each followed by the job's GPU releases. A job the
    state no longer runs in that attempt (cancelled or preempted while its start was in
    flight) has its ending already."""
    events: list[JobEvent] = []
    for job in todo.missing_work:
        if not _still_running(job, state):
            continue
        events.append(
            JobFailed(
                job_id=job.job_id,
                reason=FailReason.EXECUTOR_LOST,
                attempt=job.attempt,
                retry=False,
                time_us=now_us,
                detail="its command is not in the scheduler's work store",
            )
        )
    for start in failed:
        if not _still_running(start.job, state):
            continue
        queue = state.queues.get(start.job.spec.queue)
        events.extend(fail(start.job, queue, FailReason.EXECUTOR_LOST, now_us, detail=start.detail))
    return _with_releases(events, state)


def _still_running(job: RunningJob, state: SchedulerState) -> bool:
    now = state.running_job(job.job_id)
    return now is not None and now.attempt == job.attempt


def _with_releases(events: list[JobEvent], state: SchedulerState) -> list[JobEvent]:
    """A hand-made `JobFailed` of a running job, followed by its GPU releases."""
    out: list[JobEvent] = []
    for event in events:
        out.append(event)
        if isinstance(event, JobFailed) and not any(
            isinstance(e, GpuReleased) and e.job_id == event.job_id for e in events
        ):
            job = state.running_job(event.job_id)
            if job is not None:
                out.extend(release_events(job, event.time_us))
    return out
