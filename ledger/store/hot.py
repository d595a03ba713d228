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
  period), the open holds per job, each GPU's assignment timeline (`gpu_holdings`, who the
  scheduler says holds it: `ledger.assignments`), the applied admin events (`admin_log`), reversed
  transactions, closed periods with their checksums, the audit trail (`ledger.store.hot_audit`),
  job owners and suspense awaiting them (`ledger.store.hot_identity`) and the outbox messages
  to publish (alerts, dead letters, changed balances).
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

import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ledger.admin import AppliedAdmin, PeriodClosed
from ledger.assignments import Holding
from ledger.closing import ClosedPeriod
from ledger.errors import SealError, StoreError
from ledger.events import DeadLetter
from ledger.excerpts import bounded
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState, state_to_row
from ledger.posting_columns import PostingColumns
from ledger.store.balance_outbox import queue_balance_messages
from ledger.store.hot_audit import AUDIT_DDL, HotAudit
from ledger.store.hot_dedupe import DedupeSet, Pruned
from ledger.store.hot_identity import IDENTITY_DDL, HotIdentity, write_identity
from ledger.store.hot_reads import BALANCES_VERSION, HotReads
from ledger.store.hot_tables import (
    HOT_TABLES_DDL,
    insert_postings,
    insert_rows,
    read_gpu_timelines,
    read_idle_states,
    read_open_holds,
    write_changes,
)
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
    SealResult,
    SourcedTransaction,
    StateChanges,
    Undeliverable,
    ViewKeys,
    assemble_view,
    ranges_from_offsets,
)
from ledger.store.schema import archive_to_arrow, transactions_to_arrow, usage_to_arrow
from ledger.store.sealing import Segmenter, io_reason
from ledger.store.segments import SegmentInfo
from ledger.store.side_files import period_checksum

# The ledger_meta keys of the prunes run since the last archived batch (archived with the next).
_WINDOW, _CUTOFF = "prune_window_us", "pruned_before_us"


def _postings_table(fresh: Sequence[SourcedTransaction], incarnation: str) -> pa.Table:
    return transactions_to_arrow(fresh, incarnation)


def _now_us() -> int:
    return time.time_ns() // 1_000


class DuckDBStore(HotReads, HotAudit, HotIdentity):
    """The single writer of one ledger data directory: the DuckDB implementation of the store
    port (`ledger.store.port.LedgerStore`)."""

    def __init__(self, data_dir: Path | str) -> None:
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
        self._con.execute(WRITER_SETTINGS + HOT_TABLES_DDL + AUDIT_DDL + IDENTITY_DDL)
        self._segments = Segmenter(self._con, self.segments_root, self.archive_root)
        self.manifest = self._segments.postings.manifest
        self.archive_manifest = self._segments.archive.manifest
        self._admin_log_exported = False
        self._admin_cache: tuple[AppliedAdmin, ...] | None = None  # the admin log, as read
        self._dedupe = DedupeSet(self._con)
        self._mirror: WriterMirror | None = None  # idle states, timelines, open holds
        self._closed_cache: frozenset[str] | None = None
        version = first_row(
            self._con.execute("SELECT value FROM ledger_meta WHERE key = 'balances_version'")
        )
        if version is None or version[0] != BALANCES_VERSION:
            self.rebuild_balances()  # a store from before the balances table: fold once
        row = first_row(self._con.execute("SELECT max(batch_seq) FROM source_ranges"))
        self._batch_seq = int(row[0]) if row and row[0] is not None else 0
        pruned = self._meta(_CUTOFF)
        self._pruned_before: int | None = None if pruned is None else int(pruned)
        window = self._meta(_WINDOW)
        self._prune_window: int | None = None if window is None else int(window)

    def _meta(self, key: str) -> str | None:
        row = first_row(self._con.execute("SELECT value FROM ledger_meta WHERE key = ?", [key]))
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: object) -> None:
        self._con.execute(
            "INSERT INTO ledger_meta VALUES (?, ?) "
            "ON CONFLICT DO UPDATE SET value = excluded.value",
            [key, str(value)],
        )

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
    ) -> CommitResult:
        """Apply one batch atomically; transactions (`transactions` and the usage transactions
        in `columns`) whose id was already applied, or repeats, are dropped.

        Idle-detector states replace the stored ones, `changes` are applied, the balances move
        by the new postings, outbox messages are queued (with, when `balances_topic` is set,
        one message per changed account) and `raw`, the batch's messages in the order they
        were folded, goes to the archive under the next batch sequence number, all in the same
        transaction as the postings they follow from. `raw` must span exactly `ranges`.
        Raises StoreError for a transaction booked into a closed period, or a close committed
        while committed rows are still unsealed.
        """
        con = self._con
        now = _now_us()
        changes = changes or StateChanges()
        if raw and ranges_from_offsets((m.topic, m.partition, m.offset) for m in raw) != list(
            ranges
        ):
            raise StoreError("the archived messages of a batch must span its offset ranges")
        seq = self._batch_seq + 1 if raw else self._batch_seq
        closing = [
            e
            for e in changes.admin
            if isinstance(e.envelope.data, PeriodClosed) and e.outcome == "applied"
        ]
        con.execute("BEGIN TRANSACTION")
        try:
            fresh = self._drop_seen(transactions)
            built = self._drop_seen_columns(columns, fresh)
            self._refuse_closed(fresh, bool(closing), [r[7] for r in built.rows] if built else ())
            table = _postings_table(fresh, incarnation)
            usage = usage_to_arrow(built) if built else None
            posted = table.num_rows + insert_postings(con, table, usage, incarnation)
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
                    "DELETE FROM idle_state WHERE list_contains(?, subject)",
                    [[s.subject for s in idle_states]],
                )
                insert_rows(self._con, "idle_state", [state_to_row(s) for s in idle_states])
            self._apply_changes(changes, now)
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
                published = queue_balance_messages(
                    con, accounts, balances_topic, now, self.closed_period_labels()
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
            if isinstance(exc, duckdb.Error):  # e.g. a key applied twice: the port's error
                raise StoreError(f"the store refused the batch: {exc}") from exc
            raise
        if self._mirror is not None:
            self._mirror.apply(idle_states, changes)
        self._dedupe.added(seen_now)
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
        write_identity(self._con, changes)

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

    def pending_outbox(self, limit: int = 1000) -> list[OutboxMessage]:
        rows = self._con.execute(
            'SELECT id, topic, "key", "value" FROM outbox WHERE NOT sent '
            "ORDER BY created_at_us, rowid LIMIT ?",
            [limit],
        ).fetchall()
        return [OutboxMessage(str(i), str(t), k, v) for i, t, k, v in rows]

    def mark_sent(self, ids: Sequence[str]) -> None:
        """Forget messages the broker acknowledged (the outbox holds only what is owed)."""
        if ids:
            self._con.execute("DELETE FROM outbox WHERE list_contains(?, id)", [list(ids)])

    def mark_undeliverable(self, message_id: str, reason: str) -> None:
        """Move a refused outbox message to `undeliverable`, with the broker's reason."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(
                'INSERT INTO undeliverable SELECT id, topic, "key", "value", ?, ? FROM outbox '
                "WHERE id = ?",
                [bounded(reason), _now_us(), message_id],
            )
            con.execute("DELETE FROM outbox WHERE id = ?", [message_id])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def undeliverable(self) -> list[Undeliverable]:
        rows = self._con.execute(
            'SELECT id, topic, "key", "value", reason FROM undeliverable '
            "ORDER BY recorded_at_us, rowid"
        ).fetchall()
        return [
            Undeliverable(OutboxMessage(str(i), str(t), k, v), str(r)) for i, t, k, v, r in rows
        ]

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

    # ------------------------------------------------------------------ sealing

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        """Seal every committed, unsealed range into segments and archive segments; then compact
        small ones of each.

        The archive manifest is written before the postings manifest, so the archive never lags
        the postings a reader sees; an interrupted seal leaves its ranges unsealed, and the next
        one writes the same files again. A file the system refuses to write (the disk is full)
        raises a `SealError` and leaves the committed rows where they were (see
        `ledger.store.sealing`).
        """
        try:
            result = self._segments.seal_committed()
            result.compacted = self.compact(compact_below_rows, compact_min_segments)
            result.archive_compacted = self._segments.align_archive()
            self._segments.remove_unlisted_files()
            self.export_closed_periods()  # after sealing: a closed period's rows are all sealed
            self.export_refused()
            self.export_inventory()
            if not self._admin_log_exported:
                self.export_admin_log()
            self.export_audit()
        except OSError as exc:  # a side file, a manifest or a directory could not be written
            raise SealError(str(exc.filename or self.segments_root), io_reason(exc)) from exc
        return result

    def compact(self, below_rows: int, min_segments: int) -> list[SegmentInfo]:
        """Merge runs of ≥ `min_segments` adjacent small segments of a partition into one."""
        return self._segments.compact(self._segments.postings, below_rows, min_segments)

    def remove_unlisted_files(self) -> int:
        """Delete segment and archive files their manifest does not name."""
        return self._segments.remove_unlisted_files()

    # ------------------------------------------------------------------ inspection

    def hot_rows(self) -> int:
        row = first_row(self._con.execute("SELECT count(*) FROM postings"))
        return int(row[0]) if row else 0

    def hot_archived(self) -> int:
        """Archived messages not sealed yet."""
        row = first_row(self._con.execute("SELECT count(*) FROM raw_events"))
        return int(row[0]) if row else 0

    @property
    def batch_seq(self) -> int:
        """The sequence number of the last archived batch (0: none yet)."""
        return self._batch_seq

    def dead_letters(self) -> list[tuple[object, ...]]:
        return self._con.execute(
            'SELECT topic, "partition", "offset", event_id, reason FROM dead_letters '
            "ORDER BY recorded_at_us"
        ).fetchall()

    def prune_seen_events(self, window_us: int) -> int:
        """Per dedupe scope, raise its forgotten-before cutoff to its newest applied time less
        `window_us`, and forget its ids older than the cutoff; returns how many were forgotten.

        The window is measured in each scope's own event time, so replaying old data dedupes
        the same way as live data, and a scope that fell silent keeps its ids and cutoff where
        its last event left them. A prune that changed anything is recorded with the next
        archived batch (with no batch between them, prunes compose to the smallest window), so
        a rebuild runs it on the same state before applying that batch.
        """
        window = window_us if self._prune_window is None else min(window_us, self._prune_window)
        return self._prune(lambda: self._dedupe.prune_to_window(window_us), _WINDOW, window)

    def prune_seen_before(self, cutoff_us: int) -> int:
        """Forget every applied id older than `cutoff_us`, whatever its scope, and raise every
        scope's cutoff to it; returns how many were forgotten (see `LedgerStore`). Recorded
        with the next archived batch like `prune_seen_events` (the greatest cutoff since)."""
        cutoff = cutoff_us if self._pruned_before is None else max(cutoff_us, self._pruned_before)
        return self._prune(lambda: self._dedupe.prune_before(cutoff_us), _CUTOFF, cutoff)

    def _prune(self, prune: Callable[[], Pruned], meta: str, recorded: int) -> int:
        """Run `prune` in one transaction; when it changed anything, record `recorded` (the
        window or cutoff) under `meta` for the next archived batch."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            pruned = prune()
            changed = bool(pruned[0] or pruned[1])
            if changed:
                self._set_meta(meta, recorded)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if changed:
            if meta == _WINDOW:
                self._prune_window = recorded
            else:
                self._pruned_before = recorded
            self._dedupe.forgotten(pruned)
        return len(pruned[0])

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
