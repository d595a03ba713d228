"""What-if benchmark: `tally whatif`'s replay speed over a month of archived history.

History: `WINDOW_DAYS` of the Philly trace (`bench_scheduler`'s trace, fleet, one-cohort
quotas and queue, from the same start day), run once through the scheduler simulation under the
Tally policy, ticking as the live service does (every 2 s, the default `cycle_interval_s`, and
at each submit) — standing in for the live scheduler — and its every event written as the `jobs`
topic into a real ledger's raw-event archive (DuckDB + sealed Parquet, through the ledger's
`Ingestor`), as the worker would.

Figure: simulated days per wall-clock second of a what-if over that month — reading the archive
(`read_job_event_log`), the window (`read_history`), and both replays with their metrics and
comparison (`what_if`: the recorded configuration, and the fleet with `ADDED_NODES` more nodes)
— counting both replays' days. Baseline: the same month replayed from the trace by the bare
simulation (one replay, deciding at every event rather than at ticks, no archive, no metrics),
in the same run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ledger.pricing import Price, PriceBook
from ledger.read.job_history import read_job_event_log
from scheduler.model import Node
from scheduler.simulation import Simulation
from scheduler.state import SchedulerState
from scheduler.whatif import Scenario, read_history, what_if
from tests.benchmarks.bench_scheduler import (
    DAY_US,
    FLAVOR,
    FLEET_SCALE,
    GPUS_PER_NODE,
    HALF_LIFE_US,
    QUEUE,
    TALLY_POLICY,
    WINDOW_START_DAY,
    fleet_and_teams,
    load_trace,
    load_vc_nodes,
    sim_jobs,
)
from tests.benchmarks.harness import Figure, Progress
from tests.whatif_builders import archive, record

BENCH = "whatif"
WINDOW_DAYS = 30
ADDED_NODES = 8
PRICES = PriceBook((Price(FLAVOR.model, 2_000_000),))


def run(progress: Progress) -> list[Figure]:
    rows = load_trace()
    start = rows[0][0] + WINDOW_START_DAY * DAY_US
    until = start + WINDOW_DAYS * DAY_US
    window = [r for r in rows if start <= r[0] < until]
    nodes, teams = fleet_and_teams(sorted({r[3] for r in window}), load_vc_nodes(), FLEET_SCALE)
    baseline = Scenario(
        "baseline", (QUEUE,), tuple(teams), tuple(nodes), PRICES, HALF_LIFE_US, TALLY_POLICY
    )
    extra = tuple(
        Node(f"added-{n:03d}", FLAVOR.pool, FLAVOR.model,
             tuple(f"GPU-added-{n:03d}-{i}" for i in range(GPUS_PER_NODE)))
        for n in range(ADDED_NODES)
    )  # fmt: skip
    alternative = Scenario(
        "alternative", (QUEUE,), tuple(teams), (*nodes, *extra), PRICES, HALF_LIFE_US,
        TALLY_POLICY,
    )  # fmt: skip
    jobs = sim_jobs(window)
    progress(f"{len(jobs):,} jobs over {WINDOW_DAYS} days on {baseline.fleet_gpus} GPUs")

    started = time.perf_counter()
    Simulation(_state(baseline), TALLY_POLICY).run(jobs, until_us=until - 1)
    bare_s = time.perf_counter() - started
    progress(f"bare simulation: {bare_s:.1f} s")

    events = record(baseline, jobs)
    progress(f"recorded {len(events):,} job events; archiving")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = archive(Path(tmp) / "ledger", events, batch=5_000)
        progress("archived; replaying")
        started = time.perf_counter()
        log = read_job_event_log(data_dir)
        history = read_history(log.events, start, until)
        report, _, _ = what_if(
            history,
            baseline,
            alternative,
            tolerance_us=0,
            added_gpus={FLAVOR.model: ADDED_NODES * GPUS_PER_NODE},
        )
        whatif_s = time.perf_counter() - started
    progress(f"what-if: {whatif_s:.1f} s; {report.capacity}; {len(report.divergences)} divergences")
    return [
        Figure(
            BENCH,
            "replay speed",
            2 * WINDOW_DAYS / whatif_s,
            "sim days/s",
            baseline_name="bare simulation of the trace (one replay, no archive, no metrics)",
            baseline_value=WINDOW_DAYS / bare_s,
            note=(
                f"{len(jobs):,} jobs, {WINDOW_DAYS} days, {baseline.fleet_gpus} GPUs; both "
                f"replays counted; archive read included; {report.capacity}"
            ),
        )
    ]


def _state(scenario: Scenario) -> SchedulerState:
    return SchedulerState(
        scenario.queues, scenario.teams, scenario.nodes, prices=scenario.prices,
        half_life_us=scenario.half_life_us,
    )  # fmt: skip
