"""Builders for scheduler test objects: sensible defaults, override what the test is about.

A `Cluster` wraps a `SchedulerState` with the verbs a policy test speaks in: submit jobs, put
jobs on GPUs (through a real admission, so state stays consistent), run a cycle and apply it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ledger.job_events import JobEvent, JobSpec, JobSubmitted, JobWaiting, WaitReason
from ledger.pricing import Price, PriceBook
from scheduler.cycle import CycleResult, run_cycle
from scheduler.model import (
    DEFAULT_IDLE_POLICY,
    Balance,
    Flavor,
    IdlePolicy,
    Node,
    OverBudget,
    Policy,
    Queue,
    QueueClass,
    Quota,
    RunningJob,
    Team,
)
from scheduler.snapshot import ClusterSnapshot
from scheduler.state import SchedulerState

T0_US = 1_793_491_200_000_000  # 2026-11-01T00:00:00Z
SECOND_US = 1_000_000
MINUTE_US = 60 * SECOND_US
HOUR_US = 60 * MINUTE_US

A100 = Flavor("main", "A100")
H100 = Flavor("main", "H100")
PRICE_PER_GPU_HOUR = 2_000_000  # 2.00 per GPU-hour, in micro-units


def nodes(
    flavor: Flavor = A100, count: int = 2, gpus: int = 8, prefix: str | None = None
) -> tuple[Node, ...]:
    name = prefix or flavor.model.lower()
    return tuple(
        Node(
            name=f"{name}-{n:02d}",
            pool=flavor.pool,
            model=flavor.model,
            gpu_uuids=tuple(f"GPU-{name}-{n:02d}-{i}" for i in range(gpus)),
        )
        for n in range(count)
    )


def a_queue(
    name: str = "train",
    queue_class: QueueClass = QueueClass.TRAINING,
    priority: int = 0,
    preemptible: bool = True,
    idle: IdlePolicy | None = None,
    max_runtime_us: int | None = None,
    over_budget: OverBudget = OverBudget.WAIT,
    max_retries: int = 0,
    allowed_models: tuple[str, ...] | None = None,
    forbidden_models: tuple[str, ...] = (),
) -> Queue:
    return Queue(
        name=name,
        queue_class=queue_class,
        priority=priority,
        preemptible=preemptible,
        idle=idle or DEFAULT_IDLE_POLICY[queue_class],
        max_runtime_us=max_runtime_us,
        over_budget=over_budget,
        max_retries=max_retries,
        allowed_models=allowed_models,
        forbidden_models=forbidden_models,
    )


def a_team(
    name: str,
    nominal: int = 8,
    flavor: Flavor = A100,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    cohort: str | None = "all",
    extra: Sequence[Quota] = (),
    weight: int | None = None,
) -> Team:
    quota = Quota(flavor, nominal, borrowing_limit, lending_limit)
    return Team(name=name, quotas=(quota, *extra), cohort=cohort, weight=weight)


def a_spec(job_id: str = "job-1", team: str = "vision", **overrides: Any) -> JobSpec:
    base = JobSpec(
        job_id=job_id,
        team=team,
        project=f"{team}-project",
        user=f"{team}-user",
        queue="train",
        gpus=1,
        submit_us=T0_US,
        estimated_runtime_us=HOUR_US,
    )
    return replace(base, **overrides)


def prices(micros_per_gpu_hour: int = PRICE_PER_GPU_HOUR) -> PriceBook:
    return PriceBook((Price("*", micros_per_gpu_hour),))


@dataclass
class Cluster:
    """A scheduler state plus a clock, for tests that tell a story in cycles."""

    state: SchedulerState
    policy: Policy = field(default_factory=Policy)
    now_us: int = T0_US
    log: list[JobEvent] = field(default_factory=list)

    def apply(self, events: Iterable[JobEvent]) -> None:
        for event in events:
            self.state.apply(event)
            self.log.append(event)

    def submit(self, *specs: JobSpec) -> None:
        self.apply(JobSubmitted(spec=s, time_us=max(s.submit_us, self.now_us)) for s in specs)

    def snapshot(self) -> ClusterSnapshot:
        return self.state.snapshot(self.now_us, self.policy.heads_per_queue)

    def cycle(self, advance_us: int = SECOND_US) -> CycleResult:
        self.now_us += advance_us
        result = run_cycle(self.snapshot(), self.policy)
        self.apply(result.events)
        return result

    def settle(self, limit: int = 50) -> list[CycleResult]:
        """Cycles until one admits and preempts nothing."""
        results = []
        for _ in range(limit):
            result = self.cycle()
            results.append(result)
            if not result.admitted and not result.preempted:
                break
        return results

    def run(self, *specs: JobSpec) -> None:
        """Submit jobs and admit them (the test asserts they were admitted)."""
        self.submit(*specs)
        self.settle()
        missing = [s.job_id for s in specs if self.state.running_job(s.job_id) is None]
        assert not missing, f"setup: {missing} not admitted: {self.waiting_reasons()}"

    def running(self, job_id: str) -> RunningJob:
        job = self.state.running_job(job_id)
        assert job is not None, f"{job_id} is not running"
        return job

    def waiting_reasons(self) -> dict[str, WaitReason]:
        reasons: dict[str, WaitReason] = {}
        for event in self.log:
            if isinstance(event, JobWaiting):
                reasons[event.job_id] = event.reason
        return {j: r for j, r in reasons.items() if self.state.pending_job(j) is not None}

    def reason(self, job_id: str) -> WaitReason | None:
        job = self.state.pending_job(job_id)
        return None if job is None else job.last_wait


def a_cluster(
    teams: Sequence[Team] = (),
    queues: Sequence[Queue] | None = None,
    fleet: Sequence[Node] | None = None,
    policy: Policy | None = None,
    balances: Sequence[Balance] = (),
    price_book: PriceBook | None = None,
    half_life_us: int = 24 * HOUR_US,
) -> Cluster:
    state = SchedulerState(
        queues if queues is not None else (a_queue(),),
        teams or (a_team("vision"), a_team("audio")),
        fleet if fleet is not None else nodes(),
        prices=price_book if price_book is not None else prices(),
        half_life_us=half_life_us,
    )
    for balance in balances:
        state.set_balance(balance)
    return Cluster(state, policy or Policy())
