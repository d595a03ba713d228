"""A discrete-event simulation of the scheduler in simulated time: replay jobs (a trace or a
random workload) through the real state and cycle, with jobs that run, fail and finish.

It plays the parts the rest of the system plays in production: the executor (jobs end after
their runtime, or fail), the ledger (metered usage for fair share every `meter_interval_us`;
a run's usage settled into its team's budget when the run ends), and the clock. Between events
nothing happens; at each event time the simulation applies what happened, then runs cycles
until one admits and preempts nothing. Only the cycles (snapshot, decide, apply) are timed.

With `admissions_per_tick` (the live scheduler's `scheduler.admissions_per_tick`), the cycles
at one event time are ticks as the live dispatcher runs them: a tick admits at most that many
jobs, the jobs its cap leaves out wait with `tick_limit`, and the next tick follows at once (at
the same simulated time, with a fresh snapshot, so ordering sees what the last tick admitted).
Without it (None, the default) nothing caps a cycle.

With `tick_us` (the live scheduler's `scheduler.cycle_interval_s`, as the what-if replay runs
it) the simulation decides at ticks as the live service's loop does, not at every event: a tick
every `tick_us` (the timer), and one at each job's `seen_us` (the API wakes the loop on a
submit; by default at the submit itself). What happened since the previous tick — jobs
submitted, runs ended (at their own times: charged to then, their GPUs free from this tick) —
is decided together by the tick's cycles: at most `max_cycles_per_tick` of them
(`scheduler.cycle.MAX_CYCLES_PER_TICK`), so a tick whose last cycle still admitted or
preempted leaves the rest to the timer's next tick (`SimReport.cycle_limited` says when, and
who was still pending). The timer ticks on a fixed grid (the multiples of `tick_us`): the live
timer restarts after every tick, a phase that a record does not show (a tick that decided
nothing leaves no event), so a replay on the grid keeps one phase whatever it decides. A timer
tick with nothing new to see since the previous tick is skipped (it would decide what that one
did).

Used by the scheduler benchmark and the randomised invariant tests; also a what-if tool.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from ledger.job_events import (
    FailReason,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobSubmitted,
    WaitReason,
)
from ledger.pricing import cost_of
from ledger.units import US_PER_MS
from scheduler.cycle import MAX_CYCLES_PER_TICK, CycleResult, run_cycle
from scheduler.lifecycle import fail, finish, overdue
from scheduler.model import Policy
from scheduler.state import SchedulerState

Listener = Callable[[Sequence[JobEvent], SchedulerState], None]


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job to replay: its spec, how long it really runs, how many attempts fail first (each
    failing attempt exits non-zero halfway through), and when its submit woke a tick."""

    spec: JobSpec
    runtime_us: int
    failing_attempts: int = 0
    seen_us: int | None = None  # when its submit woke the scheduler (ticking; None: at once)


@dataclass(frozen=True, slots=True)
class CycleSample:
    pending: int  # jobs pending when the cycle started
    decisions: int
    admitted: int
    seconds: float  # wall clock
    cpu_seconds: float = 0.0  # this thread's CPU time: what other processes' load does not add


@dataclass(frozen=True, slots=True)
class ShareSample:
    """Per team at one instant: GPUs held, and GPUs wanted (held + pending requests)."""

    time_us: int
    held: dict[str, int]
    wanted: dict[str, int]


@dataclass
class SimReport:
    submitted_us: dict[str, int] = field(default_factory=dict)
    first_admitted_us: dict[str, int] = field(default_factory=dict)
    ended_us: dict[str, int] = field(default_factory=dict)
    cycles: list[CycleSample] = field(default_factory=list)
    shares: list[ShareSample] = field(default_factory=list)
    gpu_us_held: int = 0  # ∫ GPUs held dt over the simulated span
    gpu_us_preempted: int = 0  # GPU time of runs cut short by preemption (work lost)
    preemptions: int = 0
    ticks: int = 0  # ticks run (ticking only)
    # ticking: (tick, jobs pending) when the cycles cap stopped a tick, and (next tick, job,
    # its wait reason) for those still pending after the tick that followed it
    cycle_limited: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    resumed: list[tuple[int, str, WaitReason]] = field(default_factory=list)
    start_us: int = 0
    end_us: int = 0

    def queueing_delays_us(self) -> list[int]:
        return [t - self.submitted_us[j] for j, t in self.first_admitted_us.items()]


_SUBMIT, _END = 0, 1
_ENDS_A_RUN = (JobPreempted, JobFinished, JobReclaimed, JobFailed)


class Simulation:
    """Replays `SimJob`s through a `SchedulerState` under a `Policy`, in simulated time."""

    def __init__(
        self,
        state: SchedulerState,
        policy: Policy,
        *,
        meter_interval_us: int = 300_000_000,
        share_interval_us: int = 0,
        listener: Listener | None = None,
        time_cycles: bool = False,
        max_cycles_per_event: int = 1_000,
        admissions_per_tick: int | None = None,
        tick_us: int | None = None,
        max_cycles_per_tick: int = MAX_CYCLES_PER_TICK,
    ) -> None:
        if tick_us is not None and tick_us < 1:
            raise ValueError("tick_us must be at least 1")
        self.state = state
        self.tick_us = tick_us  # None: decide at every event time
        self.max_cycles_per_tick = max_cycles_per_tick
        self.policy = policy
        self.admissions_per_tick = admissions_per_tick  # None: no cap
        self.meter_interval_us = meter_interval_us
        self.share_interval_us = share_interval_us
        self.listener = listener
        self.time_cycles = time_cycles
        self.max_cycles_per_event = max_cycles_per_event
        self.report = SimReport()
        self._jobs: dict[str, SimJob] = {}
        self._queue: list[tuple[int, int, int, str, int]] = []  # (time, kind, seq, job, token)
        self._wakes: list[int] = []  # ticking: when submits wake the scheduler
        self._seq = 0
        self._admitted_at: dict[str, int] = {}
        self._tokens: dict[str, int] = {}  # job → admission count; stale ends are ignored
        self._wanted: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._metered_us: dict[str, int] = {}  # GPU-µs held per team since the last meter
        self._last_us = 0
        self._next_meter_us = 0
        self._next_share_us = 0

    # ------------------------------------------------------------------ driving

    def _push(self, at_us: int, kind: int, job_id: str, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_us, kind, self._seq, job_id, token))

    def _apply(self, events: Sequence[JobEvent]) -> None:
        state = self.state
        for event in events:
            if isinstance(event, GpuReleased):
                self._held[event.team] -= 1
            elif isinstance(event, _ENDS_A_RUN):
                self._settle(event.job_id, event.time_us)
            state.apply(event)
            if isinstance(event, JobAdmitted):
                self._admitted(event)
            elif isinstance(event, JobPreempted):
                spec = self._jobs[event.job_id].spec
                started = self._admitted_at.get(event.job_id, event.time_us)
                self.report.gpu_us_preempted += (event.time_us - started) * spec.gpus
            elif isinstance(event, JobFinished | JobReclaimed) or (
                isinstance(event, JobFailed) and not event.retry
            ):
                spec = self._jobs[event.job_id].spec
                self._wanted[spec.team] -= spec.gpus
                self.report.ended_us[event.job_id] = event.time_us
        if self.listener is not None:
            self.listener(events, state)

    def _admitted(self, event: JobAdmitted) -> None:
        job_id = event.job_id
        token = self._tokens.get(job_id, 0) + 1
        self._tokens[job_id] = token
        self.report.first_admitted_us.setdefault(job_id, event.time_us)
        self._admitted_at[job_id] = event.time_us
        gpus = len(event.gpu_uuids)
        self._held[event.team] = self._held.get(event.team, 0) + gpus
        job = self._jobs[job_id]
        runtime = job.runtime_us
        if event.attempt <= job.failing_attempts:
            runtime = max(1, runtime // 2)
        self._push(event.time_us + runtime, _END, job_id, token)

    def _settle(self, job_id: str, now_us: int) -> None:
        """Play the ledger: when a run ends, its usage is settled into its team's budget."""
        job = self.state.running_job(job_id)
        if job is None:
            return
        balance = self.state.balance(job.team)
        if balance is None:
            return
        gpu_ms = len(job.gpus) * ((now_us - job.admitted_us) // US_PER_MS)
        money = balance.money_micros
        if money is not None and self.state.prices is not None:
            rate = self.state.prices.rate_at(job.flavor.model, job.flavor.pool, now_us)
            money -= cost_of(gpu_ms, rate)
        left_ms = None if balance.gpu_ms is None else balance.gpu_ms - gpu_ms
        self.state.set_balance(replace(balance, money_micros=money, gpu_ms=left_ms))

    def _advance(self, now_us: int) -> None:
        """Integrate GPUs held up to `now_us`; meter and sample shares on their intervals."""
        elapsed = now_us - self._last_us
        if elapsed > 0:
            for team, held in self._held.items():
                if held:
                    self._metered_us[team] = self._metered_us.get(team, 0) + held * elapsed
                    self.report.gpu_us_held += held * elapsed
            self._last_us = now_us
        if now_us >= self._next_meter_us:
            for team, gpu_us in self._metered_us.items():
                if gpu_us:
                    self.state.meter(team, gpu_us // US_PER_MS, now_us)
            self._metered_us.clear()
            self._next_meter_us = now_us + self.meter_interval_us
        if self.share_interval_us and now_us >= self._next_share_us:
            self.report.shares.append(
                ShareSample(
                    now_us,
                    {t: h for t, h in self._held.items() if h},
                    {t: w for t, w in self._wanted.items() if w},
                )
            )
            self._next_share_us = now_us + self.share_interval_us

    def _end(self, job_id: str, now_us: int) -> None:
        running = self.state.running_job(job_id)
        if running is None:
            return
        job = self._jobs[job_id]
        if running.attempt <= job.failing_attempts:
            queue = self.state.queues.get(running.spec.queue)
            events = fail(running, queue, FailReason.EXIT_NONZERO, now_us, exit_code=1)
        else:
            events = finish(running, now_us)
        self._apply(events)

    def _cycle(self, now_us: int, left: int | None) -> CycleResult:
        """One cycle at `now_us` admitting at most `left` jobs, applied and sampled."""
        state = self.state
        pending = state.pending_count
        timed = self.time_cycles
        started = time.perf_counter() if timed else 0.0
        cpu = time.thread_time() if timed else 0.0
        result = run_cycle(state.snapshot(now_us, self.policy.heads_per_queue), self.policy, left)
        self._apply(result.events)
        seconds = time.perf_counter() - started if timed else 0.0
        cpu = time.thread_time() - cpu if timed else 0.0
        self.report.cycles.append(
            CycleSample(pending, result.decisions, len(result.admitted), seconds, cpu)
        )
        self.report.preemptions += len(result.preempted)
        return result

    def _cycles(self, now_us: int) -> None:
        """At an event time (not ticking): cycles until one admits and preempts nothing."""
        cap = left = self.admissions_per_tick
        for _ in range(self.max_cycles_per_event):
            if not self.state.pending_count:
                return
            result = self._cycle(now_us, left)
            if left is not None:
                left -= len(result.admitted)
                if left == 0:  # the tick's cap is reached: the next tick follows at once
                    left = cap
                    continue
            if not result.admitted and not result.preempted:
                return

    def _tick(self, now_us: int) -> bool:
        """A tick at `now_us` as the dispatcher's `decide` runs its cycles, and the next ones at
        once while the admission cap leaves jobs out; True when the last stopped at the cycles
        cap with jobs still pending (the timer's next tick goes on)."""
        state = self.state
        while True:
            self.report.ticks += 1
            left, cycles, active = self.admissions_per_tick, 0, True
            while active and cycles < self.max_cycles_per_tick and state.pending_count:
                if left == 0:
                    break
                result = self._cycle(now_us, left)
                cycles += 1
                if left is not None:
                    left -= len(result.admitted)
                active = bool(result.admitted or result.preempted)
            if left == 0 and state.pending_count:
                continue  # the admission cap: the next tick follows at once
            if active and cycles == self.max_cycles_per_tick and state.pending_count:
                pending = tuple(sorted(j.spec.job_id for j in state.pending_jobs()))
                self.report.cycle_limited.append((now_us, pending))
                return True
            return False

    def _due(self, now_us: int) -> None:
        """Apply every submit and run end up to `now_us`, each at its own time."""
        while self._queue and self._queue[0][0] <= now_us:
            at, kind, _, job_id, token = heapq.heappop(self._queue)
            self._advance(at)
            if kind == _SUBMIT:
                spec = self._jobs[job_id].spec
                self._wanted[spec.team] = self._wanted.get(spec.team, 0) + spec.gpus
                self.report.submitted_us[job_id] = spec.submit_us
                self._apply((JobSubmitted(spec=spec, time_us=at),))
            elif self._tokens.get(job_id) == token:
                self._end(job_id, at)

    def run(
        self,
        jobs: Iterable[SimJob],
        until_us: int | None = None,
        overdue_interval_us: int = 0,
        stop: Callable[[SchedulerState], bool] | None = None,
    ) -> SimReport:
        """Replay `jobs` until every job ended, `until_us`, or `stop(state)` after an event
        time (a tick, ticking); returns the report."""
        for job in jobs:
            self._jobs[job.spec.job_id] = job
            self._push(job.spec.submit_us, _SUBMIT, job.spec.job_id)
            if self.tick_us is not None:
                seen = job.spec.submit_us if job.seen_us is None else job.seen_us
                heapq.heappush(self._wakes, max(seen, job.spec.submit_us))
        if not self._queue:
            return self.report
        start = self._queue[0][0]
        self.report.start_us = self._last_us = self._next_meter_us = start
        self._next_share_us = start
        if self.tick_us is None:
            self._run_events(until_us, overdue_interval_us, stop)
        else:
            self._run_ticks(self.tick_us, until_us, overdue_interval_us, stop)
        self.report.end_us = self._last_us
        return self.report

    def _run_events(
        self,
        until_us: int | None,
        overdue_interval_us: int,
        stop: Callable[[SchedulerState], bool] | None,
    ) -> None:
        next_overdue = self.report.start_us + overdue_interval_us
        while self._queue:
            now = self._queue[0][0]
            if until_us is not None and now > until_us:
                break
            self._advance(now)
            self._due(now)
            if overdue_interval_us and now >= next_overdue:
                self._stop_overdue(now)
                next_overdue = now + overdue_interval_us
            self._cycles(now)
            if stop is not None and stop(self.state):
                break

    def _run_ticks(
        self,
        tick_us: int,
        until_us: int | None,
        overdue_interval_us: int,
        stop: Callable[[SchedulerState], bool] | None,
    ) -> None:
        """Ticks: at a wake, or at the timer's first tick (on the grid of `tick_us`
        multiples) that has news to see — a submit or run end since, or jobs the cycles cap
        left."""
        last: int | None = None
        owed = False  # the last tick stopped at the cycles cap: the timer's next tick runs
        next_overdue = self.report.start_us + overdue_interval_us
        while True:
            candidates = [self._wakes[0]] if self._wakes else []
            if last is not None and self._queue:
                candidates.append(-(-self._queue[0][0] // tick_us) * tick_us)
            if last is not None and owed:
                candidates.append((last // tick_us + 1) * tick_us)
            if not candidates:
                break
            now = min(candidates)
            if until_us is not None and now > until_us:
                self._due(until_us)  # the window's last submits and ends, undecided
                break
            while self._wakes and self._wakes[0] <= now:
                heapq.heappop(self._wakes)
            self._due(now)
            self._advance(now)
            if overdue_interval_us and now >= next_overdue:
                self._stop_overdue(now)
                next_overdue = now + overdue_interval_us
            limited = self.report.cycle_limited[-1][1] if owed else ()
            owed = self._tick(now)
            for job_id in limited:  # what the cycles cap left waiting: its reason again
                job = self.state.pending_job(job_id)
                if job is not None and job.last_wait is not None:
                    self.report.resumed.append((now, job_id, job.last_wait))
            last = now
            if stop is not None and stop(self.state):
                break

    def _stop_overdue(self, now_us: int) -> None:
        self._apply(overdue(self.state.snapshot(now_us, 1)))
