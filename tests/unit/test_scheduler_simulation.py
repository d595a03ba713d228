"""Randomised simulation invariants: random workloads (seeded) replayed through the real state
and cycle for thousands of cycles, every event batch checked by an independent bookkeeper.

Invariants (from the events alone, not from the scheduler's own state):
- a GPU is never assigned twice, and only its holder releases it;
- gang jobs are all-or-nothing: a job holds all its GPUs or none at every batch boundary;
- every admitted job's GPUs match its model and pool constraint, are of one flavor, and lie on
  one node when the job may not span nodes;
- no team holds more than nominal + borrowing limit of a flavor (nominal only, without a cohort);
- lending limits hold: per cohort and flavor, Σ borrowed ≤ Σ min(lending limit, unused nominal);
- budgets never go below the configured overdraft (over-budget borrowers, which run without a
  hold where their queue allows it, are the documented exception and are counted apart);
- jobs of a non-preemptible queue are never preempted, and no preemption is wasted: the job
  it was for is admitted in the same cycle.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import pytest

from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
)
from ledger.pricing import cost_of
from ledger.units import US_PER_MS
from scheduler.model import (
    FIFO_POLICY,
    Balance,
    Flavor,
    Node,
    Ordering,
    OverBudget,
    Policy,
    Queue,
    QueueClass,
    Quota,
    Team,
)
from scheduler.quota import UNITS, over, spare
from scheduler.simulation import SimJob, Simulation
from scheduler.state import SchedulerState
from tests.scheduler_builders import (
    HOUR_US,
    MINUTE_US,
    PRICE_PER_GPU_HOUR,
    T0_US,
    a_queue,
    nodes,
    prices,
)

A100 = Flavor("main", "A100")
H100 = Flavor("main", "H100")
L4 = Flavor("edge", "L4")
FLEET = nodes(A100, count=3, gpus=8) + nodes(H100, count=2, gpus=4) + nodes(L4, count=2, gpus=2)
QUEUES = (
    a_queue("train", max_retries=1),
    a_queue(
        "serve", QueueClass.INFERENCE, priority=10, preemptible=False, max_runtime_us=2 * HOUR_US
    ),
    a_queue("dev", QueueClass.DEV, priority=5),
    a_queue("batch", priority=-5, over_budget=OverBudget.RUN_PREEMPTIBLE),
)
MODELS = [None] * 12 + ["A100"] * 5 + ["H100"] * 2 + ["L4"]
SIZES = [1, 1, 1, 1, 2, 2, 3, 4, 8, 12]


def _limit(rng: random.Random, choices: Sequence[int | None]) -> int | None:
    return rng.choice(list(choices))


def random_teams(rng: random.Random) -> list[Team]:
    return [
        Team(
            "vision",
            (
                Quota(A100, 10, _limit(rng, (None, 0, 4, 8)), _limit(rng, (None, 2, 6))),
                Quota(H100, 4, _limit(rng, (None, 2)), _limit(rng, (None, 0, 2))),
            ),
            cohort="research",
        ),
        Team(
            "audio",
            (
                Quota(A100, 8, _limit(rng, (None, 2)), _limit(rng, (None, 0, 4))),
                Quota(H100, 4, None, _limit(rng, (None, 1))),
            ),
            cohort="research",
        ),
        Team(
            "text",
            (Quota(A100, 6, _limit(rng, (None, 6)), None), Quota(L4, 2, 2, None)),
            cohort="research",
        ),
        Team("solo", (Quota(L4, 2), Quota(H100, 0, 4, None)), cohort=None),
    ]


BALANCES = (
    Balance(
        "vision", money_micros=40 * PRICE_PER_GPU_HOUR, overdraft_micros=5 * PRICE_PER_GPU_HOUR
    ),
    Balance("audio", gpu_ms=30 * 3_600_000, overdraft_gpu_ms=3_600_000),
)


def random_jobs(rng: random.Random, count: int) -> list[SimJob]:
    jobs = []
    at = T0_US
    for i in range(count):
        at += int(rng.expovariate(1 / (4 * MINUTE_US)))
        runtime = max(MINUTE_US, int(rng.expovariate(1 / HOUR_US)))
        spec = JobSpec(
            job_id=f"job-{i:05d}",
            team=rng.choice(["vision", "vision", "audio", "text", "solo"]),
            project="p",
            user="u",
            queue=rng.choices(["train", "serve", "dev", "batch"], weights=[6, 2, 2, 2])[0],
            gpus=rng.choice(SIZES),
            submit_us=at,
            estimated_runtime_us=int(runtime * rng.uniform(1.0, 2.0)),  # estimates never short
            max_runtime_us=rng.choice([None] * 9 + [HOUR_US]),
            model=rng.choice(MODELS),
            span_nodes=rng.random() < 0.8,
            priority=rng.choice([None] * 9 + [rng.randint(-3, 3)]),
        )
        jobs.append(SimJob(spec, runtime, failing_attempts=int(rng.random() < 0.1)))
    return jobs


@dataclass
class Bookkeeper:
    """Checks every batch of events against the invariants, from the events alone."""

    teams: Sequence[Team]
    queues: Sequence[Queue]
    fleet: Sequence[Node]
    enforce_quota: bool = True
    home: dict[str, tuple[str, Flavor]] = field(default_factory=dict)
    holder: dict[str, str] = field(default_factory=dict)
    held: dict[str, set[str]] = field(default_factory=dict)  # job → GPUs it holds
    specs: dict[str, JobSpec] = field(default_factory=dict)
    admitted_at: dict[str, int] = field(default_factory=dict)
    over_budget: set[str] = field(default_factory=set)
    unheld_cost: Counter[str] = field(default_factory=Counter)  # settled over-budget usage
    unheld_gpu_ms: Counter[str] = field(default_factory=Counter)
    seen: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for node in self.fleet:
            for uuid in node.gpu_uuids:
                self.home[uuid] = (node.name, node.flavor)

    def __call__(self, events: Sequence[JobEvent], state: SchedulerState) -> None:
        self.batch(events)
        self.check_budgets(state)

    def batch(self, events: Sequence[JobEvent]) -> None:
        preemptors: set[str] = set()
        admitted: set[str] = set()
        for event in events:
            self.seen[type(event).__name__] += 1
            if isinstance(event, JobSubmitted):
                self.specs[event.spec.job_id] = event.spec
            elif isinstance(event, JobAdmitted):
                self.admitted(event)
                admitted.add(event.job_id)
            elif isinstance(event, GpuAssigned):
                holder = self.holder.get(event.gpu_uuid)
                assert holder is None, (
                    f"{event.gpu_uuid} assigned to {event.job_id}, held by {holder}"
                )
                self.holder[event.gpu_uuid] = event.job_id
                self.held.setdefault(event.job_id, set()).add(event.gpu_uuid)
            elif isinstance(event, GpuReleased):
                holder = self.holder.pop(event.gpu_uuid, None)
                assert holder == event.job_id, f"{event.gpu_uuid} released by {event.job_id}"
                self.held[event.job_id].discard(event.gpu_uuid)
            elif isinstance(event, JobPreempted | JobFinished | JobFailed | JobReclaimed):
                self.run_ended(event.job_id, event.time_us)
                if isinstance(event, JobPreempted):
                    preemptors.add(event.by)
                    queue = self.specs[event.job_id].queue
                    assert queue != "serve", f"non-preemptible {event.job_id} was preempted"
            elif isinstance(event, JobWaiting) and event.reason is WaitReason.BUDGET_EXHAUSTED:
                self.seen["budget_exhausted"] += 1
        assert preemptors <= admitted, f"preempted for {preemptors - admitted}, not admitted"
        self.check_gangs()
        if self.enforce_quota:
            self.check_quotas()

    def run_ended(self, job_id: str, time_us: int) -> None:
        """Over-budget runs are settled without a hold: count their usage apart."""
        gpus = len(self.held.get(job_id, ()))
        if job_id in self.over_budget and gpus:
            gpu_ms = gpus * ((time_us - self.admitted_at[job_id]) // US_PER_MS)
            team = self.specs[job_id].team
            self.unheld_cost[team] += cost_of(gpu_ms, PRICE_PER_GPU_HOUR)
            self.unheld_gpu_ms[team] += gpu_ms

    def admitted(self, event: JobAdmitted) -> None:
        spec = self.specs[event.job_id]
        assert not self.held.get(event.job_id), f"{event.job_id} admitted while holding GPUs"
        assert len(event.gpu_uuids) == len(set(event.gpu_uuids)) == spec.gpus
        flavors = {self.home[u][1] for u in event.gpu_uuids}
        assert flavors == {Flavor(event.pool, event.model)}, f"{event.job_id} spans flavors"
        if spec.model is not None:
            assert event.model == spec.model, f"{event.job_id} wanted {spec.model}"
        if spec.pool is not None:
            assert event.pool == spec.pool
        if not spec.span_nodes:
            nodes_used = {self.home[u][0] for u in event.gpu_uuids}
            assert len(nodes_used) == 1, f"{event.job_id} may not span nodes"
        self.admitted_at[event.job_id] = event.time_us
        if event.over_budget:
            self.over_budget.add(event.job_id)
            self.seen["over_budget"] += 1
        else:
            self.over_budget.discard(event.job_id)
        if event.borrowed_gpus:
            self.seen["borrowed"] += 1

    def check_gangs(self) -> None:
        for job_id, gpus in self.held.items():
            assert len(gpus) in (0, self.specs[job_id].gpus), f"{job_id} holds part of its gang"

    def usage(self) -> Counter[tuple[str, Flavor]]:
        used: Counter[tuple[str, Flavor]] = Counter()
        for uuid, job_id in self.holder.items():
            spec = self.specs[job_id]
            used[(spec.team, self.home[uuid][1])] += spec.gpu_share or UNITS
        return used

    def check_quotas(self) -> None:
        used = self.usage()
        totals: dict[tuple[str, Flavor], list[int]] = {}
        for team in self.teams:
            for q in team.quotas:
                u = used[(team.name, q.flavor)]
                limit = 0 if team.cohort is None else q.borrowing_limit
                if limit is not None:
                    held = f"{team.name} holds {u / UNITS:g} of {q.flavor}"
                    assert u <= (q.nominal + limit) * UNITS, held
                if team.cohort is not None:
                    t = totals.setdefault((team.cohort, q.flavor), [0, 0])
                    t[0] += over(q, u)
                    t[1] += spare(q, u)
            flavors = {q.flavor for q in team.quotas}
            for (name, flavor), u in used.items():
                assert name != team.name or flavor in flavors or u == 0, f"{name} used {flavor}"
        for key, (borrowed, lendable) in totals.items():
            assert borrowed <= lendable, f"{key}: {borrowed} borrowed > {lendable} lendable"

    def check_budgets(self, state: SchedulerState) -> None:
        for balance in BALANCES:
            now = state.balance(balance.team)
            assert now is not None
            holds = state.open_holds(balance.team)
            if now.money_micros is not None:
                held_path = now.money_micros + self.unheld_cost[balance.team] - holds.money_micros
                assert held_path >= -balance.overdraft_micros, f"{balance.team} over budget"
            if now.gpu_ms is not None:
                held_path = now.gpu_ms + self.unheld_gpu_ms[balance.team] - holds.gpu_ms
                assert held_path >= -balance.overdraft_gpu_ms, f"{balance.team} over budget"


POLICIES = [
    pytest.param(Policy(), id="tally"),
    pytest.param(Policy(ordering=Ordering.REQUESTED_SHARE, heads_per_queue=3), id="request-share"),
    pytest.param(FIFO_POLICY, id="fifo"),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("policy", POLICIES)
def test_invariants_hold_over_thousands_of_cycles(policy: Policy, seed: int) -> None:
    rng = random.Random(seed)
    teams = random_teams(rng)
    state = SchedulerState(QUEUES, teams, FLEET, prices=prices(), half_life_us=6 * HOUR_US)
    for balance in BALANCES:
        state.set_balance(balance)
    book = Bookkeeper(teams, QUEUES, FLEET, enforce_quota=policy.enforce_quota)
    sim = Simulation(state, policy, listener=book, meter_interval_us=10 * MINUTE_US)
    report = sim.run(random_jobs(rng, 1_000), overdue_interval_us=10 * MINUTE_US)
    assert len(report.cycles) >= 1_000
    assert book.seen["GpuAssigned"] >= 1_000
    assert book.seen["JobPreempted"] > 0 or not policy.preemption
    assert book.seen["borrowed"] > 0 or not policy.borrowing
    assert book.seen["over_budget"] > 0 and book.seen["budget_exhausted"] > 0
    assert book.seen["JobFailed"] > 0
    assert state.running_count == 0 and not book.holder, "every run ended"
    for job_id in set(book.specs) - set(report.ended_us):
        pending = state.pending_job(job_id)  # left: jobs that never fit, or out of budget
        assert pending is not None
        budgeted = pending.spec.team in {b.team for b in BALANCES}
        assert budgeted or pending.last_wait is WaitReason.NO_MATCHING_GPUS, pending


# ---------------------------------------------------------------------------- the bookkeeper fails


def _spec(job_id: str, gpus: int = 2, **kw: object) -> JobSpec:
    base = JobSpec(job_id, "vision", "p", "u", "train", gpus, T0_US, HOUR_US)
    return JobSpec(**{**{f.name: getattr(base, f.name) for f in fields(base)}, **kw})


def _admit(
    spec: JobSpec, uuids: Sequence[str], model: str = "A100", borrowed: int = 0
) -> list[JobEvent]:
    flavor = Flavor("main", model) if model != "L4" else L4
    nodes_of = [uuid.rsplit("-", 1)[0].removeprefix("GPU-") for uuid in uuids]
    admitted = JobAdmitted(
        spec.job_id,
        spec.team,
        spec.queue,
        flavor.pool,
        flavor.model,
        tuple(uuids),
        tuple(nodes_of),
        0,
        borrowed,
        True,
        0,
        0,
        1,
        T0_US,
    )
    assigned = [
        GpuAssigned(u, n, flavor.pool, flavor.model, spec.job_id, spec.team, "p", "u", T0_US)
        for u, n in zip(uuids, nodes_of, strict=True)
    ]
    return [admitted, *assigned]


def _bookkeeper() -> Bookkeeper:
    return Bookkeeper(random_teams(random.Random(0)), QUEUES, FLEET)


BROKEN = [
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a"), T0_US),
            JobSubmitted(_spec("b"), T0_US),
            *_admit(_spec("a"), ["GPU-a100-00-0", "GPU-a100-00-1"]),
            *_admit(_spec("b"), ["GPU-a100-00-1", "GPU-a100-00-2"]),
        ],
        "held by a",
        id="gpu-assigned-twice",
    ),
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a"), T0_US),
            *_admit(_spec("a"), ["GPU-a100-00-0", "GPU-a100-00-1"])[:2],
        ],
        "holds part of its gang",
        id="partial-gang",
    ),
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a", model="H100"), T0_US),
            *_admit(_spec("a", model="H100"), ["GPU-a100-00-0", "GPU-a100-00-1"]),
        ],
        "wanted H100",
        id="wrong-model",
    ),
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a", span_nodes=False), T0_US),
            *_admit(_spec("a", span_nodes=False), ["GPU-a100-00-0", "GPU-a100-01-0"]),
        ],
        "may not span nodes",
        id="single-node-job-on-two-nodes",
    ),
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a", gpus=24), T0_US),
            *_admit(
                _spec("a", gpus=24), [f"GPU-a100-0{n}-{i}" for n in range(3) for i in range(8)]
            ),
        ],
        "vision holds 24|borrowed >",  # beyond nominal + all the cohort may lend
        id="beyond-quota",
    ),
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a", team="solo", gpus=4, model="H100"), T0_US),
            *_admit(
                _spec("a", team="solo", gpus=4, model="H100"),
                [f"GPU-h100-00-{i}" for i in range(4)],
                model="H100",
            ),
        ],
        "solo holds 4",
        id="borrowing-without-a-cohort",
    ),
    pytest.param(
        lambda: [
            JobSubmitted(_spec("a", queue="serve"), T0_US),
            *_admit(_spec("a", queue="serve"), ["GPU-a100-00-0", "GPU-a100-00-1"]),
            JobPreempted(
                "a",
                "b",
                PreemptReason.HIGHER_PRIORITY,
                T0_US,
            ),
        ],
        "non-preemptible",
        id="non-preemptible-preempted",
    ),
]


@pytest.mark.parametrize(("stream", "message"), BROKEN)
def test_the_bookkeeper_catches_broken_event_streams(stream: object, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        _bookkeeper().batch(stream())  # type: ignore[operator]


def test_the_bookkeeper_catches_a_budget_below_its_overdraft() -> None:
    state = SchedulerState(QUEUES, random_teams(random.Random(0)), FLEET, prices=prices())
    for balance in BALANCES:
        state.set_balance(balance)
    state.set_balance(Balance("vision", money_micros=-5 * PRICE_PER_GPU_HOUR - 1))
    with pytest.raises(AssertionError, match="vision over budget"):
        _bookkeeper().check_budgets(state)
