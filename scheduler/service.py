"""The scheduler as a running service: the pure core (`scheduler.cycle`, `scheduler.state`)
between Kafka, an executor and the HTTP API (`scheduler.api`).

It owns three layers, each testable without the next:

- `Dispatcher` (synchronous, no I/O but the executor's): the `SchedulerState`, a `JobRecord`
  and the event history of every job, the holds it placed, the ledger's budgets and open idle
  alerts. Every decision is an event applied to the state as it is made and queued, in order,
  as an `Outgoing` message for the `jobs` topic;
- `SchedulerService` (asyncio): one lock around decide → publish → enact. A decision reaches
  the executor only after the broker acknowledged its events, so what runs is always on the
  topic; submit and cancel answer once their events are published;
- `run_service`: the Kafka adapters (aiokafka) and the API server around it.

Monitoring goes through the `SchedulerObserver` port (`scheduler.ports`): admissions and
preemptions per queue as decided, and pending jobs per queue.

Consumes
    jobs      (at start) the whole topic, to rebuild the state: the service is a projection of
              it. Messages are applied in publication order (the `tally-seq` header), since job
              and GPU events are keyed differently and land in different partitions.
    balances  compacted, read from the start: `budget:<team>` → the team's budget, and
              `consumer:<team>/…` GPU-ms totals → metered usage for fair share.
    alerts    `IdleGpuDetected`/`IdleGpuResolved`, read from the start: the open alerts drive
              idle reclaim by queue policy (`scheduler.reclaim`).
Produces, on `jobs`
    JobSubmitted, JobAdmitted, JobWaiting{reason}, JobStarted, JobPreempted{by, reason},
    JobReclaimed, JobFinished, JobFailed — keyed by job id; GpuAssigned/GpuReleased keyed by GPU
    UUID; HoldPlaced after an admission with a hold, HoldReleased after the end of a held run —
    keyed by job id (`ledger.holds`).

Holds are counted once (invariant). A hold is the scheduler's from placement until the ledger
has folded it *and* the scheduler has read a balance that includes it; from then on it is the
ledger's (its `remaining` subtracts what is left of it after metered usage settled part of
it). The core subtracts every open hold of the state from the balance it is given, so the
balance handed to the core is the ledger's `remaining` plus the holds the ledger already
counts: `remaining + Σ acknowledged open holds`. A hold is acknowledged when the ledger's
consumer group has committed an offset past its `HoldPlaced` (the worker commits offsets only
after the DuckDB commit and after publishing the balances that commit changed) and this
service's balances consumer has reached the end offsets the `balances` topic had at that
moment. A hold the scheduler released that the ledger has not yet released is counted by the
ledger alone. In the acknowledgement window (between the ledger's commit and this service
noticing it, about the worker's offset-commit interval) a hold is counted by both: the error is
on the safe side and lasts seconds.

Restart: the state is rebuilt from the `jobs` topic; the commands of jobs (`Work`) are not
events (they are not the ledger's business and may carry secrets in their environment) and are
kept in `work_dir/jobs/`. Jobs the topic says are running but the executor does not know (a
local executor's processes do not outlive the service's knowledge of them) fail with
`executor_lost`, retried per their queue; a process group such a job left behind is killed
(found through `work_dir/runs/<job>.pid` and checked against its `TALLY_JOB_ID`). On a clean
stop the service stops the local jobs it runs the same way.

Errors: `ServiceError` ← `BrokerUnavailable` (aiokafka's errors, translated in `_kafka`), and
`Rejected` for requests the scheduler refuses (its `kind` says why; the API maps it to a status).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import orjson

from ledger.balances import BalanceUpdate, BudgetStatus, account_team, decode_balance_update
from ledger.errors import EventError
from ledger.holds import (
    HoldEvent,
    HoldKind,
    HoldPlaced,
    HoldReleased,
    encode_hold,
    hold_envelope,
    hold_envelope_from_dict,
)
from ledger.idle import AlertKind
from ledger.job_events import (
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobEventType,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    encode_job_event,
    job_envelope_from_dict,
    subject_of,
)
from ledger.periods import Period
from ledger.units import US_PER_SECOND, Unit
from scheduler.cycle import run_cycle
from scheduler.errors import SchedulerError, StateError
from scheduler.executors.bridge import admitted, status_events, stop_orders
from scheduler.executors.errors import ExecutorError, JobAlreadyStarted, StopTimeout
from scheduler.explain import explain
from scheduler.lifecycle import cancel, fail, overdue, runtime_limit
from scheduler.model import NO_HOLD, Balance, Holds, PendingJob, Policy, RunningJob
from scheduler.ports import Clock, Executor, JobStatus, SchedulerObserver, StopReason, Work
from scheduler.reclaim import IdleAlert, IdleGpu, idle_decisions
from scheduler.state import SchedulerState

log = logging.getLogger("tally.scheduler")

SOURCE = "tally://scheduler"
SEQ_HEADER = "tally-seq"
US_PER_HOUR = 3_600 * US_PER_SECOND
HOLD_SLACK_US = US_PER_HOUR  # a hold outlives its job's expected end by this much
MAX_CYCLES_PER_TICK = 64
DEFAULT_POLICY = Policy()

T = TypeVar("T")


# ---------------------------------------------------------------------------- errors


class ServiceError(SchedulerError):
    """The service could not do its work (see the module's error tree)."""


class BrokerUnavailable(ServiceError):
    """Kafka could not be reached or refused a request."""


class RejectKind(StrEnum):
    INVALID = "invalid"  # the request is malformed
    UNKNOWN = "unknown"  # it names a queue, team, project, model or pool that is not configured
    NOT_FOUND = "not_found"  # no such job (or not one the caller may see)
    CONFLICT = "conflict"  # the job is in a state that does not allow it


class Rejected(SchedulerError):
    """A request the scheduler refuses; `kind` says why."""

    def __init__(self, kind: RejectKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class TeamBudgetRules:
    """How far below zero admission may take a team's budget."""

    overdraft_micros: int = 0
    overdraft_gpu_ms: int = 0


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    bootstrap: tuple[str, ...]
    jobs_topic: str
    balances_topic: str
    alerts_topic: str
    ledger_group: str  # the ledger worker's consumer group (hold acknowledgements)
    work_dir: Path
    client_id: str = "tally"
    cycle_interval_s: float = 2.0
    policy: Policy = DEFAULT_POLICY
    half_life_us: int = 7 * 24 * US_PER_HOUR
    default_estimate_us: int = US_PER_HOUR
    api_host: str = "127.0.0.1"
    api_port: int = 8600
    max_body_bytes: int = 64 * 1024
    stop_jobs_on_exit: bool = True
    publish_timeout_s: float = 30.0


# ---------------------------------------------------------------------------- job records


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"

    @property
    def ended(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the API shows of a job: a fold of its events (`advance`)."""

    spec: JobSpec
    state: JobState = JobState.PENDING
    attempt: int = 1
    reason: str = ""  # the last wait, preemption or failure reason
    detail: str = ""
    admitted_us: int | None = None
    started_us: int | None = None
    ended_us: int | None = None
    pool: str | None = None
    model: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    preemptions: int = 0
    hold_gpu_ms: int = 0
    hold_micros: int = 0
    over_budget: bool = False

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def team(self) -> str:
        return self.spec.team


def advance(record: JobRecord, event: JobEvent) -> JobRecord:
    """The record after one of its job's events (GPU events do not change it)."""
    if isinstance(event, JobWaiting):
        return replace(record, reason=event.reason.value, detail=event.detail)
    if isinstance(event, JobAdmitted):
        return replace(
            record,
            state=JobState.RUNNING,
            attempt=event.attempt,
            reason="",
            detail="",
            admitted_us=event.time_us,
            started_us=None,
            pool=event.pool,
            model=event.model,
            gpu_uuids=event.gpu_uuids,
            nodes=event.nodes,
            hold_gpu_ms=event.hold_gpu_ms,
            hold_micros=event.hold_micros,
            over_budget=event.over_budget,
        )
    if isinstance(event, JobStarted):
        return replace(record, started_us=event.time_us)
    if isinstance(event, JobPreempted):
        return replace(
            record,
            state=JobState.PENDING,
            reason=f"preempted: {event.reason.value}",
            detail=event.detail,
            gpu_uuids=(),
            nodes=(),
            preemptions=record.preemptions + 1,
        )
    if isinstance(event, JobReclaimed):
        return replace(
            record,
            state=JobState.RECLAIMED,
            reason="reclaimed",
            detail=event.detail,
            ended_us=event.time_us,
        )
    if isinstance(event, JobFinished):
        return replace(record, state=JobState.FINISHED, ended_us=event.time_us, exit_code=0)
    if isinstance(event, JobFailed):
        if event.retry:
            state = JobState.PENDING
        elif event.reason is FailReason.CANCELLED:
            state = JobState.CANCELLED
        else:
            state = JobState.FAILED
        return replace(
            record,
            state=state,
            reason=event.reason.value,
            detail=event.detail,
            exit_code=event.exit_code,
            ended_us=None if event.retry else event.time_us,
            attempt=event.attempt + 1 if event.retry else event.attempt,
            gpu_uuids=() if event.retry else record.gpu_uuids,
        )
    return record


# ---------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One `jobs` message: key, value, publication order, and what it carries."""

    key: bytes
    value: bytes
    seq: int
    event: JobEvent | HoldEvent

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return [(SEQ_HEADER, str(self.seq).encode())]


@dataclass(frozen=True, slots=True)
class Consumed:
    """One `jobs` message read back (replay), with where it was."""

    partition: int
    offset: int
    value: bytes | None
    seq: int | None


def seq_of(headers: Iterable[tuple[str, bytes]] | None) -> int | None:
    for name, value in headers or ():
        if name == SEQ_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def decode_jobs_value(value: bytes | None) -> JobEvent | HoldEvent | None:
    """A `jobs` message as a job or hold event; None for anything else (never raises)."""
    if not value:
        return None
    try:
        obj = orjson.loads(value)
        kind = obj.get("type") if type(obj) is dict else None
        if kind in (HoldKind.PLACED, HoldKind.RELEASED):
            return hold_envelope_from_dict(obj).data
        if isinstance(kind, str) and kind in JobEventType._value2member_map_:
            return job_envelope_from_dict(obj).data
    except (orjson.JSONDecodeError, EventError, ValueError, TypeError):
        return None
    return None


def replay_order(messages: Iterable[Consumed]) -> list[tuple[int, JobEvent | HoldEvent]]:
    """Decoded events in publication order: by `tally-seq`, else by event time (× 1000, the
    same axis: a seq is at least the publication time in µs × 1000). A message sent twice (the
    same seq) counts once."""
    keyed: list[tuple[int, int, int, JobEvent | HoldEvent]] = []
    seen: set[int] = set()
    for m in messages:
        event = decode_jobs_value(m.value)
        if event is None or m.seq in seen:
            continue
        if m.seq is not None:
            seen.add(m.seq)
        order = m.seq if m.seq is not None else event.time_us * 1000
        keyed.append((order, m.partition, m.offset, event))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [(k[0], k[3]) for k in keyed]


# ---------------------------------------------------------------------------- holds


@dataclass(slots=True)
class HoldTrack:
    """One job's open hold as the scheduler placed it, and whether the ledger counts it yet."""

    team: str
    holds: Holds
    placed_at: dict[int, int] = field(default_factory=dict)  # jobs partition → offset
    messages: int = 0  # HoldPlaced messages of this hold (one per unit)
    barrier: dict[int, int] | None = None  # balances end offsets when the ledger committed it
    acknowledged: bool = False


class HoldBook:
    """Open holds per job and their acknowledgement by the ledger (see the module)."""

    def __init__(self) -> None:
        self._open: dict[str, HoldTrack] = {}

    def place(self, job_id: str, team: str, holds: Holds, messages: int) -> None:
        self._open[job_id] = HoldTrack(team, holds, messages=messages)

    def release(self, job_id: str) -> None:
        self._open.pop(job_id, None)

    def published(self, job_id: str, partition: int, offset: int) -> None:
        track = self._open.get(job_id)
        if track is not None:
            previous = track.placed_at.get(partition, -1)
            track.placed_at[partition] = max(previous, offset)

    def awaiting_commit(self) -> list[tuple[str, HoldTrack]]:
        """Holds fully published whose commit by the ledger is not seen yet."""
        return [
            (job, t)
            for job, t in self._open.items()
            if t.barrier is None and not t.acknowledged and t.placed_at
        ]

    def committed(self, committed: Mapping[int, int], barrier: Mapping[int, int]) -> int:
        """Holds whose messages all lie below the ledger's committed offsets get `barrier`."""
        count = 0
        for _, track in self.awaiting_commit():
            if all(committed.get(p, -1) > o for p, o in track.placed_at.items()):
                track.barrier = dict(barrier)
                count += 1
        return count

    def caught_up(self, positions: Mapping[int, int]) -> int:
        """Holds whose barrier the balances consumer has reached are acknowledged."""
        count = 0
        for track in self._open.values():
            if (
                track.barrier is not None
                and not track.acknowledged
                and all(positions.get(p, 0) >= o for p, o in track.barrier.items())
            ):
                track.acknowledged = True
                count += 1
        return count

    def acknowledged(self, team: str) -> Holds:
        total = NO_HOLD
        for track in self._open.values():
            if track.team == team and track.acknowledged:
                total = total + track.holds
        return total

    def unacknowledged(self, team: str) -> Holds:
        total = NO_HOLD
        for track in self._open.values():
            if track.team == team and not track.acknowledged:
                total = total + track.holds
        return total

    def track(self, job_id: str) -> HoldTrack | None:
        return self._open.get(job_id)


# ---------------------------------------------------------------------------- work store


class WorkStore:
    """Each job's `Work`, one JSON file per job under `dir`, written before it is submitted."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, Work] = {}

    def _path(self, job_id: str) -> Path:
        return self.dir / (quote(job_id, safe="") + ".json")

    def put(self, job_id: str, work: Work) -> None:
        data = {
            "command": list(work.command),
            "script": work.script,
            "env": [list(pair) for pair in work.env],
            "cwd": work.cwd,
        }
        path = self._path(job_id)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(orjson.dumps(data))
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
        self._cache[job_id] = work

    def get(self, job_id: str) -> Work | None:
        found = self._cache.get(job_id)
        if found is not None:
            return found
        try:
            data = orjson.loads(self._path(job_id).read_bytes())
            work = Work(
                command=tuple(data["command"]),
                script=data["script"],
                env=tuple((str(k), str(v)) for k, v in data["env"]),
                cwd=data["cwd"],
            )
        except (OSError, ValueError, KeyError, TypeError, SchedulerError):
            return None
        self._cache[job_id] = work
        return work


# ---------------------------------------------------------------------------- orphans


class RunFiles:
    """Process groups of local runs (`runs/<job>.pid`), so a restarted service can kill what a
    run it lost left behind — only a group whose leader still carries the job's TALLY_JOB_ID."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, job_id: str) -> Path:
        return self.dir / (quote(job_id, safe="") + ".pid")

    def record(self, job_id: str, native_id: str) -> None:
        if native_id.isdigit():
            self._path(job_id).write_text(native_id)

    def forget(self, job_id: str) -> None:
        with contextlib.suppress(OSError):
            self._path(job_id).unlink()

    def kill_orphan(self, job_id: str) -> bool:
        """SIGKILL the group the job's last run left, if it is still that job's; True if so."""
        path = self._path(job_id)
        try:
            pgid = int(path.read_text())
        except (OSError, ValueError):
            return False
        killed = False
        try:
            environ = Path(f"/proc/{pgid}/environ").read_bytes().split(b"\0")
            if f"TALLY_JOB_ID={job_id}".encode() in environ:
                os.killpg(pgid, signal.SIGKILL)
                killed = True
        except (OSError, ProcessLookupError):
            pass
        self.forget(job_id)
        return killed


# ---------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """A validated submission (shape and ranges checked by the API; names checked here)."""

    team: str
    project: str
    user: str
    queue: str
    gpus: int
    work: Work
    estimated_runtime_us: int | None = None
    max_runtime_us: int | None = None
    model: str | None = None
    pool: str | None = None
    span_nodes: bool = True
    priority: int | None = None


# ---------------------------------------------------------------------------- the dispatcher


class Dispatcher:
    """The service's synchronous heart; see the module. Not thread-safe: one caller at a time
    (the service's lock), except `enact`, which reads the state and calls the executor."""

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
    ) -> None:
        self.state = state
        self.executor = executor
        self.clock = clock
        self.policy = policy
        self.projects = {t: tuple(p) for t, p in (projects or {}).items()}
        self.budget_rules = dict(budget_rules or {})
        self.default_estimate_us = default_estimate_us
        self.works = WorkStore(work_dir / "jobs")
        self.runs = RunFiles(work_dir / "runs") if run_files else None
        self.records: dict[str, JobRecord] = {}
        self.history: dict[str, list[JobEvent]] = {}
        self.holds = HoldBook()
        self.budgets: dict[str, BudgetStatus] = {}
        self.outbox: list[Outgoing] = []
        self.replay_errors = 0
        self._seq = 0
        self._now = 0
        self._balance_seq: dict[str, int] = {}
        self._consumer_totals: dict[str, int] = {}
        self._idle: dict[str, tuple[int, str | None]] = {}  # GPU → (idle since, owning job)
        self._alerted: set[tuple[str, int]] = set()
        self._waiting: Counter[str] = Counter()  # queue → its records in state PENDING

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
        self.outbox.append(
            Outgoing(
                subject_of(event).encode(),
                encode_job_event(event, SOURCE),
                self._next_seq(),
                event,
            )
        )

    def _queue_hold(self, event: HoldEvent) -> None:
        key, value = encode_hold(hold_envelope(event, SOURCE))
        self.outbox.append(Outgoing(key, value, self._next_seq(), event))

    def take_outbox(self) -> list[Outgoing]:
        out, self.outbox = self.outbox, []
        return out

    def published(self, message: Outgoing, partition: int, offset: int) -> None:
        """The broker acknowledged `message` at (partition, offset)."""
        if isinstance(message.event, HoldPlaced):
            self.holds.published(message.event.job_id, partition, offset)

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
                    self.holds.place(event.job_id, job.team, job.hold, len(placements))
                for hold in placements if publish else ():
                    self._queue_hold(hold)
            if release is not None:
                self.holds.release(release.job_id)
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
                    self.holds.published(event.job_id, found.partition, found.offset)
            elif isinstance(event, HoldReleased):
                continue
            elif self.apply((event,), publish=False):
                applied += 1
            else:
                self.replay_errors += 1
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
        return self.apply(events)

    # ------------------------------------------------------------------ inputs

    def on_balance(self, update: BalanceUpdate, now_us: int | None = None) -> None:
        """One `balances` message: budgets, and consumer GPU-ms for fair share."""
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
        # first sight: usage in open periods at their ends, the rest before the first of them
        rows = sorted(
            (r for r in update.periods if r.unit == Unit.GPU_MS.value), key=lambda r: r.period
        )
        in_rows = 0
        metered: list[tuple[int, int]] = []
        for row in rows:
            try:
                end = Period.month(row.period).end_us
            except ValueError:
                continue
            if row.balance > 0:
                metered.append((min(end, at), row.balance))
                in_rows += row.balance
        earlier = total - in_rows
        if earlier > 0:
            first = metered[0][0] if metered else at
            metered.insert(0, (first - 31 * 24 * US_PER_HOUR, earlier))
        for when, gpu_ms in sorted(metered):
            self.state.meter(team, gpu_ms, max(0, when))

    def on_alert(self, value: bytes | None) -> None:
        """One alerts-topic message: open or close an allocated-but-idle alert."""
        if not value:
            return
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError:
            return
        if type(obj) is not dict or type(obj.get("data")) is not dict:
            return
        kind, data = obj.get("type"), obj["data"]
        gpu = data.get("gpu_uuid")
        if type(gpu) is not str:
            return
        if kind == AlertKind.RESOLVED:
            self._idle.pop(gpu, None)
        elif kind == AlertKind.DETECTED and type(data.get("since_us")) is int:
            owner = data.get("owner")
            job = owner.get("job") if type(owner) is dict else None
            self._idle[gpu] = (data["since_us"], job if type(job) is str else None)

    def balance_of(self, team: str) -> Balance | None:
        """What the core is given for `team`: the ledger's remaining plus the open holds it
        already counts (see the module: every hold counted once)."""
        status = self.budgets.get(team)
        if status is None:
            return None
        counted = self.holds.acknowledged(team)
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
        """Validate names against the configuration, store the work, apply `JobSubmitted`."""
        state = self.state
        if request.team not in state.quotas.teams:
            raise Rejected(RejectKind.UNKNOWN, f"unknown team {request.team!r}")
        if request.queue not in state.queues:
            known = ", ".join(sorted(state.queues)) or "none configured"
            raise Rejected(RejectKind.UNKNOWN, f"unknown queue {request.queue!r} ({known})")
        projects = self.projects.get(request.team)
        if projects is not None and request.project not in projects:
            raise Rejected(
                RejectKind.UNKNOWN,
                f"team {request.team} has no project {request.project!r} ({', '.join(projects)})",
            )
        models = {f.model for f in state.fleet.flavors}
        pools = {f.pool for f in state.fleet.flavors}
        if request.model is not None and request.model not in models:
            raise Rejected(RejectKind.UNKNOWN, f"no GPUs of model {request.model!r} in the fleet")
        if request.pool is not None and request.pool not in pools:
            raise Rejected(RejectKind.UNKNOWN, f"no pool {request.pool!r} in the fleet")
        now = self.now_us()
        estimate = request.estimated_runtime_us
        if estimate is None:
            queue = state.queues[request.queue]
            limits = [v for v in (request.max_runtime_us, queue.max_runtime_us) if v is not None]
            estimate = min([self.default_estimate_us, *limits])
        job_id = self._new_job_id()
        try:
            spec = JobSpec(
                job_id=job_id,
                team=request.team,
                project=request.project,
                user=request.user,
                queue=request.queue,
                gpus=request.gpus,
                submit_us=now,
                estimated_runtime_us=estimate,
                max_runtime_us=request.max_runtime_us,
                model=request.model,
                pool=request.pool,
                span_nodes=request.span_nodes,
                priority=request.priority,
            )
        except EventError as exc:
            raise Rejected(RejectKind.INVALID, str(exc)) from None
        self.works.put(job_id, request.work)
        self.apply((JobSubmitted(spec=spec, time_us=now),))
        return self.records[job_id]

    def _new_job_id(self) -> str:
        while True:
            job_id = f"job-{secrets.token_hex(6)}"
            if job_id not in self.records:
                return job_id

    def cancel(self, job_id: str, detail: str = "") -> tuple[JobRecord, list[JobEvent]]:
        record = self.records.get(job_id)
        if record is None:
            raise Rejected(RejectKind.NOT_FOUND, f"no job {job_id}")
        now = self.now_us()
        running = self.state.running_job(job_id)
        pending = self.state.pending_job(job_id)
        target: RunningJob | PendingJob | None = running if running is not None else pending
        if target is None:
            raise Rejected(RejectKind.CONFLICT, f"job {job_id} has already ended ({record.state})")
        events = self.apply(cancel(target, now, detail=detail or "cancelled through the API"))
        return self.records[job_id], events

    # ------------------------------------------------------------------ the tick

    def decide(self) -> list[JobEvent]:
        """One round: the executor's news, runtime limits, idle reclaim, then cycles until one
        admits and preempts nothing. Returns the applied events (their messages are queued)."""
        events: list[JobEvent] = []
        for observed in self._observe():
            events.extend(self.apply(observed))
        events.extend(self.apply(overdue(self.state.snapshot(self.now_us(), 1))))
        events.extend(self._reclaim(self.now_us()))
        self._refresh_balances()
        for _ in range(MAX_CYCLES_PER_TICK):
            if not self.state.pending_count:
                break
            snap = self.state.snapshot(self.now_us(), self.policy.heads_per_queue)
            result = run_cycle(snap, self.policy)
            events.extend(self.apply(result.events))
            if not result.admitted and not result.preempted:
                break
            self._refresh_balances()
        return events

    def _observe(self) -> Iterator[tuple[JobEvent, ...]]:
        """The executor's statuses as events, each against the state as the previous ones
        left it (so RUNNING then FINISHED of one short run become JobStarted, JobFinished)."""
        try:
            statuses = self.executor.poll()
        except ExecutorError as exc:
            log.error("the executor could not be polled: %s", exc)
            return
        for status in statuses:
            self._remember_run(status)
            job = self.state.running_job(status.job_id)
            queue = None if job is None else self.state.queues.get(job.spec.queue)
            yield status_events(status, job, queue)

    def _remember_run(self, status: JobStatus) -> None:
        if self.runs is not None and status.native_id and not status.state.ended:
            self.runs.record(status.job_id, status.native_id)

    def _reclaim(self, now: int) -> list[JobEvent]:
        if not self._idle:
            return []
        idle = []
        for gpu, (since, job) in self._idle.items():
            holder = self.state.holder(gpu)
            if holder is not None and (job is None or job == holder):
                idle.append(IdleGpu(gpu, since))
        decisions = idle_decisions(idle, self.state.snapshot(now, 1))
        events: list[JobEvent] = []
        for decision in decisions:
            if isinstance(decision, IdleAlert):
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

    def enact(self, events: Sequence[JobEvent]) -> list[JobEvent]:
        """Carry out published decisions: every stop, then every start (see
        `scheduler.executors.bridge`). Returns events for starts that could not happen; they
        are to be applied by the caller. Reads the state; never changes it."""
        follow_up: list[JobEvent] = []
        for reason, job_ids in stop_orders(events):
            try:
                self.executor.stop(job_ids, reason)
            except StopTimeout as exc:
                log.error("%s: their GPUs may still be busy", exc)
            except ExecutorError as exc:
                log.error("could not stop %s: %s", ", ".join(job_ids), exc)
        for job_id in admitted(events):
            job = self.state.running_job(job_id)
            if job is None:
                continue
            work = self.works.get(job_id)
            now = self.now_us()
            if work is None:
                follow_up.append(
                    JobFailed(
                        job_id=job_id,
                        reason=FailReason.EXECUTOR_LOST,
                        attempt=job.attempt,
                        retry=False,
                        time_us=now,
                        detail="its command is not in the scheduler's work store",
                    )
                )
                continue
            queue = self.state.queues.get(job.spec.queue)
            try:
                self.executor.start(job, work, time_limit_us=runtime_limit(job, queue))
            except JobAlreadyStarted:
                continue
            except ExecutorError as exc:
                follow_up.extend(
                    fail(job, queue, FailReason.EXECUTOR_LOST, now, detail=f"cannot start: {exc}")
                )
        return _with_releases(follow_up, self.state)

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


def _with_releases(events: list[JobEvent], state: SchedulerState) -> list[JobEvent]:
    """A hand-made `JobFailed` of a running job, followed by its GPU releases."""
    from scheduler.decisions import release_events

    out: list[JobEvent] = []
    for event in events:
        out.append(event)
        if isinstance(event, JobFailed) and not any(
            isinstance(e, GpuReleased) and e.job_id == event.job_id for e in events
        ):
            job = state.running_job(event.job_id)
            if job is not None:
                out.extend(release_events(job, event.time_us))
    return out


# ---------------------------------------------------------------------------- the service


class Publisher(Protocol):
    async def publish(self, messages: Sequence[Outgoing]) -> list[tuple[int, int]]:
        """Send in order and wait for every acknowledgement; (partition, offset) of each."""
        ...


class MemoryPublisher:
    """Keeps what it is given (tests, and a service run without a broker)."""

    def __init__(self, partitions: int = 1) -> None:
        self.messages: list[Outgoing] = []
        self.partitions = partitions
        self.fail_next = 0

    async def publish(self, messages: Sequence[Outgoing]) -> list[tuple[int, int]]:
        if self.fail_next:
            self.fail_next -= 1
            raise BrokerUnavailable("the test broker is down")
        out = []
        for m in messages:
            out.append((0, len(self.messages)))
            self.messages.append(m)
        return out

    def events(self) -> list[JobEvent | HoldEvent]:
        return [m.event for m in self.messages]


@dataclass(frozen=True, slots=True)
class Accepted:
    """A submit or cancel the service took: the job, and whether its events are on the topic
    yet (False: the broker did not take them in time; they are published, and carried out,
    when it does)."""

    record: JobRecord
    published: bool


class SchedulerService:
    """The asyncio side: one lock around decide → publish → enact, the tick timer, and what the
    API calls.

    Invariant: a decision is enacted only after the broker acknowledged its events. Decisions
    whose publication did not finish wait in the dispatcher's outbox, and their enactment in
    `_unenacted`, for the next attempt (each tick tries again); nothing is lost or reordered.

    The `observer` hears, under the lock, the admissions and preemptions of every decision
    when it is made, and every queue's length after each tick, submit and cancel; it never
    affects a decision, and an observer that raises is logged and ignored.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        publisher: Publisher,
        *,
        cycle_interval_s: float = 2.0,
        publish_timeout_s: float = 30.0,
        tick_publish_timeout_s: float = 5.0,
        observer: SchedulerObserver | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.publisher = publisher
        self.observer = observer
        self.cycle_interval_s = cycle_interval_s
        self.publish_timeout_s = publish_timeout_s
        self.tick_publish_timeout_s = tick_publish_timeout_s
        self.lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._unenacted: list[JobEvent] = []
        self.ticks = 0

    async def _publish(self, deadline_s: float) -> bool:
        """Publish the dispatcher's outbox in order, retrying with backoff for `deadline_s`;
        True once all of it is acknowledged, False (the rest back in the outbox) if not."""
        pending = self.dispatcher.take_outbox()
        delay = 0.1
        started = time.monotonic()
        while pending:
            try:
                placed = await self.publisher.publish(pending)
            except BrokerUnavailable as exc:
                if time.monotonic() - started + delay > deadline_s:
                    self.dispatcher.outbox[:0] = pending
                    log.warning("publishing failed (%s); %d message(s) wait", exc, len(pending))
                    return False
                log.warning("publishing failed (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            for message, (partition, offset) in zip(pending, placed, strict=True):
                self.dispatcher.published(message, partition, offset)
            pending = self.dispatcher.take_outbox()
        return True

    async def _commit(self, events: Sequence[JobEvent], deadline_s: float) -> bool:
        """Publish, then enact `events` and whatever earlier decisions still wait. Executor
        calls run in a thread (a stop may wait out a grace period); starts that fail come back
        as events, committed in turn."""
        self._unenacted.extend(events)
        while True:
            if not await self._publish(deadline_s):
                return False
            todo, self._unenacted = self._unenacted, []
            if not todo:
                return True
            follow_up = await asyncio.to_thread(self.dispatcher.enact, todo)
            self._unenacted = self.dispatcher.apply(follow_up)

    def _report(self, events: Sequence[JobEvent]) -> None:
        observer = self.observer
        if observer is None:
            return
        admissions: Counter[str] = Counter()
        preemptions: Counter[str] = Counter()
        for event in events:
            if isinstance(event, JobAdmitted | JobPreempted):
                queue = self.dispatcher.queue_of(event.job_id)
                if queue is not None:
                    counts = admissions if isinstance(event, JobAdmitted) else preemptions
                    counts[queue] += 1
        try:
            for queue, count in admissions.items():
                observer.admitted(queue, count)
            for queue, count in preemptions.items():
                observer.preempted(queue, count)
            for queue, length in self.dispatcher.queue_lengths().items():
                observer.scheduler_queue_length(queue, length)
        except Exception:  # monitoring must never stop scheduling
            log.exception("the scheduler observer failed")

    async def tick(self) -> list[JobEvent]:
        async with self.lock:
            events = self.dispatcher.decide()
            self._report(events)
            await self._commit(events, self.tick_publish_timeout_s)
            self.ticks += 1
            return events

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Recover after a replay: lost jobs fail; their events are published."""
        async with self.lock:
            events = self.dispatcher.recover()
            self._report(events)
            await self._commit(events, self.publish_timeout_s)

    async def run(self) -> None:
        """Tick every `cycle_interval_s`, or sooner when woken, until `stop`."""
        while not self._stopping.is_set():
            try:
                await self.tick()
            except Exception:  # a bug in one tick must not stop the scheduler
                log.exception("a scheduling tick failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.cycle_interval_s)

    async def stop(self, stop_jobs: bool) -> None:
        self._stopping.set()
        self._wake.set()
        if not stop_jobs:
            return
        async with self.lock:
            await asyncio.to_thread(self.dispatcher.stop_all, "the scheduler stopped")
            await self._publish(deadline_s=5.0)

    # ------------------------------------------------------------------ what the API calls

    async def submit(self, request: SubmitRequest) -> Accepted:
        async with self.lock:
            record = self.dispatcher.submit(request)
            self._report(())
            published = await self._commit((), self.publish_timeout_s)
        self.wake()
        return Accepted(record, published)

    async def cancel(self, job_id: str, team: str | None) -> Accepted:
        async with self.lock:
            if self.dispatcher.visible(job_id, team) is None:
                raise Rejected(RejectKind.NOT_FOUND, f"no job {job_id}")
            record, events = self.dispatcher.cancel(job_id)
            self._report(events)
            published = await self._commit(events, self.publish_timeout_s)
        self.wake()
        return Accepted(self.dispatcher.records[record.job_id], published)


# ---------------------------------------------------------------------------- Kafka


async def _kafka(what: str, call: Awaitable[T]) -> T:
    """The one place aiokafka's errors become `BrokerUnavailable`."""
    from aiokafka.errors import KafkaError

    try:
        return await call
    except (KafkaError, OSError) as exc:
        raise BrokerUnavailable(f"{what}: {exc}") from exc


async def topic_partitions(bootstrap: str, topics: Sequence[str]) -> dict[str, list[int]]:
    """The partitions of each topic, asked of the broker (a consumer's metadata cache narrows to
    the topics it is assigned, so it cannot be relied on for others)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)

    async def ask() -> dict[str, list[int]]:
        await admin.start()
        described = await admin.describe_topics(list(topics))
        return {
            str(t["topic"]): sorted(int(p["partition"]) for p in t["partitions"])
            for t in described
            if t.get("error_code", 0) == 0
        }

    try:
        return await _kafka(f"describing {', '.join(topics)}", ask())
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


class KafkaPublisher:
    """Sends `jobs` messages in order and waits for every acknowledgement. Not an idempotent
    producer (tansu needs a newer InitProducerId than aiokafka sends): a retried send may land
    twice, which is harmless — a replay skips a repeated `tally-seq`, the ledger drops a
    repeated event id."""

    def __init__(self, settings: ServiceSettings) -> None:
        from aiokafka import AIOKafkaProducer

        self.topic = settings.jobs_topic
        self.producer = AIOKafkaProducer(
            bootstrap_servers=",".join(settings.bootstrap),
            client_id=f"{settings.client_id}-scheduler",
            acks="all",
            request_timeout_ms=10_000,
        )

    async def start(self) -> None:
        await _kafka("starting the producer", self.producer.start())

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.producer.stop()

    async def publish(self, messages: Sequence[Outgoing]) -> list[tuple[int, int]]:
        async def send() -> list[tuple[int, int]]:
            futures = [
                await self.producer.send(self.topic, m.value, key=m.key, headers=m.headers)
                for m in messages
            ]
            metadata = await asyncio.gather(*futures)
            return [(md.partition, md.offset) for md in metadata]

        return await _kafka(f"publishing to {self.topic}", send())


async def read_topic(bootstrap: str, topic: str, client_id: str) -> list[Consumed]:
    """Every message of `topic` up to its end offsets at the time of the call."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        enable_auto_commit=False,
        group_id=None,
    )
    out: list[Consumed] = []

    async def read() -> None:
        await consumer.start()
        parts = (await topic_partitions(bootstrap, [topic])).get(topic, [])
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for messages in batch.values():
                for m in messages:
                    headers = [(k, bytes(v)) for k, v in (m.headers or ())]
                    out.append(Consumed(m.partition, m.offset, m.value, seq_of(headers)))
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)

    try:
        await _kafka(f"reading {topic}", read())
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
    return out


class Feeds:
    """The `balances` and `alerts` consumers (no consumer group: every instance reads all of
    both from the start) and the ledger group's committed `jobs` offsets."""

    def __init__(self, settings: ServiceSettings, dispatcher: Dispatcher) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self.settings = settings
        self.dispatcher = dispatcher
        servers = ",".join(settings.bootstrap)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=servers,
            client_id=f"{settings.client_id}-scheduler-feeds",
            enable_auto_commit=False,
            group_id=None,
            auto_offset_reset="earliest",
        )
        self.admin = AIOKafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=5_000)
        self._balance_parts: list[Any] = []
        self._jobs_parts: list[Any] = []
        self._last_ack_check = 0.0
        self._ack_warned = -60.0
        self.balance_messages = 0
        self.alert_messages = 0

    async def start(self) -> None:
        from aiokafka import TopicPartition

        s = self.settings

        async def go() -> None:
            await self.consumer.start()
            await self.admin.start()
            parts = await topic_partitions(
                ",".join(s.bootstrap), [s.balances_topic, s.alerts_topic, s.jobs_topic]
            )
            tps = [
                TopicPartition(topic, p)
                for topic in (s.balances_topic, s.alerts_topic)
                for p in parts.get(topic, [])
            ]
            self.consumer.assign(tps)
            await self.consumer.seek_to_beginning(*tps)
            self._balance_parts = [tp for tp in tps if tp.topic == s.balances_topic]
            self._jobs_parts = [
                TopicPartition(s.jobs_topic, p) for p in parts.get(s.jobs_topic, [])
            ]

        await _kafka("starting the balances and alerts consumer", go())

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.consumer.stop()
        with contextlib.suppress(Exception):
            await self.admin.close()

    async def poll(self, timeout_ms: int = 200) -> int:
        """Fold what arrived; returns how many messages."""
        batch = await _kafka(
            "reading balances and alerts",
            self.consumer.getmany(timeout_ms=timeout_ms, max_records=5000),
        )
        count = 0
        for tp, messages in batch.items():
            for m in messages:
                count += 1
                if tp.topic == self.settings.balances_topic:
                    self.balance_messages += 1
                    if m.value is None:
                        continue
                    try:
                        self.dispatcher.on_balance(decode_balance_update(m.value))
                    except EventError as exc:
                        log.warning("ignored a balances message: %s", exc)
                else:
                    self.alert_messages += 1
                    self.dispatcher.on_alert(m.value)
        await self._acknowledge()
        return count

    async def _acknowledge(self) -> None:
        """Move holds along: committed by the ledger → barrier; barrier reached → counted by
        the ledger (see the module)."""
        holds = self.dispatcher.holds
        if self._balance_parts:
            positions = {}
            for tp in self._balance_parts:
                with contextlib.suppress(Exception):
                    positions[tp.partition] = await self.consumer.position(tp)
            holds.caught_up(positions)
        if not holds.awaiting_commit() or time.monotonic() - self._last_ack_check < 0.5:
            return
        if not self._jobs_parts:
            return
        self._last_ack_check = time.monotonic()
        try:
            offsets = await _kafka(
                "reading the ledger's committed offsets",
                # with the partitions named: tansu answers that form of OffsetFetch
                self.admin.list_consumer_group_offsets(
                    self.settings.ledger_group, partitions=self._jobs_parts
                ),
            )
            committed = {
                tp.partition: meta.offset
                for tp, meta in offsets.items()
                if tp.topic == self.settings.jobs_topic and meta.offset >= 0
            }
            if not committed:
                return
            ends = await _kafka(
                "reading the balances end offsets", self.consumer.end_offsets(self._balance_parts)
            )
        except BrokerUnavailable as exc:
            if time.monotonic() - self._ack_warned > 60:
                self._ack_warned = time.monotonic()
                log.warning(
                    "cannot see the ledger's progress (holds count twice meanwhile): %s", exc
                )
            return
        holds.committed(committed, {tp.partition: off for tp, off in ends.items()})

    async def run(self, stopping: asyncio.Event) -> None:
        delay = 0.2
        while not stopping.is_set():
            try:
                await self.poll()
                delay = 0.2
            except BrokerUnavailable as exc:
                log.warning("%s; retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception:  # a bad message must not stop budgets and alerts arriving
                log.exception("reading balances and alerts failed")
                await asyncio.sleep(1.0)


class WallClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


async def run_service(
    settings: ServiceSettings,
    dispatcher: Dispatcher,
    serve_api: Callable[[SchedulerService], Awaitable[Callable[[], Awaitable[None]]]],
    *,
    ready: Callable[[], None] | None = None,
    stop_event: asyncio.Event | None = None,
    observer: SchedulerObserver | None = None,
) -> None:
    """Replay the jobs topic, recover, then run feeds, ticks and the API until stopped
    (SIGTERM/SIGINT, or `stop_event`). `serve_api` starts the API and returns its closer;
    `observer` hears the service's decisions and queue lengths (see `SchedulerService`)."""
    bootstrap = settings.bootstrap[0]
    messages = await read_topic(bootstrap, settings.jobs_topic, f"{settings.client_id}-replay")
    applied = dispatcher.replay(messages)
    log.info(
        "replayed %d events from %s (%d refused); %d pending, %d running",
        applied,
        settings.jobs_topic,
        dispatcher.replay_errors,
        dispatcher.state.pending_count,
        dispatcher.state.running_count,
    )
    publisher = KafkaPublisher(settings)
    await publisher.start()
    feeds = Feeds(settings, dispatcher)
    service = SchedulerService(
        dispatcher,
        publisher,
        cycle_interval_s=settings.cycle_interval_s,
        publish_timeout_s=settings.publish_timeout_s,
        observer=observer,
    )
    stopping = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stopping.set)
    close_api: Callable[[], Awaitable[None]] | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        await feeds.start()
        await feeds.poll(timeout_ms=500)  # balances first, so the first cycle knows budgets
        await service.start()
        close_api = await serve_api(service)
        tasks = [
            asyncio.create_task(feeds.run(stopping), name="feeds"),
            asyncio.create_task(service.run(), name="ticks"),
        ]
        if ready is not None:
            ready()
        await stopping.wait()
    finally:
        if close_api is not None:
            await close_api()
        await service.stop(settings.stop_jobs_on_exit)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await feeds.stop()
        await publisher.stop()
