"""The scheduler and GPU health: unhealthy and cordoned GPUs get no new placements (pure), a
job running on a GPU gone unhealthy is preempted with `gpu_unhealthy` and requeued with the
same attempt (pure and through the service), and comes back on a healthy GPU."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from ledger.inventory import GpuHealthState, InventoryGpu, encode_record
from ledger.job_events import JobAdmitted, JobPreempted, PreemptReason
from scheduler.executors.fake import RUNS_FOREVER
from scheduler.inventory import placeable_nodes, unhealthy
from scheduler.model import Node
from tests.unit.test_scheduler_inventory import STALE_AFTER, InventoryRig, a100
from tests.unit.test_scheduler_service_support import T0_US

FALLEN = "XID 79: GPU has fallen off the bus"


def sick(uuid: str, index: int = 0, seen: int = T0_US) -> InventoryGpu:
    """An A100 record the health fold called unhealthy (XID 79)."""
    record: InventoryGpu = a100(uuid, index=index, seen=seen)
    return replace(record, health=GpuHealthState.UNHEALTHY, health_reason=FALLEN)


PLACEABLE = {
    "an-unhealthy-gpu-is-left-out": ((sick("GPU-0"), a100("GPU-1", index=1)), ("GPU-1",)),
    "a-degraded-gpu-still-takes-work": (
        (a100("GPU-0", health=GpuHealthState.DEGRADED), a100("GPU-1", index=1)),
        ("GPU-0", "GPU-1"),
    ),
    "a-cordoned-gpu-is-left-out": (
        (a100("GPU-0", cordoned=True), a100("GPU-1", index=1)),
        ("GPU-1",),
    ),
}


@pytest.mark.parametrize(("records", "uuids"), PLACEABLE.values(), ids=PLACEABLE.keys())
def test_placeable_gpus(records: tuple[object, ...], uuids: tuple[str, ...]) -> None:
    nodes = placeable_nodes(records, T0_US, STALE_AFTER)  # type: ignore[arg-type]
    assert nodes == (Node("node-01", "a100", "A100", uuids),)


def test_only_unhealthy_gpus_stop_jobs() -> None:
    records = [
        sick("GPU-0"),
        a100("GPU-1", health=GpuHealthState.DEGRADED),
        a100("GPU-2", cordoned=True),
    ]
    assert unhealthy(records) == {"GPU-0": FALLEN}


def test_a_job_on_a_gpu_gone_unhealthy_is_requeued_and_placed_elsewhere(tmp_path: Path) -> None:
    asyncio.run(_requeued(InventoryRig(tmp_path)))


async def _requeued(rig: InventoryRig) -> None:
    rig.executor.default = RUNS_FOREVER
    rig.report("GPU-0")
    job = await rig.submit(gpus=1)
    (admitted,) = [e for e in await rig.ticks(1) if isinstance(e, JobAdmitted)]
    assert admitted.gpu_uuids == ("GPU-0",)

    now = rig.clock.now_us()
    rig.inventory.on_record(encode_record(sick("GPU-0", seen=now)))
    rig.inventory.on_record(encode_record(a100("GPU-1", index=1, seen=now)))
    events = await rig.ticks(1)
    (preempted,) = [e for e in events if isinstance(e, JobPreempted)]
    assert (preempted.job_id, preempted.reason, preempted.by) == (
        job.job_id,
        PreemptReason.GPU_UNHEALTHY,
        "GPU-0",
    )
    assert "fallen off the bus" in preempted.detail
    again = [e for e in events + await rig.ticks(1) if isinstance(e, JobAdmitted)]
    assert [(e.job_id, e.gpu_uuids, e.attempt) for e in again] == [(job.job_id, ("GPU-1",), 1)]

    # GPU-0 recovers and GPU-1 goes bad: the job moves back, still the first attempt
    now = rig.clock.now_us()
    rig.inventory.on_record(encode_record(a100("GPU-0", seen=now)))
    rig.inventory.on_record(encode_record(sick("GPU-1", 1, now)))
    moved = [e for e in await rig.ticks(2) if isinstance(e, JobAdmitted)]
    assert [(e.gpu_uuids, e.attempt) for e in moved] == [(("GPU-0",), 1)]
