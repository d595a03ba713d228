"""What every executor launches a job with: the devices it sees, its environment and where its
log goes.

Invariants:
- `CUDA_VISIBLE_DEVICES` lists the job's GPUs in the order the scheduler assigned them, each as
  the executor's device map gives it (an index such as "0", or the GPU UUID when unmapped); a
  MIG instance as its `MIG-…` device name, and then `NVIDIA_VISIBLE_DEVICES` (what the NVIDIA
  container runtime reads) says the same;
- `TALLY_JOB_ID` (what `collectors.ownership` reads to attribute a process) and `TALLY_ATTEMPT`
  are set for every job and cannot be overridden by `Work.env`;
- a job's log file name is its id with every character outside [A-Za-z0-9._~-] %-encoded, so
  an id can never name a path outside the log directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from ledger.fractional import cuda_mig_device, share_parent, split_mig_key
from scheduler.model import RunningJob
from scheduler.ports import Work

TALLY_JOB_ID = "TALLY_JOB_ID"
TALLY_ATTEMPT = "TALLY_ATTEMPT"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MIG_PREFIX = "MIG-"


def visible_devices(job: RunningJob, device_ids: Mapping[str, str] | None) -> tuple[str, ...]:
    """The `CUDA_VISIBLE_DEVICES` entries of `job`: mapped device ids, else GPU UUIDs (a MIG
    instance unmapped: `MIG-<GPU UUID>/<gi>/0`; a share: the GPU it is a share of)."""
    ids = device_ids or {}
    return tuple(_device(gpu.uuid, ids) for gpu in job.gpus)


def _device(uuid: str, ids: Mapping[str, str]) -> str:
    uuid = share_parent(uuid) or uuid
    found = ids.get(uuid)
    if found is not None:
        return found
    instance = split_mig_key(uuid)
    return uuid if instance is None else cuda_mig_device(instance[0], instance[1], 0)


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
    if any(d.startswith(MIG_PREFIX) for d in devices):
        env[NVIDIA_VISIBLE_DEVICES] = env[CUDA_VISIBLE_DEVICES]
    return env


def log_name(job_id: str) -> str:
    return quote(job_id, safe="") + ".log"


def log_file(log_dir: Path, job_id: str) -> Path:
    """One log per job, appended to by every run of it."""
    return log_dir / log_name(job_id)
