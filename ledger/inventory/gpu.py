"""One GPU's inventory record (`InventoryGpu`): what its node's newest report says, its health
folded from health events (`ledger.inventory.health`) and whether an operator cordoned it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledger.events import HealthKind, MigInstance, SampleSource
from ledger.topology import NO_TOPOLOGY, GpuTopology


class GpuHealthState(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


class Severity(StrEnum):
    RECORDED = "recorded"  # counted and listed; the state is unchanged
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault as the inventory record lists it: when, what, its meaning and severity."""

    time_us: int
    kind: HealthKind
    meaning: str
    severity: Severity
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """One GPU of the inventory: what its node's newest report says, and when it was first and
    last reported; its health (state, reason, since, the faults counted and the newest ones
    listed); and its cordon (by whom, why)."""

    uuid: str
    node: str
    index: int
    model: str
    memory_total_bytes: int
    pool: str
    source: SampleSource
    interval_us: int
    first_seen_us: int
    last_seen_us: int
    mig_mode: bool = False
    mig: tuple[MigInstance, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    topology: GpuTopology = NO_TOPOLOGY
    health: GpuHealthState = GpuHealthState.HEALTHY
    health_reason: str | None = None
    health_since_us: int | None = None
    health_event_us: int | None = None  # the newest health event folded
    last_fault_us: int | None = None  # the newest fault that degraded it
    lost: bool = False  # lost and not yet recovered
    faults: int = 0
    recent_faults: tuple[Fault, ...] = ()
    cordoned: bool = False
    cordon_reason: str | None = None
    cordoned_by: str | None = None
