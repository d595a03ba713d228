"""Comparing what happened with what a replay says, and one replay with another.

- `divergences`: the recorded first admissions against a replay's, job by job, each difference
  with its cause (the reason the replay, or the record, gave the job for waiting at the time
  the other admitted it, and for a job one side never admitted also the last one; in the
  replay also `cycle_limit`: its tick ran out of cycles, `Limit.CYCLES`);
  a time difference within `tolerance_us` (a live tick comes a moment after the replay's: the
  submit's publishing, the previous tick's length) is no divergence;
- `same_decisions`: whether two replays admitted and preempted exactly alike;
- `comparison_rows`: baseline vs alternative, one row per (metric, scope), values as text;
- `wait_flags` and `capacity_sentence`: what adding GPUs did to the waits.

The words are `scheduler.whatif.texts`' (English unless a `Translate` is handed in). Pure:
values in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.job_events import WaitReason
from ledger.read.texts import Translate, english
from ledger.units import MS_PER_HOUR, format_micros
from scheduler.whatif.history import Admission, Why
from scheduler.whatif.metrics import Metrics, Overrun
from scheduler.whatif.replay import Outcome
from scheduler.whatif.texts import (
    Cause,
    capacity_text,
    cause_text,
    flag_text,
    gpu_hours_text,
    reasons_words,
    wait_text,
    where_text,
    why_code,
)

COLUMNS = ("metric", "scope", "baseline", "alternative")


@dataclass(frozen=True, slots=True)
class Divergence:
    """A job whose first admission differs between the record and a replay: each side's first
    admission (None: not admitted in the window), how they differ, and the wait reason behind
    it at the time (None: the job was not yet considered)."""

    job_id: str
    recorded_first: Admission | None
    replayed_first: Admission | None
    kind: Cause
    why: Why | None
    since_us: int  # the window's start: admissions are said as time after it
    then: tuple[Why | None, ...] = ()  # a job never admitted: its last reason, if other

    @property
    def recorded(self) -> str:
        """`+3 h 05 min on main/H100`, or `not admitted` (the report's words)."""
        return where_text(self.recorded_first, self.since_us)

    @property
    def replayed(self) -> str:
        return where_text(self.replayed_first, self.since_us)

    @property
    def cause(self) -> str:
        """The cause as the report says it, the wait reason by its code (`no_capacity`)."""
        code = ", then ".join(why_code(w) for w in (self.why, *self.then))
        return cause_text(self.kind, code, self.recorded_first, self.replayed_first)

    def said(self, tr: Translate = english) -> tuple[str, str, str, str]:
        """Job, recorded, replayed and cause as a table says them: the wait reason in words."""
        since, rec, rep = self.since_us, self.recorded_first, self.replayed_first
        return (
            self.job_id,
            where_text(rec, since, tr),
            where_text(rep, since, tr),
            cause_text(self.kind, reasons_words(self.why, self.then, tr), rec, rep, tr),
        )


def _reason_at(reasons: tuple[tuple[str, Why, int], ...], job_id: str, at_us: int) -> Why | None:
    latest = None
    for job, reason, time_us in reasons:
        if job == job_id and time_us <= at_us:
            latest = reason
    return latest


def _reasons(
    reasons: tuple[tuple[str, Why, int], ...],
    job_id: str,
    at_us: int,
    tolerance_us: int,
    end_us: int,
) -> tuple[Why | None, tuple[Why | None, ...]]:
    """The wait reason in force when the other side admitted the job (or, when none was yet,
    the first given within the tolerance after), and the last one when it changed: a job the
    live tick's cap left out says `tick_limit, then cohort_exhausted`."""
    found = _reason_at(reasons, job_id, at_us)
    if found is None:
        found = next(
            (r for j, r, t in reasons if j == job_id and at_us < t <= at_us + tolerance_us), None
        )
    end = _reason_at(reasons, job_id, end_us)
    return found, (() if end == found else (end,))


def divergences(
    recorded: tuple[Admission, ...],
    recorded_waits: tuple[tuple[str, WaitReason, int], ...],
    outcome: Outcome,
    tolerance_us: int,
) -> tuple[Divergence, ...]:
    """Every job whose first admission differs between the record and the replay."""
    mine = {a.job_id: a for a in recorded}
    theirs = {a.job_id: a for a in outcome.admissions}
    out = []
    for job_id in sorted(set(mine) | set(theirs)):
        rec, rep = mine.get(job_id), theirs.get(job_id)
        why: Why | None = None
        then: tuple[Why | None, ...] = ()
        if rec is not None and rep is not None:
            if (rec.pool, rec.model) != (rep.pool, rep.model):
                kind = Cause.ELSEWHERE
            elif abs(rec.time_us - rep.time_us) <= tolerance_us:
                continue
            elif rep.time_us > rec.time_us:
                kind = Cause.REPLAY_WAITED
                why = _reason_at(outcome.wait_reasons, job_id, rec.time_us)
            else:
                kind = Cause.RECORD_WAITED
                why = _reason_at(recorded_waits, job_id, rep.time_us)
        elif rec is not None:
            kind = Cause.REPLAY_NEVER
            why, then = _reasons(
                outcome.wait_reasons, job_id, rec.time_us, tolerance_us, outcome.until_us
            )
        else:
            assert rep is not None
            kind = Cause.RECORD_NEVER
            end = outcome.until_us
            why, then = _reasons(recorded_waits, job_id, rep.time_us, tolerance_us, end)
        out.append(Divergence(job_id, rec, rep, kind, why, outcome.since_us, then))
    return tuple(out)


def same_decisions(a: Outcome, b: Outcome) -> bool:
    """Whether two replays admitted the same jobs at the same times on the same models, and
    preempted the same jobs at the same times."""
    return a.admissions == b.admissions and a.preemption_events == b.preemption_events


def gpu_hours(gpu_ms: int) -> str:
    """GPU-ms as GPU-hours with three decimals, exactly (truncated)."""
    whole, rest = divmod(gpu_ms, MS_PER_HOUR)
    return f"{whole}.{rest * 1000 // MS_PER_HOUR:03d}"


def comparison_rows(
    a: Metrics, b: Metrics, tr: Translate = english
) -> list[tuple[str, str, str, str]]:
    """(metric code, scope, baseline, alternative): the values in `tr`'s words (waits, GPU-h),
    the metric and scope as codes (`ledger.read.whatif_words.metric_name` says them)."""

    def wait(us: int) -> str:
        return wait_text(us, tr)

    def overrun(o: Overrun | None) -> str:
        if o is None:
            return "-"
        parts = []
        if o.money_micros:
            parts.append(format_micros(o.money_micros))
        if o.gpu_ms:
            parts.append(gpu_hours_text(gpu_hours(o.gpu_ms), tr))
        return " + ".join(parts)

    rows: list[tuple[str, str, str, str]] = []
    for team in sorted(set(a.gpu_ms) | set(b.gpu_ms)):
        rows.append(
            ("gpu_hours", team, gpu_hours(a.gpu_ms.get(team, 0)), gpu_hours(b.gpu_ms.get(team, 0)))
        )
        rows.append(
            (
                "cost",
                team,
                format_micros(a.cost_micros.get(team, 0)),
                format_micros(b.cost_micros.get(team, 0)),
            )
        )
    for label, ours, other in (
        ("team", a.delay_by_team, b.delay_by_team),
        ("queue", a.delay_by_queue, b.delay_by_queue),
    ):
        for name in sorted(set(ours) | set(other)):
            x, y = ours.get(name), other.get(name)
            for q in ("p50", "p95"):
                rows.append(
                    (
                        f"wait_{q}",
                        f"{label}:{name}",
                        "-" if x is None else wait(getattr(x, f"{q}_us")),
                        "-" if y is None else wait(getattr(y, f"{q}_us")),
                    )
                )
    rows.append(("wait_p50", "all", wait(a.delay_all.p50_us), wait(b.delay_all.p50_us)))
    rows.append(("wait_p95", "all", wait(a.delay_all.p95_us), wait(b.delay_all.p95_us)))
    rows.append(("utilisation", "fleet", _pct(a.utilisation_bp), _pct(b.utilisation_bp)))
    rows.append(("preemptions", "all", str(a.preemptions), str(b.preemptions)))
    rows.append(("gpu_hours_lost", "all", gpu_hours(a.lost_gpu_ms), gpu_hours(b.lost_gpu_ms)))
    rows.append(("jain_fairness", "teams", _permille(a.jain_permille), _permille(b.jain_permille)))
    over_a = {o.team: o for o in a.overruns}
    over_b = {o.team: o for o in b.overruns}
    for team in sorted(set(over_a) | set(over_b)):
        rows.append(("budget_overrun", team, overrun(over_a.get(team)), overrun(over_b.get(team))))
    return rows


def _pct(bp: int) -> str:
    return f"{bp // 100}.{bp % 100:02d}%"


def _permille(value: int) -> str:
    return f"{value // 1000}.{value % 1000:03d}"


def wait_flags(a: Metrics, b: Metrics, tr: Translate = english) -> tuple[str, ...]:
    """Teams whose p95 wait rose from baseline to alternative."""
    return tuple(
        flag_text(team, x.p95_us, y.p95_us, tr)
        for team, x in a.delay_by_team.items()
        if (y := b.delay_by_team.get(team)) is not None and y.p95_us > x.p95_us
    )


def capacity_sentence(
    added: dict[str, int], a: Metrics, b: Metrics, tr: Translate = english
) -> str:
    """ "adding N GPUs of model M would cut p95 wait from X to Y" (or not cut it)."""
    return capacity_text(added, a.delay_all.p95_us, b.delay_all.p95_us, tr)
