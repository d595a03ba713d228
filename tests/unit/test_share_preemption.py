"""GPU shares preempt and are preempted by priority like whole-GPU jobs — stopping a share frees
only that share — and are reclaimed when idle, each by its own queue's policy (table tests
through the real scheduling cycle, in the style of the preemption and reclaim tests)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger.job_events import GpuReleased, JobPreempted, JobReclaimed
from scheduler.inventory import placeable_nodes
from scheduler.model import Flavor, Policy, QueueClass, Quota, Team
from scheduler.reclaim import IdleAlert, IdleGpu, idle_decisions, reported_idle
from scheduler.state import SHARED
from tests.inventory_builders import a_record
from tests.scheduler_builders import MINUTE_US, T0_US, Cluster, a_cluster, a_queue, a_spec

WHOLE = Flavor("a100", "A100")


def cluster(gpus: int = 1) -> Cluster:
    """`gpus` whole A100s on one node; two teams of 8 GPUs' quota each, no cohort (so a job
    preempts its own team's lower-priority jobs); a dev queue (reclaims after 60 min), an
    inference queue (never reclaims) and a training queue."""
    fleet = [
        a_record(f"GPU-W{i}", node="node-02", index=i, pool="a100", model="A100")
        for i in range(1, gpus + 1)
    ]
    return a_cluster(
        teams=[Team(t, (Quota(WHOLE, 8),), cohort=None) for t in ("vision", "audio")],
        queues=(
            a_queue("dev", QueueClass.DEV),
            a_queue("serve", QueueClass.INFERENCE),
            a_queue("train"),
        ),
        fleet=placeable_nodes(fleet, T0_US, 6),
        policy=Policy(preemption=True),
    )


@dataclass(frozen=True)
class PreemptCase:
    running: tuple[tuple[str, int | None, int], ...]  # job, share (None: whole), priority
    incoming: tuple[str, int | None, int]
    preempted: frozenset[str]
    admitted: bool


PREEMPT_CASES = {
    "a-share-preempts-a-lower-priority-share-for-room": PreemptCase(
        (("low", 500, 0), ("mid", 500, 5)), ("hi", 500, 9), frozenset({"low"}), True
    ),
    "freeing-one-share-is-enough-the-other-keeps-running": PreemptCase(
        (("low", 250, 0), ("low2", 250, 1), ("mid", 500, 5)),
        ("hi", 250, 9),
        frozenset({"low"}),
        True,
    ),
    "a-share-preempts-a-lower-priority-whole-job": PreemptCase(
        (("whole", None, 0),), ("hi", 250, 9), frozenset({"whole"}), True
    ),
    "a-whole-job-needs-every-share-of-a-gpu-gone": PreemptCase(
        (("a", 250, 0), ("b", 250, 1)), ("whole", None, 9), frozenset({"a", "b"}), True
    ),
    "a-share-never-preempts-an-equal-or-higher-priority": PreemptCase(
        (("peer", 600, 9),), ("hi", 500, 9), frozenset(), False
    ),
    "a-whole-job-cannot-free-a-gpu-with-a-higher-priority-share": PreemptCase(
        (("low", 250, 0), ("top", 250, 9)), ("whole", None, 5), frozenset(), False
    ),
}


@pytest.mark.parametrize("case", PREEMPT_CASES.values(), ids=PREEMPT_CASES.keys())
def test_share_preemption(case: PreemptCase) -> None:
    c = cluster()
    for i, (job, share, priority) in enumerate(case.running):
        queue = "train" if share is None else "serve"
        c.submit(a_spec(job, queue=queue, gpu_share=share, priority=priority, submit_us=T0_US + i))
        c.cycle()
        assert c.state.running_job(job) is not None
    job, share, priority = case.incoming
    queue = "train" if share is None else "serve"
    c.submit(a_spec(job, queue=queue, gpu_share=share, priority=priority, submit_us=T0_US + 9))
    result = c.cycle()
    preempted = {e.job_id for e in result.events if isinstance(e, JobPreempted)}
    assert preempted == case.preempted
    assert (c.state.running_job(job) is not None) is case.admitted
    for other, *_ in case.running:  # the rest keep their shares
        assert (c.state.running_job(other) is None) is (other in case.preempted)


@dataclass(frozen=True)
class ReclaimCase:
    idle: str  # what is reported idle: "gpu" (the whole GPU) or a job's share
    expect: dict[str, type | None]  # job → JobReclaimed, IdleAlert or None


RECLAIM_CASES = {
    "an-idle-shared-gpu-reclaims-each-dev-share-not-inference": ReclaimCase(
        "gpu", {"dev-a": JobReclaimed, "dev-b": JobReclaimed, "serve": None}
    ),
    "one-idle-share-is-reclaimed-alone": ReclaimCase(
        "dev-a", {"dev-a": JobReclaimed, "dev-b": None, "serve": None}
    ),
}


@pytest.mark.parametrize("case", RECLAIM_CASES.values(), ids=RECLAIM_CASES.keys())
def test_share_idle_reclaim(case: ReclaimCase) -> None:
    c = cluster()
    c.run(
        a_spec("dev-a", queue="dev", gpu_share=250),
        a_spec("dev-b", "audio", queue="dev", gpu_share=250, submit_us=T0_US + 1),
        a_spec("serve", queue="serve", gpu_share=250, submit_us=T0_US + 2),
    )
    c.now_us += 240 * MINUTE_US
    since = c.now_us - 90 * MINUTE_US
    reported = "GPU-W1" if case.idle == "gpu" else c.running(case.idle).gpus[0].uuid
    decisions = idle_decisions([IdleGpu(reported, since)], c.snapshot())
    reclaimed = {d.job_id for d in decisions if isinstance(d, JobReclaimed)}
    assert reclaimed == {j for j, kind in case.expect.items() if kind is JobReclaimed}
    released = {d.gpu_uuid for d in decisions if isinstance(d, GpuReleased)}
    assert released == {c.running(j).gpus[0].uuid for j in reclaimed}  # only their shares
    c.apply(d for d in decisions if not isinstance(d, IdleAlert))
    assert c.state.holder("GPU-W1") == SHARED  # the other shares keep the GPU


def test_an_idle_report_of_a_shared_gpu_concerns_its_share_jobs() -> None:
    assert reported_idle("dev-a", SHARED) and reported_idle(None, SHARED)
    assert reported_idle("job", "job") and not reported_idle("other", "job")
    assert not reported_idle(None, None)


def test_a_shares_idleness_before_it_started_does_not_count() -> None:
    c = cluster()
    c.run(a_spec("dev-a", queue="dev", gpu_share=250))
    c.now_us += 30 * MINUTE_US  # started 30 min ago; the GPU was idle for hours before
    decisions = idle_decisions([IdleGpu("GPU-W1", c.now_us - 600 * MINUTE_US)], c.snapshot())
    assert decisions == ()
