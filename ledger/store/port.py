"""The ledger store port: what ingest, sealing and readers ask of a store, and the values they
exchange with it.

A store keeps one ledger: postings, the exactly-once bookkeeping (applied event ids, consumed
offset ranges per broker incarnation), the projections a batch's fold reads (open holds, idle
states, GPU assignment timelines, the admin log, reversals, closed periods, balances) and an
outbox of messages owed to the broker, and the GPU inventory folded from collectors' reports
(`ledger.inventory`: one record per GPU, replaced as reports change it), and job identity
(`ledger.job_owners`: job key → owner, and the suspense transactions awaiting an owner). Two
implementations keep the same contract (`tests/contract/test_store_contract.py`):
`ledger.store.hot.DuckDBStore` (DuckDB + Parquet segments, the production one) and
`ledger.store.memory.MemoryStore`.

Ingest talks to a store in three steps: `load_view` reads, at once, everything a batch's fold
needs (a `LedgerView`, selected by the batch's `ViewKeys`); the fold is pure; `commit` writes
the batch's effect in one atomic step. Invariants every implementation keeps:
- a commit is all or nothing, and records the offset ranges it consumed with its postings;
- a transaction whose id was applied before (or repeats within the batch) is dropped;
- applied ids are remembered per dedupe scope (`ledger.dedupe`) until a prune forgets those
  older than the scope's cutoff, which the store keeps for good;
- nothing is booked into a closed period, and a close is committed only with nothing unsealed;
- balances are the fold of the postings, per (account, unit, period);
- the audit trail only grows: each commit chains its entries after the last record
  (`ledger.audit`), an event at most once, and nothing is ever pruned from it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ledger.admin import AdminView, AppliedAdmin, BudgetKey
from ledger.assignments import Holding
from ledger.audit import AuditEntry, AuditRecord
from ledger.balances import BalanceRow, ShardStamp
from ledger.closing import ClosedPeriod
from ledger.events import DeadLetter, Owner
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState
from ledger.idle_shares import share_subjects
from ledger.inventory import InventoryGpu
from ledger.posting_columns import PostingColumns
from ledger.postings import Transaction
from ledger.pricing import PriceBook
from ledger.store.segments import SegmentInfo
from ledger.units import Unit

PartitionKey = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    """One message as consumed from the broker: what the ingest folds and the archive keeps."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets `first..last` (inclusive) of one partition consumed by a batch."""

    topic: str
    partition: int
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class SourcedTransaction:
    """A transaction and the message it came from."""

    txn: Transaction
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A message to publish once its batch is committed (alerts, dead letters).

    Written in the batch's transaction and sent after it, until the broker acknowledges it: at
    least once, and consumers dedupe by the content-derived `id`.
    """

    id: str
    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Undeliverable:
    """An outbox message the broker refused for its content (too large, corrupt): it left the
    outbox, so it stops nothing behind it, and is kept here with the broker's reason (a bounded
    excerpt) instead of being lost."""

    message: OutboxMessage
    reason: str


@dataclass(frozen=True, slots=True)
class CommitResult:
    transactions: int
    postings: int
    duplicates: int
    dead_letters: int
    balances_published: int = 0
    closed: tuple[str, ...] = ()

    def __add__(self, other: CommitResult) -> CommitResult:
        return CommitResult(
            self.transactions + other.transactions,
            self.postings + other.postings,
            self.duplicates + other.duplicates,
            self.dead_letters + other.dead_letters,
            self.balances_published + other.balances_published,
            self.closed + other.closed,
        )


NO_COMMIT = CommitResult(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class StateChanges:
    """What a batch changes besides postings, committed with them.

    - `holds`: open holds that changed (an amount of 0 removes the hold);
    - `baselines`: per (job, unit), the job's usage its holds' settlements accounted, as a
      global shard's settlement moved it (`ledger.holds.HoldBook.baselines_changed`), each
      replacing the job's;
    - `baselines_dropped`: (job, unit) of baselines no hold reads any more (the job ended for
      good, `HoldBook.finish`), deleted;
    - `jobs_ended`: jobs that ended for good (`ledger.job_events.ended_for_good`), each with
      its end's time: a shard's `job_usage` rows of them are marked, and dropped by a later
      watermark (`ledger.store.job_usage`);
    - `admin`: admin events applied (a `PeriodClosed` applied closes its period);
    - `reversals`: (reversed transaction, reversing transaction);
    - `seen`: (id, event time, dedupe scope) of events applied without a transaction of their
      own (`ledger.dedupe`);
    - `timelines`: GPUs whose assignment timeline changed, each with its whole new timeline;
    - `inventory`: inventory records that changed, each replacing the GPU's record.
    - `audit`: audit entries to append to the trail, in order (`ledger.audit`); the store
      numbers and chains them, and leaves out any whose event the trail holds already;
    - `job_owners`: job keys made known (`ledger.job_owners`), each with its owner; a key the
      store knows keeps its first owner;
    - `awaiting`: (key, transaction id, its end time) of transactions awaiting an owner: a job
      key's (`ledger.job_owners`), `gpu:<uuid>` for unallocated usage awaiting a scheduler
      assignment that covers it, or `held:<timeline>` for usage an assignment timeline split
      among its holders, awaiting a later change of that timeline (a late `GpuReleased`);
    - `forget_awaiting`: per key, a time: the key's awaiting transactions that end before it
      are forgotten (they stay as booked);
    - `resolved`: transactions no longer awaiting any owner (corrected).
    """

    holds: Sequence[OpenHold] = ()
    baselines: Mapping[HoldKey, int] = field(default_factory=dict)
    baselines_dropped: Sequence[HoldKey] = ()
    jobs_ended: Mapping[str, int] = field(default_factory=dict)
    admin: Sequence[AppliedAdmin] = ()
    reversals: Sequence[tuple[str, str]] = ()
    seen: Sequence[tuple[str, int, str]] = ()
    timelines: Mapping[str, tuple[Holding, ...]] = field(default_factory=dict)
    inventory: Mapping[str, InventoryGpu] = field(default_factory=dict)
    audit: Sequence[AuditEntry] = ()
    job_owners: Mapping[str, Owner] = field(default_factory=dict)
    awaiting: Sequence[tuple[str, str, int]] = ()
    forget_awaiting: Mapping[str, int] = field(default_factory=dict)
    resolved: Sequence[str] = ()


@dataclass(slots=True)
class SealResult:
    sealed: list[SegmentInfo] = field(default_factory=list)
    compacted: list[SegmentInfo] = field(default_factory=list)
    archived: list[SegmentInfo] = field(default_factory=list)
    archive_compacted: list[SegmentInfo] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ViewKeys:
    """What one batch's fold will look at: the store answers for these keys only.

    - `event_ids`: ids whose applied-before status matters (samples, holds, assignments);
    - `admin_ids`: admin event ids (kept for good, unlike the dedupe window of `event_ids`);
    - `gpu_uuids`: GPUs whose assignment timeline the fold reads;
    - `subjects`: idle-detector subjects (GPUs or MIG slices) whose state the fold steps (with
      those of the GPU shares their timelines remember, `ledger.idle_shares.share_subjects`);
    - `budget_keys`: (team, period, unit) whose granted total a grant is checked against;
    - `txn_ids`: transactions a reversal names (the transaction and who reversed it, if anyone);
    - `scopes`: dedupe scopes of the batch's events, whose forgotten-before cutoffs it checks;
    - `audit_ids`: event ids whose place in the audit trail matters (kept for good);
    - `holds`: whether the fold needs the open holds;
    - `hold_jobs`: jobs whose hold baselines the fold reads (those placing holds: a new hold
      starts from its job's baseline; those ending for good: their baselines are dropped);
    - `admin`: whether the fold needs the admin state (`AdminView`);
    - `inventory`: whether the fold needs the GPU inventory;
    - `job_keys`: job keys whose known owner and awaiting transactions the fold reads.
    """

    event_ids: Sequence[str] = ()
    admin_ids: Sequence[str] = ()
    gpu_uuids: frozenset[str] = frozenset()
    subjects: frozenset[str] = frozenset()
    budget_keys: frozenset[BudgetKey] = frozenset()
    txn_ids: frozenset[str] = frozenset()
    scopes: frozenset[str] = frozenset()
    audit_ids: Sequence[str] = ()
    holds: bool = False
    hold_jobs: frozenset[str] = frozenset()
    admin: bool = False
    inventory: bool = False
    job_keys: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The part of the ledger one batch's fold reads, as plain values. `forgotten_before`:
    per dedupe scope asked for, the cutoff before which its applied ids may be forgotten (a
    scope never pruned is absent). `job_owners`: the owner of each job key asked for that is
    known; `awaiting`: per job key asked for, the transactions awaiting its owner, in the order
    they were committed."""

    seen: frozenset[str] = frozenset()
    admin_applied: frozenset[str] = frozenset()
    closed: frozenset[str] = frozenset()
    admin: AdminView = field(default_factory=AdminView)
    timelines: Mapping[str, tuple[Holding, ...]] = field(default_factory=dict)
    idle: Mapping[str, GpuIdleState] = field(default_factory=dict)
    holds: Mapping[HoldKey, OpenHold] = field(default_factory=dict)
    baselines: Mapping[HoldKey, int] = field(default_factory=dict)
    budget_totals: Mapping[BudgetKey, int] = field(default_factory=dict)
    transactions: Mapping[str, Transaction] = field(default_factory=dict)
    reversed_by: Mapping[str, str] = field(default_factory=dict)
    forgotten_before: Mapping[str, int] = field(default_factory=dict)
    inventory: Mapping[str, InventoryGpu] = field(default_factory=dict)
    audited: frozenset[str] = frozenset()
    job_owners: Mapping[str, Owner] = field(default_factory=dict)
    awaiting: Mapping[str, tuple[Transaction, ...]] = field(default_factory=dict)


class ViewLookups(Protocol):
    """The per-key reads a store answers a `LedgerView` from."""

    def seen_ids(self, ids: Sequence[str]) -> set[str]: ...

    def admin_ids(self, ids: Sequence[str]) -> set[str]: ...

    def closed_period_labels(self) -> frozenset[str]: ...

    def admin_view(self) -> AdminView: ...

    def gpu_timelines(self, gpu_uuids: Collection[str]) -> dict[str, tuple[Holding, ...]]: ...

    def idle_states(self, subjects: Sequence[str]) -> dict[str, GpuIdleState]: ...

    def open_holds(self) -> dict[HoldKey, OpenHold]: ...

    def hold_baselines(self, jobs: Collection[str] | None = None) -> dict[HoldKey, int]:
        """The hold baselines of `jobs` (None: every job's) that are not 0."""
        ...

    def budget_total(self, team: str, period: str, unit: Unit) -> int: ...

    def find_transaction(self, txn_id: str) -> Transaction | None: ...

    def reversed_by(self, txn_id: str) -> str | None: ...

    def forgotten_before(self, scopes: Collection[str]) -> dict[str, int]: ...

    def inventory(self) -> dict[str, InventoryGpu]: ...
    def audited_ids(self, ids: Sequence[str]) -> set[str]: ...

    def job_owners(self, keys: Collection[str]) -> dict[str, Owner]: ...

    def awaiting_transactions(
        self, keys: Collection[str]
    ) -> dict[str, tuple[Transaction, ...]]: ...


def assemble_view(store: ViewLookups, keys: ViewKeys) -> LedgerView:
    """The `LedgerView` for `keys`, from a store's per-key reads (both stores answer so)."""
    txn_ids = sorted(keys.txn_ids)
    found = {t: txn for t in txn_ids if (txn := store.find_transaction(t)) is not None}
    awaiting = store.awaiting_transactions(keys.job_keys) if keys.job_keys else {}
    timelines = store.gpu_timelines(keys.gpu_uuids)
    subjects = keys.subjects | share_subjects(timelines, keys.subjects)
    asked = sorted(set(txn_ids).union(*({t.txn_id for t in a} for a in awaiting.values())))
    return LedgerView(
        seen=frozenset(store.seen_ids(keys.event_ids)),
        admin_applied=frozenset(store.admin_ids(keys.admin_ids)),
        closed=store.closed_period_labels(),
        admin=store.admin_view() if keys.admin else AdminView(),
        timelines=timelines,
        idle=store.idle_states(sorted(subjects)),
        holds=store.open_holds() if keys.holds else {},
        baselines=store.hold_baselines(keys.hold_jobs) if keys.hold_jobs else {},
        budget_totals={k: store.budget_total(*k) for k in keys.budget_keys},
        transactions=found,
        reversed_by={t: r for t in asked if (r := store.reversed_by(t)) is not None},
        forgotten_before=store.forgotten_before(keys.scopes) if keys.scopes else {},
        inventory=store.inventory() if keys.inventory else {},
        audited=frozenset(store.audited_ids(keys.audit_ids)) if keys.audit_ids else frozenset(),
        job_owners=store.job_owners(keys.job_keys) if keys.job_keys else {},
        awaiting=awaiting,
    )


class LedgerStore(Protocol):
    """The store port. Every method either does all it says or raises `StoreError`."""

    @property
    def batch_seq(self) -> int:
        """The sequence number of the last archived batch (0: none yet)."""
        ...

    def applied_offsets(self, incarnation: str) -> dict[PartitionKey, int]:
        """The next offset to apply per (topic, partition) for one broker incarnation."""
        ...

    def load_view(self, keys: ViewKeys) -> LedgerView: ...

    def seen_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have been applied already (events and transactions alike)."""
        ...

    def commit(
        self,
        incarnation: str,
        ranges: Sequence[OffsetRange],
        transactions: Sequence[SourcedTransaction],
        dead_letters: Sequence[DeadLetter] = (),
        idle_states: Sequence[GpuIdleState] = (),
        outbox: Sequence[OutboxMessage] = (),
        changes: StateChanges | None = None,
        balances_topic: str | None = None,
        raw: Sequence[ConsumedMessage] = (),
        columns: PostingColumns | None = None,
        balances_shard: ShardStamp | None = None,
        job_usage: bool = False,
    ) -> CommitResult:
        """Apply one batch atomically: `transactions` and the usage transactions in `columns`
        (dropping those whose id was applied before or repeats), with everything else given.
        `balances_shard`: a sharded ledger's shard stamp, which its balance messages carry
        (keyed by account and shard, `ledger.balances`). `job_usage`: move each job's usage so
        far by the batch's consumer usage (what a shard's balance messages list per job; kept
        by a shard's store from its first batch, also while replayed without a stamp, and by
        no whole ledger, whose messages list none)."""
        ...

    def seal(
        self, compact_below_rows: int = 500_000, compact_min_segments: int = 8
    ) -> SealResult: ...

    def prune_seen_events(self, window_us: int) -> int:
        """Per dedupe scope, raise its forgotten-before cutoff to its newest applied time less
        `window_us` and forget its ids older than the cutoff; returns how many were forgotten.
        A scope keeps its cutoff after all its ids are gone."""
        ...

    def prune_seen_before(self, cutoff_us: int) -> int:
        """Forget every applied id older than `cutoff_us`, whatever its scope, and raise every
        scope's cutoff to it (how ledgers before dedupe scopes pruned; a rebuild replays their
        archives so); returns how many were forgotten."""
        ...

    def forgotten_before(self, scopes: Collection[str]) -> dict[str, int]:
        """The forgotten-before cutoff of each of `scopes` that has one: an event not seen
        before whose time is before it may have been applied and forgotten."""
        ...

    def pending_outbox(self, limit: int = 1000) -> list[OutboxMessage]: ...

    def mark_sent(self, ids: Sequence[str]) -> None: ...

    def mark_undeliverable(self, message_id: str, reason: str) -> None:
        """Move a queued outbox message the broker refused for its content out of the outbox
        and keep it, with `reason` (bounded), among the undeliverable; an id not queued is
        ignored."""
        ...

    def undeliverable(self) -> list[Undeliverable]:
        """The messages `mark_undeliverable` kept, oldest first."""
        ...

    def balance_rows(self) -> list[BalanceRow]:
        """The balances projection per (account, unit, period), sorted."""
        ...

    def folded_balances(self) -> list[BalanceRow]:
        """The fold of every committed posting per (account, unit, period), recomputed, sorted."""
        ...

    def job_usage_rows(self) -> dict[tuple[str, str, str], int]:
        """A shard's jobs' usage so far, (consumer account, job, unit) → amount, as its balance
        messages list it (`ledger.store.job_usage` says how long a row is kept)."""
        ...

    def open_holds(self) -> dict[HoldKey, OpenHold]: ...

    def hold_baselines(self, jobs: Collection[str] | None = None) -> dict[HoldKey, int]:
        """The hold baselines of `jobs` (None: every job's) that are not 0."""
        ...

    def closed_period_labels(self) -> frozenset[str]: ...

    def closed_periods(self) -> list[ClosedPeriod]: ...

    def admin_entries(self) -> list[AppliedAdmin]: ...

    def admin_view(self) -> AdminView: ...

    def audit_records(self) -> list[AuditRecord]:
        """The audit trail, oldest first (`ledger.audit`): every record ever appended."""
        ...

    def audited_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` are events the audit trail holds (kept for good)."""
        ...

    def price_book(self, default: PriceBook) -> PriceBook: ...

    def find_transaction(self, txn_id: str) -> Transaction | None: ...

    def inventory(self) -> dict[str, InventoryGpu]:
        """The GPU inventory: every GPU reported, by UUID, as the reports committed left it."""
        ...

    def job_owners(self, keys: Collection[str]) -> dict[str, Owner]:
        """The owner of each of `keys` (job keys, `ledger.job_owners`) the ledger knows."""
        ...

    def awaiting_owner(self, keys: Collection[str]) -> dict[str, tuple[str, ...]]:
        """Per each of `keys` that has any, the ids of the transactions awaiting its owner, in
        the order they were committed."""
        ...

    def awaiting_transactions(self, keys: Collection[str]) -> dict[str, tuple[Transaction, ...]]:
        """`awaiting_owner` with each id as its committed transaction (one never committed, e.g.
        refused after it was remembered, is left out)."""
        ...

    def dead_letters(self) -> list[tuple[object, ...]]: ...

    def hot_rows(self) -> int:
        """Committed postings not sealed yet."""
        ...

    def close(self) -> None: ...


def ranges_from_offsets(offsets: Iterable[tuple[str, int, int]]) -> list[OffsetRange]:
    """Collapse (topic, partition, offset) triples into one range per partition."""
    seen: dict[PartitionKey, list[int]] = {}
    for topic, partition, offset in offsets:
        found = seen.get((topic, partition))
        if found is None:
            seen[(topic, partition)] = [offset]
        else:
            found.append(offset)
    return [OffsetRange(t, p, min(o), max(o)) for (t, p), o in sorted(seen.items())]


def message_ranges(messages: Iterable[ConsumedMessage]) -> list[OffsetRange]:
    """`ranges_from_offsets` of consumed messages (one per sample in real time: no tuple each)."""
    seen: dict[PartitionKey, list[int]] = {}
    for m in messages:
        found = seen.get((m.topic, m.partition))
        if found is None:
            seen[(m.topic, m.partition)] = [m.offset]
        else:
            found.append(m.offset)
    return [OffsetRange(t, p, min(o), max(o)) for (t, p), o in sorted(seen.items())]
