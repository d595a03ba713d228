"""Which Slurm job each Tally job is, read back from the `jobs` topic: what a restarted Slurm
executor rebuilds its map from (`SlurmExecutor.rebuild`). Pure.

The Slurm executor publishes the Slurm job id it was given with each `JobStarted`
(`slurm_job_id`). Folding a job's events in topic order:
    JobStarted with a Slurm id      running as that Slurm job
    JobPreempted                    parked: requeued and held in Slurm, the same Slurm job is
                                    released when it is admitted again (until its next
                                    JobStarted it stays parked here)
    JobFinished, JobFailed,
    JobReclaimed                    forgotten: it no longer runs
A job admitted but never reported running before the restart has no Slurm id on the topic:
the restarted scheduler does not know it (it fails with `executor_lost`, as before).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ledger.job_events import JobFailed, JobFinished, JobPreempted, JobReclaimed, JobStarted


@dataclass(frozen=True, slots=True)
class SlurmJobs:
    """Tally job id → Slurm job id, for jobs running and for jobs parked in Slurm's queue."""

    running: dict[str, str] = field(default_factory=dict)
    parked: dict[str, str] = field(default_factory=dict)


def slurm_jobs(events: Iterable[object]) -> SlurmJobs:
    """The map after `events` (job events in topic order; anything else is skipped)."""
    out = SlurmJobs()
    for event in events:
        if isinstance(event, JobStarted):
            out.parked.pop(event.job_id, None)
            if event.slurm_job_id is not None:
                out.running[event.job_id] = event.slurm_job_id
        elif isinstance(event, JobPreempted):
            slurm_id = out.running.pop(event.job_id, None)
            if slurm_id is not None:
                out.parked[event.job_id] = slurm_id
        elif isinstance(event, JobFinished | JobFailed | JobReclaimed):
            out.running.pop(event.job_id, None)
            out.parked.pop(event.job_id, None)
    return out
