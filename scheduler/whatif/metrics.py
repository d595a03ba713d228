"""The figures a what-if compares, from one `Outcome`: GPU-hours (as GPU-ms) and cost per team,
queueing delay p50/p95 per team and per queue (nearest rank, integer µs), utilisation of the
fleet over the window (basis points), preemptions and the GPU time they threw away, Jain's
fairness index over the teams' GPU time per fair-share weight, and budget overruns.

Pure: an `Outcome` in, a frozen `Metrics` out. Money is integer micro-units.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from ledger.read.job_history import quantile_us
from scheduler.whatif.replay import Outcome


@dataclass(frozen=True, slots=True)
class Delay:
    """Queueing delays of a group of jobs."""

    jobs: int
    p50_us: int
    p95_us: int


@dataclass(frozen=True, slots=True)
class Overrun:
    """A team that spent past its budget in the window, and by how much."""

    team: str
    money_micros: int  # 0: not over in money (or not budgeted)
    gpu_ms: int


@dataclass(frozen=True, slots=True)
class Metrics:
    gpu_ms: dict[str, int]  # per team
    cost_micros: dict[str, int]
    delay_by_team: dict[str, Delay]
    delay_by_queue: dict[str, Delay]
    delay_all: Delay
    utilisation_bp: int  # GPU time held ÷ (fleet GPUs × window), in basis points
    preemptions: int
    lost_gpu_ms: int  # GPU time of runs cut short by preemption
    jain_permille: int  # Jain's index × 1000 over GPU time per weight (1000: perfectly even)
    overruns: tuple[Overrun, ...]


def delay(waits: Iterable[int]) -> Delay:
    values = list(waits)
    return Delay(len(values), quantile_us(values, 50), quantile_us(values, 95))


def jain_permille(shares: Iterable[Fraction]) -> int:
    """Jain's fairness index (Σx)² / (n·Σx²) × 1000, rounded half-even; 1000 with no shares or
    all zero."""
    xs = list(shares)
    squares = sum((x * x for x in xs), Fraction(0))
    if not xs or squares == 0:
        return 1000
    return round(sum(xs, Fraction(0)) ** 2 * 1000 / (len(xs) * squares))


def metrics(outcome: Outcome) -> Metrics:
    scenario = outcome.scenario
    gpu_ms: dict[str, int] = {}
    cost: dict[str, int] = {}
    lost = 0
    for run in outcome.runs:
        gpu_ms[run.team] = gpu_ms.get(run.team, 0) + run.gpu_ms
        cost[run.team] = cost.get(run.team, 0) + run.cost_micros
        if run.preempted:
            lost += run.gpu_ms
    by_team: dict[str, list[int]] = {}
    by_queue: dict[str, list[int]] = {}
    for wait in outcome.waits:
        by_team.setdefault(wait.team, []).append(wait.wait_us)
        by_queue.setdefault(wait.queue, []).append(wait.wait_us)
        gpu_ms.setdefault(wait.team, 0)
        cost.setdefault(wait.team, 0)
    window_ms = max(1, (outcome.until_us - outcome.since_us) // 1000)
    capacity = scenario.fleet_gpus * window_ms
    held = sum(gpu_ms.values())
    weights = {t.name: t.fair_share_weight for t in scenario.teams}
    shares = [Fraction(ms, weights.get(team, 1)) for team, ms in sorted(gpu_ms.items())]
    overruns = []
    for budget in scenario.budgets:
        over_money = 0
        if budget.money_micros is not None:
            over_money = max(0, cost.get(budget.team, 0) - budget.money_micros)
        over_ms = 0
        if budget.gpu_ms is not None:
            over_ms = max(0, gpu_ms.get(budget.team, 0) - budget.gpu_ms)
        if over_money or over_ms:
            overruns.append(Overrun(budget.team, over_money, over_ms))
    return Metrics(
        gpu_ms=dict(sorted(gpu_ms.items())),
        cost_micros=dict(sorted(cost.items())),
        delay_by_team={t: delay(v) for t, v in sorted(by_team.items())},
        delay_by_queue={q: delay(v) for q, v in sorted(by_queue.items())},
        delay_all=delay(w.wait_us for w in outcome.waits),
        utilisation_bp=held * 10_000 // capacity if capacity else 0,
        preemptions=len(outcome.preemption_events),
        lost_gpu_ms=lost,
        jain_permille=jain_permille(shares),
        overruns=tuple(sorted(overruns, key=lambda o: o.team)),
    )
