"""The dashboard's plain-language reading of job events: `explain_job` answers "why is my job
waiting / why was it stopped" for a researcher, with a timeline and advice, and the texts the
Team page uses for waits, outcomes, times and durations.

`scheduler.explain` answers the same question for the CLI from the scheduler's own copy of the
events; this is the same reading in fuller sentences.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
)
from ledger.read.job_history.fold import JobRow, JobState, fold_jobs

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
    WaitReason.TOPOLOGY: "enough GPUs are free, but not together in the one node, NVLink "
    "domain or network rail the job requires (`--topology`)",
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
    WaitReason.TOPOLOGY: "free GPUs not together as required",
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
    WaitReason.TOPOLOGY: "It starts when enough GPUs free up together. Requiring less "
    "(`--topology rail` instead of `nvlink`, or none) can let it start sooner.",
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
    PreemptReason.GPU_UNHEALTHY: "a GPU it ran on became unhealthy; this does not count as a retry",
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


def _stopped(by: str, teams: Mapping[str, str], reason: PreemptReason) -> str:
    if reason is PreemptReason.GPU_UNHEALTHY:
        return f"Stopped because of GPU {by}"
    return f"Stopped to make room for {_by(by, teams)}"


def _by(job_id: str, teams: Mapping[str, str], reason: PreemptReason | None = None) -> str:
    if reason is PreemptReason.GPU_UNHEALTHY:  # `by` names the GPU
        return f"GPU {job_id}"
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
            f"{_stopped(event.by, teams, event.reason)}: {PREEMPT_PLAIN[event.reason]}"
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
                f" It was last stopped at {when_text(last.time_us)} "
                f"by {_by(last.by, teams, last.reason)} "
                f"because {PREEMPT_PLAIN[last.reason]}."
            )
        return text, advice
    held = _gpus(len(row.gpu_uuids) or row.gpus)
    if row.gpu_share is not None:
        held = f"a {share_text(row.gpu_share)} share of one GPU"
    place = f"{held} of {row.model} in pool {row.pool}"
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
