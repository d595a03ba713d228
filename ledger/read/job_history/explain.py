"""The dashboard's plain-language reading of job events: `explain_job` answers "why is my job
waiting / why was it stopped" for a researcher, with a timeline and advice, and the texts the
Team page uses for waits, outcomes, times and durations.

`scheduler.explain` answers the same question for the CLI from the scheduler's own copy of the
events; this is the same reading in fuller sentences. Every text is English unless a `Translate`
is handed in (`ledger.read.texts`: the dashboard's catalog for its language), and every time is
on UTC's clock unless a zone is (the ledger's, `ledger.timezone`), named either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, tzinfo

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
from ledger.periods import local_time, zone_name
from ledger.read.job_history.fold import JobRow, JobState, fold_jobs
from ledger.read.texts import N_, Translate, english

WAIT_PLAIN: Mapping[WaitReason, str] = {
    WaitReason.NO_CAPACITY: N_("all GPUs of the kind it needs are busy right now"),
    WaitReason.NO_MATCHING_GPUS: N_(
        "no GPUs in the fleet (or in your team's quota) can ever fit "
        "it as submitted: the GPU model, pool or number of GPUs asked for does not exist together"
    ),
    WaitReason.QUOTA_EXHAUSTED: N_(
        "your team is already using all the GPUs its quota allows, and it may not borrow more"
    ),
    WaitReason.COHORT_EXHAUSTED: N_(
        "your team is using its own quota, and the teams it may borrow "
        "from have no unused GPUs to lend right now"
    ),
    WaitReason.QUOTA_LENT: N_(
        "your team's own quota is lent to another team at the moment, and "
        "has not been taken back yet"
    ),
    WaitReason.BUDGET_EXHAUSTED: N_(
        "your team's remaining budget cannot cover what this job is expected to cost"
    ),
    WaitReason.NO_PRICE: N_(
        "your team has a money budget, but this GPU model has no price, so the "
        "job's cost cannot be checked against the budget"
    ),
    WaitReason.TOPOLOGY: N_(
        "enough GPUs are free, but not together in the one node, NVLink "
        "domain or network rail the job requires (`--topology`)"
    ),
    WaitReason.BEHIND_HEAD: N_(
        "its queue is first in, first out, and an earlier job is still "
        "waiting; yours comes after it"
    ),
    WaitReason.TICK_LIMIT: N_(
        "the scheduler starts a bounded number of jobs at a time, and many jobs were "
        "submitted at once; it is looked at again in a moment"
    ),
    WaitReason.UNKNOWN_QUEUE: N_("it names a queue or team the scheduler does not know"),
    WaitReason.PREEMPTED: N_(
        "it was stopped to make room for another job and is back in its queue"
    ),
    WaitReason.RETRYING: N_("it failed and is back in its queue for another attempt"),
}

WAIT_SHORT: Mapping[WaitReason, str] = {
    WaitReason.NO_CAPACITY: N_("GPUs busy"),
    WaitReason.NO_MATCHING_GPUS: N_("can never fit as submitted"),
    WaitReason.QUOTA_EXHAUSTED: N_("team quota in use"),
    WaitReason.COHORT_EXHAUSTED: N_("no quota left to borrow"),
    WaitReason.QUOTA_LENT: N_("team quota lent out"),
    WaitReason.BUDGET_EXHAUSTED: N_("budget used up"),
    WaitReason.NO_PRICE: N_("GPU model has no price"),
    WaitReason.TOPOLOGY: N_("free GPUs not together as required"),
    WaitReason.BEHIND_HEAD: N_("behind an earlier job"),
    WaitReason.TICK_LIMIT: N_("many jobs starting, next in a moment"),
    WaitReason.UNKNOWN_QUEUE: N_("unknown queue or team"),
    WaitReason.PREEMPTED: N_("stopped for another job, back in queue"),
    WaitReason.RETRYING: N_("failed, waiting to retry"),
}
NOT_YET_CONSIDERED = N_("not looked at yet")

WAIT_ADVICE: Mapping[WaitReason, str] = {
    WaitReason.NO_CAPACITY: N_(
        "Nothing is wrong with the job: it starts as soon as enough GPUs "
        "free up. Asking for fewer GPUs, or for any GPU model, can let it start sooner."
    ),
    WaitReason.NO_MATCHING_GPUS: N_(
        "It will not start as it is. Cancel it (`tally job cancel`) "
        "and submit it again with fewer GPUs or another GPU model or pool."
    ),
    WaitReason.QUOTA_EXHAUSTED: N_(
        "It starts when one of your team's own jobs ends and gives "
        "its GPUs back. If this happens often, ask your platform team about a larger quota."
    ),
    WaitReason.COHORT_EXHAUSTED: N_(
        "It starts when your team's own jobs or other teams' jobs give GPUs back."
    ),
    WaitReason.QUOTA_LENT: N_(
        "The scheduler takes your quota back from the borrowing team; the "
        "job starts once those GPUs are free again."
    ),
    WaitReason.BUDGET_EXHAUSTED: N_(
        "Ask whoever manages your team's budget for a grant, or "
        "submit the job with a shorter runtime estimate (`--estimate`)."
    ),
    WaitReason.NO_PRICE: N_(
        "Your platform team needs to set a price for this GPU model "
        "(`prices:` in the configuration)."
    ),
    WaitReason.TOPOLOGY: N_(
        "It starts when enough GPUs free up together. Requiring less "
        "(`--topology rail` instead of `nvlink`, or none) can let it start sooner."
    ),
    WaitReason.BEHIND_HEAD: N_("Nothing to do: it moves up as the jobs ahead of it start."),
    WaitReason.TICK_LIMIT: N_("Nothing to do: it starts as soon as the jobs before it have."),
    WaitReason.UNKNOWN_QUEUE: N_(
        "Cancel it and submit it again to a queue that exists (`tally queue list` shows them)."
    ),
    WaitReason.PREEMPTED: N_(
        "Nothing to do: it restarts by itself when GPUs are free again. "
        "Jobs that save checkpoints often lose less work when they are stopped."
    ),
    WaitReason.RETRYING: N_(
        "Nothing to do now; if it keeps failing, look at its log (`.tally/scheduler/logs`)."
    ),
}

PREEMPT_PLAIN: Mapping[PreemptReason, str] = {
    PreemptReason.RECLAIM_LENT_QUOTA: N_(
        "your team was running on quota borrowed from another "
        "team, and that team needed its GPUs back"
    ),
    PreemptReason.HIGHER_PRIORITY: N_("a job with a higher priority needed the GPUs"),
    PreemptReason.OVER_BUDGET: N_(
        "it was running beyond your team's budget, so any other job may take its GPUs"
    ),
    PreemptReason.GPU_UNHEALTHY: N_(
        "a GPU it ran on became unhealthy; this does not count as a retry"
    ),
}

FAIL_PLAIN: Mapping[FailReason, str] = {
    FailReason.EXIT_NONZERO: N_("the program stopped with an error"),
    FailReason.MAX_RUNTIME: N_("it ran longer than its queue's maximum runtime and was stopped"),
    FailReason.EXECUTOR_LOST: N_(
        "the scheduler lost track of its processes (for example, after a restart)"
    ),
    FailReason.CANCELLED: N_("it was cancelled"),
}


def outcome_text(row: JobRow, tr: Translate = english) -> str:
    """How an ended job ended, in a few words (its state for one that has not ended)."""
    if row.state is JobState.FAILED and row.fail_reason is not None:
        return tr("failed: {reason}").format(
            reason=tr(FAIL_PLAIN[row.fail_reason]) + _exit_code(row.exit_code, tr)
        )
    if row.state is JobState.RECLAIMED:
        return tr("stopped: its GPUs sat idle")
    return state_text(row.state, tr)


STATE_TEXT: Mapping[JobState, str] = {
    JobState.WAITING: N_("waiting"),
    JobState.STARTING: N_("starting"),
    JobState.RUNNING: N_("running"),
    JobState.FINISHED: N_("finished"),
    JobState.FAILED: N_("failed"),
    JobState.CANCELLED: N_("cancelled"),
    JobState.RECLAIMED: N_("reclaimed"),
}


def state_text(state: JobState, tr: Translate = english) -> str:
    """A job state for people: its value in English (`running`), else translated."""
    return tr(STATE_TEXT[state]) if state in STATE_TEXT else state.value


def _exit_code(code: int | None, tr: Translate) -> str:
    return "" if code is None else tr(" (exit code {code})").format(code=code)


def wait_text(row: JobRow, tr: Translate = english) -> str:
    """Why a waiting job waits, in a few words."""
    return tr(NOT_YET_CONSIDERED if row.wait_reason is None else WAIT_SHORT[row.wait_reason])


def when_text(time_us: int, zone: tzinfo = UTC) -> str:
    """An instant to the minute on `zone`'s clock, the zone named: `2026-11-30 22:05
    Asia/Shanghai`."""
    return f"{local_time(time_us, zone):%Y-%m-%d %H:%M} {zone_name(zone)}"


def duration_text(us: int, tr: Translate = english) -> str:
    """A duration for people: `45 s`, `12 min`, `3 h 05 min`, `2 d 4 h`."""
    seconds = max(0, us) // 1_000_000
    if seconds < 60:
        return tr("{seconds} s").format(seconds=seconds)
    minutes = seconds // 60
    if minutes < 60:
        return tr("{minutes} min").format(minutes=minutes)
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return tr("{hours} h {minutes} min").format(hours=hours, minutes=f"{minutes:02d}")
    days, hours = divmod(hours, 24)
    return tr("{days} d {hours} h").format(days=days, hours=hours)


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


def job_name(job_id: str, tr: Translate = english) -> str:
    """`job-1a2b` as is, `1234` as `job 1234`."""
    return job_id if job_id.lower().startswith("job") else tr("job {id}").format(id=job_id)


def _stopped(by: str, teams: Mapping[str, str], reason: PreemptReason, tr: Translate) -> str:
    if reason is PreemptReason.GPU_UNHEALTHY:
        return tr("Stopped because of GPU {gpu}").format(gpu=by)
    return tr("Stopped to make room for {job}").format(job=_by(by, teams, None, tr))


def _by(
    job_id: str,
    teams: Mapping[str, str],
    reason: PreemptReason | None = None,
    tr: Translate = english,
) -> str:
    if reason is PreemptReason.GPU_UNHEALTHY:  # `by` names the GPU
        return tr("GPU {gpu}").format(gpu=job_id)
    team = teams.get(job_id)
    name = job_name(job_id, tr)
    return tr("{job} of team {team}").format(job=name, team=team) if team else name


def _gpus(n: int, tr: Translate) -> str:
    return (tr("{n} GPU") if n == 1 else tr("{n} GPUs")).format(n=n)


def _note(detail: str | None, tr: Translate) -> str:
    return tr(" (scheduler's note: {note})").format(note=detail) if detail else ""


def _event_text(
    event: JobEvent, teams: Mapping[str, str], tr: Translate, zone: tzinfo
) -> str | None:
    if isinstance(event, JobSubmitted):
        spec = event.spec
        where = tr(" in pool {pool}").format(pool=spec.pool) if spec.pool else ""
        estimate = (
            tr(", expected to run {duration}").format(
                duration=duration_text(spec.estimated_runtime_us, tr)
            )
            if spec.estimated_runtime_us
            else ""
        )
        return tr(
            "Submitted by {user} (project {project}) to queue {queue}, asking for {gpus} of "
            "{model}{where}{one_node}{estimate}."
        ).format(
            user=spec.user,
            project=spec.project,
            queue=spec.queue,
            gpus=_gpus(spec.gpus, tr),
            model=spec.model or tr("any model"),
            where=where,
            one_node="" if spec.span_nodes else tr(" on one node"),
            estimate=estimate,
        )
    if isinstance(event, JobWaiting):
        return tr("Waiting because {reason}{note}.").format(
            reason=tr(WAIT_PLAIN[event.reason]), note=_note(event.detail, tr)
        )
    if isinstance(event, JobAdmitted):
        borrowed = (
            tr(", {borrowed} of them borrowed from other teams' unused quota").format(
                borrowed=event.borrowed_gpus
            )
            if event.borrowed_gpus
            else ""
        )
        risk = (
            tr(" It runs beyond the team's budget, so other jobs may stop it.")
            if event.over_budget
            else (
                tr(" It may be stopped for other jobs (preemptible).") if event.preemptible else ""
            )
        )
        attempt = (
            tr(" (attempt {attempt})").format(attempt=event.attempt) if event.attempt > 1 else ""
        )
        return tr("Given {gpus} of {model} in pool {pool}{borrowed}{attempt}.{risk}").format(
            gpus=_gpus(len(event.gpu_uuids), tr),
            model=event.model,
            pool=event.pool,
            borrowed=borrowed,
            attempt=attempt,
            risk=risk,
        )
    if isinstance(event, JobStarted):
        return tr("Started running.")
    if isinstance(event, JobPreempted):
        return tr("{stopped}: {reason}{note}. It went back to its queue.").format(
            stopped=_stopped(event.by, teams, event.reason, tr),
            reason=tr(PREEMPT_PLAIN[event.reason]),
            note=_note(event.detail, tr),
        )
    if isinstance(event, JobReclaimed):
        return tr(
            "Stopped because its GPUs sat allocated but unused since {since}; it is not requeued."
        ).format(since=when_text(event.idle_since_us, zone))
    if isinstance(event, JobFinished):
        return tr("Finished.")
    if isinstance(event, JobFailed):
        after = (
            tr("it goes back to its queue to try again") if event.retry else tr("it is not retried")
        )
        return tr("Ended: {reason}{code}; {after}.").format(
            reason=tr(FAIL_PLAIN[event.reason]), code=_exit_code(event.exit_code, tr), after=after
        )
    return None


def _headline(
    row: JobRow, as_of_us: int, teams: Mapping[str, str], tr: Translate, zone: tzinfo
) -> tuple[str, str]:
    since = row.since_us
    name = job_name(row.job_id, tr)
    at = when_text(since, zone)
    if row.state is JobState.WAITING:
        waited = duration_text(as_of_us - since, tr)
        if row.wait_reason is None:
            text = tr(
                "{job} has been waiting for {waited} (since {since}). No scheduling cycle has "
                "looked at it yet; that normally takes seconds."
            ).format(job=name, waited=waited, since=at)
            advice = ""
        else:
            text = tr(
                "{job} has been waiting for {waited} (since {since}) because {reason}."
            ).format(job=name, waited=waited, since=at, reason=tr(WAIT_PLAIN[row.wait_reason]))
            if row.wait_detail:
                text += tr(" The scheduler's note: {note}.").format(note=row.wait_detail)
            advice = tr(WAIT_ADVICE[row.wait_reason])
        if row.preemptions:
            last = row.preemptions[-1]
            text += tr(" It was last stopped at {when} by {by} because {reason}.").format(
                when=when_text(last.time_us, zone),
                by=_by(last.by, teams, last.reason, tr),
                reason=tr(PREEMPT_PLAIN[last.reason]),
            )
        return text, advice
    held = _gpus(len(row.gpu_uuids) or row.gpus, tr)
    if row.gpu_share is not None:
        held = tr("a {share} share of one GPU").format(share=share_text(row.gpu_share))
    place = tr("{gpus} of {model} in pool {pool}").format(gpus=held, model=row.model, pool=row.pool)
    if row.state is JobState.STARTING:
        return tr("{job} has been given {place} and is starting.").format(job=name, place=place), ""
    if row.state is JobState.RUNNING:
        text = tr("{job} is running on {place} since {since} ({duration}).").format(
            job=name, place=place, since=at, duration=duration_text(as_of_us - since, tr)
        )
        if row.over_budget:
            text += tr(" It runs beyond your team's budget, so other jobs may stop it.")
        return text, ""
    ran = duration_text(row.ran_us, tr)
    if row.state is JobState.FINISHED:
        return tr("{job} finished at {when} after running {ran}.").format(
            job=name, when=at, ran=ran
        ), ""
    if row.state is JobState.RECLAIMED:
        return (
            tr(
                "{job} was stopped at {when} because its GPUs sat allocated but unused; it is "
                "not requeued."
            ).format(job=name, when=at),
            tr(
                "Submit it again when it is ready to use its GPUs; idle GPUs are reclaimed for "
                "others."
            ),
        )
    reason = (
        tr(FAIL_PLAIN[row.fail_reason]) if row.fail_reason else tr("it ended without finishing")
    )
    if row.state is JobState.CANCELLED:
        return tr("{job} was cancelled at {when}.").format(job=name, when=at), ""
    return (
        tr("{job} failed at {when}: {reason}{code}.").format(
            job=name, when=at, reason=reason, code=_exit_code(row.exit_code, tr)
        ),
        tr("Its log is in `.tally/scheduler/logs` (local executor) or Slurm's output file."),
    )


def explain_job(
    job_id: str,
    events: Iterable[JobEvent],
    as_of_us: int,
    teams: Mapping[str, str] | None = None,
    tr: Translate = english,
    zone: tzinfo = UTC,
) -> Explanation:
    """Why `job_id` waits, runs, was stopped or ended, from job events in publication order.

    `as_of_us` is "now" (how long the current wait has lasted); `teams` names the team of other
    jobs (the preemptor's), where known; `tr` is the reader's language (English by default);
    `zone` the clock its times are on (UTC by default).
    """
    known = teams or {}
    mine = [
        e for e in events if not isinstance(e, GpuAssigned | GpuReleased) and e.job_id == job_id
    ]
    if not mine:
        return Explanation(
            job_id,
            None,
            tr(
                "The ledger holds no scheduler events for {job}. Jobs run outside Tally's "
                "scheduler (or before its events were archived) have costs but no queue history."
            ).format(job=job_name(job_id, tr)),
            "",
            (),
        )
    (row,) = fold_jobs(mine)
    headline, advice = _headline(row, as_of_us, known, tr, zone)
    timeline = tuple(
        TimelineEntry(e.time_us, text)
        for e in mine
        if (text := _event_text(e, known, tr, zone)) is not None
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
