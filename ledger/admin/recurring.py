"""Recurring budgets: which grants the applied `BudgetPolicySet`s make, period by period, and
how much of a period's unspent remainder is carried into the next. Pure: policies, the
allowance records already made, balances and a month in; allowance records and transactions out.

Rules (every amount an integer in the budget's unit):
- **Trigger.** GPU samples are the ledger's clock: when a samples batch holds a sample in a month
  `F` later than every month the ledger has granted a policy's allowance for, the batch's commit
  grants every month up to `F` that is due (`plan_allowances(..., through=F)`), in order, so a
  month with no usage at all is granted too. A record is kept per (team, unit, month) granted
  (`BudgetAllowanceGranted`, in the admin log), so replaying the same batches makes the same
  grants, with the same ids, and a month is never granted twice.
- **Which policy.** For month `P` the policy in force is the one applied last among the
  policies for (team, unit) whose first month is at or before `P`; none if `P` is after its
  `end`. A policy's first month is its `start`, but never before the month it was set in
  (policies do not grant into the past; a one-off `BudgetGranted` does that).
- **Allowance.** A monthly policy grants `amount` every month. A quarterly one grants it in the
  first month of each calendar quarter (January, April, July, October), and in the first month
  it grants after a month that no quarterly policy granted (a quarterly policy started
  mid-quarter grants at once); the other months of a quarter get an allowance of 0.
- **Remainder.** The previous month's remainder is `granted − consumed` of (team, unit) booked
  into that month as the ledger stands before the batch that makes the grant: every grant
  (one-off, allowance, carry) on `budget:<team>` less the team's consumer postings. It is fixed
  then: usage booked into the previous month afterwards (late samples, corrections) lowers that
  month's own figures and is never carried again; a closed month never changes anyway.
- **Carry-over** happens only from a month this (team, unit) was granted in the month just
  before (a chain); a negative remainder is never carried (it is not debt). Inside a quarter the
  whole positive remainder moves on (it is the same allowance); at the start of an allowance
  period the policy's rule applies: `none` 0, `all` the remainder, `percent` at most
  `amount × carry_limit ÷ 100` (rounded down), `amount` at most `carry_limit`.
- **Grant.** Allowance + carried is one `budget_grant` transaction crediting `budget:<team>` and
  debiting the team's funding account, booked into the month at its first microsecond; a month
  with nothing to grant only gets its record. A closed month gets a record of 0 and 0.
- At most `MAX_MONTHS` months are granted per (team, unit) per batch, so one sample with a
  wild clock cannot make an unbounded batch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo

from ledger.accounts import AccountKind
from ledger.admin.effects import budget_transaction
from ledger.admin.events import (
    LEDGER_ACTOR,
    AdminEnvelope,
    BudgetAllowanceGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
)
from ledger.balances import BalanceRow
from ledger.periods import Period, period_label
from ledger.postings import Transaction
from ledger.units import Unit

MAX_MONTHS = 36
ALLOWANCE_REASON = "recurring budget"
PolicyKey = tuple[str, Unit]  # (team, unit)
FigureKey = tuple[str, str, str]  # (team, unit, period)


@dataclass(frozen=True, slots=True)
class AppliedPolicy:
    """A `BudgetPolicySet` the ledger applied, with its envelope id."""

    policy_id: str
    policy: BudgetPolicySet

    def first(self, zone: tzinfo = UTC) -> str:
        """The first month the policy may grant: its start, never before the month (in `zone`,
        the ledger's time zone) it was set in."""
        set_in = period_label(self.policy.effective_us, zone)
        start = self.policy.start
        return set_in if start is None or start < set_in else start


def month_after(label: str) -> str:
    return Period.month(label).next().label


def month_before(label: str) -> str:
    return period_label(Period.month(label).start_us - 1)


def quarter_starts(label: str) -> bool:
    return int(label[5:7]) % 3 == 1


def policy_for(
    policies: Sequence[AppliedPolicy], period: str, zone: tzinfo = UTC
) -> AppliedPolicy | None:
    """The policy in force for `period` among one (team, unit)'s policies in applied order."""
    for applied in reversed(policies):
        if applied.first(zone) <= period:
            end = applied.policy.end
            return None if end is not None and period > end else applied
    return None


def carry_amount(rule: CarryOver, limit: int | None, amount: int, remainder: int) -> int:
    """What a new allowance period takes of the previous month's `remainder` under `rule`."""
    left = max(remainder, 0)
    if rule is CarryOver.NONE:
        return 0
    if rule is CarryOver.ALL:
        return left
    assert limit is not None
    if rule is CarryOver.PERCENT:
        return min(left, amount * limit // 100)
    return min(left, limit)


def budget_figures(
    rows: Iterable[BalanceRow],
) -> tuple[dict[FigureKey, int], dict[FigureKey, int]]:
    """(granted, consumed) per (team, unit, period) from balance rows: granted is the credit of
    `budget:<team>`, consumed the sum of the team's `consumer:` accounts."""
    granted: dict[FigureKey, int] = {}
    consumed: dict[FigureKey, int] = {}
    budget, consumer = f"{AccountKind.BUDGET}:", f"{AccountKind.CONSUMER}:"
    for row in rows:
        if row.account.startswith(budget):
            key = (row.account[len(budget) :], row.unit, row.period)
            granted[key] = granted.get(key, 0) - row.balance
        elif row.account.startswith(consumer):
            team = row.account[len(consumer) :].partition("/")[0]
            key = (team, row.unit, row.period)
            consumed[key] = consumed.get(key, 0) + row.balance
    return granted, consumed


def _next_first(policies: Sequence[AppliedPolicy], after: str, zone: tzinfo) -> str | None:
    later = [p.first(zone) for p in policies if p.first(zone) > after]
    return min(later) if later else None


def plan_allowances(
    policies: Mapping[PolicyKey, Sequence[AppliedPolicy]],
    latest: Mapping[PolicyKey, BudgetAllowanceGranted],
    through: str,
    closed: Collection[str],
    granted: Mapping[FigureKey, int],
    consumed: Mapping[FigureKey, int],
    zone: tzinfo = UTC,
) -> tuple[BudgetAllowanceGranted, ...]:
    """The allowance records due up to month `through`, per (team, unit) in order of months
    (of `zone`, the ledger's time zone: a month's allowance is effective at its first local
    instant).

    `latest` is each key's newest record; `granted` / `consumed` are the ledger's figures
    (`budget_figures`) before the batch.
    """
    out: list[BudgetAllowanceGranted] = []
    for key in sorted(policies):
        team, unit = key
        chain = policies[key]
        last = latest.get(key)
        month: str | None = month_after(last.period) if last else min(p.first(zone) for p in chain)
        own: dict[str, int] = {}  # what this plan granted, per month
        made = 0
        while month is not None and month <= through and made < MAX_MONTHS:
            applied = policy_for(chain, month, zone)
            if applied is None:
                month = _next_first(chain, month, zone)
                continue
            policy = applied.policy
            chained = last is not None and last.period == month_before(month)
            fresh = (
                policy.every is Cadence.MONTH
                or quarter_starts(month)
                or not chained
                or (last is not None and last.every is not Cadence.QUARTER)
            )
            remainder: int | None = None
            carried = 0
            if chained:
                assert last is not None
                prev = (team, unit.value, last.period)
                remainder = granted.get(prev, 0) + own.get(last.period, 0) - consumed.get(prev, 0)
                carried = (
                    carry_amount(policy.carry_over, policy.carry_limit, policy.amount, remainder)
                    if fresh
                    else max(remainder, 0)
                )
            allowance = policy.amount if fresh else 0
            if month in closed:
                allowance = carried = 0
            last = BudgetAllowanceGranted(
                team=team,
                unit=unit,
                period=month,
                allowance=allowance,
                carried=carried,
                remainder=remainder,
                policy=applied.policy_id,
                every=policy.every,
                actor=LEDGER_ACTOR,
                reason=ALLOWANCE_REASON,
                effective_us=Period.month(month, zone).start_us,
            )
            out.append(last)
            own[month] = allowance + carried
            made += 1
            month = month_after(month)
    return tuple(out)


def allowance_transaction(
    envelope: AdminEnvelope, cost_centre: str | None, zone: tzinfo = UTC
) -> Transaction | None:
    """The grant of an allowance record (None when it grants nothing): `budget:<team>`
    credited, `funding:<cost centre>` debited, at the first microsecond of its month in
    `zone`."""
    record = envelope.data
    assert isinstance(record, BudgetAllowanceGranted)
    amount = record.granted
    if amount == 0:
        return None
    start = Period.month(record.period, zone).start_us
    return budget_transaction(
        envelope.id,
        record.team,
        record.unit,
        amount,
        record.period,
        start,
        cost_centre,
        (record.policy,),
    )
