"""`explain`: why is my job waiting, why was it preempted — answered from the job's events.

The answer is plain text for people (the CLI's `tally job explain`): what the job asked for,
where it stands now, the reason and detail of its latest wait, and its history — including,
for a job that accepted several GPU models, why it was placed on the one it got.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from ledger.fractional import share_text
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
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
)

WAIT_TEXT: dict[WaitReason, str] = {
    WaitReason.NO_CAPACITY: "not enough free GPUs of a matching model right now",
    WaitReason.NO_MATCHING_GPUS: "no GPUs in the fleet (or the team's quota) can ever hold it",
    WaitReason.QUOTA_EXHAUSTED: "the team's quota is in use and it cannot borrow more",
    WaitReason.COHORT_EXHAUSTED: "the team's quota is in use and the cohort has none to lend",
    WaitReason.QUOTA_LENT: "the team's quota is lent to its cohort and not yet taken back",
    WaitReason.BUDGET_EXHAUSTED: "the team's budget cannot cover the job's expected cost",
    WaitReason.NO_PRICE: "the team has a money budget but the GPU model has no price",
    WaitReason.TOPOLOGY: "enough GPUs are free, but not in the one node, NVLink domain or rail "
    "the job requires",
    WaitReason.BEHIND_HEAD: "an earlier job waits first (first in, first out)",
    WaitReason.TICK_LIMIT: "the tick had admitted its cap of jobs (`scheduler.admissions_per_tick`)"
    "; it is looked at in the next one",
    WaitReason.UNKNOWN_QUEUE: "the job names a queue or team that is not configured",
    WaitReason.PREEMPTED: "it was preempted and is back in its queue",
    WaitReason.RETRYING: "it failed and is back in its queue for another attempt",
}

PREEMPT_TEXT: dict[PreemptReason, str] = {
    PreemptReason.RECLAIM_LENT_QUOTA: "its team was borrowing quota the lender took back",
    PreemptReason.HIGHER_PRIORITY: "a higher-priority job needed the GPUs",
    PreemptReason.OVER_BUDGET: "it ran over budget, and another job needed the GPUs",
    PreemptReason.GPU_UNHEALTHY: "a GPU it held went unhealthy (it does not count as a retry)",
}


def _when(time_us: int) -> str:
    stamp = datetime.fromtimestamp(time_us / 1_000_000, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _line(event: JobEvent) -> str | None:
    at = _when(event.time_us)
    if isinstance(event, JobSubmitted):
        return f"{at}  submitted"
    if isinstance(event, JobWaiting):
        detail = f" ({event.detail})" if event.detail else ""
        return f"{at}  waiting: {event.reason.value}{detail}"
    if isinstance(event, JobAdmitted):
        how = " over budget, preemptible" if event.over_budget else ""
        borrowed = f", {event.borrowed_gpus} borrowed" if event.borrowed_gpus else ""
        placement = f"\n    {event.placement}" if event.placement else ""
        return (
            f"{at}  admitted (attempt {event.attempt}) on {len(event.gpu_uuids)} GPU(s) of "
            f"{event.pool}/{event.model}{borrowed}{how}{placement}"
        )
    if isinstance(event, JobStarted):
        return f"{at}  started"
    if isinstance(event, JobPreempted):
        return (
            f"{at}  preempted by {_preempter(event)}: {event.reason.value} — "
            f"{PREEMPT_TEXT[event.reason]}" + (f" ({event.detail})" if event.detail else "")
        )
    if isinstance(event, JobReclaimed):
        return f"{at}  reclaimed: its GPUs were allocated but idle ({event.detail})"
    if isinstance(event, JobFinished):
        return f"{at}  finished"
    if isinstance(event, JobFailed):
        retry = "retrying" if event.retry else "not retried"
        code = f", exit code {event.exit_code}" if event.exit_code is not None else ""
        detail = f" ({event.detail})" if event.detail else ""
        return f"{at}  failed: {event.reason.value}{code}{detail}; {retry}"
    return None


def explain(job_id: str, events: Iterable[JobEvent]) -> str:
    """Why `job_id` waits, runs, was preempted or ended, from the job's events (any order)."""
    mine = sorted(
        (e for e in events if not isinstance(e, GpuAssigned | GpuReleased) and e.job_id == job_id),
        key=lambda e: e.time_us,
    )
    if not mine:
        return f"job {job_id}: no events — unknown job"
    lines: list[str] = []
    spec = next((e.spec for e in mine if isinstance(e, JobSubmitted)), None)
    if spec is not None:
        model = "|".join(spec.accepted_models) or "any model"
        lines.append(
            f"job {job_id}: team {spec.team}, project {spec.project}, user {spec.user}, "
            f"queue {spec.queue}, {_asked(spec)} of {model}"
            + ("" if spec.span_nodes else " on one node")
        )
    else:
        lines.append(f"job {job_id}")
    lines.append(_status(mine))
    lines.append("history:")
    lines.extend(f"  {text}" for text in map(_line, mine) if text is not None)
    return "\n".join(lines)


def _asked(spec: JobSpec) -> str:
    """What a job asks for: `2 GPU(s)`, or a share of one GPU (`0.25 of a GPU`)."""
    if spec.gpu_share is not None:
        return f"{share_text(spec.gpu_share)} of a GPU"
    return f"{spec.gpus} GPU(s)"


def _status(events: Sequence[JobEvent]) -> str:
    last_wait: JobWaiting | None = None
    last_preempt: JobPreempted | None = None
    placed = ""
    state = "waiting"
    for event in events:
        if isinstance(event, JobWaiting):
            last_wait = event
        elif isinstance(event, JobAdmitted):
            state, last_wait = "running", None
            placed = f" on {event.pool}/{event.model}" + (
                f" — {event.placement}" if event.placement else ""
            )
        elif isinstance(event, JobPreempted):
            state, last_preempt, last_wait = "waiting", event, None
        elif isinstance(event, JobFinished):
            state = "finished"
        elif isinstance(event, JobReclaimed):
            state = "reclaimed"
        elif isinstance(event, JobFailed):
            if event.retry:
                state, last_wait = "waiting", None
            else:
                state = "cancelled" if event.reason is FailReason.CANCELLED else "failed"
    if state == "running":
        return f"now: running{placed}"
    if state != "waiting":
        return f"now: {state}"
    if last_wait is not None:
        why = (
            f"now: waiting since {_when(last_wait.time_us)} because " + WAIT_TEXT[last_wait.reason]
        )
        if last_wait.detail:
            why += f" — {last_wait.detail}"
    else:
        why = "now: waiting (not yet considered by a scheduling cycle)"
    if last_preempt is not None:
        why += (
            f"\nlast preempted at {_when(last_preempt.time_us)} by job {last_preempt.by} because "
            f"{PREEMPT_TEXT[last_preempt.reason]}"
        )
    return why


def _preempter(event: JobPreempted) -> str:
    if event.reason is PreemptReason.GPU_UNHEALTHY:
        return f"GPU {event.by}"
    return f"job {event.by}"
