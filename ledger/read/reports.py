"""Reports over the sealed ledger: cost by dimensions, idle-cost sharing, and the idle report.

This module owns what a cost or idle report *means*; it reads through `ReportQueries`, which is
`LedgerQueries` (the sealed segments the manifest lists, a DuckDB connection of its own) plus
two generic hooks for SQL over those postings.

Rules every report here keeps:
- A period selects postings by `period`, the accounting period they were *booked* into, not by
  when the usage happened. A closed period's reports therefore never change, and late usage
  shows up in the open period that booked it (`prior_period`: its interval began earlier).
- Two kinds of idle, kept apart: **allocated-but-idle** is the consumer postings of transactions
  flagged `idle` (still charged to the owner; its money is "idle waste"); **unallocated
  capacity** is the `unallocated:*` accounts (GPU time nobody held). The `idle` flag rides on the
  transaction, so it is only read on consumer legs.
- Idle-cost sharing (the OpenCost modes) redistributes the money of unallocated capacity across
  the rows of a report *for display and export only*; postings are never rewritten. The cost of
  `unallocated:<pool>/<model>` is shared among the rows that used that pool and model in the
  same selection — `weighted` by their GPU time, `even` equally — with largest-remainder rounding
  on integer micro-units, so the shares sum exactly to the idle cost. Idle cost of a pool and
  model nobody used stays unshared.
- Money is integer micro-units throughout; decimals appear only when rendering.

SQL is built only from the whitelisted dimension names in `ledger.read.queries.DIMENSIONS`; every
value is a bound parameter.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum
from typing import Any

import duckdb
import pyarrow as pa

from ledger.attribution import largest_remainder
from ledger.errors import LedgerError
from ledger.periods import Period
from ledger.read.queries import DIMENSIONS, LedgerQueries
from ledger.store.rollup_files import COARSE_DIMENSIONS, ROLLUP_DIMENSIONS
from ledger.units import MS_PER_HOUR

_RETRIES = 3
CONSUMER_SQL = "account LIKE 'consumer:%'"
UNALLOCATED_SQL = "account LIKE 'unallocated:%'"
# The idle flag is transaction-level; only a consumer leg of an idle transaction is idle waste.
IDLE_LEG_SQL = f"(idle AND {CONSUMER_SQL})"

Keys = tuple[str | None, ...]


class IdleSharing(StrEnum):
    """How the cost of unallocated capacity is shared across report rows (OpenCost's modes)."""

    NONE = "none"
    WEIGHTED = "weighted"
    EVEN = "even"


class ReportQueries(LedgerQueries):
    """`LedgerQueries` plus generic hooks: SQL with `{postings}` bound to the sealed postings."""

    def rows(
        self,
        sql: str,
        params: Sequence[Any] = (),
        started: tuple[int, int] | None = None,
        booked: str | None = None,
        edges: Sequence[tuple[int, int]] = (),
    ) -> list[tuple[Any, ...]]:
        """`sql` over `{postings}` / `{rollups}` / `{coarse}` / …; `started` (lo, hi): the SQL
        selects only postings whose interval started in [lo, hi); `booked`: only postings booked
        into that period (`YYYY-MM`); either way other segments are not listed. `edges`: the
        ranges whose segments `{edges}` lists (`LedgerQueries._edge_source`)."""
        return self._query(sql, params, started, booked, edges)

    def arrow(
        self,
        sql: str,
        params: Sequence[Any] = (),
        tables: Mapping[str, pa.Table] | None = None,
    ) -> pa.Table:
        """Like `rows`, as an Arrow table (for exports); retried like `LedgerQueries._query`.

        `tables` are Arrow tables the SQL may read by name while it runs."""
        last: Exception | None = None
        for name, extra in (tables or {}).items():
            self._con.register(name, extra)
        try:
            for _ in range(_RETRIES):
                try:
                    relation = self._con.sql(self._bind(sql), params=list(params) or None)
                    table: pa.Table = relation.to_arrow_table()
                    return table
                except duckdb.IOException as exc:  # a listed file was compacted away meanwhile
                    last = exc
        finally:
            for name in tables or {}:
                self._con.unregister(name)
        raise LedgerError(f"the sealed ledger could not be read: {last}")


# ---------------------------------------------------------------------------------- helpers


def period_of(period: Period | str | None, zone: tzinfo = UTC) -> Period | None:
    """The `Period` of a `YYYY-MM` label (ValueError if it is not one) or of a `Period`'s label:
    the month in `zone`, the ledger's time zone (`LedgerQueries.zone`); None for all time."""
    if period is None:
        return None
    return Period.month(period.label if isinstance(period, Period) else period, zone)


def period_clause(period: Period | None) -> tuple[str, list[Any]]:
    """SQL selecting the postings booked into `period` (all of them for None)."""
    if period is None:
        return "TRUE", []
    return "period = ?", [period.label]


def gpu_hours(gpu_ms: int, places: int = 3) -> Decimal:
    """GPU-milliseconds as GPU-hours, rounded half-even to `places` (display only)."""
    return (Decimal(gpu_ms) / MS_PER_HOUR).quantize(Decimal(1).scaleb(-places), ROUND_HALF_EVEN)


def source_for(dims: Sequence[str]) -> str:
    """The smallest source that answers a query grouping or filtering by `dims` (besides the
    rollups' other columns): `{coarse}`, `{rollups}` (job or user) or `{postings}` (GPU, node)."""
    if COARSE_DIMENSIONS.issuperset(dims):
        return "{coarse}"
    return "{rollups}" if ROLLUP_DIMENSIONS.issuperset(dims) else "{postings}"


def booked_label(period: Period | None) -> str | None:
    """The label of the one booked period a query selects (None: all), for `ReportQueries.rows`
    to list only the segments holding it."""
    return None if period is None else period.label


def check_dimensions(dims: Sequence[str]) -> tuple[str, ...]:
    """`dims` if every name is a known dimension and none repeats; else ValueError."""
    bad = [d for d in dims if d not in DIMENSIONS]
    if bad or not dims:
        raise ValueError(f"unknown dimension(s) {bad}; choose from {', '.join(DIMENSIONS)}")
    if len(set(dims)) != len(dims):
        raise ValueError(f"dimension repeated in {list(dims)}")
    return tuple(dims)


def _sort_key(keys: Keys) -> tuple[tuple[bool, str], ...]:
    return tuple((k is None, k or "") for k in keys)


def share_idle(
    idle_micros: int, weights: Mapping[Keys, int], sharing: IdleSharing
) -> dict[Keys, int]:
    """Split `idle_micros` across the rows in `weights` (their GPU-ms on the idle pool).

    Returns the share per row; the shares sum exactly to `idle_micros` whenever there is a row
    to share with (largest remainder, ties to the earlier row in key order), else nothing is
    shared. Negative weights (net credits) count as zero.
    """
    if sharing is IdleSharing.NONE or not weights or idle_micros == 0:
        return {}
    order = sorted(weights, key=_sort_key)
    if sharing is IdleSharing.EVEN:
        parts = largest_remainder(idle_micros, [1] * len(order))
    else:
        parts = largest_remainder(idle_micros, [max(weights[k], 0) for k in order])
    return dict(zip(order, parts, strict=True))


# ---------------------------------------------------------------------------------- cost


@dataclass(frozen=True, slots=True)
class CostLine:
    """One row of a cost report. `unallocated` rows hold idle capacity that was not shared."""

    keys: Keys
    gpu_ms: int
    money_micros: int
    idle_gpu_ms: int
    idle_waste_micros: int
    shared_idle_micros: int = 0
    unallocated: bool = False

    @property
    def total_micros(self) -> int:
        """Own cost plus the share of unallocated capacity."""
        return self.money_micros + self.shared_idle_micros


@dataclass(frozen=True, slots=True)
class CostReport:
    """Cost by `dims`. Invariant: consumer money + shared + unshared = the selection's money."""

    dims: tuple[str, ...]
    period: str | None
    sharing: IdleSharing
    lines: tuple[CostLine, ...]
    consumer_micros: int
    unallocated_gpu_ms: int
    unallocated_micros: int
    unshared_micros: int

    @property
    def total_micros(self) -> int:
        """Consumer plus unallocated money: the ledger's money for the selection."""
        return self.consumer_micros + self.unallocated_micros


def cost_report(
    queries: ReportQueries,
    dims: Sequence[str],
    period: Period | str | None = None,
    sharing: IdleSharing = IdleSharing.NONE,
    include_unallocated: bool = False,
    where: Mapping[str, str] | None = None,
) -> CostReport:
    """GPU time, cost and idle waste per combination of `dims`, largest total first.

    `where` narrows consumer rows to dimension values (e.g. `{"team": "vision"}`; the
    unallocated figures stay those of the whole period); sharing is a property of a whole
    report, so it cannot be combined with `where`. `include_unallocated` adds the unshared idle
    capacity as rows of its own (`unallocated=True`).
    """
    dims = check_dimensions(dims)
    chosen = period_of(period, queries.zone)
    filters = dict(where or {})
    if filters:
        check_dimensions(tuple(filters))
    if filters and sharing is not IdleSharing.NONE:
        raise ValueError("idle sharing applies to a whole report; it cannot be filtered")
    columns = ", ".join(f'"{d}"' for d in dims)
    source = source_for((*dims, *filters))
    if source == "{coarse}":
        source = "{daily}"  # the same groups without hours (a report uses no time)
    booked = booked_label(chosen)
    when, params = period_clause(chosen)
    for name, value in filters.items():
        when += f' AND "{name}" = ?'
        params.append(value)
    consumer = queries.rows(
        f'SELECT {columns}, "pool", "model", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {IDLE_LEG_SQL}), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {IDLE_LEG_SQL}), 0) "
        f"FROM {source} WHERE {CONSUMER_SQL} AND {when} GROUP BY ALL",
        params,
        booked=booked,
    )
    idle_when, idle_params = period_clause(chosen)
    unallocated = queries.rows(
        f'SELECT {columns}, "pool", "model", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) "
        f"FROM {source} WHERE {UNALLOCATED_SQL} AND {idle_when} GROUP BY ALL",
        idle_params,
        booked=booked,
    )
    n = len(dims)
    sums: dict[Keys, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    usage_on: dict[tuple[str, str], dict[Keys, int]] = defaultdict(lambda: defaultdict(int))
    for row in consumer:
        keys: Keys = tuple(row[:n])
        pool, model, ms, money, idle_ms, idle_money = row[n:]
        acc = sums[keys]
        acc[0] += int(ms)
        acc[1] += int(money)
        acc[2] += int(idle_ms)
        acc[3] += int(idle_money)
        usage_on[(pool, model)][keys] += int(ms)
    idle_by_pool: dict[tuple[str, str], int] = defaultdict(int)
    idle_rows: dict[Keys, list[int]] = defaultdict(lambda: [0, 0])
    unallocated_ms = 0
    for row in unallocated:
        keys = tuple(row[:n])
        pool, model, ms, money = row[n:]
        idle_by_pool[(pool, model)] += int(money)
        unallocated_ms += int(ms)
        idle_rows[keys][0] += int(ms)
        idle_rows[keys][1] += int(money)
    shared: dict[Keys, int] = defaultdict(int)
    unshared_pools: set[tuple[str, str]] = set()
    for pool_model in sorted(idle_by_pool, key=lambda pm: (pm[0] or "", pm[1] or "")):
        shares = share_idle(idle_by_pool[pool_model], usage_on.get(pool_model, {}), sharing)
        if not shares:
            unshared_pools.add(pool_model)
        for keys, part in shares.items():
            shared[keys] += part
    lines = [
        CostLine(keys, ms, money, idle_ms, idle_money, shared.get(keys, 0))
        for keys, (ms, money, idle_ms, idle_money) in sums.items()
    ]
    unshared = sum(idle_by_pool[pm] for pm in unshared_pools)
    if include_unallocated and unshared_pools:
        lines += _unallocated_lines(unallocated, n, unshared_pools)
    lines.sort(key=lambda line: (-line.total_micros, line.unallocated, _sort_key(line.keys)))
    return CostReport(
        dims=dims,
        period=chosen.label if chosen else None,
        sharing=sharing,
        lines=tuple(lines),
        consumer_micros=sum(v[1] for v in sums.values()),
        unallocated_gpu_ms=unallocated_ms,
        unallocated_micros=sum(idle_by_pool.values()),
        unshared_micros=unshared,
    )


def _unallocated_lines(
    rows: Sequence[tuple[Any, ...]], n: int, pools: set[tuple[str, str]]
) -> list[CostLine]:
    sums: dict[Keys, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        pool, model, ms, money = row[n:]
        if (pool, model) in pools:
            sums[tuple(row[:n])][0] += int(ms)
            sums[tuple(row[:n])][1] += int(money)
    return [CostLine(k, ms, money, 0, 0, 0, True) for k, (ms, money) in sums.items()]


def ledger_money_total(queries: ReportQueries, period: Period | str | None = None) -> int:
    """Money debited to consumer and unallocated accounts in the selection (what exports bill).

    Read from the daily rollups: a booked period is one of their keys and no hour is needed."""
    chosen = period_of(period, queries.zone)
    when, params = period_clause(chosen)
    rows = queries.rows(
        "SELECT coalesce(sum(amount), 0) FROM {daily} "
        f"WHERE unit = 'money_micros' AND ({CONSUMER_SQL} OR {UNALLOCATED_SQL}) AND {when}",
        params,
        booked=booked_label(chosen),
    )
    return int(rows[0][0])


# ---------------------------------------------------------------------------------- idle


@dataclass(frozen=True, slots=True)
class PoolIdle:
    """Idle per pool and GPU model; `physical_gpu_ms` = allocated + unallocated time."""

    pool: str | None
    model: str | None
    allocated_gpu_ms: int
    idle_gpu_ms: int
    idle_waste_micros: int
    unallocated_gpu_ms: int
    unallocated_micros: int

    @property
    def physical_gpu_ms(self) -> int:
        return self.allocated_gpu_ms + self.unallocated_gpu_ms


@dataclass(frozen=True, slots=True)
class TeamIdle:
    """A team's allocated-but-idle time and waste, and its share of unallocated capacity."""

    team: str | None
    allocated_gpu_ms: int
    idle_gpu_ms: int
    idle_waste_micros: int
    shared_unallocated_micros: int = 0


@dataclass(frozen=True, slots=True)
class IdleReport:
    period: str | None
    sharing: IdleSharing
    pools: tuple[PoolIdle, ...]
    teams: tuple[TeamIdle, ...]

    @property
    def unallocated_micros(self) -> int:
        return sum(p.unallocated_micros for p in self.pools)

    @property
    def idle_waste_micros(self) -> int:
        return sum(p.idle_waste_micros for p in self.pools)


def idle_report(
    queries: ReportQueries,
    period: Period | str | None = None,
    sharing: IdleSharing = IdleSharing.NONE,
) -> IdleReport:
    """Unallocated capacity and allocated-but-idle waste per pool/model and per team, from the
    daily rollups (their keys hold the booked period, pool, model, team and idle flag)."""
    chosen = period_of(period, queries.zone)
    when, params = period_clause(chosen)
    sums = (
        f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {CONSUMER_SQL}), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {IDLE_LEG_SQL}), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {IDLE_LEG_SQL}), 0)"
    )
    pool_rows = queries.rows(
        f'SELECT "pool", "model", {sums}, '
        f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {UNALLOCATED_SQL}), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {UNALLOCATED_SQL}), 0) "
        f"FROM {{daily}} WHERE ({CONSUMER_SQL} OR {UNALLOCATED_SQL}) AND {when} "
        'GROUP BY ALL ORDER BY 7 DESC, 5 DESC, "pool", "model"',
        params,
        booked=booked_label(chosen),
    )
    team_rows = queries.rows(
        f'SELECT "team", {sums} FROM {{daily}} WHERE {CONSUMER_SQL} AND {when} '
        'GROUP BY ALL ORDER BY 4 DESC, 3 DESC, "team"',
        params,
        booked=booked_label(chosen),
    )
    shares: dict[str | None, int] = {}
    if sharing is not IdleSharing.NONE:
        by_team = cost_report(queries, ("team",), chosen, sharing)
        shares = {line.keys[0]: line.shared_idle_micros for line in by_team.lines}
    return IdleReport(
        period=chosen.label if chosen else None,
        sharing=sharing,
        pools=tuple(PoolIdle(r[0], r[1], *(int(v) for v in r[2:])) for r in pool_rows),
        teams=tuple(
            TeamIdle(r[0], int(r[1]), int(r[2]), int(r[3]), shares.get(r[0], 0)) for r in team_rows
        ),
    )
