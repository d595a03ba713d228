"""The in-memory ledger store: `MemoryStore`, the pure-Python implementation of the store port
(`ledger.store.port.LedgerStore`), for tests and for folding a ledger without a data directory.

It owns one `MemoryState` (`ledger.store.memory_state`: plain dicts and lists of frozen values)
and keeps the same observable contract as `ledger.store.hot.DuckDBStore`
(`tests/contract/test_store_contract.py`):
- a commit builds the next state on a copy and swaps it in only once everything succeeded, so a
  commit that raises leaves the store exactly as it was (all or nothing by construction);
- a transaction whose id was applied before, or repeats within its batch, is dropped;
- nothing is booked into a closed period; a close is committed only with every range sealed,
  and records the checksum `ledger.closing` defines, computed in pure Python
  (`ledger.store.memory_checksum`);
- `balances` always equals the fold of the postings per (account, unit, period);
- a key the DuckDB tables hold once (an event id, a hold, an idle subject, an admin event, a
  reversed transaction, a closed period, an outbox id) inserted twice raises `StoreError`.
Sealing has no files to write: it marks the hot postings of the unsealed ranges sealed, so
`hot_rows` drops while every read stays the same. There is no raw-event archive; `batch_seq`
still counts the batches committed with their messages.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from ledger.accounts import AccountKind, budget_account
from ledger.admin import AdminView, AppliedAdmin, PeriodClosed
from ledger.admin.events import BUDGET_UNITS
from ledger.assignments import Holding
from ledger.audit import AuditRecord, chain, new_entries
from ledger.balances import (
    BalanceRow,
    JobAmount,
    ShardStamp,
    account_team,
    account_update,
    balance_key,
    balance_message_id,
    encode_balance_update,
)
from ledger.balances import current_period as _current_period
from ledger.closing import ClosedPeriod
from ledger.dedupe import transaction_scope
from ledger.errors import StoreError
from ledger.events import DeadLetter
from ledger.excerpts import bounded
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState
from ledger.inventory import InventoryGpu
from ledger.posting_columns import PostingColumns
from ledger.postings import Transaction, TransactionKind
from ledger.pricing import PriceBook
from ledger.store.job_usage import update_memory_job_usage
from ledger.store.memory_checksum import period_checksum
from ledger.store.memory_identity import JobIdentity, MemoryIdentityReads
from ledger.store.memory_state import BalanceKey, Booked, MemoryState, Range
from ledger.store.port import (
    CommitResult,
    ConsumedMessage,
    LedgerView,
    OffsetRange,
    OutboxMessage,
    PartitionKey,
    SealResult,
    SourcedTransaction,
    StateChanges,
    Undeliverable,
    ViewKeys,
    assemble_view,
    ranges_from_offsets,
)
from ledger.units import Unit

_PUBLISHED_KINDS = (AccountKind.CONSUMER, AccountKind.BUDGET, AccountKind.HOLD)


def _stored(txn: Transaction) -> Transaction:
    """`txn` as the DuckDB store gives it back: its cause goes through one space-joined column."""
    return replace(txn, cause=tuple(" ".join(txn.cause).split(" ")))


def _once(keys: Iterable[object], what: str, held: Collection[object] = ()) -> None:
    """Raise unless `keys` are distinct and none is in `held` (a table's primary key)."""
    seen: set[object] = set()
    for key in keys:
        if key in seen or key in held:
            raise StoreError(f"{what} {key!r} is stored already")
        seen.add(key)


def _move_job_usage(usage: dict[tuple[str, str, str], int], txn: Transaction) -> None:
    """Move each job's usage so far by `txn` (as the DuckDB store's `job_usage`: consumer
    postings of usage and reversals in budget units)."""
    if txn.kind not in (TransactionKind.USAGE, TransactionKind.REVERSAL):
        return
    for p in txn.postings:
        if p.job_id is not None and p.unit in BUDGET_UNITS and p.account.startswith("consumer:"):
            key = (p.account, p.job_id, p.unit.value)
            usage[key] = usage.get(key, 0) + p.amount


def _rows(balances: dict[BalanceKey, int], accounts: Collection[str] | None) -> list[BalanceRow]:
    """Balance rows sorted as DuckDB's `ORDER BY ALL` sorts them (by account, unit, period)."""
    return [
        BalanceRow(a, u, p, b)
        for (a, u, p), b in sorted(balances.items())
        if accounts is None or a in accounts
    ]


class MemoryStore(MemoryIdentityReads):
    """A ledger kept in memory: the pure-Python implementation of the store port."""

    def __init__(self) -> None:
        self._s = MemoryState()

    # ------------------------------------------------------------------ exactly-once bookkeeping

    @property
    def batch_seq(self) -> int:
        """The sequence number of the last batch committed with its messages (0: none yet)."""
        return self._s.batch_seq

    def applied_offsets(self, incarnation: str) -> dict[PartitionKey, int]:
        nxt: dict[PartitionKey, int] = {}
        for r in self._s.ranges:
            if r.incarnation == incarnation:
                key = (r.topic, r.partition)
                nxt[key] = max(nxt.get(key, 0), r.last + 1)
        return nxt

    def seen_ids(self, ids: Sequence[str]) -> set[str]:
        return {i for i in ids if i in self._s.seen}

    def forgotten_before(self, scopes: Collection[str]) -> dict[str, int]:
        known = self._s.scopes
        return {s: c for s in scopes if s in known and (c := known[s][1]) is not None}

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
        """Apply one batch atomically (see `DuckDBStore.commit`): it is applied to a copy of
        the state, which replaces the state only when nothing raised."""
        changes = changes or StateChanges()
        if columns is not None:
            transactions = [
                *transactions,
                *(SourcedTransaction(txn, *source) for txn, source in columns.transactions()),
            ]
        if raw and ranges_from_offsets((m.topic, m.partition, m.offset) for m in raw) != list(
            ranges
        ):
            raise StoreError("the archived messages of a batch must span its offset ranges")
        closing = [
            e
            for e in changes.admin
            if isinstance(e.envelope.data, PeriodClosed) and e.outcome == "applied"
        ]
        s = self._s.copy()
        fresh: list[SourcedTransaction] = []
        taken: set[str] = set()
        for item in transactions:  # applied before, or a repeat within the batch: dropped
            if item.txn.txn_id not in s.seen and item.txn.txn_id not in taken:
                taken.add(item.txn.txn_id)
                fresh.append(item)
        self._refuse_closed(s, fresh, bool(closing))
        accounts: set[str] = set()
        jobs: set[str] = set()
        postings = 0
        for item in fresh:
            txn = _stored(item.txn)
            s.booked.append(Booked(replace(item, txn=txn), incarnation))
            s.transactions.setdefault(txn.txn_id, txn)
            for p in txn.postings:
                key = (p.account, p.unit.value, txn.period)
                s.balances[key] = s.balances.get(key, 0) + p.amount
                accounts.add(p.account)
                postings += 1
                if p.job_id is not None:
                    jobs.add(p.job_id)
            if job_usage:
                _move_job_usage(s.job_usage, txn)
        self._insert_seen(s, fresh, changes.seen)
        s.ranges.extend(Range(incarnation, r.topic, r.partition, r.first, r.last) for r in ranges)
        if raw:
            s.batch_seq += 1
        _once((i.subject for i in idle_states), "idle state")
        s.idle.update((i.subject, i) for i in idle_states)
        self._apply_changes(s, changes)
        if job_usage:
            update_memory_job_usage(s.job_usage, s.jobs_ended, s.timelines, changes)
        closed = tuple(self._close(s, entry) for entry in closing)
        queued = [m for m in outbox if m.id not in s.outbox]
        _once((m.id for m in queued), "outbox message")
        s.outbox.update((m.id, m) for m in queued)
        published = 0
        if balances_topic is not None and (postings or closed):
            accounts |= {a for (a, _, p) in s.balances if p in closed}
            published = self._queue_balances(s, accounts, balances_topic, balances_shard, jobs)
        s.dead.extend((d.topic, d.partition, d.offset, d.event_id, d.reason) for d in dead_letters)
        self._s = s  # the commit point
        return CommitResult(
            transactions=len(fresh),
            postings=postings,
            duplicates=len(transactions) - len(fresh),
            dead_letters=len(dead_letters),
            balances_published=published,
            closed=closed,
        )

    @staticmethod
    def _refuse_closed(s: MemoryState, fresh: Sequence[SourcedTransaction], closing: bool) -> None:
        """The commit guards: nothing posts into a closed period; a close finds all sealed."""
        late = sorted({t.txn.period for t in fresh} & s.closed.keys())
        if late:
            raise StoreError(f"period {', '.join(late)} is closed: nothing may be booked into it")
        if closing and any(not r.sealed for r in s.ranges):
            raise StoreError("seal the store before committing a period close")

    @staticmethod
    def _insert_seen(
        s: MemoryState, fresh: Sequence[SourcedTransaction], extra: Sequence[tuple[str, int, str]]
    ) -> None:
        """Record the applied ids with their dedupe time and scope, and move each scope's
        newest applied time (as `DuckDBStore._insert_seen`)."""
        rows = [(t.txn.txn_id, t.txn.end_us, transaction_scope(t.txn)) for t in fresh]
        rows += list(extra)
        _once((i for i, _, _ in rows), "event id", s.seen)
        for event, time_us, scope in rows:
            s.seen[event] = (time_us, scope)
            newest, cutoff = s.scopes.get(scope, (time_us, None))
            s.scopes[scope] = (max(newest, time_us), cutoff)

    @staticmethod
    def _apply_changes(s: MemoryState, changes: StateChanges) -> None:
        s.inventory.update(changes.inventory)
        for uuid, timeline in changes.timelines.items():
            if timeline:  # a timeline replaces the GPU's whole one; an empty one removes it
                s.timelines[uuid] = tuple(sorted(timeline, key=lambda h: h.from_us))
            else:
                s.timelines.pop(uuid, None)
        _once((h.key for h in changes.holds if h.amount), "open hold")
        for hold in changes.holds:
            s.holds.pop(hold.key, None)
        s.holds.update((h.key, h) for h in changes.holds if h.amount)  # 0: the hold is gone
        s.baselines.update(changes.baselines)
        for key in changes.baselines_dropped:
            s.baselines.pop(key, None)
        _once((e.envelope.id for e in changes.admin), "admin event", s.admin_ids)
        s.admin.extend(changes.admin)
        s.admin_ids.update(e.envelope.id for e in changes.admin)
        _once((t for t, _ in changes.reversals), "reversal of", s.reversals)
        s.reversals.update(changes.reversals)
        fresh = list(new_entries(changes.audit, s.audit_ids))
        s.audit.extend(chain(s.audit[-1] if s.audit else None, fresh))
        s.audit_ids.update(e.event_id for e in fresh)
        s.identity.apply(changes)

    @staticmethod
    def _close(s: MemoryState, entry: AppliedAdmin) -> str:
        """Record a close with the checksum of everything booked into the period so far."""
        event = entry.envelope.data
        assert isinstance(event, PeriodClosed)
        _once([event.period], "closed period", s.closed)
        rows, digest = period_checksum((b.item.txn for b in s.booked), event.period)
        s.closed[event.period] = ClosedPeriod(
            event.period,
            entry.envelope.id,
            event.effective_us,
            event.actor,
            event.reason,
            rows,
            digest,
        )
        return event.period

    @staticmethod
    def _queue_balances(
        s: MemoryState,
        accounts: set[str],
        topic: str,
        stamp: ShardStamp | None = None,
        jobs: Collection[str] = (),
    ) -> int:
        """Queue one message per changed account (and per affected team's budget account); a
        queued message not yet sent for the same account is superseded. The same selection as
        `DuckDBStore._queue_balances`."""
        current = _current_period(_rows(s.balances, None))
        moved = current is not None and s.published_period != current
        budgeted = {
            a.partition(":")[2]
            for (a, _, _) in s.balances
            if a.startswith(f"{AccountKind.BUDGET}:")
        }
        touched = {account_team(a) for a in accounts if a.split(":", 1)[0] in _PUBLISHED_KINDS}
        teams = budgeted if moved else budgeted & {t for t in touched if t}
        publish = sorted(accounts | {budget_account(t) for t in teams})
        if not publish:  # e.g. a period closed on a ledger with no postings yet
            return 0
        rows = _rows(s.balances, set(publish))
        budget_rows = [
            r
            for r in _rows(s.balances, None)
            if r.account.startswith((f"{AccountKind.BUDGET}:", f"{AccountKind.HOLD}:"))
            or (r.account.startswith(f"{AccountKind.CONSUMER}:") and r.period == current)
        ]
        lines: dict[str, list[JobAmount]] = {}
        holds: dict[str, list[JobAmount]] = {}
        if stamp is not None:
            running = {
                h.owner.job_id
                for timeline in s.timelines.values()
                for h in timeline
                if h.to_us is None and h.owner.job_id is not None
            }
            for (account, job, unit), amount in sorted(s.job_usage.items()):
                if account in publish and (job in jobs or job in running):
                    lines.setdefault(account, []).append(JobAmount(job, unit, amount))
            for (job, unit), hold in sorted(s.holds.items()):
                if hold.team in teams:
                    holds.setdefault(hold.team, []).append(
                        JobAmount(job, unit.value, hold.amount, hold.baseline, hold.earlier)
                    )
        s.publish_seq += 1
        seq = s.publish_seq
        now = time.time_ns() // 1_000
        keys = {balance_key(a, stamp) for a in publish}
        for old in [m.id for m in s.outbox.values() if m.topic == topic and m.key in keys]:
            del s.outbox[old]
        closed = s.closed.keys()
        for account in publish:
            update = account_update(
                account, rows, closed, current, seq, now, budget_rows, stamp, holds, lines
            )
            message_id = balance_message_id(account, seq, stamp)
            _once([message_id], "outbox message", s.outbox)
            s.outbox[message_id] = OutboxMessage(
                message_id, topic, balance_key(account, stamp), encode_balance_update(update)
            )
        if moved:
            s.published_period = current
        return len(publish)

    # ------------------------------------------------------------------ reads

    def load_view(self, keys: ViewKeys) -> LedgerView:
        """What one batch's fold reads, for `keys` only."""
        return assemble_view(self, keys)

    def idle_states(self, subjects: Sequence[str]) -> dict[str, GpuIdleState]:
        return {s: self._s.idle[s] for s in subjects if s in self._s.idle}

    def gpu_timelines(self, gpu_uuids: Collection[str]) -> dict[str, tuple[Holding, ...]]:
        """The assignment timelines of `gpu_uuids` (a GPU never assigned has none)."""
        return {u: self._s.timelines[u] for u in sorted(gpu_uuids) if u in self._s.timelines}

    def admin_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` are applied admin events (kept for good, unlike the seen ids)."""
        return {i for i in ids if i in self._s.admin_ids}

    def budget_total(self, team: str, period: str, unit: Unit) -> int:
        """What `team` was granted of `unit` for `period`, net of negative grants."""
        return -self._s.balances.get((budget_account(team), unit.value, period), 0)

    def reversed_by(self, txn_id: str) -> str | None:
        return self._s.reversals.get(txn_id)

    def inventory(self) -> dict[str, InventoryGpu]:
        return dict(self._s.inventory)

    def find_transaction(self, txn_id: str) -> Transaction | None:
        return self._s.transactions.get(txn_id)

    def _identity(self) -> tuple[JobIdentity, Mapping[str, Transaction]]:
        return self._s.identity, self._s.transactions

    def pending_outbox(self, limit: int = 1000) -> list[OutboxMessage]:
        return list(self._s.outbox.values())[:limit]

    def mark_sent(self, ids: Sequence[str]) -> None:
        """Forget messages the broker acknowledged (the outbox holds only what is owed)."""
        for i in ids:
            self._s.outbox.pop(i, None)

    def mark_undeliverable(self, message_id: str, reason: str) -> None:
        """Move a refused outbox message among the undeliverable, with the broker's reason."""
        message = self._s.outbox.pop(message_id, None)
        if message is not None:
            self._s.undeliverable.append(Undeliverable(message, bounded(reason)))

    def undeliverable(self) -> list[Undeliverable]:
        return list(self._s.undeliverable)

    def balance_rows(self) -> list[BalanceRow]:
        return _rows(self._s.balances, None)

    def folded_balances(self) -> list[BalanceRow]:
        """The fold of every committed posting, recomputed from the postings themselves."""
        folded: dict[BalanceKey, int] = {}
        for booked in self._s.booked:
            txn = booked.item.txn
            for p in txn.postings:
                key = (p.account, p.unit.value, txn.period)
                folded[key] = folded.get(key, 0) + p.amount
        return _rows(folded, None)

    def current_period(self) -> str | None:
        return _current_period(self.balance_rows())

    def open_holds(self) -> dict[HoldKey, OpenHold]:
        return dict(self._s.holds)

    def hold_baselines(self, jobs: Collection[str] | None = None) -> dict[HoldKey, int]:
        return {k: v for k, v in self._s.baselines.items() if jobs is None or k[0] in jobs}

    def job_usage_rows(self) -> dict[tuple[str, str, str], int]:
        return dict(self._s.job_usage)

    def closed_period_labels(self) -> frozenset[str]:
        return frozenset(self._s.closed)

    def closed_periods(self) -> list[ClosedPeriod]:
        return [self._s.closed[p] for p in sorted(self._s.closed)]

    def admin_entries(self) -> list[AppliedAdmin]:
        return list(self._s.admin)

    def admin_view(self) -> AdminView:
        return AdminView.from_log(self._s.admin)

    def audit_records(self) -> list[AuditRecord]:
        return list(self._s.audit)

    def audited_ids(self, ids: Sequence[str]) -> set[str]:
        return {i for i in ids if i in self._s.audit_ids}

    def price_book(self, default: PriceBook) -> PriceBook:
        return self.admin_view().price_book(default)

    def dead_letters(self) -> list[tuple[object, ...]]:
        """(topic, partition, offset, event id, reason) of each dead letter, oldest first."""
        return list(self._s.dead)

    def hot_rows(self) -> int:
        return sum(len(b.item.txn.postings) for b in self._s.booked if not b.sealed)

    # ------------------------------------------------------------------ sealing and pruning

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        """Seal every unsealed range: as `DuckDBStore.seal`, per (incarnation, topic,
        partition) the span of its unsealed ranges takes the hot postings whose offsets lie in
        it. Nothing is written anywhere, so the result lists no segments."""
        s = self._s
        spans: dict[tuple[str, str, int], tuple[int, int]] = {}
        for r in s.ranges:
            if not r.sealed:
                key = (r.incarnation, r.topic, r.partition)
                lo, hi = spans.get(key, (r.first, r.last))
                spans[key] = (min(lo, r.first), max(hi, r.last))

        def inside(incarnation: str, topic: str, partition: int, first: int, last: int) -> bool:
            span = spans.get((incarnation, topic, partition))
            return span is not None and span[0] <= first and last <= span[1]

        s.booked = [
            replace(b, sealed=True)
            if not b.sealed
            and inside(b.incarnation, b.item.topic, b.item.partition, b.item.offset, b.item.offset)
            else b
            for b in s.booked
        ]
        s.ranges = [
            replace(r, sealed=True)
            if inside(r.incarnation, r.topic, r.partition, r.first, r.last)
            else r
            for r in s.ranges
        ]
        return SealResult()

    def prune_seen_events(self, window_us: int) -> int:
        """Per dedupe scope, raise its cutoff to its newest applied time less `window_us` and
        forget its ids older than the cutoff; returns how many were forgotten."""
        scopes = self._s.scopes
        for scope, (newest, cutoff) in scopes.items():
            if cutoff is None or cutoff < newest - window_us:
                scopes[scope] = (newest, newest - window_us)
        return self._forget()

    def prune_seen_before(self, cutoff_us: int) -> int:
        """Forget every applied id older than `cutoff_us` and raise every scope's cutoff to it."""
        scopes = self._s.scopes
        for scope, (newest, cutoff) in scopes.items():
            if cutoff is None or cutoff < cutoff_us:
                scopes[scope] = (newest, cutoff_us)
        return self._forget(cutoff_us)

    def _forget(self, before_us: int | None = None) -> int:
        """Forget the ids older than their scope's cutoff (or than `before_us`)."""
        scopes = self._s.scopes
        old = [
            i
            for i, (t, scope) in self._s.seen.items()
            if (before_us is not None and t < before_us)
            or ((c := scopes[scope][1]) is not None and t < c)
        ]
        for i in old:
            del self._s.seen[i]
        return len(old)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
