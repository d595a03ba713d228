"""The in-memory store's state (`MemoryState`): plain dicts and lists of frozen values, the
committed transactions (`Booked`) and consumed offset ranges (`Range`) as the DuckDB tables keep
them, and the one-level `copy` a `MemoryStore` commit builds on."""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.admin import AppliedAdmin
from ledger.assignments import Holding
from ledger.audit import AuditRecord
from ledger.closing import ClosedPeriod
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState
from ledger.inventory import InventoryGpu
from ledger.postings import Transaction
from ledger.store.memory_identity import JobIdentity
from ledger.store.port import OutboxMessage, SourcedTransaction, Undeliverable

BalanceKey = tuple[str, str, str]  # (account, unit, period)


@dataclass(frozen=True, slots=True)
class Booked:
    """One committed transaction, where it came from, and whether sealing has taken it."""

    item: SourcedTransaction
    incarnation: str
    sealed: bool = False


@dataclass(frozen=True, slots=True)
class Range:
    """One consumed offset range, as `source_ranges` keeps it."""

    incarnation: str
    topic: str
    partition: int
    first: int
    last: int
    sealed: bool = False


@dataclass(slots=True)
class MemoryState:
    """Everything the store holds. Containers hold frozen values only, so `copy` (one level
    deep) is a snapshot that later changes to either side do not reach."""

    booked: list[Booked] = field(default_factory=list)
    transactions: dict[str, Transaction] = field(default_factory=dict)  # the first of each id
    seen: dict[str, tuple[int, str]] = field(default_factory=dict)  # id → (time, scope)
    ranges: list[Range] = field(default_factory=list)
    idle: dict[str, GpuIdleState] = field(default_factory=dict)
    outbox: dict[str, OutboxMessage] = field(default_factory=dict)  # unsent, in queue order
    dead: list[tuple[object, ...]] = field(default_factory=list)
    balances: dict[BalanceKey, int] = field(default_factory=dict)
    holds: dict[HoldKey, OpenHold] = field(default_factory=dict)
    baselines: dict[HoldKey, int] = field(default_factory=dict)  # as `hold_baselines`
    timelines: dict[str, tuple[Holding, ...]] = field(default_factory=dict)
    admin: list[AppliedAdmin] = field(default_factory=list)
    admin_ids: set[str] = field(default_factory=set)
    closed: dict[str, ClosedPeriod] = field(default_factory=dict)
    reversals: dict[str, str] = field(default_factory=dict)
    published_period: str | None = None  # the current period the last balances message named
    publish_seq: int = 0
    batch_seq: int = 0
    undeliverable: list[Undeliverable] = field(default_factory=list)
    # dedupe scope → (newest applied time, forgotten-before cutoff), as `dedupe_scopes`
    scopes: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    inventory: dict[str, InventoryGpu] = field(default_factory=dict)
    audit: list[AuditRecord] = field(default_factory=list)  # the trail, chained
    audit_ids: set[str] = field(default_factory=set)
    identity: JobIdentity = field(default_factory=JobIdentity)  # job owners, awaiting ones
    # (consumer account, job, unit) → the job's usage so far, as `job_usage`
    job_usage: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # job → when it ended for good, until its `job_usage` goes, as `ended_jobs`
    jobs_ended: dict[str, int] = field(default_factory=dict)

    def copy(self) -> MemoryState:
        return MemoryState(
            list(self.booked),
            dict(self.transactions),
            dict(self.seen),
            list(self.ranges),
            dict(self.idle),
            dict(self.outbox),
            list(self.dead),
            dict(self.balances),
            dict(self.holds),
            dict(self.baselines),
            dict(self.timelines),
            list(self.admin),
            set(self.admin_ids),
            dict(self.closed),
            dict(self.reversals),
            self.published_period,
            self.publish_seq,
            self.batch_seq,
            list(self.undeliverable),
            dict(self.scopes),
            dict(self.inventory),
            list(self.audit),
            set(self.audit_ids),
            self.identity.copy(),
            dict(self.job_usage),
            dict(self.jobs_ended),
        )
