"""The ledger store: the single writer's hot DuckDB, its exactly-once bookkeeping, and sealing.

The writer owns `<data_dir>/hot.duckdb`; nothing else opens it. One `commit` is one DuckDB
transaction holding, together:
- the postings of the batch's new transactions,
- the ids of the events applied (`seen_events`, the dedupe set),
- the source offset ranges consumed (`source_ranges`, per broker incarnation and partition),
- the batch's dead letters,
- the projections that follow from the batch: the running `balances` per (account, unit,
  period), the open holds per job, the applied admin events (`admin_log`), reversed
  transactions, closed periods with their checksums, and the outbox messages to publish
  (alerts, dead letters, changed balances).
So after a crash either all of a batch is in the store or none of it is, and `applied_offsets`
tells a restarted consumer exactly where the store stands.

A closed period never takes another posting: `commit` refuses a transaction booked into one
(the ingest books late data into the next open period first). Closing a period records the
checksum of its postings (`ledger.closing`), so a close must be committed with nothing left
unsealed; `seal` then writes the period's record beside the segments for `verify`.

`seal` moves committed postings out to immutable Parquet segments (see `ledger.segments`) and
then drops them from the hot tables; `compact` merges runs of small segments. Both are safe to
interrupt at any point and to run again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from ledger.accounts import AccountKind, budget_account
from ledger.admin import (
    AdminView,
    AppliedAdmin,
    PeriodClosed,
    applied_from_dict,
    applied_to_dict,
    write_admin_log,
)
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
from ledger.closing import ClosedPeriod, period_checksum, write_closed_period
from ledger.errors import StoreError
from ledger.events import DeadLetter
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState, state_from_row, state_to_row
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import PriceBook
from ledger.segments import (
    Manifest,
    SegmentInfo,
    file_sha256,
    fsync_dir,
    segment_path,
)
from ledger.units import Unit

HOT_DB_NAME = "hot.duckdb"
SEGMENTS_DIR = "segments"

POSTINGS_SCHEMA = pa.schema(
    [
        ("txn_id", pa.string()),
        ("leg", pa.int16()),
        ("kind", pa.string()),
        ("account", pa.string()),
        ("unit", pa.string()),
        ("amount", pa.int64()),
        ("team", pa.string()),
        ("project", pa.string()),
        ("user", pa.string()),
        ("job_id", pa.string()),
        ("cost_centre", pa.string()),
        ("gpu_uuid", pa.string()),
        ("model", pa.string()),
        ("pool", pa.string()),
        ("node", pa.string()),
        ("start_us", pa.int64()),
        ("end_us", pa.int64()),
        ("cause", pa.string()),
        ("incarnation", pa.string()),
        ("src_topic", pa.string()),
        ("src_partition", pa.int32()),
        ("src_offset", pa.int64()),
        ("period", pa.string()),
        ("util_pct", pa.int16()),
        ("idle", pa.bool_()),
    ]
)

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
    committed_at_us BIGINT NOT NULL, sealed BOOLEAN NOT NULL DEFAULT FALSE
);
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
CREATE TABLE IF NOT EXISTS admin_log (
    seq BIGINT NOT NULL, event_id VARCHAR PRIMARY KEY, type VARCHAR NOT NULL,
    effective_us BIGINT NOT NULL, entry VARCHAR NOT NULL, applied_at_us BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS closed_periods (
    period VARCHAR PRIMARY KEY, event_id VARCHAR NOT NULL, effective_us BIGINT NOT NULL,
    actor VARCHAR NOT NULL, reason VARCHAR NOT NULL, "rows" BIGINT NOT NULL,
    sha256 VARCHAR NOT NULL, algorithm VARCHAR NOT NULL, closed_at_us BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS reversals (txn_id VARCHAR PRIMARY KEY, reversed_by VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE SEQUENCE IF NOT EXISTS publish_seq;
"""
_BALANCES_VERSION = "1"
_COLUMNS = ", ".join(f'"{name}"' for name in POSTINGS_SCHEMA.names)
# Kinds whose interval is chosen by a person (an effective time, a period): their dedupe time
# is capped at the newest applied event, so a future date cannot age out every sample id.
_ADMIN_KINDS = (TransactionKind.BUDGET_GRANT, TransactionKind.ADJUSTMENT)

PartitionKey = tuple[str, int]  # (topic, partition)


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
    - `admin`: admin events applied (a `PeriodClosed` applied closes its period);
    - `reversals`: (reversed transaction, reversing transaction);
    - `seen`: ids (and event times) of events applied without a transaction of their own.
    """

    holds: Sequence[OpenHold] = ()
    admin: Sequence[AppliedAdmin] = ()
    reversals: Sequence[tuple[str, str]] = ()
    seen: Sequence[tuple[str, int]] = ()


@dataclass(slots=True)
class SealResult:
    sealed: list[SegmentInfo] = field(default_factory=list)
    compacted: list[SegmentInfo] = field(default_factory=list)


def _now_us() -> int:
    return time.time_ns() // 1_000


_TXN_COLUMNS = (
    "txn_id",
    "kind",
    "gpu_uuid",
    "model",
    "pool",
    "node",
    "start_us",
    "end_us",
    "cause",
    "src_topic",
    "src_partition",
    "src_offset",
    "period",
    "util_pct",
    "idle",
)


def transactions_to_arrow(items: Sequence[SourcedTransaction], incarnation: str) -> pa.Table:
    """Column-wise postings of `items`, in the hot table's and the segments' schema.

    Transaction-level columns are built once per transaction and repeated per posting by Arrow
    (`take`), so Python touches each posting only for its own fields.
    """
    txn_id: list[str] = []
    kind: list[str] = []
    gpu: list[str | None] = []
    model: list[str | None] = []
    pool: list[str | None] = []
    node: list[str | None] = []
    start: list[int] = []
    end: list[int] = []
    cause: list[str] = []
    topic: list[str] = []
    partition: list[int] = []
    offset: list[int] = []
    period: list[str] = []
    util: list[int | None] = []
    idle: list[bool] = []
    owner_index: list[int] = []
    leg: list[int] = []
    account: list[str] = []
    unit: list[str] = []
    amount: list[int] = []
    team: list[str | None] = []
    project: list[str | None] = []
    user: list[str | None] = []
    job: list[str | None] = []
    centre: list[str | None] = []
    for index, item in enumerate(items):
        txn = item.txn
        txn_id.append(txn.txn_id)
        kind.append(txn.kind.value)
        gpu.append(txn.gpu_uuid or None)  # admin and hold transactions are about no GPU
        model.append(txn.model or None)
        pool.append(txn.pool or None)
        node.append(txn.node or None)
        start.append(txn.start_us)
        end.append(txn.end_us)
        cause.append(" ".join(txn.cause))
        topic.append(item.topic)
        partition.append(item.partition)
        offset.append(item.offset)
        period.append(txn.period)
        util.append(txn.util_pct)
        idle.append(txn.idle)
        for number, p in enumerate(txn.postings):
            owner_index.append(index)
            leg.append(number)
            account.append(p.account)
            unit.append(p.unit.value)
            amount.append(p.amount)
            team.append(p.team)
            project.append(p.project)
            user.append(p.user)
            job.append(p.job_id)
            centre.append(p.cost_centre)
    per_txn = pa.table(
        [
            txn_id,
            kind,
            gpu,
            model,
            pool,
            node,
            start,
            end,
            cause,
            topic,
            partition,
            offset,
            period,
            util,
            idle,
        ],
        schema=pa.schema([POSTINGS_SCHEMA.field(name) for name in _TXN_COLUMNS]),
    ).take(pa.array(owner_index, pa.int32()))
    rows = len(leg)
    columns = {
        **{name: per_txn.column(name) for name in _TXN_COLUMNS},
        "leg": pa.array(leg, pa.int16()),
        "account": pa.array(account, pa.string()),
        "unit": pa.array(unit, pa.string()),
        "amount": pa.array(amount, pa.int64()),
        "team": pa.array(team, pa.string()),
        "project": pa.array(project, pa.string()),
        "user": pa.array(user, pa.string()),
        "job_id": pa.array(job, pa.string()),
        "cost_centre": pa.array(centre, pa.string()),
        "incarnation": pa.array([incarnation] * rows, pa.string()),
    }
    return pa.table([columns[name] for name in POSTINGS_SCHEMA.names], schema=POSTINGS_SCHEMA)


class LedgerStore:
    """The single writer of one ledger data directory."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.segments_root = self.data_dir / SEGMENTS_DIR
        self.segments_root.mkdir(exist_ok=True)
        self.manifest = Manifest(self.segments_root)
        db = self.data_dir / HOT_DB_NAME
        try:
            self._con = duckdb.connect(str(db))
        except duckdb.IOException as exc:
            raise StoreError(f"cannot open the ledger store {db}: {exc}") from exc
        self._con.execute(_DDL)
        self._admin_log_exported = False
        version = _first(
            self._con.execute("SELECT value FROM ledger_meta WHERE key = 'balances_version'")
        )
        if version is None or version[0] != _BALANCES_VERSION:
            self.rebuild_balances()  # a store from before the balances table: fold once

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
    ) -> CommitResult:
        """Apply one batch atomically; transactions whose id was already applied are dropped.

        Idle-detector states replace the stored ones, `changes` are applied, the balances move
        by the new postings, and outbox messages are queued (with, when `balances_topic` is
        set, one message per changed account), all in the same transaction as the postings
        they follow from. Raises StoreError for a transaction booked into a closed period, or a
        close committed while committed rows are still unsealed.
        """
        con = self._con
        now = _now_us()
        changes = changes or StateChanges()
        closing = [
            e
            for e in changes.admin
            if isinstance(e.envelope.data, PeriodClosed) and e.outcome == "applied"
        ]
        con.execute("BEGIN TRANSACTION")
        try:
            fresh = self._drop_seen(transactions)
            self._refuse_closed(fresh, bool(closing))
            table = transactions_to_arrow(fresh, incarnation)
            if table.num_rows:
                con.register("batch_postings", table)
                con.execute("INSERT INTO postings SELECT * FROM batch_postings")
                con.execute(
                    "INSERT INTO balances SELECT account, unit, period, sum(amount) "
                    "FROM batch_postings GROUP BY ALL "
                    "ON CONFLICT DO UPDATE SET balance = balance + excluded.balance"
                )
                con.unregister("batch_postings")
            self._insert_seen(fresh, changes.seen)
            if ranges:
                con.executemany(
                    "INSERT INTO source_ranges VALUES (?, ?, ?, ?, ?, ?, FALSE)",
                    [(incarnation, r.topic, r.partition, r.first, r.last, now) for r in ranges],
                )
            if idle_states:
                con.executemany(
                    "DELETE FROM idle_state WHERE subject = ?", [(s.subject,) for s in idle_states]
                )
                con.executemany(
                    "INSERT INTO idle_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [state_to_row(s) for s in idle_states],
                )
            self._apply_changes(changes, now)
            closed = tuple(self._close(entry, now) for entry in closing)
            if outbox:
                con.executemany(
                    "INSERT INTO outbox VALUES (?, ?, ?, ?, ?, FALSE) ON CONFLICT DO NOTHING",
                    [(m.id, m.topic, m.key, m.value, now) for m in outbox],
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
            if dead_letters:
                con.executemany(
                    "INSERT INTO dead_letters VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if changes.admin:
            self.export_admin_log()
        return CommitResult(
            transactions=len(fresh),
            postings=table.num_rows,
            duplicates=len(transactions) - len(fresh),
            dead_letters=len(dead_letters),
            balances_published=published,
            closed=closed,
        )

    def _refuse_closed(self, fresh: Sequence[SourcedTransaction], closing: bool) -> None:
        """The commit guards: nothing posts into a closed period; a close finds all sealed."""
        closed = self.closed_period_labels()
        if closed:
            late = sorted({t.txn.period for t in fresh} & closed)
            if late:
                raise StoreError(
                    f"period {', '.join(late)} is closed: nothing may be booked into it"
                )
        if closing:
            row = _first(self._con.execute("SELECT count(*) FROM source_ranges WHERE NOT sealed"))
            if row and row[0]:
                raise StoreError("seal the store before committing a period close")

    def _insert_seen(
        self, fresh: Sequence[SourcedTransaction], extra: Sequence[tuple[str, int]]
    ) -> None:
        if not fresh and not extra:
            return
        ids = [t.txn.txn_id for t in fresh] + [i for i, _ in extra]
        times = [t.txn.end_us for t in fresh] + [t for _, t in extra]
        if any(t.txn.kind in _ADMIN_KINDS for t in fresh) or extra:
            row = _first(self._con.execute("SELECT max(time_us) FROM seen_events"))
            newest = row[0] if row and row[0] is not None else None
            if newest is not None:
                kinds = [t.txn.kind for t in fresh] + [None] * len(extra)
                times = [
                    min(t, newest) if k in _ADMIN_KINDS or k is None else t
                    for t, k in zip(times, kinds, strict=True)
                ]
        self._con.register("batch_seen", pa.table({"event_id": ids, "time_us": times}))
        self._con.execute("INSERT INTO seen_events SELECT * FROM batch_seen")
        self._con.unregister("batch_seen")

    def _apply_changes(self, changes: StateChanges, now: int) -> None:
        con = self._con
        if changes.holds:
            con.executemany(
                "DELETE FROM open_holds WHERE job_id = ? AND unit = ?",
                [(h.job_id, h.unit.value) for h in changes.holds],
            )
            kept = [h for h in changes.holds if h.amount]
            if kept:
                con.executemany(
                    "INSERT INTO open_holds VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            h.job_id,
                            h.unit.value,
                            h.team,
                            h.project,
                            h.amount,
                            h.expires_us,
                            h.placed_by,
                        )
                        for h in kept
                    ],
                )
        if changes.admin:
            row = _first(con.execute("SELECT coalesce(max(seq), 0) FROM admin_log"))
            seq = int(row[0]) if row else 0
            con.executemany(
                "INSERT INTO admin_log VALUES (?, ?, ?, ?, ?, ?)",
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
        if changes.reversals:
            con.executemany("INSERT INTO reversals VALUES (?, ?)", list(changes.reversals))

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
        return closed.period

    def _queue_balances(self, accounts: set[str], topic: str, now: int) -> int:
        """Queue one message per changed account (and per affected team's budget account);
        a queued message not yet sent for the same account is superseded."""
        con = self._con
        row = _first(
            con.execute(
                "SELECT max(period) FILTER (account LIKE 'capacity:%'), max(period) FROM balances"
            )
        )
        current = (row[0] or row[1]) if row else None
        meta = _first(con.execute("SELECT value FROM ledger_meta WHERE key = 'current_period'"))
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
        seq_row = _first(con.execute("SELECT nextval('publish_seq')"))
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
        con.executemany(
            'DELETE FROM outbox WHERE NOT sent AND topic = ? AND "key" = ?',
            [(topic, m[2]) for m in messages],
        )
        con.executemany("INSERT INTO outbox VALUES (?, ?, ?, ?, ?, FALSE)", messages)
        if moved:
            con.execute(
                "INSERT INTO ledger_meta VALUES ('current_period', ?) "
                "ON CONFLICT DO UPDATE SET value = excluded.value",
                [current],
            )
        return len(messages)

    def seen_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of `ids` have been applied already."""
        if not ids:
            return set()
        self._con.register("batch_ids", pa.table({"event_id": list(ids)}))
        try:
            rows = self._con.execute(
                "SELECT s.event_id FROM seen_events s SEMI JOIN batch_ids b USING (event_id)"
            ).fetchall()
        finally:
            self._con.unregister("batch_ids")
        return {row[0] for row in rows}

    def idle_states(self, subjects: Sequence[str]) -> dict[str, GpuIdleState]:
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
            self._con.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])

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
        listed = ", ".join(f"'{_sql_path(f)}'" for f in files)
        return f"read_parquet([{listed}])"

    def _all_postings_sql(self) -> str:
        """Every committed posting: the hot rows and the sealed segments (disjoint once sealing
        has finished, which holds whenever the writer is not inside `seal`)."""
        sealed = self._sealed_sql()
        if sealed is None:
            return "postings"
        return f"(SELECT {_COLUMNS} FROM postings UNION ALL SELECT {_COLUMNS} FROM {sealed})"

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
        row = _first(
            self._con.execute(
                "SELECT coalesce(-sum(balance), 0) FROM balances "
                "WHERE account = ? AND period = ? AND unit = ?",
                [budget_account(team), period, unit.value],
            )
        )
        return int(row[0]) if row else 0

    def open_holds(self) -> dict[HoldKey, OpenHold]:
        rows = self._con.execute(
            "SELECT job_id, unit, team, project, amount, expires_us, placed_by FROM open_holds"
        ).fetchall()
        holds = [
            OpenHold(str(j), Unit(u), str(t), p, int(a), int(e), str(b))
            for j, u, t, p, a, e, b in rows
        ]
        return {h.key: h for h in holds}

    def closed_period_labels(self) -> frozenset[str]:
        rows = self._con.execute("SELECT period FROM closed_periods").fetchall()
        return frozenset(str(r[0]) for r in rows)

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
        """Every applied admin event, in the order applied."""
        rows = self._con.execute("SELECT entry FROM admin_log ORDER BY seq").fetchall()
        return [applied_from_dict(orjson.loads(r[0])) for r in rows]

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
        row = _first(
            self._con.execute("SELECT reversed_by FROM reversals WHERE txn_id = ?", [txn_id])
        )
        return str(row[0]) if row else None

    def find_transaction(self, txn_id: str) -> Transaction | None:
        """A committed transaction, from the hot rows or the sealed segments."""
        rows = self._con.execute(
            f"SELECT {_COLUMNS} FROM {self._all_postings_sql()} WHERE txn_id = ? ORDER BY leg",
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
        """Seal every committed, unsealed range into segments; then compact small segments."""
        result = SealResult()
        con = self._con
        groups = con.execute(
            'SELECT incarnation, topic, "partition", min(first_offset), max(last_offset) '
            "FROM source_ranges WHERE NOT sealed GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        if groups:
            entries = {s.path: s for s in self.manifest.load()}
            for incarnation, topic, partition, first, last in groups:
                info = self._write_segment(incarnation, topic, partition, first, last)
                entries[info.path] = info
                result.sealed.append(info)
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
        self.remove_unlisted_files()
        self.export_closed_periods()  # after sealing: a closed period's rows are all sealed now
        if not self._admin_log_exported:
            self.export_admin_log()
        return result

    def _write_segment(
        self, incarnation: str, topic: str, partition: int, first: int, last: int
    ) -> SegmentInfo:
        rel = segment_path(incarnation, topic, partition, first, last)
        query = (
            "SELECT * FROM postings WHERE incarnation = $inc AND src_topic = $topic "
            "AND src_partition = $part AND src_offset BETWEEN $first AND $last "
            "ORDER BY src_offset, txn_id, leg"
        )
        params = {
            "inc": incarnation,
            "topic": topic,
            "part": partition,
            "first": first,
            "last": last,
        }
        return self._copy_to_segment(rel, query, params, incarnation, topic, partition, first, last)

    def _copy_to_segment(
        self,
        rel: str,
        query: str,
        params: dict[str, object],
        incarnation: str,
        topic: str,
        partition: int,
        first: int,
        last: int,
    ) -> SegmentInfo:
        target = self.segments_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        con = self._con
        con.execute(
            f"COPY ({query}) TO '{_sql_path(tmp)}' "
            "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)",
            params,
        )
        stats = _first(
            con.execute(
                f"SELECT count(*), min(start_us), max(end_us) FROM read_parquet('{_sql_path(tmp)}')"
            )
        )
        assert stats is not None
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        tmp.replace(target)
        fsync_dir(target.parent)
        return SegmentInfo(
            path=rel,
            incarnation=incarnation,
            topic=topic,
            partition=partition,
            first_offset=first,
            last_offset=last,
            rows=int(stats[0]),
            sha256=file_sha256(target),
            min_start_us=stats[1],
            max_end_us=stats[2],
        )

    def compact(self, below_rows: int, min_segments: int) -> list[SegmentInfo]:
        """Merge runs of ≥ `min_segments` adjacent small segments of a partition into one."""
        segments = self.manifest.load()
        by_partition: dict[tuple[str, str, int], list[SegmentInfo]] = {}
        for seg in segments:
            by_partition.setdefault((seg.incarnation, seg.topic, seg.partition), []).append(seg)
        runs: list[list[SegmentInfo]] = []
        for segs in by_partition.values():
            segs.sort(key=lambda s: s.first_offset)
            run: list[SegmentInfo] = []
            total = 0
            for seg in segs:
                adjacent = not run or run[-1].last_offset + 1 == seg.first_offset
                if seg.rows < below_rows and adjacent and total + seg.rows <= below_rows:
                    run.append(seg)
                    total += seg.rows
                    continue
                if len(run) >= min_segments:
                    runs.append(run)
                run, total = ([seg], seg.rows) if seg.rows < below_rows else ([], 0)
            if len(run) >= min_segments:
                runs.append(run)
        if not runs:
            return []
        keep = {s.path: s for s in segments}
        merged: list[SegmentInfo] = []
        for run in runs:
            head, tail = run[0], run[-1]
            files = ", ".join(f"'{_sql_path(self.segments_root / s.path)}'" for s in run)
            query = f"SELECT * FROM read_parquet([{files}]) ORDER BY src_offset, txn_id, leg"
            rel = segment_path(
                head.incarnation, head.topic, head.partition, head.first_offset, tail.last_offset
            )
            info = self._copy_to_segment(
                rel,
                query,
                {},
                head.incarnation,
                head.topic,
                head.partition,
                head.first_offset,
                tail.last_offset,
            )
            if info.rows != sum(s.rows for s in run):
                raise StoreError(f"compaction of {rel} lost rows")
            for seg in run:
                keep.pop(seg.path, None)
            keep[info.path] = info
            merged.append(info)
        self.manifest.save(keep.values())
        return merged

    def remove_unlisted_files(self) -> int:
        """Delete segment files the manifest does not name (leftovers of interrupted work)."""
        listed = {self.segments_root / s.path for s in self.manifest.load()}
        removed = 0
        for path in self.segments_root.rglob("*.parquet"):
            if path not in listed:
                path.unlink(missing_ok=True)
                removed += 1
        for path in self.segments_root.rglob(".*.tmp-*"):
            path.unlink(missing_ok=True)
        return removed

    # ------------------------------------------------------------------ inspection

    def hot_rows(self) -> int:
        row = _first(self._con.execute("SELECT count(*) FROM postings"))
        return int(row[0]) if row else 0

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
        rows = self._con.execute(
            "DELETE FROM seen_events WHERE time_us < "
            "(SELECT max(time_us) FROM seen_events) - ? RETURNING 1",
            [window_us],
        ).fetchall()
        return len(rows)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of a result, read to its end so the connection is free for the next call."""
    rows = result.fetchall()
    return rows[0] if rows else None


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


_INDEX = {name: i for i, name in enumerate(POSTINGS_SCHEMA.names)}


def transaction_from_rows(rows: Sequence[tuple[object, ...]]) -> Transaction | None:
    """Rebuild a transaction from its posting rows (in the postings schema's column order)."""
    if not rows:
        return None
    first = rows[0]

    def col(row: tuple[object, ...], name: str) -> object:
        return row[_INDEX[name]]

    def text(row: tuple[object, ...], name: str) -> str | None:
        value = col(row, name)
        return None if value is None else str(value)

    postings = tuple(
        Posting(
            account=str(col(r, "account")),
            unit=Unit(str(col(r, "unit"))),
            amount=int(str(col(r, "amount"))),
            team=text(r, "team"),
            project=text(r, "project"),
            user=text(r, "user"),
            job_id=text(r, "job_id"),
            cost_centre=text(r, "cost_centre"),
        )
        for r in rows
    )
    util = col(first, "util_pct")
    return Transaction(
        txn_id=str(col(first, "txn_id")),
        kind=TransactionKind(str(col(first, "kind"))),
        start_us=int(str(col(first, "start_us"))),
        end_us=int(str(col(first, "end_us"))),
        gpu_uuid=text(first, "gpu_uuid") or "",
        model=text(first, "model") or "",
        pool=text(first, "pool") or "",
        node=text(first, "node") or "",
        postings=postings,
        cause=tuple(str(col(first, "cause")).split(" ")),
        period=str(col(first, "period")),
        util_pct=None if util is None else int(str(util)),
        idle=bool(col(first, "idle")),
    )


def find_sealed_transaction(data_dir: Path | str, txn_id: str) -> Transaction | None:
    """A transaction in the sealed segments, read with a connection of its own (for readers)."""
    files = Manifest(Path(data_dir) / SEGMENTS_DIR).files()
    if not files:
        return None
    listed = ", ".join(f"'{_sql_path(f)}'" for f in files)
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            f"SELECT {_COLUMNS} FROM read_parquet([{listed}]) WHERE txn_id = ? ORDER BY leg",
            [txn_id],
        ).fetchall()
    finally:
        con.close()
    return transaction_from_rows(rows)


def ranges_from_offsets(offsets: Iterable[tuple[str, int, int]]) -> list[OffsetRange]:
    """Collapse (topic, partition, offset) triples into one range per partition."""
    bounds: dict[PartitionKey, tuple[int, int]] = {}
    for topic, partition, offset in offsets:
        key = (topic, partition)
        lo, hi = bounds.get(key, (offset, offset))
        bounds[key] = (min(lo, offset), max(hi, offset))
    return [OffsetRange(t, p, lo, hi) for (t, p), (lo, hi) in sorted(bounds.items())]
