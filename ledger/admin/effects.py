"""The ledger effects of admin events, as pure functions returning balanced transactions:
`grant_transaction` (a budget grant), `adjustment_transaction` and `reversal_transaction`.
Nothing is ever updated or deleted; a correction is a new transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, tzinfo

from ledger.accounts import AccountKind, budget_account, funding_account
from ledger.admin.events import (
    DEFAULT_ADJUSTMENTS,
    DEFAULT_FUNDING,
    AdjustmentRecorded,
    AdminEnvelope,
    BudgetGranted,
)
from ledger.periods import Period
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.units import Unit


def _within(time_us: int, period: Period) -> int:
    """`time_us` if it lies in `period`, else the nearer edge of the period."""
    return min(max(time_us, period.start_us), period.end_us - 1)


def grant_transaction(
    envelope: AdminEnvelope, cost_centre: str | None, zone: tzinfo = UTC
) -> Transaction:
    """A budget grant: `budget:<team>` credited, `funding:<cost centre>` debited.

    The interval is the effective time, moved into the granted period (a month in `zone`, the
    ledger's time zone) when it lies outside, so a grant is never mistaken for a prior-period
    adjustment.
    """
    event = envelope.data
    assert isinstance(event, BudgetGranted)
    start = _within(event.effective_us, Period.month(event.period, zone))
    return budget_transaction(
        envelope.id, event.team, event.unit, event.amount, event.period, start, cost_centre
    )


def budget_transaction(
    txn_id: str,
    team: str,
    unit: Unit,
    amount: int,
    period: str,
    start_us: int,
    cost_centre: str | None,
    cause: tuple[str, ...] = (),
) -> Transaction:
    """`amount` of `unit` into `budget:<team>` from `funding:<cost centre>` at `start_us`: what a
    one-off grant and a recurring allowance both book (`cause` after the transaction's own id)."""
    return Transaction(
        txn_id=txn_id,
        kind=TransactionKind.BUDGET_GRANT,
        start_us=start_us,
        end_us=start_us + 1,
        gpu_uuid="",
        model="",
        pool="",
        node="",
        postings=(
            Posting(budget_account(team), unit, -amount, team, cost_centre=cost_centre),
            Posting(
                funding_account(cost_centre or DEFAULT_FUNDING),
                unit,
                amount,
                team,
                cost_centre=cost_centre,
            ),
        ),
        cause=(txn_id, *cause),
        period=period,
    )


def _dims_of(account: str) -> tuple[str | None, str | None]:
    """(team, project) named by a consumer account, else (None, None)."""
    kind, _, path = account.partition(":")
    if kind != AccountKind.CONSUMER:
        return None, None
    team, _, project = path.partition("/")
    return team or None, (project or None) if project != "-" else None


def adjustment_transaction(
    envelope: AdminEnvelope,
    booked_period: str,
    cost_centres: Mapping[str, str],
    zone: tzinfo = UTC,
) -> Transaction:
    """`amount` on the account against its counter-account, booked into `booked_period`.

    The interval lies in the period the adjustment is for, so one booked into a later period
    (the intended one is closed) is recognisable as a prior-period adjustment.
    """
    event = envelope.data
    assert isinstance(event, AdjustmentRecorded)
    assert event.account is not None and event.unit is not None and event.period is not None
    start = _within(event.effective_us, Period.month(event.period, zone))
    counter = event.counter_account or DEFAULT_ADJUSTMENTS
    team, project = _dims_of(event.account)
    team, project = event.team or team, event.project or project

    def posting(account: str, amount: int, team: str | None, project: str | None) -> Posting:
        assert event.unit is not None
        centre = cost_centres.get(team) if team else None
        return Posting(account, event.unit, amount, team, project, event.user, event.job_id, centre)

    counter_team, counter_project = _dims_of(counter)
    if counter_team is None:
        counter_team, counter_project = team, project
    return Transaction(
        txn_id=envelope.id,
        kind=TransactionKind.ADJUSTMENT,
        start_us=start,
        end_us=start + 1,
        gpu_uuid="",
        model="",
        pool="",
        node="",
        postings=(
            posting(event.account, event.amount, team, project),
            posting(counter, -event.amount, counter_team, counter_project),
        ),
        cause=(envelope.id,),
        period=booked_period,
    )


def reversal_transaction(
    envelope: AdminEnvelope, original: Transaction, booked_period: str
) -> Transaction:
    """The exact negation of `original` (same accounts, dimensions, GPU and interval), caused
    by the admin event and by the transaction it reverses."""
    return replace(
        original,
        txn_id=envelope.id,
        kind=TransactionKind.REVERSAL,
        postings=tuple(replace(p, amount=-p.amount) for p in original.postings),
        cause=(envelope.id, original.txn_id),
        period=booked_period,
    )
