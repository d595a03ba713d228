"""The ledger store contract's shared builders (no tests here): both stores side by side, and
transactions, batches, admin events, holds, idle states and outbox messages. The `store`
fixture itself (the DuckDB store, `duckdb`, and the in-memory one, `memory`) is in this
folder's `conftest.py`. The contract suite is
`test_store_contract.py` (exactly once, balances, period close, state changes, outbox) and
`test_store_sealing_contract.py` (pruning, sealing, atomicity, ingest, both stores agreeing);
the audit, request, identity and inventory contracts use the same fixture."""

from __future__ import annotations

from ledger.admin import AppliedAdmin, PeriodClosed, TeamDefined, admin_envelope
from ledger.holds import OpenHold
from ledger.idle import GpuIdleState
from ledger.periods import period_label
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.port import (
    OffsetRange,
    OutboxMessage,
    SourcedTransaction,
    ViewKeys,
)
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, an_owner

INC = "cluster-a"
TOPIC = "samples"
NOV, DEC = "2026-11", "2026-12"
DEC_US = T0_US + 30 * 86_400_000_000  # 2026-12-01
CONSUMER = "consumer:vision/detection"
CAPACITY = "capacity:h100/H100"


# ---------------------------------------------------------------------------- builders


def a_txn(
    txn_id: str,
    amount: int = 100,
    *,
    at_us: int = T0_US + INTERVAL_US,
    kind: TransactionKind = TransactionKind.USAGE,
    debit: str = CONSUMER,
    credit: str = CAPACITY,
    unit: Unit = Unit.GPU_MS,
    team: str = "vision",
    period: str | None = None,
) -> Transaction:
    """A balanced two-leg transaction: `amount` onto `debit`, off `credit`."""
    return Transaction(
        txn_id=txn_id,
        kind=kind,
        start_us=at_us - INTERVAL_US,
        end_us=at_us,
        gpu_uuid="GPU-1" if kind is TransactionKind.USAGE else "",
        model="H100" if kind is TransactionKind.USAGE else "",
        pool="h100" if kind is TransactionKind.USAGE else "",
        node="node-01" if kind is TransactionKind.USAGE else "",
        postings=(
            Posting(debit, unit, amount, team, "detection", "ada", "job-1", "research"),
            Posting(credit, unit, -amount),
        ),
        cause=(f"event-{txn_id}",),
        period=period or period_label(at_us - INTERVAL_US),
        util_pct=90 if kind is TransactionKind.USAGE else None,
    )


def a_grant(txn_id: str, amount: int, period: str = NOV) -> Transaction:
    """A budget grant of `amount` micros to vision: `budget:vision` is credited."""
    return a_txn(
        txn_id,
        -amount,
        kind=TransactionKind.BUDGET_GRANT,
        debit="budget:vision",
        credit="funding:research",
        unit=Unit.MONEY,
        period=period,
    )


def sourced(txns: list[Transaction], first_offset: int = 0) -> list[SourcedTransaction]:
    return [SourcedTransaction(t, TOPIC, 0, first_offset + i) for i, t in enumerate(txns)]


def commit(store, *txns: Transaction, offset: int = 0, incarnation: str = INC, **kwargs):
    """Commit `txns` as one batch consumed from offsets `offset..` of partition 0."""
    last = offset + max(len(txns), 1) - 1
    return store.commit(
        incarnation,
        [OffsetRange(TOPIC, 0, offset, last)],
        sourced(list(txns), offset),
        **kwargs,
    )


def closing(period: str = NOV) -> AppliedAdmin:
    return AppliedAdmin(admin_envelope(PeriodClosed(period, "alice", "month end", DEC_US)))


def a_team(name: str = "vision") -> AppliedAdmin:
    event = TeamDefined(name, "research", ("detection",), ("ada",), "alice", "setup", T0_US)
    return AppliedAdmin(admin_envelope(event))


def a_hold(job: str = "job-1", amount: int = 500, unit: Unit = Unit.MONEY) -> OpenHold:
    return OpenHold(job, unit, "vision", "detection", amount, T0_US + 3_600_000_000, "h-1")


def an_idle_state(subject: str = "GPU-1", last: int = T0_US, waste: int = 0) -> GpuIdleState:
    return GpuIdleState(subject, last, an_owner(), below_since_us=T0_US, waste_gpu_ms=waste)


def message(n: int, topic: str = "alerts") -> OutboxMessage:
    return OutboxMessage(f"m-{n}", topic, f"k{n}".encode(), f"v{n}".encode())


def observable(store) -> tuple[object, ...]:
    """Everything a reader can see of a store, for "nothing changed" checks."""
    return (
        store.batch_seq,
        store.applied_offsets(INC),
        store.balance_rows(),
        store.folded_balances(),
        store.hot_rows(),
        store.seen_ids(["a", "b", "c", "seen-1"]),
        store.pending_outbox(),
        store.dead_letters(),
        store.open_holds(),
        store.hold_baselines(),
        store.admin_entries(),
        store.closed_periods(),
        store.audit_records(),
        store.load_view(ViewKeys(gpu_uuids=frozenset({"GPU-1"}), subjects=frozenset({"GPU-1"}))),
    )


def both_stores(tmp_path) -> tuple[DuckDBStore, MemoryStore]:
    return DuckDBStore(tmp_path / "ledger"), MemoryStore()
