"""What every executor launches a job with: the devices it sees, its environment and where its
log goes.

Invariants:
- `CUDA_VISIBLE_DEVICES` lists the job's GPUs in the order the scheduler assigned them, each as
  the executor's device map gives it (an index such as "0", or the GPU UUID when unmapped);
- `TALLY_JOB_ID` (what `collectors.ownership` reads to attribute a process) and `TALLY_ATTEMPT`
  are set for every job and cannot be overridden by `Work.env`;
- a job's log file name is its id with every character outside [A-Za-z0-9._~-] %-encoded, so
  an id can never name a path outside the log directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from scheduler.model import RunningJob
from scheduler.ports import Work

TALLY_JOB_ID = "TALLY_JOB_ID"
TALLY_ATTEMPT = "TALLY_ATTEMPT"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def visible_devices(job: RunningJob, device_ids: Mapping[str, str] | None) -> tuple[str, ...]:
    """The `CUDA_VISIBLE_DEVICES` entries of `job`: mapped device ids, else GPU UUIDs."""
    ids = device_ids or {}
    return tuple(ids.get(gpu.uuid, gpu.uuid) for gpu in job.gpus)


def tally_env(job: RunningJob) -> dict[str, str]:
    return {TALLY_JOB_ID: job.job_id, TALLY_ATTEMPT: str(job.attempt)}


def job_environment(
    job: RunningJob, work: Work, devices: tuple[str, ...], base: Mapping[str, str]
) -> dict[str, str]:
    """`base`, then `work.env`, then the variables the executor owns."""
    env = dict(base)
    env.update(work.env)
    env.update(tally_env(job))
    env[CUDA_VISIBLE_DEVICES] = ",".join(devices)
    return env


def log_name(job_id: str) -> str:
    return quote(job_id, safe="") + ".log"


def log_file(log_dir: Path, job_id: str) -> Path:
    """One log per job, appended to by every run of it."""
    return log_dir / log_name(job_id)
