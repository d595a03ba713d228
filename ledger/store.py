"""The ledger store: the single writer's hot DuckDB, its exactly-once bookkeeping, and sealing.

The writer owns `<data_dir>/hot.duckdb`; nothing else opens it. One `commit` is one DuckDB
transaction holding, together:
- the postings of the batch's new transactions,
- the ids of the events applied (`seen_events`, the dedupe set),
- the source offset ranges consumed (`source_ranges`, per broker incarnation and partition),
- the batch's dead letters.
So after a crash either all of a batch is in the store or none of it is, and `applied_offsets`
tells a restarted consumer exactly where the store stands.

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

import duckdb
import pyarrow as pa

from ledger.errors import StoreError
from ledger.events import DeadLetter
from ledger.idle import GpuIdleState, state_from_row, state_to_row
from ledger.postings import Transaction
from ledger.segments import (
    Manifest,
    SegmentInfo,
    file_sha256,
    fsync_dir,
    segment_path,
)

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
"""

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
    gpu: list[str] = []
    model: list[str] = []
    pool: list[str] = []
    node: list[str] = []
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
        gpu.append(txn.gpu_uuid)
        model.append(txn.model)
        pool.append(txn.pool)
        node.append(txn.node)
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
    ) -> CommitResult:
        """Apply one batch atomically; transactions whose id was already applied are dropped.

        Idle-detector states replace the stored ones, and outbox messages are queued, in the same
        transaction as the postings they follow from.
        """
        con = self._con
        now = _now_us()
        con.execute("BEGIN TRANSACTION")
        try:
            fresh = self._drop_seen(transactions)
            table = transactions_to_arrow(fresh, incarnation)
            if table.num_rows:
                con.register("batch_postings", table)
                con.execute("INSERT INTO postings SELECT * FROM batch_postings")
                con.unregister("batch_postings")
            if fresh:
                seen = pa.table(
                    {
                        "event_id": [t.txn.txn_id for t in fresh],
                        "time_us": [t.txn.end_us for t in fresh],
                    }
                )
                con.register("batch_seen", seen)
                con.execute("INSERT INTO seen_events SELECT * FROM batch_seen")
                con.unregister("batch_seen")
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
            if outbox:
                con.executemany(
                    "INSERT INTO outbox VALUES (?, ?, ?, ?, ?, FALSE) ON CONFLICT DO NOTHING",
                    [(m.id, m.topic, m.key, m.value, now) for m in outbox],
                )
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
        return CommitResult(
            transactions=len(fresh),
            postings=table.num_rows,
            duplicates=len(transactions) - len(fresh),
            dead_letters=len(dead_letters),
        )

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
        if ids:
            self._con.executemany("UPDATE outbox SET sent = TRUE WHERE id = ?", [(i,) for i in ids])

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
        stats = con.execute(
            f"SELECT count(*), min(start_us), max(end_us) FROM read_parquet('{_sql_path(tmp)}')"
        ).fetchone()
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
        row = self._con.execute("SELECT count(*) FROM postings").fetchone()
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


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def ranges_from_offsets(offsets: Iterable[tuple[str, int, int]]) -> list[OffsetRange]:
    """Collapse (topic, partition, offset) triples into one range per partition."""
    bounds: dict[PartitionKey, tuple[int, int]] = {}
    for topic, partition, offset in offsets:
        key = (topic, partition)
        lo, hi = bounds.get(key, (offset, offset))
        bounds[key] = (min(lo, offset), max(hi, offset))
    return [OffsetRange(t, p, lo, hi) for (t, p), (lo, hi) in sorted(bounds.items())]
