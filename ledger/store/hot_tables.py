"""The writer's hot tables: their DDL, and writing and reading their rows in one statement per
table (DuckDB's `executemany` runs one statement per row).

Postings built one at a time are rows of `posting_rows`; column-built usage is one row per
transaction in `usage_rows`; the `postings` view is both, the usage rows expanded.

The DDL also brings a database from before a column or table was added up to date: ids applied
before dedupe scopes get the scope '' and one `dedupe_scopes` row, so a prune by window forgets
them by their newest time, as before; a `postings` table from before usage rows is renamed
first (`keep_posting_rows`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ledger.admin import applied_to_dict
from ledger.assignments import Holding
from ledger.events import Owner
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState, state_from_row
from ledger.inventory import record_json
from ledger.postings import TransactionKind
from ledger.store.balance_moves import balance_moves
from ledger.store.layout import first_row
from ledger.store.port import StateChanges
from ledger.store.schema import POSTING_COLUMNS_SQL, USAGE_POSTINGS_SQL
from ledger.units import Unit

# Column-built usage, one row per transaction (`ledger.posting_columns`, `usage_to_arrow`'s
# columns and the batch's incarnation): its postings are what `USAGE_POSTINGS_SQL` expands the
# row to, read through the `postings` view, so a commit writes one row per sample rather than
# four or six, and the seal expands them as it copies them out.
USAGE_ROWS_DDL = """
CREATE TABLE IF NOT EXISTS usage_rows (
    txn_id VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL, model VARCHAR NOT NULL,
    pool VARCHAR NOT NULL, node VARCHAR NOT NULL, start_us BIGINT NOT NULL,
    end_us BIGINT NOT NULL, period VARCHAR NOT NULL, util_pct SMALLINT,
    topic VARCHAR NOT NULL, "partition" INTEGER NOT NULL, "offset" BIGINT NOT NULL,
    account VARCHAR NOT NULL, capacity VARCHAR NOT NULL, team VARCHAR, project VARCHAR,
    "user" VARCHAR, job_id VARCHAR, cost_centre VARCHAR, gpu_ms BIGINT NOT NULL,
    money BIGINT NOT NULL, energy_mj BIGINT NOT NULL, idle BOOLEAN NOT NULL,
    incarnation VARCHAR NOT NULL
);
"""
# Every hot posting: the rows built one posting at a time and the expanded usage rows.
POSTINGS_VIEW_DDL = (
    f"CREATE OR REPLACE VIEW postings AS SELECT {POSTING_COLUMNS_SQL} FROM posting_rows "
    f"UNION ALL {USAGE_POSTINGS_SQL.format(usage='usage_rows', incarnation='u.incarnation')};"
)


def keep_posting_rows(con: duckdb.DuckDBPyConnection) -> None:
    """Before `HOT_TABLES_DDL` on a database written before usage rows: its `postings` table
    becomes `posting_rows` (the DDL then makes `postings` the view over it)."""
    row = first_row(
        con.execute(
            "SELECT table_type FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_name = 'postings'"
        )
    )
    if row is not None and row[0] == "BASE TABLE":
        con.execute("ALTER TABLE postings RENAME TO posting_rows")


HOT_TABLES_DDL = (
    """
CREATE TABLE IF NOT EXISTS posting_rows (
    txn_id VARCHAR NOT NULL, leg SMALLINT NOT NULL, kind VARCHAR NOT NULL,
    account VARCHAR NOT NULL, unit VARCHAR NOT NULL, amount BIGINT NOT NULL,
    team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR, cost_centre VARCHAR,
    gpu_uuid VARCHAR, model VARCHAR, pool VARCHAR, node VARCHAR,
    start_us BIGINT NOT NULL, end_us BIGINT NOT NULL, cause VARCHAR NOT NULL,
    incarnation VARCHAR NOT NULL, src_topic VARCHAR NOT NULL,
    src_partition INTEGER NOT NULL, src_offset BIGINT NOT NULL,
    period VARCHAR NOT NULL, util_pct SMALLINT, idle BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS seen_events (
    event_id VARCHAR PRIMARY KEY, time_us BIGINT NOT NULL, scope VARCHAR NOT NULL DEFAULT ''
);
ALTER TABLE seen_events ADD COLUMN IF NOT EXISTS scope VARCHAR DEFAULT '';
CREATE TABLE IF NOT EXISTS dedupe_scopes (
    scope VARCHAR PRIMARY KEY, newest_us BIGINT NOT NULL, forgotten_before_us BIGINT
);
INSERT INTO dedupe_scopes SELECT '', max(time_us), NULL FROM seen_events WHERE scope = ''
    HAVING count(*) > 0 ON CONFLICT DO NOTHING;
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
CREATE TABLE IF NOT EXISTS undeliverable (
    id VARCHAR NOT NULL, topic VARCHAR NOT NULL, "key" BLOB, "value" BLOB NOT NULL,
    reason VARCHAR NOT NULL, recorded_at_us BIGINT NOT NULL
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
CREATE TABLE IF NOT EXISTS job_usage (
    account VARCHAR NOT NULL, job_id VARCHAR NOT NULL, unit VARCHAR NOT NULL,
    amount BIGINT NOT NULL, PRIMARY KEY (account, job_id, unit)
);
CREATE TABLE IF NOT EXISTS ended_jobs (job_id VARCHAR PRIMARY KEY, ended_us BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS open_holds (
    job_id VARCHAR NOT NULL, unit VARCHAR NOT NULL, team VARCHAR NOT NULL, project VARCHAR,
    amount BIGINT NOT NULL, expires_us BIGINT NOT NULL, placed_by VARCHAR NOT NULL,
    PRIMARY KEY (job_id, unit)
);
ALTER TABLE open_holds ADD COLUMN IF NOT EXISTS baseline BIGINT DEFAULT 0;
ALTER TABLE open_holds ADD COLUMN IF NOT EXISTS earlier BIGINT DEFAULT 0;
ALTER TABLE open_holds ADD COLUMN IF NOT EXISTS final BOOLEAN DEFAULT FALSE;
CREATE TABLE IF NOT EXISTS hold_baselines (
    job_id VARCHAR NOT NULL, unit VARCHAR NOT NULL, usage BIGINT NOT NULL,
    PRIMARY KEY (job_id, unit)
);
CREATE TABLE IF NOT EXISTS gpu_holdings (
    gpu_uuid VARCHAR NOT NULL, team VARCHAR, project VARCHAR, "user" VARCHAR, job_id VARCHAR,
    from_us BIGINT NOT NULL, to_us BIGINT
);
ALTER TABLE gpu_holdings ADD COLUMN IF NOT EXISTS share INTEGER;
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
    "key" BLOB, "value" BLOB, value_codec VARCHAR, value_size BIGINT, pruned_before_us BIGINT,
    prune_window_us BIGINT
);
ALTER TABLE raw_events ADD COLUMN IF NOT EXISTS prune_window_us BIGINT;
CREATE TABLE IF NOT EXISTS inventory_gpus (uuid VARCHAR PRIMARY KEY, record VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS reversals (txn_id VARCHAR PRIMARY KEY, reversed_by VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE SEQUENCE IF NOT EXISTS publish_seq;
"""
    + USAGE_ROWS_DDL
    + POSTINGS_VIEW_DDL
)


def insert_rows(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: Sequence[tuple[object, ...]],
    new_ids_only: bool = False,
) -> None:
    """Insert whole rows (every column, in the table's order), in their order, in one
    statement (DuckDB's `executemany` runs one per row); with `new_ids_only`, rows whose
    `id` (their first column) the table holds already are left out."""
    if not rows:
        return
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


def write_changes(con: duckdb.DuckDBPyConnection, changes: StateChanges, now: int) -> None:
    """Write what a batch changes besides postings (see `StateChanges`)."""
    if changes.inventory:
        con.execute(
            "DELETE FROM inventory_gpus WHERE uuid IN (SELECT unnest(?))", [list(changes.inventory)]
        )
        insert_rows(
            con,
            "inventory_gpus",
            [(uuid, record_json(gpu)) for uuid, gpu in sorted(changes.inventory.items())],
        )
    if changes.timelines:
        con.execute(
            "DELETE FROM gpu_holdings WHERE gpu_uuid IN (SELECT unnest(?))",
            [list(changes.timelines)],
        )
        insert_rows(
            con,
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
                    h.share,
                )
                for uuid, timeline in changes.timelines.items()
                for h in timeline
            ],
        )
    if changes.holds:
        con.execute(
            "DELETE FROM open_holds WHERE job_id || '/' || unit IN (SELECT unnest(?))",
            # injective: a unit has no '/'
            [[f"{h.job_id}/{h.unit.value}" for h in changes.holds]],
        )
        insert_rows(
            con,
            "open_holds",
            [
                (
                    h.job_id,
                    h.unit.value,
                    h.team,
                    h.project,
                    h.amount,
                    h.expires_us,
                    h.placed_by,
                    h.baseline,
                    h.earlier,
                    h.final,
                )
                for h in changes.holds
                if h.amount
            ],
        )
    if changes.baselines or changes.baselines_dropped:
        con.execute(
            "DELETE FROM hold_baselines WHERE job_id || '/' || unit IN (SELECT unnest(?))",
            [
                [
                    f"{job}/{unit.value}"
                    for job, unit in (*changes.baselines, *changes.baselines_dropped)
                ]
            ],
        )
        insert_rows(
            con,
            "hold_baselines",
            [(job, unit.value, usage) for (job, unit), usage in changes.baselines.items()],
        )
    if changes.admin:
        row = first_row(con.execute("SELECT coalesce(max(seq), 0) FROM admin_log"))
        seq = int(row[0]) if row else 0
        insert_rows(
            con,
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
    insert_rows(con, "reversals", list(changes.reversals))


def read_idle_states(
    con: duckdb.DuckDBPyConnection, subjects: Sequence[str]
) -> dict[str, GpuIdleState]:
    if not subjects:
        return {}
    con.register("batch_subjects", pa.table({"subject": list(subjects)}))
    try:
        rows = con.execute(
            "SELECT i.* FROM idle_state i SEMI JOIN batch_subjects b USING (subject)"
        ).fetchall()
    finally:
        con.unregister("batch_subjects")
    return {str(row[0]): state_from_row(row) for row in rows}


def read_gpu_timelines(
    con: duckdb.DuckDBPyConnection, gpu_uuids: Collection[str]
) -> dict[str, tuple[Holding, ...]]:
    """The assignment timelines of `gpu_uuids` (a GPU never assigned has none)."""
    if not gpu_uuids:
        return {}
    rows = con.execute(
        'SELECT gpu_uuid, team, project, "user", job_id, from_us, to_us, share '
        "FROM gpu_holdings WHERE list_contains(?, gpu_uuid) ORDER BY gpu_uuid, from_us",
        [sorted(gpu_uuids)],
    ).fetchall()
    timelines: dict[str, list[Holding]] = {}
    for uuid, team, project, user, job, from_us, to_us, share in rows:
        owner = Owner(team, project, user, job)
        end = None if to_us is None else int(to_us)
        timelines.setdefault(str(uuid), []).append(
            Holding(str(uuid), owner, int(from_us), end, None if share is None else int(share))
        )
    return {uuid: tuple(timeline) for uuid, timeline in timelines.items()}


def read_open_holds(con: duckdb.DuckDBPyConnection) -> dict[HoldKey, OpenHold]:
    rows = con.execute(
        "SELECT job_id, unit, team, project, amount, expires_us, placed_by, "
        "coalesce(baseline, 0), coalesce(earlier, 0), coalesce(final, false) FROM open_holds"
    ).fetchall()
    holds = [
        OpenHold(
            str(j), Unit(u), str(t), p, int(a), int(e), str(b), int(base), int(before), bool(f)
        )
        for j, u, t, p, a, e, b, base, before, f in rows
    ]
    return {h.key: h for h in holds}


def read_hold_baselines(
    con: duckdb.DuckDBPyConnection, jobs: Collection[str] | None = None
) -> dict[HoldKey, int]:
    """The hold baselines (`StateChanges.baselines`) of `jobs` (None: every job's)."""
    query = "SELECT job_id, unit, usage FROM hold_baselines"
    if jobs is None:
        rows = con.execute(query).fetchall()
    else:
        rows = con.execute(f"{query} WHERE list_contains(?, job_id)", [sorted(jobs)]).fetchall()
    return {(str(j), Unit(u)): int(n) for j, u, n in rows}


# A job's usage so far per consumer account (`job_usage`): what a sharded ledger's samples
# shard publishes with its consumer balances (`ledger.balances.BalanceUpdate.jobs`), the same
# postings the shards' watermark sums per job (usage and reversals, budget units).
_JOB_POSTINGS_SQL = f"""
SELECT account, job_id, unit, amount FROM batch_postings
WHERE job_id IS NOT NULL AND starts_with(account, 'consumer:')
  AND kind IN ('{TransactionKind.USAGE.value}', '{TransactionKind.REVERSAL.value}')
  AND unit IN ('{Unit.GPU_MS.value}', '{Unit.MONEY.value}')"""
_JOB_USAGE_SQL = f"""
SELECT account, job_id, '{Unit.GPU_MS.value}' AS unit, gpu_ms AS amount FROM batch_usage
WHERE job_id IS NOT NULL AND starts_with(account, 'consumer:')
UNION ALL
SELECT account, job_id, '{Unit.MONEY.value}', money FROM batch_usage
WHERE job_id IS NOT NULL AND starts_with(account, 'consumer:')"""


def _move_job_usage(con: duckdb.DuckDBPyConnection, registered: Collection[str]) -> None:
    parts = [
        sql
        for name, sql in (("batch_postings", _JOB_POSTINGS_SQL), ("batch_usage", _JOB_USAGE_SQL))
        if name in registered
    ]
    con.execute(
        "INSERT INTO job_usage (account, job_id, unit, amount) "
        "SELECT account, job_id, unit, sum(amount) "
        f"FROM ({' UNION ALL '.join(f'({part})' for part in parts)}) GROUP BY ALL "
        "ON CONFLICT DO UPDATE SET amount = amount + excluded.amount"
    )


def read_job_usage(
    con: duckdb.DuckDBPyConnection, accounts: Collection[str], jobs: Collection[str]
) -> list[tuple[str, str, str, int]]:
    """(account, job, unit, amount) of `job_usage` for `accounts`, of the jobs `jobs` names
    and the jobs holding a GPU now (an open assignment in `gpu_holdings`)."""
    if not accounts:
        return []
    con.register("job_accounts", pa.table({"account": pa.array(sorted(accounts), pa.string())}))
    con.register("job_ids", pa.table({"job_id": pa.array(sorted(jobs), pa.string())}))
    try:
        rows = con.execute(
            "SELECT account, job_id, unit, amount FROM job_usage "
            "SEMI JOIN job_accounts USING (account) WHERE job_id IN (SELECT job_id FROM job_ids) "
            "OR job_id IN (SELECT job_id FROM gpu_holdings WHERE to_us IS NULL)"
        ).fetchall()
    finally:
        con.unregister("job_accounts")
        con.unregister("job_ids")
    return [(str(a), str(j), str(u), int(n)) for a, j, u, n in rows]


def insert_postings(
    con: duckdb.DuckDBPyConnection,
    table: pa.Table,
    usage: pa.Table | None,
    incarnation: str,
    job_usage: bool = False,
) -> int:
    """Insert the postings of `table` and the usage rows of `usage` (whose postings the
    `postings` view expands, `USAGE_POSTINGS_SQL`), and move the balances by both (summed in
    Arrow first, `ledger.store.balance_moves`: one upsert of a few dozen rows); the count of
    usage postings."""
    registered = []
    if table.num_rows:
        con.register("batch_postings", table)
        registered.append("batch_postings")
        con.execute("INSERT INTO posting_rows SELECT * FROM batch_postings")
    expanded = 0
    if usage is not None and usage.num_rows:
        con.register("batch_usage", usage)
        registered.append("batch_usage")
        con.execute(
            "INSERT INTO usage_rows SELECT *, $incarnation FROM batch_usage",
            {"incarnation": incarnation},
        )
        with_energy = pc.sum(pc.not_equal(usage.column("energy_mj"), 0)).as_py() or 0
        expanded = 4 * usage.num_rows + 2 * with_energy  # the legs of each (`LEG_UNITS`)
    if registered:
        con.register("batch_moves", balance_moves(table, usage))
        registered.append("batch_moves")
        con.execute(
            "INSERT INTO balances SELECT * FROM batch_moves "
            "ON CONFLICT DO UPDATE SET balance = balance + excluded.balance"
        )
        if job_usage:
            _move_job_usage(con, registered)
    for name in registered:
        con.unregister(name)
    return expanded
