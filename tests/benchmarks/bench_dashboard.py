"""Dashboard load time: the ledger queries each page runs on a cold cache (what the first visitor
after a new seal waits for), over the synthetic sealed ledger of `bench_reports`, beside a plain
DuckDB scan of the same segments.

A page's figure is the wall time of all its queries with the default selection (the newest
period, all teams and pools, the first GPU model), each through a fresh `ReportQueries` as
`dashboard.common.query` runs them; the FOCUS export runs only when someone clicks its download
button and is measured by `bench_reports`. Later visits render from `st.cache_data` until the
next seal changes the manifest. The generated ledger has no archived job events, so the Team
page's job lists and the queue-wait charts are empty here: their figures time the postings
queries (budget, fair share, cost per job) and reading an empty archive.

Size: 10 million postings by default; `TALLY_BENCH_POSTINGS=100000000` for the issue's 100 M.
"""

from __future__ import annotations

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
from tests.benchmarks.bench_reports import _p95, _postings, generate
from tests.benchmarks.harness import Figure, Progress

BENCH = "dashboard"
JOBS = "tally.jobs"  # the generated ledger archives no job events: the job lists are empty
REPEATS = 5


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


def run(progress: Progress) -> list[Figure]:
    postings = _postings()
    with tempfile.TemporaryDirectory(prefix="tally-bench-dashboard-") as tmp:
        data_dir = Path(tmp) / "ledger"
        progress(f"generating a sealed ledger of {postings:,} postings")
        started = time.perf_counter()
        files = generate(data_dir, postings, progress)
        generated_s = time.perf_counter() - started
        listed = ", ".join(f"'{f}'" for f in files)

        def baseline() -> object:
            scan = duckdb.connect(":memory:")
            try:
                return scan.execute(f"SELECT sum(amount) FROM read_parquet([{listed}])").fetchall()
            finally:
                scan.close()

        progress("measuring: plain scan")
        base = _latencies(baseline, REPEATS)
        measured: dict[str, tuple[list[float], dict[str, float]]] = {}
        for name, queries in _pages(data_dir).items():
            progress(f"measuring: {name}")
            measured[name] = _page_latencies(queries, REPEATS)
    size = (
        f"{postings:,} postings, {len(files)} segments (generated in {generated_s:.0f}s); "
        "cold cache, default selection; TALLY_BENCH_POSTINGS=100000000 for the issue's 100 M"
    )
    figures: list[Figure] = []
    for name, (times, each) in measured.items():
        slowest = sorted(each.items(), key=lambda kv: -kv[1])[:3]
        breakdown = "slowest queries (p50): " + ", ".join(f"{q} {ms:.0f} ms" for q, ms in slowest)
        for label, value, base_value in (
            ("p50", statistics.median(times), statistics.median(base)),
            ("p95", _p95(times), _p95(base)),
        ):
            figures.append(
                Figure(
                    BENCH,
                    f"{name} {label}",
                    value,
                    "ms",
                    f"plain scan sum(amount) {label}",
                    base_value,
                    higher_is_better=False,
                    target="p95 ≤ 2 s (cold); cached renders skip the queries",
                    note=(f"{size}; " if not figures else "") + breakdown
                    if label == "p50"
                    else None,
                )
            )
    return figures
