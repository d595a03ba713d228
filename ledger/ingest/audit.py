"""Audit entries from the events the folds apply (`ledger.audit`): an applied admin event with
what it changed (the fold gives the value before, from the ledger's view and the batch so far),
and the scheduler's job submissions and cancellations with who made them and from where. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.admin import (
    AdjustmentRecorded,
    AdminEnvelope,
    BudgetGranted,
    PeriodClosed,
    PriceSet,
    QuotaSet,
    TeamDefined,
)
from ledger.audit import UNRECORDED, AuditEntry, changes
from ledger.job_events import FailReason, JobEnvelope, JobFailed, JobSubmitted

ADMIN_ROLE = "admin"  # an admin event that records no role: the local operator, as the admin
SCHEDULER = "scheduler"  # the scheduler itself (a cancel it made, e.g. when it stopped)


def admin_kind(envelope: AdminEnvelope) -> str:
    """`admin.<type>`, a reversal `admin.reversal`."""
    event = envelope.data
    if isinstance(event, AdjustmentRecorded) and event.reverses_txn is not None:
        return "admin.reversal"
    return "admin." + envelope.type.value.removeprefix("tally.admin.")


def admin_entry(
    envelope: AdminEnvelope,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
) -> AuditEntry:
    event = envelope.data
    return AuditEntry(
        event_id=envelope.id,
        time_us=envelope.time_us,
        kind=admin_kind(envelope),
        actor=event.actor,
        role=event.role or ADMIN_ROLE,
        client=envelope.source,
        subject=envelope.subject,
        reason=event.reason,
        before=changes(before),
        after=changes(after),
    )


def price_state(price: PriceSet | None) -> dict[str, Any] | None:
    if price is None:
        return None
    return {
        "pool": price.pool,
        "micros_per_gpu_hour": price.micros_per_gpu_hour,
        "effective_us": price.effective_us,
    }


def team_state(team: TeamDefined | None) -> dict[str, Any] | None:
    if team is None:
        return None
    cost_centre, projects, users = team.definition
    return {"cost_centre": cost_centre, "projects": list(projects), "users": list(users)}


def quota_state(quota: QuotaSet | None) -> dict[str, Any] | None:
    if quota is None:
        return None
    return {
        "pool": quota.pool,
        "model": quota.model,
        "nominal_gpus": quota.nominal_gpus,
        "borrowing_limit": quota.borrowing_limit,
        "lending_limit": quota.lending_limit,
    }


def grant_states(event: BudgetGranted, total: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The team's granted total for (period, unit) before and after the grant."""
    key = {"period": event.period, "unit": event.unit.value}
    return {**key, "granted": total}, {**key, "granted": total + event.amount}


def adjustment_state(event: AdjustmentRecorded, booked: str) -> dict[str, Any]:
    unit = None if event.unit is None else event.unit.value
    return {
        "account": event.account,
        "counter_account": event.counter_account,
        "unit": unit,
        "amount": event.amount,
        "period": event.period,
        "booked_period": booked,
    }


def close_states(event: PeriodClosed) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"period": event.period, "closed": False}, {"period": event.period, "closed": True}


def job_entry(envelope: JobEnvelope) -> AuditEntry | None:
    """The audit entry of a submission or a cancellation; None for any other job event."""
    event = envelope.data
    if isinstance(event, JobSubmitted):
        spec = event.spec
        after: dict[str, Any] = {
            "team": spec.team,
            "project": spec.project,
            "user": spec.user,
            "queue": spec.queue,
            "gpus": spec.gpus,
            "model": spec.model,
            "pool": spec.pool,
            "priority": spec.priority,
            "state": "pending",
        }
        who = event.requested_by or UNRECORDED
        return _job(envelope, "job.submit", who, event.client, None, after, "")
    if isinstance(event, JobFailed) and event.reason is FailReason.CANCELLED:
        who = event.requested_by or SCHEDULER
        after = {"state": "cancelled", "attempt": event.attempt}
        return _job(envelope, "job.cancel", who, event.client, None, after, event.detail)
    return None


def _job(
    envelope: JobEnvelope,
    kind: str,
    who: str,
    client: str | None,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any],
    reason: str,
) -> AuditEntry:
    return AuditEntry(
        event_id=envelope.id,
        time_us=envelope.time_us,
        kind=kind,
        actor=who,
        role=who,
        client=client or envelope.source,
        subject=envelope.subject,
        reason=reason,
        before=changes(before),
        after=changes(after),
    )
