"""The ledger store: the single writer's hot DuckDB, its exactly-once bookkeeping, and sealing.

The writer owns `<data_dir>/hot.duckdb`; nothing else opens it. One `commit` is one DuckDB
transaction holding, together:
- the postings of the batch's new transactions,
- the ids of the events applied (`seen_events`, the dedupe set),
- the source offset ranges consumed (`source_ranges`, per broker incarnation and partition,
  with the batch's sequence number),
- the batch's dead letters,
- the batch's consumed messages themselves, in the raw-event archive (`raw_events`: source
  coordinates, key and value bytes, the batch's sequence number and each message's position in
  it), so the ledger can be rebuilt from them at any time (`ledger.store.rebuild`),
- the projections that follow from the batch: the running `balances` per (account, unit,
  period), the open holds per job and the jobs' hold baselines (`hold_baselines`, until the
  job ends for good: `ledger.holds.HoldBook.finish`), a shard's jobs' usage so far
  (`job_usage`, `ended_jobs`: `ledger.store.job_usage`), each GPU's
  assignment timeline (`gpu_holdings`, who the scheduler says holds it: `ledger.assignments`),
  the applied admin events (`admin_log`), reversed transactions, closed periods with their
  checksums, the audit trail (`ledger.store.hot_audit`), job owners and suspense awaiting them
  (`ledger.store.hot_identity`) and the outbox messages to publish (alerts, dead letters,
  changed balances).
So after a crash either all of a batch is in the store or none of it is, and `applied_offsets`
tells a restarted consumer exactly where the store stands.

A closed period never takes another posting: `commit` refuses a transaction booked into one
(the ingest books late data into the next open period first). Closing a period records the
checksum of its postings (`ledger.closing`), so a close must be committed with nothing left
unsealed; `seal` then writes the period's record beside the segments for `verify`.

`seal` moves committed postings out to immutable Parquet segments, and the archived messages
of the same offset ranges out to archive segments (`ledger.store.segments`, written by
`ledger.store.sealing`), then drops both from the hot tables; `compact` merges runs of small
postings segments, and the archive segments
within each merged range are merged alike, so archive and postings segments cover the same
ranges. Both are safe to interrupt at any point and to run again.

Replaying the archive in batch order reproduces the ledger exactly: a batch is applied as one
unit, in its original message order, and everything a batch's fold reads is itself a fold of
the earlier batches, except the dedupe window, which the worker prunes between batches. Applied
ids are kept per dedupe scope (`ledger.dedupe`: `seen_events.scope`), and `dedupe_scopes` keeps
each scope's newest applied time (moved by every commit) and forgotten-before cutoff (raised by
every prune, kept after all the scope's ids are gone). A prune that changed anything is
therefore recorded with the next archived batch (`prune_window_us`, the window it pruned with;
`pruned_before_us` for a prune by one cutoff), and a rebuild runs the same prune on the same
state before applying that batch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ledger.admin import AppliedAdmin, PeriodClosed
from ledger.assignments import Holding
from ledger.balances import ShardStamp
from ledger.closing import ClosedPeriod
from ledger.errors import StoreError
from ledger.events import DeadLetter
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState, state_to_row
from ledger.posting_columns import PostingColumns
from ledger.store.balance_outbox import BalanceFigures, queue_balance_messages
from ledger.store.hot_audit import AUDIT_DDL
from ledger.store.hot_dedupe import DedupeSet
from ledger.store.hot_identity import IDENTITY_DDL, HotIdentity, write_identity
from ledger.store.hot_memory import DEFAULT_MEMORY_LIMIT, MemoryLimit
from ledger.store.hot_outbox import HotOutbox, now_us
from ledger.store.hot_reads import BALANCES_VERSION
from ledger.store.hot_tables import (
    HOT_TABLES_DDL,
    insert_postings,
    insert_rows,
    keep_posting_rows,
    read_gpu_timelines,
    read_hold_baselines,
    read_idle_states,
    read_open_holds,
    write_changes,
)
from ledger.store.hot_upkeep import PRUNE_WINDOW_KEY, PRUNED_BEFORE_KEY, HotUpkeep
from ledger.store.job_usage import update_job_usage
from ledger.store.layout import (
    ARCHIVE_DIR,
    HOT_DB_NAME,
    SEGMENTS_DIR,
    WRITER_SETTINGS,
    first_row,
)
from ledger.store.mirror import WriterMirror
from ledger.store.port import (
    CommitResult,
    ConsumedMessage,
    LedgerView,
    OffsetRange,
    OutboxMessage,
    PartitionKey,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
    assemble_view,
    message_ranges,
)
from ledger.store.schema import archive_to_arrow, transactions_to_arrow, usage_to_arrow
from ledger.store.sealing import Segmenter
from ledger.store.side_files import period_checksum


def _postings_table(fresh: Sequence[SourcedTransaction], incarnation: str) -> pa.Table:
    return transactions_to_arrow(fresh, incarnation)


class DuckDBStore(HotUpkeep, HotOutbox, HotIdentity):
    """The single writer of one ledger data directory: the DuckDB implementation of the store
    port (`ledger.store.port.LedgerStore`)."""

    def __init__(
        self, data_dir: Path | str, memory_limit: int | None = DEFAULT_MEMORY_LIMIT
    ) -> None:
        """`memory_limit`: bytes of working memory for DuckDB (`ledger.store.hot_memory`; None:
        DuckDB's default)."""
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.segments_root = self.data_dir / SEGMENTS_DIR
        self.segments_root.mkdir(exist_ok=True)
        self.archive_root = self.data_dir / ARCHIVE_DIR
        self.archive_root.mkdir(exist_ok=True)
        db = self.data_dir / HOT_DB_NAME
        try:
            self._con = duckdb.connect(str(db))
        except duckdb.IOException as exc:
            raise StoreError(f"cannot open the ledger store {db}: {exc}") from exc
        keep_posting_rows(self._con)
        self._con.execute(WRITER_SETTINGS + HOT_TABLES_DDL + AUDIT_DDL + IDENTITY_DDL)
        self._segments = Segmenter(self._con, self.segments_root, self.archive_root)
        self.manifest = self._segments.postings.manifest
        self.archive_manifest = self._segments.archive.manifest
        self._admin_log_exported = False
        self._admin_cache: tuple[AppliedAdmin, ...] | None = None  # the admin log, as read
        self._dedupe = DedupeSet(self._con)
        self._memory = MemoryLimit(self._con, memory_limit)
        ids = first_row(self._con.execute("SELECT count(*) FROM seen_events"))
        self._memory.follow(int(ids[0]) if ids else 0)
        self._mirror: WriterMirror | None = None  # idle states, timelines, open holds
        self._awaiting_seq: int | None = None  # `awaiting_owner`'s greatest seq, once known
        self._closed_cache: frozenset[str] | None = None
        # what balance messages need of the whole balances table (`ledger.store.balance_outbox`)
        self._balance_figures: BalanceFigures | None = None
        version = first_row(
            self._con.execute("SELECT value FROM ledger_meta WHERE key = 'balances_version'")
        )
        if version is None or version[0] != BALANCES_VERSION:
            self.rebuild_balances()  # a store from before the balances table: fold once
        row = first_row(self._con.execute("SELECT max(batch_seq) FROM source_ranges"))
        self._batch_seq = int(row[0]) if row and row[0] is not None else 0
        pruned = self._meta(PRUNED_BEFORE_KEY)
        self._pruned_before: int | None = None if pruned is None else int(pruned)
        window = self._meta(PRUNE_WINDOW_KEY)
        self._prune_window: int | None = None if window is None else int(window)

    # ------------------------------------------------------------------ exactly-once bookkeeping

    def applied_offsets(self, incarnation: str) -> dict[PartitionKey, int]:
        """The next offset to apply per (topic, partition) for one broker incarnation."""
        rows = self._con.execute(
            'SELECT topic, "partition", max(last_offset) FROM source_ranges '
            "WHERE incarnation = ? GROUP BY ALL",
            [incarnation],
        ).fetchall()
        return {(topic, partition): last + 1 for topic, partition, last in rows}

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
        """Apply one batch atomically; transactions (`transactions` and the usage transactions
        in `columns`) whose id was already applied, or repeats, are dropped.

        Idle-detector states replace the stored ones, `changes` are applied, the balances move
        by the new postings, outbox messages are queued (with, when `balances_topic` is set,
        one message per changed account, stamped with `balances_shard` when set) and `raw`,
        the batch's messages in the order they were folded, goes to the archive under the
        next batch sequence number, all in the same
        transaction as the postings they follow from. `raw` must span exactly `ranges`.
        Raises StoreError for a transaction booked into a closed period, or a close committed
        while committed rows are still unsealed.
        """
        con = self._con
        now = now_us()
        changes = changes or StateChanges()
        if raw and message_ranges(raw) != list(ranges):
            raise StoreError("the archived messages of a batch must span its offset ranges")
        seq = self._batch_seq + 1 if raw else self._batch_seq
        closing = [
            e
            for e in changes.admin
            if isinstance(e.envelope.data, PeriodClosed) and e.outcome == "applied"
        ]
        # nothing owed before this commit: its balance messages supersede none
        superseding = not self._outbox_settled or any(m.topic == balances_topic for m in outbox)
        if outbox or balances_topic is not None:
            self._outbox_settled = False  # it may queue messages
        con.execute("BEGIN TRANSACTION")
        try:
            fresh = self._drop_seen(transactions)
            built = self._drop_seen_columns(columns, fresh)
            self._refuse_closed(fresh, bool(closing), [r[7] for r in built.rows] if built else ())
            table = _postings_table(fresh, incarnation)
            usage = usage_to_arrow(built) if built else None
            posted = table.num_rows + insert_postings(con, table, usage, incarnation, job_usage)
            seen_now = self._insert_seen(fresh, changes.seen, built)
            batch = seq if raw else None  # a range committed without its messages has none
            insert_rows(
                self._con,
                "source_ranges",
                [
                    (incarnation, r.topic, r.partition, r.first, r.last, now, False, batch)
                    for r in ranges
                ],
            )
            if raw:
                archived = archive_to_arrow(
                    raw, incarnation, seq, self._pruned_before, self._prune_window
                )
                con.register("batch_raw", archived)
                con.execute("INSERT INTO raw_events SELECT * FROM batch_raw")
                con.unregister("batch_raw")
                if self._pruned_before is not None or self._prune_window is not None:
                    con.execute(
                        "DELETE FROM ledger_meta "
                        "WHERE key IN ('pruned_before_us', 'prune_window_us')"
                    )
            if idle_states:
                con.execute(
                    "DELETE FROM idle_state WHERE subject IN (SELECT unnest(?))",
                    [[s.subject for s in idle_states]],
                )
                insert_rows(self._con, "idle_state", [state_to_row(s) for s in idle_states])
            self._apply_changes(changes, now)
            if job_usage:
                update_job_usage(con, changes)
            self._append_audit(changes.audit)
            closed = tuple(self._close(entry, now) for entry in closing)
            insert_rows(
                self._con,
                "outbox",
                [(m.id, m.topic, m.key, m.value, now, False) for m in outbox],
                new_ids_only=True,
            )
            published = 0
            if balances_topic is not None and (posted or closed):
                accounts = set(table.column("account").to_pylist())
                if usage is not None:
                    accounts |= set(pc.unique(usage.column("account")).to_pylist())
                    accounts |= set(pc.unique(usage.column("capacity")).to_pylist())
                if closed:  # a closed period drops out of its accounts' messages
                    con.register("closed_now", pa.table({"period": list(closed)}))
                    accounts |= {
                        str(a)
                        for (a,) in con.execute(
                            "SELECT DISTINCT account FROM balances "
                            "SEMI JOIN closed_now USING (period)"
                        ).fetchall()
                    }
                    con.unregister("closed_now")
                jobs: set[str | None] = set()
                if balances_shard is not None:  # a shard lists the jobs it charged
                    jobs |= set(pc.unique(table.column("job_id")).to_pylist())
                    if usage is not None:
                        jobs |= set(pc.unique(usage.column("job_id")).to_pylist())
                published, self._balance_figures = queue_balance_messages(
                    con,
                    accounts,
                    balances_topic,
                    now,
                    self.closed_period_labels(),
                    balances_shard,
                    {j for j in jobs if j is not None},
                    self._balance_figures,
                    superseding,
                )
            insert_rows(
                self._con,
                "dead_letters",
                [
                    (
                        incarnation,
                        d.topic,
                        d.partition,
                        d.offset,
                        d.event_id,
                        d.reason,
                        d.payload,
                        now,
                    )
                    for d in dead_letters
                ],
            )
            con.execute("COMMIT")
        except BaseException as exc:
            con.execute("ROLLBACK")
            self._admin_cache = self._closed_cache = None  # may hold what was rolled back
            self._awaiting_seq = self._balance_figures = None
            self._outbox_settled = False
            if isinstance(exc, duckdb.Error):  # e.g. a key applied twice: the port's error
                raise StoreError(f"the store refused the batch: {exc}") from exc
            raise
        if self._mirror is not None:
            self._mirror.apply(idle_states, changes)
        self._dedupe.added(seen_now)
        self._memory.follow(len(self._dedupe.ids()))
        if raw:
            self._batch_seq = seq
            self._pruned_before = self._prune_window = None
        if changes.admin:
            self._admin_cache = self._closed_cache = None
            self.export_admin_log()
        offered = len(transactions) + (len(columns) if columns else 0)
        applied = len(fresh) + (len(built) if built else 0)
        return CommitResult(
            transactions=applied,
            postings=posted,
            duplicates=offered - applied,
            dead_letters=len(dead_letters),
            balances_published=published,
            closed=closed,
        )

    def _apply_changes(self, changes: StateChanges, now: int) -> None:
        write_changes(self._con, changes, now)
        # `awaiting_owner`'s last seq, kept rather than read per batch (only this writer adds)
        self._awaiting_seq = write_identity(self._con, changes, self._awaiting_seq)

    def _refuse_closed(
        self, fresh: Sequence[SourcedTransaction], closing: bool, periods: Sequence[str] = ()
    ) -> None:
        """The commit guards: nothing posts into a closed period; a close finds all sealed."""
        closed = self.closed_period_labels()
        if closed:
            late = sorted(({t.txn.period for t in fresh} | set(periods)) & closed)
            if late:
                raise StoreError(
                    f"period {', '.join(late)} is closed: nothing may be booked into it"
                )
        if closing:
            row = first_row(
                self._con.execute("SELECT count(*) FROM source_ranges WHERE NOT sealed")
            )
            if row and row[0]:
                raise StoreError("seal the store before committing a period close")

    def _insert_seen(
        self,
        fresh: Sequence[SourcedTransaction],
        extra: Sequence[tuple[str, int, str]],
        built: PostingColumns | None,
    ) -> list[str]:
        """Record the applied ids with their dedupe time and scope; the ids recorded."""
        return self._dedupe.insert(fresh, extra, built)

    def _close(self, entry: AppliedAdmin, now: int) -> str:
        """Record a close with the checksum of everything booked into the period so far."""
        event = entry.envelope.data
        assert isinstance(event, PeriodClosed)
        rows, digest = period_checksum(self._con, self._all_postings_sql(), event.period)
        closed = ClosedPeriod(
            event.period,
            entry.envelope.id,
            event.effective_us,
            event.actor,
            event.reason,
            rows,
            digest,
        )
        self._con.execute(
            "INSERT INTO closed_periods VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                closed.period,
                closed.event_id,
                closed.effective_us,
                closed.actor,
                closed.reason,
                closed.rows,
                closed.sha256,
                closed.algorithm,
                now,
            ],
        )
        self._closed_cache = None
        return closed.period

    def load_view(self, keys: ViewKeys) -> LedgerView:
        """What one batch's fold reads, for `keys` only."""
        return assemble_view(self, keys)

    def forgotten_before(self, scopes: Collection[str]) -> dict[str, int]:
        """Each of `scopes`' forgotten-before cutoff, from the in-memory dedupe set."""
        return self._dedupe.cutoffs(scopes)

    def seen_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have been applied already: one set intersection with the dedupe set,
        which the writer keeps in memory beside `seen_events` (only it changes that table)."""
        if not ids:
            return set()
        return self._dedupe.ids().intersection(ids)

    def _state(self) -> WriterMirror:
        """The projections a fold reads, in memory: read from the tables once, then kept in step
        by every commit (only this writer changes them)."""
        if self._mirror is None:
            every = [
                str(r[0]) for r in self._con.execute("SELECT subject FROM idle_state").fetchall()
            ]
            gpus = [
                str(r[0])
                for r in self._con.execute("SELECT DISTINCT gpu_uuid FROM gpu_holdings").fetchall()
            ]
            self._mirror = WriterMirror(
                read_idle_states(self._con, every),
                read_gpu_timelines(self._con, gpus),
                read_open_holds(self._con),
            )
        return self._mirror

    def idle_states(self, subjects: Sequence[str]) -> dict[str, GpuIdleState]:
        idle = self._state().idle
        return {s: idle[s] for s in subjects if s in idle}

    def gpu_timelines(self, gpu_uuids: Collection[str]) -> dict[str, tuple[Holding, ...]]:
        """The assignment timelines of `gpu_uuids` (a GPU never assigned has none)."""
        timelines = self._state().timelines
        return {g: timelines[g] for g in gpu_uuids if g in timelines}

    def open_holds(self) -> dict[HoldKey, OpenHold]:
        return dict(self._state().holds)

    def hold_baselines(self, jobs: Collection[str] | None = None) -> dict[HoldKey, int]:
        """Read from the table, not the mirror: a global shard keeps one per job settled and
        not ended for good, and a fold reads only those of the jobs placing holds or ending."""
        return read_hold_baselines(self._con, jobs)

    def job_usage_rows(self) -> dict[tuple[str, str, str], int]:
        rows = self._con.execute("SELECT account, job_id, unit, amount FROM job_usage").fetchall()
        return {(str(a), str(j), str(u)): int(n) for a, j, u, n in rows}

    def _drop_seen_columns(
        self, columns: PostingColumns | None, fresh: Sequence[SourcedTransaction]
    ) -> PostingColumns | None:
        """`columns` less the transactions already applied, in `fresh`, or repeated."""
        if not columns:
            return None
        ids = [r[0] for r in columns.rows]
        taken = self._dedupe.ids().intersection(ids)
        taken.update(t.txn.txn_id for t in fresh)
        drop: set[int] = set()
        for index, txn_id in enumerate(ids):
            if txn_id in taken:
                drop.add(index)
            taken.add(txn_id)
        return columns.without(drop) if drop else columns

    def _drop_seen(self, transactions: Sequence[SourcedTransaction]) -> list[SourcedTransaction]:
        """`transactions` less those already applied, and less repeats within the batch."""
        seen = self.seen_ids([t.txn.txn_id for t in transactions])
        fresh: list[SourcedTransaction] = []
        for item in transactions:
            if item.txn.txn_id in seen:
                continue
            seen.add(item.txn.txn_id)
            fresh.append(item)
        return fresh

    def limit_memory(self, limit: int | None) -> None:
        """Set the working memory DuckDB may use, in bytes (None: DuckDB's default; see
        `ledger.store.hot_memory`)."""
        if limit is None:
            self._con.execute("RESET memory_limit")
        self._memory = MemoryLimit(self._con, limit)
        self._memory.follow(len(self._dedupe.ids()))

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
