"""When budget burn, idle GPU time and waiting jobs raise alerts: pure decisions on plain values
(`ledger.fleet_alerts` holds the alerts themselves).

Budget burn (per team, period and budgeted unit, from the team's `BudgetStatus`):
- a threshold `p` is crossed when `consumed × 100 ≥ granted × p` (integers, exact); each
  threshold fires once per team, period and unit (`BudgetMemory.fired`), never resolves;
- "forecast to exceed before period end": at the average burn rate since the period began,
  `consumed × (end − start) > granted × (now − start)`, while `consumed < granted` (an overrun
  is the 100 % threshold's news) and at least `forecast_after_pct` of the period has passed (a
  period's first hours say little about its rate). It resolves when the inequality stops
  holding (a grant, a slower burn) or the budget is reached;
- `forecast_at_end` and `exceed_at` give the numbers the alert shows (floor and ceiling).

Idle GPU time per team and UTC day: the sum of the team's allocated-but-idle spans (from the
idle-GPU alerts: detection to resolution, or to now while open) overlapping the day, in GPU-ms
(one GPU subject per span: a MIG slice counts as a GPU). Over `threshold_gpu_ms` fires once per
team and day.

Jobs: `job_step` follows the jobs a rule finds (idle past the queue's allowance, pending past
its threshold): one alert when a job's episode starts, one resolution when the job is no
longer found. `overdue` picks the waiting jobs past their queue's threshold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, tzinfo

from ledger.alerts import Alert
from ledger.balances import BudgetStatus
from ledger.fleet_alerts import BudgetAlert, FleetKind, JobAlert, TeamIdleAlert
from ledger.periods import Period, local_day_start

DAY_US = 86_400_000_000


# ------------------------------------------------------------------------------- budget burn


@dataclass(frozen=True, slots=True)
class BudgetRules:
    thresholds_pct: tuple[int, ...] = (50, 80, 100)
    forecast: bool = True
    forecast_after_pct: int = 10
    zone: tzinfo = UTC  # the ledger's time zone: where a budget's month starts and ends


@dataclass(frozen=True, slots=True)
class BudgetMemory:
    """What a budget watcher remembers: thresholds fired (team, period, unit, pct) and the
    forecasts open (team, period, unit)."""

    fired: frozenset[tuple[str, str, str, int]] = frozenset()
    forecasting: frozenset[tuple[str, str, str]] = frozenset()


def crossed(granted: int, consumed: int, thresholds_pct: Iterable[int]) -> tuple[int, ...]:
    """The thresholds (percent of `granted`) that `consumed` reached, ascending."""
    if granted <= 0:
        return ()
    return tuple(p for p in sorted(set(thresholds_pct)) if consumed * 100 >= granted * p)


def forecast_at_end(consumed: int, start_us: int, end_us: int, now_us: int) -> int | None:
    """What `consumed` becomes by `end_us` at the average rate since `start_us` (floor); None
    before any time has passed."""
    now = min(now_us, end_us)
    if now <= start_us:
        return None
    return consumed * (end_us - start_us) // (now - start_us)


def exceed_at(granted: int, consumed: int, start_us: int, now_us: int) -> int | None:
    """When the average rate since `start_us` reaches `granted` (ceiling); None without a
    rate."""
    if consumed <= 0 or now_us <= start_us:
        return None
    return start_us + -(-granted * (now_us - start_us) // consumed)


def forecast_exceeds(
    granted: int, consumed: int, start_us: int, end_us: int, now_us: int, after_pct: int = 0
) -> bool:
    """Whether the average burn rate overruns `granted` before `end_us` (exact integers)."""
    if granted <= 0 or consumed >= granted or not start_us < now_us < end_us:
        return False
    if (now_us - start_us) * 100 < (end_us - start_us) * after_pct:
        return False
    return consumed * (end_us - start_us) > granted * (now_us - start_us)


def budget_step(
    memory: BudgetMemory, status: BudgetStatus, as_of_us: int, rules: BudgetRules
) -> tuple[BudgetMemory, list[BudgetAlert]]:
    """The alerts `status` (a team's budget at `as_of_us`) raises given what was raised."""
    try:
        period = Period.month(status.period, rules.zone)
    except ValueError:
        return memory, []
    fired, forecasting = set(memory.fired), set(memory.forecasting)
    out: list[BudgetAlert] = []
    for line in status.lines:
        base = BudgetAlert(
            kind=FleetKind.BUDGET_THRESHOLD,
            team=status.team,
            period=status.period,
            unit=line.unit,
            granted=line.granted,
            consumed=line.consumed,
            period_start_us=period.start_us,
            period_end_us=period.end_us,
            at_us=as_of_us,
        )
        for pct in crossed(line.granted, line.consumed, rules.thresholds_pct):
            key = (status.team, status.period, line.unit, pct)
            if key not in fired:
                fired.add(key)
                out.append(replace(base, threshold_pct=pct))
        if not rules.forecast:
            continue
        open_key = (status.team, status.period, line.unit)
        exceeds = forecast_exceeds(
            line.granted,
            line.consumed,
            period.start_us,
            period.end_us,
            as_of_us,
            rules.forecast_after_pct,
        )
        if exceeds == (open_key in forecasting):
            continue
        forecast = forecast_at_end(line.consumed, period.start_us, period.end_us, as_of_us)
        if exceeds:
            forecasting.add(open_key)
            kind = FleetKind.BUDGET_FORECAST
        else:
            forecasting.discard(open_key)
            kind = FleetKind.BUDGET_FORECAST_RESOLVED
        out.append(
            replace(
                base,
                kind=kind,
                forecast=forecast,
                exceed_at_us=exceed_at(line.granted, line.consumed, period.start_us, as_of_us),
            )
        )
    return BudgetMemory(frozenset(fired), frozenset(forecasting)), out


# --------------------------------------------------------------------- idle GPU time per team


@dataclass(frozen=True, slots=True)
class IdleSpan:
    """One allocated-but-idle episode of one GPU subject: `end_us` None while it lasts."""

    team: str
    start_us: int
    end_us: int | None = None


Spans = Mapping[tuple[str, int], IdleSpan]  # by idle episode (GPU subject, since)


def track_idle(spans: Spans, alert: Alert) -> dict[tuple[str, int], IdleSpan]:
    """`spans` (by episode) after one idle-GPU alert: a detection opens a span for its owner's
    team (an unowned GPU is nobody's waste here), a resolution ends it."""
    out = dict(spans)
    if alert.team is None:
        return out
    if alert.resolved:
        out[alert.episode] = IdleSpan(alert.team, alert.since_us, alert.at_us)
    elif alert.episode not in out:
        out[alert.episode] = IdleSpan(alert.team, alert.since_us)
    return out


def idle_gpu_ms(
    spans: Iterable[IdleSpan], start_us: int, end_us: int, now_us: int
) -> dict[str, int]:
    """Per team, the GPU-ms of its spans inside `[start_us, end_us)` (open spans up to
    `now_us`); the sum in µs is floored to ms once per team."""
    total: dict[str, int] = {}
    for span in spans:
        stop = min(span.end_us if span.end_us is not None else now_us, end_us)
        overlap = stop - max(span.start_us, start_us)
        if overlap > 0:
            total[span.team] = total.get(span.team, 0) + overlap
    return {team: us // 1_000 for team, us in total.items()}


@dataclass(frozen=True, slots=True)
class TeamIdleMemory:
    fired: frozenset[tuple[str, int]] = frozenset()  # (team, day start)


def idle_days(now_us: int, zone: tzinfo = UTC) -> tuple[tuple[int, int], tuple[int, int]]:
    """Yesterday and today in the ledger's time zone, as `[start, end)` µs (a day is 23 or 25
    hours long where the clocks change)."""
    today = local_day_start(now_us, zone)
    yesterday = local_day_start(today - 1, zone)
    tomorrow = local_day_start(today + DAY_US + DAY_US // 2, zone)
    return (yesterday, today), (today, tomorrow)


def team_idle_step(
    memory: TeamIdleMemory,
    spans: Iterable[IdleSpan],
    now_us: int,
    threshold_gpu_ms: int,
    zone: tzinfo = UTC,
) -> tuple[TeamIdleMemory, list[TeamIdleAlert]]:
    """Alerts for teams over `threshold_gpu_ms` of idle GPU time today or yesterday (days of the
    ledger's time zone `zone`) that were not raised yet."""
    listed = list(spans)
    fired = set(memory.fired)
    out: list[TeamIdleAlert] = []
    for start, end in idle_days(now_us, zone):
        for team, gpu_ms in sorted(idle_gpu_ms(listed, start, end, now_us).items()):
            if gpu_ms > threshold_gpu_ms and (team, start) not in fired:
                fired.add((team, start))
                out.append(TeamIdleAlert(team, start, gpu_ms, threshold_gpu_ms, now_us))
    return TeamIdleMemory(frozenset(fired)), out


def forget_before(spans: Spans, cutoff_us: int) -> dict[tuple[str, int], IdleSpan]:
    """`spans` without those that ended before `cutoff_us` (nothing can count them again)."""
    return {k: s for k, s in spans.items() if s.end_us is None or s.end_us >= cutoff_us}


# ------------------------------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending job as the scheduler knows it."""

    job: str
    team: str
    queue: str
    submitted_us: int
    gpus: int
    reason: str | None = None


def overdue(
    waiting: Iterable[Waiting], limits_us: Mapping[str, int], default_us: int | None, now_us: int
) -> list[JobAlert]:
    """`tally.job.pending` alerts for the jobs waiting longer than their queue's threshold
    (`limits_us` per queue, else `default_us`; None: no threshold)."""
    out = []
    for job in waiting:
        limit = limits_us.get(job.queue, default_us)
        if limit is not None and now_us - job.submitted_us > limit:
            out.append(
                JobAlert(
                    kind=FleetKind.JOB_PENDING,
                    job=job.job,
                    team=job.team,
                    queue=job.queue,
                    since_us=job.submitted_us,
                    at_us=now_us,
                    limit_us=limit,
                    gpus=job.gpus,
                    reason=job.reason,
                )
            )
    return out


RESOLUTION = {
    FleetKind.JOB_IDLE: FleetKind.JOB_IDLE_RESOLVED,
    FleetKind.JOB_PENDING: FleetKind.JOB_PENDING_RESOLVED,
}


@dataclass(frozen=True, slots=True)
class JobMemory:
    """The job alerts open now, by (kind, job)."""

    open: Mapping[tuple[FleetKind, str], JobAlert] = field(default_factory=dict)


def job_step(
    memory: JobMemory,
    kind: FleetKind,
    found: Iterable[JobAlert],
    now_us: int,
    ended: Mapping[str, str] | None = None,
) -> tuple[JobMemory, list[JobAlert]]:
    """Follow the jobs a rule of `kind` found now: an alert for each new episode (a job not
    open, or open with another start), a resolution for each open one no longer found, with
    `ended[job]` as its reason when given."""
    opened = dict(memory.open)
    current = {a.job: a for a in found if a.kind is kind}
    out: list[JobAlert] = []
    for (open_kind, job), alert in sorted(memory.open.items()):
        if open_kind is not kind:
            continue
        now = current.get(job)
        if now is None or now.since_us != alert.since_us:
            reason = (ended or {}).get(job)
            out.append(replace(alert, kind=RESOLUTION[kind], at_us=now_us, reason=reason))
            del opened[(kind, job)]
    for job, alert in sorted(current.items()):
        if (kind, job) not in opened:
            opened[(kind, job)] = alert
            out.append(alert)
    return JobMemory(opened), out
