"""What a period of Tally's own history holds for a replay: the jobs submitted in the window
(their specs, how long their last run took, how many attempts failed first), the admissions
the live scheduler recorded for them, and the GPU time each team held before the window (its
fair-share history).

Pure: job events in (the archived `jobs` topic, `ledger.read.job_history.read_job_event_log`),
a frozen `History` out. Times are integer µs.

How a job's runtime is read back: the length of its last run (admission to `JobFinished` or a
final `JobFailed`); a run still going at the window's end runs past it (as long as from its
submission to the window's end: a replay that admits it earlier than the record did must not
end it inside the window, where its GPUs would free up for others only in the replay); a job
never admitted runs for its estimate. A job cancelled or refused before it ever ran is left out
(`skipped`): the replay has no one to cancel it. A job whose last run was reclaimed for idling
keeps how long that run worked before it went idle (`reclaimed`): the replay ends it by the
scenario's idle policy (`scheduler.whatif.replay`).

When the live scheduler first looked at a job (`SimJob.seen_us`): its first tick after the
submit, the first cycle time the record shows (an admission or a wait reason, any job's) at or
after it; the replay wakes its tick then, so submits the live loop decided together in one tick
(a burst, or submits that came in while a tick ran) are decided together again, in the cycle's
order, not one by one as they arrived. Without such a time (no decision after it in the
window) it is the submit itself, when the API wakes the live loop.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from ledger.job_events import (
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobSubmitted,
    JobWaiting,
    WaitReason,
)
from ledger.units import US_PER_MS
from scheduler.simulation import SimJob


class Limit(StrEnum):
    """Why a replayed job waited that no `WaitReason` says: a limit of the tick itself."""

    CYCLES = "cycle_limit"  # the tick ran its `MAX_CYCLES_PER_TICK` cycles; the timer's next


Why = WaitReason | Limit  # a wait reason as the what-if compares them


@dataclass(frozen=True, slots=True)
class Admission:
    """A job's first admission: when, and on which (pool, model)."""

    job_id: str
    team: str
    queue: str
    time_us: int
    pool: str
    model: str


@dataclass(frozen=True, slots=True)
class History:
    """The window [since_us, until_us) of the jobs topic, ready to replay."""

    since_us: int
    until_us: int
    jobs: tuple[SimJob, ...]
    recorded: tuple[Admission, ...]  # first admissions of the window's jobs, in time order
    recorded_waits: tuple[tuple[str, WaitReason, int], ...]  # (job, reason, time) as recorded
    prior_gpu_ms: tuple[tuple[str, int, int], ...]  # (team, GPU-ms, at µs) before the window
    skipped: tuple[str, ...]  # jobs that never ran and ended: cancelled or refused
    events: int  # job events read
    reclaimed: tuple[tuple[str, int], ...] = ()  # (job, µs its last run worked before idling)
    undecodable: int = 0  # archived job messages that could not be read (the replay lacks them)


_ENDS = (JobFinished, JobFailed, JobPreempted, JobReclaimed)


def read_history(events: Iterable[JobEvent], since_us: int, until_us: int) -> History:
    """The replayable content of `events` (publication order) for jobs submitted in
    [since_us, until_us)."""
    specs: dict[str, JobSubmitted] = {}
    first: dict[str, Admission] = {}
    run_from: dict[str, tuple[int, int, str]] = {}  # job → (admitted µs, GPUs, team)
    last_run: dict[str, int] = {}
    failed_retries: dict[str, int] = {}
    worked: dict[str, int] = {}  # reclaimed for idling: how long the last run worked first
    ended: set[str] = set()
    waits: list[tuple[str, WaitReason, int]] = []
    cycle_times: list[int] = []  # when the live ticks' cycles decided something
    prior: list[tuple[str, int, int]] = []
    count = 0
    for event in events:
        count += 1
        if isinstance(event, JobSubmitted):
            specs.setdefault(event.spec.job_id, event)
        elif isinstance(event, JobAdmitted):
            cycle_times.append(event.time_us)
            run_from[event.job_id] = (event.time_us, len(event.gpu_uuids), event.team)
            first.setdefault(
                event.job_id,
                Admission(
                    event.job_id, event.team, event.queue, event.time_us, event.pool, event.model
                ),
            )
        elif isinstance(event, JobWaiting):
            cycle_times.append(event.time_us)
            waits.append((event.job_id, event.reason, event.time_us))
        elif isinstance(event, _ENDS):
            run = run_from.pop(event.job_id, None)
            if run is not None:
                started, gpus, team = run
                last_run[event.job_id] = event.time_us - started
                if isinstance(event, JobReclaimed):
                    worked[event.job_id] = max(0, event.idle_since_us - started)
                else:
                    worked.pop(event.job_id, None)
                if started < since_us:
                    held_ms = gpus * (min(event.time_us, since_us) - started) // US_PER_MS
                    prior.append((team, held_ms, min(event.time_us, since_us)))
            if isinstance(event, JobFailed) and event.retry:
                failed_retries[event.job_id] = failed_retries.get(event.job_id, 0) + 1
            elif not isinstance(event, JobPreempted):
                ended.add(event.job_id)
    for started, gpus, team in run_from.values():  # still running at the end
        if started < since_us:
            prior.append((team, gpus * (since_us - started) // US_PER_MS, since_us))
    in_window = sorted(
        (s for s in specs.values() if since_us <= s.spec.submit_us < until_us),
        key=lambda s: (s.spec.submit_us, s.spec.job_id),
    )
    cycles = sorted(t for t in cycle_times if t < until_us)
    jobs: list[SimJob] = []
    skipped: list[str] = []
    for submitted in in_window:
        spec = submitted.spec
        job_id = spec.job_id
        if job_id in run_from:  # at least to the window's end from any admission after submit
            runtime = max(1, until_us - spec.submit_us)
        elif job_id in last_run:
            runtime = max(1, last_run[job_id])
        elif job_id in ended:
            skipped.append(job_id)
            continue
        else:
            runtime = spec.estimated_runtime_us
        jobs.append(SimJob(spec, runtime, failed_retries.get(job_id, 0), _seen(cycles, spec)))
    kept = {j.spec.job_id for j in jobs}
    recorded = sorted(
        (a for a in first.values() if a.job_id in kept and a.time_us < until_us),
        key=lambda a: (a.time_us, a.job_id),
    )
    return History(
        since_us,
        until_us,
        tuple(jobs),
        tuple(recorded),
        tuple(w for w in waits if w[0] in kept),
        tuple(prior),
        tuple(skipped),
        count,
        tuple((j, us) for j, us in sorted(worked.items()) if j in kept),
    )


def _seen(cycles: list[int], spec: JobSpec) -> int:
    """The first recorded cycle time at or after the submit (sorted `cycles`), else the submit."""
    at = bisect_left(cycles, spec.submit_us)
    return cycles[at] if at < len(cycles) else spec.submit_us
