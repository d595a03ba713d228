"""Admission policy: free GPUs of a matching model (gangs all-or-nothing), quota with
borrowing and lending limits, and budget holds."""

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from ledger.job_events import GpuAssigned, JobAdmitted, JobSpec, JobWaiting, WaitReason
from scheduler.admission import Blocked, Fit, Workspace, evaluate, nominate
from scheduler.budget import expected_gpu_ms
from scheduler.model import (
    FIFO_POLICY,
    Balance,
    Flavor,
    Node,
    OverBudget,
    Policy,
    Queue,
    Quota,
    Team,
)
from scheduler.placement import place
from scheduler.quota import UNITS
from tests.scheduler_builders import (
    A100,
    H100,
    HOUR_US,
    PRICE_PER_GPU_HOUR,
    T0_US,
    a_cluster,
    a_queue,
    a_spec,
    a_team,
    nodes,
)

TWO_A100_NODES = nodes(A100, count=2, gpus=8)
MIXED = nodes(A100, count=1, gpus=8) + nodes(H100, count=1, gpus=4)
SMALL_NODES = nodes(A100, count=4, gpus=2)


@dataclass(frozen=True)
class Case:
    """Run `before` (each must be admitted), submit `job`, run one cycle."""

    job: JobSpec
    expect: WaitReason | Flavor  # a wait reason, or the flavor it is admitted in
    teams: Sequence[Team] = (a_team("vision", 8), a_team("audio", 8))
    fleet: Sequence[Node] = TWO_A100_NODES
    before: Sequence[JobSpec] = ()
    queues: Sequence[Queue] = (a_queue(), a_queue("serve", preemptible=False, priority=10))
    policy: Policy = field(default_factory=Policy)


def _vision(job_id: str, gpus: int = 1, **kw: object) -> JobSpec:
    return a_spec(job_id, "vision", gpus=gpus, **kw)


def _audio(job_id: str, gpus: int = 1, **kw: object) -> JobSpec:
    return a_spec(job_id, "audio", gpus=gpus, **kw)


CASES = [
    # capacity and gangs
    pytest.param(Case(_vision("j", 8), A100), id="fits-within-nominal"),
    pytest.param(
        Case(
            _vision("j", 4),
            WaitReason.NO_CAPACITY,
            fleet=nodes(A100, count=3, gpus=4),  # quotas (16) exceed the fleet (12)
            before=[_audio("a", 8), _vision("v", 1)],
        ),
        id="gang-waits-when-3-of-4-are-free",
    ),
    pytest.param(Case(_vision("j", 4), A100, fleet=SMALL_NODES), id="gang-spans-nodes"),
    pytest.param(
        Case(_vision("j", 4, span_nodes=False), WaitReason.NO_MATCHING_GPUS, fleet=SMALL_NODES),
        id="single-node-job-larger-than-any-node",
    ),
    pytest.param(Case(_vision("j", 17), WaitReason.NO_MATCHING_GPUS), id="larger-than-fleet"),
    # model constraints
    pytest.param(
        Case(
            _vision("j", 2, model="H100"),
            H100,
            fleet=MIXED,
            teams=[a_team("vision", 8, extra=[Quota(H100, 4)]), a_team("audio", 8)],
        ),
        id="model-constraint-picks-h100",
    ),
    pytest.param(
        Case(
            _vision("j", 2, model="H100"),
            WaitReason.NO_MATCHING_GPUS,
            fleet=MIXED,
        ),
        id="model-outside-team-quota",
    ),
    pytest.param(
        Case(_vision("j", 1, model="B200"), WaitReason.NO_MATCHING_GPUS),
        id="model-not-in-fleet",
    ),
    pytest.param(
        Case(
            _vision("j", 2),
            H100,
            fleet=MIXED,
            teams=[a_team("vision", 8, extra=[Quota(H100, 4)]), a_team("audio", 8)],
            before=[_vision("v", 8, model="A100")],
        ),
        id="any-model-falls-back-to-second-flavor",
    ),
    pytest.param(
        Case(_vision("j", 1, pool="other"), WaitReason.NO_MATCHING_GPUS),
        id="pool-constraint-with-no-such-pool",
    ),
    # quota and borrowing
    pytest.param(
        Case(_vision("j", 4), A100, before=[_vision("v", 8)]),
        id="borrows-unused-quota-of-cohort",
    ),
    pytest.param(
        Case(
            _vision("j", 4),
            WaitReason.QUOTA_EXHAUSTED,
            teams=[a_team("vision", 8, borrowing_limit=2), a_team("audio", 8)],
            before=[_vision("v", 8)],
        ),
        id="borrowing-limit",
    ),
    pytest.param(
        Case(
            _vision("j", 2),
            A100,
            teams=[a_team("vision", 8, borrowing_limit=2), a_team("audio", 8)],
            before=[_vision("v", 8)],
        ),
        id="borrowing-exactly-to-the-limit",
    ),
    pytest.param(
        Case(
            _vision("j", 4),
            WaitReason.QUOTA_EXHAUSTED,
            teams=[a_team("vision", 8, cohort=None), a_team("audio", 8, cohort=None)],
            before=[_vision("v", 8)],
        ),
        id="no-cohort-no-borrowing",
    ),
    pytest.param(
        Case(
            _vision("j", 4, queue="serve"),
            WaitReason.QUOTA_EXHAUSTED,
            before=[_vision("v", 8, queue="serve")],
        ),
        id="non-preemptible-queue-never-borrows",
    ),
    pytest.param(
        Case(
            _vision("j", 4),
            WaitReason.QUOTA_EXHAUSTED,
            before=[_vision("v", 8)],
            policy=Policy(borrowing=False),
        ),
        id="policy-without-borrowing",
    ),
    pytest.param(
        Case(
            _vision("j", 4),
            WaitReason.COHORT_EXHAUSTED,
            teams=[a_team("vision", 8), a_team("audio", 8, lending_limit=3)],
            before=[_vision("v", 8)],
        ),
        id="lending-limit-below-request",
    ),
    pytest.param(
        Case(
            _vision("j", 3),
            A100,
            teams=[a_team("vision", 8), a_team("audio", 8, lending_limit=3)],
            before=[_vision("v", 8)],
        ),
        id="lending-limit-exactly",
    ),
    pytest.param(
        Case(
            _vision("j", 5),
            WaitReason.COHORT_EXHAUSTED,
            teams=[a_team("vision", 8), a_team("audio", 8, lending_limit=6)],
            before=[_vision("v", 8), _audio("a", 4)],
        ),
        id="lender-uses-part-of-its-quota",
    ),
    pytest.param(
        Case(
            _vision("j", 5),
            A100,
            teams=[a_team("vision", 4), a_team("audio", 6, lending_limit=2), a_team("text", 6)],
            fleet=nodes(A100, count=2, gpus=8),
            before=[_vision("v", 4)],
        ),
        id="borrows-from-two-lenders",
    ),
    pytest.param(
        Case(
            _vision("j", 9),
            A100,
            before=[],
            policy=FIFO_POLICY,
        ),
        id="no-quota-enforcement",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_admission(case: Case) -> None:
    cluster = a_cluster(teams=case.teams, queues=case.queues, fleet=case.fleet, policy=case.policy)
    if case.before:
        cluster.run(*case.before)
    cluster.submit(case.job)
    result = cluster.cycle()
    running = cluster.state.running_job(case.job.job_id)
    if isinstance(case.expect, WaitReason):
        assert running is None
        assert cluster.reason(case.job.job_id) is case.expect
        assert case.job.job_id not in result.admitted
    else:
        assert running is not None, cluster.waiting_reasons()
        assert running.flavor == case.expect
        assert len(running.gpus) == case.job.gpus


def test_single_node_job_waits_when_free_gpus_are_split_across_nodes() -> None:
    from scheduler.lifecycle import finish

    cluster = a_cluster(fleet=nodes(A100, count=2, gpus=2))
    cluster.run(*(_vision(f"v{i}", 1, submit_us=T0_US + i) for i in range(4)))
    nodes_of = {j: cluster.running(j).gpus[0].node for j in ("v0", "v1", "v2", "v3")}
    assert nodes_of["v0"] == nodes_of["v1"] != nodes_of["v2"] == nodes_of["v3"]  # best fit packs
    cluster.apply(finish(cluster.running("v0"), cluster.now_us))
    cluster.apply(finish(cluster.running("v2"), cluster.now_us))
    cluster.submit(
        _vision("one-node", 2, span_nodes=False), _vision("gang", 2, submit_us=T0_US + 9)
    )
    cluster.cycle()
    assert cluster.reason("one-node") is WaitReason.NO_CAPACITY
    assert len({g.node for g in cluster.running("gang").gpus}) == 2


def test_a_gang_is_assigned_all_its_gpus_in_one_cycle() -> None:
    cluster = a_cluster(fleet=SMALL_NODES)
    cluster.submit(_vision("j", 5))
    result = cluster.cycle()
    assigned = [e for e in result.events if isinstance(e, GpuAssigned)]
    admitted = [e for e in result.events if isinstance(e, JobAdmitted)]
    assert len(admitted) == 1
    assert len(assigned) == 5
    assert {e.gpu_uuid for e in assigned} == set(admitted[0].gpu_uuids)
    assert len({e.node for e in assigned}) == 3  # 2 + 2 + 1: fewest nodes


def test_a_waiting_gang_holds_no_gpus() -> None:
    cluster = a_cluster(fleet=SMALL_NODES)
    cluster.run(_audio("a", 5))
    cluster.submit(_vision("j", 4))
    result = cluster.cycle()
    assert not [e for e in result.events if isinstance(e, GpuAssigned)]
    assert cluster.state.free_total(A100) == 3


def test_borrowed_gpus_are_recorded_on_admission() -> None:
    cluster = a_cluster()
    cluster.run(_vision("v", 6))
    cluster.submit(_vision("j", 4))
    cluster.cycle()
    assert cluster.running("j").borrowed == 2
    assert cluster.running("v").borrowed == 0


# ---------------------------------------------------------------------------- budgets

BUDGET = 10 * PRICE_PER_GPU_HOUR  # ten GPU-hours of money


@dataclass(frozen=True)
class BudgetCase:
    job: JobSpec
    balance: Balance
    expect: WaitReason | None  # None: admitted
    before: Sequence[JobSpec] = ()
    over_budget: OverBudget = OverBudget.WAIT
    priced: bool = True


def _hours(job_id: str, gpus: int, hours: int) -> JobSpec:
    return _vision(job_id, gpus, estimated_runtime_us=hours * HOUR_US)


BUDGET_CASES = [
    pytest.param(BudgetCase(_hours("j", 2, 5), Balance("vision", BUDGET), None), id="hold-fits"),
    pytest.param(
        BudgetCase(_hours("j", 2, 6), Balance("vision", BUDGET), WaitReason.BUDGET_EXHAUSTED),
        id="hold-larger-than-balance",
    ),
    pytest.param(
        BudgetCase(
            _hours("j", 2, 6),
            Balance("vision", BUDGET, overdraft_micros=2 * PRICE_PER_GPU_HOUR),
            None,
        ),
        id="overdraft-covers-the-rest",
    ),
    pytest.param(
        BudgetCase(
            _hours("j", 2, 6),
            Balance("vision", BUDGET, overdraft_micros=2 * PRICE_PER_GPU_HOUR - 1),
            WaitReason.BUDGET_EXHAUSTED,
        ),
        id="overdraft-one-micro-short",
    ),
    pytest.param(
        BudgetCase(
            _hours("j", 1, 3),
            Balance("vision", BUDGET),
            WaitReason.BUDGET_EXHAUSTED,
            before=[_hours("v", 4, 2)],
        ),
        id="open-holds-count",
    ),
    pytest.param(
        BudgetCase(_hours("j", 1, 1), Balance("vision", -1), WaitReason.BUDGET_EXHAUSTED),
        id="balance-already-negative",
    ),
    pytest.param(
        BudgetCase(
            _hours("j", 2, 6),
            Balance("vision", gpu_ms=12 * 3_600_000),
            None,
        ),
        id="gpu-time-budget-fits",
    ),
    pytest.param(
        BudgetCase(
            _hours("j", 2, 7),
            Balance("vision", gpu_ms=12 * 3_600_000),
            WaitReason.BUDGET_EXHAUSTED,
        ),
        id="gpu-time-budget-exhausted",
    ),
    pytest.param(
        BudgetCase(
            _hours("j", 2, 6),
            Balance("vision", BUDGET),
            None,
            over_budget=OverBudget.RUN_PREEMPTIBLE,
        ),
        id="over-budget-runs-preemptible-where-queue-allows",
    ),
    pytest.param(
        BudgetCase(_hours("j", 1, 1), Balance("vision", BUDGET), WaitReason.NO_PRICE, priced=False),
        id="money-budget-without-price",
    ),
    pytest.param(
        BudgetCase(_hours("j", 1, 1), Balance("audio", 0), None),
        id="another-teams-budget-does-not-apply",
    ),
]


@pytest.mark.parametrize("case", BUDGET_CASES)
def test_budget_holds(case: BudgetCase) -> None:
    from ledger.pricing import PriceBook

    cluster = a_cluster(
        queues=(a_queue(over_budget=case.over_budget),),
        balances=(case.balance,),
        price_book=None if case.priced else PriceBook(()),
    )
    if case.before:
        cluster.run(*case.before)
    cluster.submit(case.job)
    cluster.cycle()
    running = cluster.state.running_job(case.job.job_id)
    if case.expect is not None:
        assert running is None
        assert cluster.reason(case.job.job_id) is case.expect
        return
    assert running is not None, cluster.waiting_reasons()
    if case.over_budget is OverBudget.RUN_PREEMPTIBLE:
        assert running.over_budget and running.preemptible
        assert running.hold.money_micros == 0
    else:
        assert not running.over_budget
        assert running.hold.gpu_ms == expected_gpu_ms(case.job)


def test_hold_is_expected_usage_at_the_price() -> None:
    cluster = a_cluster(balances=(Balance("vision", BUDGET),))
    cluster.submit(_hours("j", 2, 3))
    cluster.cycle()
    hold = cluster.running("j").hold
    assert hold.gpu_ms == 2 * 3 * 3_600_000
    assert hold.money_micros == 6 * PRICE_PER_GPU_HOUR
    assert cluster.state.open_holds("vision") == hold


def test_holds_are_released_when_the_job_ends() -> None:
    from scheduler.lifecycle import finish

    cluster = a_cluster(balances=(Balance("vision", BUDGET),))
    cluster.run(_hours("j", 2, 3))
    cluster.apply(finish(cluster.running("j"), cluster.now_us))
    assert cluster.state.open_holds("vision").money_micros == 0


def test_expected_gpu_ms_rounds_runtime_up_to_a_millisecond() -> None:
    assert expected_gpu_ms(_vision("j", 3, estimated_runtime_us=1_001)) == 3 * 2


# ---------------------------------------------------------------------------- order of a cycle


def test_strict_fifo_makes_later_jobs_wait_behind_the_head() -> None:
    cluster = a_cluster(policy=FIFO_POLICY)
    cluster.run(_vision("v", 12))
    cluster.submit(_vision("big", 8, submit_us=T0_US + 1), _audio("small", 1, submit_us=T0_US + 2))
    cluster.cycle()
    assert cluster.reason("big") is WaitReason.NO_CAPACITY
    assert cluster.reason("small") is WaitReason.BEHIND_HEAD


def test_best_effort_lets_small_jobs_past_a_blocked_one() -> None:
    cluster = a_cluster()
    cluster.run(_vision("v", 12))
    cluster.submit(_vision("big", 8, submit_us=T0_US + 1), _audio("small", 1, submit_us=T0_US + 2))
    cluster.cycle()
    assert cluster.reason("big") is not None
    assert cluster.state.running_job("small") is not None


def test_waiting_is_emitted_only_when_the_reason_changes() -> None:
    cluster = a_cluster()
    cluster.run(_vision("v", 16))
    cluster.submit(_vision("j", 1, submit_us=T0_US + 1))
    first = cluster.cycle()
    second = cluster.cycle()
    assert [e.reason for e in first.events if isinstance(e, JobWaiting)] == [
        WaitReason.COHORT_EXHAUSTED
    ]
    assert not [e for e in second.events if isinstance(e, JobWaiting)]
    assert second.decisions == 1


def test_unknown_queue_and_team_wait_with_that_reason() -> None:
    cluster = a_cluster()
    cluster.submit(a_spec("q", "vision", queue="nope"), a_spec("t", "nobody"))
    cluster.cycle()
    assert cluster.reason("q") is WaitReason.UNKNOWN_QUEUE
    assert cluster.reason("t") is WaitReason.UNKNOWN_QUEUE


def test_evaluate_never_changes_the_snapshot() -> None:
    cluster = a_cluster()
    cluster.submit(_vision("j", 4))
    snap = cluster.snapshot()
    before = (dict(snap.usage), {f: dict(g.by_node) for f, g in snap.free.items()})
    nominations, _ = nominate(snap, snap.heads, cluster.policy)
    ws = Workspace(snap)
    outcome = evaluate(nominations[0], ws, cluster.policy)
    assert isinstance(outcome, Fit)
    ws.take("vision", outcome.flavor, outcome.gpus, outcome.hold)
    assert isinstance(evaluate(nominations[0], ws, cluster.policy), Fit)
    assert (dict(snap.usage), {f: dict(g.by_node) for f, g in snap.free.items()}) == before
    assert ws.used("vision", A100) == 4 * UNITS and snap.used("vision", A100) == 0


def test_blocked_reports_where_preemption_could_help() -> None:
    cluster = a_cluster()
    cluster.run(_audio("a", 16))
    cluster.submit(_vision("j", 2))
    snap = cluster.snapshot()
    nominations, _ = nominate(snap, snap.heads, cluster.policy)
    outcome = evaluate(nominations[0], Workspace(snap), cluster.policy)
    assert isinstance(outcome, Blocked)
    assert outcome.reason is WaitReason.QUOTA_LENT
    assert [f for f, _ in outcome.preemptible_in] == [A100]


# ---------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("free", "gpus", "span", "expect_nodes"),
    [
        pytest.param({"n1": ("a",) * 8, "n2": ("b", "c")}, 2, True, {"n2"}, id="best-fit-node"),
        pytest.param({"n1": ("a", "b", "c"), "n2": ("d", "e")}, 3, True, {"n1"}, id="exact-fit"),
        pytest.param(
            {"n1": ("a", "b"), "n2": ("c", "d", "e"), "n3": ("f",)},
            4,
            True,
            {"n2", "n3"},
            id="gang-fewest-nodes-then-best-fit-remainder",
        ),
        pytest.param({"n1": ("a", "b"), "n2": ("c", "d")}, 3, False, None, id="no-span"),
        pytest.param({"n1": ("a",)}, 2, True, None, id="too-few"),
    ],
)
def test_placement(
    free: dict[str, tuple[str, ...]], gpus: int, span: bool, expect_nodes: set[str] | None
) -> None:
    placed = place(free, gpus, span)
    if expect_nodes is None:
        assert placed is None
        return
    assert placed is not None
    assert len(placed) == gpus
    assert len({g.uuid for g in placed}) == gpus or len(set(free.values())) < len(free)
    assert {g.node for g in placed} == expect_nodes
    for gpu in placed:
        assert gpu.uuid in free[gpu.node]


def test_nominate_uses_queue_priority_unless_the_job_names_one() -> None:
    cluster = a_cluster(queues=(a_queue(priority=3),))
    cluster.submit(_vision("a"), _vision("b", priority=-1, submit_us=T0_US + 1))
    snap = cluster.snapshot()
    nominations, verdicts = nominate(snap, snap.heads, cluster.policy)
    assert not verdicts
    assert {n.spec.job_id: n.priority for n in nominations} == {"a": 3, "b": -1}


def test_team_without_quota_in_a_flavor_cannot_use_it() -> None:
    teams = (Team("vision", (Quota(A100, 8),), "all"), Team("audio", (Quota(H100, 4),), "all"))
    cluster = a_cluster(teams=teams, fleet=MIXED)
    cluster.submit(_audio("j", 1, model="A100"))
    cluster.cycle()
    assert cluster.reason("j") is WaitReason.NO_MATCHING_GPUS
