"""The scheduler benchmark's price-aware placement figures: utilisation and cost per team with
and without price-aware placement, on the same replay (called by `bench_scheduler`).

Fleet: the replay's nodes, alternately H100 (3.20 per GPU-hour) and A100 (1.80): each tenant's
even-numbered nodes are H100, odd-numbered A100, and its nominal quota in each model is its
nodes of that model × 8 GPUs, H100 listed first (the order a team lists its premium GPUs in).
Every job accepts either model (`A100|H100`). Without price-aware placement a job tries the
team's quota flavors in quota order (today's behaviour for a job with a choice); with it,
cheapest first. Same jobs, same Tally policy otherwise.

Cost: every run's GPU time at the price of the model it ran on (`ledger.pricing.cost_of`),
preempted runs included (that GPU time was held), per team.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ledger.job_events import (
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
)
from ledger.pricing import Price, PriceBook, cost_of
from ledger.units import MICROS_PER_UNIT, US_PER_MS
from scheduler.model import Flavor, Node, Policy, Queue, Quota, Team
from scheduler.simulation import SimJob, SimReport, Simulation
from scheduler.state import SchedulerState
from tests.benchmarks.harness import Figure, Progress

A100 = "A100"
H100 = "H100"
PRICES = PriceBook((Price(A100, 1_800_000), Price(H100, 3_200_000)))


def two_model_fleet(nodes: Sequence[Node], teams: Sequence[Team]) -> tuple[list[Node], list[Team]]:
    """`nodes` alternately H100 and A100 per tenant; each team's quota split the same way."""
    out: list[Node] = []
    per_team: dict[str, dict[str, int]] = {}
    seen: dict[str, int] = {}
    for node in nodes:
        tenant = node.name.rsplit("-", 1)[0]
        index = seen.get(tenant, 0)
        seen[tenant] = index + 1
        model = H100 if index % 2 == 0 else A100
        out.append(replace(node, model=model))
        counts = per_team.setdefault(tenant, {H100: 0, A100: 0})
        counts[model] += len(node.gpu_uuids)
    split = []
    for team in teams:
        pool = team.quotas[0].flavor.pool
        counts = per_team.get(team.name, {H100: 0, A100: 0})
        quotas = tuple(Quota(Flavor(pool, m), counts[m]) for m in (H100, A100))
        split.append(replace(team, quotas=quotas))
    return out, split


def either_model(jobs: Sequence[SimJob]) -> list[SimJob]:
    return [replace(j, spec=replace(j.spec, model=None, models=(A100, H100))) for j in jobs]


class CostMeter:
    """A simulation listener: each run's GPU time × its model's price, per team (micro-units)."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices
        self.cost: dict[str, int] = {}
        self._runs: dict[str, JobAdmitted] = {}

    def __call__(self, events: Sequence[JobEvent], state: SchedulerState) -> None:
        for event in events:
            if isinstance(event, JobAdmitted):
                self._runs[event.job_id] = event
            elif isinstance(event, JobPreempted | JobFinished | JobReclaimed | JobFailed):
                run = self._runs.pop(event.job_id, None)
                if run is None:
                    continue
                gpu_ms = len(run.gpu_uuids) * ((event.time_us - run.time_us) // US_PER_MS)
                rate = self.prices.rate_at(run.model, run.pool, run.time_us)
                self.cost[run.team] = self.cost.get(run.team, 0) + cost_of(gpu_ms, rate)


def price_figures(
    bench: str,
    queue: Queue,
    nodes: Sequence[Node],
    teams: Sequence[Team],
    jobs: Sequence[SimJob],
    policy: Policy,
    *,
    half_life_us: int,
    sample_us: int,
    utilisation: Callable[[SimReport], float],
    progress: Progress,
) -> list[Figure]:
    """Utilisation, total cost and cost per team, price-aware vs quota order, one replay each."""
    fleet, split = two_model_fleet(nodes, teams)
    either = either_model(jobs)
    results: dict[bool, tuple[float, dict[str, int]]] = {}
    for aware in (False, True):
        began = time.monotonic()
        meter = CostMeter(PRICES)
        state = SchedulerState((queue,), split, fleet, prices=PRICES, half_life_us=half_life_us)
        sim = Simulation(
            state,
            replace(policy, price_aware=aware),
            share_interval_us=sample_us,
            listener=meter,
        )
        report = sim.run(either)
        results[aware] = (utilisation(report), meter.cost)
        progress(
            f"price-aware placement {'on' if aware else 'off'}: util "
            f"{results[aware][0]:.2f}, cost {sum(meter.cost.values()) / MICROS_PER_UNIT:,.0f}; "
            f"{time.monotonic() - began:.1f} s"
        )
    (util_off, cost_off), (util_on, cost_on) = results[False], results[True]
    baseline = "quota order (H100 first)"
    note = (
        "same replay on a two-model fleet (alternate nodes H100 at 3.20/GPU-h, A100 at "
        "1.80/GPU-h), every job accepting A100|H100"
    )
    figures = [
        Figure(
            bench,
            "GPU utilisation (price-aware)",
            util_on,
            "fraction",
            baseline,
            util_off,
            note=note,
        ),
        Figure(
            bench,
            "cost, all teams (price-aware)",
            sum(cost_on.values()) / MICROS_PER_UNIT,
            "currency",
            baseline,
            sum(cost_off.values()) / MICROS_PER_UNIT,
            higher_is_better=False,
            note="GPU time of every run (preempted runs too) at its model's price",
        ),
    ]
    for team in sorted(set(cost_on) | set(cost_off)):
        figures.append(
            Figure(
                bench,
                f"cost {team} (price-aware)",
                cost_on.get(team, 0) / MICROS_PER_UNIT,
                "currency",
                baseline,
                cost_off.get(team, 0) / MICROS_PER_UNIT,
                higher_is_better=False,
            )
        )
    return figures
