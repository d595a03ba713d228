"""Idle reclaim: what to do about GPUs that are allocated but idle, by the queue's policy.

Input is what the ledger's idle detection reports (`IdleGpu`: a GPU UUID and since when it has
done no work). Rules, per running job:
- idle time counts from the later of the GPU's idle-since and the job's start, so a job never
  pays for idleness before it held the GPU;
- when every GPU of the job has been idle for at least the queue's `after_us`:
  `reclaim` stops the job (`JobReclaimed`, GPUs released, not requeued), `alert` raises an
  `IdleAlert`, `never` does nothing;
- when only some of its GPUs have been idle that long, `reclaim` and `alert` raise an
  `IdleAlert` (partial idleness is a sizing problem, not abandonment); `never` does nothing;
- GPUs nobody holds, and jobs of unknown queues, are left alone;
- a GPU share (`<GPU UUID>/share/<job id>`) is idle when it is reported idle itself — the
  ledger detects idleness per share, from the share job's own processes on the GPU
  (`ledger.idle_shares`), so one share idle beside a busy one is reclaimed alone — or when the
  GPU it is a share of is reported idle (a whole-GPU report, kept for alerts raised before
  per-share detection); each share job is handled by its own queue's policy, and reclaiming
  one frees only its share (`reported_idle` keeps a shared GPU's report whichever job it
  names).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ledger.fractional import share_parent
from ledger.job_events import JobEvent, JobReclaimed
from scheduler.decisions import release_events
from scheduler.model import IdleAction
from scheduler.snapshot import ClusterSnapshot
from scheduler.state import SHARED


@dataclass(frozen=True, slots=True)
class IdleGpu:
    """An allocated GPU that has done no work since `since_us` (the ledger's idle detection)."""

    gpu_uuid: str
    since_us: int


@dataclass(frozen=True, slots=True)
class IdleAlert:
    """An allocated-but-idle job that policy says to report, not stop."""

    job_id: str
    team: str
    queue: str
    idle_gpus: tuple[str, ...]
    gpus: int
    idle_since_us: int
    time_us: int


def reported_idle(job: str | None, holder: str | None) -> bool:
    """Whether an idle report naming `job` (None: no owner) concerns the GPU's holder now: its
    holder's own GPU, or a GPU running shares (`SHARED`: each share job on it)."""
    return holder is not None and (job is None or holder in (job, SHARED))


def _since(since: dict[str, int], uuid: str) -> int | None:
    """When `uuid` went idle: its own report, else — for a share — its GPU's."""
    found = since.get(uuid)
    if found is None and (gpu := share_parent(uuid)) is not None:
        found = since.get(gpu)
    return found


def idle_decisions(
    idle: Iterable[IdleGpu], snap: ClusterSnapshot
) -> tuple[JobEvent | IdleAlert, ...]:
    """Reclaims (as events) and alerts for the idle GPUs reported, at `snap.now_us`."""
    since = {i.gpu_uuid: i.since_us for i in idle}
    if not since:
        return ()
    decisions: list[JobEvent | IdleAlert] = []
    for job in snap.running_jobs():
        queue = snap.queues.get(job.spec.queue)
        if queue is None or queue.idle.action is IdleAction.NEVER:
            continue
        idle_since = {
            g.uuid: max(t, job.since_us)
            for g in job.gpus
            if (t := _since(since, g.uuid)) is not None
        }
        due = {uuid: t for uuid, t in idle_since.items() if snap.now_us - t >= queue.idle.after_us}
        if not due:
            continue
        uuids = tuple(sorted(due))
        latest = max(due.values())
        if len(due) == len(job.gpus) and queue.idle.action is IdleAction.RECLAIM:
            reclaimed = JobReclaimed(
                job_id=job.job_id,
                gpu_uuids=uuids,
                idle_since_us=latest,
                time_us=snap.now_us,
                detail=f"all {len(uuids)} GPU(s) idle for {snap.now_us - latest} µs; queue "
                f"{queue.name} reclaims after {queue.idle.after_us} µs",
            )
            decisions.append(reclaimed)
            decisions.extend(release_events(job, snap.now_us))
        else:
            decisions.append(
                IdleAlert(
                    job_id=job.job_id,
                    team=job.team,
                    queue=queue.name,
                    idle_gpus=uuids,
                    gpus=len(job.gpus),
                    idle_since_us=latest,
                    time_us=snap.now_us,
                )
            )
    return tuple(decisions)
