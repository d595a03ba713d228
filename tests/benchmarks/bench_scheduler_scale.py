"""Scheduler benchmark at scale: the decision core with 100,000 pending jobs on ~10,000 GPUs.

Workload: a Philly-shaped synthetic. The fleet is the Philly VC table (`bench_scheduler`)
scaled so that it has about 10,000 GPUs (10,048: each VC's nodes × 10,000 / (8 × all VC
nodes), rounded down, at least one node); the jobs are `JOBS` rows cycled from the Philly trace
in submission order (gang size, runtime and tenant as recorded), all submitted at the first
row's time. Quotas, cohort, queue and the three policies are `bench_scheduler`'s.

Measured per policy, in the same run: decisions per second (a decision is a head given a
verdict in a cycle: admitted, or waiting with a reason) and admissions per second, over the
scheduling cycles (snapshot + decide + apply; by wall clock, and by the thread's CPU time,
which the load of other processes on a shared machine does not inflate) that began with ≥
`PENDING_FLOOR` pending jobs, up to `MAX_CYCLES` cycles: the cycles that fill the empty fleet
at the first event time, then the cycles after jobs end (a few admissions each, with preemption
where the policy has it). A cycle looks at the first `heads_per_queue` (8) jobs of every (team,
queue) backlog — at most 8 × 15 tenants = 120 heads, whatever the backlog holds — so what
100,000 pending jobs cost is the state's upkeep (snapshots, backlogs, running jobs) per cycle,
not more decisions per cycle.
"""

from __future__ import annotations

import time
from decimal import Decimal
from itertools import cycle, islice

from scheduler.model import Policy
from scheduler.simulation import SimReport, Simulation
from scheduler.state import SchedulerState
from tests.benchmarks.bench_scheduler import (
    GPUS_PER_NODE,
    POLICIES,
    _state,
    fleet_and_teams,
    load_trace,
    load_vc_nodes,
    sim_jobs,
)
from tests.benchmarks.harness import Figure, FigureSpec, Progress, policy_figures

BENCH = "scheduler scale"
JOBS = 100_000
FLEET_GPUS = 10_000
PENDING_FLOOR = 90_000
MAX_CYCLES = 1_000
TARGET = 10_000  # decisions/s


def _measure(policy: Policy, jobs_rows: list[tuple[int, int, int, str]]) -> dict[str, float]:
    rows = load_trace()
    tenants = sorted({r[3] for r in rows})
    vc = load_vc_nodes()
    nodes, teams = fleet_and_teams(tenants, vc, Decimal(FLEET_GPUS) / (sum(vc.values()) * 8))
    sim = Simulation(_state(nodes, teams), policy, time_cycles=True)

    def _stop(state: SchedulerState) -> bool:
        return state.pending_count < PENDING_FLOOR or len(sim.report.cycles) >= MAX_CYCLES

    cpu = time.process_time()
    report: SimReport = sim.run(sim_jobs(jobs_rows, at_once=True), stop=_stop)
    cpu = time.process_time() - cpu
    timed = [c for c in report.cycles if c.pending >= PENDING_FLOOR]
    seconds = sum(c.seconds for c in timed)
    decisions = sum(c.decisions for c in timed)
    return {
        "rate": decisions / seconds,
        "cpu_rate": decisions / sum(c.cpu_seconds for c in timed),
        "admit_rate": sum(c.admitted for c in timed) / seconds,
        "cycle_ms": 1000 * seconds / len(timed),
        "per_cycle": decisions / len(timed),
        "cycles": len(timed),
        "gpus": len(nodes) * GPUS_PER_NODE,
        "cpu": cpu,
    }


def run(progress: Progress) -> list[Figure]:
    rows = load_trace()
    first = rows[0][0]
    jobs_rows = [(first, *r[1:]) for r in islice(cycle(rows), JOBS)]
    results: dict[str, dict[str, float]] = {}
    for name, policy in POLICIES:
        began = time.monotonic()
        r = results[name] = _measure(policy, jobs_rows)
        progress(
            f"{name}: {r['rate']:,.0f} decisions/s ({r['cpu_rate']:,.0f} per CPU-second), "
            f"{r['admit_rate']:,.0f} admissions/s over "
            f"{int(r['cycles'])} cycles ≥ {PENDING_FLOOR:,} pending on {int(r['gpus']):,} GPUs "
            f"({r['per_cycle']:.0f} decisions, {r['cycle_ms']:.1f} ms a cycle); "
            f"{time.monotonic() - began:.1f} s wall, {r['cpu']:.1f} s CPU"
        )
    tally = results["Tally"]
    note = (
        f"{JOBS:,} Philly-shaped jobs submitted at once on {int(tally['gpus']):,} GPUs (VC "
        f"table scaled); cycles that began with ≥ {PENDING_FLOOR:,} pending, at most "
        f"{MAX_CYCLES:,}; a cycle judges ≤ 8 heads per (team, queue) backlog"
    )
    specs: tuple[FigureSpec, ...] = (
        ("rate", "decisions/s @100k", "decisions/s", True, f"≥ {TARGET:,} decisions/s", note),
        (
            "cpu_rate",
            "decisions/CPU-s @100k",
            "decisions/s",
            True,
            f"≥ {TARGET:,} decisions/s",
            "the same cycles by the thread's CPU time: what a machine shared with other "
            "processes does not inflate",
        ),
        ("admit_rate", "admissions/s @100k", "jobs/s", True, None, None),
        ("cycle_ms", "cycle time @100k", "ms", False, None, "snapshot + decide + apply, mean"),
    )
    return policy_figures(BENCH, results, specs)
