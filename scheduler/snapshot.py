"""The immutable picture of the cluster that every decision of a cycle reads.

`ClusterSnapshot` holds config (queues, quotas, the fleet), and state at one instant: free GPUs
indexed by flavor and node, GPUs held per (team, flavor), running jobs, the heads of the
backlogs, balances and open holds, and decayed fair-share usage. Decisions never change it;
they return events, which the state (`scheduler.state`) applies before the next snapshot.

Phase 1 of a cycle, `heads`, lives here: it picks the jobs a cycle considers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ledger.pricing import PriceBook
from scheduler.errors import ConfigError
from scheduler.model import Balance, Flavor, Holds, Node, PendingJob, Queue, RunningJob
from scheduler.quota import QuotaBook
from scheduler.running_index import Ranked
from scheduler.topology import GpuPlace


@dataclass(frozen=True, slots=True)
class Fleet:
    """The GPUs that exist: nodes, and per flavor the GPU count and the largest node; `where`:
    the GPUs whose topology is known, by UUID (`scheduler.topology`)."""

    nodes: Mapping[str, Node]
    capacity: Mapping[Flavor, int]
    largest_node: Mapping[Flavor, int]
    flavors: tuple[Flavor, ...]  # in order of first appearance
    where: Mapping[str, GpuPlace] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Fleet:
        by_name: dict[str, Node] = {}
        capacity: dict[Flavor, int] = {}
        largest: dict[Flavor, int] = {}
        seen: set[str] = set()
        where: dict[str, GpuPlace] = {}
        for node in nodes:
            if node.name in by_name:
                raise ConfigError(f"node {node.name} is configured twice")
            if seen.intersection(node.gpu_uuids):
                raise ConfigError(f"node {node.name}: a GPU UUID is on another node too")
            seen.update(node.gpu_uuids)
            by_name[node.name] = node
            flavor = node.flavor
            capacity[flavor] = capacity.get(flavor, 0) + len(node.gpu_uuids)
            largest[flavor] = max(largest.get(flavor, 0), len(node.gpu_uuids))
            where.update((uuid, GpuPlace(node.name, t)) for uuid, t in node.topology)
        return cls(by_name, capacity, largest, tuple(capacity), where)

    def matching(self, model: str | None, pool: str | None) -> tuple[Flavor, ...]:
        return tuple(
            f
            for f in self.flavors
            if (model is None or f.model == model) and (pool is None or f.pool == pool)
        )


@dataclass(frozen=True, slots=True)
class FreeGpus:
    """The free GPUs of one flavor: per node with at least one free GPU, their UUIDs."""

    by_node: Mapping[str, tuple[str, ...]]
    total: int


NO_FREE = FreeGpus({}, 0)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything a scheduling cycle may read, at `now_us`. Read-only by contract and by type."""

    now_us: int
    queues: Mapping[str, Queue]
    quotas: QuotaBook
    fleet: Fleet
    free: Mapping[Flavor, FreeGpus]
    usage: Mapping[tuple[str, Flavor], int]  # quota units held per (team, flavor)
    running: Mapping[tuple[str, Flavor], tuple[RunningJob, ...]]  # per (team, flavor)
    heads: tuple[PendingJob, ...]
    balances: Mapping[str, Balance] = field(default_factory=dict)
    holds: Mapping[str, Holds] = field(default_factory=dict)  # open holds per team
    fair_share: Mapping[str, int] = field(default_factory=dict)  # decayed GPU-ms per team
    prices: PriceBook | None = None
    pending: int = 0  # jobs in all backlogs, heads included
    # per flavor: the lowest priority of a preemptible running job, and how many running jobs
    # are over-budget borrowers (None: not known; preemption then looks at every job)
    lowest_preemptible: Mapping[Flavor, int] | None = None
    over_budget_running: Mapping[Flavor, int] | None = None
    # per (team, flavor): the preemptible running jobs with their `victim_key`, in that order
    # (None: not indexed; preemption then sorts `running` itself)
    victims: Mapping[tuple[str, Flavor], tuple[Ranked, ...]] | None = None

    def free_in(self, flavor: Flavor) -> FreeGpus:
        return self.free.get(flavor, NO_FREE)

    def used(self, team: str, flavor: Flavor) -> int:
        return self.usage.get((team, flavor), 0)

    def running_jobs(self) -> Iterator[RunningJob]:
        for jobs in self.running.values():
            yield from jobs

    def holder_of(self, gpu_uuid: str) -> RunningJob | None:
        """The running job that holds a GPU (a scan: for rare questions, not for cycles)."""
        for job in self.running_jobs():
            if any(g.uuid == gpu_uuid for g in job.gpus):
                return job
        return None


def heads(backlogs: Iterable[Sequence[PendingJob]], per_queue: int) -> tuple[PendingJob, ...]:
    """Phase 1: the first `per_queue` jobs of every backlog (each already in queue order)."""
    picked: list[PendingJob] = []
    for backlog in backlogs:
        picked.extend(backlog[:per_queue])
    return tuple(picked)
