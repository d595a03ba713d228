"""Decisions as events: the `jobs`-topic events each kind of decision is written as.

An admission is `JobAdmitted` followed by one `GpuAssigned` per GPU; anything that ends a job's
hold on its GPUs (preemption, reclaim, finish, failure) is its own job event followed by one
`GpuReleased` per GPU. The ledger learns who holds each GPU from the GPU events alone.
"""

from __future__ import annotations

from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobPreempted,
    JobSpec,
    PreemptReason,
)
from scheduler.model import Flavor, GpuRef, Holds, RunningJob


def admission_events(
    spec: JobSpec,
    flavor: Flavor,
    gpus: tuple[GpuRef, ...],
    *,
    priority: int,
    borrowed: int,
    preemptible: bool,
    hold: Holds,
    attempt: int,
    over_budget: bool,
    now_us: int,
    placement: str = "",
) -> tuple[JobEvent, ...]:
    admitted = JobAdmitted(
        job_id=spec.job_id,
        team=spec.team,
        queue=spec.queue,
        pool=flavor.pool,
        model=flavor.model,
        gpu_uuids=tuple(g.uuid for g in gpus),
        nodes=tuple(g.node for g in gpus),
        priority=priority,
        borrowed_gpus=borrowed,
        preemptible=preemptible,
        hold_micros=hold.money_micros,
        hold_gpu_ms=hold.gpu_ms,
        attempt=attempt,
        time_us=now_us,
        over_budget=over_budget,
        placement=placement,
    )
    assigned = tuple(
        GpuAssigned(
            gpu_uuid=g.uuid,
            node=g.node,
            pool=flavor.pool,
            model=flavor.model,
            job_id=spec.job_id,
            team=spec.team,
            project=spec.project,
            user=spec.user,
            time_us=now_us,
            share=spec.gpu_share,  # a share's per-mille, which the ledger charges
        )
        for g in gpus
    )
    return (admitted, *assigned)


def release_events(job: RunningJob, now_us: int) -> tuple[GpuReleased, ...]:
    spec = job.spec
    return tuple(
        GpuReleased(
            gpu_uuid=g.uuid,
            node=g.node,
            pool=job.flavor.pool,
            model=job.flavor.model,
            job_id=spec.job_id,
            team=spec.team,
            project=spec.project,
            user=spec.user,
            time_us=now_us,
        )
        for g in job.gpus
    )


def preemption_events(
    victim: RunningJob, by: JobSpec, reason: PreemptReason, now_us: int
) -> tuple[JobEvent, ...]:
    detail = {
        PreemptReason.RECLAIM_LENT_QUOTA: f"team {by.team} reclaimed quota lent to team "
        f"{victim.team} in {victim.flavor}",
        PreemptReason.HIGHER_PRIORITY: f"job {by.job_id} (team {by.team}) has a higher "
        f"priority than {victim.priority}",
        PreemptReason.OVER_BUDGET: f"ran over budget without a hold; job {by.job_id} "
        f"(team {by.team}) needed the GPUs",
    }[reason]
    preempted = JobPreempted(
        job_id=victim.job_id, by=by.job_id, reason=reason, time_us=now_us, detail=detail
    )
    return (preempted, *release_events(victim, now_us))
