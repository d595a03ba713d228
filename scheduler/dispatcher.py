"""The scheduler's synchronous heart (`Dispatcher`): decisions as they are made, with no I/O but
the executor's and the work directory's.

It owns the `SchedulerState`, a `JobRecord` and the event history of every job, the holds it
placed until the ledger acknowledges them (`scheduler.hold_acks`), the ledger's budgets, the
metered usage per team and the open idle alerts. Invariants:

- every decision is an event applied to the state as it is made and queued, in order, as an
  `Outgoing` message for the `jobs` topic (`outbox`); the caller publishes the outbox before it
  carries those events out (`scheduler.pipeline`, `scheduler.enactment`), so what runs is
  always on the topic. An event the state
  refuses is logged and dropped, never queued;
- an admission with a hold is followed by its `HoldPlaced` messages (one per unit), and the end
  of a held run (preemption, reclaim, finish, failure) by its `HoldReleased`;
- decision times strictly increase (`now_us`: event ids derive from them), and so do the
  messages' `tally-seq` numbers;
- the state is a projection of the `jobs` topic: `replay` rebuilds it (holds re-derived from
  the job events; an executor that can, its runs: `RebuildsFromTopic`), then `recover` fails
  with `executor_lost` the running jobs the executor does not run and kills what their
  processes left (`scheduler.work_store`).

Inputs from the ledger: `on_balance` takes `balances` messages (`budget:<team>` → budgets;
`consumer:<team>/…` GPU-ms totals → metered usage for fair share; a message no newer, by `seq`,
than the last one of its account is ignored), `on_alert` the alerts topic
(`IdleGpuDetected`/`IdleGpuResolved`: open alerts drive idle reclaim by queue policy,
`scheduler.reclaim`; its own `tally.job.*` alerts rebuild `scheduler.job_alerts`' memory).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, tzinfo
from pathlib import Path

from ledger.alerts import Alert, AlertKind
from ledger.balances import BalanceUpdate, BudgetStatus, account_team
from ledger.errors import EventError
from ledger.fleet_alerts import JobAlert, decode_any_alert
from ledger.holds import HoldEvent, HoldPlaced, HoldReleased
from ledger.job_events import (
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSubmitted,
)
from ledger.shard_balances import ShardBalances
from ledger.units import US_PER_HOUR, Unit
from scheduler.cycle import MAX_CYCLES_PER_TICK, run_cycle
from scheduler.errors import Rejected, RejectKind, StateError
from scheduler.executors.bridge import status_events
from scheduler.executors.errors import ExecutorError
from scheduler.explain import explain
from scheduler.hold_acks import HoldAcknowledgements
from scheduler.idempotency import RequestKeys
from scheduler.job_alerts import JobAlertWatch
from scheduler.jobs_topic import Consumed, Outgoing, hold_message, job_message, replay_order
from scheduler.lifecycle import cancel, fail, overdue, runtime_limit
from scheduler.metering import first_metering
from scheduler.model import NO_HOLD, Balance, PendingJob, Policy, RunningJob
from scheduler.ports import Clock, Executor, JobStatus, RebuildsFromTopic, StopReason, Work
from scheduler.reclaim import IdleAlert, IdleGpu, idle_decisions, reported_idle
from scheduler.records import JobRecord, JobState, PriorityBounds, SubmitRequest, advance
from scheduler.state import SchedulerState
from scheduler.submission import check_names, submitted
from scheduler.work_store import RunFiles, WorkStore

log = logging.getLogger("tally.scheduler")

HOLD_SLACK_US = US_PER_HOUR  # a hold outlives its job's expected end by this much
ADMISSIONS_PER_TICK = 256  # a tick's decide and enactment stay short; the rest wait a tick
DEFAULT_POLICY = Policy()


@dataclass(frozen=True, slots=True)
class TeamBudgetRules:
    """How far below zero admission may take a team's budget."""

    overdraft_micros: int = 0
    overdraft_gpu_ms: int = 0


class Dispatcher:
    """The service's synchronous heart; see the module. Not thread-safe: called from the
    service's event loop only (`stop_all` at shutdown, in a thread, once nothing else runs)."""

    def __init__(
        self,
        state: SchedulerState,
        executor: Executor,
        clock: Clock,
        work_dir: Path,
        *,
        policy: Policy = DEFAULT_POLICY,
        projects: Mapping[str, Sequence[str]] | None = None,
        budget_rules: Mapping[str, TeamBudgetRules] | None = None,
        default_estimate_us: int = US_PER_HOUR,
        run_files: bool = True,
        priority_bounds: Mapping[str, PriorityBounds] | None = None,
        job_alerts: JobAlertWatch | None = None,
        zone: tzinfo = UTC,
        admissions_per_tick: int | None = ADMISSIONS_PER_TICK,
    ) -> None:
        self.state = state
        self.admissions_per_tick = admissions_per_tick  # None: no cap
        self.capped = False  # the last decide left jobs out for its cap: tick again at once
        self.zone = zone  # ledger.timezone: whose months budget periods are
        self.executor = executor
        self.clock = clock
        self.policy = policy
        self.projects = {t: tuple(p) for t, p in (projects or {}).items()}
        self.budget_rules = dict(budget_rules or {})
        self.default_estimate_us = default_estimate_us
        self.priority_bounds = dict(priority_bounds or {})  # queue → bounds; absent: none
        self.keys = RequestKeys()
        self.works = WorkStore(work_dir / "jobs")
        self.runs = RunFiles(work_dir / "runs") if run_files else None
        self.records: dict[str, JobRecord] = {}
        self.history: dict[str, list[JobEvent]] = {}
        self.hold_acks = HoldAcknowledgements()
        self.budgets: dict[str, BudgetStatus] = {}
        self.outbox: list[Outgoing] = []
        self.replay_errors = 0
        self._seq = 0
        self._now = 0
        self._balance_seq: dict[str, int] = {}
        self._shard_balances = ShardBalances()  # a sharded ledger's, summed over its shards
        self._consumer_totals: dict[str, int] = {}
        self._idle: dict[str, tuple[int, str | None]] = {}  # GPU → (idle since, owning job)
        self._alerted: set[tuple[str, int]] = set()
        self._idle_found: list[IdleAlert] = []
        self.job_alerts = job_alerts  # job idle / pending alerts (`scheduler.job_alerts`)
        self._waiting: Counter[str] = Counter()  # queue → its records in state PENDING
        self._fresh_ids: list[str] = []  # random parts of job ids to come

    # ------------------------------------------------------------------ publication

    def now_us(self) -> int:
        """The time of the next decision: the clock, but strictly after the previous decision,
        so two decisions about one job never share a time (event ids derive from it)."""
        self._now = max(self.clock.now_us(), self._now + 1)
        return self._now

    def _next_seq(self) -> int:
        self._seq = max(self._seq + 1, self.clock.now_us() * 1000)
        return self._seq

    def _queue_job_event(self, event: JobEvent) -> None:
        self.outbox.append(job_message(event, self._next_seq()))

    def _queue_hold(self, event: HoldEvent) -> None:
        self.outbox.append(hold_message(event, self._next_seq()))

    @property
    def last_seq(self) -> int:
        """The `tally-seq` of the latest message queued (or replayed)."""
        return self._seq

    def take_outbox(self) -> list[Outgoing]:
        self.works.sync()  # the submitted jobs' work is on disk before their events go out
        out, self.outbox = self.outbox, []
        return out

    def published(self, message: Outgoing, partition: int, offset: int) -> None:
        """The broker acknowledged `message` at (partition, offset)."""
        if isinstance(message.event, HoldPlaced):
            self.hold_acks.published(message.event.job_id, partition, offset)

    # ------------------------------------------------------------------ applying events

    def _release_of(self, event: JobEvent) -> HoldReleased | None:
        """The `HoldReleased` that follows `event` (computed before it is applied)."""
        if not isinstance(event, JobPreempted | JobReclaimed | JobFinished | JobFailed):
            return None
        job = self.state.running_job(event.job_id)
        if job is None or job.hold == NO_HOLD:
            return None
        if isinstance(event, JobFailed):
            reason = f"failed: {event.reason.value}"
        else:
            reason = type(event).__name__.removeprefix("Job").lower()
        return HoldReleased(event.job_id, max(1, event.time_us), reason)

    def _placements(self, event: JobAdmitted) -> list[HoldEvent]:
        job = self.state.running_job(event.job_id)
        if job is None or job.hold == NO_HOLD:
            return []
        queue = self.state.queues.get(job.spec.queue)
        limit = runtime_limit(job, queue)
        span = limit if limit is not None else 2 * job.spec.estimated_runtime_us
        at = max(1, event.time_us)
        expires = at + span + HOLD_SLACK_US
        project = job.spec.project
        out: list[HoldEvent] = []
        if job.hold.gpu_ms > 0:
            out.append(
                HoldPlaced(job.job_id, job.team, project, Unit.GPU_MS, job.hold.gpu_ms, expires, at)
            )
        if job.hold.money_micros > 0:
            out.append(
                HoldPlaced(
                    job.job_id, job.team, project, Unit.MONEY, job.hold.money_micros, expires, at
                )
            )
        return out

    def _track(self, event: JobEvent) -> None:
        """Records, history and hold bookkeeping for an event just applied."""
        if isinstance(event, GpuAssigned | GpuReleased):
            return
        job_id = event.job_id
        if isinstance(event, JobSubmitted) and job_id not in self.records:
            self.records[job_id] = JobRecord(event.spec)
            self._waiting[event.spec.queue] += 1
            self.keys.saw(event)
        elif isinstance(event, JobFailed):
            self.keys.saw(event)
        record = self.records.get(job_id)
        if record is None:
            return
        after = advance(record, event)
        was, now = record.state is JobState.PENDING, after.state is JobState.PENDING
        if was != now:
            self._waiting[record.spec.queue] += 1 if now else -1
        self.records[job_id] = after
        self.history.setdefault(job_id, []).append(event)

    def apply(self, events: Iterable[JobEvent], *, publish: bool = True) -> list[JobEvent]:
        """Apply decisions to the state (and queue them, with their holds, for publication).
        An event the state refuses is logged and dropped; the applied ones are returned."""
        applied: list[JobEvent] = []
        for event in events:
            release = self._release_of(event)
            try:
                self.state.apply(event)
            except StateError as exc:
                log.error("dropped an event the state refuses: %s (%s)", exc, event)
                continue
            applied.append(event)
            self._track(event)
            if publish:
                self._queue_job_event(event)
            if isinstance(event, JobAdmitted):
                placements = self._placements(event)
                job = self.state.running_job(event.job_id)
                if placements and job is not None:
                    self.hold_acks.place(event.job_id, job.team, job.hold, len(placements))
                for hold in placements if publish else ():
                    self._queue_hold(hold)
            if release is not None:
                self.hold_acks.release(release.job_id)
                if publish:
                    self._queue_hold(release)
            if self.runs is not None and isinstance(
                event, JobPreempted | JobReclaimed | JobFinished | JobFailed
            ):
                self.runs.forget(event.job_id)
        return applied

    # ------------------------------------------------------------------ replay and recovery

    def replay(self, messages: Sequence[Consumed]) -> int:
        """Rebuild from the `jobs` topic; returns how many job events were applied. Holds are
        re-derived from the job events; the `HoldPlaced` messages say where each hold lies."""
        where = {m.seq: m for m in messages if m.seq is not None}
        applied = 0
        for seq, event in replay_order(messages):
            self._seq = max(self._seq, seq)
            self._now = max(self._now, event.time_us)
            if isinstance(event, HoldPlaced):
                found = where.get(seq)
                if found is not None:
                    self.hold_acks.published(event.job_id, found.partition, found.offset)
            elif isinstance(event, HoldReleased):
                continue
            elif self.apply((event,), publish=False):
                applied += 1
            else:
                self.replay_errors += 1
        if isinstance(self.executor, RebuildsFromTopic):  # Slurm: which Slurm job is whose
            self.executor.rebuild(event for _, event in replay_order(messages))
        return applied

    def recover(self) -> list[JobEvent]:
        """After a replay: jobs running in the state that the executor does not run fail with
        `executor_lost` (retried per queue); what their processes left is killed."""
        now = self.now_us()
        active = set(self.executor.active())
        events: list[JobEvent] = []
        for job in self.state.running_jobs():
            if job.job_id in active:
                continue
            killed = self.runs.kill_orphan(job.job_id) if self.runs is not None else False
            detail = "the scheduler restarted and no longer runs it"
            if killed:
                detail += "; its leftover processes were killed"
            queue = self.state.queues.get(job.spec.queue)
            events.extend(fail(job, queue, FailReason.EXECUTOR_LOST, now, detail=detail))
        if self.runs is not None:  # what the previous process recorded has served
            self.runs.drop_inherited()
        return self.apply(events)

    # ------------------------------------------------------------------ inputs

    def on_balance(self, update: BalanceUpdate, now_us: int | None = None) -> None:
        """One `balances` message: budgets, and consumer GPU-ms for fair share (a shard's message
        first summed with the other shards', `ledger.shard_balances`)."""
        for merged in self._shard_balances.merge(update):
            self._on_balance(merged, now_us)

    def _on_balance(self, update: BalanceUpdate, now_us: int | None) -> None:
        last = self._balance_seq.get(update.account)
        if last is not None and update.seq <= last:
            return
        self._balance_seq[update.account] = update.seq
        kind = update.account.partition(":")[0]
        team = account_team(update.account)
        if team is None:
            return
        if kind == "budget":
            if update.budget is not None:
                self.budgets[team] = update.budget
            return
        if kind != "consumer":
            return
        total = dict(update.totals).get(Unit.GPU_MS.value, 0)
        at = update.as_of_us if now_us is None else now_us
        previous = self._consumer_totals.get(update.account)
        self._consumer_totals[update.account] = total
        if previous is not None:
            if total > previous:
                self.state.meter(team, total - previous, at)
            return
        for when, gpu_ms in first_metering(update, total, at, self.zone):
            self.state.meter(team, gpu_ms, when)

    def on_alert(self, value: bytes | None) -> None:
        """One alerts-topic message: open or close an allocated-but-idle alert. Anything that is
        not an idle-GPU alert (GPU health events share the topic; malformed messages) is
        ignored."""
        if not value:
            return
        try:
            alert = decode_any_alert(value)
        except EventError:
            return
        if isinstance(alert, JobAlert):
            if self.job_alerts is not None:
                self.job_alerts.observe(alert)
            return
        if not isinstance(alert, Alert):
            return
        if alert.kind is AlertKind.RESOLVED:
            self._idle.pop(alert.subject, None)  # a GPU's UUID, a MIG instance's or share's name
        elif alert.kind is AlertKind.DETECTED:
            self._idle[alert.subject] = (alert.since_us, alert.job)

    def balance_of(self, team: str) -> Balance | None:
        """What the core is given for `team`: the ledger's remaining plus the open holds it
        already counts (every hold counted once: see `scheduler.hold_acks`)."""
        status = self.budgets.get(team)
        if status is None:
            return None
        counted = self.hold_acks.acknowledged(team)
        rules = self.budget_rules.get(team, TeamBudgetRules())
        money = status.line(Unit.MONEY.value)
        gpu = status.line(Unit.GPU_MS.value)
        return Balance(
            team,
            money_micros=None if money is None else money.remaining + counted.money_micros,
            gpu_ms=None if gpu is None else gpu.remaining + counted.gpu_ms,
            overdraft_micros=rules.overdraft_micros,
            overdraft_gpu_ms=rules.overdraft_gpu_ms,
        )

    def _refresh_balances(self) -> None:
        for team in self.budgets:
            balance = self.balance_of(team)
            if balance is not None:
                self.state.set_balance(balance)

    # ------------------------------------------------------------------ requests

    def submit(self, request: SubmitRequest) -> JobRecord:
        """Validate names (and a team's priority) against the configuration, store the work,
        apply `JobSubmitted` (with the request's idempotency key, if any: `self.keys`)."""
        check_names(request, self.state, self.projects, self.priority_bounds)
        job_id = self._new_job_id()
        event = submitted(request, self.state, job_id, self.now_us(), self.default_estimate_us)
        self.works.put(job_id, request.work)
        self.apply((event,))
        return self.records[job_id]

    def _new_job_id(self) -> str:
        """`job-` and 12 random hex digits, drawn from the OS 512 ids at a time (one
        `getrandom` per submit was a visible cost at 1,000 submits/s)."""
        while True:
            if not self._fresh_ids:
                drawn = secrets.token_hex(6 * 512)
                self._fresh_ids = [drawn[i : i + 12] for i in range(0, len(drawn), 12)]
            job_id = f"job-{self._fresh_ids.pop()}"
            if job_id not in self.records:
                return job_id

    def cancel(
        self,
        job_id: str,
        detail: str = "",
        key: tuple[str, str] | None = None,
        by: tuple[str, str] | None = None,
    ) -> tuple[JobRecord, list[JobEvent]]:
        """Cancel a pending or running job; `key` (scope, idempotency key) and `by` (who and
        from where, for the audit trail) go in its event."""
        record = self.records.get(job_id)
        if record is None:
            raise Rejected(RejectKind.NOT_FOUND, f"no job {job_id}")
        now = self.now_us()
        running = self.state.running_job(job_id)
        pending = self.state.pending_job(job_id)
        target: RunningJob | PendingJob | None = running if running is not None else pending
        if target is None:
            raise Rejected(RejectKind.CONFLICT, f"job {job_id} has already ended ({record.state})")
        decided = cancel(target, now, detail=detail or "cancelled through the API")
        if key is not None or by is not None:
            decided = tuple(
                replace(
                    e,
                    requested_by=key[0] if key else by[0] if by else None,
                    idempotency_key=key[1] if key else None,
                    client=by[1] if by else None,
                )
                if isinstance(e, JobFailed)
                else e
                for e in decided
            )
        events = self.apply(decided)
        return self.records[job_id], events

    # ------------------------------------------------------------------ the tick

    def decide(self, news: Sequence[JobStatus] | None = None) -> list[JobEvent]:
        """One round: the executor's news (`news`, else it is polled here), runtime limits,
        idle reclaim, then cycles until one admits and preempts nothing or
        `admissions_per_tick` jobs are admitted (the jobs the cap leaves out wait with
        `tick_limit`). Returns the applied events (their messages are queued)."""
        events = self.observe(self._poll() if news is None else news)
        events.extend(self.apply(overdue(self.state.snapshot(self.now_us(), 1))))
        events.extend(self._reclaim(self.now_us()))
        self._refresh_balances()
        left = self.admissions_per_tick
        for _ in range(MAX_CYCLES_PER_TICK):
            if not self.state.pending_count or left == 0:
                break
            snap = self.state.snapshot(self.now_us(), self.policy.heads_per_queue)
            result = run_cycle(snap, self.policy, left)
            events.extend(self.apply(result.events))
            if left is not None:
                left -= len(result.admitted)
            if not result.admitted and not result.preempted:
                break
            self._refresh_balances()
        self.capped = left == 0 and self.state.pending_count > 0
        if self.job_alerts is not None:  # queued in its outbox for the alerts topic
            self.job_alerts.after_tick(self.now_us(), self._idle_found, self.state)
        return events

    def _poll(self) -> Sequence[JobStatus]:
        try:
            return self.executor.poll()
        except ExecutorError as exc:
            log.error("the executor could not be polled: %s", exc)
            return ()

    def observe(self, statuses: Iterable[JobStatus]) -> list[JobEvent]:
        """Apply the executor's statuses as events, each against the state as the previous
        ones left it (so RUNNING then FINISHED of one short run become JobStarted,
        JobFinished); the applied events (queued)."""
        events: list[JobEvent] = []
        for status in statuses:
            self._remember_run(status)
            job = self.state.running_job(status.job_id)
            queue = None if job is None else self.state.queues.get(job.spec.queue)
            events.extend(self.apply(status_events(status, job, queue)))
        return events

    def _remember_run(self, status: JobStatus) -> None:
        if self.runs is not None and status.native_id and not status.state.ended:
            self.runs.record(status.job_id, status.native_id)

    def _reclaim(self, now: int) -> list[JobEvent]:
        self._idle_found = []
        if not self._idle:
            return []
        idle = []
        for gpu, (since, job) in self._idle.items():
            if reported_idle(job, self.state.holder(gpu)):
                idle.append(IdleGpu(gpu, since))
        decisions = idle_decisions(idle, self.state.snapshot(now, 1))
        events: list[JobEvent] = []
        for decision in decisions:
            if isinstance(decision, IdleAlert):
                self._idle_found.append(decision)
                key = (decision.job_id, decision.idle_since_us)
                if key not in self._alerted:
                    self._alerted.add(key)
                    log.warning(
                        "job %s (team %s, queue %s): %d of %d GPU(s) allocated but idle since %d",
                        decision.job_id,
                        decision.team,
                        decision.queue,
                        len(decision.idle_gpus),
                        decision.gpus,
                        decision.idle_since_us,
                    )
            else:
                events.append(decision)
        return self.apply(events)

    def work_for(self, job_id: str) -> Work | None:
        return self.works.get(job_id)

    def stop_all(self, detail: str) -> list[JobEvent]:
        """Stop every job the executor runs (a clean shutdown): they fail with
        `executor_lost`, retried per queue when the service runs again."""
        active = self.executor.active()
        if not active:
            return []
        with contextlib.suppress(ExecutorError):
            self.executor.stop(active, StopReason.CANCELLED)
        now = self.now_us()
        events: list[JobEvent] = []
        for job_id in active:
            job = self.state.running_job(job_id)
            if job is not None:
                queue = self.state.queues.get(job.spec.queue)
                events.extend(fail(job, queue, FailReason.EXECUTOR_LOST, now, detail=detail))
        return self.apply(events)

    # ------------------------------------------------------------------ views

    def visible(self, job_id: str, team: str | None) -> JobRecord | None:
        """The job, if the caller (a team, or None for the admin) may see it."""
        record = self.records.get(job_id)
        if record is None or (team is not None and record.team != team):
            return None
        return record

    def jobs(self, team: str | None) -> list[JobRecord]:
        return [r for r in self.records.values() if team is None or r.team == team]

    def queue_lengths(self) -> dict[str, int]:
        """Pending jobs per queue: every configured queue (0 when empty), and any other queue
        a replayed job still waits in."""
        lengths = dict.fromkeys(self.state.queues, 0)
        lengths.update(self._waiting)  # a queue once seen stays reported, at 0 when drained
        return lengths

    def queue_of(self, job_id: str) -> str | None:
        record = self.records.get(job_id)
        return None if record is None else record.spec.queue

    def explain(self, job_id: str) -> str:
        return explain(job_id, self.history.get(job_id, ()))
