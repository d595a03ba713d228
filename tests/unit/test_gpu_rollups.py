"""The Platform and Capacity pages' per-GPU figures read from the gpus rollups
(`ledger.store.rollup_files.GPUS`, each GPU's usage per hour) equal a plain scan of the
postings — the SQL those pages ran over the postings before the level existed, kept here as the
oracle — for windows that begin and end between samples mid-hour (their ends read from the
postings, `ledger.read.rollups.hours`), in a UTC ledger, one in Asia/Shanghai (days at 16:00
UTC) and one in Asia/Kolkata (hours at :30 UTC: the level is read as its postings); and the
level's idle split adds up. The usage trend (the daily or, outside UTC, the coarse rollups), read
once for its days and its span, equals the two scans it was."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger.periods import local_day_start
from ledger.read import rollups
from ledger.read.queries import time_bucket_sql
from ledger.read.reports import CONSUMER_SQL, ReportQueries
from ledger.read.rollups.capacity import days_before, next_day
from ledger.read.rollups.hours import HourSplit
from ledger.read.rollups.shared import CAPACITY_SQL, MS_PER_HOUR, USAGE_SQL
from ledger.store.identity import IDENTITY_NAME, IDENTITY_VERSION
from tests.unit.test_dashboard_seed import A100, END_US, H100

DAY, HOUR, MINUTE = rollups.DAY_US, rollups.HOUR_US, 60_000_000
ZONES = ("UTC", "Asia/Shanghai", "Asia/Kolkata")


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory: pytest.TempPathFactory, seeded_once: Path) -> dict[str, Path]:
    """The dashboard's seeded ledger (samples every 15 minutes) in each of `ZONES`."""
    found = {}
    for zone in ZONES:
        copy = tmp_path_factory.mktemp(zone.replace("/", "-")) / "ledger"
        shutil.copytree(seeded_once, copy)
        identity = {"version": IDENTITY_VERSION, "timezone": zone}
        (copy / IDENTITY_NAME).write_text(json.dumps(identity))
        found[zone] = copy
    return found


def _pool(pool: str | None) -> tuple[str, list[Any]]:
    return ("AND pool = ?", [pool]) if pool is not None else ("", [])


# ------------------------------------------------- the oracle: the pages' scans of the postings


def scanned_heatmap(
    q: ReportQueries, since_us: int, until_us: int, bucket_us: int, pool: str | None = None
) -> tuple[rollups.HeatCell, ...]:
    pool_sql, pool_params = _pool(pool)
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
        rollups.HeatCell(r[0], r[1], r[2], r[3], int(r[4]), float(r[5] or 0.0), int(r[6]))
        for r in rows
    )


def scanned_nodes(
    q: ReportQueries, pool: str | None = None, lookback_us: int = 35 * DAY
) -> tuple[rollups.NodeSeen, ...]:
    newest = q.newest_sealed_us()
    assert newest is not None
    pool_sql, pool_params = _pool(pool)
    rows = q.rows(
        "SELECT node, any_value(pool), count(DISTINCT gpu_uuid), max(end_us) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND {CAPACITY_SQL} AND unit = 'gpu_ms' "
        f"AND end_us > ? AND coalesce(node, '') <> '' {pool_sql} GROUP BY node ORDER BY 4, node",
        [newest - lookback_us, *pool_params],
    )
    return tuple(rollups.NodeSeen(r[0], r[1], int(r[2]), int(r[3])) for r in rows)


def scanned_trends(
    q: ReportQueries, as_of_us: int, pool: str | None = None
) -> tuple[rollups.ModelTrend, ...]:
    end = local_day_start(as_of_us, q.zone)
    mid = days_before(end, 7, q.zone)
    start = days_before(mid, 7, q.zone)
    pool_sql, pool_params = _pool(pool)
    rows = q.rows(
        'SELECT "pool", "model", count(DISTINCT gpu_uuid) FILTER (start_us >= ?), '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL} AND start_us >= ?), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL} AND start_us >= ?), 0), "
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL} AND start_us < ?), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND start_us >= ? "
        f'AND start_us < ? {pool_sql} GROUP BY ALL ORDER BY "pool", "model"',
        [mid, mid, mid, mid, start, end, *pool_params],
    )
    return tuple(rollups.ModelTrend(r[0], r[1], *(int(v) for v in r[2:])) for r in rows)


def scanned_demand(
    q: ReportQueries, model: str, since_us: int, until_us: int, pool: str | None = None
) -> rollups.Demand:
    pool_sql, pool_params = _pool(pool)
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
    return rollups.Demand(
        model, pool, since_us, until_us, *(int(v) for v in totals), *(int(v) for v in jobs)
    )


def scanned_usage_trend(
    q: ReportQueries, model: str, pool: str | None = None
) -> rollups.UsageTrend:
    """The trend as the page read it before: each day's usage per pool summed (`daily_usage`),
    then the model's span in a second query, both here over the postings."""
    pool_sql, pool_params = _pool(pool)
    day = time_bucket_sql("start_us", DAY, q.zone)
    per_day: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for d, _, _, allocated, physical in q.rows(
        f'SELECT {day} AS day, "pool", "model", '
        f"coalesce(sum(amount) FILTER ({CONSUMER_SQL}), 0), "
        f"coalesce(-sum(amount) FILTER ({CAPACITY_SQL}), 0) "
        f"FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms' AND model = ? {pool_sql} "
        'GROUP BY ALL ORDER BY day, "pool", "model"',
        [model, *pool_params],
    ):
        per_day[int(d)][0] += int(allocated)
        per_day[int(d)][1] += int(physical)
    first, last = q.rows(
        f"SELECT min(start_us), max(end_us) FROM {{postings}} WHERE {USAGE_SQL} AND model = ? "
        + pool_sql,
        [model, *pool_params],
    )[0]
    days = tuple((d, v[0], v[1]) for d, v in sorted(per_day.items()))
    complete = tuple(d for d, _, _ in days if d >= first and next_day(d, q.zone) <= last)
    series = [(d, a / MS_PER_HOUR) for d, a, _ in days if d in set(complete)]
    return rollups.UsageTrend(
        model, pool, days, complete, rollups.forecast_daily(series, 28, 4, q.zone)
    )


# -------------------------------------------------------------------------------- the cases

Read = Callable[[ReportQueries], Any]
MID_DAY = END_US - DAY + 20 * MINUTE  # between two samples, 20 minutes into an hour
MID_END = END_US - 50 * MINUTE
CASES: dict[str, tuple[Read, Read]] = {
    "heatmap-mid-hour-ends": (
        lambda q: rollups.utilisation_heatmap(q, MID_DAY, MID_END, HOUR),
        lambda q: scanned_heatmap(q, MID_DAY, MID_END, HOUR),
    ),
    "heatmap-six-hours-pool": (
        lambda q: rollups.utilisation_heatmap(q, MID_DAY - 2 * DAY, MID_END, 6 * HOUR, "a100"),
        lambda q: scanned_heatmap(q, MID_DAY - 2 * DAY, MID_END, 6 * HOUR, "a100"),
    ),
    "heatmap-inside-one-hour": (
        lambda q: rollups.utilisation_heatmap(q, MID_DAY, MID_DAY + 30 * MINUTE, HOUR),
        lambda q: scanned_heatmap(q, MID_DAY, MID_DAY + 30 * MINUTE, HOUR),
    ),
    "nodes-last-seen": (rollups.nodes_last_seen, scanned_nodes),
    "nodes-last-seen-cut-mid-sample": (
        lambda q: rollups.nodes_last_seen(q, "h100", DAY + 7 * MINUTE),
        lambda q: scanned_nodes(q, "h100", DAY + 7 * MINUTE),
    ),
    "model-trends-at-the-end": (
        lambda q: rollups.model_trends(q, END_US),
        lambda q: scanned_trends(q, END_US),
    ),
    "model-trends-mid-day-pool": (
        lambda q: rollups.model_trends(q, MID_DAY + 9 * HOUR, "a100"),
        lambda q: scanned_trends(q, MID_DAY + 9 * HOUR, "a100"),
    ),
    "demand-mid-hour-ends": (
        lambda q: rollups.demand(q, H100, MID_DAY - DAY, MID_END),
        lambda q: scanned_demand(q, H100, MID_DAY - DAY, MID_END),
    ),
    "usage-trend": (
        lambda q: rollups.usage_trend(q, H100),
        lambda q: scanned_usage_trend(q, H100),
    ),
    "usage-trend-pool": (
        lambda q: rollups.usage_trend(q, A100, "a100"),
        lambda q: scanned_usage_trend(q, A100, "a100"),
    ),
    "demand-pool-on-the-hour": (
        lambda q: rollups.demand(q, A100, END_US - 2 * DAY, END_US, "a100"),
        lambda q: scanned_demand(q, A100, END_US - 2 * DAY, END_US, "a100"),
    ),
}


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize(("read", "scan"), [pytest.param(*c, id=n) for n, c in CASES.items()])
def test_the_pages_read_from_the_gpu_hours_what_a_scan_of_the_postings_finds(
    ledgers, zone, read, scan
):
    q = ReportQueries(ledgers[zone])
    try:
        found, expected = read(q), scan(q)
    finally:
        q.close()
    assert found == expected
    assert expected  # something to compare: the seeded ledger has it


def test_the_gpu_hours_split_each_gpus_time_and_stand_for_several_postings(ledgers):
    """Per GPU and hour: the physical time is the consumer time plus the unallocated time (the
    seeded ledger shares no GPU), the idle time is part of the consumer's, and a row stands for
    the 4 samples of an hour (each a capacity, a consumer or unallocated leg in GPU-ms)."""
    q = ReportQueries(ledgers["UTC"])
    try:
        (postings,) = q.rows(
            f"SELECT count(*) FROM {{postings}} WHERE {USAGE_SQL} AND unit = 'gpu_ms'"
        )[0]
        rows, counted, unbalanced, idle, physical = q.rows(
            "SELECT count(*), sum(postings), "
            "count(*) FILTER (capacity_gpu_ms + consumer_gpu_ms + unallocated_gpu_ms <> 0), "
            "sum(idle_gpu_ms), -sum(capacity_gpu_ms) FROM {gpus}"
        )[0]
        (consumer,) = q.rows("SELECT sum(consumer_gpu_ms) FROM {gpus}")[0]
        split = HourSplit(END_US - DAY + 1, END_US - 1)
    finally:
        q.close()
    assert counted == postings and rows * 8 == postings  # 4 samples × 2 legs per GPU-hour
    assert unbalanced == 0
    assert 0 < idle < consumer < physical
    assert split.hours == (END_US - DAY + HOUR, END_US - HOUR)
    assert split.edges == ((END_US - DAY + 1, END_US - DAY + HOUR), (END_US - HOUR, END_US - 1))
