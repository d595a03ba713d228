"""The simulated cluster's history: weeks of jobs and samples that `tally up` backfills into a
new ledger, so every dashboard page has numbers within minutes.

`simulate_history` is pure: the config and a window in; the jobs-topic messages and each GPU's
stints out. It generates the window's submit schedule (`collectors.workload`, the same one the
live submitter follows) and replays it through the real scheduling cycle
(`scheduler.simulation`: the configured queues, quotas, fair share and budgets on the simulated
fleet's GPUs), recording every event the scheduler would have published, with its past time:
submissions, admissions, waits, GPU assignments and releases, ends, and the holds the
dispatcher places and releases (`HoldPlaced` / `HoldReleased`, computed as
`scheduler.dispatcher` does). Each message's `tally-seq` is its time in µs × 1000 (plus its
place among events of the same µs), below anything the live scheduler publishes later.

Rules of the replay, where the simulation plays the world:
- a budget's allowance is the scheduler's balance at the start of each month (as the ledger
  would report it), spent as runs end;
- an idle job (a forgotten notebook) in a queue that reclaims is reclaimed (`JobReclaimed`)
  `after` its queue's idle time, as the live scheduler would once the ledger reports its GPUs
  idle; in other queues it runs its course;
- the executor starts a job as it is admitted (`JobStarted` at the admission's time);
- jobs the schedule has still running at the end of the window are left to the live
  submitter (`collectors.workload.in_flight`); any other job still running then (it waited)
  finishes and every pending job is cancelled, so the live scheduler rebuilds a state with
  nothing in flight (it cannot run a command the history never had).

`history_samples` then meters each round of the window on the simulated fleet: a GPU runs the
job that held it at that moment (its queue's profile, owned by its team, project, user and
job), otherwise an external notebook or nothing (`collectors.simulated`, cluster mode).
Publishing (`publish_history`) is the only I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from collectors.simulated import SimulatedFleet, TeamSpec, Workload, WorkloadKind
from collectors.workload import (
    JobKind,
    PlannedJob,
    TeamPool,
    in_flight,
    kind_of_queue,
    submit_schedule,
)
from ledger.events import GpuSample, Owner
from ledger.holds import HoldEvent, HoldPlaced, HoldReleased
from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobStarted,
    JobSubmitted,
)
from ledger.periods import period_label
from ledger.units import Unit
from scheduler.decisions import release_events
from scheduler.dispatcher import HOLD_SLACK_US
from scheduler.jobs_topic import Outgoing, hold_message, job_message
from scheduler.lifecycle import cancel, finish, runtime_limit
from scheduler.model import NO_HOLD, Balance, IdleAction, Policy
from scheduler.simulation import SimJob, Simulation
from scheduler.state import SchedulerState
from tally.components import simulated_fleet
from tally.config import TallyConfig
from tally.scheduling import scheduler_state

_ENDS = (JobPreempted, JobFinished, JobReclaimed, JobFailed)


@dataclass(frozen=True, slots=True)
class Stint:
    """`gpu_uuid` ran a job (`owner`, its queue's profile `kind`) over [start_us, end_us)."""

    gpu_uuid: str
    start_us: int
    end_us: int
    kind: WorkloadKind
    owner: Owner


@dataclass(frozen=True, slots=True)
class ClusterHistory:
    start_us: int
    end_us: int
    planned: int  # jobs submitted in the window
    messages: tuple[Outgoing, ...]  # the jobs topic, in publication (seq) order
    stints: tuple[Stint, ...]


def team_pools(config: TallyConfig) -> list[TeamPool]:
    """Each team with a quota, on the pool (and model) of its largest nominal quota, its
    jobs at most that many GPUs."""
    teams = {t.name: t for t in config.organisation.teams()}
    best: dict[str, tuple[int, str, str]] = {}
    for q in config.quotas:
        if q.nominal > best.get(q.team, (-1, "", ""))[0]:
            best[q.team] = (q.nominal, q.pool, q.model)
    return [
        TeamPool(
            TeamSpec(name, tuple(teams[name].projects), tuple(teams[name].users)),
            pool,
            model,
            max_gpus=nominal,
        )
        for name, (nominal, pool, model) in sorted(best.items())
    ]


def job_mix(config: TallyConfig) -> list[tuple[JobKind, int]]:
    mix = config.fleet.workloads
    return [
        (JobKind.TRAINING, mix.training),
        (JobKind.INFERENCE, mix.inference),
        (JobKind.NOTEBOOK, mix.notebook),
    ]


def monthly_balances(config: TallyConfig) -> dict[str, Balance]:
    """Each team's recurring budget as a fresh month's balance (allowance, overdraft)."""
    overdraft = {t.name: t.overdraft_money for t in config.scheduler.teams}
    out: dict[str, Balance] = {}
    for b in config.budgets:
        if b.every is None:
            continue
        out[b.team] = Balance(
            b.team, b.money, b.gpu_hours, overdraft_micros=overdraft.get(b.team) or 0
        )
    return out


class _Recorder:
    """The listener: every applied event, its holds, and the month's budget refills."""

    def __init__(self, balances: dict[str, Balance]) -> None:
        self.events: list[JobEvent | HoldEvent] = []
        self.balances = balances
        self.month = ""
        self.held: set[str] = set()

    def refill(self, state: SchedulerState, time_us: int) -> None:
        month = period_label(time_us)
        if month != self.month:
            self.month = month
            for balance in self.balances.values():
                state.set_balance(balance)

    def __call__(self, events: Sequence[JobEvent], state: SchedulerState) -> None:
        for event in events:
            self.events.append(event)
            if isinstance(event, JobAdmitted):
                self.events.extend(self._placed(event, state))
                self.events.append(JobStarted(event.job_id, event.time_us))  # the executor's
            elif isinstance(event, _ENDS) and event.job_id in self.held:
                self.held.discard(event.job_id)
                reason = type(event).__name__.removeprefix("Job").lower()
                if isinstance(event, JobFailed):
                    reason = f"failed: {event.reason.value}"
                self.events.append(HoldReleased(event.job_id, max(1, event.time_us), reason))
        if events:
            self.refill(state, events[-1].time_us)

    def _placed(self, event: JobAdmitted, state: SchedulerState) -> list[HoldEvent]:
        job = state.running_job(event.job_id)
        if job is None or job.hold == NO_HOLD:
            return []
        limit = runtime_limit(job, state.queues.get(job.spec.queue))
        span = limit if limit is not None else 2 * job.spec.estimated_runtime_us
        at = max(1, event.time_us)
        expires = at + span + HOLD_SLACK_US
        self.held.add(job.job_id)
        amounts = ((Unit.GPU_MS, job.hold.gpu_ms), (Unit.MONEY, job.hold.money_micros))
        return [
            HoldPlaced(job.job_id, job.team, job.spec.project, unit, amount, expires, at)
            for unit, amount in amounts
            if amount > 0
        ]


class _ClusterSimulation(Simulation):
    """The simulation, with idle jobs reclaimed by their queue's policy when their run ends."""

    idle_jobs: frozenset[str] = frozenset()

    def _end(self, job_id: str, now_us: int) -> None:
        running = self.state.running_job(job_id)
        queue = None if running is None else self.state.queues.get(running.spec.queue)
        if running is None or queue is None or job_id not in self.idle_jobs:
            super()._end(job_id, now_us)
            return
        held_us = now_us - running.admitted_us
        if queue.idle.action is not IdleAction.RECLAIM or held_us < queue.idle.after_us:
            super()._end(job_id, now_us)  # closed before its queue would reclaim it
            return
        gpus = tuple(sorted(g.uuid for g in running.gpus))
        reclaimed = JobReclaimed(
            job_id=job_id,
            gpu_uuids=gpus,
            idle_since_us=running.admitted_us,
            time_us=now_us,
            detail=f"all {len(gpus)} GPU(s) idle for {held_us} µs; queue "
            f"{queue.name} reclaims after {queue.idle.after_us} µs",
        )
        self._apply((reclaimed, *release_events(running, now_us)))

    def close(self, now_us: int) -> None:
        """The end of the window: what runs finishes, what waits is cancelled."""
        closing: list[JobEvent] = []
        for running in self.state.running_jobs():
            closing.extend(finish(running, now_us))
        for pending in self.state.pending_jobs():
            closing.extend(cancel(pending, now_us, "the simulated history ends"))
        self._apply(closing)


def _sim_job(plan: PlannedJob, state: SchedulerState) -> SimJob:
    spec = JobSpec(
        job_id=plan.key,
        team=plan.team,
        project=plan.project,
        user=plan.user,
        queue=plan.queue,
        gpus=plan.gpus,
        submit_us=plan.submit_us,
        estimated_runtime_us=plan.runtime_us,
        model=plan.model,
        pool=plan.pool,
    )
    runtime = plan.runtime_us
    queue = state.queues.get(plan.queue)
    if plan.idle and queue is not None and queue.idle.action is IdleAction.RECLAIM:
        runtime = min(runtime, queue.idle.after_us + 60_000_000)  # reclaimed within a minute
    return SimJob(spec, runtime)


def simulate_history(config: TallyConfig, start_us: int, end_us: int) -> ClusterHistory:
    """The window's jobs replayed through the scheduling cycle (see the module rules)."""
    workload = config.fleet.workload
    rate = workload.jobs_per_hour if workload is not None else 0
    planned = submit_schedule(
        config.fleet.seed, team_pools(config), job_mix(config), rate, start_us, end_us
    )
    live = {j.key for j in in_flight(planned, end_us)}  # the live submitter's
    plans = [p for p in planned if p.key not in live]
    state = scheduler_state(config)
    recorder = _Recorder(monthly_balances(config))
    recorder.refill(state, start_us)
    sim = _ClusterSimulation(
        state, Policy(heads_per_queue=config.scheduler.heads_per_queue), listener=recorder
    )
    sim.idle_jobs = frozenset(p.key for p in plans if p.idle)
    sim.run([_sim_job(p, state) for p in plans], until_us=end_us - 1)
    sim.close(end_us - 1)
    return ClusterHistory(
        start_us, end_us, len(plans), _messages(recorder.events), _stints(recorder.events)
    )


def _messages(events: Sequence[JobEvent | HoldEvent]) -> tuple[Outgoing, ...]:
    out: list[Outgoing] = []
    seq = 0
    for event in events:
        seq = max(seq + 1, event.time_us * 1000)
        if isinstance(event, HoldPlaced | HoldReleased):
            out.append(hold_message(event, seq))
        else:
            out.append(job_message(event, seq))
    return tuple(out)


def _stints(events: Sequence[JobEvent | HoldEvent]) -> tuple[Stint, ...]:
    queues: dict[str, str] = {}
    open_: dict[str, GpuAssigned] = {}
    out: list[Stint] = []
    for event in events:
        if isinstance(event, JobSubmitted):
            queues[event.job_id] = event.spec.queue
        elif isinstance(event, GpuAssigned):
            open_[event.gpu_uuid] = event
        elif isinstance(event, GpuReleased):
            start = open_.pop(event.gpu_uuid, None)
            if start is not None and event.time_us > start.time_us:
                out.append(_stint(start, event.time_us, queues))
    return tuple(out)


def _stint(a: GpuAssigned, end_us: int, queues: dict[str, str]) -> Stint:
    kind = WorkloadKind(kind_of_queue(queues.get(a.job_id, "")).value)
    owner = Owner(team=a.team, project=a.project, user=a.user, job_id=a.job_id)
    return Stint(a.gpu_uuid, a.time_us, end_us, kind, owner)


def history_fleet(config: TallyConfig) -> SimulatedFleet:
    """The simulated fleet in cluster mode, sampling at the history's coarser interval."""
    workload = config.fleet.workload
    return simulated_fleet(config, interval_s=workload.history_interval_s if workload else None)


def history_samples(fleet: SimulatedFleet, history: ClusterHistory) -> Iterator[list[GpuSample]]:
    """One round per `fleet.interval_us` over the window, each GPU metering what ran there at
    the end of the round's interval."""
    interval = fleet.interval_us
    by_start = sorted(history.stints, key=lambda s: s.start_us)
    starts = [s.start_us for s in by_start]
    running: dict[str, tuple[Stint, Workload]] = {}
    taken = 0
    t = history.start_us - history.start_us % interval + interval
    while t < history.end_us:
        moment = t - 1
        upto = bisect.bisect_right(starts, moment)
        for stint in by_start[taken:upto]:
            running[stint.gpu_uuid] = (stint, fleet.job_workload(stint.kind, stint.owner))
        taken = upto
        for uuid in [u for u, (s, _) in running.items() if s.end_us <= moment]:
            del running[uuid]
        fleet.jobs = {uuid: work for uuid, (_, work) in running.items()}
        yield fleet.sample_round(t)
        t += interval
