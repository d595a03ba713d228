"""The Platform page's GPU health: each GPU's health and cordon, each node's counts, the fleet's
recent faults with their meaning, and failure counts — from the inventory the last seal wrote
beside the segments (`segments/inventory.json`, `ledger.store.side_files`).

`fleet_health(q, pool)` reads that copy; `health_of(gpus)` is the pure part. Faults are the
newest the inventory keeps per GPU (`ledger.inventory.health.RECENT_FAULTS`), newest first;
`faults` per GPU counts every fault ever folded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ledger.inventory import GpuHealthState, InventoryGpu
from ledger.read.reports import ReportQueries
from ledger.store.side_files import load_inventory


@dataclass(frozen=True, slots=True)
class GpuHealthRow:
    node: str
    index: int
    uuid: str
    pool: str
    model: str
    health: str
    reason: str | None
    since_us: int | None
    faults: int
    cordoned: bool
    cordon: str | None  # "actor: reason"


@dataclass(frozen=True, slots=True)
class NodeHealth:
    node: str
    pool: str
    gpus: int
    healthy: int
    degraded: int
    unhealthy: int
    cordoned: int
    faults: int

    @property
    def state(self) -> str:
        """The node's worst GPU state."""
        if self.unhealthy:
            return GpuHealthState.UNHEALTHY.value
        return GpuHealthState.DEGRADED.value if self.degraded else GpuHealthState.HEALTHY.value


@dataclass(frozen=True, slots=True)
class FaultRow:
    time_us: int
    node: str
    uuid: str
    kind: str
    xid: int | None
    meaning: str
    severity: str


@dataclass(frozen=True, slots=True)
class FleetHealth:
    gpus: tuple[GpuHealthRow, ...]
    nodes: tuple[NodeHealth, ...]
    faults: tuple[FaultRow, ...]

    def count(self, state: str) -> int:
        """GPUs in `state` (`healthy`, `degraded`, `unhealthy`)."""
        return sum(1 for g in self.gpus if g.health == state)

    @property
    def cordoned(self) -> int:
        return sum(1 for g in self.gpus if g.cordoned)

    @property
    def fault_total(self) -> int:
        return sum(g.faults for g in self.gpus)


def health_of(gpus: Iterable[InventoryGpu], pool: str | None = None) -> FleetHealth:
    """The fleet's health from inventory records (of `pool`, if given)."""
    chosen = sorted(
        (g for g in gpus if pool is None or g.pool == pool), key=lambda g: (g.node, g.index)
    )
    rows = tuple(
        GpuHealthRow(
            node=g.node,
            index=g.index,
            uuid=g.uuid,
            pool=g.pool,
            model=g.model,
            health=g.health.value,
            reason=g.health_reason,
            since_us=g.health_since_us,
            faults=g.faults,
            cordoned=g.cordoned,
            cordon=f"{g.cordoned_by}: {g.cordon_reason}" if g.cordoned else None,
        )
        for g in chosen
    )
    nodes: dict[str, list[InventoryGpu]] = {}
    for g in chosen:
        nodes.setdefault(g.node, []).append(g)
    node_rows = tuple(
        NodeHealth(
            node=name,
            pool=members[0].pool,
            gpus=len(members),
            healthy=sum(1 for g in members if g.health is GpuHealthState.HEALTHY),
            degraded=sum(1 for g in members if g.health is GpuHealthState.DEGRADED),
            unhealthy=sum(1 for g in members if g.health is GpuHealthState.UNHEALTHY),
            cordoned=sum(1 for g in members if g.cordoned),
            faults=sum(g.faults for g in members),
        )
        for name, members in sorted(nodes.items())
    )
    faults = sorted(
        (
            FaultRow(f.time_us, g.node, g.uuid, f.kind.value, f.xid, f.meaning, f.severity.value)
            for g in chosen
            for f in g.recent_faults
        ),
        key=lambda f: (-f.time_us, f.node, f.uuid),
    )
    return FleetHealth(rows, node_rows, tuple(faults))


def fleet_health(q: ReportQueries, pool: str | None = None) -> FleetHealth:
    """The fleet's health as of the last seal."""
    return health_of(load_inventory(q.root), pool)
