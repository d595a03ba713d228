"""Dashboard load time: the ledger queries each page runs on a cold cache (what the first visitor
after a new seal waits for), over the synthetic sealed ledger of `bench_reports` (each segment
with its rollups, `ledger.store.rollup_files`), beside a plain DuckDB scan of the same segments
and beside the same pages read from the segments alone (the manifest naming no rollups, as
before rollups existed). The same pages are then read over the S3 API server of the tests
(moto, loopback): the ledger published there, each load a `pull` into the reader's cache plus
the queries, and the Finance page's next visit after each of five seals (one small segment and
its rollup published, then pulled).

A page's figure is the wall time of all its queries with the default selection (the newest
period, all teams and pools, the first GPU model), each through a fresh `ReportQueries` as
`dashboard.common.query` runs them; the FOCUS export runs only when someone clicks its download
button and is measured by `bench_reports`. Later visits render from `st.cache_data` until the
next seal changes the manifest. The generated ledger has no archived job events, so the Team
page's job lists and the queue-wait charts are empty here: their figures time the postings
queries (budget, fair share, cost per job) and reading an empty archive.

Size: 10 million postings by default; `TALLY_BENCH_POSTINGS=100000000` for the issue's 100 M.
The generated ledger is a year of 1,000 GPUs sampled every few hours at 10 M (every 21 minutes
at 100 M) whose samples belong to jobs as a real fleet's do (`fleet_jobs`): jobs drawn from the
Philly trace's run times and GPU counts, each with one owner on one set of GPUs, idle gaps
between them, so the rollups and the per-job tables are as large as a real month's (tens of
thousands of jobs), not one job per sample. `TALLY_BENCH_SHAPE=random` generates the earlier
worst case instead (each sample's owner and job drawn at random: ~1.5 M job keys a month at
100 M), so both figures can be reported.

Generating 100 M takes tens of minutes: with `TALLY_BENCH_CACHE=<dir>` the ledger is generated
once into `<dir>/<shape>-<postings>/` and reused by later runs (each run reads a hard-linked copy,
since the S3 part appends seals to the writer's ledger; a rollup level added since the cache was
written is written into the copy).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from ledger.read import rollups
from ledger.read.reports import IdleSharing, ReportQueries
from ledger.read.statements import team_statement
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.replica import REPLICA_DIR, Publisher, pull
from ledger.store.segments import Manifest
from tests.benchmarks import fleet_jobs
from tests.benchmarks.bench_reports import _p95, _postings, generate
from tests.benchmarks.dashboard_ledgers import (
    add_missing_levels,
    append_seal,
    s3_store,
    without_rollups,
)
from tests.benchmarks.harness import Figure, Progress

BENCH = "dashboard"
JOBS = "tally.jobs"  # the generated ledger archives no job events: the job lists are empty
REPEATS = 5
TARGET = "p95 ≤ 1 s (cold); cached renders skip the queries"


def _fresh(data_dir: Path, fn: Callable[..., Any], *args: Any) -> Any:
    queries = ReportQueries(data_dir)
    try:
        return fn(queries, *args)
    finally:
        queries.close()


Query = tuple[str, Callable[[], object]]


def _pages(data_dir: Path) -> dict[str, list[Query]]:
    """The queries each page runs with its default selection, in page order."""
    extent = _fresh(data_dir, rollups.extent)
    assert extent.newest_us is not None and extent.models and extent.teams
    period = extent.periods[0]
    newest = extent.newest_us
    filters = rollups.Filters(period)
    model = extent.models[0]
    team = extent.teams[0]
    since = newest - rollups.DAY_US
    none = IdleSharing.NONE

    def q(name: str, fn: Callable[..., Any], *args: Any) -> Query:
        return name, lambda: _fresh(data_dir, fn, *args)

    def sizing() -> object:
        found = _fresh(data_dir, rollups.demand, model, newest - 7 * rollups.DAY_US, newest, None)
        return rollups.size_for_wait(found, 0.5)

    return {
        "finance page": [
            q("extent", rollups.extent),
            q("cost_table", rollups.cost_table, "team", filters, none),
            q("idle_waste", rollups.idle_waste, filters),
            q("cost_over_time", rollups.cost_over_time, "team", rollups.DAY_US, filters),
            q("budget_burn", rollups.budget_burn, period, newest, None),
            q("top_jobs", rollups.top_jobs, filters, 20),
            q("team_statement", team_statement, extent.teams[0], period, "USD", none),
        ],
        "platform page": [
            q("extent", rollups.extent),
            q("fleet_now", rollups.fleet_now, None),
            q("heatmap", rollups.utilisation_heatmap, since, newest, rollups.HOUR_US, None),
            q("distribution", rollups.utilisation_distribution, since, newest, None),
            q("summary", rollups.utilisation_summary, since, newest, None),
            q("occupancy", rollups.occupancy, since, newest, rollups.HOUR_US, None),
            q("nodes_last_seen", rollups.nodes_last_seen, None),
        ],
        "capacity page": [
            q("extent", rollups.extent),
            q("model_trends", rollups.model_trends, newest, None),
            q("queue_wait_trends", rollups.queue_wait_trends, JOBS, None, None, None),
            q("usage_trend", rollups.usage_trend, model, None, 28, 4),
            ("demand + sizing", sizing),
            q("observed_waits", rollups.observed_queue_waits, JOBS, model, since, newest, None),
        ],
        "team page": [
            q("extent", rollups.extent),
            q("job_history", rollups.job_history_of, JOBS),
            q("team_budget", rollups.team_budget, team, None),
            q("fair_share", rollups.fair_share, newest),
            q("job_costs", rollups.job_costs, rollups.Filters(period, team, None)),
            q("team_quotas", rollups.team_quotas, team, JOBS),
        ],
    }


def _page_latencies(queries: list[Query], repeats: int) -> tuple[list[float], dict[str, float]]:
    """Page times (ms) over `repeats` loads after a warm one, and each query's median."""
    for _, action in queries:
        action()  # warm: file metadata, imports
    pages: list[float] = []
    each: dict[str, list[float]] = {name: [] for name, _ in queries}
    for _ in range(repeats):
        total = 0.0
        for name, action in queries:
            started = time.perf_counter()
            action()
            spent = (time.perf_counter() - started) * 1_000
            each[name].append(spent)
            total += spent
        pages.append(total)
    return pages, {name: statistics.median(t) for name, t in each.items()}


def _latencies(action: Callable[[], object], repeats: int) -> list[float]:
    action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1_000)
    return times


def _figures(
    name: str,
    times: list[float],
    base: list[float],
    base_name: str,
    note: str | None,
) -> list[Figure]:
    return [
        Figure(
            BENCH,
            f"{name} {label}",
            value,
            "ms",
            f"{base_name} {label}",
            base_value,
            higher_is_better=False,
            target=TARGET,
            note=note if label == "p50" else None,
        )
        for label, value, base_value in (
            ("p50", statistics.median(times), statistics.median(base)),
            ("p95", _p95(times), _p95(base)),
        )
    ]


def _breakdown(each: dict[str, float]) -> str:
    slowest = sorted(each.items(), key=lambda kv: -kv[1])[:3]
    return "slowest queries (p50): " + ", ".join(f"{q} {ms:.0f} ms" for q, ms in slowest)


def _ledger(tmp: Path, postings: int, progress: Progress) -> tuple[Path, str]:
    """The generated ledger in `tmp` (a hard-linked copy of the cached one under
    `TALLY_BENCH_CACHE` when set, generated there first if missing), and how it was made."""
    data_dir = tmp / "ledger"
    cache = os.environ.get("TALLY_BENCH_CACHE")
    kept = Path(cache) / f"{fleet_jobs.shape()}-{postings}" if cache else tmp
    done = kept / "complete"
    made = f"reused from {kept}"
    if not done.exists():
        shutil.rmtree(kept / "ledger", ignore_errors=True)
        progress(f"generating a sealed ledger of {postings:,} postings, with rollups")
        started = time.perf_counter()
        generate(kept / "ledger", postings, progress)
        made = f"generated in {time.perf_counter() - started:.0f}s"
        done.write_text(made)
    if cache:
        shutil.copytree(kept / "ledger", data_dir, copy_function=os.link)
        added = add_missing_levels(data_dir)  # the copy's manifest is a new file, not the cache's
        if added:
            made += f", {added} rollup files of levels added since written"
    return data_dir, made


def run(progress: Progress) -> list[Figure]:
    postings = _postings()
    with tempfile.TemporaryDirectory(prefix="tally-bench-dashboard-") as tmp:
        data_dir, made = _ledger(Path(tmp), postings, progress)
        entries = Manifest(data_dir / SEGMENTS_DIR).load()
        files = [data_dir / SEGMENTS_DIR / s.path for s in entries]
        rollup_rows = sum(s.rollup.rows for s in entries if s.rollup is not None)
        job_rows = sum(s.jobs.rows for s in entries if s.jobs is not None)
        gpu_rows = sum(s.gpus.rows for s in entries if s.gpus is not None)
        plain = without_rollups(data_dir, Path(tmp) / "plain")
        listed = ", ".join(f"'{f}'" for f in files)

        def baseline() -> object:
            scan = duckdb.connect(":memory:")
            try:
                return scan.execute(f"SELECT sum(amount) FROM read_parquet([{listed}])").fetchall()
            finally:
                scan.close()

        progress("measuring: plain scan")
        base = _latencies(baseline, REPEATS)
        rolled: dict[str, tuple[list[float], dict[str, float]]] = {}
        for name, queries in _pages(data_dir).items():
            progress(f"measuring: {name}, rollups")
            rolled[name] = _page_latencies(queries, REPEATS)
        segments: dict[str, tuple[list[float], dict[str, float]]] = {}
        for name, queries in _pages(plain).items():
            progress(f"measuring: {name}, segments only")
            segments[name] = _page_latencies(queries, REPEATS)
        with s3_store() as store:
            progress("S3: publishing the ledger")
            publisher = Publisher(data_dir, store)
            started = time.perf_counter()
            publisher.push()
            publish_s = time.perf_counter() - started
            reader = Path(tmp) / "reader" / REPLICA_DIR
            started = time.perf_counter()
            pull(store, reader)
            first_pull_s = time.perf_counter() - started
            over_s3: dict[str, tuple[list[float], dict[str, float]]] = {}
            for name, queries in _pages(reader).items():
                progress(f"measuring: {name} over S3")
                with_pull: list[Query] = [("pull", lambda: pull(store, reader)), *queries]
                over_s3[name] = _page_latencies(with_pull, REPEATS)
            finance = [("pull", lambda: pull(store, reader)), *_pages(reader)["finance page"]]
            after_seal: list[float] = []
            for seal in range(REPEATS):
                progress(f"measuring: the finance page after seal {seal + 1} over S3")
                append_seal(data_dir, postings, seal)
                publisher.push()
                started = time.perf_counter()
                for _, action in finance:
                    action()
                after_seal.append((time.perf_counter() - started) * 1_000)
    size = (
        f"{postings:,} postings ({fleet_jobs.shape()} shape), {len(files)} segments, "
        f"{rollup_rows:,} fine rollup rows ({rollup_rows / postings:.0%}), {job_rows:,} jobs "
        f"rollup rows, {gpu_rows:,} gpus rollup rows; {made}; cold cache, default selection; "
        "TALLY_BENCH_POSTINGS=100000000 for the issue's 100 M"
    )
    figures: list[Figure] = []
    for name, (times, each) in rolled.items():
        before, before_each = segments[name]
        note = (f"{size}; " if not figures else "") + _breakdown(each)
        figures += _figures(name, times, base, "plain scan sum(amount)", note)
        figures += _figures(
            f"{name} vs segments",
            times,
            before,
            "the page from the segments (no rollups)",
            "from the segments: " + _breakdown(before_each),
        )
    s3_note = (
        f"moto S3 server on loopback: publishing the whole ledger took {publish_s:.1f}s, the "
        f"first pull into an empty cache {first_pull_s:.1f}s; each load below = pull + queries"
    )
    for name, (times, each) in over_s3.items():
        note = (f"{s3_note}; " if name == "finance page" else "") + _breakdown(each)
        figures += _figures(f"{name} over S3", times, base, "plain scan sum(amount)", note)
    figures += _figures(
        "finance page, next visit after a seal, over S3",
        after_seal,
        over_s3["finance page"][0],
        "the finance page over S3 without a new seal",
        "each: one seal (20,000 postings and its rollup) published, then pull + the queries",
    )
    return figures
