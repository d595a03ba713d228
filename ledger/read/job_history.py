"""Job history: the readers' projection of the scheduler's `jobs` topic, out of the raw-event
archive, and the dashboard's plain-language reading of it.

This module owns what the Team page and the queue-wait trends say about jobs:
- `read_job_event_log` reads the messages of the jobs topic from the sealed raw-event archive
  (`archive/`, see `ledger.store.segments`) and decodes them with `ledger.job_events`
  (`job_event_log`); hold events, which share the topic, are passed over;
- `fold_jobs` folds job events into one `JobRow` per job: state, queue, GPUs, times, the
  current wait and its reason, preemptions (by whom, why), attempts;
- `select_jobs`, `daily_queue_waits` and `observed_waits` select and summarise rows;
- `explain_job` answers "why is my job waiting / why was it stopped" for a researcher.

`scheduler.explain` answers the same question for the CLI from the scheduler's own copy of the
events; `explain_job` is the dashboard's reading of the same events, in fuller sentences and
with advice. Both follow the scheduler's state machine (`scheduler.state`): a preempted job is
back in its queue with the reason `preempted` until a cycle gives it another reason, and a
failed job with `retry` is back with `retrying`.

Invariants:
- everything here but `read_job_event_log` is pure: plain values in, frozen values out;
- events are applied in publication order: the archive's order (batch sequence, then position
  in the batch). A job's events share its key and so one partition, whose order the archive
  keeps; events repeated by a resend (the same content-derived id) count once;
- times are integer µs; durations and quantiles are integer µs (nearest rank, no floats).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from ledger.errors import EventError
from ledger.job_events import (
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEnvelope,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
    decode_job_event,
    job_envelope_from_dict,
)
from ledger.periods import Period
from ledger.store.layout import ARCHIVE_DIR
from ledger.store.segments import Manifest

DEFAULT_JOBS_TOPIC = "tally.jobs"
US_PER_MINUTE = 60_000_000
US_PER_HOUR = 60 * US_PER_MINUTE
DAY_US = 24 * US_PER_HOUR
_READ_RETRIES = 3
_CACHED_FILES = 1024
_JOB_PREFIX = "tally.job."
_GPU_PREFIX = "tally.gpu."


# ---------------------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class JobEventLog:
    """The job events of the jobs topic, in publication order, each once.

    `messages`: jobs-topic messages read; `undecodable`: messages or array items that claim to
    be job events (or are not JSON) but fail `ledger.job_events`' validation; `newest_us`: the
    latest event time (None without events).
    """

    events: tuple[JobEvent, ...] = ()
    messages: int = 0
    undecodable: int = 0
    newest_us: int | None = None


def job_envelopes(value: bytes | None) -> tuple[tuple[JobEnvelope, ...], int]:
    """The job events in one jobs-topic message value (one envelope, or an array of them), and
    how many items were undecodable. Hold events and other types are passed over; never raises.
    """
    if not value:
        return (), 1
    try:
        return (decode_job_event(value),), 0
    except EventError:
        pass  # not a single job event: an array, a hold event, or bad input (sorted out below)
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return (), 1
    items = parsed if type(parsed) is list else [parsed]
    found: list[JobEnvelope] = []
    bad = 0
    for item in items:
        kind = item.get("type") if type(item) is dict else None
        if type(kind) is str and not kind.startswith((_JOB_PREFIX, _GPU_PREFIX)):
            continue  # a hold event (`ledger.holds`) or another producer's type
        try:
            found.append(job_envelope_from_dict(item))
        except EventError:
            bad += 1
    return tuple(found), bad


def job_event_log(values: Iterable[bytes | None]) -> JobEventLog:
    """Decode jobs-topic message values given in publication order; resent events count once."""
    seen: set[str] = set()
    events: list[JobEvent] = []
    messages = bad = 0
    for value in values:
        messages += 1
        envelopes, undecodable = job_envelopes(value)
        bad += undecodable
        for envelope in envelopes:
            if envelope.id not in seen:
                seen.add(envelope.id)
                events.append(envelope.data)
    newest = max((e.time_us for e in events), default=None)
    return JobEventLog(tuple(events), messages, bad, newest)


_Decoded = tuple[tuple[int, int, tuple[JobEnvelope, ...], int], ...]


@functools.lru_cache(maxsize=_CACHED_FILES)
def _archive_file(path: str, sha256: str, topic: str) -> _Decoded:
    """(batch sequence, position, job envelopes, undecodable) per message of one archive file.

    Archive files are immutable and named by their offset range; the checksum in the key makes
    a rewritten file (a re-seal after a crash writes the same bytes) a cache hit only when equal.
    """
    del sha256  # part of the cache key only
    table = pq.read_table(path, columns=["batch_seq", "batch_index", "topic", "value"])
    out = []
    for seq, index, msg_topic, value in zip(
        *(table.column(i).to_pylist() for i in range(4)), strict=True
    ):
        if msg_topic == topic:
            envelopes, bad = job_envelopes(value)
            out.append((int(seq), int(index), envelopes, bad))
    return tuple(out)


def read_job_event_log(data_dir: Path | str, topic: str = DEFAULT_JOBS_TOPIC) -> JobEventLog:
    """The job events of `topic` in the sealed raw-event archive of the ledger in `data_dir`.

    Reads only the archive segments the archive manifest lists for `topic` (what the ledger
    worker consumed and sealed; the writer's hot database is never opened). A file compacted
    away between reading the manifest and the file is retried with the new manifest.
    """
    root = Path(data_dir) / ARCHIVE_DIR
    last: OSError | None = None
    for _ in range(_READ_RETRIES):
        infos = [s for s in Manifest(root).load() if s.topic == topic]
        try:
            decoded = [_archive_file(str(root / s.path), s.sha256, topic) for s in infos]
            break
        except OSError as exc:  # FileNotFoundError, or pyarrow's error for a vanished file
            last = exc
    else:
        raise EventError(f"the raw-event archive could not be read: {last}")
    rows = sorted((row for part in decoded for row in part), key=lambda r: (r[0], r[1]))
    seen: set[str] = set()
    events: list[JobEvent] = []
    bad = 0
    for _, _, envelopes, undecodable in rows:
        bad += undecodable
        for envelope in envelopes:
            if envelope.id not in seen:
                seen.add(envelope.id)
                events.append(envelope.data)
    newest = max((e.time_us for e in events), default=None)
    return JobEventLog(tuple(events), len(rows), bad, newest)


# ---------------------------------------------------------------------------- the fold


class JobState(StrEnum):
    """Where a job stands after its latest event."""

    WAITING = "waiting"  # in its queue (never admitted, or back after a preemption or failure)
    STARTING = "starting"  # admitted to GPUs; its processes have not started yet
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"  # stopped because its GPUs sat allocated but idle; not requeued

    @property
    def active(self) -> bool:
        """Holds GPUs now."""
        return self in (JobState.STARTING, JobState.RUNNING)

    @property
    def ended(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED, JobState.RECLAIMED)


@dataclass(frozen=True, slots=True)
class Preemption:
    """One time the job was stopped to make room for job `by`."""

    time_us: int
    by: str
    reason: PreemptReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as its events describe it.

    `model` and `pool` are those of the latest admission, else what the job asked for (None:
    any). `waiting_since_us` is the start of the current wait (submission, preemption or
    retry); `wait_reason` the latest reason given in it, given at `wait_reason_since_us`.
    `waited_us` and `ran_us` add up the waits and runs that are over; `attempts` counts
    admissions. Team, project and user are None only for a job whose submission the archive
    does not hold.
    """

    job_id: str
    team: str | None
    project: str | None
    user: str | None
    queue: str | None
    gpus: int
    model: str | None
    pool: str | None
    state: JobState
    submitted_us: int | None
    first_event_us: int
    last_event_us: int
    waiting_since_us: int | None = None
    wait_reason: WaitReason | None = None
    wait_reason_since_us: int | None = None
    wait_detail: str = ""
    admitted_us: int | None = None
    started_us: int | None = None
    first_started_us: int | None = None
    ended_us: int | None = None
    attempts: int = 0
    gpu_uuids: tuple[str, ...] = ()
    borrowed_gpus: int = 0
    over_budget: bool = False
    preemptions: tuple[Preemption, ...] = ()
    fail_reason: FailReason | None = None
    exit_code: int | None = None
    estimated_runtime_us: int | None = None
    waited_us: int = 0
    ran_us: int = 0

    @property
    def since_us(self) -> int:
        """When the job entered its current state."""
        if self.state is JobState.WAITING:
            return self.waiting_since_us or self.first_event_us
        if self.state is JobState.RUNNING:
            return self.started_us or self.admitted_us or self.first_event_us
        if self.state is JobState.STARTING:
            return self.admitted_us or self.first_event_us
        return self.ended_us or self.last_event_us

    def waited_total_us(self, as_of_us: int) -> int:
        """All the time the job spent waiting, up to `as_of_us` if it waits now."""
        if self.state is JobState.WAITING:
            return self.waited_us + max(0, as_of_us - self.since_us)
        return self.waited_us

    def runtime_us(self, as_of_us: int) -> int:
        """All the time the job held GPUs, up to `as_of_us` if it holds them now."""
        if self.state.active:
            return self.ran_us + max(0, as_of_us - (self.admitted_us or self.since_us))
        return self.ran_us

    @property
    def first_wait_us(self) -> int | None:
        """Queueing delay from submission to the first start (None: not started, or no
        submission in the archive)."""
        if self.submitted_us is None or self.first_started_us is None:
            return None
        return max(0, self.first_started_us - self.submitted_us)


@dataclass(slots=True)
class _Acc:
    """A job being folded (mutable; frozen into a `JobRow`)."""

    job_id: str
    first_event_us: int
    team: str | None = None
    project: str | None = None
    user: str | None = None
    queue: str | None = None
    gpus: int = 0
    model: str | None = None
    pool: str | None = None
    state: JobState = JobState.WAITING
    submitted_us: int | None = None
    last_event_us: int = 0
    waiting_since_us: int | None = None
    wait_reason: WaitReason | None = None
    wait_reason_since_us: int | None = None
    wait_detail: str = ""
    admitted_us: int | None = None
    started_us: int | None = None
    first_started_us: int | None = None
    ended_us: int | None = None
    attempts: int = 0
    gpu_uuids: tuple[str, ...] = ()
    borrowed_gpus: int = 0
    over_budget: bool = False
    preemptions: list[Preemption] = field(default_factory=list)
    fail_reason: FailReason | None = None
    exit_code: int | None = None
    estimated_runtime_us: int | None = None
    waited_us: int = 0
    ran_us: int = 0

    def end_wait(self, at_us: int) -> None:
        if self.state is JobState.WAITING:
            since = self.waiting_since_us
            if since is None:
                since = self.submitted_us if self.submitted_us is not None else at_us
            self.waited_us += max(0, at_us - since)
        self.waiting_since_us = None
        self.wait_reason = None
        self.wait_reason_since_us = None
        self.wait_detail = ""

    def end_run(self, at_us: int) -> None:
        if self.state.active and self.admitted_us is not None:
            self.ran_us += max(0, at_us - self.admitted_us)

    def requeue(self, at_us: int, reason: WaitReason) -> None:
        self.state = JobState.WAITING
        self.waiting_since_us = at_us
        self.wait_reason = reason
        self.wait_reason_since_us = at_us
        self.wait_detail = ""

    def freeze(self) -> JobRow:
        return JobRow(
            job_id=self.job_id,
            team=self.team,
            project=self.project,
            user=self.user,
            queue=self.queue,
            gpus=self.gpus,
            model=self.model,
            pool=self.pool,
            state=self.state,
            submitted_us=self.submitted_us,
            first_event_us=self.first_event_us,
            last_event_us=self.last_event_us,
            waiting_since_us=self.waiting_since_us,
            wait_reason=self.wait_reason,
            wait_reason_since_us=self.wait_reason_since_us,
            wait_detail=self.wait_detail,
            admitted_us=self.admitted_us,
            started_us=self.started_us,
            first_started_us=self.first_started_us,
            ended_us=self.ended_us,
            attempts=self.attempts,
            gpu_uuids=self.gpu_uuids,
            borrowed_gpus=self.borrowed_gpus,
            over_budget=self.over_budget,
            preemptions=tuple(self.preemptions),
            fail_reason=self.fail_reason,
            exit_code=self.exit_code,
            estimated_runtime_us=self.estimated_runtime_us,
            waited_us=self.waited_us,
            ran_us=self.ran_us,
        )


def _apply(acc: _Acc, event: JobEvent) -> None:
    at = event.time_us
    acc.last_event_us = max(acc.last_event_us, at)
    if isinstance(event, JobSubmitted):
        if acc.submitted_us is not None:
            return  # a job is submitted once
        spec = event.spec
        acc.team, acc.project, acc.user, acc.queue = spec.team, spec.project, spec.user, spec.queue
        acc.gpus, acc.estimated_runtime_us = spec.gpus, spec.estimated_runtime_us
        acc.model = acc.model or spec.model
        acc.pool = acc.pool or spec.pool
        acc.submitted_us = at
        if acc.state is JobState.WAITING and acc.waiting_since_us is None:
            acc.waiting_since_us = at
    elif isinstance(event, JobWaiting):
        if acc.state is not JobState.WAITING:
            return  # a late verdict on a job that has moved on
        if acc.waiting_since_us is None:
            acc.waiting_since_us = at
        acc.wait_reason, acc.wait_reason_since_us, acc.wait_detail = event.reason, at, event.detail
    elif isinstance(event, JobAdmitted):
        acc.end_wait(at)
        acc.state = JobState.STARTING
        acc.team = acc.team or event.team
        acc.queue = acc.queue or event.queue
        acc.pool, acc.model, acc.gpu_uuids = event.pool, event.model, event.gpu_uuids
        acc.gpus = acc.gpus or len(event.gpu_uuids)
        acc.borrowed_gpus, acc.over_budget = event.borrowed_gpus, event.over_budget
        acc.admitted_us, acc.started_us = at, None
        acc.attempts = max(acc.attempts + 1, event.attempt)
    elif isinstance(event, JobStarted):
        if acc.state.active:
            acc.state = JobState.RUNNING
            acc.started_us = at
            if acc.first_started_us is None:
                acc.first_started_us = at
    elif isinstance(event, JobPreempted):
        acc.preemptions.append(Preemption(at, event.by, event.reason, event.detail))
        acc.end_run(at)
        acc.requeue(at, WaitReason.PREEMPTED)
    elif isinstance(event, JobReclaimed | JobFinished):
        acc.end_run(at)
        acc.end_wait(at)
        acc.state = JobState.RECLAIMED if isinstance(event, JobReclaimed) else JobState.FINISHED
        acc.ended_us = at
    elif isinstance(event, JobFailed):
        acc.end_run(at)
        acc.fail_reason, acc.exit_code = event.reason, event.exit_code
        acc.attempts = max(acc.attempts, event.attempt)
        if event.retry:
            if acc.state is not JobState.WAITING:
                acc.requeue(at, WaitReason.RETRYING)
            return
        acc.end_wait(at)
        cancelled = event.reason is FailReason.CANCELLED
        acc.state = JobState.CANCELLED if cancelled else JobState.FAILED
        acc.ended_us = at


def fold_jobs(events: Iterable[JobEvent]) -> tuple[JobRow, ...]:
    """One row per job from job events in publication order, in order of first appearance.

    `GpuAssigned` only fills in a job's project and user when its submission is missing;
    `GpuReleased` changes nothing (the job events say when GPUs are given back).
    """
    jobs: dict[str, _Acc] = {}
    for event in events:
        if isinstance(event, GpuReleased):
            continue
        acc = jobs.get(event.job_id)
        if acc is None:
            acc = jobs[event.job_id] = _Acc(event.job_id, event.time_us)
        if isinstance(event, GpuAssigned):
            acc.team = acc.team or event.team
            acc.project = acc.project or event.project
            acc.user = acc.user or event.user
            continue
        _apply(acc, event)
    return tuple(acc.freeze() for acc in jobs.values())


def job_teams(rows: Iterable[JobRow]) -> dict[str, str]:
    """Job id → team, for the jobs whose team is known."""
    return {r.job_id: r.team for r in rows if r.team is not None}


# ---------------------------------------------------------------------------- selecting


def select_jobs(
    rows: Iterable[JobRow],
    team: str | None = None,
    period: Period | None = None,
    pool: str | None = None,
) -> tuple[JobRow, ...]:
    """The rows of `team`, active in `period` and on `pool` (None: no condition).

    Active in a period: submitted (or first seen) before its end and not ended before its
    start. On a pool: admitted to it, or asked for it; a job that asked for any pool and was
    never admitted is on no pool.
    """
    chosen = []
    for r in rows:
        if team is not None and r.team != team:
            continue
        if pool is not None and r.pool != pool:
            continue
        if period is not None:
            began = r.submitted_us if r.submitted_us is not None else r.first_event_us
            if began >= period.end_us or (r.ended_us is not None and r.ended_us < period.start_us):
                continue
        chosen.append(r)
    return tuple(chosen)


# ---------------------------------------------------------------------------- queue waits


def quantile_us(values: Sequence[int], pct: int) -> int:
    """The `pct` percentile of `values` by nearest rank (an observed value); 0 when empty."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, -(-pct * len(ordered) // 100))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class QueueWaitDay:
    """Queueing delays (submission → first start) of the jobs that first started on one UTC
    day in one pool and GPU model."""

    day_us: int
    pool: str | None
    model: str | None
    jobs: int
    p50_us: int
    p95_us: int
    max_us: int


def daily_queue_waits(
    rows: Iterable[JobRow],
    since_us: int | None = None,
    until_us: int | None = None,
    pool: str | None = None,
) -> tuple[QueueWaitDay, ...]:
    """p50 / p95 / max queueing delay per UTC day of first start, pool and model, for jobs that
    first started in `[since_us, until_us)` (None: unbounded)."""
    groups: dict[tuple[int, str | None, str | None], list[int]] = {}
    for r in rows:
        wait = r.first_wait_us
        start = r.first_started_us
        if wait is None or start is None:
            continue
        if (since_us is not None and start < since_us) or (
            until_us is not None and start >= until_us
        ):
            continue
        if pool is not None and r.pool != pool:
            continue
        groups.setdefault((start - start % DAY_US, r.pool, r.model), []).append(wait)
    return tuple(
        QueueWaitDay(day, p, m, len(w), quantile_us(w, 50), quantile_us(w, 95), max(w))
        for (day, p, m), w in sorted(groups.items(), key=lambda kv: _group_key(kv[0]))
    )


def _group_key(key: tuple[int, str | None, str | None]) -> tuple[int, str, str]:
    return (key[0], key[1] or "", key[2] or "")


@dataclass(frozen=True, slots=True)
class ObservedWaits:
    """Observed queueing of one GPU model (and pool) in `[since_us, until_us)`.

    `started`: jobs that first started in the window, with their delay's p50, p95 and max;
    `waiting`: jobs still waiting at `until_us` that asked for the model (or were admitted to
    it before), and the longest of those waits so far.
    """

    model: str
    pool: str | None
    since_us: int
    until_us: int
    started: int
    p50_us: int
    p95_us: int
    max_us: int
    waiting: int
    longest_waiting_us: int


def observed_waits(
    rows: Iterable[JobRow], model: str, since_us: int, until_us: int, pool: str | None = None
) -> ObservedWaits:
    waits: list[int] = []
    waiting: list[int] = []
    for r in rows:
        if r.model != model or (pool is not None and r.pool != pool):
            continue
        start, wait = r.first_started_us, r.first_wait_us
        if start is not None and wait is not None and since_us <= start < until_us:
            waits.append(wait)
        if r.state is JobState.WAITING and r.since_us < until_us:
            waiting.append(until_us - r.since_us)
    return ObservedWaits(
        model,
        pool,
        since_us,
        until_us,
        len(waits),
        quantile_us(waits, 50),
        quantile_us(waits, 95),
        max(waits, default=0),
        len(waiting),
        max(waiting, default=0),
    )


# ---------------------------------------------------------------------------- explaining

WAIT_PLAIN: Mapping[WaitReason, str] = {
    WaitReason.NO_CAPACITY: "all GPUs of the kind it needs are busy right now",
    WaitReason.NO_MATCHING_GPUS: "no GPUs in the fleet (or in your team's quota) can ever fit "
    "it as submitted: the GPU model, pool or number of GPUs asked for does not exist together",
    WaitReason.QUOTA_EXHAUSTED: "your team is already using all the GPUs its quota allows, and "
    "it may not borrow more",
    WaitReason.COHORT_EXHAUSTED: "your team is using its own quota, and the teams it may borrow "
    "from have no unused GPUs to lend right now",
    WaitReason.QUOTA_LENT: "your team's own quota is lent to another team at the moment, and "
    "has not been taken back yet",
    WaitReason.BUDGET_EXHAUSTED: "your team's remaining budget cannot cover what this job is "
    "expected to cost",
    WaitReason.NO_PRICE: "your team has a money budget, but this GPU model has no price, so the "
    "job's cost cannot be checked against the budget",
    WaitReason.BEHIND_HEAD: "its queue is first in, first out, and an earlier job is still "
    "waiting; yours comes after it",
    WaitReason.UNKNOWN_QUEUE: "it names a queue or team the scheduler does not know",
    WaitReason.PREEMPTED: "it was stopped to make room for another job and is back in its queue",
    WaitReason.RETRYING: "it failed and is back in its queue for another attempt",
}

WAIT_SHORT: Mapping[WaitReason, str] = {
    WaitReason.NO_CAPACITY: "GPUs busy",
    WaitReason.NO_MATCHING_GPUS: "can never fit as submitted",
    WaitReason.QUOTA_EXHAUSTED: "team quota in use",
    WaitReason.COHORT_EXHAUSTED: "no quota left to borrow",
    WaitReason.QUOTA_LENT: "team quota lent out",
    WaitReason.BUDGET_EXHAUSTED: "budget used up",
    WaitReason.NO_PRICE: "GPU model has no price",
    WaitReason.BEHIND_HEAD: "behind an earlier job",
    WaitReason.UNKNOWN_QUEUE: "unknown queue or team",
    WaitReason.PREEMPTED: "stopped for another job, back in queue",
    WaitReason.RETRYING: "failed, waiting to retry",
}
NOT_YET_CONSIDERED = "not looked at yet"

WAIT_ADVICE: Mapping[WaitReason, str] = {
    WaitReason.NO_CAPACITY: "Nothing is wrong with the job: it starts as soon as enough GPUs "
    "free up. Asking for fewer GPUs, or for any GPU model, can let it start sooner.",
    WaitReason.NO_MATCHING_GPUS: "It will not start as it is. Cancel it (`tally job cancel`) "
    "and submit it again with fewer GPUs or another GPU model or pool.",
    WaitReason.QUOTA_EXHAUSTED: "It starts when one of your team's own jobs ends and gives "
    "its GPUs back. If this happens often, ask your platform team about a larger quota.",
    WaitReason.COHORT_EXHAUSTED: "It starts when your team's own jobs or other teams' jobs "
    "give GPUs back.",
    WaitReason.QUOTA_LENT: "The scheduler takes your quota back from the borrowing team; the "
    "job starts once those GPUs are free again.",
    WaitReason.BUDGET_EXHAUSTED: "Ask whoever manages your team's budget for a grant, or "
    "submit the job with a shorter runtime estimate (`--estimate`).",
    WaitReason.NO_PRICE: "Your platform team needs to set a price for this GPU model "
    "(`prices:` in the configuration).",
    WaitReason.BEHIND_HEAD: "Nothing to do: it moves up as the jobs ahead of it start.",
    WaitReason.UNKNOWN_QUEUE: "Cancel it and submit it again to a queue that exists "
    "(`tally queue list` shows them).",
    WaitReason.PREEMPTED: "Nothing to do: it restarts by itself when GPUs are free again. "
    "Jobs that save checkpoints often lose less work when they are stopped.",
    WaitReason.RETRYING: "Nothing to do now; if it keeps failing, look at its log "
    "(`.tally/scheduler/logs`).",
}

PREEMPT_PLAIN: Mapping[PreemptReason, str] = {
    PreemptReason.RECLAIM_LENT_QUOTA: "your team was running on quota borrowed from another "
    "team, and that team needed its GPUs back",
    PreemptReason.HIGHER_PRIORITY: "a job with a higher priority needed the GPUs",
    PreemptReason.OVER_BUDGET: "it was running beyond your team's budget, so any other job may "
    "take its GPUs",
}

FAIL_PLAIN: Mapping[FailReason, str] = {
    FailReason.EXIT_NONZERO: "the program stopped with an error",
    FailReason.MAX_RUNTIME: "it ran longer than its queue's maximum runtime and was stopped",
    FailReason.EXECUTOR_LOST: "the scheduler lost track of its processes (for example, after "
    "a restart)",
    FailReason.CANCELLED: "it was cancelled",
}


def outcome_text(row: JobRow) -> str:
    """How an ended job ended, in a few words (its state for one that has not ended)."""
    if row.state is JobState.FAILED and row.fail_reason is not None:
        code = f" (exit code {row.exit_code})" if row.exit_code is not None else ""
        return f"failed: {FAIL_PLAIN[row.fail_reason]}{code}"
    if row.state is JobState.RECLAIMED:
        return "stopped: its GPUs sat idle"
    return row.state.value


def wait_text(row: JobRow) -> str:
    """Why a waiting job waits, in a few words."""
    return NOT_YET_CONSIDERED if row.wait_reason is None else WAIT_SHORT[row.wait_reason]


def when_text(time_us: int) -> str:
    return f"{datetime.fromtimestamp(time_us / 1e6, tz=UTC):%Y-%m-%d %H:%M} UTC"


def duration_text(us: int) -> str:
    """A duration for people: `45 s`, `12 min`, `3 h 05 min`, `2 d 4 h`."""
    seconds = max(0, us) // 1_000_000
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    time_us: int
    text: str


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a job is where it is, for a researcher: `headline` (where it stands and why),
    `advice` (what they can do; empty when nothing), and its history in plain sentences."""

    job_id: str
    state: JobState | None
    headline: str
    advice: str
    timeline: tuple[TimelineEntry, ...]
    waited_us: int = 0
    preemptions: int = 0


def job_name(job_id: str) -> str:
    """`job-1a2b` as is, `1234` as `job 1234`."""
    return job_id if job_id.lower().startswith("job") else f"job {job_id}"


def _by(job_id: str, teams: Mapping[str, str]) -> str:
    team = teams.get(job_id)
    return job_name(job_id) + (f" of team {team}" if team else "")


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def _event_text(event: JobEvent, teams: Mapping[str, str]) -> str | None:
    if isinstance(event, JobSubmitted):
        spec = event.spec
        where = f" in pool {spec.pool}" if spec.pool else ""
        estimate = (
            f", expected to run {duration_text(spec.estimated_runtime_us)}"
            if spec.estimated_runtime_us
            else ""
        )
        return (
            f"Submitted by {spec.user} (project {spec.project}) to queue {spec.queue}, asking "
            f"for {_gpus(spec.gpus)} of {spec.model or 'any model'}{where}"
            + ("" if spec.span_nodes else " on one node")
            + f"{estimate}."
        )
    if isinstance(event, JobWaiting):
        note = f" (scheduler's note: {event.detail})" if event.detail else ""
        return f"Waiting because {WAIT_PLAIN[event.reason]}{note}."
    if isinstance(event, JobAdmitted):
        borrowed = (
            f", {event.borrowed_gpus} of them borrowed from other teams' unused quota"
            if event.borrowed_gpus
            else ""
        )
        risk = (
            " It runs beyond the team's budget, so other jobs may stop it."
            if event.over_budget
            else (" It may be stopped for other jobs (preemptible)." if event.preemptible else "")
        )
        attempt = f" (attempt {event.attempt})" if event.attempt > 1 else ""
        return (
            f"Given {_gpus(len(event.gpu_uuids))} of {event.model} in pool {event.pool}"
            f"{borrowed}{attempt}.{risk}"
        )
    if isinstance(event, JobStarted):
        return "Started running."
    if isinstance(event, JobPreempted):
        note = f" (scheduler's note: {event.detail})" if event.detail else ""
        return (
            f"Stopped to make room for {_by(event.by, teams)}: {PREEMPT_PLAIN[event.reason]}"
            f"{note}. It went back to its queue."
        )
    if isinstance(event, JobReclaimed):
        return (
            f"Stopped because its GPUs sat allocated but unused since "
            f"{when_text(event.idle_since_us)}; it is not requeued."
        )
    if isinstance(event, JobFinished):
        return "Finished."
    if isinstance(event, JobFailed):
        code = f" (exit code {event.exit_code})" if event.exit_code is not None else ""
        after = "it goes back to its queue to try again" if event.retry else "it is not retried"
        return f"Ended: {FAIL_PLAIN[event.reason]}{code}; {after}."
    return None


def _headline(row: JobRow, as_of_us: int, teams: Mapping[str, str]) -> tuple[str, str]:
    since = row.since_us
    name = job_name(row.job_id)
    if row.state is JobState.WAITING:
        waited = duration_text(as_of_us - since)
        if row.wait_reason is None:
            text = (
                f"{name} has been waiting for {waited} (since {when_text(since)}). No scheduling "
                "cycle has looked at it yet; that normally takes seconds."
            )
            advice = ""
        else:
            text = (
                f"{name} has been waiting for {waited} (since {when_text(since)}) because "
                f"{WAIT_PLAIN[row.wait_reason]}."
            )
            if row.wait_detail:
                text += f" The scheduler's note: {row.wait_detail}."
            advice = WAIT_ADVICE[row.wait_reason]
        if row.preemptions:
            last = row.preemptions[-1]
            text += (
                f" It was last stopped at {when_text(last.time_us)} by {_by(last.by, teams)} "
                f"because {PREEMPT_PLAIN[last.reason]}."
            )
        return text, advice
    place = f"{_gpus(len(row.gpu_uuids) or row.gpus)} of {row.model} in pool {row.pool}"
    if row.state is JobState.STARTING:
        return f"{name} has been given {place} and is starting.", ""
    if row.state is JobState.RUNNING:
        text = (
            f"{name} is running on {place} since {when_text(since)} "
            f"({duration_text(as_of_us - since)})."
        )
        if row.over_budget:
            text += " It runs beyond your team's budget, so other jobs may stop it."
        return text, ""
    ran = duration_text(row.ran_us)
    if row.state is JobState.FINISHED:
        return f"{name} finished at {when_text(since)} after running {ran}.", ""
    if row.state is JobState.RECLAIMED:
        return (
            f"{name} was stopped at {when_text(since)} because its GPUs sat allocated but unused; "
            "it is not requeued.",
            "Submit it again when it is ready to use its GPUs; idle GPUs are reclaimed for others.",
        )
    reason = FAIL_PLAIN[row.fail_reason] if row.fail_reason else "it ended without finishing"
    code = f" (exit code {row.exit_code})" if row.exit_code is not None else ""
    if row.state is JobState.CANCELLED:
        return f"{name} was cancelled at {when_text(since)}.", ""
    return (
        f"{name} failed at {when_text(since)}: {reason}{code}.",
        "Its log is in `.tally/scheduler/logs` (local executor) or Slurm's output file.",
    )


def explain_job(
    job_id: str,
    events: Iterable[JobEvent],
    as_of_us: int,
    teams: Mapping[str, str] | None = None,
) -> Explanation:
    """Why `job_id` waits, runs, was stopped or ended, from job events in publication order.

    `as_of_us` is "now" (how long the current wait has lasted); `teams` names the team of other
    jobs (the preemptor's), where known.
    """
    known = teams or {}
    mine = [
        e for e in events if not isinstance(e, GpuAssigned | GpuReleased) and e.job_id == job_id
    ]
    if not mine:
        return Explanation(
            job_id,
            None,
            f"The ledger holds no scheduler events for {job_name(job_id)}. Jobs run outside "
            "Tally's scheduler (or before its events were archived) have costs but no queue "
            "history.",
            "",
            (),
        )
    (row,) = fold_jobs(mine)
    headline, advice = _headline(row, as_of_us, known)
    timeline = tuple(
        TimelineEntry(e.time_us, text) for e in mine if (text := _event_text(e, known)) is not None
    )
    return Explanation(
        job_id,
        row.state,
        headline,
        advice,
        timeline,
        row.waited_total_us(as_of_us),
        len(row.preemptions),
    )
