"""Read-only queries over the sealed segments, with a DuckDB connection of their own.

Readers (dashboard, reports, exports) never open the writer's database: they read the Parquet
files the segment manifest lists, so they see exactly the sealed ledger and nothing half-done.
Each listed file is checked against the checksum its manifest records before it is read (once
per process, `ledger.store.integrity`): a missing or damaged segment, or a manifest that cannot
be read, raises a `SegmentError` naming it rather than a total without it.
Periods select postings by the start of their interval (`start_us`), half-open `[start, end)`.
SQL may also read `{rollups}`: the same ledger pre-aggregated per segment
(`ledger.store.rollup_files`), which answers any query that only sums `amount`, takes
`min(start_us)` / `max(end_us)` and groups or filters by the rollups' columns; `{coarse}` is the
coarse rollup (no job or user: far fewer rows) for queries that need neither, `{daily}` the
same per UTC day, `{metered}` consumer GPU time per team and hour it ended in, `{jobs}` each
job's consumer totals per booked period (its own columns: `gpu_ms`, `money_micros`,
`idle_gpu_ms`, `idle_money_micros`, `postings`, `start_us`, `end_us`), `{gpus}` each GPU's
usage per hour (its own columns too: `capacity_gpu_ms`, …). A query that
selects one booked period says so (`booked`), and only the segments holding postings booked
into it are listed; `{edges}` is the postings of the segments that can hold one started in the
`edges` ranges a query names (the parts of an hour at the ends of a range whose whole hours it
reads from a level: `ledger.read.rollups.hours`).
`LedgerQueries.zone` is the ledger's time zone (`ledger.store.identity`): the months and days
readers group by are that zone's (`time_bucket_sql`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo
from pathlib import Path
from typing import Any

import duckdb

from ledger.errors import LedgerError, SegmentError
from ledger.periods import Period, zone_name
from ledger.postings import Transaction
from ledger.store.identity import recorded_zone
from ledger.store.integrity import require_intact
from ledger.store.layout import SEGMENTS_DIR, sql_list
from ledger.store.rollup_files import (
    COARSE,
    DAILY,
    FINE,
    GPUS,
    JOBS,
    METERED,
    RollupInfo,
    RollupLevel,
    hour_aligned,
    postings_as_rollup_sql,
    rollup_columns_sql,
)
from ledger.store.schema import POSTING_COLUMNS_SQL, POSTINGS_SCHEMA, transaction_from_rows
from ledger.store.segments import Manifest, SegmentInfo, SegmentSummary, summarise_segment

DIMENSIONS = (
    "cost_centre",
    "team",
    "project",
    "user",
    "job_id",
    "model",
    "pool",
    "gpu_uuid",
    "node",
)
_RETRIES = 3
_HOUR_US = 3_600_000_000
_CALENDAR_UNITS = {_HOUR_US: "hour", 24 * _HOUR_US: "day"}


def time_bucket_sql(column: str, bucket_us: int, zone: tzinfo = UTC) -> str:
    """SQL for the start (µs) of the `bucket_us` bucket holding `column` (µs since the epoch).

    In UTC, or for a bucket that is not an hour or a day, buckets are multiples of `bucket_us`
    since the epoch. In another zone, hours and days are that zone's (DuckDB's ICU time zones:
    a day in Asia/Shanghai starts at 16:00 UTC, a day in a zone with summer time can last 23
    or 25 hours)."""
    unit = _CALENDAR_UNITS.get(int(bucket_us))
    if zone is UTC or unit is None:
        return f"({column} - {column} % {int(bucket_us)})"
    name = zone_name(zone).replace("'", "''")
    utc = f"timezone('UTC', make_timestamp(({column})::BIGINT))"
    local = f"date_trunc('{unit}', timezone('{name}', {utc}))"
    return f"epoch_us(timezone('{name}', {local}))"


_READERS: dict[int, duckdb.DuckDBPyConnection] = {}  # by process id: one database each
_READERS_LOCK = threading.Lock()


def reader_connection() -> duckdb.DuckDBPyConnection:
    """A connection of its own to this process's in-memory DuckDB database for readers.

    Opening a database costs tens of milliseconds of CPU (its catalog, buffer manager and
    thread pool), a connection to an open one well under one, and the dashboard opens one per
    query (seven for the Finance page). Each connection keeps what it registers to itself and
    is closed by its reader; the database lives as long as the process (a forked child opens
    its own: DuckDB's threads do not survive a fork). It caches no file data between queries
    (`enable_external_file_cache` off), so each query reads its files as a database of its own
    did."""
    with _READERS_LOCK:
        database = _READERS.get(os.getpid())
        if database is None:
            _READERS.clear()  # the parent's, in a forked child
            database = duckdb.connect(":memory:", config={"enable_external_file_cache": False})
            _READERS[os.getpid()] = database
        return database.cursor()


@dataclass(frozen=True, slots=True)
class CostRow:
    keys: tuple[str | None, ...]
    gpu_ms: int
    money_micros: int


class LedgerQueries:
    """Queries over the sealed ledger in `data_dir`; `zone` is its time zone."""

    def __init__(self, data_dir: Path | str) -> None:
        self.zone = recorded_zone(Path(data_dir))
        self.root = Path(data_dir) / SEGMENTS_DIR
        self.manifest = Manifest(self.root)
        self._con = reader_connection()
        empty = ", ".join(
            f'CAST(NULL AS {_duck_type(str(f.type))}) AS "{f.name}"' for f in POSTINGS_SCHEMA
        )
        self._empty = f"(SELECT {empty} WHERE FALSE)"

    def segments(self) -> list[SegmentInfo]:
        return self.manifest.load()

    def segment_summaries(self) -> list[SegmentSummary]:
        """Each sealed postings segment's summary: from the manifest, or (an entry written
        before summaries) read from the file. Retried like `_query`."""
        last: Exception | None = None
        for _ in range(_RETRIES):
            try:
                return [
                    s.summary
                    if s.summary is not None
                    else summarise_segment(self._con, self.root / s.path)
                    for s in self.manifest.checked()
                ]
            except duckdb.IOException as exc:  # a listed file was compacted away meanwhile
                last = exc
        raise LedgerError(f"the sealed ledger could not be read: {last}")

    def _wanted(
        self, started: tuple[int, int] | None, booked: str | None
    ) -> Callable[[SegmentInfo], bool] | None:
        """Which listed segments a query needs: with `started` (lo, hi), those that can hold a
        posting whose interval started in [lo, hi) (by the manifest's interval extents); with
        `booked`, those holding postings booked into that period (by their summaries; an entry
        without one is read). None: all of them."""
        if started is None and booked is None:
            return None

        def wanted(s: SegmentInfo) -> bool:
            if started is not None:
                lo, hi = started
                if s.min_start_us is None or s.max_end_us is None:
                    return False
                if not (s.min_start_us < hi and s.max_end_us >= lo):
                    return False
            return booked is None or s.summary is None or booked in s.summary.periods

        return wanted

    def _listed(
        self, started: tuple[int, int] | None = None, booked: str | None = None
    ) -> list[SegmentInfo]:
        """The segments a query reads (`_wanted`), each checked against its checksum."""
        wanted = self._wanted(started, booked)
        return self.manifest.checked() if wanted is None else self.manifest.checked_where(wanted)

    def _source(self, started: tuple[int, int] | None = None, booked: str | None = None) -> str:
        """The sealed postings of the segments `_wanted` picks."""
        files = [self.root / s.path for s in self._listed(started, booked)]
        if not files:
            return self._empty
        listed = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
        return f"read_parquet([{listed}], union_by_name = true)"

    def _rollup_source(
        self,
        level: RollupLevel = FINE,
        started: tuple[int, int] | None = None,
        booked: str | None = None,
    ) -> str:
        """The sealed ledger in `level`'s shape (`ledger.store.rollup_files`): each picked
        segment's rollup of that level, or its postings (one per row) for a segment sealed
        without one; the postings themselves where the ledger's zone has hours that do not
        begin on UTC hours and the level groups by hour."""
        if level.hours and not hour_aligned(self.zone):
            return f"({postings_as_rollup_sql(self._source(started, booked), level)})"
        rolled, raw = self._rollup_files(level, started, booked)
        parts = []
        if rolled:
            parts.append(
                f"SELECT {rollup_columns_sql(level)} FROM read_parquet([{sql_list(rolled)}])"
            )
        if raw:
            parts.append(postings_as_rollup_sql(f"read_parquet([{sql_list(raw)}])", level))
        if not parts:
            return f"({postings_as_rollup_sql(self._empty, level)})"
        return "(" + " UNION ALL ".join(parts) + ")"

    def _rollup_files(
        self, level: RollupLevel, started: tuple[int, int] | None, booked: str | None
    ) -> tuple[list[Path], list[Path]]:
        """The picked segments' rollups of `level` and the segments picked without one, every
        picked file checked against its checksum (once per process, `ledger.store.integrity`);
        retried when a file vanished because a compaction replaced it meanwhile."""

        def rollup_of(s: SegmentInfo) -> RollupInfo | None:
            return s.rollup_of(level.name)

        for attempt in range(_RETRIES):
            segments = self._listed(started, booked)  # a damaged ledger is refused, rollups or not
            try:
                rolled = [
                    require_intact(self.root / r.path, r.sha256)
                    for r in map(rollup_of, segments)
                    if r is not None
                ]
                return rolled, [self.root / s.path for s in segments if rollup_of(s) is None]
            except SegmentError:
                if attempt == _RETRIES - 1 or self._listed(started, booked) == segments:
                    raise
        raise AssertionError("unreachable")

    def _edge_source(self, edges: Sequence[tuple[int, int]]) -> str:
        """The sealed postings of the segments that can hold a posting started in any of the
        `edges` ranges (lo, hi) (`_wanted`; none: no postings)."""
        wants = [w for w in (self._wanted(r, None) for r in edges if r[0] < r[1]) if w]
        if not wants:
            return self._empty
        files = self.manifest.checked_where(lambda s: any(w(s) for w in wants))
        if not files:
            return self._empty
        return f"read_parquet([{sql_list([self.root / s.path for s in files])}])"

    def _bind(
        self,
        sql: str,
        started: tuple[int, int] | None = None,
        booked: str | None = None,
        edges: Sequence[tuple[int, int]] = (),
    ) -> str:
        """`sql` with `{postings}`, each rollup level (`{rollups}`, `{coarse}`, `{daily}`,
        `{metered}`, `{jobs}`, `{gpus}`) and `{edges}` bound (each source listed only if
        used)."""
        return sql.format(
            edges=self._edge_source(edges) if "{edges}" in sql else "",
            gpus=self._rollup_source(GPUS, started, booked) if "{gpus}" in sql else "",
            postings=self._source(started, booked) if "{postings}" in sql else "",
            rollups=self._rollup_source(FINE, started, booked) if "{rollups}" in sql else "",
            coarse=self._rollup_source(COARSE, started, booked) if "{coarse}" in sql else "",
            daily=self._rollup_source(DAILY, started, booked) if "{daily}" in sql else "",
            metered=self._rollup_source(METERED, started, booked) if "{metered}" in sql else "",
            jobs=self._rollup_source(JOBS, started, booked) if "{jobs}" in sql else "",
        )

    def _query(
        self,
        sql: str,
        params: Sequence[Any] = (),
        started: tuple[int, int] | None = None,
        booked: str | None = None,
        edges: Sequence[tuple[int, int]] = (),
    ) -> list[tuple[Any, ...]]:
        """Run `sql` with `{postings}` bound to the sealed postings, `{rollups}` and `{coarse}`
        to their rollups (`_rollup_source`); `started`: the query reads only postings whose
        interval started in [lo, hi); `booked`: only postings booked into that period (a
        `YYYY-MM` label) — either way only the segments that can hold one are listed;
        `edges`: the ranges `{edges}` lists the segments of (`_edge_source`).

        Retried when a listed file vanished: compaction replaced it between manifest read and scan.
        """
        last: Exception | None = None
        for _ in range(_RETRIES):
            try:
                bound = self._bind(sql, started, booked, edges)
                return self._con.execute(bound, list(params)).fetchall()
            except duckdb.IOException as exc:  # a listed file was compacted away meanwhile
                last = exc
        raise LedgerError(f"the sealed ledger could not be read: {last}")

    def totals_by_unit(self) -> dict[str, int]:
        rows = self._query(
            "SELECT unit, sum(amount) FROM {postings} WHERE amount > 0 GROUP BY unit"
        )
        return {unit: int(total) for unit, total in rows}

    def transaction_count(self) -> int:
        rows = self._query("SELECT count(DISTINCT txn_id) FROM {postings}")
        return int(rows[0][0])

    def balances(self) -> dict[tuple[str, str], int]:
        """Balance per (account, unit) over the whole sealed ledger."""
        rows = self._query("SELECT account, unit, sum(amount) FROM {postings} GROUP BY ALL")
        return {(account, unit): int(total) for account, unit, total in rows}

    def cost_by(
        self, dims: Sequence[str], period: Period | None = None, include_unallocated: bool = False
    ) -> list[CostRow]:
        """GPU time and money per combination of `dims`, largest cost first."""
        bad = [d for d in dims if d not in DIMENSIONS]
        if bad or not dims:
            raise ValueError(f"unknown dimension(s) {bad}; choose from {', '.join(DIMENSIONS)}")
        columns = ", ".join(f'"{d}"' for d in dims)
        where, params = self._where(period, include_unallocated)
        rows = self._query(
            f"SELECT {columns}, "
            "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
            "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) "
            f"FROM {{postings}} WHERE {where} GROUP BY ALL "
            f"ORDER BY {len(dims) + 2} DESC, {columns}",
            params,
        )
        n = len(dims)
        return [CostRow(tuple(r[:n]), int(r[n]), int(r[n + 1])) for r in rows]

    def cost_by_team_over_time(
        self, bucket_us: int = 3_600_000_000, period: Period | None = None
    ) -> list[tuple[int, str, int, int]]:
        """(bucket start µs, team, GPU-ms, money µ) per time bucket (an hour or a day of the
        ledger's time zone) and team, oldest first."""
        where, params = self._where(period, False)
        rows = self._query(
            f"SELECT {time_bucket_sql('start_us', bucket_us, self.zone)} AS bucket, team, "
            "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
            "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) "
            f"FROM {{postings}} WHERE {where} GROUP BY ALL ORDER BY bucket, team",
            params,
        )
        return [(int(b), t, int(ms), int(m)) for b, t, ms, m in rows]

    def newest_sealed_us(self) -> int | None:
        ends = [s.max_end_us for s in self.manifest.load() if s.max_end_us is not None]
        return max(ends) if ends else None

    @staticmethod
    def _where(period: Period | None, include_unallocated: bool) -> tuple[str, list[Any]]:
        clauses = ["account LIKE 'unallocated:%'" if include_unallocated else "FALSE"]
        clauses = [f"(account LIKE 'consumer:%' OR {clauses[0]})"]
        params: list[Any] = []
        if period is not None:
            clauses.append("start_us >= ? AND start_us < ?")
            params += [period.start_us, period.end_us]
        return " AND ".join(clauses), params

    def close(self) -> None:
        self._con.close()


def _duck_type(arrow_type: str) -> str:
    return {
        "string": "VARCHAR",
        "int16": "SMALLINT",
        "int32": "INTEGER",
        "int64": "BIGINT",
        "bool": "BOOLEAN",
    }[arrow_type]


def find_sealed_transaction(data_dir: Path | str, txn_id: str) -> Transaction | None:
    """A transaction in the sealed segments, read with a connection of its own (for readers)."""
    files = Manifest(Path(data_dir) / SEGMENTS_DIR).files()
    if not files:
        return None
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            f"SELECT {POSTING_COLUMNS_SQL} FROM read_parquet([{sql_list(files)}]) "
            "WHERE txn_id = ? ORDER BY leg",
            [txn_id],
        ).fetchall()
    finally:
        con.close()
    return transaction_from_rows(rows)
