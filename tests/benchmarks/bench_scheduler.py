"""Scheduler benchmark: the Philly trace replayed in simulated time under three policies.

Trace: `philly_pollux.csv` (Microsoft Philly, via the Pollux artifact), rows sorted by
submission time; `duration` is each job's runtime, `num_gpus` its gang size, `cluster` (the
virtual cluster) its tenant. Fleet and quotas: `philly_vc_nodes_heliosartifact.csv`, 8 GPUs per
node, scaled by `FLEET_SCALE`; each tenant's nominal quota is its share of the fleet; tenants
without a row get `DEFAULT_NODES` nodes; all tenants form one cohort with no borrowing or
lending limits. One flavor; one preemptible training queue; no budgets.

Policies, each on the same jobs in the same run:
- FIFO: one global first-in-first-out order, no quotas; the first job waiting for free GPUs
  blocks everyone behind it;
- request-based fair share (Kueue-like): quotas, borrowing within the cohort, reclaim by
  preemption, ordered by (GPUs the tenant holds + GPUs requested) / quota;
- Tally: the same quotas, borrowing and reclaim, ordered by decayed metered usage / quota
  (half-life `HALF_LIFE_US`, usage metered every 5 simulated minutes).

Figures per policy:
- admission decisions per second (a decision is a job given a verdict: admitted, or waiting
  with a reason) and admissions per second, measured only over scheduling cycles (snapshot +
  decide + apply) that started with ≥ 10,000 pending jobs, on the full-scale fleet, with the
  first `SATURATION_JOBS` jobs of the window submitted at once;
- from the replay of the window (after `WARMUP_DAYS` replayed but not measured): queueing
  delay of the window's jobs (mean, median, p95; submission to first admission; the replay
  runs until every job has ended), GPU-hours lost to preemption, GPU utilisation (mean GPUs
  held / fleet GPUs, sampled every 5 minutes over the window), and Jain's fairness index of
  per-tenant share versus quota: at every sample where some tenant waits, each tenant's GPUs
  held divided by its entitlement — the fleet divided by weighted max-min fairness with quota
  as weight and GPUs wanted (held + pending) as cap — averaged over those samples; also over
  the window's totals per tenant, and the worst tenant's total share / entitlement;
- price-aware placement (`tests.benchmarks.scheduler_price`): utilisation and cost per team
  with and without it, on the same replay over a two-model (A100/H100) split of the fleet.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from ledger.job_events import JobSpec
from scheduler.model import (
    FIFO_POLICY,
    Flavor,
    IdleAction,
    IdlePolicy,
    Node,
    Ordering,
    Policy,
    Queue,
    QueueClass,
    Quota,
    Team,
)
from scheduler.simulation import SimJob, SimReport, Simulation
from scheduler.state import SchedulerState
from tests.benchmarks.harness import Figure, FigureSpec, Progress, policy_figures
from tests.benchmarks.scheduler_price import price_figures

BENCH = "scheduler"
TRACES = Path(__file__).resolve().parents[3] / "shared/data/traces"
TRACE = TRACES / "philly_pollux.csv"
VC_NODES = TRACES / "philly_vc_nodes_heliosartifact.csv"
GPUS_PER_NODE = 8
DEFAULT_NODES = 1
FLEET_SCALE = Decimal("0.2")  # replay fleet: a fifth of the VC table, so the window is contended
WINDOW_START_DAY = 42  # days after the first submission in the trace
WINDOW_DAYS = 14
WARMUP_DAYS = 2  # replayed before the window, not measured, so it does not start empty
DAY_US = 86_400_000_000
SATURATION_JOBS = 14_000
SATURATION_PENDING = 10_000
HALF_LIFE_US = 24 * 3_600_000_000
SAMPLE_US = 300_000_000
FLAVOR = Flavor("philly", "gpu")
QUEUE = Queue(
    name="train",
    queue_class=QueueClass.TRAINING,
    priority=0,
    preemptible=True,
    idle=IdlePolicy(IdleAction.ALERT),
)
KUEUE_POLICY = Policy(ordering=Ordering.REQUESTED_SHARE)
TALLY_POLICY = Policy(ordering=Ordering.METERED_FAIR_SHARE)
POLICIES: tuple[tuple[str, Policy], ...] = (
    ("FIFO", FIFO_POLICY),
    ("request share (Kueue-like)", KUEUE_POLICY),
    ("Tally", TALLY_POLICY),
)


def _us(stamp: str) -> int:
    moment = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000


def load_trace() -> list[tuple[int, int, int, str]]:
    """(submit µs, runtime µs, GPUs, tenant) per row, sorted by submission time."""
    with TRACE.open(newline="") as handle:
        rows = [
            (
                _us(r["timestamp"]),
                max(1, int(Decimal(r["duration"]))) * 1_000_000,
                int(r["num_gpus"]),
                r["cluster"],
            )
            for r in csv.DictReader(handle)
        ]
    rows.sort()
    return rows


def load_vc_nodes() -> dict[str, int]:
    with VC_NODES.open(newline="") as handle:
        return {r["vc"]: int(r["node num"]) for r in csv.DictReader(handle)}


def fleet_and_teams(
    tenants: Sequence[str], vc_nodes: Mapping[str, int], scale: Decimal
) -> tuple[list[Node], list[Team]]:
    """Nodes and one-cohort teams: each tenant's quota is its (scaled) nodes × 8 GPUs."""
    nodes: list[Node] = []
    teams: list[Team] = []
    for tenant in sorted(tenants):
        count = max(1, int(vc_nodes.get(tenant, DEFAULT_NODES) * scale))
        for n in range(count):
            name = f"{tenant}-{n:03d}"
            uuids = tuple(f"GPU-{name}-{i}" for i in range(GPUS_PER_NODE))
            nodes.append(Node(name, FLAVOR.pool, FLAVOR.model, uuids))
        quota = Quota(FLAVOR, count * GPUS_PER_NODE)
        teams.append(Team(tenant, (quota,), cohort="philly"))
    return nodes, teams


def sim_jobs(rows: Sequence[tuple[int, int, int, str]], at_once: bool = False) -> list[SimJob]:
    jobs = []
    first = rows[0][0] if rows else 0
    for index, (submit, runtime, gpus, tenant) in enumerate(rows):
        spec = JobSpec(
            job_id=f"philly-{index:06d}",
            team=tenant,
            project=tenant,
            user=tenant,
            queue=QUEUE.name,
            gpus=gpus,
            submit_us=first if at_once else submit,
            estimated_runtime_us=runtime,
        )
        jobs.append(SimJob(spec, runtime))
    return jobs


def _state(nodes: Sequence[Node], teams: Sequence[Team]) -> SchedulerState:
    return SchedulerState((QUEUE,), teams, nodes, half_life_us=HALF_LIFE_US)


def water_fill(
    capacity: int, weights: Mapping[str, int], caps: Mapping[str, int]
) -> dict[str, float]:
    """Weighted max-min fair shares of `capacity`, no tenant above its cap."""
    share = {t: 0.0 for t in caps}
    active = {t for t, c in caps.items() if c > 0}
    left = float(capacity)
    while active and left > 1e-9:
        total_weight = sum(weights[t] for t in active)
        step = left / total_weight
        capped = {t for t in active if share[t] + step * weights[t] >= caps[t]}
        if not capped:
            for t in active:
                share[t] += step * weights[t]
            break
        for t in capped:
            left -= caps[t] - share[t]
            share[t] = float(caps[t])
        active -= capped
    return share


def jain(values: Sequence[float]) -> float:
    if not values:
        return 1.0
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def fairness(
    report: SimReport, fleet: int, quotas: Mapping[str, int], start_us: int, end_us: int
) -> tuple[float, float, dict[str, float]]:
    """Jain's index of GPUs held / entitlement: the mean over contended samples, and over the
    window's totals; and each tenant's total held / total entitled."""
    indices = []
    held_sum: dict[str, float] = {}
    entitled_sum: dict[str, float] = {}
    for sample in report.shares:
        if sample.time_us > end_us:
            break
        if sample.time_us < start_us:
            continue
        if sum(sample.wanted.values()) <= sum(sample.held.values()):
            continue  # nobody waits: every tenant has what it wants
        entitled = water_fill(fleet, quotas, sample.wanted)
        ratios = []
        for tenant, share in entitled.items():
            if share <= 0:
                continue
            held = sample.held.get(tenant, 0)
            ratios.append(held / share)
            held_sum[tenant] = held_sum.get(tenant, 0.0) + held
            entitled_sum[tenant] = entitled_sum.get(tenant, 0.0) + share
        indices.append(jain(ratios))
    per_tenant = {t: held_sum[t] / e for t, e in entitled_sum.items()}
    mean = statistics.fmean(indices) if indices else 1.0
    return mean, jain(list(per_tenant.values())), per_tenant


def utilisation(report: SimReport, fleet: int, start_us: int, end_us: int) -> float:
    held = [sum(s.held.values()) for s in report.shares if start_us <= s.time_us <= end_us]
    return statistics.fmean(held) / fleet if held else 0.0


def p95(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=20)[18] if len(values) >= 2 else 0.0


def saturation(
    rows: Sequence[tuple[int, int, int, str]], tenants: Sequence[str], policy: Policy
) -> tuple[float, float, int, int]:
    """Decisions/s and admissions/s over cycles that began with ≥ SATURATION_PENDING pending."""
    nodes, teams = fleet_and_teams(tenants, load_vc_nodes(), Decimal(1))
    sim = Simulation(_state(nodes, teams), policy, time_cycles=True)

    def _stop(state: SchedulerState) -> bool:
        return state.pending_count < SATURATION_PENDING

    jobs = sim_jobs(rows[:SATURATION_JOBS], at_once=True)
    report = sim.run(jobs, stop=_stop)
    timed = [c for c in report.cycles if c.pending >= SATURATION_PENDING]
    seconds = sum(c.seconds for c in timed)
    decisions = sum(c.decisions for c in timed)
    admitted = sum(c.admitted for c in timed)
    return decisions / seconds, admitted / seconds, len(timed), len(nodes) * GPUS_PER_NODE


def run(progress: Progress) -> list[Figure]:
    rows = load_trace()
    start = rows[0][0] + WINDOW_START_DAY * DAY_US
    end = start + WINDOW_DAYS * DAY_US
    window = [r for r in rows if start <= r[0] < end]
    replayed = [r for r in rows if start - WARMUP_DAYS * DAY_US <= r[0] < end]
    tenants = sorted({r[3] for r in rows})
    nodes, teams = fleet_and_teams(tenants, load_vc_nodes(), FLEET_SCALE)
    fleet = len(nodes) * GPUS_PER_NODE
    quotas = {t.name: t.quotas[0].nominal for t in teams}
    progress(f"{len(window):,} jobs, {fleet:,} GPUs; saturation on the full-scale fleet")
    results: dict[str, dict[str, float]] = {}
    for name, policy in POLICIES:
        began = time.monotonic()
        rate, admit_rate, cycles, sat_gpus = saturation(window, tenants, policy)
        sim = Simulation(_state(nodes, teams), policy, share_interval_us=SAMPLE_US)
        report = sim.run(sim_jobs(replayed))
        delays = [
            (report.first_admitted_us[j] - t) / 1_000_000
            for j, t in report.submitted_us.items()
            if t >= start
        ]
        instant, overall, per_tenant = fairness(report, fleet, quotas, start, end)
        results[name] = {
            "rate": rate,
            "admit_rate": admit_rate,
            "cycles": cycles,
            "mean": statistics.fmean(delays),
            "median": statistics.median(delays),
            "p95": p95(delays),
            "util": utilisation(report, fleet, start, end),
            "jain": instant,
            "jain_window": overall,
            "min_share": min(per_tenant.values(), default=1.0),
            "preemptions": report.preemptions,
            "lost": report.gpu_us_preempted / 3_600_000_000,
            "gpus": sat_gpus,
        }
        progress(
            f"{name}: {rate:,.0f} decisions/s, {admit_rate:,.0f} admissions/s ({cycles} cycles "
            f"≥ {SATURATION_PENDING:,} pending, {sat_gpus:,} GPUs); delay mean "
            f"{results[name]['mean']:,.0f} s p95 {results[name]['p95']:,.0f} s; util "
            f"{results[name]['util']:.2f}; Jain {instant:.3f}/{overall:.3f}; "
            f"{report.preemptions} preemptions; {time.monotonic() - began:.1f} s"
        )
    figures = _figures(results, len(window), fleet)
    return figures + price_figures(
        BENCH,
        QUEUE,
        nodes,
        teams,
        sim_jobs(replayed),
        TALLY_POLICY,
        half_life_us=HALF_LIFE_US,
        sample_us=SAMPLE_US,
        utilisation=lambda report: utilisation(report, fleet, start, end),
        progress=progress,
    )


def _figures(results: Mapping[str, Mapping[str, float]], jobs: int, fleet: int) -> list[Figure]:
    tally = results["Tally"]
    replay = (
        f"replay: Philly days {WINDOW_START_DAY}–{WINDOW_START_DAY + WINDOW_DAYS} after the "
        f"trace start ({jobs:,} jobs, a contiguous window to keep the run short, after "
        f"{WARMUP_DAYS} unmeasured warm-up days) on {fleet:,} GPUs (VC table × {FLEET_SCALE}, "
        "so the window is contended)"
    )
    saturation_note = (
        f"cycles that began with ≥ {SATURATION_PENDING:,} pending jobs: the window's first "
        f"{SATURATION_JOBS:,} jobs submitted at once on {int(tally['gpus']):,} GPUs (full VC "
        "table); only snapshot + decide + apply is timed"
    )
    specs: tuple[FigureSpec, ...] = (
        ("rate", "decisions/s", "decisions/s", True, "≥ 1,000 decisions/s", saturation_note),
        ("admit_rate", "admissions/s", "jobs/s", True, None, "admitted jobs only, same cycles"),
        ("mean", "queueing delay mean", "s", False, None, replay),
        ("median", "queueing delay median", "s", False, None, None),
        ("p95", "queueing delay p95", "s", False, None, None),
        (
            "util",
            "GPU utilisation",
            "fraction",
            True,
            None,
            "mean GPUs held / fleet, 5-min samples",
        ),
        (
            "jain",
            "Jain share/quota",
            "index",
            True,
            None,
            "per-tenant GPUs held / weighted max-min entitlement (quota weights, demand caps), "
            "mean over samples where some tenant waits",
        ),
        (
            "jain_window",
            "Jain share/quota window",
            "index",
            True,
            None,
            "the same ratio over the window's totals per tenant",
        ),
        ("min_share", "worst tenant share/quota", "ratio", True, None, None),
        ("preemptions", "preemptions", "jobs", False, None, None),
        (
            "lost",
            "GPU-hours lost to preemption",
            "GPU-h",
            False,
            None,
            "runs cut short by preemption (no checkpointing assumed)",
        ),
    )
    return policy_figures(BENCH, results, specs)
