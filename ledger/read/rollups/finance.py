"""Rollups behind the Finance page: cost over time and by dimension, the top jobs, idle waste,
budget burn-down (with a recurring budget's allowance and carry-over) and its month-end
forecast, and the FOCUS export's bytes.

Money is booked money: a period filter selects postings booked into the period (as
`ledger.read.reports` does).
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ledger.admin import AdminView
from ledger.errors import LedgerError
from ledger.pricing import PriceBook
from ledger.read.focus import ExportFormat, FocusContext, focus_table, write_focus
from ledger.read.queries import time_bucket_sql
from ledger.read.reports import (
    CONSUMER_SQL,
    IDLE_LEG_SQL,
    UNALLOCATED_SQL,
    IdleSharing,
    ReportQueries,
    check_dimensions,
    cost_report,
    period_of,
    source_for,
)
from ledger.read.rollups.shared import DAY_US, Filters, by_day
from ledger.read.texts import Translate, english
from ledger.store.rollup_files import HOUR_US
from ledger.store.side_files import load_admin_log
from ledger.units import Unit

BUDGET_GRANT_KIND = "budget_grant"
BUDGET_PREFIX = "budget:"
# Dimensions the finance pages break cost down by, in the order a finance analyst reads them.
COST_DIMENSIONS = ("cost_centre", "team", "project", "user")


@dataclass(frozen=True, slots=True)
class TimeCost:
    bucket_us: int
    key: str | None
    gpu_ms: int
    money_micros: int


def cost_over_time(
    q: ReportQueries, dim: str, bucket_us: int, filters: Filters
) -> tuple[TimeCost, ...]:
    """Consumer GPU time and cost per time bucket (of `start_us`: an hour or a day of the
    ledger's time zone) and value of `dim`.

    Postings booked into the selected period whose interval began earlier (late usage) fall in
    the bucket where they were used, so a period's buckets can start before the period.
    """
    (dim,) = check_dimensions((dim,))
    where, params = filters.sql()
    source = source_for((dim,))
    if source == "{coarse}" and bucket_us == DAY_US:
        source = by_day(q)  # days need no hours
    rows = q.rows(
        f'SELECT {time_bucket_sql("start_us", bucket_us, q.zone)} AS bucket, "{dim}", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) "
        f"FROM {source} WHERE {CONSUMER_SQL} AND {where} "
        f'GROUP BY ALL ORDER BY bucket, "{dim}" NULLS LAST',
        params,
        booked=filters.booked,
    )
    return tuple(TimeCost(int(b), k, int(ms), int(m)) for b, k, ms, m in rows)


@dataclass(frozen=True, slots=True)
class CostTableRow:
    key: str | None
    gpu_ms: int
    money_micros: int
    idle_gpu_ms: int
    idle_waste_micros: int
    shared_idle_micros: int

    @property
    def total_micros(self) -> int:
        return self.money_micros + self.shared_idle_micros


@dataclass(frozen=True, slots=True)
class CostTable:
    """Cost by one dimension for a selection; `unallocated_micros` is the idle capacity of the
    selected pools in the period (nobody's cost), of which `shared_micros` went to rows shown."""

    dim: str
    sharing: IdleSharing
    rows: tuple[CostTableRow, ...]
    unallocated_gpu_ms: int
    unallocated_micros: int

    @property
    def money_micros(self) -> int:
        return sum(r.money_micros for r in self.rows)

    @property
    def shared_micros(self) -> int:
        return sum(r.shared_idle_micros for r in self.rows)


def cost_table(
    q: ReportQueries, dim: str, filters: Filters, sharing: IdleSharing | str = IdleSharing.NONE
) -> CostTable:
    """`ledger.read.reports.cost_report` by `dim`, narrowed to the team and pool filters.

    Sharing is a property of a whole report, so the report is built by `dim` plus each filtered
    dimension over the whole period, then narrowed: a row shows exactly what
    `tally report cost --by <dim>,team,pool --idle-sharing …` shows for it.
    """
    (dim,) = check_dimensions((dim,))
    mode = IdleSharing(sharing)  # callers may pass the mode's text
    narrow = {name: value for name, value in (("team", filters.team), ("pool", filters.pool))}
    narrow = {name: value for name, value in narrow.items() if value is not None}
    dims = (dim, *(name for name in narrow if name != dim))
    report = cost_report(q, dims, filters.period, mode)
    sums: dict[str | None, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for line in report.lines:
        values = dict(zip(dims, line.keys, strict=True))
        if any(values[name] != value for name, value in narrow.items()):
            continue
        acc = sums[line.keys[0]]
        acc[0] += line.gpu_ms
        acc[1] += line.money_micros
        acc[2] += line.idle_gpu_ms
        acc[3] += line.idle_waste_micros
        acc[4] += line.shared_idle_micros
    rows = sorted(
        (CostTableRow(key, *values) for key, values in sums.items()),
        key=lambda r: (-r.total_micros, r.key is None, r.key or ""),
    )
    where, params = Filters(filters.period, None, filters.pool).sql()
    unallocated = q.rows(
        "SELECT coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) "
        f"FROM {{daily}} WHERE {UNALLOCATED_SQL} AND {where}",
        params,
        booked=filters.booked,
    )[0]
    return CostTable(dim, mode, tuple(rows), int(unallocated[0]), int(unallocated[1]))


@dataclass(frozen=True, slots=True)
class JobCost:
    job_id: str
    team: str | None
    project: str | None
    user: str | None
    pools: str
    gpu_ms: int
    money_micros: int
    idle_waste_micros: int
    first_us: int
    last_us: int


def top_jobs(q: ReportQueries, filters: Filters, limit: int = 20) -> tuple[JobCost, ...]:
    """The `limit` most expensive jobs of the selection (consumer postings with a job id), from
    the jobs rollups (`{jobs}`: each job's totals per booked period).

    Two passes over the selection: the top jobs by money over the job's key alone, then the
    details (pools, GPU time, idle waste, span) of those jobs only; aggregating the details
    for every job of a month costs several times more on a large ledger.
    """
    where, params = filters.sql()
    key = 'job_id, team, project, "user"'
    same = " AND ".join(f's."{c}" IS NOT DISTINCT FROM t."{c}"' for c in _JOB_KEY)
    rows = q.rows(
        f"WITH s AS NOT MATERIALIZED (SELECT * FROM {{jobs}} WHERE {where}), "
        f"t AS (SELECT {key}, sum(money_micros) AS money "
        f"FROM s GROUP BY ALL ORDER BY money DESC, {key} LIMIT ?) "
        f"SELECT {key}, {POOLS_SQL}, "
        "sum(gpu_ms), sum(money_micros) AS money, sum(idle_money_micros), "
        f"min(start_us), max(end_us) FROM s SEMI JOIN t ON {same} "
        f"GROUP BY ALL ORDER BY money DESC, {key}",
        [*params, int(limit)],
        booked=filters.booked,
    )
    return tuple(
        JobCost(r[0], r[1], r[2], r[3], r[4] or "", *(int(v) for v in r[5:])) for r in rows
    )


_JOB_KEY = ("job_id", "team", "project", "user")
# A job's pools, distinct, sorted and joined (what `string_agg(DISTINCT pool, ', ' ORDER BY
# pool)` gives, without the DISTINCT aggregate's extra pass: job costs took twice as long)
POOLS_SQL = "array_to_string(list_sort(list_distinct(list(pool))), ', ')"


@dataclass(frozen=True, slots=True)
class IdleWasteRow:
    """Allocated-but-idle time and its money for one team on one pool and model."""

    team: str | None
    pool: str | None
    model: str | None
    allocated_gpu_ms: int
    idle_gpu_ms: int
    idle_waste_micros: int


@dataclass(frozen=True, slots=True)
class UnallocatedRow:
    pool: str | None
    model: str | None
    gpu_ms: int
    money_micros: int


@dataclass(frozen=True, slots=True)
class IdleWaste:
    rows: tuple[IdleWasteRow, ...]
    unallocated: tuple[UnallocatedRow, ...]

    @property
    def idle_waste_micros(self) -> int:
        return sum(r.idle_waste_micros for r in self.rows)

    @property
    def unallocated_micros(self) -> int:
        return sum(r.money_micros for r in self.unallocated)

    def by_team(self) -> tuple[IdleWasteRow, ...]:
        """The rows summed per team (pool and model None), most waste first."""
        sums: dict[str | None, list[int]] = defaultdict(lambda: [0, 0, 0])
        for row in self.rows:
            acc = sums[row.team]
            acc[0] += row.allocated_gpu_ms
            acc[1] += row.idle_gpu_ms
            acc[2] += row.idle_waste_micros
        teams = [IdleWasteRow(team, None, None, *values) for team, values in sums.items()]
        return tuple(sorted(teams, key=lambda r: (-r.idle_waste_micros, r.team or "")))


def idle_waste(q: ReportQueries, filters: Filters) -> IdleWaste:
    """Idle money of the selection: allocated-but-idle per team, pool and model, and the
    unallocated capacity per pool and model (the team filter does not apply to it)."""
    where, params = filters.sql()
    rows = q.rows(
        'SELECT team, "pool", "model", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {IDLE_LEG_SQL}), 0), "
        f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {IDLE_LEG_SQL}), 0) AS waste "
        f"FROM {{daily}} WHERE {CONSUMER_SQL} AND {where} "
        'GROUP BY ALL ORDER BY waste DESC, team, "pool", "model"',
        params,
        booked=filters.booked,
    )
    where, params = Filters(filters.period, None, filters.pool).sql()
    capacity = q.rows(
        'SELECT "pool", "model", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money "
        f"FROM {{daily}} WHERE {UNALLOCATED_SQL} AND {where} "
        'GROUP BY ALL ORDER BY money DESC, "pool", "model"',
        params,
        booked=filters.booked,
    )
    return IdleWaste(
        rows=tuple(IdleWasteRow(r[0], r[1], r[2], *(int(v) for v in r[3:])) for r in rows),
        unallocated=tuple(UnallocatedRow(r[0], r[1], int(r[2]), int(r[3])) for r in capacity),
    )


class BudgetStatus(StrEnum):
    NO_BUDGET = "no budget"
    OVER = "over budget"
    FORECAST_OVER = "forecast over budget"
    ON_TRACK = "on track"


@dataclass(frozen=True, slots=True)
class BudgetBurn:
    """A team's month: money budget granted, spent so far, and the month-end forecast.

    `granted_micros` is None when no money budget was granted for the period. Of it, a recurring
    budget granted `allowance_micros` and carried `carried_micros` over from the previous month
    (both None without a recurring money budget that month; the rest are one-off grants).
    `daily` holds the cumulative spend at the end of each day that had postings (day start µs,
    cumulative µ).
    """

    team: str
    period: str
    granted_micros: int | None
    spent_micros: int
    forecast_micros: int
    as_of_us: int
    daily: tuple[tuple[int, int], ...]
    rate_window_us: int
    rate_window_micros: int
    allowance_micros: int | None = None  # a recurring budget's allowance for the period
    carried_micros: int | None = None  # what it carried over from the previous month

    @property
    def remaining_micros(self) -> int | None:
        return None if self.granted_micros is None else self.granted_micros - self.spent_micros

    @property
    def status(self) -> BudgetStatus:
        if self.granted_micros is None:
            return BudgetStatus.NO_BUDGET
        if self.spent_micros > self.granted_micros:
            return BudgetStatus.OVER
        if self.forecast_micros > self.granted_micros:
            return BudgetStatus.FORECAST_OVER
        return BudgetStatus.ON_TRACK

    @property
    def forecast_over_micros(self) -> int | None:
        """How far the forecast exceeds the budget (negative: headroom)."""
        if self.granted_micros is None:
            return None
        return self.forecast_micros - self.granted_micros


def forecast_method(window_days: int, tr: Translate = english) -> str:
    return tr(
        "Month-end forecast = spent so far + the average daily spend of the last {days} "
        "days of data (or fewer, early in the month) × the time left in the month. "
        "For a month that is over, the forecast is what was spent."
    ).format(days=window_days)


def budget_burn(
    q: ReportQueries,
    period: str,
    as_of_us: int,
    team: str | None = None,
    window_days: int = 7,
) -> tuple[BudgetBurn, ...]:
    """Budget burn-down of every team (or `team`) with spend or a money grant in `period`.

    Spend is the team's consumer money booked into the period (all kinds, so credits lower
    it): what `ledger.read.statements` calls *used*. Grants are `budget_grant` postings on
    `budget:<team>`, whose credit is negative by the ledger's sign convention.

    Allowance and carry-over come from the admin log's allowance records
    (`ledger.admin.recurring`); an unreadable log leaves them None.

    The forecast is a run rate in integers: spend in the last `window_days` before `as_of_us`
    (clipped to the period) × time left ÷ window length, rounded down.
    """
    chosen = period_of(period, q.zone)
    assert chosen is not None
    team_sql, team_params = ("AND team = ?", [team]) if team is not None else ("", [])
    day_sql = time_bucket_sql(f"greatest(start_us, {int(chosen.start_us)})", DAY_US, q.zone)
    daily = q.rows(
        f"SELECT team, {day_sql} AS day, sum(amount) "
        f"FROM {by_day(q)} WHERE {CONSUMER_SQL} AND unit = 'money_micros' AND period = ? "
        f"{team_sql} GROUP BY ALL ORDER BY team, day",
        [chosen.label, *team_params],
        booked=chosen.label,
    )
    grants = q.rows(
        "SELECT substr(account, ?), -sum(amount) FROM {daily} "
        "WHERE kind = ? AND account LIKE 'budget:%' AND unit = 'money_micros' AND period = ? "
        f"{'AND account = ?' if team is not None else ''} GROUP BY ALL",
        [len(BUDGET_PREFIX) + 1, BUDGET_GRANT_KIND, chosen.label]
        + ([BUDGET_PREFIX + team] if team is not None else []),
        booked=chosen.label,
    )
    now = min(max(as_of_us, chosen.start_us), chosen.end_us)
    window_start = max(chosen.start_us, now - window_days * DAY_US)
    recent = _spend_between(q, chosen.label, window_start, now, team_sql, team_params)
    per_day: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name, day, amount in daily:
        if name is not None:
            per_day[name].append((int(day), int(amount)))
    granted = {str(name): int(amount) for name, amount in grants}
    try:
        recurring = AdminView.from_log(load_admin_log(q.root)).allowances
    except LedgerError:
        recurring = {}
    in_window = {name: int(amount) for name, amount in recent if name is not None}
    remaining_us = chosen.end_us - now
    window_us = now - window_start
    burns = []
    for name in sorted(set(per_day) | set(granted)):
        running = 0
        cumulative = []
        for day, amount in per_day.get(name, []):
            running += amount
            cumulative.append((day, running))
        rate_micros = in_window.get(name, 0)
        record = recurring.get((name, Unit.MONEY, chosen.label))
        extra = rate_micros * remaining_us // window_us if window_us > 0 else 0
        burns.append(
            BudgetBurn(
                team=name,
                period=chosen.label,
                granted_micros=granted.get(name),
                spent_micros=running,
                forecast_micros=running + max(extra, 0),
                as_of_us=now,
                daily=tuple(cumulative),
                rate_window_us=window_us,
                rate_window_micros=rate_micros,
                allowance_micros=record.allowance if record else None,
                carried_micros=record.carried if record else None,
            )
        )
    return tuple(burns)


def focus_bytes(
    q: ReportQueries,
    period: str,
    fmt: ExportFormat,
    context: FocusContext,
    prices: PriceBook | None = None,
) -> tuple[bytes, int]:
    """The FOCUS export of `period` as the bytes `tally export focus` writes, and its rows;
    `prices` is the configuration's price book."""
    chosen = period_of(period, q.zone)
    assert chosen is not None
    table = focus_table(q, chosen, context, prices)
    with tempfile.TemporaryDirectory(prefix="tally-focus-") as tmp:
        path = Path(tmp) / f"focus.{fmt.value}"
        write_focus(table, path, fmt)
        return path.read_bytes(), table.num_rows


def _spend_between(
    q: ReportQueries, period: str, lo: int, hi: int, team_sql: str, team_params: list[str]
) -> list[tuple[str | None, int]]:
    """Consumer money per team booked into `period` whose usage started in [lo, hi): the whole
    hours from the rollups, the part hours at either end from the postings of the segments that
    can hold them."""
    first_hour = -(-lo // HOUR_US) * HOUR_US
    last_hour = hi // HOUR_US * HOUR_US
    spans = [(lo, hi)] if first_hour >= last_hour else [(lo, first_hour), (last_hour, hi)]
    sql = (
        "SELECT team, sum(amount) FROM {source} "
        f"WHERE {CONSUMER_SQL} AND unit = 'money_micros' AND period = ? AND start_us >= ? "
        f"AND start_us < ? {team_sql} GROUP BY ALL"
    )
    rows: list[tuple[Any, ...]] = []
    if first_hour < last_hour:
        rows += q.rows(
            sql.format(source="{coarse}"),
            [period, first_hour, last_hour, *team_params],
            booked=period,
        )
    for start, end in spans:
        if start < end:
            rows += q.rows(
                sql.format(source="{postings}"),
                [period, start, end, *team_params],
                (start, end),
                booked=period,
            )
    spent: dict[str | None, int] = defaultdict(int)
    for team, amount in rows:
        spent[team] += int(amount)
    return list(spent.items())
