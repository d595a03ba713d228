"""Replaying a `History` under a `Scenario`: the real scheduling cycle (`scheduler.cycle`, driven
by `scheduler.simulation.Simulation` on a simulated clock) over the window's jobs, with the
ledger's pricing (`ledger.pricing`: a run is charged per price piece in force, rounded once per
piece, as attribution does), giving an `Outcome`: every run, every first admission, every wait.

A scenario is plain domain values (`tally.whatif` builds one from a configuration): queues,
teams with quotas and cohorts, the fleet, prices, the fair-share half-life, the policy, the
budgets the teams start the window with, and the live loop's ticks: the replay decides at ticks
as the service does (`scheduler.simulation`'s ticking): every `tick_us` (the config's
`scheduler.cycle_interval_s`) and whenever a submit woke the live loop (`History`: the first
recorded tick after it), deciding together whatever was submitted or ended since the previous
tick; each tick admits at most `admissions_per_tick` jobs (the rest wait with `tick_limit`, the
next tick at once) and runs at most `max_cycles_per_tick` cycles (the rest wait for the timer's
next tick: `Limit.CYCLES` among the replay's wait reasons), as the live dispatcher's do.

Fair share starts from the usage before the window (`History.prior_gpu_ms`: the ledger's
metered usage, or the archived runs' GPU time); during the window it is metered from the
replay's own runs. A job the record shows reclaimed for idling
works as long as it did, then idles: under a queue that reclaims after `after_us` it ends then;
under one that only alerts or never acts it holds its GPUs until its queue's `max_runtime_us`,
or the window's end. A run still going at the window's end is charged up to the end; a job
still waiting then counts its wait up to the end (censored), so a scenario cannot look faster
by never admitting a job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ledger.job_events import (
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSubmitted,
    JobWaiting,
    WaitReason,
)
from ledger.pricing import PriceBook, cost_of
from ledger.units import US_PER_MS
from scheduler.cycle import MAX_CYCLES_PER_TICK
from scheduler.model import Balance, IdleAction, Node, Policy, Queue, Team
from scheduler.simulation import SimJob, SimReport, Simulation
from scheduler.state import SchedulerState
from scheduler.whatif.history import Admission, History, Limit, Why

Progress = Callable[[int, int], None]  # (jobs submitted so far, jobs in the window)
_ENDS = (JobFinished, JobFailed, JobPreempted, JobReclaimed)


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything a replay may vary."""

    name: str
    queues: tuple[Queue, ...]
    teams: tuple[Team, ...]
    nodes: tuple[Node, ...]
    prices: PriceBook
    half_life_us: int
    policy: Policy
    budgets: tuple[Balance, ...] = ()
    meter_interval_us: int = 300_000_000
    admissions_per_tick: int | None = None  # the live tick's cap (None: none)
    tick_us: int = 2_000_000  # the live loop's timer (`scheduler.cycle_interval_s`)
    max_cycles_per_tick: int = MAX_CYCLES_PER_TICK

    @property
    def fleet_gpus(self) -> int:
        return sum(len(n.gpu_uuids) for n in self.nodes)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a job in the replay: admission to its end (or the window's end)."""

    job_id: str
    team: str
    queue: str
    pool: str
    model: str
    gpus: int
    start_us: int
    end_us: int
    gpu_ms: int
    cost_micros: int
    preempted: bool


@dataclass(frozen=True, slots=True)
class Wait:
    """A job's queueing delay: submission to first admission (or to the window's end)."""

    job_id: str
    team: str
    queue: str
    wait_us: int
    admitted: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: Scenario
    since_us: int
    until_us: int
    admissions: tuple[Admission, ...]  # first admissions, in time order
    waits: tuple[Wait, ...]
    runs: tuple[Run, ...]
    wait_reasons: tuple[tuple[str, Why, int], ...]  # (job, reason, time) in the replay
    preemption_events: tuple[tuple[str, int], ...]  # (job, time)
    wall_s: float = 0.0


@dataclass
class _Recorder:
    """The simulation's listener: runs, first admissions and wait reasons as they happen."""

    prices: PriceBook
    progress: Progress | None
    total: int
    submitted: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    first: dict[str, Admission] = field(default_factory=dict)
    open: dict[str, JobAdmitted] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    reasons: list[tuple[str, WaitReason, int]] = field(default_factory=list)
    preempted: list[tuple[str, int]] = field(default_factory=list)

    def __call__(self, events: Sequence[JobEvent], state: SchedulerState) -> None:
        del state
        for event in events:
            if isinstance(event, JobSubmitted):
                spec = event.spec
                self.submitted[spec.job_id] = (spec.team, spec.queue, spec.submit_us)
                if self.progress is not None:
                    self.progress(len(self.submitted), self.total)
            elif isinstance(event, JobAdmitted):
                self.open[event.job_id] = event
                self.first.setdefault(
                    event.job_id,
                    Admission(
                        event.job_id,
                        event.team,
                        event.queue,
                        event.time_us,
                        event.pool,
                        event.model,
                    ),
                )
            elif isinstance(event, JobWaiting):
                self.reasons.append((event.job_id, event.reason, event.time_us))
            elif isinstance(event, _ENDS):
                if isinstance(event, JobPreempted):
                    self.preempted.append((event.job_id, event.time_us))
                self.close(event.job_id, event.time_us, isinstance(event, JobPreempted))

    def close(self, job_id: str, end_us: int, preempted: bool) -> None:
        admitted = self.open.pop(job_id, None)
        if admitted is None:
            return
        gpus = len(admitted.gpu_uuids)
        gpu_ms = cost = 0
        pieces = self.prices.rates_between(
            admitted.model, admitted.pool, admitted.time_us, max(end_us, admitted.time_us + 1)
        )
        for start, end, rate in pieces:
            piece_ms = gpus * (min(end, end_us) - start) // US_PER_MS
            gpu_ms += piece_ms
            cost += cost_of(piece_ms, rate)
        self.runs.append(
            Run(
                job_id,
                admitted.team,
                admitted.queue,
                admitted.pool,
                admitted.model,
                gpus,
                admitted.time_us,
                end_us,
                gpu_ms,
                cost,
                preempted,
            )
        )


def idle_runtimes(history: History, scenario: Scenario) -> tuple[SimJob, ...]:
    """The window's jobs with each reclaimed job's runtime set by `scenario`'s idle policy."""
    worked = dict(history.reclaimed)
    if not worked:
        return history.jobs
    queues = {q.name: q for q in scenario.queues}
    out = []
    for job in history.jobs:
        work = worked.get(job.spec.job_id)
        queue = queues.get(job.spec.queue)
        if work is None or queue is None:
            out.append(job)
            continue
        if queue.idle.action is IdleAction.RECLAIM:
            runtime = work + queue.idle.after_us
        else:
            runtime = queue.max_runtime_us or history.until_us - job.spec.submit_us
        out.append(replace(job, runtime_us=max(1, runtime)))
    return tuple(out)


def replay(history: History, scenario: Scenario, progress: Progress | None = None) -> Outcome:
    """Replay `history`'s jobs under `scenario` from the window's start to its end."""
    started = time.perf_counter()
    state = SchedulerState(
        scenario.queues,
        scenario.teams,
        scenario.nodes,
        prices=scenario.prices,
        half_life_us=scenario.half_life_us,
    )
    for balance in scenario.budgets:
        state.set_balance(balance)
    for team, gpu_ms, at_us in sorted(history.prior_gpu_ms, key=lambda p: p[2]):
        state.meter(team, gpu_ms, at_us)
    recorder = _Recorder(scenario.prices, progress, len(history.jobs))
    simulation = Simulation(
        state,
        scenario.policy,
        meter_interval_us=scenario.meter_interval_us,
        listener=recorder,
        admissions_per_tick=scenario.admissions_per_tick,
        tick_us=scenario.tick_us,
        max_cycles_per_tick=scenario.max_cycles_per_tick,
    )
    simulation.run(idle_runtimes(history, scenario), until_us=history.until_us - 1)
    for job_id in sorted(recorder.open):
        recorder.close(job_id, history.until_us, False)
    waits = []
    for job_id, (team, queue, submit_us) in recorder.submitted.items():
        first = recorder.first.get(job_id)
        if first is None:
            waits.append(Wait(job_id, team, queue, history.until_us - submit_us, False))
        else:
            waits.append(Wait(job_id, team, queue, first.time_us - submit_us, True))
    return Outcome(
        scenario,
        history.since_us,
        history.until_us,
        tuple(sorted(recorder.first.values(), key=lambda a: (a.time_us, a.job_id))),
        tuple(waits),
        tuple(recorder.runs),
        _reasons(recorder.reasons, simulation.report),
        tuple(recorder.preempted),
        time.perf_counter() - started,
    )


def _reasons(
    given: list[tuple[str, WaitReason, int]], report: SimReport
) -> tuple[tuple[str, Why, int], ...]:
    """The cycles' wait reasons with the ticks' own limits among them, in time order (at one
    time: the cycles', the reasons that came back after a cycles cap, then the cap)."""
    merged: list[tuple[int, int, str, Why]] = [(t, 0, job, why) for job, why, t in given]
    merged += [(t, 1, job, why) for t, job, why in report.resumed]
    merged += [(t, 2, job, Limit.CYCLES) for t, jobs in report.cycle_limited for job in jobs]
    merged.sort(key=lambda m: (m[0], m[1]))
    return tuple((job, why, t) for t, _, job, why in merged)
