"""Jobs on unhealthy GPUs: stopped and requeued.

`unhealthy_decisions(unhealthy, snap)` (pure): every running job that holds a GPU of
`unhealthy` (GPU UUID → why, from the inventory's health: `scheduler.inventory`) — or a MIG
instance or a share of one — is preempted
with reason `gpu_unhealthy` (`by` the first such GPU, the detail says why) and its GPUs are
released. A preempted job goes back to its queue with the same attempt number, so this never
counts against its retry limit; it is placed again only on GPUs the inventory still calls
placeable (the unhealthy one is not, until it is healthy again).
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.fractional import physical_gpu
from ledger.job_events import JobEvent, JobPreempted, PreemptReason
from scheduler.decisions import release_events
from scheduler.snapshot import ClusterSnapshot


def unhealthy_decisions(
    unhealthy: Mapping[str, str], snap: ClusterSnapshot
) -> tuple[JobEvent, ...]:
    """Preemptions (and releases) of the running jobs that hold an unhealthy GPU."""
    if not unhealthy:
        return ()
    events: list[JobEvent] = []
    for job in sorted(snap.running_jobs(), key=lambda j: j.job_id):
        bad = sorted({gpu for g in job.gpus if (gpu := physical_gpu(g.uuid)) in unhealthy})
        if not bad:
            continue
        preempted = JobPreempted(
            job_id=job.job_id,
            by=bad[0],
            reason=PreemptReason.GPU_UNHEALTHY,
            time_us=snap.now_us,
            detail=f"GPU {bad[0]} is unhealthy: {unhealthy[bad[0]]}",
        )
        events.extend((preempted, *release_events(job, snap.now_us)))
    return tuple(events)
