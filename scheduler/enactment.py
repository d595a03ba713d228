"""Carrying out published decisions: what the executor is told, in which order, and what becomes
of a start that cannot happen — split so that only the executor's own calls run off the event
loop, and the state is read and changed on the loop alone (a submit or cancel decided while an
enactment is in flight never races it).

- `plan` (on the loop): the stops, grouped by reason in the order each first appears, and the
  starts — each admitted job still running in the state (one admitted and ended before its
  enactment is not started), with its work and runtime limit; an admitted job whose work is
  missing from the work store fails at once (`executor_lost`, not retried);
- `carry_out` (in a thread): the run files' pending removals, every stop, then every start
  (`scheduler.executors.bridge`'s order); a start the executor refuses comes back as a
  `FailedStart`; one the executor already runs (`JobAlreadyStarted`) is left alone. An
  executor that `StartsConcurrently` gets up to its `concurrent_starts` starts at a time (a
  pool of threads, `StartPool`, kept from one enactment to the next: making and joining eight
  threads per enactment cost more CPU than the starts' own Python; the failed ones are
  reported in plan order all the same); one that
  `KnowsProcessGroups` has the groups of the runs it started recorded in one pass
  (`RunFiles.write_all`) once the starts are made; one that `PollsCheaply` is then polled, so
  its starts are reported (`JobStarted`, applied on the loop) in the round after the
  enactment instead of at the next tick — never before their groups are on disk; any other
  executor is polled there too when a tick skipped its poll meanwhile (`poll`), so a busy
  service that always decides during an enactment still hears from it;
- `failures` (on the loop): the `JobFailed` (retried per queue) of each failed start, each
  followed by its GPU releases, for the caller to apply.

Pure but for the executor's calls and the run files written in `carry_out`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from ledger.job_events import FailReason, GpuReleased, JobEvent, JobFailed
from scheduler.decisions import release_events
from scheduler.executors.bridge import admitted, stop_orders
from scheduler.executors.errors import ExecutorError, JobAlreadyStarted, StopTimeout
from scheduler.lifecycle import fail, runtime_limit
from scheduler.model import RunningJob
from scheduler.ports import (
    Executor,
    JobStatus,
    KnowsProcessGroups,
    PollsCheaply,
    StartsConcurrently,
    StopReason,
    Work,
)
from scheduler.state import SchedulerState
from scheduler.work_store import RunFiles

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


class StartPool:
    """The threads an enactment's concurrent starts run in, made at the first enactment that
    needs them and kept for the next (made again if the width asked for changes) until
    `close`. Used by one enactment at a time (the executor lock)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._width = 0

    def map(
        self, fn: Callable[[Start], FailedStart | None], starts: Sequence[Start], width: int
    ) -> list[FailedStart | None]:
        """`fn` of every start, `width` at a time, in order."""
        if self._pool is None or self._width != width:
            self.close()
            self._pool = ThreadPoolExecutor(width, thread_name_prefix="tally-start")
            self._width = width
        return list(self._pool.map(fn, starts))

    def close(self) -> None:
        """Let its threads end (each once its start, if any, is made)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What carrying out a plan came to: the starts the executor could not make (in plan
    order), and its statuses polled right after (an executor that `PollsCheaply`; else
    none: the next tick polls)."""

    failed: tuple[FailedStart, ...]
    statuses: tuple[JobStatus, ...] = ()


def carry_out(
    todo: Plan,
    executor: Executor,
    runs: RunFiles | None = None,
    before: Callable[[], None] | None = None,
    poll: bool = False,
    pool: StartPool | None = None,
) -> Outcome:
    """`before` (the run files' pending removals), every stop, then every start (concurrently
    where the executor allows: in `pool`'s threads, else in threads made for this call); then
    the started runs' process groups go in `runs`, all together, and only then is the executor
    polled — if it `PollsCheaply`, or `poll` (a tick skipped its poll while the enactment was in
    flight) — so no start is reported before its group is on disk."""
    if before is not None:
        before()
    for reason, job_ids in todo.stops:
        try:
            executor.stop(job_ids, reason)
        except StopTimeout as exc:
            log.error("%s: their GPUs may still be busy", exc)
        except ExecutorError as exc:
            log.error("could not stop %s: %s", ", ".join(job_ids), exc)
    start = partial(_start, executor=executor)
    allowed = executor.concurrent_starts if isinstance(executor, StartsConcurrently) else 1
    width = min(allowed, len(todo.starts))
    if width > 1 and pool is not None:
        outcomes = pool.map(start, todo.starts, allowed)
    elif width > 1:
        with ThreadPoolExecutor(width, thread_name_prefix="tally-start") as threads:
            outcomes = list(threads.map(start, todo.starts))
    else:
        outcomes = [start(s) for s in todo.starts]
    if runs is not None and isinstance(executor, KnowsProcessGroups):
        _record_groups(todo, executor, runs)
    failed = tuple(f for f in outcomes if f is not None)
    if not poll and not (isinstance(executor, PollsCheaply) and executor.polls_cheaply):
        return Outcome(failed)
    try:
        return Outcome(failed, tuple(executor.poll()))
    except ExecutorError as exc:  # the next tick polls again
        log.error("the executor could not be polled: %s", exc)
        return Outcome(failed)


def _start(start: Start, executor: Executor) -> FailedStart | None:
    try:
        executor.start(start.job, start.work, time_limit_us=start.time_limit_us)
    except JobAlreadyStarted:
        return None
    except ExecutorError as exc:
        return FailedStart(start.job, f"cannot start: {exc}")
    return None


def _record_groups(todo: Plan, executor: KnowsProcessGroups, runs: RunFiles) -> None:
    """The process groups of the plan's runs the executor runs now, on disk in one pass."""
    groups = []
    for s in todo.starts:
        pgid = executor.pgid(s.job.job_id)
        if pgid is not None:
            groups.append((s.job.job_id, str(pgid)))
    for job_id, exc in runs.write_all(groups):  # the run goes on; a restart may not find it
        log.error("could not record the process group of %s: %s", job_id, exc)


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
