"""Arrow row schemas of the ledger's tables and segments, and conversions to and from them.

`POSTINGS_SCHEMA` is the column order of the hot `postings` (the `posting_rows` table and the
usage rows `USAGE_POSTINGS_SQL` expands) and of every postings segment; `RAW_SCHEMA` that of
the raw-event archive. Conversions are column-wise: Python
touches each posting once, Arrow repeats transaction-level columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from ledger.errors import StoreError
from ledger.posting_columns import LEG_UNITS, ROW_FIELDS, PostingColumns
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.store.port import ConsumedMessage, SourcedTransaction
from ledger.units import Unit

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
        ("prune_window_us", pa.int64()),
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


POSTING_COLUMNS_SQL = ", ".join(f'"{name}"' for name in POSTINGS_SCHEMA.names)

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
    idle: list[bool] = []  # per posting: its transaction's flag, or a share leg's own
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
        whole_idle = txn.idle
        for number, p in enumerate(txn.postings):
            idle.append(whole_idle or p.idle)
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
        "idle": pa.array(idle, pa.bool_()),
        "incarnation": pa.array([incarnation] * rows, pa.string()),
    }
    return pa.table([columns[name] for name in POSTINGS_SCHEMA.names], schema=POSTINGS_SCHEMA)


def archive_to_arrow(
    messages: Sequence[ConsumedMessage],
    incarnation: str,
    batch_seq: int,
    pruned: int | None,
    window: int | None = None,
) -> pa.Table:
    """The archive rows of one batch, in the hot table's and the archive segments' schema;
    `pruned` and `window` record the prunes the writer ran before the batch (see
    `ledger.store.rebuild`)."""
    n = len(messages)
    values: list[bytes | None] = [m.value for m in messages]
    codecs: list[str | None] = [None] * n
    sizes: list[int | None] = [None] * n
    # a real-time batch has none: one pass over the lengths, not a branch per message
    large = [i for i, v in enumerate(values) if v is not None and len(v) >= ARCHIVE_COMPRESS_FROM]
    for i in large:
        value = values[i]
        assert value is not None
        values[i] = _ZSTD.compress(value, asbytes=True)
        codecs[i] = ARCHIVE_CODEC
        sizes[i] = len(value)
    return pa.table(
        [
            pa.repeat(pa.scalar(batch_seq, pa.int64()), n),
            pa.array(range(n), pa.int32()),
            pa.repeat(pa.scalar(incarnation, pa.string()), n),
            pa.array([m.topic for m in messages], pa.string()),
            pa.array([m.partition for m in messages], pa.int32()),
            pa.array([m.offset for m in messages], pa.int64()),
            pa.array([m.key for m in messages], pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(codecs, pa.string()),
            pa.array(sizes, pa.int64()),
            pa.repeat(pa.scalar(pruned, pa.int64()), n),
            pa.repeat(pa.scalar(window, pa.int64()), n),
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


_INDEX = {name: i for i, name in enumerate(POSTINGS_SCHEMA.names)}


def transaction_from_rows(rows: Sequence[tuple[object, ...]]) -> Transaction | None:
    """Rebuild a transaction from its posting rows (in the postings schema's column order).

    Every row idle is an idle transaction (`Transaction.idle`); some rows idle are a shared
    GPU's idle shares' legs (`Posting.idle`)."""
    if not rows:
        return None
    first = rows[0]

    def col(row: tuple[object, ...], name: str) -> object:
        return row[_INDEX[name]]

    def text(row: tuple[object, ...], name: str) -> str | None:
        value = col(row, name)
        return None if value is None else str(value)

    whole_idle = all(bool(col(r, "idle")) for r in rows)
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
            idle=not whole_idle and bool(col(r, "idle")),
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
        idle=whole_idle,
    )


def usage_to_arrow(columns: PostingColumns) -> pa.Table:
    """Column-built usage transactions, one row each (`ROW_FIELDS` and `idle`): what
    `USAGE_POSTINGS_SQL` expands into postings inside DuckDB."""
    cols = columns.columns()
    idle = columns.idle
    return pa.table(
        [pa.array(cols[name], kind) for name, kind in USAGE_ROW_SCHEMA]
        + [pa.array([i in idle for i in range(len(columns))], pa.bool_())],
        names=[name for name, _ in USAGE_ROW_SCHEMA] + ["idle"],
    )


USAGE_ROW_SCHEMA = tuple(
    zip(
        ROW_FIELDS,
        (
            *(pa.string(),) * 5,  # txn_id, gpu_uuid, model, pool, node
            pa.int64(),  # start_us
            pa.int64(),  # end_us
            pa.string(),  # period
            pa.int16(),  # util_pct
            pa.string(),  # topic
            pa.int32(),  # partition
            pa.int64(),  # offset
            *(pa.string(),) * 7,  # account, capacity, team, project, user, job_id, cost_centre
            *(pa.int64(),) * 3,  # gpu_ms, money, energy_mj
        ),
        strict=True,
    )
)

# The legs of a usage transaction, in `leg` order: the holder's GPU-ms, money and energy, then
# the capacity's of the opposite sign; energy legs only when there is energy (then `leg` counts
# them, else the capacity's legs are 2 and 3).
_LEGS = ", ".join(
    f"({position}, '{unit.value}', {position < 3}, {1 if position < 3 else -1})"
    for position, unit in enumerate(LEG_UNITS * 2)
)
INCARNATION_PARAMETER = "CAST($incarnation AS VARCHAR)"  # `USAGE_POSTINGS_SQL` of a batch
USAGE_POSTINGS_SQL = f"""
SELECT u.txn_id,
    CAST(CASE WHEN u.energy_mj <> 0 OR l.position < 3 THEN l.position
         ELSE l.position - 1 END AS SMALLINT) AS leg,
    '{TransactionKind.USAGE.value}' AS kind,
    CASE WHEN l.holder THEN u.account ELSE u.capacity END AS account,
    l.unit,
    l.sign * CASE l.position % 3 WHEN 0 THEN u.gpu_ms WHEN 1 THEN u.money ELSE u.energy_mj END
        AS amount,
    CASE WHEN l.holder THEN u.team END AS team,
    CASE WHEN l.holder THEN u.project END AS project,
    CASE WHEN l.holder THEN u."user" END AS "user",
    CASE WHEN l.holder THEN u.job_id END AS job_id,
    CASE WHEN l.holder THEN u.cost_centre END AS cost_centre,
    u.gpu_uuid, u.model, u.pool, u.node, u.start_us, u.end_us, u.txn_id AS cause,
    {{incarnation}} AS incarnation, u.topic AS src_topic,
    u."partition" AS src_partition, u."offset" AS src_offset, u.period, u.util_pct, u.idle
FROM {{usage}} AS u
CROSS JOIN (VALUES {_LEGS}) AS l(position, unit, holder, sign)
WHERE u.energy_mj <> 0 OR l.position % 3 <> 2
"""


def columns_to_arrow(columns: PostingColumns, incarnation: str) -> pa.Table:
    """Column-built usage transactions as postings (`POSTINGS_SCHEMA`), expanded by the same
    SQL the store commits them with; for readers of a batch outside the store."""
    con = duckdb.connect()
    try:
        con.register("usage", usage_to_arrow(columns))
        query = USAGE_POSTINGS_SQL.format(usage="usage", incarnation=INCARNATION_PARAMETER)
        table: pa.Table = con.sql(query, params={"incarnation": incarnation}).to_arrow_table()
    finally:
        con.close()
    return table.cast(POSTINGS_SCHEMA)
