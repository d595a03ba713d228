"""Rollups for the dashboard: the queries behind each page, as plain values.

This module owns what the Finance, Platform, Capacity-planning and Team pages *show*: every
number on those pages comes from a function here (or from `ledger.read.reports`,
`ledger.read.statements`, `ledger.read.focus`, `ledger.read.balances` and
`ledger.read.job_history`, which these build on). Each function reads the sealed postings
through `ReportQueries.rows` (a DuckDB connection of its own over the
segments the manifest lists), the jobs topic's messages out of the sealed raw-event archive
(`ledger.read.job_history.read_job_event_log`) or the readers' copy of the admin log, and returns
frozen dataclasses; the pages only render them.

Rules every rollup here keeps:
- money and GPU time are integers (micro-units, GPU-ms) in everything computed; floats appear
  only in estimates that are not ledger amounts (utilisation averages, forecasts, queueing
  estimates) and in display;
- a *period* filter selects postings booked into the period (as `ledger.read.reports` does); the
  platform and capacity rollups are about when GPUs were used and select by `start_us`;
- "now" is the newest sealed sample (`LedgerQueries.newest_sealed_us`), never the wall clock, so
  the pages describe the ledger as sealed and a historic ledger reads the same tomorrow;
- one row per usage transaction is its capacity leg (`capacity:%`, unit `gpu_ms`): it carries the
  physical GPU time and the sample's `util_pct`; consumer and unallocated legs split that time
  between owners and nobody.

SQL is built only from constants and whitelisted dimension names; every value is a bound
parameter.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ledger.accounts import AccountKind
from ledger.admin import AdminView
from ledger.balances import BudgetStatus as TeamBudgetStatus
from ledger.balances import budget_status as balance_budget_status
from ledger.balances import fold_rows
from ledger.errors import LedgerError
from ledger.read import job_history
from ledger.read.focus import ExportFormat, FocusContext, focus_table, write_focus
from ledger.read.reports import (
    CONSUMER_SQL,
    IDLE_LEG_SQL,
    UNALLOCATED_SQL,
    IdleSharing,
    ReportQueries,
    check_dimensions,
    cost_report,
    period_clause,
    period_of,
)
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR
from ledger.store.segments import MANIFEST_NAME
from ledger.store.side_files import ADMIN_LOG_NAME, load_admin_log, load_closed_periods

HOUR_US = 3_600_000_000
DAY_US = 24 * HOUR_US
WEEK_US = 7 * DAY_US
MS_PER_HOUR = 3_600_000
CAPACITY_SQL = "account LIKE 'capacity:%'"
USAGE_SQL = "kind = 'usage'"
BUDGET_GRANT_KIND = "budget_grant"
BUDGET_PREFIX = "budget:"
# Dimensions the finance pages break cost down by, in the order a finance analyst reads them.
COST_DIMENSIONS = ("cost_centre", "team", "project", "user")
# The scheduler's default fair-share half-life (`scheduler.fair_share_half_life_hours`).
DEFAULT_HALF_LIFE_US = 168 * HOUR_US
STANDING_SCALE = 1_000_000  # standing = decayed GPU-ms × STANDING_SCALE // weight, as scheduled

Keys = tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Filters:
    """The sidebar's selection. `period`: a `YYYY-MM` label (None: all periods)."""

    period: str | None = None
    team: str | None = None
    pool: str | None = None

    def sql(self, by_booking: bool = True) -> tuple[str, list[Any]]:
        """A WHERE fragment for these filters; the period by booking or by usage time."""
        chosen = period_of(self.period)
        if by_booking or chosen is None:
            clause, params = period_clause(chosen)
        else:
            clause, params = "start_us >= ? AND start_us < ?", [chosen.start_us, chosen.end_us]
        if self.team is not None:
            clause += " AND team = ?"
            params.append(self.team)
        if self.pool is not None:
            clause += " AND pool = ?"
            params.append(self.pool)
        return clause, params


# ------------------------------------------------------------------------------ the ledger


def ledger_version(data_dir: Path | str) -> str:
    """A key that changes whenever the sealed ledger, its raw-event archive, its admin log or
    its closed periods change.

    The manifests are replaced atomically by every seal and compaction, the admin log by every
    batch of admin events, and closed-period records are written once, so their bytes identify
    what readers see.
    """
    root = Path(data_dir) / SEGMENTS_DIR
    digest = hashlib.sha256()
    for path in (
        root / MANIFEST_NAME,
        Path(data_dir) / ARCHIVE_DIR / MANIFEST_NAME,
        root / ADMIN_LOG_NAME,
    ):
        try:
            digest.update(path.read_bytes())
        except FileNotFoundError:
            digest.update(b"none: " + path.name.encode())
    closed = root / "closed"
    if closed.is_dir():
        for path in sorted(closed.glob("*.json")):
            digest.update(path.name.encode())
    return digest.hexdigest()


def closed_periods(data_dir: Path | str) -> tuple[str, ...]:
    """Labels of the closed periods of the ledger in `data_dir`, oldest first.

    A period is closed when `ledger.closing` has written its record.
    """
    return tuple(c.period for c in load_closed_periods(Path(data_dir) / SEGMENTS_DIR))


@dataclass(frozen=True, slots=True)
class Extent:
    """What the ledger holds: the choices the sidebar offers, and its time range."""

    periods: tuple[str, ...]  # newest first
    teams: tuple[str, ...]
    pools: tuple[str, ...]
    models: tuple[str, ...]
    first_us: int | None
    newest_us: int | None

    @property
    def empty(self) -> bool:
        return self.newest_us is None


def extent(q: ReportQueries) -> Extent:
    """Periods, teams, pools, models and the usage's time span of the sealed ledger, merged
    from the segments' summaries (`ledger.store.segments.SegmentSummary`): no scan of the
    postings."""
    summaries = q.segment_summaries()
    firsts = [s.usage_first_us for s in summaries if s.usage_first_us is not None]
    lasts = [s.usage_last_us for s in summaries if s.usage_last_us is not None]
    return Extent(
        periods=tuple(sorted({p for s in summaries for p in s.periods}, reverse=True)),
        teams=tuple(sorted({t for s in summaries for t in s.teams})),
        pools=tuple(sorted({p for s in summaries for p in s.pools})),
        models=tuple(sorted({m for s in summaries for m in s.models})),
        first_us=min(firsts, default=None),
        newest_us=max(lasts, default=None),
    )


# ------------------------------------------------------------------------------ finance


@dataclass(frozen=True, slots=True)
class TimeCost:
    bucket_us: int
    key: str | None
    gpu_ms: int
    money_micros: int


def cost_over_time(
    q: ReportQueries, dim: str, bucket_us: int, filters: Filters
) -> tuple[TimeCost, ...]:
    """Consumer GPU time and cost per time bucket (of `start_us`) and value of `dim`.

    Postings booked into the selected period whose interval began earlier (late usage) fall in
    the bucket where they were used, so a period's buckets can start before the period.
    """
    (dim,) = check_dimensions((dim,))
    where, params = filters.sql()
    rows = q.rows(
        f'SELECT start_us - start_us % {int(bucket_us)} AS bucket, "{dim}", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) "
        f"FROM {{postings}} WHERE {CONSUMER_SQL} AND {where} "
        f'GROUP BY ALL ORDER BY bucket, "{dim}" NULLS LAST',
        params,
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
        f"FROM {{postings}} WHERE {UNALLOCATED_SQL} AND {where}",
        params,
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
    """The `limit` most expensive jobs of the selection (consumer postings with a job id).

    Two passes over the selection: the top jobs by money over the job's key alone, then the
    details (pools, GPU time, idle waste, span) of those jobs only; aggregating the details
    for every job of a month costs several times more on a large ledger.
    """
    where, params = filters.sql()
    key = 'job_id, team, project, "user"'
    same = " AND ".join(f's."{c}" IS NOT DISTINCT FROM t."{c}"' for c in _JOB_KEY)
    rows = q.rows(
        "WITH s AS NOT MATERIALIZED (SELECT * FROM {postings} "
        f"WHERE {CONSUMER_SQL} AND job_id IS NOT NULL AND {where}), "
        f"t AS (SELECT {key}, coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money "
        f"FROM s GROUP BY ALL ORDER BY money DESC, {key} LIMIT ?) "
        f"SELECT {key}, string_agg(DISTINCT pool, ', ' ORDER BY pool), "
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money, "
        f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {IDLE_LEG_SQL}), 0), "
        f"min(start_us), max(end_us) FROM s SEMI JOIN t ON {same} "
        f"GROUP BY ALL ORDER BY money DESC, {key}",
        [*params, int(limit)],
    )
    return tuple(
        JobCost(r[0], r[1], r[2], r[3], r[4] or "", *(int(v) for v in r[5:])) for r in rows
    )


_JOB_KEY = ("job_id", "team", "project", "user")


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
        f"FROM {{postings}} WHERE {CONSUMER_SQL} AND {where} "
        'GROUP BY ALL ORDER BY waste DESC, team, "pool", "model"',
        params,
    )
    where, params = Filters(filters.period, None, filters.pool).sql()
    capacity = q.rows(
        'SELECT "pool", "model", '
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money "
        f"FROM {{postings}} WHERE {UNALLOCATED_SQL} AND {where} "
        'GROUP BY ALL ORDER BY money DESC, "pool", "model"',
        params,
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

    `granted_micros` is None when no money budget was granted for the period. `daily` holds the
    cumulative spend at the end of each day that had postings (day start µs, cumulative µ).
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


def forecast_method(window_days: int) -> str:
    return (
        f"Month-end forecast = spent so far + the average daily spend of the last {window_days} "
        "days of data (or fewer, early in the month) × the time left in the month. "
        "For a month that is over, the forecast is what was spent."
    )


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

    The forecast is a run rate in integers: spend in the last `window_days` before `as_of_us`
    (clipped to the period) × time left ÷ window length, rounded down.
    """
    chosen = period_of(period)
    assert chosen is not None
    team_sql, team_params = ("AND team = ?", [team]) if team is not None else ("", [])
    daily = q.rows(
        "SELECT team, greatest(start_us, ?) - greatest(start_us, ?) % ? AS day, sum(amount) "
        f"FROM {{postings}} WHERE {CONSUMER_SQL} AND unit = 'money_micros' AND period = ? "
        f"{team_sql} GROUP BY ALL ORDER BY team, day",
        [chosen.start_us, chosen.start_us, DAY_US, chosen.label, *team_params],
    )
    grants = q.rows(
        "SELECT substr(account, ?), -sum(amount) FROM {postings} "
        "WHERE kind = ? AND account LIKE 'budget:%' AND unit = 'money_micros' AND period = ? "
        f"{'AND account = ?' if team is not None else ''} GROUP BY ALL",
        [len(BUDGET_PREFIX) + 1, BUDGET_GRANT_KIND, chosen.label]
        + ([BUDGET_PREFIX + team] if team is not None else []),
    )
    now = min(max(as_of_us, chosen.start_us), chosen.end_us)
    window_start = max(chosen.start_us, now - window_days * DAY_US)
    recent = q.rows(
        "SELECT team, sum(amount) FROM {postings} "
        f"WHERE {CONSUMER_SQL} AND unit = 'money_micros' AND period = ? AND start_us >= ? "
        f"AND start_us < ? {team_sql} GROUP BY ALL",
        [chosen.label, window_start, now, *team_params],
    )
    per_day: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name, day, amount in daily:
        if name is not None:
            per_day[name].append((int(day), int(amount)))
    granted = {str(name): int(amount) for name, amount in grants}
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
            )
        )
    return tuple(burns)


def focus_bytes(
    q: ReportQueries, period: str, fmt: ExportFormat, context: FocusContext
) -> tuple[bytes, int]:
    """The FOCUS export of `period` as the bytes `tally export focus` writes, and its rows."""
    chosen = period_of(period)
    assert chosen is not None
    table = focus_table(q, chosen, context)
    with tempfile.TemporaryDirectory(prefix="tally-focus-") as tmp:
        path = Path(tmp) / f"focus.{fmt.value}"
        write_focus(table, path, fmt)
        return path.read_bytes(), table.num_rows


# ------------------------------------------------------------------------------ platform


class GpuState(StrEnum):
    """What a GPU (or a slice of it) was doing in its latest sealed sample."""

    BUSY = "busy"
    ALLOCATED_IDLE = "allocated_idle"
    UNALLOCATED = "unallocated"


@dataclass(frozen=True, slots=True)
class IdleGpu:
    """A GPU idle now: allocated-but-idle (with its owner) or unallocated.

    `since_us` is the start of the unbroken run of samples in this state (for allocated-but-idle:
    since the detector flagged it, after its grace period); `gpu_ms` and `money_micros` are that
    run's time and money so far (for unallocated GPUs: the cost of the idle capacity). When the
    run is longer than the lookback, `since_capped` is set and the figures cover the lookback.
    """

    state: GpuState
    gpu_uuid: str
    node: str | None
    pool: str | None
    model: str | None
    team: str | None
    project: str | None
    user: str | None
    job_id: str | None
    util_pct: int | None
    since_us: int
    last_us: int
    gpu_ms: int
    money_micros: int
    since_capped: bool = False


@dataclass(frozen=True, slots=True)
class FleetNow:
    """The fleet at the newest sealed sample: GPUs seen in the last `window_us`, idle ones."""

    as_of_us: int | None
    gpus: int
    busy: int
    idle: tuple[IdleGpu, ...]

    def count(self, state: GpuState) -> int:
        return len({g.gpu_uuid for g in self.idle if g.state is state})


_STATE_SQL = (
    "CASE WHEN account LIKE 'unallocated:%' THEN 'unallocated' "
    "WHEN idle THEN 'allocated_idle' ELSE 'busy' END"
)
_OWNER = ("team", "project", "user", "job_id")


def fleet_now(
    q: ReportQueries,
    pool: str | None = None,
    window_us: int = HOUR_US,
    lookback_us: int = 35 * DAY_US,
) -> FleetNow:
    """Idle GPUs now: each GPU's latest sample in the last `window_us` of sealed data.

    A GPU (or MIG slice) is allocated-but-idle when its latest usage is flagged idle, and
    unallocated when its latest usage is on an `unallocated:` account. GPUs with no sample in
    the window (stopped reporting) are left out. How long a GPU has been idle is looked for in
    the last `lookback_us` only (so the scan stays bounded on a long ledger).
    """
    segments = q.segments()
    newest = max((s.max_end_us for s in segments if s.max_end_us is not None), default=None)
    if newest is None:
        return FleetNow(None, 0, 0, ())
    oldest = min((s.min_start_us for s in segments if s.min_start_us is not None), default=0)
    horizon = newest - lookback_us
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    owner_match = " AND ".join(f'p."{c}" IS NOT DISTINCT FROM c."{c}"' for c in _OWNER)
    rows = q.rows(
        f"""
        WITH recent AS (
            SELECT * FROM {{postings}}
            WHERE {USAGE_SQL} AND end_us > ? AND gpu_uuid <> '' {pool_sql}
        ), latest AS (
            SELECT gpu_uuid, max(start_us) AS slot FROM recent GROUP BY gpu_uuid
        ), current AS (
            SELECT DISTINCT r.gpu_uuid, r.node, r.pool, r.model, {_STATE_SQL} AS state,
                r.team, r.project, r."user", r.job_id, r.util_pct
            FROM recent r JOIN latest l ON r.gpu_uuid = l.gpu_uuid AND r.start_us = l.slot
            WHERE r.account LIKE 'consumer:%' OR r.account LIKE 'unallocated:%'
        ), idle_now AS (
            SELECT * FROM current WHERE state <> 'busy'
        ), hist AS (
            SELECT c.*, p.start_us, p.end_us, p.unit, p.amount,
                (CASE WHEN p.account LIKE 'unallocated:%' THEN 'unallocated'
                    WHEN p.idle THEN 'allocated_idle' ELSE 'busy' END) = c.state
                    AND {owner_match} AS same
            FROM {{postings}} p JOIN idle_now c ON p.gpu_uuid = c.gpu_uuid
            WHERE p.{USAGE_SQL} AND p.start_us >= ?
                AND (p.account LIKE 'consumer:%' OR p.account LIKE 'unallocated:%')
        ), broke AS (
            SELECT gpu_uuid, state, team, project, "user", job_id,
                coalesce(max(start_us) FILTER (NOT same), -1) AS break_us
            FROM hist GROUP BY ALL
        )
        SELECT h.state, h.gpu_uuid, any_value(h.node), any_value(h.pool), any_value(h.model),
            h.team, h.project, h."user", h.job_id, any_value(h.util_pct),
            min(h.start_us), max(h.end_us),
            coalesce(sum(h.amount) FILTER (h.unit = 'gpu_ms'), 0),
            coalesce(sum(h.amount) FILTER (h.unit = 'money_micros'), 0),
            any_value(b.break_us) = -1
        FROM hist h JOIN broke b ON h.gpu_uuid = b.gpu_uuid AND h.state = b.state
            AND h.team IS NOT DISTINCT FROM b.team AND h.project IS NOT DISTINCT FROM b.project
            AND h."user" IS NOT DISTINCT FROM b."user"
            AND h.job_id IS NOT DISTINCT FROM b.job_id
        WHERE h.same AND h.start_us > b.break_us
        GROUP BY h.state, h.gpu_uuid, h.team, h.project, h."user", h.job_id
        ORDER BY h.state, 14 DESC, h.gpu_uuid
        """,
        [newest - window_us, *pool_params, horizon],
    )
    counts = q.rows(
        f"""
        WITH recent AS (
            SELECT gpu_uuid, start_us, {_STATE_SQL} AS state FROM {{postings}}
            WHERE {USAGE_SQL} AND end_us > ? AND gpu_uuid <> '' {pool_sql}
                AND (account LIKE 'consumer:%' OR account LIKE 'unallocated:%')
        ), latest AS (SELECT gpu_uuid, max(start_us) AS slot FROM recent GROUP BY gpu_uuid)
        SELECT count(DISTINCT r.gpu_uuid),
            count(DISTINCT r.gpu_uuid) FILTER (r.state = 'busy')
        FROM recent r JOIN latest l ON r.gpu_uuid = l.gpu_uuid AND r.start_us = l.slot
        """,
        [newest - window_us, *pool_params],
    )[0]
    idle = tuple(
        IdleGpu(
            GpuState(r[0]),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
            util_pct=None if r[9] is None else int(r[9]),
            since_us=int(r[10]),
            last_us=int(r[11]),
            gpu_ms=int(r[12]),
            money_micros=int(r[13]),
            since_capped=bool(r[14]) and oldest < horizon,
        )
        for r in rows
    )
    return FleetNow(newest, int(counts[0]), int(counts[1]), idle)


@dataclass(frozen=True, slots=True)
class HeatCell:
    """Utilisation of one GPU in one time bucket: GPU-time-weighted mean of `util_pct`."""

    gpu_uuid: str
    node: str | None
    pool: str | None
    model: str | None
    bucket_us: int
    util_pct: float
    gpu_ms: int


def utilisation_heatmap(
    q: ReportQueries, since_us: int, until_us: int, bucket_us: int, pool: str | None = None
) -> tuple[HeatCell, ...]:
    """GPU × time utilisation from the capacity leg of each usage transaction."""
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        f"SELECT gpu_uuid, any_value(node), any_value(pool), any_value(model), "
        f"start_us - start_us % {int(bucket_us)} AS bucket, "
        "sum(util_pct * -amount) / nullif(sum(-amount) FILTER (util_pct IS NOT NULL), 0), "
        "-sum(amount) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND {CAPACITY_SQL} AND unit = 'gpu_ms' "
        f"AND gpu_uuid <> '' AND start_us >= ? AND start_us < ? {pool_sql} "
        "GROUP BY gpu_uuid, bucket ORDER BY 3, 2, gpu_uuid, bucket",
        [since_us, until_us, *pool_params],
    )
    return tuple(
        HeatCell(r[0], r[1], r[2], r[3], int(r[4]), float(r[5] or 0.0), int(r[6])) for r in rows
    )


@dataclass(frozen=True, slots=True)
class UtilisationBand:
    """GPU time of one pool and model spent at utilisation `[low_pct, low_pct + 10)`
    (the last band includes 100 %), allocated to an owner or not."""

    pool: str | None
    model: str | None
    low_pct: int
    allocated: bool
    gpu_ms: int


def utilisation_distribution(
    q: ReportQueries, since_us: int, until_us: int, pool: str | None = None
) -> tuple[UtilisationBand, ...]:
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        'SELECT "pool", "model", least(util_pct // 10, 9) * 10 AS band, '
        f"{CONSUMER_SQL} AS allocated, sum(amount) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND util_pct IS NOT NULL "
        f"AND ({CONSUMER_SQL} OR {UNALLOCATED_SQL}) AND start_us >= ? AND start_us < ? "
        f'{pool_sql} GROUP BY ALL ORDER BY "pool", "model", band, allocated',
        [since_us, until_us, *pool_params],
    )
    return tuple(UtilisationBand(r[0], r[1], int(r[2]), bool(r[3]), int(r[4])) for r in rows)


@dataclass(frozen=True, slots=True)
class UtilisationSummary:
    """One pool and model over a time range: GPU time, the part allocated, and the
    GPU-time-weighted mean utilisation of all and of allocated time (display floats)."""

    pool: str | None
    model: str | None
    physical_gpu_ms: int
    allocated_gpu_ms: int
    mean_util_pct: float
    mean_allocated_util_pct: float


def utilisation_summary(
    q: ReportQueries, since_us: int, until_us: int, pool: str | None = None
) -> tuple[UtilisationSummary, ...]:
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        'SELECT "pool", "model", coalesce(sum(amount), 0), '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        "coalesce(sum(util_pct * amount) / nullif(sum(amount), 0), 0), "
        f"coalesce(sum(util_pct * amount) FILTER ({CONSUMER_SQL}) "
        f"/ nullif(sum(amount) FILTER ({CONSUMER_SQL}), 0), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND util_pct IS NOT NULL "
        f"AND ({CONSUMER_SQL} OR {UNALLOCATED_SQL}) AND start_us >= ? AND start_us < ? "
        f'{pool_sql} GROUP BY ALL ORDER BY "pool", "model"',
        [since_us, until_us, *pool_params],
    )
    return tuple(
        UtilisationSummary(r[0], r[1], int(r[2]), int(r[3]), float(r[4]), float(r[5])) for r in rows
    )


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Allocated and physical GPU time of one pool and model in one bucket (`None`: all)."""

    bucket_us: int
    pool: str | None
    model: str | None
    allocated_gpu_ms: int
    idle_gpu_ms: int
    physical_gpu_ms: int

    @property
    def share(self) -> float:
        """Share of GPU time allocated (display only)."""
        return self.allocated_gpu_ms / self.physical_gpu_ms if self.physical_gpu_ms else 0.0


def occupancy(
    q: ReportQueries, since_us: int, until_us: int, bucket_us: int, pool: str | None = None
) -> tuple[Occupancy, ...]:
    """Occupancy (allocated ÷ physical GPU time) per time bucket, pool and model; buckets of
    `until_us - since_us` or more give one row per pool and model for the whole range."""
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    width = int(bucket_us)
    rows = q.rows(
        f'SELECT ? + (start_us - ?) // {width} * {width} AS bucket, "pool", "model", '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        f"coalesce(sum(amount) FILTER ({IDLE_LEG_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL}), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' "
        f"AND start_us >= ? AND start_us < ? {pool_sql} "
        'GROUP BY ALL ORDER BY bucket, "pool", "model"',
        [since_us, since_us, since_us, until_us, *pool_params],
    )
    return tuple(Occupancy(int(r[0]), r[1], r[2], *(int(v) for v in r[3:])) for r in rows)


@dataclass(frozen=True, slots=True)
class NodeSeen:
    node: str
    pool: str | None
    gpus: int
    last_us: int


def nodes_last_seen(
    q: ReportQueries, pool: str | None = None, lookback_us: int = 35 * DAY_US
) -> tuple[NodeSeen, ...]:
    """Each node's newest sealed sample and GPU count (the only health signal the ledger has),
    for the nodes that reported in the last `lookback_us` of sealed data (so the scan stays
    bounded on a long ledger: a node silent for longer is not listed)."""
    newest = max((s.max_end_us for s in q.segments() if s.max_end_us is not None), default=None)
    if newest is None:
        return ()
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        "SELECT node, any_value(pool), count(DISTINCT gpu_uuid), max(end_us) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND {CAPACITY_SQL} AND unit = 'gpu_ms' "
        f"AND end_us > ? AND coalesce(node, '') <> '' {pool_sql} GROUP BY node ORDER BY 4, node",
        [newest - lookback_us, *pool_params],
    )
    return tuple(NodeSeen(r[0], r[1], int(r[2]), int(r[3])) for r in rows)


# ------------------------------------------------------------------------------ capacity


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """One UTC day of one pool and model: allocated and physical GPU time."""

    day_us: int
    pool: str | None
    model: str | None
    allocated_gpu_ms: int
    physical_gpu_ms: int


def daily_usage(
    q: ReportQueries, pool: str | None = None, model: str | None = None
) -> tuple[DailyUsage, ...]:
    """Allocated and physical GPU time per UTC day, pool and model (all history)."""
    clause = ""
    params: list[Any] = []
    if pool is not None:
        clause += " AND pool = ?"
        params.append(pool)
    if model is not None:
        clause += " AND model = ?"
        params.append(model)
    rows = q.rows(
        f'SELECT start_us - start_us % {DAY_US} AS day, "pool", "model", '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL}), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' {clause} "
        'GROUP BY ALL ORDER BY day, "pool", "model"',
        params,
    )
    return tuple(DailyUsage(int(r[0]), r[1], r[2], int(r[3]), int(r[4])) for r in rows)


@dataclass(frozen=True, slots=True)
class UsageTrend:
    """Daily GPU-hours of one model (and pool): history, complete days, and the forecast."""

    model: str
    pool: str | None
    days: tuple[tuple[int, int, int], ...]  # (day start µs, allocated GPU-ms, physical GPU-ms)
    complete: tuple[int, ...]  # day starts of the days wholly inside the sealed data
    forecast: Forecast | None


def usage_trend(
    q: ReportQueries,
    model: str,
    pool: str | None = None,
    horizon_days: int = 28,
    weeks: int = 4,
) -> UsageTrend:
    """Allocated GPU-hours per day of `model` and their forecast (`forecast_daily`).

    Only complete days are fitted: the first and last day of the data are usually partial.
    """
    per_day: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row in daily_usage(q, pool, model):
        per_day[row.day_us][0] += row.allocated_gpu_ms
        per_day[row.day_us][1] += row.physical_gpu_ms
    span = q.rows(
        f"SELECT min(start_us), max(end_us) FROM {{postings}} WHERE {USAGE_SQL} AND model = ?"
        + (" AND pool = ?" if pool is not None else ""),
        [model] + ([pool] if pool is not None else []),
    )[0]
    days = tuple((day, v[0], v[1]) for day, v in sorted(per_day.items()))
    complete: tuple[int, ...] = ()
    if span[0] is not None:
        first, last = int(span[0]), int(span[1])
        complete = tuple(d for d, _, _ in days if d >= first and d + DAY_US <= last)
    series = [(d, a / MS_PER_HOUR) for d, a, _ in days if d in set(complete)]
    return UsageTrend(model, pool, days, complete, forecast_daily(series, horizon_days, weeks))


@dataclass(frozen=True, slots=True)
class ModelTrend:
    """A pool and model's last 7 complete days against the 7 before (GPU-ms per window)."""

    pool: str | None
    model: str | None
    gpus: int
    allocated_last_gpu_ms: int
    physical_last_gpu_ms: int
    allocated_previous_gpu_ms: int


def model_trends(
    q: ReportQueries, as_of_us: int, pool: str | None = None
) -> tuple[ModelTrend, ...]:
    """Usage of every pool and model in the last 7 whole days before `as_of_us` and the 7
    days before those."""
    end = as_of_us - as_of_us % DAY_US
    mid = end - WEEK_US
    start = mid - WEEK_US
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        'SELECT "pool", "model", count(DISTINCT gpu_uuid) FILTER (start_us >= ?), '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL} AND start_us >= ?), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL} AND start_us >= ?), 0), "
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL} AND start_us < ?), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND start_us >= ? "
        f'AND start_us < ? {pool_sql} GROUP BY ALL ORDER BY "pool", "model"',
        [mid, mid, mid, mid, start, end, *pool_params],
    )
    return tuple(ModelTrend(r[0], r[1], *(int(v) for v in r[2:])) for r in rows)


@dataclass(frozen=True, slots=True)
class Forecast:
    """A daily forecast of GPU-hours and how it was made (`method` is for the page)."""

    days: tuple[int, ...]  # day start µs of each forecast point
    values: tuple[float, ...]  # GPU-hours per day
    low: tuple[float, ...]
    high: tuple[float, ...]
    fitted_days: int
    slope_per_day: float  # GPU-hours/day gained per day
    weekday_effect: tuple[float, ...]  # Monday..Sunday, GPU-hours/day; zeros without seasonality
    residual_sd: float
    method: str


def forecast_daily(
    series: Sequence[tuple[int, float]], horizon_days: int = 28, weeks: int = 4
) -> Forecast | None:
    """Forecast a daily series (day start µs, GPU-hours) `horizon_days` ahead.

    Method: least-squares linear trend over the last `weeks` × 7 days, plus weekly seasonality
    (the mean residual per weekday, when at least two weeks are fitted); the band is ±1.96 ×
    the standard deviation of what remains. Values below zero are clipped. None with fewer than
    three days of history.
    """
    points = sorted(series)[-weeks * 7 :]
    n = len(points)
    if n < 3:
        return None
    xs = [(day - points[0][0]) / DAY_US for day, _ in points]
    ys = [value for _, value in points]
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True)]
    seasonal = n >= 14
    effect = [0.0] * 7
    if seasonal:
        by_day: dict[int, list[float]] = defaultdict(list)
        for (day, _), r in zip(points, residuals, strict=True):
            by_day[_weekday(day)].append(r)
        effect = [sum(v) / len(v) if v else 0.0 for v in (by_day[d] for d in range(7))]
    rest = [r - effect[_weekday(day)] for (day, _), r in zip(points, residuals, strict=True)]
    sd = math.sqrt(sum(r * r for r in rest) / max(n - 2, 1))
    last_day = points[-1][0]
    days = tuple(last_day + k * DAY_US for k in range(1, horizon_days + 1))
    values = tuple(
        max(0.0, intercept + slope * (xs[-1] + k) + effect[_weekday(day)])
        for k, day in enumerate(days, 1)
    )
    method = (
        f"Linear trend fitted by least squares to the last {n} complete days "
        f"({slope:+.2f} GPU-hours/day per day)"
        + (
            ", plus weekly seasonality: each weekday's average deviation from that trend"
            if seasonal
            else " (weekly seasonality needs at least 14 days of history, so none is applied)"
        )
        + f". The band is ± 1.96 × the standard deviation of what is left ({sd:.1f} GPU-hours);"
        " forecasts below zero are shown as zero."
    )
    return Forecast(
        days=days,
        values=values,
        low=tuple(max(0.0, v - 1.96 * sd) for v in values),
        high=tuple(v + 1.96 * sd for v in values),
        fitted_days=n,
        slope_per_day=slope,
        weekday_effect=tuple(effect),
        residual_sd=sd,
        method=method,
    )


def _weekday(day_us: int) -> int:
    """Monday = 0 for the UTC day starting at `day_us` (1970-01-01 was a Thursday)."""
    return (day_us // DAY_US + 3) % 7


@dataclass(frozen=True, slots=True)
class Demand:
    """Observed demand for GPUs of one model (and pool) in `[since_us, until_us)`."""

    model: str
    pool: str | None
    since_us: int
    until_us: int
    gpus: int  # distinct GPUs of the model seen in the window
    allocated_gpu_ms: int
    physical_gpu_ms: int
    jobs: int  # jobs with usage in the window
    arrivals: int  # jobs whose first usage lies in the window
    job_seconds: int  # wall time of those jobs (first to last usage), summed
    job_gpu_ms: int  # GPU time of the jobs

    @property
    def hours(self) -> float:
        return (self.until_us - self.since_us) / HOUR_US

    @property
    def mean_busy_gpus(self) -> float:
        """Offered load in GPUs: allocated GPU-hours per hour."""
        return self.allocated_gpu_ms / MS_PER_HOUR / self.hours if self.hours else 0.0


def demand(
    q: ReportQueries, model: str, since_us: int, until_us: int, pool: str | None = None
) -> Demand:
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    totals = q.rows(
        "SELECT count(DISTINCT gpu_uuid) FILTER (gpu_uuid <> ''), "
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL}), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND model = ? "
        f"AND start_us >= ? AND start_us < ? {pool_sql}",
        [model, since_us, until_us, *pool_params],
    )[0]
    jobs = q.rows(
        "WITH j AS (SELECT job_id, min(start_us) AS first, max(end_us) AS last, "
        "sum(amount) AS ms "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND {CONSUMER_SQL} AND unit = 'gpu_ms' "
        f"AND job_id IS NOT NULL AND model = ? AND start_us >= ? AND start_us < ? {pool_sql} "
        "GROUP BY job_id) "
        "SELECT count(*), count(*) FILTER (first > ?), "
        "coalesce(sum((last - first) // 1000000), 0), coalesce(sum(ms), 0) FROM j",
        [model, since_us, until_us, *pool_params, since_us],
    )[0]
    return Demand(
        model,
        pool,
        since_us,
        until_us,
        int(totals[0]),
        int(totals[1]),
        int(totals[2]),
        *(int(v) for v in jobs),
    )


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival waits in an M/M/`servers` queue with offered `load`
    (Erlangs); 1.0 when the queue is unstable."""
    if load <= 0:
        return 0.0
    if servers <= load:
        return 1.0
    blocking = 1.0  # Erlang B by its stable recursion
    for n in range(1, servers + 1):
        blocking = load * blocking / (n + load * blocking)
    return servers * blocking / (servers - load * (1 - blocking))


def wait_quantile_hours(
    servers: int, arrivals_per_hour: float, service_hours: float, q: float
) -> float:
    """The `q` quantile of the wait in M/M/`servers` (hours); inf when unstable.

    P(wait > t) = C(servers, a) · exp(−(servers/S − λ) t), with a = λ S.
    """
    load = arrivals_per_hour * service_hours
    if load <= 0:
        return 0.0
    if servers <= load:
        return math.inf
    waits = erlang_c(servers, load)
    if waits <= 1 - q:
        return 0.0
    return math.log(waits / (1 - q)) / (servers / service_hours - arrivals_per_hour)


@dataclass(frozen=True, slots=True)
class Sizing:
    """How many GPUs of a model keep the `quantile` queueing delay under `target_hours`."""

    demand: Demand
    growth_pct: int
    target_hours: float
    quantile: float
    arrivals_per_hour: float
    service_hours: float
    gpus_per_job: float
    load_jobs: float  # offered load in concurrent jobs (a = λ S)
    gpus_needed: int | None  # None: no job data to model from
    wait_now_hours: float | None  # the quantile wait with the GPUs seen in the window
    assumptions: str


MAX_SERVERS = 100_000


def size_for_wait(
    found: Demand, target_hours: float, quantile: float = 0.95, growth_pct: int = 0
) -> Sizing:
    """An Erlang-C (M/M/c) estimate of the GPUs needed for `found` demand (+ `growth_pct` %).

    Jobs are the customers. S = mean job wall time (first to last usage); k = GPUs per job =
    the jobs' GPU time ÷ their wall time; λ = arrival rate that, with S and k, reproduces the
    observed mean number of allocated GPUs (λ = busy GPUs ÷ (S k)), which is robust to jobs cut
    by the window's edges. A job needs k GPUs, so c GPUs serve ⌊c / k⌋ jobs at once.
    """
    assumptions = (
        "Erlang-C (M/M/c) model: jobs arrive at random (Poisson) at a rate that reproduces the "
        "GPUs in use in the window, hold their GPUs for an exponentially distributed time with "
        "the observed mean job duration, and each needs the observed average number of GPUs; "
        "all GPUs of the model are interchangeable and jobs queue first-come first-served "
        "without priorities, quotas or preemption. Demand is what was *used*: work that was "
        "never submitted because the queue was long is not seen, and usage without a job id "
        "counts towards the load but not towards job lengths. Treat the answer as a planning "
        "estimate, not a promise."
    )
    scale = 1 + growth_pct / 100
    if found.jobs == 0 or found.job_seconds <= 0 or found.job_gpu_ms <= 0 or found.hours <= 0:
        return Sizing(
            found, growth_pct, target_hours, quantile, 0.0, 0.0, 0.0, 0.0, None, None, assumptions
        )
    service = found.job_seconds / found.jobs / 3600
    gpus_per_job = found.job_gpu_ms / (found.job_seconds * 1000)
    arrivals = found.mean_busy_gpus * scale / (service * gpus_per_job)
    load_jobs = arrivals * service
    servers = max(1, math.floor(load_jobs) + 1)
    while (
        wait_quantile_hours(servers, arrivals, service, quantile) > target_hours
        and servers < MAX_SERVERS
    ):
        servers += 1
    needed = math.ceil(servers * gpus_per_job - 1e-9)
    now_servers = math.floor(found.gpus / gpus_per_job + 1e-9)
    wait_now = wait_quantile_hours(now_servers, arrivals, service, quantile)
    return Sizing(
        found,
        growth_pct,
        target_hours,
        quantile,
        arrivals,
        service,
        gpus_per_job,
        load_jobs,
        needed,
        wait_now,
        assumptions,
    )


# ------------------------------------------------------------------------------ jobs and teams


def _data_dir(q: ReportQueries) -> Path:
    return q.root.parent


@dataclass(frozen=True, slots=True)
class JobHistory:
    """Every job the scheduler's events describe (`ledger.read.job_history.fold_jobs`), read from
    the jobs topic's messages in the sealed raw-event archive."""

    rows: tuple[job_history.JobRow, ...]
    messages: int
    undecodable: int
    newest_us: int | None

    @property
    def teams(self) -> tuple[str, ...]:
        return tuple(sorted({r.team for r in self.rows if r.team is not None}))


def _job_log(q: ReportQueries, topic: str) -> job_history.JobEventLog:
    return job_history.read_job_event_log(_data_dir(q), topic)


def job_history_of(q: ReportQueries, topic: str = job_history.DEFAULT_JOBS_TOPIC) -> JobHistory:
    log = _job_log(q, topic)
    return JobHistory(
        job_history.fold_jobs(log.events), log.messages, log.undecodable, log.newest_us
    )


def job_explanation(
    q: ReportQueries, topic: str, job_id: str, as_of_us: int
) -> job_history.Explanation:
    """`ledger.read.job_history.explain_job` for `job_id`, naming the preemptors' teams."""
    log = _job_log(q, topic)
    teams = job_history.job_teams(job_history.fold_jobs(log.events))
    return job_history.explain_job(job_id, log.events, as_of_us, teams)


def job_costs(
    q: ReportQueries, filters: Filters, only: Sequence[str] | None = None
) -> tuple[JobCost, ...]:
    """Consumer GPU time and cost per job id of the selection, most expensive first (every
    job with usage: those the scheduler ran and those it did not; with `only`, those jobs)."""
    where, params = filters.sql()
    if only is not None:
        if not only:
            return ()
        where += " AND list_contains(?, job_id)"
        params.append(list(only))
    rows = q.rows(
        'SELECT job_id, any_value(team), any_value(project), any_value("user"), '
        "string_agg(DISTINCT pool, ', ' ORDER BY pool), "
        "coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
        "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0) AS money, "
        f"coalesce(sum(amount) FILTER (unit = 'money_micros' AND {IDLE_LEG_SQL}), 0), "
        "min(start_us), max(end_us) "
        f"FROM {{postings}} WHERE {CONSUMER_SQL} AND job_id IS NOT NULL AND {where} "
        "GROUP BY job_id ORDER BY money DESC, job_id",
        params,
    )
    return tuple(
        JobCost(r[0], r[1], r[2], r[3], r[4] or "", *(int(v) for v in r[5:])) for r in rows
    )


@dataclass(frozen=True, slots=True)
class TeamBudget:
    """A team's budget in one period, as the balances projection computes it
    (`ledger.balances.budget_status`: granted − consumed − open holds per budgeted unit).

    `period` is the filter's period, else the ledger's current period (None: nothing booked);
    `status` is None when the team was never granted a budget.
    """

    team: str
    period: str | None
    current: bool
    status: TeamBudgetStatus | None


def team_budget(q: ReportQueries, team: str, period: str | None = None) -> TeamBudget:
    summaries = q.segment_summaries()  # the current period: the newest with usage, else any
    current = max((p for s in summaries for p in s.usage_periods), default=None) or max(
        (p for s in summaries for p in s.periods), default=None
    )
    chosen = period or current
    if chosen is None:
        return TeamBudget(team, None, True, None)
    rows = q.rows(  # what budget_status needs: budget and holds of every period, usage of one
        "SELECT account, unit, period, sum(amount) FROM {postings} "
        "WHERE account = ? OR account = ? GROUP BY ALL "
        "UNION ALL SELECT account, unit, period, sum(amount) FROM {postings} "
        "WHERE period = ? AND starts_with(account, ?) GROUP BY ALL",
        [
            f"{AccountKind.BUDGET}:{team}",
            f"{AccountKind.HOLD}:{team}",
            chosen,
            f"{AccountKind.CONSUMER}:{team}/",
        ],
    )
    status = balance_budget_status(team, chosen, fold_rows(rows))
    return TeamBudget(team, chosen, chosen == current, status)


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """A team's quota of one pool and model (`quotas:` admin events), and its GPUs in use now
    by its running jobs (`borrowed_gpus` of them count against other teams' unused quota)."""

    pool: str
    model: str
    nominal_gpus: int
    borrowing_limit: int | None  # None: unlimited
    lending_limit: int | None
    in_use_gpus: int
    borrowed_gpus: int
    set_by: str
    effective_us: int


@dataclass(frozen=True, slots=True)
class TeamQuotas:
    """`problem` says why the admin log could not be read (then `lines` is empty)."""

    team: str
    lines: tuple[QuotaLine, ...]
    problem: str | None = None


def _admin_view(q: ReportQueries) -> tuple[AdminView, str | None]:
    try:
        return AdminView.from_log(load_admin_log(q.root)), None
    except LedgerError as exc:
        return AdminView(), str(exc)


def team_quotas(
    q: ReportQueries, team: str, topic: str = job_history.DEFAULT_JOBS_TOPIC
) -> TeamQuotas:
    view, problem = _admin_view(q)
    in_use: dict[tuple[str | None, str | None], list[int]] = defaultdict(lambda: [0, 0])
    for row in job_history.fold_jobs(_job_log(q, topic).events):
        if row.team == team and row.state.active:
            used = in_use[(row.pool, row.model)]
            used[0] += len(row.gpu_uuids) or row.gpus
            used[1] += row.borrowed_gpus
    lines = tuple(
        QuotaLine(
            quota.pool,
            quota.model,
            quota.nominal_gpus,
            quota.borrowing_limit,
            quota.lending_limit,
            in_use[(quota.pool, quota.model)][0],
            in_use[(quota.pool, quota.model)][1],
            quota.actor,
            quota.effective_us,
        )
        for (owner, _, _), quota in sorted(view.quotas.items())
        if owner == team
    )
    return TeamQuotas(team, lines, problem)


@dataclass(frozen=True, slots=True)
class FairShareRow:
    """A team's fair-share standing: decayed metered GPU time per unit of weight (its nominal
    GPUs; 1 without a quota). Lower standing is served first; `rank` 1 is served first."""

    team: str
    decayed_gpu_ms: int
    weight: int
    standing: int
    rank: int

    @property
    def hours_per_gpu(self) -> float:
        """Decayed GPU-hours per nominal GPU (display only)."""
        return self.decayed_gpu_ms / MS_PER_HOUR / self.weight


@dataclass(frozen=True, slots=True)
class FairShare:
    as_of_us: int
    half_life_us: int
    rows: tuple[FairShareRow, ...]  # rank order
    quotas_known: bool

    def of(self, team: str) -> FairShareRow | None:
        return next((r for r in self.rows if r.team == team), None)


def fair_share(
    q: ReportQueries, as_of_us: int, half_life_us: int = DEFAULT_HALF_LIFE_US
) -> FairShare:
    """Every team's standing as of `as_of_us`, the way the scheduler orders teams.

    Metered usage is the consumer GPU time in the sealed ledger, summed per hour it ended in
    and decayed from the end of that hour: a GPU-hour `half_life_us` old counts half. The
    weight is the team's total nominal GPUs from the `quotas:` admin events (at least 1); a
    `weight:` set in the scheduler's configuration is not in the ledger and not applied here.
    """
    rows = q.rows(
        f"SELECT team, (end_us - 1) // {HOUR_US} AS hour, sum(amount) FROM {{postings}} "
        f"WHERE {CONSUMER_SQL} AND unit = 'gpu_ms' AND team IS NOT NULL AND end_us <= ? "
        "GROUP BY ALL ORDER BY team, hour",
        [as_of_us],
    )
    decayed: dict[str, float] = defaultdict(float)
    for team, hour, amount in rows:
        age = max(0, as_of_us - min(as_of_us, (int(hour) + 1) * HOUR_US))
        decayed[team] += int(amount) * 2.0 ** (-age / half_life_us)
    view, problem = _admin_view(q)
    weights: dict[str, int] = defaultdict(int)
    for (team, _, _), quota in view.quotas.items():
        weights[team] += quota.nominal_gpus
    teams = sorted(set(decayed) | set(weights))
    usage = {team: max(0, math.floor(decayed.get(team, 0.0))) for team in teams}
    standing = {t: usage[t] * STANDING_SCALE // max(1, weights.get(t, 0)) for t in teams}
    ordered = sorted(teams, key=lambda t: (standing[t], t))
    return FairShare(
        as_of_us,
        half_life_us,
        tuple(
            FairShareRow(t, usage[t], max(1, weights.get(t, 0)), standing[t], rank)
            for rank, t in enumerate(ordered, 1)
        ),
        problem is None and bool(weights),
    )


# ------------------------------------------------------------------------------ queue waits


def queue_wait_trends(
    q: ReportQueries,
    topic: str,
    since_us: int | None = None,
    until_us: int | None = None,
    pool: str | None = None,
) -> tuple[job_history.QueueWaitDay, ...]:
    """Queueing delay (submission → first start) per UTC day, pool and model, from the jobs
    topic in the archive (`ledger.read.job_history.daily_queue_waits`; None: unbounded)."""
    rows = job_history.fold_jobs(_job_log(q, topic).events)
    return job_history.daily_queue_waits(rows, since_us, until_us, pool)


def observed_queue_waits(
    q: ReportQueries,
    topic: str,
    model: str,
    since_us: int,
    until_us: int,
    pool: str | None = None,
) -> job_history.ObservedWaits:
    """The observed p50 / p95 queueing delay of `model` in a window, beside the jobs still
    waiting for it (`ledger.read.job_history.observed_waits`)."""
    rows = job_history.fold_jobs(_job_log(q, topic).events)
    return job_history.observed_waits(rows, model, since_us, until_us, pool)
