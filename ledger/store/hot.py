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
  transactions, closed periods with their checksums, and the outbox messages to publish
  (alerts, dead letters, changed balances).
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
the earlier batches, except the dedupe window, which the worker prunes between batches. A prune
that forgot ids is therefore recorded with the next archived batch (`pruned_before_us`), and a
rebuild forgets the same ids at the same point.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa

from ledger.accounts import AccountKind, budget_account
from ledger.admin import AdminView, AppliedAdmin, PeriodClosed, applied_from_dict, applied_to_dict
from ledger.assignments import Holding
from ledger.balances import (
    BalanceRow,
    account_team,
    balance_message_id,
    balance_update,
    budget_status,
    current_period,
    encode_balance_update,
    fold_rows,
)
from ledger.closing import ClosedPeriod
from ledger.errors import StoreError
from ledger.events import DeadLetter, Owner
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState, state_from_row, state_to_row
from ledger.posting_columns import PostingColumns
from ledger.postings import Transaction, TransactionKind
from ledger.pricing import PriceBook
from ledger.store.layout import (
    ARCHIVE_DIR,
    HOT_DB_NAME,
    SEGMENTS_DIR,
    first_row,
    sql_path,
)
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
    ViewKeys,
    ranges_from_offsets,
)
from ledger.store.schema import (
    POSTING_COLUMNS_SQL,
    archive_to_arrow,
    columns_to_arrow,
    transaction_from_rows,
    transactions_to_arrow,
)
from ledger.store.sealing import Segmenter
from ledger.store.segments import SegmentInfo
from ledger.store.side_files import period_checksum, write_admin_log, write_closed_period
from ledger.units import Unit

_DDL = """
CREATE TABLE IF NOT EXISTS postings (
    txn_id VARCHAR NOT NULL, leg SMALLINT NOT NULL, kind VARCHAR NOT NULL,
    account VARCHAR NOT NULL, unit VARCHAR NOT NULL, amount BIGINT NOT NULL,
    team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR, cost_centre VARCHAR,
    gpu_uuid VARCHAR, model VARCHAR, pool VARCHAR, node VARCHAR,
    start_us BIGINT NOT NULL, end_us BIGINT NOT NULL, cause VARCHAR NOT NULL,
    incarnation VARCHAR NOT NULL, src_topic VARCHAR NOT NULL,
    src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL,
    period VARCHAR NOT NULL, util_pct SMALLINT, idle BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS seen_events (event_id VARCHAR PRIMARY KEY, time_us BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS source_ranges (
    incarnation VARCHAR NOT NULL, topic VARCHAR NOT NULL, "partition" INTEGER NOT NULL,
    first_offset BIGINT NOT NULL, last_offset BIGINT NOT NULL,
    committed_at_us BIGINT NOT NULL, sealed BOOLEAN NOT NULL DEFAULT FALSE, batch_seq BIGINT
);
ALTER TABLE source_ranges ADD COLUMN IF NOT EXISTS batch_seq BIGINT;
CREATE TABLE IF NOT EXISTS idle_state (
    subject VARCHAR PRIMARY KEY, last_time_us BIGINT NOT NULL,
    team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR,
    below_since_us BIGINT, busy_since_us BIGINT, alert_since_us BIGINT,
    waste_gpu_ms BIGINT NOT NULL, waste_micros BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    id VARCHAR PRIMARY KEY, topic VARCHAR NOT NULL, "key" BLOB, "value" BLOB NOT NULL,
    created_at_us BIGINT NOT NULL, sent BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE TABLE IF NOT EXISTS dead_letters (
    incarnation VARCHAR, topic VARCHAR, "partition" INTEGER, "offset" BIGINT,
    event_id VARCHAR, reason VARCHAR NOT NULL, payload VARCHAR NOT NULL,
    recorded_at_us BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS balances (
    account VARCHAR NOT NULL, unit VARCHAR NOT NULL, period VARCHAR NOT NULL,
    balance BIGINT NOT NULL, PRIMARY KEY (account, unit, period)
);
CREATE TABLE IF NOT EXISTS open_holds (
    job_id VARCHAR NOT NULL, unit VARCHAR NOT NULL, team VARCHAR NOT NULL, project VARCHAR,
    amount BIGINT NOT NULL, expires_us BIGINT NOT NULL, placed_by VARCHAR NOT NULL,
    PRIMARY KEY (job_id, unit)
);
CREATE TABLE IF NOT EXISTS gpu_holdings (
    gpu_uuid VARCHAR NOT NULL, team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR,
    from_us BIGINT NOT NULL, to_us BIGINT
);
CREATE TABLE IF NOT EXISTS admin_log (
    seq BIGINT NOT NULL, event_id VARCHAR PRIMARY KEY, type VARCHAR NOT NULL,
    effective_us BIGINT NOT NULL, entry VARCHAR NOT NULL, applied_at_us BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS closed_periods (
    period VARCHAR PRIMARY KEY, event_id VARCHAR NOT NULL, effective_us BIGINT NOT NULL,
    actor VARCHAR NOT NULL, reason VARCHAR NOT NULL, "rows" BIGINT NOT NULL,
    sha256 VARCHAR NOT NULL, algorithm VARCHAR NOT NULL, closed_at_us BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS raw_events (
    batch_seq BIGINT NOT NULL, batch_index INTEGER NOT NULL, incarnation VARCHAR NOT NULL,
    topic VARCHAR NOT NULL, "partition" INTEGER NOT NULL, "offset" BIGINT NOT NULL,
    "key" BLOB, "value" BLOB, value_codec VARCHAR, value_size BIGINT, pruned_before_us BIGINT
);
CREATE TABLE IF NOT EXISTS reversals (txn_id VARCHAR PRIMARY KEY, reversed_by VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE SEQUENCE IF NOT EXISTS publish_seq;
"""
_BALANCES_VERSION = "1"
# Kinds whose interval is chosen by a person (an effective time, a period): their dedupe time
# is capped at the newest applied event, so a future date cannot age out every sample id.
_ADMIN_KINDS = (TransactionKind.BUDGET_GRANT, TransactionKind.ADJUSTMENT)


@dataclass(slots=True)
class _WriterState:
    """The writer's in-memory copy of the projections a fold reads."""

    idle: dict[str, GpuIdleState]
    timelines: dict[str, tuple[Holding, ...]]
    holds: dict[HoldKey, OpenHold]

    def apply(self, idle_states: Sequence[GpuIdleState], changes: StateChanges) -> None:
        """What a committed batch changed (the tables changed alike in its transaction)."""
        for state in idle_states:
            self.idle[state.subject] = state
        for gpu, timeline in changes.timelines.items():
            if timeline:
                self.timelines[gpu] = tuple(timeline)
            else:
                self.timelines.pop(gpu, None)
        for hold in changes.holds:
            if hold.amount:
                self.holds[hold.key] = hold
            else:
                self.holds.pop(hold.key, None)


def _postings_table(
    fresh: Sequence[SourcedTransaction], built: PostingColumns | None, incarnation: str
) -> pa.Table:
    if not built:
        return transactions_to_arrow(fresh, incarnation)
    table = columns_to_arrow(built, incarnation)
    if not fresh:
        return table
    return pa.concat_tables([transactions_to_arrow(fresh, incarnation), table])


def _now_us() -> int:
    return time.time_ns() // 1_000


class DuckDBStore:
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
        self._con.execute(_DDL)
        self._segments = Segmenter(self._con, self.segments_root, self.archive_root)
        self.manifest = self._segments.postings.manifest
        self.archive_manifest = self._segments.archive.manifest
        self._admin_log_exported = False
        self._admin_cache: tuple[AppliedAdmin, ...] | None = None  # the admin log, as read
        self._seen: set[str] | None = None  # `seen_events`' ids, read once
        self._mirror: _WriterState | None = None  # idle states, timelines, open holds
        self._newest_seen: int | None = None  # their greatest dedupe time
        self._closed_cache: frozenset[str] | None = None
        version = first_row(
            self._con.execute("SELECT value FROM ledger_meta WHERE key = 'balances_version'")
        )
        if version is None or version[0] != _BALANCES_VERSION:
            self.rebuild_balances()  # a store from before the balances table: fold once
        row = first_row(self._con.execute("SELECT max(batch_seq) FROM source_ranges"))
        self._batch_seq = int(row[0]) if row and row[0] is not None else 0
        pruned = self._meta("pruned_before_us")
        self._pruned_before: int | None = None if pruned is None else int(pruned)

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
            self._refuse_closed(fresh, bool(closing), built.period if built else ())
            table = _postings_table(fresh, built, incarnation)
            if table.num_rows:
                con.register("batch_postings", table)
                con.execute("INSERT INTO postings SELECT * FROM batch_postings")
                con.execute(
                    "INSERT INTO balances SELECT account, unit, period, sum(amount) "
                    "FROM batch_postings GROUP BY ALL "
                    "ON CONFLICT DO UPDATE SET balance = balance + excluded.balance"
                )
                con.unregister("batch_postings")
            seen_now = self._insert_seen(fresh, changes.seen, built)
            batch = seq if raw else None  # a range committed without its messages has none
            self._insert_rows(
                "source_ranges",
                [
                    (incarnation, r.topic, r.partition, r.first, r.last, now, False, batch)
                    for r in ranges
                ],
            )
            if raw:
                con.register(
                    "batch_raw", archive_to_arrow(raw, incarnation, seq, self._pruned_before)
                )
                con.execute("INSERT INTO raw_events SELECT * FROM batch_raw")
                con.unregister("batch_raw")
                if self._pruned_before is not None:
                    con.execute("DELETE FROM ledger_meta WHERE key = 'pruned_before_us'")
            if idle_states:
                con.execute(
                    "DELETE FROM idle_state WHERE list_contains(?, subject)",
                    [[s.subject for s in idle_states]],
                )
                self._insert_rows("idle_state", [state_to_row(s) for s in idle_states])
            self._apply_changes(changes, now)
            closed = tuple(self._close(entry, now) for entry in closing)
            self._insert_rows(
                "outbox",
                [(m.id, m.topic, m.key, m.value, now, False) for m in outbox],
                new_ids_only=True,
            )
            published = 0
            if balances_topic is not None and (table.num_rows or closed):
                accounts = set(table.column("account").to_pylist())
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
                published = self._queue_balances(accounts, balances_topic, now)
            self._insert_rows(
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
        if self._seen is not None and seen_now[0]:
            self._seen.update(seen_now[0])
            newest = max(seen_now[1])
            self._newest_seen = (
                newest if self._newest_seen is None else max(newest, self._newest_seen)
            )
        if raw:
            self._batch_seq = seq
            self._pruned_before = None
        if changes.admin:
            self._admin_cache = self._closed_cache = None
            self.export_admin_log()
        offered = len(transactions) + (len(columns) if columns else 0)
        applied = len(fresh) + (len(built) if built else 0)
        return CommitResult(
            transactions=applied,
            postings=table.num_rows,
            duplicates=offered - applied,
            dead_letters=len(dead_letters),
            balances_published=published,
            closed=closed,
        )

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

    def _insert_rows(
        self, table: str, rows: Sequence[tuple[object, ...]], new_ids_only: bool = False
    ) -> None:
        """Insert whole rows (every column, in the table's order), in their order, in one
        statement (DuckDB's `executemany` runs one per row); with `new_ids_only`, rows whose
        `id` (their first column) the table holds already are left out."""
        if not rows:
            return
        con = self._con
        if len(rows) == 1 and not new_ids_only:
            marks = ", ".join("?" * len(rows[0]))
            con.execute(f"INSERT INTO {table} VALUES ({marks})", list(rows[0]))
            return
        name = f"batch_rows_{table}"
        columns = list(zip(*rows, strict=True))
        con.register(name, pa.table({f"c{i}": pa.array(c) for i, c in enumerate(columns)}))
        try:  # not ON CONFLICT: it does not keep the rows' order
            where = f" WHERE c0 NOT IN (SELECT id FROM {table})" if new_ids_only else ""
            con.execute(f"INSERT INTO {table} SELECT * FROM {name}{where}")
        finally:
            con.unregister(name)

    def _insert_seen(
        self,
        fresh: Sequence[SourcedTransaction],
        extra: Sequence[tuple[str, int]],
        built: PostingColumns | None,
    ) -> tuple[list[str], list[int]]:
        """Record the applied ids; the ids and dedupe times recorded."""
        if built:  # usage: applied at the end of its interval, like `fresh`'s usage
            fresh_ids = [t.txn.txn_id for t in fresh] + built.txn_id
            fresh_times = [t.txn.end_us for t in fresh] + built.end_us
        else:
            fresh_ids = [t.txn.txn_id for t in fresh]
            fresh_times = [t.txn.end_us for t in fresh]
        if not fresh_ids and not extra:
            return [], []
        ids = fresh_ids + [i for i, _ in extra]
        times = fresh_times + [t for _, t in extra]
        if any(t.txn.kind in _ADMIN_KINDS for t in fresh) or extra:
            self._seen_set()
            newest = self._newest_seen
            if newest is not None:
                usage = [TransactionKind.USAGE] * (len(fresh_ids) - len(fresh))
                kinds = [t.txn.kind for t in fresh] + usage + [None] * len(extra)
                times = [
                    min(t, newest) if k in _ADMIN_KINDS or k is None else t
                    for t, k in zip(times, kinds, strict=True)
                ]
        self._con.register("batch_seen", pa.table({"event_id": ids, "time_us": times}))
        self._con.execute("INSERT INTO seen_events SELECT * FROM batch_seen")
        self._con.unregister("batch_seen")
        return ids, times

    def _apply_changes(self, changes: StateChanges, now: int) -> None:
        con = self._con
        if changes.timelines:
            con.execute(
                "DELETE FROM gpu_holdings WHERE list_contains(?, gpu_uuid)",
                [list(changes.timelines)],
            )
            self._insert_rows(
                "gpu_holdings",
                [
                    (
                        uuid,
                        h.owner.team,
                        h.owner.project,
                        h.owner.user,
                        h.owner.job_id,
                        h.from_us,
                        h.to_us,
                    )
                    for uuid, timeline in changes.timelines.items()
                    for h in timeline
                ],
            )
        if changes.holds:
            con.execute(
                "DELETE FROM open_holds WHERE list_contains(?, job_id || '/' || unit)",
                # injective: a unit has no '/'
                [[f"{h.job_id}/{h.unit.value}" for h in changes.holds]],
            )
            self._insert_rows(
                "open_holds",
                [
                    (h.job_id, h.unit.value, h.team, h.project, h.amount, h.expires_us, h.placed_by)
                    for h in changes.holds
                    if h.amount
                ],
            )
        if changes.admin:
            row = first_row(con.execute("SELECT coalesce(max(seq), 0) FROM admin_log"))
            seq = int(row[0]) if row else 0
            self._insert_rows(
                "admin_log",
                [
                    (
                        seq + i + 1,
                        e.envelope.id,
                        e.envelope.type.value,
                        e.envelope.time_us,
                        orjson.dumps(applied_to_dict(e)).decode(),
                        now,
                    )
                    for i, e in enumerate(changes.admin)
                ],
            )
        self._insert_rows("reversals", list(changes.reversals))

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

    def _queue_balances(self, accounts: set[str], topic: str, now: int) -> int:
        """Queue one message per changed account (and per affected team's budget account);
        a queued message not yet sent for the same account is superseded."""
        con = self._con
        row = first_row(
            con.execute(
                "SELECT max(period) FILTER (account LIKE 'capacity:%'), max(period) FROM balances"
            )
        )
        current = (row[0] or row[1]) if row else None
        meta = first_row(con.execute("SELECT value FROM ledger_meta WHERE key = 'current_period'"))
        moved = current is not None and (meta is None or meta[0] != current)
        budgeted = {
            str(a).partition(":")[2]
            for (a,) in con.execute(
                "SELECT DISTINCT account FROM balances WHERE account LIKE 'budget:%'"
            ).fetchall()
        }
        touched = {
            account_team(a)
            for a in accounts
            if a.split(":", 1)[0] in (AccountKind.CONSUMER, AccountKind.BUDGET, AccountKind.HOLD)
        }
        teams = budgeted if moved else budgeted & {t for t in touched if t}
        publish = sorted(accounts | {budget_account(t) for t in teams})
        if not publish:  # e.g. a period closed on a ledger with no postings yet
            return 0
        con.register("publish_accounts", pa.table({"account": publish}))
        rows = fold_rows(
            con.execute(
                "SELECT b.account, b.unit, b.period, b.balance FROM balances b "
                "SEMI JOIN publish_accounts p USING (account)"
            ).fetchall()
        )
        con.unregister("publish_accounts")
        budget_rows: list[BalanceRow] = []
        if teams and current is not None:
            budget_rows = fold_rows(
                con.execute(
                    "SELECT account, unit, period, balance FROM balances WHERE "
                    "account LIKE 'budget:%' OR account LIKE 'hold:%' "
                    "OR (account LIKE 'consumer:%' AND period = ?)",
                    [current],
                ).fetchall()
            )
        closed = self.closed_period_labels()
        seq_row = first_row(con.execute("SELECT nextval('publish_seq')"))
        seq = int(seq_row[0]) if seq_row else 0
        messages = []
        for account in publish:
            budget = None
            team = account.partition(":")[2]
            if account.startswith(f"{AccountKind.BUDGET}:") and current is not None:
                budget = budget_status(team, current, budget_rows)
            update = balance_update(account, rows, closed, current, seq, now, budget)
            messages.append(
                (
                    balance_message_id(account, seq),
                    topic,
                    account.encode(),
                    encode_balance_update(update),
                    now,
                )
            )
        con.execute(
            'DELETE FROM outbox WHERE NOT sent AND topic = ? AND list_contains(?, "key")',
            [topic, [m[2] for m in messages]],
        )
        self._insert_rows("outbox", [(*m, False) for m in messages])
        if moved:
            con.execute(
                "INSERT INTO ledger_meta VALUES ('current_period', ?) "
                "ON CONFLICT DO UPDATE SET value = excluded.value",
                [current],
            )
        return len(messages)

    def load_view(self, keys: ViewKeys) -> LedgerView:
        """What one batch's fold reads, for `keys` only."""
        txn_ids = sorted(keys.txn_ids)
        found = {t: txn for t in txn_ids if (txn := self.find_transaction(t)) is not None}
        return LedgerView(
            seen=frozenset(self.seen_ids(keys.event_ids)),
            admin_applied=frozenset(self.admin_ids(keys.admin_ids)),
            closed=self.closed_period_labels(),
            admin=self.admin_view() if keys.admin else AdminView(),
            timelines=self.gpu_timelines(keys.gpu_uuids),
            idle=self.idle_states(sorted(keys.subjects)),
            holds=self.open_holds() if keys.holds else {},
            budget_totals={k: self.budget_total(*k) for k in keys.budget_keys},
            transactions=found,
            reversed_by={t: r for t in txn_ids if (r := self.reversed_by(t)) is not None},
        )

    def seen_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have been applied already: one set intersection with the dedupe set,
        which the writer keeps in memory beside `seen_events` (only it changes that table)."""
        if not ids:
            return set()
        return self._seen_set().intersection(ids)

    def _seen_set(self) -> set[str]:
        if self._seen is None:
            rows = self._con.execute("SELECT event_id, time_us FROM seen_events").fetchall()
            self._seen = {str(r[0]) for r in rows}
            self._newest_seen = max((int(r[1]) for r in rows), default=None)
        return self._seen

    def _read_idle_states(self, subjects: Sequence[str]) -> dict[str, GpuIdleState]:
        if not subjects:
            return {}
        self._con.register("batch_subjects", pa.table({"subject": list(subjects)}))
        try:
            rows = self._con.execute(
                "SELECT i.* FROM idle_state i SEMI JOIN batch_subjects b USING (subject)"
            ).fetchall()
        finally:
            self._con.unregister("batch_subjects")
        return {str(row[0]): state_from_row(row) for row in rows}

    def _read_gpu_timelines(self, gpu_uuids: Collection[str]) -> dict[str, tuple[Holding, ...]]:
        """The assignment timelines of `gpu_uuids` (a GPU never assigned has none)."""
        if not gpu_uuids:
            return {}
        rows = self._con.execute(
            'SELECT gpu_uuid, team, project, "user", job_id, from_us, to_us FROM gpu_holdings '
            "WHERE list_contains(?, gpu_uuid) ORDER BY gpu_uuid, from_us",
            [sorted(gpu_uuids)],
        ).fetchall()
        timelines: dict[str, list[Holding]] = {}
        for uuid, team, project, user, job, from_us, to_us in rows:
            owner = Owner(team, project, user, job)
            timelines.setdefault(str(uuid), []).append(
                Holding(str(uuid), owner, int(from_us), None if to_us is None else int(to_us))
            )
        return {uuid: tuple(timeline) for uuid, timeline in timelines.items()}

    def _state(self) -> _WriterState:
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
            self._mirror = _WriterState(
                self._read_idle_states(every),
                self._read_gpu_timelines(gpus),
                self._read_open_holds(),
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

    def _drop_seen_columns(
        self, columns: PostingColumns | None, fresh: Sequence[SourcedTransaction]
    ) -> PostingColumns | None:
        """`columns` less the transactions already applied, in `fresh`, or repeated."""
        if not columns:
            return None
        taken = self._seen_set().intersection(columns.txn_id)
        taken.update(t.txn.txn_id for t in fresh)
        drop: set[int] = set()
        for index, txn_id in enumerate(columns.txn_id):
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

    # ------------------------------------------------------------------ projections

    def _sealed_sql(self) -> str | None:
        files = self.manifest.files()
        if not files:
            return None
        listed = ", ".join(f"'{sql_path(f)}'" for f in files)
        return f"read_parquet([{listed}])"

    def _all_postings_sql(self) -> str:
        """Every committed posting: the hot rows and the sealed segments (disjoint once sealing
        has finished, which holds whenever the writer is not inside `seal`)."""
        sealed = self._sealed_sql()
        if sealed is None:
            return "postings"
        columns = POSTING_COLUMNS_SQL
        return f"(SELECT {columns} FROM postings UNION ALL SELECT {columns} FROM {sealed})"

    def balance_rows(self) -> list[BalanceRow]:
        """The balances table: balance per (account, unit, period)."""
        return fold_rows(
            self._con.execute(
                "SELECT account, unit, period, balance FROM balances ORDER BY ALL"
            ).fetchall()
        )

    def folded_balances(self) -> list[BalanceRow]:
        """The fold of every committed posting per (account, unit, period), recomputed."""
        return fold_rows(
            self._con.execute(
                f"SELECT account, unit, period, sum(amount) FROM {self._all_postings_sql()} "
                "GROUP BY ALL ORDER BY ALL"
            ).fetchall()
        )

    def rebuild_balances(self) -> None:
        """Recompute the balances table from the postings."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM balances")
            con.execute(
                "INSERT INTO balances SELECT account, unit, period, sum(amount) "
                f"FROM {self._all_postings_sql()} GROUP BY ALL"
            )
            con.execute(
                "INSERT INTO ledger_meta VALUES ('balances_version', ?) "
                "ON CONFLICT DO UPDATE SET value = excluded.value",
                [_BALANCES_VERSION],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def current_period(self) -> str | None:
        return current_period(self.balance_rows())

    def budget_total(self, team: str, period: str, unit: Unit) -> int:
        """What `team` was granted of `unit` for `period`, net of negative grants."""
        row = first_row(
            self._con.execute(
                "SELECT coalesce(-sum(balance), 0) FROM balances "
                "WHERE account = ? AND period = ? AND unit = ?",
                [budget_account(team), period, unit.value],
            )
        )
        return int(row[0]) if row else 0

    def _read_open_holds(self) -> dict[HoldKey, OpenHold]:
        rows = self._con.execute(
            "SELECT job_id, unit, team, project, amount, expires_us, placed_by FROM open_holds"
        ).fetchall()
        holds = [
            OpenHold(str(j), Unit(u), str(t), p, int(a), int(e), str(b))
            for j, u, t, p, a, e, b in rows
        ]
        return {h.key: h for h in holds}

    def closed_period_labels(self) -> frozenset[str]:
        if self._closed_cache is None:  # read once per close: only this writer closes
            rows = self._con.execute("SELECT period FROM closed_periods").fetchall()
            self._closed_cache = frozenset(str(r[0]) for r in rows)
        return self._closed_cache

    def closed_periods(self) -> list[ClosedPeriod]:
        rows = self._con.execute(
            'SELECT period, event_id, effective_us, actor, reason, "rows", sha256, algorithm '
            "FROM closed_periods ORDER BY period"
        ).fetchall()
        return [
            ClosedPeriod(str(p), str(e), int(t), str(a), str(r), int(n), str(h), str(alg))
            for p, e, t, a, r, n, h, alg in rows
        ]

    def admin_entries(self) -> list[AppliedAdmin]:
        """Every applied admin event, in the order applied (read once per change: only this
        writer appends to the log)."""
        if self._admin_cache is None:
            rows = self._con.execute("SELECT entry FROM admin_log ORDER BY seq").fetchall()
            self._admin_cache = tuple(applied_from_dict(orjson.loads(r[0])) for r in rows)
        return list(self._admin_cache)

    def admin_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` are applied admin events (kept for good, unlike `seen_events`)."""
        if not ids:
            return set()
        self._con.register("batch_admin_ids", pa.table({"event_id": list(ids)}))
        try:
            rows = self._con.execute(
                "SELECT a.event_id FROM admin_log a SEMI JOIN batch_admin_ids b USING (event_id)"
            ).fetchall()
        finally:
            self._con.unregister("batch_admin_ids")
        return {str(r[0]) for r in rows}

    def admin_view(self) -> AdminView:
        return AdminView.from_log(self.admin_entries())

    def price_book(self, default: PriceBook) -> PriceBook:
        """`default` (the configuration's book) plus every applied `PriceSet`."""
        return self.admin_view().price_book(default)

    def reversed_by(self, txn_id: str) -> str | None:
        row = first_row(
            self._con.execute("SELECT reversed_by FROM reversals WHERE txn_id = ?", [txn_id])
        )
        return str(row[0]) if row else None

    def find_transaction(self, txn_id: str) -> Transaction | None:
        """A committed transaction, from the hot rows or the sealed segments."""
        rows = self._con.execute(
            f"SELECT {POSTING_COLUMNS_SQL} FROM {self._all_postings_sql()} "
            "WHERE txn_id = ? ORDER BY leg",
            [txn_id],
        ).fetchall()
        return transaction_from_rows(rows)

    def export_admin_log(self) -> None:
        """Write the readers' copy of the admin log (`segments/admin-log.json`)."""
        write_admin_log(self.segments_root, self.admin_entries())
        self._admin_log_exported = True

    def export_closed_periods(self) -> int:
        """Write the record of every closed period that has none yet; how many were written."""
        return sum(write_closed_period(self.segments_root, c) for c in self.closed_periods())

    # ------------------------------------------------------------------ sealing

    def seal(self, compact_below_rows: int = 500_000, compact_min_segments: int = 8) -> SealResult:
        """Seal every committed, unsealed range into segments and archive segments; then compact
        small ones of each.

        The archive manifest is written before the postings manifest, so the archive never lags
        the postings a reader sees; an interrupted seal leaves its ranges unsealed, and the next
        one writes the same files again.
        """
        result = SealResult()
        con = self._con
        groups = con.execute(
            'SELECT incarnation, topic, "partition", min(first_offset), max(last_offset) '
            "FROM source_ranges WHERE NOT sealed GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        if groups:
            entries = {s.path: s for s in self.manifest.load()}
            archive = {s.path: s for s in self.archive_manifest.load()}
            for incarnation, topic, partition, first, last in groups:
                info = self._segments.write_segment(incarnation, topic, partition, first, last)
                entries[info.path] = info
                result.sealed.append(info)
                kept = self._segments.seal_range(
                    self._segments.archive, incarnation, topic, partition, first, last
                )
                if kept is not None:  # a range committed without its messages has none
                    archive[kept.path] = kept
                    result.archived.append(kept)
            self.archive_manifest.save(archive.values())
            self.manifest.save(entries.values())
            con.execute("BEGIN TRANSACTION")
            try:
                for incarnation, topic, partition, first, last in groups:
                    params = [incarnation, topic, partition, first, last]
                    con.execute(
                        "DELETE FROM postings WHERE incarnation = ? AND src_topic = ? "
                        "AND src_partition = ? AND src_offset BETWEEN ? AND ?",
                        params,
                    )
                    con.execute(
                        "DELETE FROM raw_events WHERE incarnation = ? AND topic = ? "
                        'AND "partition" = ? AND "offset" BETWEEN ? AND ?',
                        params,
                    )
                    con.execute(
                        "UPDATE source_ranges SET sealed = TRUE WHERE incarnation = ? "
                        'AND topic = ? AND "partition" = ? AND first_offset >= ? '
                        "AND last_offset <= ?",
                        params,
                    )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        result.compacted = self.compact(compact_below_rows, compact_min_segments)
        result.archive_compacted = self._segments.align_archive()
        self._segments.remove_unlisted_files()
        self.export_closed_periods()  # after sealing: a closed period's rows are all sealed now
        if not self._admin_log_exported:
            self.export_admin_log()
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
        """Forget applied event ids older than `window_us` before the newest one; returns how many.

        The dedupe window is measured in sample time, so replaying old data dedupes the same way
        as live data.
        """
        self._seen_set()
        if self._newest_seen is None:
            return 0
        return self.prune_seen_before(self._newest_seen - window_us)

    def prune_seen_before(self, cutoff_us: int) -> int:
        """Forget applied event ids whose event time is before `cutoff_us`; returns how many.

        A prune that forgot anything is recorded with the next archived batch (the greatest
        cutoff since the previous batch: with no batch between them, prunes compose to it), so
        a rebuild forgets the same ids before applying that batch.
        """
        con = self._con
        pruned = max(cutoff_us, self._pruned_before or cutoff_us)
        con.execute("BEGIN TRANSACTION")
        try:
            rows = con.execute(
                "DELETE FROM seen_events WHERE time_us < ? RETURNING event_id", [cutoff_us]
            ).fetchall()
            if rows:
                self._set_meta("pruned_before_us", pruned)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if rows:
            self._pruned_before = pruned
            if self._seen is not None:
                self._seen.difference_update(str(r[0]) for r in rows)
        return len(rows)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> DuckDBStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
