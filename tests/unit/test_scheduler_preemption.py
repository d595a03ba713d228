"""Preemption policy: reclaim lent quota, make room for higher priority; the fewest, then
lowest-priority, then most recently started victims; never a non-preemptible queue's jobs."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest

from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobPreempted,
    JobSpec,
    PreemptReason,
    WaitReason,
)
from scheduler.model import Balance, Node, OverBudget, Policy, Queue, Team
from scheduler.quota import UNITS
from tests.scheduler_builders import (
    A100,
    T0_US,
    a_cluster,
    a_queue,
    a_spec,
    a_team,
    nodes,
)

QUEUES = (
    a_queue("train"),
    a_queue("low", priority=-1),
    a_queue("serve", preemptible=False, priority=10),
    a_queue("batch", priority=-5, over_budget=OverBudget.RUN_PREEMPTIBLE),
)


def _a(job_id: str, gpus: int = 1, **kw: object) -> JobSpec:
    return a_spec(job_id, "audio", gpus=gpus, **kw)


def _v(job_id: str, gpus: int = 1, **kw: object) -> JobSpec:
    return a_spec(job_id, "vision", gpus=gpus, **kw)


def _ones(prefix: str, count: int, team: str = "audio", **kw: object) -> list[JobSpec]:
    return [a_spec(f"{prefix}{i}", team, **kw) for i in range(count)]


@dataclass(frozen=True)
class Case:
    """Start `running` one job per cycle (so start times differ), then submit `job`."""

    running: Sequence[JobSpec]
    job: JobSpec
    victims: Mapping[str, PreemptReason]  # empty: no preemption, the job waits
    teams: Sequence[Team] = (a_team("vision", 8), a_team("audio", 8))
    fleet: Sequence[Node] = field(default_factory=lambda: nodes(A100, count=2, gpus=8))
    queues: Sequence[Queue] = QUEUES
    balances: Sequence[Balance] = ()
    policy: Policy = field(default_factory=Policy)


RECLAIM = PreemptReason.RECLAIM_LENT_QUOTA
PRIORITY = PreemptReason.HIGHER_PRIORITY

CASES = [
    pytest.param(
        Case(_ones("a", 16), _v("j", 2), {"a15": RECLAIM, "a14": RECLAIM}),
        id="reclaim-lent-quota-most-recent-first",
    ),
    pytest.param(
        Case([_a("big", 4), *_ones("a", 12)], _v("j", 4), {"big": RECLAIM}),
        id="fewest-victims-beats-most-recent",
    ),
    pytest.param(
        Case(
            [_a("big", 8), *_ones("low", 8, queue="low")],
            _v("j", 8),
            {"big": RECLAIM},
        ),
        id="fewest-victims-beats-lowest-priority",
    ),
    pytest.param(
        Case(
            [*_ones("low", 4, queue="low"), *_ones("a", 12)],
            _v("j", 2),
            {"low3": RECLAIM, "low2": RECLAIM},
        ),
        id="lowest-priority-beats-most-recent",
    ),
    pytest.param(
        Case(
            [*_ones("v", 8, team="vision"), *_ones("a", 8)],
            _v("j", 2, priority=5),
            {"v7": PRIORITY, "v6": PRIORITY},
        ),
        id="higher-priority-preempts-own-team",
    ),
    pytest.param(
        Case([*_ones("v", 8, team="vision"), *_ones("a", 8)], _v("j", 2), {}),
        id="equal-priority-never-preempts",
    ),
    pytest.param(
        Case(
            [*_ones("v", 8, team="vision", queue="serve"), *_ones("a", 8)],
            _v("j", 2, queue="serve", priority=20),
            {},
        ),
        id="non-preemptible-jobs-are-never-victims",
    ),
    pytest.param(
        Case(
            [*_ones("a", 10), *_ones("v", 0)],
            _v("j", 6),
            {},
            fleet=nodes(A100, count=3, gpus=4),  # 12 GPUs, quotas 8 + 8
        ),
        id="reclaim-never-takes-a-lenders-own-nominal",
    ),
    pytest.param(
        Case(
            [*_ones("a", 10)],
            _v("j", 4),
            {"a9": RECLAIM, "a8": RECLAIM},
            fleet=nodes(A100, count=3, gpus=4),
        ),
        id="reclaim-exactly-what-was-borrowed",
    ),
    pytest.param(
        Case(
            [_a("scavenger", 4, queue="batch"), *_ones("v", 12, team="vision")],
            _v("j", 1),
            {"scavenger": PreemptReason.OVER_BUDGET},
            balances=(Balance("audio", 0),),
        ),
        id="over-budget-borrower-goes-first",
    ),
    pytest.param(
        Case(_ones("a", 16), _v("j", 2), {}, policy=Policy(preemption=False)),
        id="preemption-disabled",
    ),
    pytest.param(
        Case(_ones("a", 16), _v("j", 2), {}, policy=Policy(max_preemption_plans=0)),
        id="no-preemption-plans-left",
    ),
    pytest.param(
        Case(
            [*_ones("a", 12), *_ones("x", 4, team="text")],
            _v("j", 4),
            {"a11": RECLAIM, "a10": RECLAIM, "a9": RECLAIM, "a8": RECLAIM},
            teams=(a_team("vision", 8), a_team("audio", 4), a_team("text", 4, cohort="other")),
        ),
        id="only-cohort-members-are-reclaimed",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_preemption(case: Case) -> None:
    cluster = a_cluster(
        teams=case.teams,
        queues=case.queues,
        fleet=case.fleet,
        policy=case.policy,
        balances=case.balances,
    )
    for i, spec in enumerate(case.running):
        cluster.run(replace(spec, submit_us=T0_US + i))
    cluster.submit(case.job)
    result = cluster.cycle()
    preempted = {e.job_id: e.reason for e in result.events if isinstance(e, JobPreempted)}
    assert preempted == dict(case.victims)
    if case.victims:
        assert cluster.state.running_job(case.job.job_id) is not None
        assert all(e.by == case.job.job_id for e in result.events if isinstance(e, JobPreempted))
    else:
        assert cluster.state.running_job(case.job.job_id) is None


def test_victims_release_their_gpus_before_the_preemptor_gets_them() -> None:
    cluster = a_cluster(queues=QUEUES)
    for i, spec in enumerate(_ones("a", 16)):
        cluster.run(replace(spec, submit_us=T0_US + i))
    cluster.submit(_v("j", 2))
    events = list(cluster.cycle().events)
    released = [i for i, e in enumerate(events) if isinstance(e, GpuReleased)]
    assigned = [i for i, e in enumerate(events) if isinstance(e, GpuAssigned)]
    admitted = next(e for e in events if isinstance(e, JobAdmitted))
    assert len(released) == 2 and len(assigned) == 2
    assert max(released) < min(assigned)
    freed = {e.gpu_uuid for e in events if isinstance(e, GpuReleased)}
    assert set(admitted.gpu_uuids) == freed


def test_preempted_jobs_requeue_with_their_place_and_reason() -> None:
    cluster = a_cluster(queues=QUEUES)
    for i, spec in enumerate(_ones("a", 16)):
        cluster.run(replace(spec, submit_us=T0_US + i))
    cluster.submit(_v("j", 1))
    cluster.cycle()
    requeued = cluster.state.pending_job("a15")
    assert requeued is not None
    assert requeued.last_wait is WaitReason.PREEMPTED
    assert requeued.spec.submit_us == T0_US + 15
    assert requeued.attempt == 1
    cluster.cycle()
    assert cluster.reason("a15") is WaitReason.COHORT_EXHAUSTED


def test_a_reclaiming_team_gets_its_nominal_back_over_cycles() -> None:
    cluster = a_cluster(queues=QUEUES, policy=Policy(max_preemption_plans=1))
    for i, spec in enumerate(_ones("a", 16)):
        cluster.run(replace(spec, submit_us=T0_US + i))
    cluster.submit(*[a_spec(f"v{i}", "vision", submit_us=T0_US + 100 + i) for i in range(8)])
    cluster.settle()
    assert cluster.state.used("vision", A100) == 8 * UNITS
    assert cluster.state.used("audio", A100) == 8 * UNITS
