"""Segment rollups (`ledger.store.rollup_files`): every sealed postings segment's rollup equals the
aggregation of its postings exactly — after seals, after compaction, after a rebuild (in
`test_rebuild`) — `verify` notices one that lies, and every dashboard read model returns the same
values from the rollups as from the segments (a ledger whose manifest names no rollups is read
from its postings)."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import duckdb
import pytest

from ledger.read import rollups
from ledger.read.metered import hourly_team_usage, team_hour_columns, team_hour_usage
from ledger.read.queries import time_bucket_sql
from ledger.read.reports import IdleSharing, ReportQueries, cost_report, idle_report
from ledger.read.reports import ledger_money_total as money_total
from ledger.read.rollups.finance import POOLS_SQL
from ledger.read.rollups.shared import by_day
from ledger.read.rollups.team import DEFAULT_HALF_LIFE_US, decayed_usage
from ledger.read.statements import team_statement
from ledger.store.hot import DuckDBStore
from ledger.store.identity import IDENTITY_NAME, IDENTITY_VERSION
from ledger.store.layout import SEGMENTS_DIR, sql_list
from ledger.store.objects import LocalObjectStore
from ledger.store.replica import Publisher, pull
from ledger.store.rollup_files import (
    COARSE,
    DAILY,
    DAY_US,
    FINE,
    GPUS,
    HOUR_US,
    JOBS,
    LEVELS,
    METERED,
    RollupLevel,
    hour_aligned,
)
from ledger.store.segments import MANIFEST_NAME, Manifest, file_sha256
from ledger.store.verify import verify_ledger
from tests.unit.test_dashboard_seed import A100, END_US, H100
from tests.unit.test_store import ingest, message

Group = tuple[Any, ...]


def postings_folded(data_dir: Path, level: RollupLevel = FINE) -> dict[Group, list[int]]:
    """The oracle: every posting of the sealed segments, folded in Python per `level`'s keys
    and UTC hours (of its start; for the coarse level also of its end) into its measures: [amount,
    postings, first start, last end]; for the jobs level [GPU-ms, money, idle GPU-ms, idle
    money, postings, first start, last end]; for the gpus level [capacity, consumer, idle and
    unallocated GPU-ms, capacity GPU-ms with a utilisation and utilisation × GPU-ms, postings,
    first start, last end, last end of a capacity leg]."""
    files = Manifest(data_dir / SEGMENTS_DIR).files()
    rows = duckdb.connect().execute(
        f"SELECT {level.keys_sql()}, amount, start_us, end_us, account, unit, idle, team, job_id, "
        f"kind, model, util_pct FROM read_parquet([{sql_list(files)}])"
    )
    folded: dict[Group, list[int]] = {}
    n = len(level.keys)
    for row in rows.fetchall():
        amount, start, end, account, unit, idle, team, job, kind, model, util = row[n:]
        consumer = account.startswith("consumer:")
        if level is METERED and not (consumer and unit == "gpu_ms" and team is not None):
            continue  # the metered rollup sums teams' consumer GPU time only
        if level is JOBS and not (consumer and job is not None):
            continue  # the jobs rollup: consumer postings with a job id
        usage = kind == "usage" or (kind == "reversal" and model not in (None, ""))
        if level is GPUS and not (usage and unit == "gpu_ms"):
            continue  # the gpus rollup: usage (net of reversals) in GPU time
        key = (*row[:n], *_hours(level, start, end))
        if level is JOBS:
            gpu, money = (amount if unit == u else 0 for u in ("gpu_ms", "money_micros"))
            values = [gpu, money, gpu if idle else 0, money if idle else 0, 1, start, end]
        elif level is GPUS:
            capacity = account.startswith("capacity:")
            rated = capacity and util is not None
            values = [
                *(amount if side else 0 for side in (capacity, consumer, consumer and idle)),
                amount if account.startswith("unallocated:") else 0,
                amount if rated else 0,
                util * amount if rated else 0,
                1, start, end, end if capacity else None,
            ]  # fmt: skip
        else:
            values = [amount, 1, start, end]
        _merge(level, folded.setdefault(key, _empty(level)), values)
    return folded


def _empty(level: RollupLevel) -> list[Any]:
    """A group's measures before any posting: sums 0, firsts and lasts none."""
    return [0 if m.agg == "sum" else None for m in level.measures]


def _merge(level: RollupLevel, acc: list[Any], values: Sequence[Any]) -> None:
    """Add a posting's (or a rollup row's) measures to a group's, each by its aggregate: sums,
    first starts and last ends."""
    for n, (measure, value) in enumerate(zip(level.measures, values, strict=True)):
        if measure.agg == "sum":
            acc[n] += value
        elif value is not None:
            pick = min if measure.agg == "min" else max
            acc[n] = value if acc[n] is None else pick(acc[n], value)


def _hours(level: RollupLevel, start: int | None, end: int | None) -> tuple[int | None, ...]:
    """A posting's (or a group's: its first start, last end) buckets at `level`, in Python."""
    if start is None or end is None:
        return (None,) * len(level.hours)
    return {
        FINE: (start // HOUR_US,),
        COARSE: (start // HOUR_US, (end - 1) // HOUR_US),
        DAILY: (start // DAY_US,),
        METERED: ((end - 1) // HOUR_US,),
        JOBS: (),
        GPUS: (start // HOUR_US,),
    }[level]


def rollups_folded(data_dir: Path, level: RollupLevel = FINE) -> dict[Group, list[int]]:
    """`level`'s rollups the manifest names, merged per key and hours (a group cut by segment
    boundaries is in several rollups); a group's first start and last end give its hours."""
    root = data_dir / SEGMENTS_DIR
    entries = Manifest(root).load()
    infos = [s.rollup_of(level.name) for s in entries]
    assert entries and all(r is not None for r in infos)
    files = [root / r.path for r in infos if r is not None]
    rows = duckdb.connect().execute(
        f"SELECT {level.columns_sql()} FROM read_parquet([{sql_list(files)}])"
    )
    folded: dict[Group, list[int]] = {}
    n = len(level.keys)
    for row in rows.fetchall():
        values = row[n:]
        start, end = (values[level.columns.index(c) - n] for c in ("start_us", "end_us"))
        key = (*row[:n], *_hours(level, start, end))
        _merge(level, folded.setdefault(key, _empty(level)), values)
    return folded


def test_rollups_equal_the_postings_after_seals_and_after_compaction(tmp_path):
    data_dir = tmp_path / "ledger"
    levels = LEVELS
    with DuckDBStore(data_dir) as store:
        for n in range(5):  # five small segments over two partitions, hours apart
            times = (n * 40, n * 40 + 1, n * 40 + 30)
            ingest(store, message(n // 2, *times, partition=n % 2))
            store.seal(compact_min_segments=100)
        assert len(Manifest(data_dir / SEGMENTS_DIR).load()) == 5
        sealed = [rollups_folded(data_dir, level) for level in levels]
        assert sealed == [postings_folded(data_dir, level) for level in levels]
        assert verify_ledger(data_dir).ok
        store.seal(compact_min_segments=2)  # merges each partition's segments
    segments = Manifest(data_dir / SEGMENTS_DIR).load()
    assert len(segments) == 2
    assert [rollups_folded(data_dir, level) for level in levels] == sealed
    assert [postings_folded(data_dir, level) for level in levels] == sealed
    for level in levels:
        infos = [s.rollup_of(level.name) for s in segments]
        assert sum(r.rows for r in infos if r) < sum(s.rows for s in segments)
    assert not Manifest(data_dir / SEGMENTS_DIR).strays()  # the parts' rollups went with them
    assert verify_ledger(data_dir).ok


def test_verify_names_a_rollup_that_differs_from_its_segment(tmp_path):
    data_dir = tmp_path / "ledger"
    with DuckDBStore(data_dir) as store:
        ingest(store, message(0, 1, 2), message(1, 3))
        store.seal()
    root = data_dir / SEGMENTS_DIR
    doc = json.loads((root / MANIFEST_NAME).read_text())
    altered = []
    for level in LEVELS:  # each level checked on its own
        rollup = doc["segments"][0][level.name]
        path = root / rollup["path"]
        tmp = path.with_name("rewritten.tmp")
        column = level.measures[0].name  # the amount, or the jobs level's GPU-ms
        duckdb.connect().execute(  # one more GPU-ms, checksum updated: only the sums can tell
            f"COPY (SELECT * REPLACE (CASE WHEN {column} <> 0 THEN {column} + 1 "
            f"ELSE {column} END AS {column}) FROM read_parquet('{path}')) TO '{tmp}' "
            "(FORMAT parquet)"
        )
        tmp.replace(path)
        rollup["sha256"] = file_sha256(path)
        altered.append(rollup["path"])
    (root / MANIFEST_NAME).write_text(json.dumps(doc))
    problems = verify_ledger(data_dir).problems
    for name in altered:
        assert any(
            p.startswith(f"segments/{name}: ") and "rows differ from the aggregation" in p
            for p in problems
        ), problems


def test_a_manifest_from_a_newer_writer_is_read_and_its_unknown_levels_kept(tmp_path):
    """Forward compatible: an entry's keys this code does not know (a level a newer writer adds)
    are neither refused nor lost — kept through this writer's next seal, their files published,
    pulled, and never removed as strays."""
    data_dir = tmp_path / "ledger"
    root = data_dir / SEGMENTS_DIR
    with DuckDBStore(data_dir) as store:
        ingest(store, message(0, 1, 2))
        store.seal()
        before = _transactions(data_dir)
        doc = json.loads((root / MANIFEST_NAME).read_text())
        entry = doc["segments"][0]
        future = root / entry["path"].replace(".parquet", ".hourly-gpu.parquet")
        future.write_bytes(b"a level this code does not read")
        entry["hourly_gpu"] = {"path": str(future.relative_to(root)), "rows": 1,
                               "sha256": file_sha256(future)}  # fmt: skip
        entry["written_by"] = {"version": 9}
        (root / MANIFEST_NAME).write_text(json.dumps(doc))
        (loaded,) = Manifest(root).load()
        assert future.relative_to(root).as_posix() in loaded.files()
        ingest(store, message(1, 3))
        store.seal(compact_min_segments=100)  # rewrites the manifest, removes strays
    first, second = json.loads((root / MANIFEST_NAME).read_text())["segments"]
    assert first == entry  # the unknown entries as they were
    assert "hourly_gpu" not in second
    assert future.exists() and not Manifest(root).strays()
    assert _transactions(data_dir) > before > 0  # both segments read
    bucket = LocalObjectStore(tmp_path / "bucket")
    Publisher(data_dir, bucket).push()
    reader = pull(bucket, tmp_path / "reader")
    assert (reader / SEGMENTS_DIR / future.relative_to(root)).read_bytes() == future.read_bytes()
    assert Manifest(reader / SEGMENTS_DIR).load()[0].unknown == Manifest(root).load()[0].unknown


def _transactions(data_dir: Path) -> int:
    q = ReportQueries(data_dir)
    try:
        return q.transaction_count()
    finally:
        q.close()


@pytest.mark.parametrize(
    ("zone", "aligned"),
    [
        pytest.param(UTC, True, id="utc"),
        pytest.param(ZoneInfo("Europe/Berlin"), True, id="berlin-summer-time"),
        pytest.param(ZoneInfo("America/New_York"), True, id="new-york"),
        pytest.param(ZoneInfo("Asia/Kolkata"), False, id="kolkata-half-hour"),
        pytest.param(ZoneInfo("Asia/Kathmandu"), False, id="kathmandu-quarter-hour"),
        pytest.param(ZoneInfo("Australia/Adelaide"), False, id="adelaide-half-hour"),
    ],
)
def test_rollups_answer_zones_whose_hours_begin_on_utc_hours(zone: tzinfo, aligned: bool):
    assert hour_aligned(zone) is aligned


# ------------------------------------------------------------------- the pages' read models


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, seeded_once: Path) -> tuple[Path, Path]:
    """The dashboard's seeded ledger, and a copy whose manifest names no rollups (read from the
    segments, as a ledger sealed before rollups is)."""
    rolled = tmp_path_factory.mktemp("rolled") / "ledger"
    shutil.copytree(seeded_once, rolled)
    plain = tmp_path_factory.mktemp("plain") / "ledger"
    shutil.copytree(rolled, plain)
    manifest = plain / SEGMENTS_DIR / MANIFEST_NAME
    doc = json.loads(manifest.read_text())
    levels = {level.name for level in LEVELS}
    assert all(levels <= set(entry) for entry in doc["segments"])
    for entry in doc["segments"]:
        for name in levels:
            del entry[name]
    manifest.write_text(json.dumps(doc))
    return rolled, plain


PERIOD = "2026-11"
DAY = rollups.DAY_US
FILTERS = rollups.Filters(PERIOD)
TEAM = rollups.Filters(PERIOD, "vision", None)
POOL = rollups.Filters(None, None, "a100")
READS: dict[str, Callable[[ReportQueries], Any]] = {
    "cost-report-team": lambda q: cost_report(q, ("team",), PERIOD),
    "cost-report-project-user-weighted": lambda q: cost_report(
        q, ("project", "user"), PERIOD, IdleSharing.WEIGHTED, include_unallocated=True
    ),
    "cost-report-by-gpu-from-postings": lambda q: cost_report(q, ("gpu_uuid",), None),
    "idle-report-even": lambda q: idle_report(q, PERIOD, IdleSharing.EVEN),
    "money-total": lambda q: money_total(q, PERIOD),
    "cost-table-team-pool-filter": lambda q: rollups.cost_table(q, "team", POOL),
    "cost-table-user-weighted": lambda q: rollups.cost_table(q, "user", FILTERS, "weighted"),
    "cost-over-time-hourly": lambda q: rollups.cost_over_time(q, "team", HOUR_US, FILTERS),
    "cost-over-time-daily-model": lambda q: rollups.cost_over_time(
        q, "model", rollups.DAY_US, TEAM
    ),
    "top-jobs": lambda q: rollups.top_jobs(q, FILTERS, 3),
    "top-jobs-all-periods-pool": lambda q: rollups.top_jobs(q, POOL, 20),
    "top-jobs-team-pool": lambda q: rollups.top_jobs(q, rollups.Filters(PERIOD, "search", "a100")),
    "idle-waste": lambda q: rollups.idle_waste(q, POOL),
    "budget-burn-at-the-end": lambda q: rollups.budget_burn(q, PERIOD, END_US, None),
    "budget-burn-mid-hour": lambda q: rollups.budget_burn(q, PERIOD, END_US - 1_234_567, "vision"),
    "job-costs": lambda q: rollups.job_costs(q, TEAM),
    "job-costs-all": lambda q: rollups.job_costs(q, rollups.Filters()),
    "job-costs-only": lambda q: rollups.job_costs(q, FILTERS, ["job-v1", "job-notebook", "x"]),
    "team-budget": lambda q: rollups.team_budget(q, "vision"),
    "team-statement-weighted": lambda q: team_statement(q, "vision", PERIOD, "USD", "weighted"),
    "daily-usage": lambda q: rollups.daily_usage(q, None, None),
    "usage-trend": lambda q: rollups.usage_trend(q, H100, None, 28, 4),
    "usage-trend-pool": lambda q: rollups.usage_trend(q, A100, "a100", 28, 4),
    "fair-share-at-the-end": lambda q: rollups.fair_share(q, END_US),
    "fair-share-mid-hour": lambda q: rollups.fair_share(q, END_US - 1_234_567),
    "metered-for-whatif": lambda q: hourly_team_usage(q, END_US - 1_234_567),
    "model-trends": lambda q: rollups.model_trends(q, END_US),
    "demand": lambda q: rollups.demand(q, H100, END_US - 2 * rollups.DAY_US, END_US),
    "fleet-now": rollups.fleet_now,
    "heatmap": lambda q: rollups.utilisation_heatmap(q, END_US - DAY, END_US, HOUR_US),
    "occupancy-mid-hour": lambda q: rollups.occupancy(q, END_US - DAY - 999, END_US, HOUR_US),
    "nodes-last-seen": rollups.nodes_last_seen,
    # the gpus level (`rollup_files.GPUS`), windows that begin and end mid-hour read their ends
    # from the postings (`rollups.hours.HourSplit`)
    "heatmap-mid-hour": lambda q: rollups.utilisation_heatmap(
        q, END_US - DAY - 999, END_US - 1_234_567, HOUR_US
    ),
    "heatmap-inside-one-hour": lambda q: rollups.utilisation_heatmap(
        q, END_US - DAY + 5, END_US - DAY + HOUR_US - 5, HOUR_US
    ),
    "demand-mid-hour": lambda q: rollups.demand(q, H100, END_US - 2 * DAY - 1_234_567, END_US - 9),
    "nodes-last-seen-pool-short": lambda q: rollups.nodes_last_seen(q, "a100", DAY + 999),
}


class Unpruned(ReportQueries):
    """Reads every listed segment whatever a query says it selects (`started`, `booked`): what
    pruning by the manifest must not change."""

    def rows(
        self,
        sql: str,
        params: Sequence[Any] = (),
        started: tuple[int, int] | None = None,
        booked: str | None = None,
        edges: Sequence[tuple[int, int]] = (),
    ) -> list[tuple[Any, ...]]:
        return super().rows(sql, params, edges=((0, 2**62),) if edges else ())


@pytest.mark.parametrize("read", [pytest.param(r, id=name) for name, r in READS.items()])
def test_each_read_model_is_the_same_from_rollups_as_from_segments(both, read):
    rolled, plain = both
    answers = []
    for data_dir, kind in ((rolled, ReportQueries), (plain, ReportQueries), (plain, Unpruned)):
        q = kind(data_dir)
        try:
            answers.append(read(q))
        finally:
            q.close()
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]  # something to compare: the seeded ledger has it


def test_the_jobs_rollups_hold_what_the_fine_rollups_hold_per_job(both):
    rolled, _ = both
    per_job = 'period, team, project, "user", job_id, model, pool'
    q = ReportQueries(rolled)
    try:
        fine = q.rows(
            f"SELECT {per_job}, coalesce(sum(amount) FILTER (unit = 'gpu_ms'), 0), "
            "coalesce(sum(amount) FILTER (unit = 'money_micros'), 0), "
            "coalesce(sum(amount) FILTER (unit = 'gpu_ms' AND idle), 0), "
            "coalesce(sum(amount) FILTER (unit = 'money_micros' AND idle), 0), "
            "sum(postings), min(start_us), max(end_us) FROM {rollups} "
            "WHERE account LIKE 'consumer:%' AND job_id IS NOT NULL GROUP BY ALL ORDER BY ALL"
        )
        jobs = q.rows(
            f"SELECT {per_job}, sum(gpu_ms), sum(money_micros), sum(idle_gpu_ms), "
            "sum(idle_money_micros), sum(postings), min(start_us), max(end_us) FROM {jobs} "
            "GROUP BY ALL ORDER BY ALL"
        )
        ((rows,),) = q.rows("SELECT count(*) FROM {jobs}")
    finally:
        q.close()
    assert jobs == fine
    assert any(idle for *_, idle, _, _, _ in jobs)  # idle money to compare
    assert len(jobs) <= rows < sum(r[-3] for r in jobs)  # a row per job and period per segment


def test_a_jobs_pools_are_listed_as_a_distinct_string_aggregate_lists_them():
    rows = duckdb.connect().execute(
        f"SELECT job, {POOLS_SQL}, coalesce(string_agg(DISTINCT pool, ', ' ORDER BY pool), '') "
        "FROM (VALUES ('a', 'h100'), ('a', 'a100'), ('a', 'h100'), ('a', NULL), ('b', NULL), "
        "('c', 'l4'), ('d', 'a100'), ('d', 'A100'), ('d', 'a100-x')) t(job, pool) GROUP BY job"
    )
    found = {job: (listed, aggregated) for job, listed, aggregated in rows.fetchall()}
    assert found["a"] == ("a100, h100", "a100, h100")
    assert all(listed == aggregated for listed, aggregated in found.values()), found


@pytest.mark.parametrize(
    "as_of_us",
    [
        pytest.param(END_US, id="at-the-end"),
        pytest.param(END_US - 1_234_567, id="mid-hour"),
        pytest.param(END_US + 30 * DAY, id="a-month-later"),
    ],
)
def test_fair_share_folds_the_same_floats_as_the_plain_loop(both, as_of_us):
    rolled, _ = both
    q = ReportQueries(rolled)
    try:
        rows = team_hour_usage(q, as_of_us)
        columns = team_hour_columns(q, as_of_us)
        nothing = team_hour_columns(q, HOUR_US + 1)  # before the ledger: no rows at all
    finally:
        q.close()
    plain: dict[str, float] = defaultdict(float)
    for team, hour, amount in rows:  # the fold as it was written before it was columnar
        age = max(0, as_of_us - min(as_of_us, (hour + 1) * HOUR_US))
        plain[team] += amount * 2.0 ** (-age / DEFAULT_HALF_LIFE_US)
    assert len(rows) > 24 and len(plain) > 1
    assert decayed_usage(columns, as_of_us, DEFAULT_HALF_LIFE_US) == plain
    assert decayed_usage(nothing, HOUR_US + 1, DEFAULT_HALF_LIFE_US) == {}


def test_the_rollups_stand_for_the_segments_that_have_them(both):
    rolled, plain = both
    for data_dir, from_rollups in ((rolled, True), (plain, False)):
        q = ReportQueries(data_dir)
        try:
            (postings,) = q.rows("SELECT count(*) FROM {postings}")[0]
            rows, counted = q.rows("SELECT count(*), sum(postings) FROM {rollups}")[0]
        finally:
            q.close()
        assert counted == postings  # every posting counted once, either way
        assert (rows < postings) is from_rollups  # a rollup row stands for several postings


def test_a_zone_whose_hours_split_a_rollups_hour_is_read_from_the_postings(both, tmp_path):
    rolled, _ = both
    kolkata = tmp_path / "ledger"
    shutil.copytree(rolled, kolkata)
    identity = {"version": IDENTITY_VERSION, "timezone": "Asia/Kolkata"}  # UTC+05:30
    (kolkata / IDENTITY_NAME).write_text(json.dumps(identity))  # its hours start at :30 UTC
    q = ReportQueries(kolkata)
    try:
        (postings,) = q.rows("SELECT count(*) FROM {postings}")[0]
        (rows,) = q.rows("SELECT count(*) FROM {rollups}")[0]
        hourly = rollups.cost_over_time(q, "team", HOUR_US, FILTERS)
        scanned = q.rows(
            f"SELECT {time_bucket_sql('start_us', HOUR_US, q.zone)} AS b, team, "
            "sum(amount) FILTER (unit = 'gpu_ms') FROM {postings} "
            "WHERE account LIKE 'consumer:%' AND period = ? GROUP BY ALL ORDER BY b, team",
            [PERIOD],
        )
    finally:
        q.close()
    assert rows == postings
    assert [(c.bucket_us, c.key, c.gpu_ms) for c in hourly] == [
        (int(b), t, int(ms)) for b, t, ms in scanned
    ]
    assert any(c.bucket_us % HOUR_US for c in hourly)  # buckets at :30 UTC


DAY_READS: dict[str, Callable[[ReportQueries], Any]] = {
    "cost-over-time-daily": lambda q: rollups.cost_over_time(q, "team", DAY, FILTERS),
    "budget-burn-mid-hour": lambda q: rollups.budget_burn(q, PERIOD, END_US - 1_234_567, None),
    "capacity-daily-usage": rollups.daily_usage,
    "capacity-usage-trend": lambda q: rollups.usage_trend(q, rollups.extent(q).models[0]),
    "capacity-model-trends": lambda q: rollups.model_trends(q, END_US - 1_234_567),
}


@pytest.mark.parametrize("read", [pytest.param(r, id=name) for name, r in DAY_READS.items()])
def test_days_of_a_zone_other_than_utc_are_not_read_from_the_utc_daily_rollups(
    both, tmp_path, read
):
    """In UTC a day's figures come from the daily level (a row per UTC day); a day of
    Asia/Shanghai (UTC+8, whole hours) splits a UTC day, so they come from the hours."""
    answers = []
    for source in both:
        shanghai = tmp_path / source.parent.name / "ledger"
        shutil.copytree(source, shanghai)
        identity = {"version": IDENTITY_VERSION, "timezone": "Asia/Shanghai"}
        (shanghai / IDENTITY_NAME).write_text(json.dumps(identity))
        q = ReportQueries(shanghai)
        try:
            assert by_day(q) == "{coarse}"
            answers.append(read(q))
        finally:
            q.close()
    assert answers[0] == answers[1]
    assert answers[0]
