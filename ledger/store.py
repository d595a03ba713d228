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
  it), so the ledger can be rebuilt from them at any time (`ledger.rebuild`),
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
of the same offset ranges out to archive segments (see `ledger.segments`), then drops both from
the hot tables; `compact` merges runs of small postings segments, and the archive segments
within each merged range are merged alike, so archive and postings segments cover the same
ranges. Both are safe to interrupt at any point and to run again.

Replaying the archive in batch order reproduces the ledger exactly: a batch is applied as one
unit, in its original message order, and everything a batch's fold reads is itself a fold of
the earlier batches, except the dedupe window, which the worker prunes between batches. A prune
that forgot ids is therefore recorded with the next archived batch (`pruned_before_us`), and a
rebuild forgets the same ids at the same point.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
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
from ledger.closing import ClosedPeriod, period_checksum, write_closed_period
from ledger.errors import StoreError
from ledger.events import DeadLetter, Owner
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
    summarise_segment,
)
from ledger.units import Unit

HOT_DB_NAME = "hot.duckdb"
SEGMENTS_DIR = "segments"
ARCHIVE_DIR = "archive"

RAW_SCHEMA = pa.schema(
    [
        ("batch_seq", pa.int64()),
        ("batch_index", pa.int32()),
        ("incarnation", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("value_codec", pa.string()),
        ("value_size", pa.int64()),
        ("pruned_before_us", pa.int64()),
    ]
)
# A value of at least this many bytes is kept zstd-compressed (`value_codec` 'zstd', the
# original length in `value_size`): packed backfill messages shrink ~14×, so the hot database
# and its WAL carry a fraction of the bytes; small real-time messages gain too little to pay
# for the call. Parquet compresses the segments (zstd) either way.
ARCHIVE_COMPRESS_FROM = 1024
ARCHIVE_CODEC = "zstd"
_ZSTD = pa.Codec(ARCHIVE_CODEC)

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
_COLUMNS = ", ".join(f'"{name}"' for name in POSTINGS_SCHEMA.names)
# Kinds whose interval is chosen by a person (an effective time, a period): their dedupe time
# is capped at the newest applied event, so a future date cannot age out every sample id.
_ADMIN_KINDS = (TransactionKind.BUDGET_GRANT, TransactionKind.ADJUSTMENT)

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
    - `seen`: ids (and event times) of events applied without a transaction of their own;
    - `timelines`: GPUs whose assignment timeline changed, each with its whole new timeline.
    """

    holds: Sequence[OpenHold] = ()
    admin: Sequence[AppliedAdmin] = ()
    reversals: Sequence[tuple[str, str]] = ()
    seen: Sequence[tuple[str, int]] = ()
    timelines: Mapping[str, tuple[Holding, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class SealResult:
    sealed: list[SegmentInfo] = field(default_factory=list)
    compacted: list[SegmentInfo] = field(default_factory=list)
    archived: list[SegmentInfo] = field(default_factory=list)
    archive_compacted: list[SegmentInfo] = field(default_factory=list)


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


def archive_to_arrow(
    messages: Sequence[ConsumedMessage], incarnation: str, batch_seq: int, pruned: int | None
) -> pa.Table:
    """The archive rows of one batch, in the hot table's and the archive segments' schema."""
    n = len(messages)
    values: list[bytes | None] = []
    codecs: list[str | None] = []
    sizes: list[int | None] = []
    for m in messages:
        value = m.value
        if value is not None and len(value) >= ARCHIVE_COMPRESS_FROM:
            values.append(_ZSTD.compress(value, asbytes=True))
            codecs.append(ARCHIVE_CODEC)
            sizes.append(len(value))
        else:
            values.append(value)
            codecs.append(None)
            sizes.append(None)
    return pa.table(
        [
            pa.array([batch_seq] * n, pa.int64()),
            pa.array(range(n), pa.int32()),
            pa.array([incarnation] * n, pa.string()),
            pa.array([m.topic for m in messages], pa.string()),
            pa.array([m.partition for m in messages], pa.int32()),
            pa.array([m.offset for m in messages], pa.int64()),
            pa.array([m.key for m in messages], pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(codecs, pa.string()),
            pa.array(sizes, pa.int64()),
            pa.array([pruned] * n, pa.int64()),
        ],
        schema=RAW_SCHEMA,
    )


def archived_value(value: bytes | None, codec: str | None, size: int | None) -> bytes | None:
    """A message value as consumed, from its archived form."""
    if codec is None or value is None:
        return value
    if codec != ARCHIVE_CODEC or size is None:
        raise StoreError(f"an archived value in unknown form: codec {codec!r}, size {size!r}")
    raw: bytes = _ZSTD.decompress(value, decompressed_size=size, asbytes=True)
    return raw


@dataclass(frozen=True, slots=True)
class _SealKind:
    """Where one kind of hot row (postings, archived messages) is sealed, and how."""

    table: str
    root: Path
    manifest: Manifest
    in_range: str  # the rows of one source range ($inc, $topic, $part, $first, $last)
    order: str  # the order of rows in a segment file
    stats: str  # rows, and the interval extent (or NULLs), of a written file


class LedgerStore:
    """The single writer of one ledger data directory."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.segments_root = self.data_dir / SEGMENTS_DIR
        self.segments_root.mkdir(exist_ok=True)
        self.manifest = Manifest(self.segments_root)
        self.archive_root = self.data_dir / ARCHIVE_DIR
        self.archive_root.mkdir(exist_ok=True)
        self.archive_manifest = Manifest(self.archive_root)
        self._postings_kind = _SealKind(
            "postings",
            self.segments_root,
            self.manifest,
            "incarnation = $inc AND src_topic = $topic AND src_partition = $part "
            "AND src_offset BETWEEN $first AND $last",
            "src_offset, txn_id, leg",
            "count(*), min(start_us), max(end_us)",
        )
        self._archive_kind = _SealKind(
            "raw_events",
            self.archive_root,
            self.archive_manifest,
            'incarnation = $inc AND topic = $topic AND "partition" = $part '
            'AND "offset" BETWEEN $first AND $last',
            '"offset"',
            "count(*), NULL, NULL",
        )
        db = self.data_dir / HOT_DB_NAME
        try:
            self._con = duckdb.connect(str(db))
        except duckdb.IOException as exc:
            raise StoreError(f"cannot open the ledger store {db}: {exc}") from exc
        self._con.execute(_DDL)
        self._admin_log_exported = False
        self._admin_cache: tuple[AppliedAdmin, ...] | None = None  # the admin log, as read
        self._closed_cache: frozenset[str] | None = None
        version = _first(
            self._con.execute("SELECT value FROM ledger_meta WHERE key = 'balances_version'")
        )
        if version is None or version[0] != _BALANCES_VERSION:
            self.rebuild_balances()  # a store from before the balances table: fold once
        row = _first(self._con.execute("SELECT max(batch_seq) FROM source_ranges"))
        self._batch_seq = int(row[0]) if row and row[0] is not None else 0
        pruned = self._meta("pruned_before_us")
        self._pruned_before: int | None = None if pruned is None else int(pruned)

    def _meta(self, key: str) -> str | None:
        row = _first(self._con.execute("SELECT value FROM ledger_meta WHERE key = ?", [key]))
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
    ) -> CommitResult:
        """Apply one batch atomically; transactions whose id was already applied are dropped.

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
        except BaseException:
            con.execute("ROLLBACK")
            self._admin_cache = self._closed_cache = None  # may hold what was rolled back
            raise
        if raw:
            self._batch_seq = seq
            self._pruned_before = None
        if changes.admin:
            self._admin_cache = self._closed_cache = None
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
            row = _first(con.execute("SELECT coalesce(max(seq), 0) FROM admin_log"))
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

    def gpu_timelines(self, gpu_uuids: Collection[str]) -> dict[str, tuple[Holding, ...]]:
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
                info = self._write_segment(incarnation, topic, partition, first, last)
                entries[info.path] = info
                result.sealed.append(info)
                kept = self._seal_range(
                    self._archive_kind, incarnation, topic, partition, first, last
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
        result.archive_compacted = self._align_archive()
        self.remove_unlisted_files()
        self.export_closed_periods()  # after sealing: a closed period's rows are all sealed now
        if not self._admin_log_exported:
            self.export_admin_log()
        return result

    def _write_segment(
        self, incarnation: str, topic: str, partition: int, first: int, last: int
    ) -> SegmentInfo:
        info = self._seal_range(self._postings_kind, incarnation, topic, partition, first, last)
        assert info is not None
        return info

    def _seal_range(
        self, kind: _SealKind, incarnation: str, topic: str, partition: int, first: int, last: int
    ) -> SegmentInfo | None:
        """Write the hot rows of one source range to their segment; None when there are none."""
        rel = segment_path(incarnation, topic, partition, first, last)
        query = f"SELECT * FROM {kind.table} WHERE {kind.in_range} ORDER BY {kind.order}"
        params = {
            "inc": incarnation,
            "topic": topic,
            "part": partition,
            "first": first,
            "last": last,
        }
        if kind is self._archive_kind:
            row = _first(
                self._con.execute(
                    f"SELECT count(*) FROM {kind.table} WHERE {kind.in_range}", params
                )
            )
            if not row or not row[0]:
                return None
        return self._copy_to_segment(
            kind, rel, query, params, incarnation, topic, partition, first, last
        )

    def _copy_to_segment(
        self,
        kind: _SealKind,
        rel: str,
        query: str,
        params: dict[str, object],
        incarnation: str,
        topic: str,
        partition: int,
        first: int,
        last: int,
    ) -> SegmentInfo:
        target = kind.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        con = self._con
        con.execute(
            f"COPY ({query}) TO '{_sql_path(tmp)}' "
            "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)",
            params,
        )
        stats = _first(con.execute(f"SELECT {kind.stats} FROM read_parquet('{_sql_path(tmp)}')"))
        assert stats is not None
        summary = summarise_segment(con, tmp) if kind is self._postings_kind else None
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
            summary=summary,
        )

    def compact(self, below_rows: int, min_segments: int) -> list[SegmentInfo]:
        """Merge runs of ≥ `min_segments` adjacent small segments of a partition into one."""
        return self._compact(self._postings_kind, below_rows, min_segments)

    def _compact(self, kind: _SealKind, below_rows: int, min_segments: int) -> list[SegmentInfo]:
        segments = kind.manifest.load()
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
            files = ", ".join(f"'{_sql_path(kind.root / s.path)}'" for s in run)
            query = f"SELECT * FROM read_parquet([{files}]) ORDER BY {kind.order}"
            rel = segment_path(
                head.incarnation, head.topic, head.partition, head.first_offset, tail.last_offset
            )
            info = self._copy_to_segment(
                kind,
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
        kind.manifest.save(keep.values())
        return merged

    def _align_archive(self) -> list[SegmentInfo]:
        """Merge the archive segments that lie within one postings segment into one of the same
        range and name, so the archive is cut as the postings are (compaction merges postings
        segments by their rows; archived messages are far fewer and larger than postings).
        Run on every seal, it also finishes an alignment a crash interrupted."""
        archive = self.archive_manifest.load()
        runs: list[tuple[SegmentInfo, list[SegmentInfo]]] = []
        for seg in self.manifest.load():
            parts = [
                a
                for a in archive
                if (a.incarnation, a.topic, a.partition)
                == (seg.incarnation, seg.topic, seg.partition)
                and seg.first_offset <= a.first_offset
                and a.last_offset <= seg.last_offset
            ]
            if len(parts) > 1:
                runs.append((seg, sorted(parts, key=lambda a: a.first_offset)))
        if not runs:
            return []
        kind = self._archive_kind
        keep = {a.path: a for a in archive}
        merged: list[SegmentInfo] = []
        for seg, parts in runs:
            files = ", ".join(f"'{_sql_path(kind.root / a.path)}'" for a in parts)
            info = self._copy_to_segment(
                kind,
                seg.path,
                f"SELECT * FROM read_parquet([{files}]) ORDER BY {kind.order}",
                {},
                seg.incarnation,
                seg.topic,
                seg.partition,
                seg.first_offset,
                seg.last_offset,
            )
            if info.rows != sum(a.rows for a in parts):
                raise StoreError(f"aligning the archive of {seg.path} lost messages")
            for part in parts:
                keep.pop(part.path, None)
            keep[info.path] = info
            merged.append(info)
        kind.manifest.save(keep.values())
        return merged

    def remove_unlisted_files(self) -> int:
        """Delete segment and archive files their manifest does not name (leftovers of
        interrupted work)."""
        removed = 0
        for kind in (self._postings_kind, self._archive_kind):
            listed = {kind.root / s.path for s in kind.manifest.load()}
            for path in kind.root.rglob("*.parquet"):
                if path not in listed:
                    path.unlink(missing_ok=True)
                    removed += 1
            for path in kind.root.rglob(".*.tmp-*"):
                path.unlink(missing_ok=True)
        return removed

    # ------------------------------------------------------------------ inspection

    def hot_rows(self) -> int:
        row = _first(self._con.execute("SELECT count(*) FROM postings"))
        return int(row[0]) if row else 0

    def hot_archived(self) -> int:
        """Archived messages not sealed yet."""
        row = _first(self._con.execute("SELECT count(*) FROM raw_events"))
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
        row = _first(self._con.execute("SELECT max(time_us) FROM seen_events"))
        if row is None or row[0] is None:
            return 0
        return self.prune_seen_before(int(row[0]) - window_us)

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
                "DELETE FROM seen_events WHERE time_us < ? RETURNING 1", [cutoff_us]
            ).fetchall()
            if rows:
                self._set_meta("pruned_before_us", pruned)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if rows:
            self._pruned_before = pruned
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
