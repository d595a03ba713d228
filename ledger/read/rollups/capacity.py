"""Rollups behind the Capacity-planning page: daily usage and its trend and forecast per model,
week-on-week model trends, observed demand with Erlang-C (M/M/c) sizing for a queueing-delay
target, and the queueing delays observed in the jobs topic.

Days are the ledger's time zone's (`LedgerQueries.zone`, `ledger.timezone`): in Asia/Shanghai
a day starts at 16:00 UTC. Forecasts and queueing estimates are display floats, never ledger
amounts. Nothing here reads the postings but the ends of the demand window: daily usage reads
the daily (or coarse) rollups, the model trends each GPU's hours (`{gpus}`), the demand each
GPU's hours and the fine rollups' jobs for the window's whole hours and the postings for the
parts of an hour at its ends (`hours.HourSplit`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any

from ledger.periods import local_day_start, local_time
from ledger.read import job_history
from ledger.read.queries import time_bucket_sql
from ledger.read.reports import CONSUMER_SQL, ReportQueries
from ledger.read.rollups.hours import HourSplit
from ledger.read.rollups.shared import (
    CAPACITY_SQL,
    DAY_US,
    HOUR_US,
    MS_PER_HOUR,
    USAGE_SQL,
    archived_job_log,
    by_day,
)
from ledger.read.texts import N_, Translate, english
from ledger.store.rollup_files import FINE, GPUS


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """One day (the ledger's zone) of one pool and model: allocated and physical GPU time."""

    day_us: int
    pool: str | None
    model: str | None
    allocated_gpu_ms: int
    physical_gpu_ms: int


def daily_usage(
    q: ReportQueries, pool: str | None = None, model: str | None = None
) -> tuple[DailyUsage, ...]:
    """Allocated and physical GPU time per day (the ledger's zone), pool and model (all
    history)."""
    clause = ""
    params: list[Any] = []
    if pool is not None:
        clause += " AND pool = ?"
        params.append(pool)
    if model is not None:
        clause += " AND model = ?"
        params.append(model)
    rows = q.rows(
        f'SELECT {time_bucket_sql("start_us", DAY_US, q.zone)} AS day, "pool", "model", '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL}), 0) "
        f"FROM {by_day(q)} WHERE {USAGE_SQL} AND unit = 'gpu_ms' {clause} "
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

    Only complete days are fitted: the first and last day of the data are usually partial. One
    read of the days' rows gives both: each day's GPU time (`daily_usage`'s, its pools summed)
    and the span of the model's usage in any unit.
    """
    rows = q.rows(
        f"SELECT {time_bucket_sql('start_us', DAY_US, q.zone)} AS day, "
        f"coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND {CONSUMER_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER (unit = 'gpu_ms' AND {CAPACITY_SQL}), 0), "
        "bool_or(unit = 'gpu_ms'), min(start_us), max(end_us) "
        f"FROM {by_day(q)} WHERE {USAGE_SQL} AND model = ?"
        + (" AND pool = ?" if pool is not None else "")
        + " GROUP BY day ORDER BY day",
        [model] + ([pool] if pool is not None else []),
    )
    days = tuple((int(r[0]), int(r[1]), int(r[2])) for r in rows if r[3])
    starts = [r[4] for r in rows if r[4] is not None]
    ends = [r[5] for r in rows if r[5] is not None]
    complete: tuple[int, ...] = ()
    if starts and ends:
        first, last = int(min(starts)), int(max(ends))
        complete = tuple(d for d, _, _ in days if d >= first and next_day(d, q.zone) <= last)
    series = [(d, a / MS_PER_HOUR) for d, a, _ in days if d in set(complete)]
    forecast = forecast_daily(series, horizon_days, weeks, q.zone)
    return UsageTrend(model, pool, days, complete, forecast)


def next_day(day_us: int, zone: tzinfo = UTC) -> int:
    """The start of the day after the one starting at `day_us` in `zone` (a local day lasts
    23 to 25 hours where clocks change)."""
    return local_day_start(day_us + DAY_US + HOUR_US, zone)


def days_before(day_us: int, days: int, zone: tzinfo = UTC) -> int:
    """The start of the day `days` local days before the day starting at `day_us`."""
    return local_day_start(day_us - days * DAY_US + 2 * HOUR_US, zone)


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
    """Usage of every pool and model in the last 7 whole days (the ledger's zone) before
    `as_of_us` and the 7 days before those, from each GPU's hours (`{gpus}`: the days begin on
    hours; in a zone whose do not, the level is read as its postings)."""
    end = local_day_start(as_of_us, q.zone)
    mid = days_before(end, 7, q.zone)
    start = days_before(mid, 7, q.zone)
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    rows = q.rows(
        'SELECT "pool", "model", count(DISTINCT gpu_uuid) FILTER (start_us >= ?), '
        "coalesce(sum(consumer_gpu_ms) FILTER (start_us >= ?), 0), "
        "coalesce(-sum(capacity_gpu_ms) FILTER (start_us >= ?), 0), "
        "coalesce(sum(consumer_gpu_ms) FILTER (start_us < ?), 0) "
        "FROM {gpus} WHERE start_us >= ? "
        f'AND start_us < ? {pool_sql} GROUP BY ALL ORDER BY "pool", "model"',
        [mid, mid, mid, mid, start, end, *pool_params],
        (start, end),
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
    series: Sequence[tuple[int, float]],
    horizon_days: int = 28,
    weeks: int = 4,
    zone: tzinfo = UTC,
) -> Forecast | None:
    """Forecast a daily series (day start µs, GPU-hours) `horizon_days` ahead.

    Method: least-squares linear trend over the last `weeks` × 7 days, plus weekly seasonality
    (the mean residual per weekday, when at least two weeks are fitted); the band is ±1.96 ×
    the standard deviation of what remains. Values below zero are clipped. None with fewer than
    three days of history. Days and weekdays are `zone`'s.
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
            by_day[_weekday(day, zone)].append(r)
        effect = [sum(v) / len(v) if v else 0.0 for v in (by_day[d] for d in range(7))]
    rest = [r - effect[_weekday(day, zone)] for (day, _), r in zip(points, residuals, strict=True)]
    sd = math.sqrt(sum(r * r for r in rest) / max(n - 2, 1))
    last_day = points[-1][0]
    ahead = [last_day]
    for _k in range(horizon_days):
        ahead.append(next_day(ahead[-1], zone))
    days = tuple(ahead[1:])
    values = tuple(
        max(0.0, intercept + slope * (xs[-1] + k) + effect[_weekday(day, zone)])
        for k, day in enumerate(days, 1)
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
        method=usage_forecast_method(n, slope, sd),
    )


def usage_forecast_method(
    fitted_days: int, slope_per_day: float, residual_sd: float, tr: Translate = english
) -> str:
    """How `forecast_daily` made a forecast, for the page (`Forecast.method` in English)."""
    seasonal = fitted_days >= 14
    return (
        tr(
            "Linear trend fitted by least squares to the last {days} complete days "
            "({slope} GPU-hours/day per day)"
        ).format(days=fitted_days, slope=f"{slope_per_day:+.2f}")
        + (
            tr(", plus weekly seasonality: each weekday's average deviation from that trend")
            if seasonal
            else tr(" (weekly seasonality needs at least 14 days of history, so none is applied)")
        )
        + tr(
            ". The band is ± 1.96 × the standard deviation of what is left ({sd} GPU-hours);"
            " forecasts below zero are shown as zero."
        ).format(sd=f"{residual_sd:.1f}")
    )


def _weekday(day_us: int, zone: tzinfo = UTC) -> int:
    """Monday = 0 for the day (in `zone`) starting at `day_us`."""
    return local_time(day_us, zone).weekday()


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
    """Usage of `model` started in [`since_us`, `until_us`): GPU totals from each GPU's hours
    (`{gpus}`), the jobs from the fine rollups (each job's first start and last end per hour),
    both for the window's whole hours, and from the postings for the parts of an hour at its
    ends (`HourSplit`)."""
    pool_sql, pool_params = ("AND pool = ?", [pool]) if pool is not None else ("", [])
    split = HourSplit(since_us, until_us)
    gpus, gpu_params = split.source(GPUS)
    totals = q.rows(
        "SELECT count(DISTINCT gpu_uuid) FILTER (gpu_uuid <> ''), "
        "coalesce(sum(consumer_gpu_ms), 0), coalesce(-sum(capacity_gpu_ms), 0) "
        f"FROM {gpus} WHERE model = ? {pool_sql}",
        [*gpu_params, model, *pool_params],
        split.started,
        edges=split.edges,
    )[0]
    fine, fine_params = split.source(FINE)
    jobs = q.rows(
        "WITH j AS (SELECT job_id, min(start_us) AS first, max(end_us) AS last, "
        "sum(amount) AS ms "
        f"FROM {fine} WHERE {USAGE_SQL} AND {CONSUMER_SQL} AND unit = 'gpu_ms' "
        f"AND job_id IS NOT NULL AND model = ? {pool_sql} "
        "GROUP BY job_id) "
        "SELECT count(*), count(*) FILTER (first > ?), "
        "coalesce(sum((last - first) // 1000000), 0), coalesce(sum(ms), 0) FROM j",
        [*fine_params, model, *pool_params, since_us],
        split.started,
        edges=split.edges,
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
SIZING_ASSUMPTIONS = N_(
    "Erlang-C (M/M/c) model: jobs arrive at random (Poisson) at a rate that reproduces the "
    "GPUs in use in the window, hold their GPUs for an exponentially distributed time with "
    "the observed mean job duration, and each needs the observed average number of GPUs; "
    "all GPUs of the model are interchangeable and jobs queue first-come first-served "
    "without priorities, quotas or preemption. Demand is what was *used*: work that was "
    "never submitted because the queue was long is not seen, and usage without a job id "
    "counts towards the load but not towards job lengths. Treat the answer as a planning "
    "estimate, not a promise."
)  # `Sizing.assumptions`, translated where shown


def size_for_wait(
    found: Demand, target_hours: float, quantile: float = 0.95, growth_pct: int = 0
) -> Sizing:
    """An Erlang-C (M/M/c) estimate of the GPUs needed for `found` demand (+ `growth_pct` %).

    Jobs are the customers. S = mean job wall time (first to last usage); k = GPUs per job =
    the jobs' GPU time ÷ their wall time; λ = arrival rate that, with S and k, reproduces the
    observed mean number of allocated GPUs (λ = busy GPUs ÷ (S k)), which is robust to jobs cut
    by the window's edges. A job needs k GPUs, so c GPUs serve ⌊c / k⌋ jobs at once.
    """
    assumptions = SIZING_ASSUMPTIONS
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


def queue_wait_trends(
    q: ReportQueries,
    topic: str,
    since_us: int | None = None,
    until_us: int | None = None,
    pool: str | None = None,
) -> tuple[job_history.QueueWaitDay, ...]:
    """Queueing delay (submission → first start) per day (the ledger's zone), pool and model,
    from the jobs topic in the archive (`ledger.read.job_history.daily_queue_waits`; None:
    unbounded)."""
    rows = job_history.fold_jobs(archived_job_log(q, topic).events)
    return job_history.daily_queue_waits(rows, since_us, until_us, pool, q.zone)


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
    rows = job_history.fold_jobs(archived_job_log(q, topic).events)
    return job_history.observed_waits(rows, model, since_us, until_us, pool)
