"""Idle reclaim: allocated-but-idle GPUs handled by each queue's policy."""

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from ledger.job_events import GpuReleased, JobReclaimed
from scheduler.model import IdleAction, IdlePolicy, QueueClass
from scheduler.reclaim import IdleAlert, IdleGpu, idle_decisions
from tests.scheduler_builders import MINUTE_US, a_cluster, a_queue, a_spec

QUEUES = (
    a_queue("dev", QueueClass.DEV),  # reclaim after 60 min
    a_queue("train", QueueClass.TRAINING),  # alert after 60 min
    a_queue("serve", QueueClass.INFERENCE, preemptible=False),  # never
)


@dataclass(frozen=True)
class Case:
    queue: str
    gpus: int
    idle_gpus: int  # how many of the job's GPUs are reported idle
    idle_minutes: int  # how long before the check they went idle
    expect: type | None  # JobReclaimed, IdleAlert, or None
    started_minutes_ago: int = 240


CASES = [
    pytest.param(Case("dev", 1, 1, 61, JobReclaimed), id="dev-idle-61-min-reclaimed"),
    pytest.param(Case("dev", 1, 1, 60, JobReclaimed), id="dev-idle-exactly-60-min-reclaimed"),
    pytest.param(Case("dev", 1, 1, 59, None), id="dev-idle-59-min-kept"),
    pytest.param(Case("dev", 4, 4, 90, JobReclaimed), id="dev-all-gpus-idle-reclaimed"),
    pytest.param(Case("dev", 4, 3, 90, IdleAlert), id="dev-some-gpus-idle-alert-only"),
    pytest.param(Case("train", 2, 2, 600, IdleAlert), id="training-alerts"),
    pytest.param(Case("train", 2, 2, 30, None), id="training-not-yet"),
    pytest.param(Case("serve", 1, 1, 6000, None), id="inference-never"),
    pytest.param(
        Case("dev", 1, 1, 600, None, started_minutes_ago=30),
        id="idleness-before-the-job-started-does-not-count",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_idle_reclaim(case: Case) -> None:
    cluster = a_cluster(queues=QUEUES)
    cluster.run(a_spec("j", "vision", gpus=case.gpus, queue=case.queue))
    cluster.now_us += case.started_minutes_ago * MINUTE_US
    job = cluster.running("j")
    since = cluster.now_us - case.idle_minutes * MINUTE_US
    idle = [IdleGpu(g.uuid, since) for g in job.gpus[: case.idle_gpus]]
    decisions = idle_decisions(idle, cluster.snapshot())
    kinds = {type(d) for d in decisions} - {GpuReleased}
    assert kinds == ({case.expect} if case.expect else set())
    if case.expect is JobReclaimed:
        released = {d.gpu_uuid for d in decisions if isinstance(d, GpuReleased)}
        assert released == {g.uuid for g in job.gpus}
        cluster.apply(d for d in decisions if not isinstance(d, IdleAlert))
        assert cluster.state.running_job("j") is None
        assert cluster.state.pending_job("j") is None  # a reclaimed job does not requeue
        assert cluster.state.is_done("j")


def test_idle_gpus_nobody_holds_are_ignored() -> None:
    cluster = a_cluster(queues=QUEUES)
    cluster.now_us += 600 * MINUTE_US
    assert idle_decisions([IdleGpu("GPU-a100-00-0", 0)], cluster.snapshot()) == ()


def test_a_custom_queue_policy_is_honoured() -> None:
    quick = a_queue("quick", QueueClass.DEV, idle=IdlePolicy(IdleAction.RECLAIM, 5 * MINUTE_US))
    cluster = a_cluster(queues=(quick,))
    cluster.run(a_spec("j", "vision", queue="quick"))
    cluster.now_us += 6 * MINUTE_US
    gpu = cluster.running("j").gpus[0].uuid
    decisions = idle_decisions([IdleGpu(gpu, cluster.now_us - 5 * MINUTE_US)], cluster.snapshot())
    reclaimed = [d for d in decisions if isinstance(d, JobReclaimed)]
    assert [r.gpu_uuids for r in reclaimed] == [(gpu,)]


def test_reclaim_reports_since_when_the_job_was_idle() -> None:
    cluster = a_cluster(queues=QUEUES)
    cluster.run(a_spec("j", "vision", gpus=2, queue="dev"))
    cluster.now_us += 300 * MINUTE_US
    gpus: Sequence[str] = [g.uuid for g in cluster.running("j").gpus]
    idle = [
        IdleGpu(gpus[0], cluster.now_us - 200 * MINUTE_US),
        IdleGpu(gpus[1], cluster.now_us - 90 * MINUTE_US),
    ]
    reclaimed = [d for d in idle_decisions(idle, cluster.snapshot()) if isinstance(d, JobReclaimed)]
    assert reclaimed[0].idle_since_us == cluster.now_us - 90 * MINUTE_US  # all idle since then
