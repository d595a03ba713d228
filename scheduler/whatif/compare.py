"""Comparing what happened with what a replay says, and one replay with another.

- `divergences`: the recorded first admissions against a replay's, job by job, each difference
  with its cause (the reason the replay, or the record, gave the job for waiting at the time
  the other admitted it, and for a job one side never admitted also the last one);
  a time difference within `tolerance_us` (the live scheduler decides every cycle interval,
  the replay at once) is no divergence;
- `same_decisions`: whether two replays admitted and preempted exactly alike;
- `comparison_rows`: baseline vs alternative, one row per (metric, scope), values as text;
- `wait_flags` and `capacity_sentence`: what adding GPUs did to the waits.

Pure: values in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.job_events import WaitReason
from ledger.read.job_history import duration_text
from ledger.units import MS_PER_HOUR, format_micros
from scheduler.whatif.history import Admission
from scheduler.whatif.metrics import Metrics, Overrun
from scheduler.whatif.replay import Outcome

COLUMNS = ("metric", "scope", "baseline", "alternative")


@dataclass(frozen=True, slots=True)
class Divergence:
    job_id: str
    recorded: str  # "12:00:05 on main/H100", or "not admitted"
    replayed: str
    cause: str


def _reason_at(
    reasons: tuple[tuple[str, WaitReason, int], ...], job_id: str, at_us: int
) -> WaitReason | None:
    latest = None
    for job, reason, time_us in reasons:
        if job == job_id and time_us <= at_us:
            latest = reason
    return latest


def _reasons(
    reasons: tuple[tuple[str, WaitReason, int], ...],
    job_id: str,
    at_us: int,
    tolerance_us: int,
    end_us: int,
) -> str:
    """The wait reason in force when the other side admitted the job (or, when none was yet,
    the first given within the tolerance after), then the last one when it changed: a job the
    live tick's cap left out says `tick_limit, then cohort_exhausted`."""
    found = _reason_at(reasons, job_id, at_us)
    if found is None:
        found = next(
            (r for j, r, t in reasons if j == job_id and at_us < t <= at_us + tolerance_us), None
        )
    at = found or "not yet considered"
    end = _reason_at(reasons, job_id, end_us) or "not yet considered"
    return at if at == end else f"{at}, then {end}"


def _where(a: Admission | None, since_us: int) -> str:
    if a is None:
        return "not admitted"
    return f"+{duration_text(a.time_us - since_us)} on {a.pool}/{a.model}"


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
        if rec is not None and rep is not None:
            if (rec.pool, rec.model) != (rep.pool, rep.model):
                cause = f"placed on {rep.pool}/{rep.model} instead of {rec.pool}/{rec.model}"
            elif abs(rec.time_us - rep.time_us) <= tolerance_us:
                continue
            elif rep.time_us > rec.time_us:
                why = _reason_at(outcome.wait_reasons, job_id, rec.time_us)
                cause = f"the replay kept it waiting ({why or 'not yet considered'})"
            else:
                why = _reason_at(recorded_waits, job_id, rep.time_us)
                cause = f"the record kept it waiting ({why or 'not yet considered'})"
        elif rec is not None:
            end = outcome.until_us
            last = _reasons(outcome.wait_reasons, job_id, rec.time_us, tolerance_us, end)
            cause = f"the replay never admitted it ({last})"
        else:
            assert rep is not None
            last = _reasons(recorded_waits, job_id, rep.time_us, tolerance_us, outcome.until_us)
            cause = f"never admitted in the record ({last})"
        since = outcome.since_us
        out.append(Divergence(job_id, _where(rec, since), _where(rep, since), cause))
    return tuple(out)


def same_decisions(a: Outcome, b: Outcome) -> bool:
    """Whether two replays admitted the same jobs at the same times on the same models, and
    preempted the same jobs at the same times."""
    return a.admissions == b.admissions and a.preemption_events == b.preemption_events


def gpu_hours(gpu_ms: int) -> str:
    """GPU-ms as GPU-hours with three decimals, exactly (truncated)."""
    whole, rest = divmod(gpu_ms, MS_PER_HOUR)
    return f"{whole}.{rest * 1000 // MS_PER_HOUR:03d}"


def _wait(us: int) -> str:
    return duration_text(us)


def comparison_rows(a: Metrics, b: Metrics) -> list[tuple[str, str, str, str]]:
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
                        "-" if x is None else _wait(getattr(x, f"{q}_us")),
                        "-" if y is None else _wait(getattr(y, f"{q}_us")),
                    )
                )
    rows.append(("wait_p50", "all", _wait(a.delay_all.p50_us), _wait(b.delay_all.p50_us)))
    rows.append(("wait_p95", "all", _wait(a.delay_all.p95_us), _wait(b.delay_all.p95_us)))
    rows.append(
        (
            "utilisation",
            "fleet",
            _pct(a.utilisation_bp),
            _pct(b.utilisation_bp),
        )
    )
    rows.append(("preemptions", "all", str(a.preemptions), str(b.preemptions)))
    rows.append(("gpu_hours_lost", "all", gpu_hours(a.lost_gpu_ms), gpu_hours(b.lost_gpu_ms)))
    rows.append(("jain_fairness", "teams", _permille(a.jain_permille), _permille(b.jain_permille)))
    over_a = {o.team: o for o in a.overruns}
    over_b = {o.team: o for o in b.overruns}
    for team in sorted(set(over_a) | set(over_b)):
        row = ("budget_overrun", team, _overrun(over_a.get(team)), _overrun(over_b.get(team)))
        rows.append(row)
    return rows


def _pct(bp: int) -> str:
    return f"{bp // 100}.{bp % 100:02d}%"


def _permille(value: int) -> str:
    return f"{value // 1000}.{value % 1000:03d}"


def _overrun(o: Overrun | None) -> str:
    if o is None:
        return "-"
    parts = []
    if o.money_micros:
        parts.append(format_micros(o.money_micros))
    if o.gpu_ms:
        parts.append(f"{gpu_hours(o.gpu_ms)} GPU-h")
    return " + ".join(parts)


def wait_flags(a: Metrics, b: Metrics) -> tuple[str, ...]:
    """Teams whose p95 wait rose from baseline to alternative."""
    return tuple(
        f"team {team}: p95 wait rose from {_wait(x.p95_us)} to {_wait(y.p95_us)}"
        for team, x in a.delay_by_team.items()
        if (y := b.delay_by_team.get(team)) is not None and y.p95_us > x.p95_us
    )


def capacity_sentence(added: dict[str, int], a: Metrics, b: Metrics) -> str:
    """ "adding N GPUs of model M would cut p95 wait from X to Y" (or not cut it)."""
    what = " and ".join(f"{n} GPUs of model {m}" for m, n in sorted(added.items()))
    x, y = a.delay_all.p95_us, b.delay_all.p95_us
    if x == y:
        return f"adding {what} would leave p95 wait at {_wait(x)}"
    verb = "cut" if y < x else "raise"
    return f"adding {what} would {verb} p95 wait from {_wait(x)} to {_wait(y)}"
