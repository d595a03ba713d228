"""The scheduler's domain values: queues, teams and quotas, nodes, budgets, pending and running
jobs, and the policy a cycle runs under.

Invariants:
- every value is frozen and slotted, holds tuples, and validates itself on construction
  (`ConfigError`);
- money is integer micro-units, GPU time integer GPU-ms, time integer µs;
- a flavor is a (pool, GPU model) pair: quotas, capacity and usage are counted per flavor.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from ledger.job_events import JobSpec, WaitReason
from ledger.topology import GpuTopology
from ledger.units import US_PER_SECOND
from scheduler.errors import ConfigError

US_PER_MINUTE = 60 * US_PER_SECOND


class Flavor(NamedTuple):
    """A pool and a GPU model: the unit quotas, capacity and usage are counted in."""

    pool: str
    model: str

    def __str__(self) -> str:
        return f"{self.pool}/{self.model}"


class GpuRef(NamedTuple):
    """One GPU: its UUID and the node it is on."""

    uuid: str
    node: str


class QueueClass(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    DEV = "dev"


class IdleAction(StrEnum):
    """What the scheduler does about a GPU that is allocated but idle."""

    RECLAIM = "reclaim"  # stop the job and free its GPUs
    ALERT = "alert"  # tell someone, leave the job running
    NEVER = "never"  # ignore (latency-bound work idles by design)


class OverBudget(StrEnum):
    """What happens to a job whose team's budget cannot cover its hold."""

    WAIT = "wait"  # it waits with reason budget_exhausted
    RUN_PREEMPTIBLE = "run_preemptible"  # it runs with no hold, preemptible by anyone


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    action: IdleAction
    after_us: int = 0  # allocated-but-idle this long before acting

    def __post_init__(self) -> None:
        if self.after_us < 0:
            raise ConfigError("idle policy: after_us must not be negative")


DEFAULT_IDLE_POLICY: dict[QueueClass, IdlePolicy] = {
    QueueClass.DEV: IdlePolicy(IdleAction.RECLAIM, 60 * US_PER_MINUTE),
    QueueClass.TRAINING: IdlePolicy(IdleAction.ALERT, 60 * US_PER_MINUTE),
    QueueClass.INFERENCE: IdlePolicy(IdleAction.NEVER),
}


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue jobs are submitted to. Its priority applies to jobs that name none.

    Jobs of a non-preemptible queue are never preempted, so they may only run within their
    team's nominal quota: borrowed quota must always be reclaimable.

    Model policy: `allowed_models` (None: every model) and `forbidden_models` say which GPU
    models the queue's jobs may be placed on (e.g. dev never on H100).
    """

    name: str
    queue_class: QueueClass
    priority: int
    preemptible: bool
    idle: IdlePolicy
    max_runtime_us: int | None = None
    over_budget: OverBudget = OverBudget.WAIT
    max_retries: int = 0
    allowed_models: tuple[str, ...] | None = None
    forbidden_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("queue: a name is required")
        if self.allowed_models is not None and not self.allowed_models:
            raise ConfigError(f"queue {self.name}: allowed_models must name a model")
        if self.max_runtime_us is not None and self.max_runtime_us <= 0:
            raise ConfigError(f"queue {self.name}: max_runtime_us must be positive")
        if self.max_retries < 0:
            raise ConfigError(f"queue {self.name}: max_retries must not be negative")
        if self.over_budget is OverBudget.RUN_PREEMPTIBLE and not self.preemptible:
            raise ConfigError(
                f"queue {self.name}: over-budget jobs run preemptible, so the queue must be"
            )

    @property
    def may_borrow(self) -> bool:
        return self.preemptible

    def permits(self, model: str) -> bool:
        """Whether the queue's jobs may be placed on GPUs of `model`."""
        if model in self.forbidden_models:
            return False
        return self.allowed_models is None or model in self.allowed_models


@dataclass(frozen=True, slots=True)
class Quota:
    """A team's quota in one flavor, in GPUs.

    `borrowing_limit`: how many GPUs above nominal the team may borrow from its cohort
    (None: no limit). `lending_limit`: how many GPUs of its unused nominal quota the cohort may
    borrow (None: all of it).
    """

    flavor: Flavor
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("nominal", "borrowing_limit", "lending_limit"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"quota {self.flavor}: {name} must not be negative")

    @property
    def lendable(self) -> int:
        if self.lending_limit is None:
            return self.nominal
        return min(self.lending_limit, self.nominal)


@dataclass(frozen=True, slots=True)
class Team:
    """A team: its quotas (tried in this order for jobs that accept any model), its cohort and
    its fair-share weight (None: its total nominal GPUs, at least 1)."""

    name: str
    quotas: tuple[Quota, ...]
    cohort: str | None = None
    weight: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("team: a name is required")
        flavors = [q.flavor for q in self.quotas]
        if len(set(flavors)) != len(flavors):
            raise ConfigError(f"team {self.name}: more than one quota for a flavor")
        if self.weight is not None and self.weight <= 0:
            raise ConfigError(f"team {self.name}: weight must be positive")

    @property
    def fair_share_weight(self) -> int:
        if self.weight is not None:
            return self.weight
        return max(1, sum(q.nominal for q in self.quotas))


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: the pool it belongs to, its GPU model, and its GPUs; `topology`: where those
    of its GPUs whose topology is known sit, as (UUID, topology) pairs."""

    name: str
    pool: str
    model: str
    gpu_uuids: tuple[str, ...]
    topology: tuple[tuple[str, GpuTopology], ...] = ()

    def __post_init__(self) -> None:
        if len(set(self.gpu_uuids)) != len(self.gpu_uuids):
            raise ConfigError(f"node {self.name}: a GPU UUID appears twice")

    @property
    def flavor(self) -> Flavor:
        return Flavor(self.pool, self.model)


@dataclass(frozen=True, slots=True)
class Balance:
    """A team's budget for the current period as the ledger reports it (the `balances` topic):
    what is left after settled usage, which may be negative, and how far below zero admission
    may take it. A dimension that is None is not budgeted."""

    team: str
    money_micros: int | None = None
    gpu_ms: int | None = None
    overdraft_micros: int = 0
    overdraft_gpu_ms: int = 0

    def __post_init__(self) -> None:
        if self.overdraft_micros < 0 or self.overdraft_gpu_ms < 0:
            raise ConfigError(f"balance {self.team}: an overdraft must not be negative")


@dataclass(frozen=True, slots=True)
class Holds:
    """Expected usage reserved against a budget: one job's hold, or the sum of a team's."""

    money_micros: int = 0
    gpu_ms: int = 0

    def __add__(self, other: Holds) -> Holds:
        return Holds(self.money_micros + other.money_micros, self.gpu_ms + other.gpu_ms)

    def __sub__(self, other: Holds) -> Holds:
        return Holds(self.money_micros - other.money_micros, self.gpu_ms - other.gpu_ms)


NO_HOLD = Holds()


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting in its queue: its spec, which attempt this is, and the last reason it was
    given for waiting (a new `JobWaiting` is emitted only when the reason changes)."""

    spec: JobSpec
    attempt: int = 1
    last_wait: WaitReason | None = None


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs, all in one flavor."""

    spec: JobSpec
    flavor: Flavor
    gpus: tuple[GpuRef, ...]
    priority: int
    preemptible: bool
    admitted_us: int
    attempt: int = 1
    borrowed: int = 0
    hold: Holds = NO_HOLD
    over_budget: bool = False
    started_us: int | None = None

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def team(self) -> str:
        return self.spec.team

    @property
    def since_us(self) -> int:
        """When it started running (or was admitted, until the executor says it started)."""
        return self.admitted_us if self.started_us is None else self.started_us


class Ordering(StrEnum):
    """How a cycle orders the jobs it considers."""

    FIFO = "fifo"  # submit time only
    REQUESTED_SHARE = "requested_share"  # Kueue-like: (allocated + requested) / weight, now
    METERED_FAIR_SHARE = "metered_fair_share"  # Tally: decayed metered usage / weight


@dataclass(frozen=True, slots=True)
class Policy:
    """What a scheduling cycle enforces.

    `heads_per_queue`: how many jobs of each (team, queue) backlog a cycle considers.
    `strict_fifo`: the first job waiting for free GPUs blocks every job ordered after it.
    `max_preemption_plans`: how many jobs per cycle may preempt others.
    `price_aware`: a job that more than one flavor can hold tries them cheapest first (price
    per GPU-hour now, then model and pool name); otherwise in the team's quota order.
    """

    ordering: Ordering = Ordering.METERED_FAIR_SHARE
    enforce_quota: bool = True
    borrowing: bool = True
    preemption: bool = True
    strict_fifo: bool = False
    heads_per_queue: int = 8
    max_preemption_plans: int = 4
    price_aware: bool = True

    def __post_init__(self) -> None:
        if self.heads_per_queue < 1:
            raise ConfigError("policy: heads_per_queue must be at least 1")
        if self.max_preemption_plans < 0:
            raise ConfigError("policy: max_preemption_plans must not be negative")


FIFO_POLICY = Policy(
    ordering=Ordering.FIFO,
    enforce_quota=False,
    borrowing=False,
    preemption=False,
    strict_fifo=True,
)
TALLY_POLICY = Policy()
