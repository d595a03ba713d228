"""What a person reads about an alert, whatever the sink: a title, a one-line summary, and the
facts (label, value) behind it, for every alert kind (`ledger.fleet_alerts.AnyAlert`).

Pure functions of the alert and the ledger currency. Amounts are the ledger's integers, turned
into text once, here: GPU-ms as GPU-hours with two places, micro-units as money with two
places (half-even), times as UTC minutes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal

from ledger.alerts import Alert
from ledger.fleet_alerts import (
    AnyAlert,
    BudgetAlert,
    FleetKind,
    HealthAlert,
    JobAlert,
    RequestAlert,
    TeamIdleAlert,
)
from ledger.units import MICROS_PER_UNIT, MS_PER_HOUR, Unit

TITLES = {
    "tally.idle.detected": "Tally: GPU allocated but idle",
    "tally.idle.resolved": "Tally: idle GPU resolved",
    FleetKind.BUDGET_THRESHOLD: "Tally: budget threshold crossed",
    FleetKind.BUDGET_FORECAST: "Tally: budget forecast to be exceeded",
    FleetKind.BUDGET_FORECAST_RESOLVED: "Tally: budget forecast back within budget",
    FleetKind.TEAM_IDLE: "Tally: team's idle GPU-hours over the daily threshold",
    FleetKind.JOB_IDLE: "Tally: job holds idle GPUs past its queue's allowance",
    FleetKind.JOB_IDLE_RESOLVED: "Tally: idle job resolved",
    FleetKind.JOB_PENDING: "Tally: job pending too long",
    FleetKind.JOB_PENDING_RESOLVED: "Tally: pending job no longer waiting",
    FleetKind.GPU_HEALTH: "Tally: GPU health",
    FleetKind.GPU_HEALTH_RESOLVED: "Tally: GPU healthy again",
    FleetKind.REQUEST_OPENED: "Tally: quota/budget request opened",
    FleetKind.REQUEST_APPROVED: "Tally: quota/budget request approved",
    FleetKind.REQUEST_REJECTED: "Tally: quota/budget request rejected",
    FleetKind.REQUEST_EXPIRED: "Tally: quota/budget request expired",
    FleetKind.REQUEST_REFUSED: "Tally: quota/budget request decision refused by the ledger",
}


def iso(time_us: int) -> str:
    moment = datetime.fromtimestamp(time_us // 1_000_000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def when(time_us: int) -> str:
    return datetime.fromtimestamp(time_us // 1_000_000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def day(time_us: int) -> str:
    return datetime.fromtimestamp(time_us // 1_000_000, tz=UTC).strftime("%Y-%m-%d")


def money(micros: int, currency: str) -> str:
    value = (Decimal(micros) / MICROS_PER_UNIT).quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    return f"{value:,.2f} {currency}"


def hours(gpu_ms: int) -> str:
    return f"{Decimal(gpu_ms) / MS_PER_HOUR:.2f}"


def amount(value: int, unit: str, currency: str) -> str:
    """A budget amount in its unit, as a person writes it."""
    if unit == Unit.GPU_MS:
        return f"{hours(value)} GPU-hours"
    if unit == Unit.MONEY:
        return money(value, currency)
    return f"{value:,} {unit}"


def duration(us: int) -> str:
    """`2 h 05 min`, `45 min`, `30 s`."""
    seconds = max(0, us) // 1_000_000
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def owner(alert: Alert) -> str:
    who = "/".join(p for p in (alert.team, alert.project) if p) or "unknown owner"
    extra = ", ".join(
        part
        for part in (alert.user and f"user {alert.user}", alert.job and f"job {alert.job}")
        if part
    )
    return f"{who} ({extra})" if extra else who


def _resolve_reason(reason: str | None) -> str:
    return {
        "busy_again": "it is busy again",
        "owner_changed": "it changed owner",
        "released": "its owner released it",
    }.get(reason or "", "it is no longer idle")


def title(alert: AnyAlert) -> str:
    return TITLES.get(alert.kind, "Tally alert")


def _idle_summary(alert: Alert, currency: str) -> str:
    gpu = f"GPU {alert.gpu_uuid} on {alert.node} ({alert.pool}, {alert.model})"
    waste = f"{money(alert.waste_micros, currency)} for {hours(alert.waste_gpu_ms)} GPU-hours"
    if alert.resolved:
        return (
            f"Resolved: {gpu} held by {owner(alert)} is no longer idle: "
            f"{_resolve_reason(alert.reason)} ({when(alert.at_us)}). "
            f"Idle since {when(alert.since_us)}; waste {waste}."
        )
    return (
        f"{gpu} is allocated but idle since {when(alert.since_us)}, held by {owner(alert)}. "
        f"Waste so far: {waste}."
    )


def _budget_summary(alert: BudgetAlert, currency: str) -> str:
    used = (
        f"{amount(alert.consumed, alert.unit, currency)} of "
        f"{amount(alert.granted, alert.unit, currency)} used"
    )
    budget = f"team {alert.team}'s {alert.period} budget"
    if alert.kind is FleetKind.BUDGET_THRESHOLD:
        share = alert.consumed * 100 // alert.granted if alert.granted > 0 else 0
        return (
            f"Budget: {budget} crossed {alert.threshold_pct}% — {used} ({share}%) "
            f"as of {when(alert.at_us)}."
        )
    forecast = amount(alert.forecast or 0, alert.unit, currency)
    if alert.kind is FleetKind.BUDGET_FORECAST_RESOLVED:
        return (
            f"Resolved: {budget} is no longer forecast to be exceeded — {used} as of "
            f"{when(alert.at_us)}; {forecast} forecast by {when(alert.period_end_us)}."
        )
    reach = f", the budget reached around {when(alert.exceed_at_us)}" if alert.exceed_at_us else ""
    return (
        f"Budget forecast: at its current burn rate {budget} will be exceeded before the "
        f"period ends — {used} as of {when(alert.at_us)}; {forecast} by "
        f"{when(alert.period_end_us)}{reach}."
    )


def _job_summary(alert: JobAlert) -> str:
    job = f"Job {alert.job} (team {alert.team}, queue {alert.queue})"
    if alert.kind is FleetKind.JOB_IDLE:
        return (
            f"{job} holds {alert.idle_gpus} of {alert.gpus} GPU(s) idle since "
            f"{when(alert.since_us)} ({duration(alert.at_us - alert.since_us)}), longer than its "
            f"queue allows ({duration(alert.limit_us)})."
        )
    if alert.kind is FleetKind.JOB_IDLE_RESOLVED:
        ended = f": {alert.reason}" if alert.reason else ""
        return (
            f"Resolved: {job} no longer holds GPUs idle since {when(alert.since_us)}"
            f"{ended} ({when(alert.at_us)})."
        )
    waited = duration(alert.at_us - alert.since_us)
    if alert.kind is FleetKind.JOB_PENDING:
        why = f" Waiting: {alert.reason}." if alert.reason else ""
        return (
            f"{job}, asking for {alert.gpus} GPU(s), has been pending for {waited} since "
            f"{when(alert.since_us)}, longer than the queue's threshold of "
            f"{duration(alert.limit_us)}.{why}"
        )
    ended = f" ({alert.reason})" if alert.reason else ""
    return f"Resolved: {job} is no longer pending{ended}, after waiting {waited}."


def summary(alert: AnyAlert, currency: str) -> str:
    """One line a person understands, for every kind."""
    if isinstance(alert, Alert):
        return _idle_summary(alert, currency)
    if isinstance(alert, BudgetAlert):
        return _budget_summary(alert, currency)
    if isinstance(alert, HealthAlert):
        gpu = f"GPU {alert.gpu_uuid} on {alert.node} ({alert.pool} / {alert.model})"
        if alert.resolved:
            return (
                f"Resolved: {gpu} is healthy again ({when(alert.at_us)}), after trouble since "
                f"{when(alert.since_us)}."
            )
        placements = "no new jobs go there" if alert.state == "unhealthy" else "it still runs jobs"
        return (
            f"{gpu} is {alert.state}: {alert.reason} (since {when(alert.since_us)}; "
            f"{alert.faults} fault(s) so far; {placements})."
        )
    if isinstance(alert, RequestAlert):
        step = alert.kind.value.removeprefix("tally.request.")
        if alert.kind is FleetKind.REQUEST_OPENED:
            return (
                f"{alert.actor} ({alert.role}) asks for {alert.change} for team {alert.team} "
                f"(request {alert.request_id}; approvers: {alert.approvers}): {alert.comment}"
            )
        if alert.kind is FleetKind.REQUEST_REFUSED:
            return (
                f"The ledger refused a decision by {alert.actor} ({alert.role}) on request "
                f"{alert.request_id} of team {alert.team} ({alert.change}); the request stays "
                f"as it was: {alert.comment}"
            )
        return (
            f"Request {alert.request_id} of team {alert.team} ({alert.change}) {step} by "
            f"{alert.actor} ({alert.role}) at {when(alert.at_us)}: {alert.comment}"
        )
    if isinstance(alert, TeamIdleAlert):
        return (
            f"Team {alert.team} held {hours(alert.idle_gpu_ms)} allocated-but-idle GPU-hours on "
            f"{day(alert.day_start_us)} (UTC), over the daily threshold of "
            f"{hours(alert.threshold_gpu_ms)} GPU-hours (as of {when(alert.at_us)})."
        )
    return _job_summary(alert)


def facts(alert: AnyAlert, currency: str) -> list[tuple[str, str]]:
    """The alert's facts as (label, value), in reading order."""
    if isinstance(alert, Alert):
        return [
            ("GPU", alert.gpu_uuid),
            ("Node", alert.node),
            ("Pool / model", f"{alert.pool} / {alert.model}"),
            ("Owner", owner(alert)),
            ("Idle since", when(alert.since_us)),
            ("Waste", money(alert.waste_micros, currency)),
        ]
    if isinstance(alert, BudgetAlert):
        found = [
            ("Team", alert.team),
            ("Period", alert.period),
            ("Budget", amount(alert.granted, alert.unit, currency)),
            ("Used", amount(alert.consumed, alert.unit, currency)),
        ]
        if alert.threshold_pct is not None:
            found.append(("Threshold", f"{alert.threshold_pct}%"))
        if alert.forecast is not None:
            found.append(("Forecast by period end", amount(alert.forecast, alert.unit, currency)))
        return found
    if isinstance(alert, HealthAlert):
        return [
            ("GPU", alert.gpu_uuid),
            ("Node", alert.node),
            ("Pool / model", f"{alert.pool} / {alert.model}"),
            ("State", alert.state),
            ("Reason", alert.reason),
            ("Since", when(alert.since_us)),
            ("Faults", str(alert.faults)),
        ]
    if isinstance(alert, RequestAlert):
        return [
            ("Request", alert.request_id),
            ("Team", alert.team),
            ("Change", alert.change),
            ("By", f"{alert.actor} ({alert.role})"),
            ("Approvers", alert.approvers),
            ("Comment", alert.comment),
        ]
    if isinstance(alert, TeamIdleAlert):
        return [
            ("Team", alert.team),
            ("Day (UTC)", day(alert.day_start_us)),
            ("Idle GPU-hours", hours(alert.idle_gpu_ms)),
            ("Threshold", f"{hours(alert.threshold_gpu_ms)} GPU-hours"),
        ]
    found = [("Job", alert.job), ("Team", alert.team), ("Queue", alert.queue)]
    if alert.kind in (FleetKind.JOB_IDLE, FleetKind.JOB_IDLE_RESOLVED):
        found += [
            ("Idle GPUs", f"{alert.idle_gpus} of {alert.gpus}"),
            ("Idle since", when(alert.since_us)),
            ("Queue allows", duration(alert.limit_us)),
        ]
    else:
        found += [
            ("GPUs asked", str(alert.gpus)),
            ("Submitted", when(alert.since_us)),
            ("Threshold", duration(alert.limit_us)),
        ]
    if alert.reason:
        found.append(("Reason", alert.reason))
    return found
