"""Rollups behind the Team page: the jobs the scheduler's events describe (history, explanations,
cost per job), a team's budget, its quotas with the GPUs in use, and every team's fair-share
standing as the scheduler orders teams.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo

import numpy as np

from ledger.accounts import AccountKind
from ledger.admin import AdminView
from ledger.balances import BudgetStatus as TeamBudgetStatus
from ledger.balances import budget_status as balance_budget_status
from ledger.balances import fold_rows
from ledger.errors import LedgerError
from ledger.fractional import SHARE_UNITS
from ledger.read import job_history
from ledger.read.metered import TeamHours, team_hour_columns
from ledger.read.reports import ReportQueries
from ledger.read.rollups.finance import POOLS_SQL, JobCost
from ledger.read.rollups.shared import HOUR_US, MS_PER_HOUR, Filters, archived_job_log
from ledger.read.texts import Translate, english
from ledger.store.side_files import load_admin_log

# The scheduler's default fair-share half-life (`scheduler.fair_share_half_life_hours`).
DEFAULT_HALF_LIFE_US = 168 * HOUR_US
STANDING_SCALE = 1_000_000  # standing = decayed GPU-ms × STANDING_SCALE // weight, as scheduled


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


def job_history_of(q: ReportQueries, topic: str = job_history.DEFAULT_JOBS_TOPIC) -> JobHistory:
    log = archived_job_log(q, topic)
    return JobHistory(
        job_history.fold_jobs(log.events), log.messages, log.undecodable, log.newest_us
    )


def job_explanation(
    q: ReportQueries,
    topic: str,
    job_id: str,
    as_of_us: int,
    tr: Translate = english,
    zone: tzinfo = UTC,
) -> job_history.Explanation:
    """`ledger.read.job_history.explain_job` for `job_id`, naming the preemptors' teams, in the
    reader's language `tr`, its times on `zone`'s clock."""
    log = archived_job_log(q, topic)
    teams = job_history.job_teams(job_history.fold_jobs(log.events))
    return job_history.explain_job(job_id, log.events, as_of_us, teams, tr, zone)


def job_costs(
    q: ReportQueries, filters: Filters, only: Sequence[str] | None = None
) -> tuple[JobCost, ...]:
    """Consumer GPU time and cost per job id of the selection, most expensive first (every
    job with usage: those the scheduler ran and those it did not; with `only`, those jobs),
    from the jobs rollups (`{jobs}`)."""
    where, params = filters.sql()
    if only is not None:
        if not only:
            return ()
        where += " AND list_contains(?, job_id)"
        params.append(list(only))
    rows = q.rows(
        'SELECT job_id, any_value(team), any_value(project), any_value("user"), '
        f"{POOLS_SQL}, "
        "sum(gpu_ms), sum(money_micros) AS money, sum(idle_money_micros), "
        "min(start_us), max(end_us) "
        f"FROM {{jobs}} WHERE {where} GROUP BY job_id ORDER BY money DESC, job_id",
        params,
        booked=filters.booked,
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
        "SELECT account, unit, period, sum(amount) FROM {daily} "
        "WHERE account = ? OR account = ? GROUP BY ALL "
        "UNION ALL SELECT account, unit, period, sum(amount) FROM {daily} "
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
    by its running jobs (`borrowed_gpus` of them count against other teams' unused quota). A
    GPU share counts as its share, as the scheduler counts quota: `in_use_gpus` is the GPUs in
    use rounded up (four 0.25 shares: 1)."""

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
    for row in job_history.fold_jobs(archived_job_log(q, topic).events):
        if row.team == team and row.state.active:
            used = in_use[(row.pool, row.model)]
            whole = (len(row.gpu_uuids) or row.gpus) * SHARE_UNITS
            used[0] += whole if row.gpu_share is None else row.gpu_share
            used[1] += row.borrowed_gpus
    lines = tuple(
        QuotaLine(
            quota.pool,
            quota.model,
            quota.nominal_gpus,
            quota.borrowing_limit,
            quota.lending_limit,
            -(-in_use[(quota.pool, quota.model)][0] // SHARE_UNITS),  # GPUs, rounded up
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
    decayed = decayed_usage(team_hour_columns(q, as_of_us), as_of_us, half_life_us)
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


def decayed_usage(hours: TeamHours, as_of_us: int, half_life_us: int) -> dict[str, float]:
    """Each team's GPU-ms decayed from the end of the hour it ended in (cut at `as_of_us`) to
    `as_of_us`, summed over its hours in time order (`ledger.read.metered`, from the metered
    rollups).

    Columnar, and the same floats as the plain loop `decayed[team] += gpu_ms * 2.0 ** (-age /
    half_life_us)`: the factor is Python's power once per distinct age, products are IEEE
    doubles either way, and `bincount` adds each team's terms one by one in row order."""
    ages = np.maximum(0, as_of_us - np.minimum(as_of_us, (hours.hour + 1) * HOUR_US))
    distinct, which = np.unique(ages, return_inverse=True)
    factors = np.array([2.0 ** (-int(age) / half_life_us) for age in distinct], np.float64)
    terms = hours.gpu_ms.astype(np.float64) * factors[which]
    sums = np.bincount(hours.team, weights=terms, minlength=len(hours.teams))
    return {team: float(sums[n]) for n, team in enumerate(hours.teams)}
